"""``host-kernel ls`` and ``show``: what a record holds, listed and shown, read verified."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host_kernel import Host
from host_kernel.cli import main
from host_kernel.store.ledger import SQLiteLedger

SESSION_KEYS = ["session", "started", "ended", "end_reason", "front", "mode", "armed",
                "confinement", "network", "generations", "cells", "running", "receipts",
                "artifacts", "submissions", "accepted", "cause"]
CELL_KEYS = ["cell_id", "session", "generation", "status", "started", "ended", "duration",
             "execution_count", "silent", "receipts", "artifacts", "first_line"]
RECEIPT_KEYS = ["receipt_id", "session", "cell_id", "generation", "command", "exit_status",
                "ended"]
ARTIFACT_KEYS = ["artifact_id", "session", "cell_id", "generation", "filename", "size",
                 "sha256", "media_type", "source_path", "saved"]
VERDICT_KEYS = ["submission_id", "session", "cell_id", "accepted", "mode", "armed", "failed",
                "advice", "decided"]

CELLS = [
    "print('hi')",
    "host.write_file('a.csv', 'x\\n1\\n')\nr = host.bash('wc -l a.csv')\n"
    "a = host.save_artifact('a.csv')",
    "host.submit_output({'rows': 1}, ['wrote a.csv'], task_status='completed')",
    "print('\\x1b[31mred\\x1b[0m and a bell \\x07')",
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(state))
        yield tmp_path_factory.mktemp("browse")


@pytest.fixture(scope="module")
def recorded(workspace: Path) -> dict[str, Any]:
    """Two real sessions of four cells: a receipt, an artifact, an accepted verdict each."""
    sessions = []
    for _ in range(2):
        with Host(workspace) as host:
            cells = [host.execute(code, timeout=60) for code in CELLS]
            assert [c.status for c in cells] == ["ok"] * 4, [c.text for c in cells]
            sessions.append({"session": host.session_id, "cells": [c.cell_id for c in cells]})
        record = host.record_dir
    db = sqlite3.connect(record / "ledger.sqlite")
    for s in sessions:
        sid = s["session"]
        s["receipt"] = db.execute("SELECT receipt_id FROM receipts WHERE session = ?",
                                  (sid,)).fetchone()[0]
        s["artifact"] = db.execute("SELECT artifact_id FROM artifacts WHERE session = ?",
                                   (sid,)).fetchone()[0]
        s["verdict"] = db.execute("SELECT submission_id FROM submissions WHERE session = ?",
                                  (sid,)).fetchone()[0]
    db.close()
    return {"record": record, "sessions": sessions}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> Any:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def run_text(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> str:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "\x1b" not in out  # not a terminal: no colour codes
    return out


def unique_prefix(full: str, others: list[str]) -> str:
    for n in range(4, len(full)):
        if not any(o != full and o.startswith(full[:n]) for o in others):
            return full[:n]
    return full


def all_ids(recorded: dict[str, Any]) -> list[str]:
    return [i for s in recorded["sessions"]
            for i in (s["session"], *s["cells"], s["receipt"], s["artifact"], s["verdict"])]


# ---------------------------------------------------------------------- ls


def test_ls_lists_every_session_with_its_counts(recorded: dict[str, Any],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "ls", recorded["record"], "--json")
    assert list(data) == ["record", "kind", "session", "rows"]
    assert data["kind"] == "sessions" and data["session"] is None
    assert data["record"] == str(recorded["record"])
    rows = data["rows"]
    assert [r["session"] for r in rows] == [s["session"] for s in recorded["sessions"]]
    for row in rows:
        assert list(row) == SESSION_KEYS
        assert (row["cells"], row["receipts"], row["artifacts"], row["submissions"],
                row["accepted"], row["generations"], row["running"]) == (4, 1, 1, 1, 1, 1, 0)
        assert row["ended"] is not None and row["mode"] == "analysis_run"
        assert row["confinement"] in ("landlock", "none")
    text = run_text(capsys, "ls", recorded["record"])
    for s in recorded["sessions"]:
        assert s["session"] in text
    assert text.rstrip().endswith(f"2 sessions in the record ({recorded['record']})")
    assert all(line == line.rstrip() for line in text.splitlines())


def test_ls_session_prefix_lists_its_cells(recorded: dict[str, Any],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    first = recorded["sessions"][0]
    prefix = unique_prefix(first["session"], [s["session"] for s in recorded["sessions"]])
    data = run_json(capsys, "ls", "--record", recorded["record"], "--session", prefix, "--json")
    assert data["kind"] == "cells" and data["session"] == first["session"]
    assert [r["cell_id"] for r in data["rows"]] == first["cells"]
    assert all(list(r) == CELL_KEYS for r in data["rows"])
    assert [r["status"] for r in data["rows"]] == ["ok"] * 4
    assert data["rows"][1]["receipts"] == 1 and data["rows"][1]["artifacts"] == 1
    assert data["rows"][0]["first_line"] == "print('hi')"
    text = run_text(capsys, "ls", recorded["record"], "--session", prefix)
    assert all(c in text for c in first["cells"])
    assert recorded["sessions"][1]["cells"][0] not in text


@pytest.mark.parametrize(("flag", "key", "keys", "field"), [
    ("--cells", "cell_id", CELL_KEYS, "cells"),
    ("--receipts", "receipt_id", RECEIPT_KEYS, "receipt"),
    ("--artifacts", "artifact_id", ARTIFACT_KEYS, "artifact"),
    ("--verdicts", "submission_id", VERDICT_KEYS, "verdict"),
])
def test_ls_lists_rows_of_one_kind_across_sessions_or_in_one(
        recorded: dict[str, Any], capsys: pytest.CaptureFixture[str], flag: str, key: str,
        keys: list[str], field: str) -> None:
    def ids(s: dict[str, Any]) -> list[str]:
        return list(s[field]) if field == "cells" else [s[field]]

    data = run_json(capsys, "ls", recorded["record"], flag, "--json")
    assert data["kind"] == flag[2:]
    assert [r[key] for r in data["rows"]] == [i for s in recorded["sessions"] for i in ids(s)]
    assert all(list(r) == keys for r in data["rows"])
    second = recorded["sessions"][1]
    data = run_json(capsys, "ls", recorded["record"], flag, "--session", second["session"],
                    "--json")
    assert [r[key] for r in data["rows"]] == ids(second)
    text = run_text(capsys, "ls", recorded["record"], flag)
    assert all(i in text for s in recorded["sessions"] for i in ids(s))


def test_ls_verdict_rows_say_accepted_and_the_failed_checks(
        recorded: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    rows = run_json(capsys, "ls", recorded["record"], "--verdicts", "--json")["rows"]
    assert [(r["accepted"], r["failed"]) for r in rows] == [(True, [])] * 2


def test_ls_finds_the_record_of_the_current_workspace(
        recorded: dict[str, Any], workspace: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace)
    assert run_json(capsys, "ls", "--json")["record"] == str(recorded["record"])
    assert run_json(capsys, "ls", workspace, "--json")["record"] == str(recorded["record"])


def test_ls_with_two_different_records_is_a_usage_error(
        recorded: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", str(recorded["record"]), "--record", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("host-kernel ls: error: two records given")


def test_ls_of_an_empty_kind_says_so(recorded: dict[str, Any], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with SQLiteLedger(tmp_path / "ledger.sqlite") as ledger:
        ledger.append("lonely", "session_started", {"mode": {"name": None}})
    text = run_text(capsys, "ls", tmp_path, "--receipts")
    assert text == f"no receipts in the record ({tmp_path})\n"
    assert run_json(capsys, "ls", tmp_path, "--receipts", "--json")["rows"] == []


# ---------------------------------------------------------------------- show


@pytest.mark.parametrize("kind", ["session", "cell", "receipt", "artifact", "verdict"])
def test_show_finds_each_kind_by_its_id_and_by_a_prefix(
        recorded: dict[str, Any], kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    s = recorded["sessions"][0]
    full = s["cells"][1] if kind == "cell" else s[kind]
    prefix = unique_prefix(full, all_ids(recorded))
    for given in (full, prefix):
        data = run_json(capsys, "show", given, "--record", recorded["record"], "--json")
        assert list(data) == ["record", "kind", "id", "item", "related"]
        assert (data["kind"], data["id"]) == (kind, full)
    item, related = data["item"], data["related"]
    if kind == "session":
        assert item["session"] == full and item["workdir"] and item["pid"]
        assert [c["cell_id"] for c in related["cells"]] == s["cells"]
        assert [r["receipt_id"] for r in related["receipts"]] == [s["receipt"]]
        assert [g["reason"] for g in related["generations"]] == ["start"]
    elif kind == "cell":
        assert item["code"] == CELLS[1] and item["outputs"][0]["text"] == "2 a.csv\n"
        assert [r["receipt_id"] for r in related["receipts"]] == [s["receipt"]]
        assert [a["artifact_id"] for a in related["artifacts"]] == [s["artifact"]]
        assert [w["path"] for w in related["writes"]] == ["a.csv"]
    elif kind == "receipt":
        assert item["command"] == "wc -l a.csv" and item["exit_status"] == 0
        assert item["receipt"]["stdout_tail"] == "2 a.csv\n"
    elif kind == "artifact":
        assert item["filename"] == "a.csv" and item["size"] == 4
        assert isinstance(item["lineage"], dict)
    else:
        assert item["accepted"] is True and item["cell_id"] == s["cells"][2]
        assert all(c["ok"] for c in item["checks"] if not c.get("advisory"))
        assert item["submission"]["output"] == {"rows": 1}
    text = run_text(capsys, "show", prefix, "--record", recorded["record"])
    assert text.startswith(f"{kind} {full}\n")


def test_show_finds_the_record_from_the_workdir(
        recorded: dict[str, Any], workspace: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    receipt = recorded["sessions"][1]["receipt"]
    data = run_json(capsys, "show", receipt, "--workdir", workspace, "--json")
    assert data["kind"] == "receipt" and data["item"]["receipt_id"] == receipt


def test_show_of_a_cell_prints_its_code_and_outputs_without_control_codes(
        recorded: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    cell = recorded["sessions"][0]["cells"][3]
    text = run_text(capsys, "show", cell, "--record", recorded["record"])
    assert "red and a bell \\x07" in text  # colour codes stripped, the bell shown escaped
    assert "\x07" not in text and "\x1b" not in text
    assert "print('\\x1b[31mred" in text  # the code as written


def test_show_of_an_ambiguous_prefix_lists_the_candidates(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SQLiteLedger(tmp_path / "ledger.sqlite") as ledger:
        for sid in ("abc-1", "abc-2", "abd-3"):
            ledger.append(sid, "session_started", {"mode": {"name": None}})
    assert main(["show", "ab", "--record", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == "host-kernel show: error: 'ab' is ambiguous: 3 ids start with it:"
    assert lines[1:] == ["  session abc-1", "  session abc-2", "  session abd-3"]
    assert run_json(capsys, "show", "abd", "--record", tmp_path, "--json")["id"] == "abd-3"
    assert main(["ls", str(tmp_path), "--session", "abc"]) == 2
    assert "--session: 'abc' is ambiguous" in capsys.readouterr().err


def test_show_of_an_unknown_id_is_a_usage_error(recorded: dict[str, Any],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "no-such-id", "--record", str(recorded["record"])]) == 2
    assert capsys.readouterr().err == (
        "host-kernel show: error: no session, cell, receipt, artifact or verdict id in the "
        "record starts with 'no-such-id'\n")


# ---------------------------------------------------------------------- refused records


def test_ls_and_show_refuse_a_drifted_record_and_show_nothing(
        recorded: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "record"
    copy.mkdir()
    for name in ("ledger.sqlite", "record.key"):
        shutil.copy2(recorded["record"] / name, copy / name)
    with sqlite3.connect(copy / "ledger.sqlite") as db:
        db.execute("UPDATE receipts SET command = 'rm -rf /'")
    db.close()
    receipt = recorded["sessions"][0]["receipt"]
    for argv, name in ((["ls", str(copy), "--receipts"], "ls"),
                       (["show", receipt, "--record", str(copy)], "show")):
        assert main(argv) == 1
        out, err = capsys.readouterr()
        assert out == "" and "rm -rf" not in err
        assert err.startswith(f"host-kernel {name}: error: [projection_drift]")
        assert err.count("\n") == 1


def test_ls_piped_prints_plain_rows_one_line_each(recorded: dict[str, Any],
                                                  workspace: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "host_kernel", "ls", "--cells"], cwd=workspace,
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "COLUMNS": "40"})
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout
    lines = proc.stdout.splitlines()
    for s in recorded["sessions"]:
        for cell in s["cells"]:
            [line] = [x for x in lines if x.startswith(cell)]
            assert s["session"] in line  # not wrapped at the terminal's width


def test_minted_cell_ids_never_begin_like_an_option() -> None:
    from host_kernel._ids import is_cell_id, mint_cell_id

    ids = [mint_cell_id() for _ in range(4000)]  # about 1 in 32 would begin with - or _
    assert all(is_cell_id(i) and len(i) == 16 and i[0].isalnum() for i in ids)


def test_show_takes_an_older_cell_id_that_begins_with_a_dash_after_a_double_dash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import host_kernel.host._cells as host_module

    (tmp_path / "ws").mkdir()
    record = tmp_path / "record"
    with Host(tmp_path / "ws", record_dir=record) as host:
        monkeypatch.setattr(host_module, "mint_cell_id", lambda: "-Dashed0Cell0Id0")
        assert host.execute("print('dash')").cell_id == "-Dashed0Cell0Id0"
    assert main(["show", "--record", str(record), "--json", "--", "-Dashed0"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["kind"] == "cell" and shown["id"] == "-Dashed0Cell0Id0"
