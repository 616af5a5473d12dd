"""The CLI's rough edges, each through the real command as a subprocess (issue 31, 9-17).

:data:`EDGES` is a bad-input table in the style of tests/test_cli_errors.py: the
arguments, the exit code and the words of the one ``host-kernel CMD: error: …`` line,
and what must not be printed (a traceback, a warning, a temporary path). The cases a
table cannot hold (Ctrl-C as a terminal sends it, a read-only workspace, a record of
another workspace, the notebook a session ran and its markdown in the export) follow it.
Every command runs as ``python -m host_kernel``, with its own stdout and stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from host_kernel import Host
from host_kernel.store.verified import open_verified

REPO = Path(__file__).resolve().parent.parent


def cli(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "host_kernel", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL, env=env)


def no_noise(err: str) -> None:
    """Nothing on stderr but the command's own lines: no traceback, no warning."""
    assert "Traceback" not in err, err
    assert "Warning" not in err and "site-packages" not in err, err


# ---------------------------------------------------------------------- one record


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """One session: a command that reads data.csv and prints in colour (its receipt), and
    seventeen artifacts, two of which must share a first hex digit (an ambiguous prefix)."""
    root = tmp_path_factory.mktemp("edges")
    ws = root / "ws"
    ws.mkdir()
    with Host(ws, record_dir=root / "record") as host:
        obs = host.execute(
            "host.write_file('data.csv', 'x\\n1\\n2\\n')\n"
            "r = host.bash(\"cat data.csv > /dev/null; printf '\\\\033[32mgreen\\\\033[0m\\\\n'\")\n"
            "print(r.receipt_id)")
        assert obs.status == "ok", obs.text
        receipt = obs.outputs[-1]["text"].strip().splitlines()[-1]
        obs = host.execute("ids = []\nfor i in range(17):\n"
                           "    host.write_file(f'a{i}.txt', str(i))\n"
                           "    ids.append(host.save_artifact(f'a{i}.txt').artifact_id)\n"
                           "print(' '.join(ids))")
        assert obs.status == "ok", obs.text
        artifacts = obs.outputs[-1]["text"].split()
    by_first: dict[str, list[str]] = {}
    for a in artifacts:
        by_first.setdefault(a[0], []).append(a)
    shared = next(ids for ids in by_first.values() if len(ids) > 1)
    unique = next(ids[0] for ids in by_first.values() if len(ids) == 1) \
        if any(len(ids) == 1 for ids in by_first.values()) else artifacts[0]
    yield {"root": root, "record": root / "record", "ws": ws, "receipt": receipt,
           "artifacts": artifacts, "shared": shared, "unique": unique,
           "data_sha": hashlib.sha256(b"x\n1\n2\n").hexdigest()}


@dataclass(frozen=True)
class Edge:
    """Arguments (``{name}`` filled from the record fixture and :func:`places`), the exit
    code, words stderr must hold, and words neither stream may hold."""

    argv: tuple[str, ...]
    code: int
    says: str
    never: tuple[str, ...] = ()


@pytest.fixture(scope="module")
def places(record: dict[str, object], tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, str]:
    root = tmp_path_factory.mktemp("places")
    noid = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
            "cells": [{"cell_type": "markdown", "metadata": {}, "source": "no ids here"},
                      {"cell_type": "code", "metadata": {}, "outputs": [],
                       "execution_count": None}]}  # no source: invalid, and no ids
    (root / "noid.ipynb").write_text(json.dumps(noid))
    (root / "empty").mkdir()
    (root / "prefix").mkdir()
    shared = record["shared"]
    assert isinstance(shared, list)
    return {"record": str(record["record"]), "shared": str(shared[0][0]),
            "unique": str(record["unique"])[:8], "receipt": str(record["receipt"])[:8],
            "noid": str(root / "noid.ipynb"), "empty": str(root / "empty"),
            "prefix": str(root / "prefix"), "root": str(root)}


