"""One error style on every command: bad input of every kind, a closed stdout, Ctrl-C.

The table :data:`BAD_INPUTS` gives every command a decision for every kind of
bad input: the arguments that make it, and what must come back (exit code and
the words of the one ``host-kernel CMD: error: …`` line), or why it does not
apply. A command added to the registry without a row fails
:func:`test_every_command_has_a_row_for_every_bad_input`.
"""

from __future__ import annotations

import _thread
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from host_kernel import Host
from host_kernel.cli import all_commands, main
from host_kernel.export import export_notebook
from host_kernel.store.verified import open_verified

#: Every kind of bad input each command must answer.
INPUTS = ("unknown_flag", "missing_argument", "record_is_file", "garbage_ledger", "no_record",
          "unknown_id", "invalid_notebook", "missing_notebook")


@dataclass(frozen=True)
class Bad:
    """Arguments (``{name}`` is a path of :func:`places`), the exit code, and words the
    error line must hold; ``usage``: argparse's usage line of the command comes first."""

    argv: tuple[str, ...]
    code: int
    says: str
    usage: bool = False


def na(why: str) -> str:
    return f"does not apply: {why}"


_RUN = ("run", "a task", "--base-url", "http://127.0.0.1:9/v1", "--model", "m")

BAD_INPUTS: dict[str, dict[str, Bad | str]] = {
    "exec": {
        "unknown_flag": Bad(("exec", "{good_nb}", "--bogus"), 2,
                            "unrecognized arguments: --bogus", usage=True),
        "missing_argument": Bad(("exec",), 2, "the following arguments are required",
                                usage=True),
        "record_is_file": Bad(("exec", "{good_nb}", "--record", "{file}"), 1,
                              "[record_missing]"),
        "garbage_ledger": Bad(("exec", "{good_nb}", "--workdir", "{elsewhere}", "--record",
                               "{garbage}"), 1, "cannot open the ledger"),
        "no_record": na("exec creates its record"),
        "unknown_id": na("exec takes no id"),
        "invalid_notebook": Bad(("exec", "{bad_nb}"), 2, "not a notebook: "),
        "missing_notebook": Bad(("exec", "{no_nb}"), 2, "no such file"),
    },
    "batch": {
        "unknown_flag": Bad(("batch", "{good_nb}", "--bogus"), 2,
                            "unrecognized arguments: --bogus", usage=True),
        "missing_argument": Bad(("batch",), 2,
                                "give notebooks, folders of notebooks, or --tasks FILE"),
        "record_is_file": Bad(("batch", "{good_nb}", "--records", "{file}"), 1,
                              "[record_missing]"),
        "garbage_ledger": Bad(("batch", "{good_nb}", "--ledger", "mysql://x/y"), 2,
                              "postgresql://"),
        "no_record": na("batch creates its records"),
        "unknown_id": na("batch takes no id"),
        "invalid_notebook": Bad(("batch", "{bad_nb}"), 2, "not a notebook: "),
        "missing_notebook": Bad(("batch", "{no_nb}"), 2, "no such file"),
    },
    "audit": {
        "unknown_flag": Bad(("audit", "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("audit", "--expect-head"), 2, "expected one argument",
                                usage=True),
        "record_is_file": Bad(("audit", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": Bad(("audit", "{garbage}"), 1, "[ledger_truncated]"),
        "no_record": Bad(("audit",), 1, "[record_missing]"),
        "unknown_id": na("audit takes no id"),
        "invalid_notebook": na("audit reads no notebook"),
        "missing_notebook": na("audit reads no notebook"),
    },
    "ls": {
        "unknown_flag": Bad(("ls", "--bogus"), 2, "unrecognized arguments: --bogus", usage=True),
        "missing_argument": Bad(("ls", "--session"), 2, "expected one argument", usage=True),
        "record_is_file": Bad(("ls", "--record", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": Bad(("ls", "{garbage}"), 1, "[ledger_truncated]"),
        "no_record": Bad(("ls",), 1, "[record_missing]"),
        "unknown_id": Bad(("ls", "{record}", "--session", "nope"), 2, "no session id"),
        "invalid_notebook": na("ls reads no notebook"),
        "missing_notebook": na("ls reads no notebook"),
    },
    "show": {
        "unknown_flag": Bad(("show", "x", "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("show",), 2, "the following arguments are required: ID",
                                usage=True),
        "record_is_file": Bad(("show", "x", "--record", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": Bad(("show", "x", "--record", "{garbage}"), 1, "[ledger_truncated]"),
        "no_record": Bad(("show", "x"), 1, "[record_missing]"),
        "unknown_id": Bad(("show", "nope", "--record", "{record}"), 2,
                          "no session, cell, receipt, artifact or verdict id"),
        "invalid_notebook": na("show reads no notebook"),
        "missing_notebook": na("show reads no notebook"),
    },
    "lineage": {
        "unknown_flag": Bad(("lineage", "x", "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("lineage",), 2, "the following arguments are required",
                                usage=True),
        "record_is_file": Bad(("lineage", "x", "--record", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": Bad(("lineage", "x", "--record", "{garbage}"), 1,
                              "[ledger_truncated]"),
        "no_record": Bad(("lineage", "x"), 1, "[record_missing]"),
        "unknown_id": Bad(("lineage", "nope", "--record", "{record}"), 2, "nope"),
        "invalid_notebook": na("lineage reads no notebook"),
        "missing_notebook": na("lineage reads no notebook"),
    },
    "slice": {
        "unknown_flag": Bad(("slice", "x", "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("slice",), 2, "the following arguments are required",
                                usage=True),
        "record_is_file": Bad(("slice", "x", "--record", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": Bad(("slice", "x", "--record", "{garbage}"), 1,
                              "[ledger_truncated]"),
        "no_record": Bad(("slice", "x"), 1, "[record_missing]"),
        "unknown_id": Bad(("slice", "nope", "--record", "{record}"), 2, "nope"),
        "invalid_notebook": na("slice reads no notebook"),
        "missing_notebook": na("slice reads no notebook"),
    },
    "rederive": {
        "unknown_flag": Bad(("rederive", "x", "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("rederive",), 2, "the following arguments are required",
                                usage=True),
        "record_is_file": Bad(("rederive", "x", "--record", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": Bad(("rederive", "x", "--record", "{garbage}"), 1,
                              "[ledger_truncated]"),
        "no_record": Bad(("rederive", "x"), 1, "[record_missing]"),
        "unknown_id": Bad(("rederive", "nope", "--record", "{record}"), 2, "nope"),
        "invalid_notebook": na("rederive reads no notebook"),
        "missing_notebook": na("rederive reads no notebook"),
    },
    "receipt": {
        "unknown_flag": Bad(("receipt", "x", "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("receipt",), 2, "the following arguments are required",
                                usage=True),
        "record_is_file": Bad(("receipt", "x", "--record", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": Bad(("receipt", "x", "--workdir", "{garbage}"), 1,
                              "[ledger_truncated]"),
        "no_record": Bad(("receipt", "x"), 1, "[record_missing]"),
        "unknown_id": Bad(("receipt", "nope", "--record", "{record}"), 2, "nope"),
        "invalid_notebook": na("receipt reads no notebook"),
        "missing_notebook": na("receipt reads no notebook"),
    },
    "install": {
        "unknown_flag": Bad(("install", "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("install", "--name"), 2, "expected one argument", usage=True),
        "record_is_file": Bad(("install", "--prefix", "{prefix}", "--record", "{file}"), 1,
                              "[record_missing]"),
        "garbage_ledger": na("install only names the record; the kernel opens it"),
        "no_record": na("install needs no record"),
        "unknown_id": Bad(("install", "--prefix", "{prefix}", "--mode", "nope"), 2,
                          "unknown task mode"),
        "invalid_notebook": na("install reads no notebook"),
        "missing_notebook": na("install reads no notebook"),
    },
    "uninstall": {
        "unknown_flag": Bad(("uninstall", "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("uninstall", "--name"), 2, "expected one argument",
                                usage=True),
        "record_is_file": na("uninstall takes no record"),
        "garbage_ledger": na("uninstall takes no record"),
        "no_record": na("uninstall takes no record"),
        "unknown_id": Bad(("uninstall", "--name", "no_such_kernel_here"), 2,
                          "no kernelspec named"),
        "invalid_notebook": na("uninstall reads no notebook"),
        "missing_notebook": na("uninstall reads no notebook"),
    },
    "export": {
        "unknown_flag": Bad(("export", "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("export", "-o"), 2, "expected one argument", usage=True),
        "record_is_file": Bad(("export", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": Bad(("export", "--record", "{garbage}"), 1, "[ledger_truncated]"),
        "no_record": Bad(("export",), 1, "[record_missing]"),
        "unknown_id": Bad(("export", "{record}", "--session", "nope"), 2, "no session 'nope'"),
        "invalid_notebook": na("export writes a notebook, reads none"),
        "missing_notebook": na("export writes a notebook, reads none"),
    },
    "run": {
        "unknown_flag": Bad((*_RUN, "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("run", "a task"), 2, "the following arguments are required",
                                usage=True),
        "record_is_file": Bad((*_RUN, "--record", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": na("run would start the agent; its Host refuses the ledger as "
                             "exec's does"),
        "no_record": na("run creates its record"),
        "unknown_id": Bad((*_RUN, "--mode", "nope"), 2, "unknown task mode"),
        "invalid_notebook": na("run reads no notebook"),
        "missing_notebook": na("run reads no notebook"),
    },
    "trace": {
        "unknown_flag": Bad(("trace", "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("trace", "--session"), 2, "expected one argument", usage=True),
        "record_is_file": Bad(("trace", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": Bad(("trace", "{garbage}"), 1, "[record_missing]"),
        "no_record": Bad(("trace",), 1, "[record_missing]"),
        "unknown_id": Bad(("trace", "{events}", "--session", "nope"), 2, "no session nope"),
        "invalid_notebook": na("trace reads no notebook"),
        "missing_notebook": na("trace reads no notebook"),
    },
    "mcp": {
        "unknown_flag": Bad(("mcp", "--bogus"), 2, "unrecognized arguments: --bogus", usage=True),
        "missing_argument": Bad(("mcp", "--workdir"), 2, "expected one argument", usage=True),
        "record_is_file": Bad(("mcp", "--record", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": na("mcp would start serving; its Host refuses the ledger as exec's "
                             "does"),
        "no_record": na("mcp creates its record"),
        "unknown_id": Bad(("mcp", "--mode", "nope"), 2, "unknown task mode"),
        "invalid_notebook": na("mcp reads no notebook"),
        "missing_notebook": na("mcp reads no notebook"),
    },
    "view": {
        "unknown_flag": Bad(("view", "--bogus"), 2, "unrecognized arguments: --bogus",
                            usage=True),
        "missing_argument": Bad(("view", "--port"), 2, "expected one argument", usage=True),
        "record_is_file": Bad(("view", "{file}"), 1, "[record_missing]"),
        "garbage_ledger": na("view serves a refused record as a red banner: a server would "
                             "start"),
        "no_record": Bad(("view",), 1, "[record_missing]"),
        "unknown_id": na("view takes no id"),
        "invalid_notebook": na("view reads no notebook"),
        "missing_notebook": na("view reads no notebook"),
    },
}


def test_every_command_has_a_row_for_every_bad_input() -> None:
    names = {c.name for c in all_commands()}
    missing = names - BAD_INPUTS.keys()
    assert not missing, f"commands with no row in BAD_INPUTS: {sorted(missing)}"
    for name in names:
        assert set(BAD_INPUTS[name]) == set(INPUTS), name
        for decision in BAD_INPUTS[name].values():
            assert isinstance(decision, Bad) or decision.startswith("does not apply: ")


# ---------------------------------------------------------------------- places


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Paths the bad inputs name: a plain file, a record folder with a garbage ledger, a
    notebook whose code cell has no source, a good notebook, a real record."""
    root = tmp_path_factory.mktemp("bad")
    file = root / "plain.txt"
    file.write_text("not a record")
    garbage = root / "garbage"
    garbage.mkdir()
    (garbage / "ledger.sqlite").write_bytes(b"this is no SQLite database" * 10)
    good = root / "good.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), good)
    bad = root / "bad.ipynb"
    broken = json.loads(good.read_text())
    del broken["cells"][0]["source"]
    bad.write_text(json.dumps(broken))
    events = root / "agent-events.ndjson"
    events.write_text(json.dumps({"session": "abc", "kind": "session_started", "data": {}})
                      + "\n")
    workspace = root / "ws"
    workspace.mkdir()
    with Host(workspace, record_dir=root / "record") as host:
        host.execute("print(1)")
    prefix = root / "prefix"
    prefix.mkdir()
    return {"file": file, "garbage": garbage, "good_nb": good, "bad_nb": bad,
            "no_nb": root / "absent.ipynb", "record": root / "record", "events": events,
            "prefix": prefix, "elsewhere": tmp_path_factory.mktemp("elsewhere")}


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory with no record anywhere."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path


CASES = [(name, kind, decision) for name, row in BAD_INPUTS.items()
         for kind, decision in row.items() if isinstance(decision, Bad)]


@pytest.mark.parametrize(("name", "kind", "bad"), CASES,
                         ids=[f"{name}-{kind}" for name, kind, _ in CASES])
def test_bad_input_gets_one_error_line_and_its_exit_code(
        name: str, kind: str, bad: Bad, places: dict[str, Path], nowhere: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    if name not in {c.name for c in all_commands()}:
        pytest.skip(f"{name} is not built in this version")
    argv = [a.format(**{k: str(v) for k, v in places.items()}) for a in bad.argv]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == bad.code, (argv, out, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    error = [line for line in lines if line.startswith(f"host-kernel {name}: error: ")]
    assert error, (argv, err)
    assert bad.says in err, (argv, err)
    if bad.usage:
        assert lines[0].startswith(f"usage: host-kernel {name} "), err
    elif bad.code == 1 and "[" in bad.says:
        assert error[-1].startswith(f"host-kernel {name}: error: [")


def test_a_flag_before_the_command_is_reported_by_the_top_level(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--bogus", "ls"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: host-kernel [-h]")
    assert "host-kernel: error: unrecognized arguments: --bogus" in err


def test_an_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nope"]) == 2
    assert "host-kernel: error: argument COMMAND: invalid choice: 'nope'" in \
        capsys.readouterr().err


@pytest.mark.parametrize("notebook", [
    {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": {"a": 1}},
    {"nbformat": 9, "nbformat_minor": 0, "metadata": {}, "cells": []},
    {"cells": []},
    {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
     "cells": [{"cell_type": "code", "id": "a", "metadata": {}, "outputs": [],
                "execution_count": None}]},
], ids=["cells-not-a-list", "nbformat-9", "no-nbformat", "code-cell-without-source"])
def test_exec_refuses_an_invalid_notebook_before_running_anything(
        notebook: dict[str, object], nowhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = nowhere / "good.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), good)
    path = nowhere / "nb.ipynb"
    path.write_text(json.dumps(notebook))
    # a good notebook first: nothing runs, the bad one is found before any Host starts
    assert main(["exec", str(good), str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"host-kernel exec: error: not a notebook: {path}")
    assert err.count("\n") == 1
    assert not (nowhere / "state").exists()


# ---------------------------------------------------------------------- subprocesses


def cli_process(*args: str | Path, cwd: Path, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "host_kernel", *map(str, args)], cwd=cwd,
                            stdin=subprocess.DEVNULL, text=True, **kwargs)  # type: ignore[call-overload]


def cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "host_kernel", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = tmp_path / "ws"
    ws.mkdir()
    yield ws


def record_cells(ws: Path) -> list[dict[str, object]]:
    proc = cli("ls", "--cells", "--json", cwd=ws)
    assert proc.returncode == 0, proc.stderr
    rows: list[dict[str, object]] = json.loads(proc.stdout)["rows"]
    return rows


def test_exec_into_a_closed_pipe_ends_quietly_and_closes_the_record(workspace: Path) -> None:
    nb = workspace / "nb.ipynb"
    nbformat.write(new_notebook(cells=[
        new_code_cell(f"import time\ntime.sleep(0.2)\nprint('line {i}')") for i in range(4)]), nb)
    proc = cli_process("exec", nb, cwd=workspace, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()  # what `| head -1` reads, then it goes away
    assert first.startswith("--- cell 1 ")
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert err == ""  # no traceback, no "Exception ignored"
    cells = record_cells(workspace)
    assert cells and all(c["status"] == "ok" for c in cells)
    sessions = json.loads(cli("ls", "--json", cwd=workspace).stdout)["rows"]
    assert sessions[0]["ended"] is not None  # the Host closed its session
    assert cli("audit", cwd=workspace).returncode == 0


@pytest.mark.parametrize("args", [["ls"], ["ls", "--cells"], ["show", "{cell}"],
                                  ["export"], ["audit"]])
def test_reading_commands_into_a_closed_pipe_end_quietly(workspace: Path,
                                                        args: list[str]) -> None:
    with Host(workspace) as host:
        cell = host.execute("print('hi')").cell_id
    argv = [a.format(cell=cell) for a in args]
    proc = cli_process(*argv, cwd=workspace, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # closed before the command writes anything
    with proc.stderr:
        err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141, err
    assert err == ""


def test_ctrl_c_during_exec_records_the_cell_interrupted_and_exits_130(workspace: Path) -> None:
    nb = workspace / "nb.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print('before')"),
                                       new_code_cell("import time\nprint('partial', "
                                                     "flush=True)\nopen('ready', 'w').close()"
                                                     "\ntime.sleep(60)"),
                                       new_code_cell("print('never run')")]), nb)
    record = workspace.parent / "record"
    proc = cli_process("exec", nb, "--record", record, cwd=workspace, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        # The cell itself says it runs (a SIGINT before its code starts would be caught
        # by ipykernel's loop, and the cell would sleep on).
        while not (workspace / "ready").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err == "host-kernel exec: interrupted\n"
    assert "never run" not in out
    cells = record_cells(record)
    assert [c["status"] for c in cells] == ["ok", "interrupted"]
    audit = cli("audit", record, cwd=workspace)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    cell = export_notebook(record).cells[1]
    assert cell.metadata["host_kernel"]["status"] == "interrupted"
    assert "interrupted" in cell.metadata["host_kernel"]["notice"]
    # What the cell printed before Ctrl-C is kept, then the kernel's KeyboardInterrupt,
    # then the export's marker.
    kinds = [(o["output_type"], o.get("name") or o.get("ename")) for o in cell.outputs]
    assert kinds == [("stream", "stdout"), ("error", "KeyboardInterrupt"),
                     ("error", "Interrupted")], kinds
    assert cell.outputs[0]["text"] == "partial\n"


def ctrl_c_during(host: Host, code: str) -> None:
    """Run ``code``, which creates the file ``ready`` in the workspace once it runs, and press
    Ctrl-C (SIGINT's KeyboardInterrupt in this thread) when that file appears."""
    ready, done = host.workdir / "ready", threading.Event()

    def press() -> None:
        deadline = time.monotonic() + 60
        while not ready.exists() and not done.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not done.is_set():
            _thread.interrupt_main()

    presser = threading.Thread(target=press)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            host.execute(code)
    finally:
        done.set()
        presser.join()
        ready.unlink(missing_ok=True)


def test_a_keyboard_interrupt_in_execute_is_recorded_and_the_host_goes_on(
        workspace: Path) -> None:
    with Host(workspace) as host:
        ctrl_c_during(host, "import time\nprint('so far', flush=True)\n"
                            "open('ready', 'w').close()\ntime.sleep(30)")
        after = host.execute("print('still here')", timeout=30)
        assert after.status == "ok" and "still here" in after.text
        record = host.record_dir
    cells = record_cells(record)
    assert [c["status"] for c in cells] == ["interrupted", "ok"]
    with open_verified(record) as ledger:
        outputs = json.loads(ledger.query("SELECT outputs FROM cells WHERE cell_id = ?",
                                          (cells[0]["cell_id"],))[0]["outputs"])
    assert outputs[0]["text"] == "so far\n"
    assert outputs[-1]["ename"] == "KeyboardInterrupt"
    assert cli("audit", record, cwd=workspace).returncode == 0


def test_ctrl_c_right_after_the_cell_is_sent_still_keeps_its_outputs(workspace: Path) -> None:
    """The gap a loaded machine opens: the request is out, the Host's thread is not yet
    waiting, and the cell has run to its first output when Ctrl-C lands. Made certain here
    by a send that returns only once the cell runs, then raises as SIGINT would."""
    with Host(workspace) as host:
        kc = host.generations.kernel.client
        channel_send = kc.shell_channel.send

        def send_then_ctrl_c(msg: dict) -> None:
            channel_send(msg)
            if msg["header"]["msg_type"] != "execute_request":
                return
            deadline = time.monotonic() + 60
            while not (host.workdir / "ready").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            raise KeyboardInterrupt

        kc.shell_channel.send = send_then_ctrl_c
        try:
            with pytest.raises(KeyboardInterrupt):
                host.execute("import time\nprint('so far', flush=True)\n"
                             "open('ready', 'w').close()\ntime.sleep(30)")
        finally:
            kc.shell_channel.send = channel_send
        after = host.execute("print('still here')", timeout=30)
        assert after.status == "ok" and after.generation == 1
        record = host.record_dir
    cells = record_cells(record)
    assert [c["status"] for c in cells] == ["interrupted", "ok"]
    with open_verified(record) as ledger:
        outputs = json.loads(ledger.query("SELECT outputs FROM cells WHERE cell_id = ?",
                                          (cells[0]["cell_id"],))[0]["outputs"])
    assert outputs[0]["text"] == "so far\n"
    assert outputs[-1]["ename"] == "KeyboardInterrupt"
    assert cli("audit", record, cwd=workspace).returncode == 0


def test_a_cell_that_ignores_the_interrupt_after_ctrl_c_costs_its_kernel(
        workspace: Path) -> None:
    with Host(workspace) as host:
        ctrl_c_during(host, "import signal, time\n"
                            "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])\n"
                            "open('ready', 'w').close()\ntime.sleep(60)")
        after = host.execute("print('fresh kernel')", timeout=30)
        assert after.status == "ok" and after.generation == 2
        record = host.record_dir
    with open_verified(record) as ledger:
        [stuck] = ledger.query("SELECT status FROM cells ORDER BY seq_started LIMIT 1")
        reasons = [r["reason"] for r in ledger.query(
            "SELECT reason FROM generations ORDER BY generation")]
    assert stuck["status"] == "interrupted" and reasons == ["start", "interrupted"]


def _unreadable(kind: str, folder: Path) -> None:
    ledger = folder / "ledger.sqlite"
    if kind == "zero_bytes":
        ledger.write_bytes(b"")
    elif kind == "a_directory":
        ledger.mkdir()
    elif kind == "garbage":
        ledger.write_bytes(os.urandom(4096))
    elif kind == "no_events":
        db = sqlite3.connect(ledger)
        db.execute("CREATE TABLE t (x)")
        db.commit()
        db.close()
    else:  # cut short: a real SQLite header, damaged pages after it
        db = sqlite3.connect(ledger)
        db.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, body TEXT)")
        db.executemany("INSERT INTO events (body) VALUES (?)", [("x" * 500,)] * 50)
        db.commit()
        db.close()
        data = ledger.read_bytes()
        ledger.write_bytes(data[:100] + b"\xff" * (len(data) - 100))


@pytest.mark.parametrize("command", [["lineage", "x", "--record"], ["receipt", "x", "--record"],
                                     ["slice", "x", "--record"], ["rederive", "x", "--record"],
                                     ["show", "x", "--record"], ["ls"], ["export"], ["audit"]],
                         ids=lambda c: c[0])
@pytest.mark.parametrize(("kind", "code"), [
    ("zero_bytes", "ledger_empty"), ("a_directory", "record_missing"),
    ("garbage", "ledger_truncated"), ("no_events", "ledger_empty"),
    ("damaged", "ledger_truncated")])
def test_an_unreadable_ledger_is_refused_with_its_code(
        command: list[str], kind: str, code: str, tmp_path: Path, nowhere: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "record"
    folder.mkdir()
    _unreadable(kind, folder)
    assert main([*command, str(folder)]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith(f"host-kernel {command[0]}: error: [{code}]"), err
