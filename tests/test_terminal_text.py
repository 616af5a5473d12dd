"""Terminal output is text: what the CLI prints from a record has its control characters
escaped.

A session writes a file whose name carries escape sequences (a terminal title, a
screen clear, a carriage return, a bell, a C1 CSI, a right-to-left override and a
newline that would forge a line of the lineage tree), runs a command that prints
colour codes and a bell, and saves the file as an artifact. ``lineage`` (every
format), ``ls``, ``show``, ``receipt`` and ``audit`` then print it: no raw control
character reaches stdout, each is shown as its escape, and the JSON formats still
parse to the record's own strings. The honest twin: a name in plain non-ASCII text
prints as it is.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from typing import Any

import pytest

from host_kernel import Host
from host_kernel.browse import printable, printable_json
from host_kernel.cli import main

#: A file name no terminal should ever receive raw.
EVIL = "x\x1b]0;owned\x07\x1b[2J\rfake\x9b31m\u202ecsv.exe\n  ← from [traced]:.csv"
#: What a command prints: colour, a bell, a carriage return that rewrites the line.
PRINTS = "\\033[32mgreen\\033[0m\\a\\rREWRITTEN"
#: An ordinary name in non-ASCII text: printed unchanged.
PLAIN = "données_été.csv"
#: Characters that must never reach the terminal raw.
RAW = ("\x1b", "\x07", "\r", "\x9b", "\u202e")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    ws = tmp_path_factory.mktemp("terminal") / "ws"
    ws.mkdir()
    with Host(ws) as host:
        obs = host.execute(
            f"r = host.bash('printf {PRINTS}; echo; printf data > ' + {shlex.quote(EVIL)!r})\n"
            f"a = host.save_artifact({EVIL!r})\n"
            f"host.write_file({PLAIN!r}, 'ok')\n"
            f"b = host.save_artifact({PLAIN!r})\n"
            f"print(r.receipt_id, a.artifact_id, b.artifact_id)", timeout=120)
        assert obs.status == "ok", obs.text
        receipt, evil, plain = obs.outputs[-1]["text"].splitlines()[-1].split()
        yield {"record": host.record_dir, "cell": obs.cell_id, "receipt": receipt,
               "evil": evil, "plain": plain, "session": host.session_id}


def _strings(value: Any) -> set[str]:
    """Every string in a parsed JSON value, keys too."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(_strings(k) | _strings(v) for k, v in value.items()))
    if isinstance(value, list):
        return set().union(*(_strings(v) for v in value))
    return set()


def _run(capsys: pytest.CaptureFixture[str], *argv: object) -> str:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    for char in RAW:
        assert char not in out, f"{char!r} reached the terminal raw: {out!r}"
    return out


def test_lineage_text_escapes_every_name_and_keeps_each_on_its_line(
        recorded: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "lineage", recorded["evil"], "--record", recorded["record"])
    first = out.splitlines()[0]
    assert first.startswith("artifact x\\x1b]0;owned\\x07\\x1b[2J\\rfake\\x9b31m\\u202ecsv.exe"
                            "\\n  ← from [traced]:.csv ("), out
    # The forged line is not a line: the tree's own lines are the Host's.
    assert all(not line.startswith("  ← from [traced]:.csv") for line in out.splitlines())
    assert "command " in out and "\\x1b" in out.split("command ", 1)[1]


@pytest.mark.parametrize("fmt", ["mermaid", "dot", "json", "prov-json"])
def test_lineage_exports_escape_too_and_json_still_says_the_same(
        recorded: dict[str, Any], capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    out = _run(capsys, "lineage", recorded["evil"], "--record", recorded["record"],
               "--format", fmt)
    if fmt in ("json", "prov-json"):
        # The record's own strings, escaped only on the wire.
        assert any(EVIL in text for text in _strings(json.loads(out)))
    else:
        assert "\\x1b" in out or "\\u001b" in out


def test_ls_escapes_file_names_and_commands(recorded: dict[str, Any],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "ls", recorded["record"], "--artifacts")
    assert "x\\x1b]0;owned\\x07" in out and PLAIN in out
    rows = [line for line in out.splitlines() if recorded["evil"][:8] in line]
    assert len(rows) == 1 and "\\n" in rows[0]  # the name's newline did not split the row
    out = _run(capsys, "ls", recorded["record"], "--receipts")
    assert "printf \\x1b[32mgreen" in out, out
    listed = json.loads(_run(capsys, "ls", recorded["record"], "--artifacts", "--json"))
    assert {r["filename"] for r in listed["rows"]} == {EVIL, PLAIN}


def test_show_escapes_the_receipts_output_tail_and_the_cells_outputs(
        recorded: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "show", recorded["receipt"], "--record", recorded["record"])
    assert "\\x1b[32mgreen\\x1b[0m\\x07\\rREWRITTEN" in out, out
    assert "\x1b[32m" not in out
    out = _run(capsys, "show", recorded["cell"], "--record", recorded["record"])
    assert "green" in out and "\x1b[32m" not in out
    assert "x\\x1b]0;owned" in out  # the code names the file
    shown = json.loads(_run(capsys, "show", recorded["receipt"], "--record",
                            recorded["record"], "--json"))
    assert shown["item"]["receipt"]["stdout_tail"].startswith("\x1b[32mgreen")


def test_receipt_statement_escapes_and_still_parses(recorded: dict[str, Any],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "receipt", recorded["receipt"], "--record", recorded["record"])
    assert any(EVIL in text for text in _strings(json.loads(out)))


def test_audit_prints_clean_and_escaped(recorded: dict[str, Any],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "audit", recorded["record"])
    assert "clean" in out


def test_an_ordinary_non_ascii_name_prints_as_it_is(recorded: dict[str, Any],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "lineage", recorded["plain"], "--record", recorded["record"])
    assert out.startswith(f"artifact {PLAIN} (")
    out = _run(capsys, "show", recorded["plain"], "--record", recorded["record"])
    assert PLAIN in out


def test_the_one_helper_escapes_what_a_terminal_acts_on() -> None:
    assert printable("a\x1b[2Jb\x07\r\x9b\u202e\u2028") == \
        "a\\x1b[2Jb\\x07\\r\\x9b\\u202e\\u2028"
    assert printable("line one\n\tline two") == "line one\\n\\tline two"
    assert printable("line one\n\tline two\x1b", lines=True) == "line one\n\tline two\\x1b"
    assert printable(PLAIN) == PLAIN
    text = printable_json({"k": "\x1b\x7f\x9b\u202e" + PLAIN})
    assert json.loads(text) == {"k": "\x1b\x7f\x9b\u202e" + PLAIN}
    assert not any(c in text for c in "\x1b\x7f\x9b\u202e") and PLAIN in text