#: Point 12 (no nbformat warning), 13 (prefixes, an id starting with '-'), 14 (trace
#: without a record, a bad kernelspec name).
EDGES: dict[str, Edge] = {
    "exec-notebook-without-ids": Edge(("exec", "{noid}"), 2, "not a notebook: "),
    "batch-notebook-without-ids": Edge(("batch", "{noid}"), 2, "not a notebook: "),
    "lineage-ambiguous-prefix": Edge(("lineage", "{shared}", "--record", "{record}"), 2,
                                     "is ambiguous", ("no artifact",)),
    "receipt-unknown-prefix": Edge(("receipt", "zz", "--record", "{record}"), 2,
                                   "no receipt id in the record starts with 'zz'"),
    "slice-ambiguous-prefix": Edge(("slice", "{shared}", "--record", "{record}"), 2,
                                   "is ambiguous"),
    "show-dash-id": Edge(("show", "-8a12", "--record", "{record}"), 2,
                         "host-kernel show -- -8a12"),
    "lineage-dash-id": Edge(("lineage", "-8a12", "--record", "{record}"), 2,
                            "host-kernel lineage -- -8a12"),
    "trace-no-record": Edge(("trace", "{empty}"), 1, "[record_missing]"),
    "trace-no-record-here": Edge(("trace",), 1, "[record_missing]"),
    "install-bad-name": Edge(("install", "--prefix", "{prefix}", "--name", "bad/name"), 2,
                             "--name 'bad/name'", ("host-kernel-spec", "/tmp/")),
}


@pytest.mark.parametrize("edge", EDGES.values(), ids=EDGES.keys())
def test_an_edge_gets_one_error_line_and_its_exit_code(edge: Edge, places: dict[str, str]
                                                       ) -> None:
    argv = [a.format(**places) for a in edge.argv]
    proc = cli(*argv, cwd=Path(places["empty"]))
    assert proc.returncode == edge.code, (argv, proc.stdout, proc.stderr)
    no_noise(proc.stderr)
    name = argv[0]
    errors = [line for line in proc.stderr.splitlines()
              if line.startswith(f"host-kernel {name}: error: ")]
    assert errors, proc.stderr
    assert edge.says in proc.stderr, proc.stderr
    for word in edge.never:
        assert word not in proc.stderr + proc.stdout, (word, proc.stderr)
    if edge.code == 2 and "ambiguous" not in edge.says:
        # a usage error: argparse's usage line, or nothing, before the one error line
        assert all(line.startswith(("usage:", " ", f"host-kernel {name}: error: "))
                   for line in proc.stderr.splitlines()), proc.stderr


def test_an_ambiguous_prefix_lists_every_id_it_matches(record: dict[str, object],
                                                       places: dict[str, str]) -> None:
    proc = cli("lineage", places["shared"], "--record", places["record"],
               cwd=Path(places["empty"]))
    assert proc.returncode == 2
    shared = record["artifacts"]
    assert isinstance(shared, list)
    matching = [a for a in shared if a.startswith(places["shared"])]
    assert len(matching) >= 2
    for artifact in matching:
        assert f"artifact {artifact}" in proc.stderr, proc.stderr


def test_lineage_and_receipt_take_a_unique_prefix_as_show_does(
        record: dict[str, object], places: dict[str, str]) -> None:
    here = Path(places["empty"])
    lineage = cli("lineage", places["unique"], "--record", places["record"], "--format",
                  "json", cwd=here)
    assert lineage.returncode == 0, lineage.stderr
    assert str(record["unique"]) in lineage.stdout
    receipt = cli("receipt", places["receipt"], "--record", places["record"], cwd=here)
    assert receipt.returncode == 0, receipt.stderr
    assert json.loads(receipt.stdout)["predicate"]["name"] == \
        f"host-kernel receipt {record['receipt']}"
    # an id starting with '-' given after '--' is an id, not an option
    dashed = cli("show", "--record", places["record"], "--", "-8a12", cwd=here)
    assert dashed.returncode == 2 and "no session, cell, receipt" in dashed.stderr


def test_the_in_toto_receipt_lists_the_files_the_command_read(
        record: dict[str, object], places: dict[str, str]) -> None:
    proc = cli("receipt", places["receipt"], "--record", places["record"],
               cwd=Path(places["empty"]))
    assert proc.returncode == 0, proc.stderr
    materials = json.loads(proc.stdout)["predicate"]["materials"]
    read = [m for m in materials if m["name"] == "data.csv"]
    assert read, materials
    assert read[0]["digest"] == {"sha256": record["data_sha"]}
    assert read[0]["uri"] == f"file://{os.path.realpath(str(record['ws']))}/data.csv"
    assert any(m["name"].endswith("bash") or "/" in m["name"] for m in materials
               if m["name"] != "data.csv")  # the executable is still there


def test_show_prints_a_commands_colours_as_text_not_raw_escapes(
        record: dict[str, object], places: dict[str, str]) -> None:
    proc = cli("show", places["receipt"], "--record", places["record"],
               cwd=Path(places["empty"]))
    assert proc.returncode == 0, proc.stderr
    tail = proc.stdout.split("\nstdout_tail\n", 1)[1]  # the command line shows its own text
    assert tail.startswith("green\n"), proc.stdout
    assert "\x1b" not in proc.stdout and "\\x1b" not in tail and "[32m" not in tail, tail


# ---------------------------------------------------------------------- exec


@pytest.fixture
def state(tmp_path: Path) -> dict[str, str]:
    """An environment whose default records live under ``tmp_path``."""
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}


def test_the_pipeline_notebook_without_its_mode_says_the_command_to_run(
        tmp_path: Path, state: dict[str, str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = cli("exec", REPO / "notebooks" / "reusable_pipeline.ipynb", "--workdir", ws,
               "--stop-on-error", cwd=tmp_path, env=state)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "(see above)" not in proc.stdout
    assert "host-kernel exec --mode reusable_pipeline notebooks/reusable_pipeline.ipynb" \
        in proc.stdout, proc.stdout
    assert "stopped at cell 2" in proc.stdout
    no_noise(proc.stderr)


def test_exec_refuses_a_read_only_workspace_in_one_line_before_starting(
        tmp_path: Path, state: dict[str, str]) -> None:
    nb = tmp_path / "nb.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(1)")]), nb)
    ro = tmp_path / "ro"
    ro.mkdir()
    argv = [sys.executable, "-m", "host_kernel", "exec", str(nb), "--workdir", str(ro)]
    if shutil.which("unshare") and subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True, check=False).returncode == 0:
        # A read-only tmpfs over the workspace, in a mount namespace of the command's own:
        # read-only for root too, where chmod stops nothing.
        script = f"mount -t tmpfs -o ro tmpfs {ro} && exec \"$@\""
        argv = ["unshare", "-rm", "sh", "-c", script, "sh", *argv]
    elif os.geteuid() != 0:
        ro.chmod(0o555)
    else:
        pytest.skip("NO WAY TO MAKE A READ-ONLY FOLDER HERE: root, and unshare -rm fails")
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=state, stdin=subprocess.DEVNULL, check=False)
    ro.chmod(0o755)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"host-kernel exec: error: the workspace {ro} is not "
                                  f"writable ("), proc.stderr
    assert not (tmp_path / "state").exists()  # nothing started, no record made


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """``host-kernel exec`` of a notebook with markdown between its code cells (and an
    empty code cell), into a record folder of its own."""
    root = tmp_path_factory.mktemp("executed")
    ws = root / "ws"
    ws.mkdir()
    nb = ws / "analysis.ipynb"
    nbformat.write(new_notebook(cells=[
        new_markdown_cell("# The analysis"), new_code_cell("x = 1"),
        new_markdown_cell("Then *the sum*."), new_code_cell(""), new_code_cell("print(x + 1)"),
        new_markdown_cell("The end.")]), nb)
    proc = cli("exec", nb, "--record", root / "record", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield {"root": root, "ws": ws, "nb": nb, "record": root / "record"}


def test_exec_records_the_notebook_it_ran_with_its_sha256(executed: dict[str, Path]) -> None:
    with open_verified(executed["record"]) as ledger:
        (row,) = ledger.query("SELECT body FROM events WHERE kind = 'session_started'")
    body = json.loads(row["body"])
    assert body["notebook"] == {"path": "analysis.ipynb", "sha256": hashlib.sha256(
        executed["nb"].read_bytes()).hexdigest()}
    assert body["request"] is None  # the notebook is not the task's text


def test_export_puts_the_notebooks_markdown_back_between_its_cells(
        executed: dict[str, Path]) -> None:
    proc = cli("export", executed["record"], cwd=executed["root"])
    assert proc.returncode == 0, proc.stderr
    nb = nbformat.reads(proc.stdout, as_version=4)
    nbformat.validate(nb)
    assert [(c.cell_type, c.source) for c in nb.cells] == [
        ("markdown", "# The analysis"), ("code", "x = 1"), ("markdown", "Then *the sum*."),
        ("code", "print(x + 1)"), ("markdown", "The end.")]
    assert nb.metadata["host_kernel"]["notebook"]["markdown"] == "kept"


def test_export_says_why_the_markdown_is_missing_when_the_notebook_changed(
        executed: dict[str, Path]) -> None:
    nb, saved = executed["nb"], executed["nb"].read_bytes()
    try:
        nb.write_bytes(saved + b"\n")
        proc = cli("export", executed["record"], cwd=executed["root"])
    finally:
        nb.write_bytes(saved)
    assert proc.returncode == 0, proc.stderr
    out = nbformat.reads(proc.stdout, as_version=4)
    assert [c.cell_type for c in out.cells] == ["markdown", "code", "code"]
    assert "has changed since the session ran it" in out.cells[0].source
    assert "has changed" in out.metadata["host_kernel"]["notebook"]["markdown"]


def test_exec_into_another_workspaces_record_is_refused_unless_allowed(
        executed: dict[str, Path]) -> None:
    other = executed["root"] / "other"
    other.mkdir(exist_ok=True)
    nb = other / "nb.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print('other')")]), nb)
    proc = cli("exec", nb, "--record", executed["record"], cwd=other)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert f"is the record of the workspace {os.path.realpath(executed['ws'])}" in proc.stderr
    assert "--other-workspace" in proc.stderr
    allowed = cli("exec", nb, "--record", executed["record"], "--other-workspace", cwd=other)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    with open_verified(executed["record"]) as ledger:
        workdirs = [r["workdir"] for r in ledger.query(
            "SELECT workdir FROM sessions ORDER BY started")]
    assert workdirs == [os.path.realpath(executed["ws"]), os.path.realpath(other)]


# ---------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_during_host_bash_prints_no_traceback_and_says_where_the_record_is(
        tmp_path: Path, state: dict[str, str]) -> None:
    """SIGINT to the command's whole process group, as a terminal sends Ctrl-C."""
    ws = tmp_path / "ws"
    ws.mkdir()
    nb = ws / "nb.ipynb"
    nbformat.write(new_notebook(cells=[
        new_code_cell("print('before')"),
        new_code_cell("open('ready', 'w').close()\nr = host.bash('sleep 30')"),
        new_code_cell("print('never run')")]), nb)
    record = tmp_path / "record"
    proc = subprocess.Popen([sys.executable, "-m", "host_kernel", "exec", str(nb), "--record",
                             str(record)], cwd=ws, stdin=subprocess.DEVNULL, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=state,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (ws / "ready").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.5)  # the command is running now
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out + err
    assert err == "host-kernel exec: interrupted\n", err
    lines = out.splitlines()
    assert any(line.startswith("--- cell 2 (2/3 code): interrupted, generation 1, ")
               for line in lines), out
    assert "never run" not in out
    summary = [line for line in lines if line.startswith("=== ")]
    assert summary == [summary[0]] and "interrupted at cell 2" in summary[0], out
    assert summary[0].endswith(f"record: {os.path.realpath(record)}"), out
    with open_verified(record) as ledger:
        head = ledger.query("SELECT hash FROM events ORDER BY seq DESC LIMIT 1")[0]["hash"]
        statuses = [r["status"] for r in ledger.query(
            "SELECT status FROM cells ORDER BY seq_started")]
    assert lines[-1] == f"head: {head}"
    assert statuses == ["ok", "interrupted"]
