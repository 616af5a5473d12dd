"""The ``host-kernel`` command line, run as a real subprocess: exit codes, output, help."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_raw_cell

from host_kernel import __version__
from host_kernel._paths import default_record_dir
from host_kernel.cli import all_commands
from host_kernel.store.ledger import SQLiteLedger

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "notebooks" / "quickstart.ipynb"


def run_cli(*args: str | Path, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python -m host_kernel ARGS`` in ``cwd``, with no stdin; output captured as text."""
    return subprocess.run([sys.executable, "-m", "host_kernel", *map(str, args)], check=False,
                          cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def write_notebook(path: Path, *cells: nbformat.NotebookNode) -> Path:
    nbformat.write(new_notebook(cells=list(cells)), path)
    return path


@pytest.fixture(autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Default record folders go under a state folder of the test's own (the CLI subprocesses
    inherit it), outside the workspace, never ~/.local/state."""
    home = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


def summary_line(stdout: str) -> str:
    """The ``=== …`` line exec ends with (only the ``head:`` line follows it)."""
    return next(line for line in reversed(stdout.splitlines()) if line.startswith("=== "))


def head_line(stdout: str) -> str:
    last = stdout.rstrip("\n").splitlines()[-1]
    assert re.fullmatch(r"head: [0-9a-f]{64}", last), last
    return last.removeprefix("head: ")


def last_hash(record: Path) -> str:
    with SQLiteLedger.open_readonly(record / "ledger.sqlite") as ledger:
        head = ledger.head()
    assert head is not None
    return head.hash


def test_exec_runs_code_cells_and_ends_with_a_summary(tmp_path: Path) -> None:
    nb = write_notebook(
        tmp_path / "ok.ipynb",
        new_markdown_cell("# not code: `raise SystemExit(3)`"),
        new_code_cell("x = 6 * 7\nprint('the answer is', x)"),
        new_raw_cell("1/0"),
        new_code_cell("host.write_file('out.txt', str(x))"),
        new_code_cell("   \n"),
    )
    proc = run_cli("exec", nb, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the answer is 42" in proc.stdout
    # one header per non-empty code cell: notebook index, status, generation
    headers = [line for line in proc.stdout.splitlines() if line.startswith("--- cell ")]
    assert len(headers) == 2
    assert headers[0].startswith("--- cell 2 (1/2 code): ok, generation 1")
    assert headers[1].startswith("--- cell 4 (2/2 code): ok, generation 1")
    record = default_record_dir(tmp_path)  # outside the workspace, under XDG_STATE_HOME
    assert summary_line(proc.stdout).startswith("=== 2 cells run, 0 errors")
    assert summary_line(proc.stdout).endswith(f"record: {record}")
    assert (record / "ledger.sqlite").is_file()
    assert not (tmp_path / ".host_kernel").exists()
    assert head_line(proc.stdout) == last_hash(record)
    assert (tmp_path / "out.txt").read_text() == "42"


def test_exec_uses_the_given_workdir_and_record(tmp_path: Path) -> None:
    nb = write_notebook(tmp_path / "nb.ipynb", new_code_cell("host.write_file('w.txt', 'hi')"))
    work, record = tmp_path / "work", tmp_path / "elsewhere" / "record"
    work.mkdir()
    proc = run_cli("exec", nb, "--workdir", work, "--record", record, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (work / "w.txt").read_text() == "hi"
    assert (record / "ledger.sqlite").is_file()
    assert summary_line(proc.stdout).endswith(f"record: {record}")
    assert head_line(proc.stdout) == last_hash(record)


def test_exec_runs_several_notebooks_each_in_a_session_of_its_own(tmp_path: Path) -> None:
    """A batch: one session per notebook; the later ones start from the pool's standby."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_notebook(tmp_path / "a" / "first.ipynb", new_code_cell("x = 1\nprint('one')"))
    second = write_notebook(tmp_path / "b" / "second.ipynb",
                            new_code_cell("print('x' in globals(), 'two')"))
    proc = run_cli("exec", first, second, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"### notebook 1/2: {first}"
    assert f"### notebook 2/2: {second}" in lines
    assert "False two" in proc.stdout
    assert lines[-1] == "### 2 notebooks run, 0 failed"
    warm = []
    for folder in ("a", "b"):
        record = default_record_dir(tmp_path / folder)
        with SQLiteLedger.open_readonly(record / "ledger.sqlite") as ledger:
            [row] = ledger.query("SELECT body FROM events WHERE kind = 'generation_started'")
        warm.append(json.loads(row["body"])["warm"]["used"])
    assert warm[1] is True


def test_exec_record_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    nb = write_notebook(tmp_path / "nb.ipynb", new_code_cell("pass"))
    (tmp_path / "record").write_text("not a folder")
    proc = run_cli("exec", nb, "--record", tmp_path / "record", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith("host-kernel exec: error: [record_missing]")
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_the_head_exec_prints_is_what_audit_expects_later(tmp_path: Path) -> None:
    nb = write_notebook(tmp_path / "nb.ipynb", new_code_cell("print('hi')"))
    head = head_line(run_cli("exec", nb, cwd=tmp_path).stdout)
    # audit finds the record from the workspace it is run in, and holds it to that head
    proc = run_cli("audit", "--expect-head", head, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"head: {head}" in proc.stdout.splitlines()
    with SQLiteLedger(default_record_dir(tmp_path) / "ledger.sqlite") as ledger:
        ledger.append("later", "note", {"text": "appended after exec"})
    proc = run_cli("audit", tmp_path, "--expect-head", head, cwd=tmp_path)
    assert proc.returncode == 1
    [finding] = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert finding.startswith("FAIL [head_mismatch]") and "1 events follow it" in finding
    assert proc.stderr.startswith("host-kernel audit: error: [head_mismatch]")
    assert proc.stderr.count("\n") == 1
    proc = run_cli("audit", tmp_path, "--expect-head", "abc", cwd=tmp_path)
    assert proc.returncode == 2 and "64 hex digits" in proc.stderr


def test_lineage_and_receipt_find_the_record_and_refuse_a_drifted_one(tmp_path: Path) -> None:
    nb = write_notebook(
        tmp_path / "nb.ipynb",
        new_code_cell("host.write_file('a.csv', 'x\\n1\\n')\nr = host.bash('wc -l a.csv')\n"
                      "a = host.save_artifact('a.csv')"))
    assert run_cli("exec", nb, cwd=tmp_path).returncode == 0
    record = default_record_dir(tmp_path)
    db = sqlite3.connect(record / "ledger.sqlite")
    artifact = db.execute("SELECT artifact_id FROM artifacts").fetchone()[0]
    receipt = db.execute("SELECT receipt_id FROM receipts").fetchone()[0]
    db.close()
    elsewhere = tmp_path.parent
    lineage = run_cli("lineage", artifact, "--workdir", tmp_path, cwd=elsewhere)
    assert lineage.returncode == 0, lineage.stderr
    assert lineage.stdout.startswith("artifact a.csv")
    statement = run_cli("receipt", receipt, cwd=tmp_path)  # the current directory's record
    assert statement.returncode == 0, statement.stderr
    assert '"return-value": 0' in statement.stdout
    here = run_cli("lineage", artifact, "--format", "json", cwd=tmp_path)
    assert here.returncode == 0, here.stderr
    assert json.loads(here.stdout)
    session = json.loads(run_cli("ls", "--json", cwd=tmp_path).stdout)["rows"][0]["session"]
    exported = run_cli("export", "--session", session[:8], cwd=tmp_path)  # a prefix will do
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["metadata"]["host_kernel"]["session"] == session

    db = sqlite3.connect(record / "ledger.sqlite")
    db.execute("UPDATE artifacts SET sha256 = ?", ("f" * 64,))
    db.execute("UPDATE receipts SET exit_status = 1")
    db.commit()
    db.close()
    for name, proc in (("lineage", run_cli("lineage", artifact, "--record", record,
                                           cwd=elsewhere)),
                       ("receipt", run_cli("receipt", receipt, "--workdir", tmp_path,
                                           cwd=elsewhere))):
        assert proc.returncode == 1
        assert proc.stdout == ""  # the drifted values are never shown
        assert proc.stderr.startswith(f"host-kernel {name}: error: [projection_drift]")
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_reading_commands_without_a_record_say_so_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for args in (["lineage", "some-id"], ["receipt", "some-id", "--record", tmp_path / "file"],
                 ["audit"], ["export"], ["audit", tmp_path / "file"]):
        proc = run_cli(*args, cwd=tmp_path)
        assert proc.returncode == 1, args
        assert proc.stderr.startswith(f"host-kernel {args[0]}: error: [record_missing]"), \
            (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stdout == ""


def test_exec_exits_1_when_a_cell_fails_and_keeps_going(tmp_path: Path) -> None:
    nb = write_notebook(
        tmp_path / "bad.ipynb",
        new_code_cell("1 / 0"),
        new_code_cell("print('after the error')"),
    )
    proc = run_cli("exec", nb, cwd=tmp_path)
    assert proc.returncode == 1
    assert "--- cell 1 (1/2 code): error, generation 1" in proc.stdout
    assert "ZeroDivisionError" in proc.stdout
    assert "after the error" in proc.stdout
    assert summary_line(proc.stdout).startswith("=== 2 cells run, 1 error (error 1)")


def test_exec_stop_on_error_stops_at_the_failed_cell(tmp_path: Path) -> None:
    nb = write_notebook(
        tmp_path / "bad.ipynb",
        new_code_cell("raise ValueError('boom')"),
        new_code_cell("print('never printed')"),
    )
    proc = run_cli("exec", nb, "--stop-on-error", cwd=tmp_path)
    assert proc.returncode == 1
    assert "never printed" not in proc.stdout
    assert "=== 1 cell run, 1 error (error 1), stopped at cell 1" in summary_line(proc.stdout)


def test_exec_counts_a_timeout_as_a_failure(tmp_path: Path) -> None:
    nb = write_notebook(tmp_path / "slow.ipynb", new_code_cell("import time\ntime.sleep(30)"))
    proc = run_cli("exec", nb, "--timeout", "0.5", cwd=tmp_path)
    assert proc.returncode == 1
    assert "--- cell 1 (1/1 code): timeout" in proc.stdout
    assert "(timeout 1)" in summary_line(proc.stdout)


def test_exec_missing_notebook_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_cli("exec", tmp_path / "absent.ipynb", cwd=tmp_path)
    assert proc.returncode == 2
    assert "no such file" in proc.stderr and "absent.ipynb" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("content", ["this is not json", "{}", "[1, 2]"])
def test_exec_non_notebook_is_a_usage_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "fake.ipynb"
    path.write_text(content)
    proc = run_cli("exec", path, cwd=tmp_path)
    assert proc.returncode == 2
    assert "not a notebook" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("flags", [["--mode", "no_such_mode"], ["--timeout", "0"],
                                   ["--workdir", "missing-dir"]])
def test_exec_bad_flag_values_are_usage_errors(tmp_path: Path, flags: list[str]) -> None:
    nb = write_notebook(tmp_path / "nb.ipynb", new_code_cell("pass"))
    proc = run_cli("exec", nb, *flags, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("host-kernel exec: error:")


def test_version_prints_the_package_version(tmp_path: Path) -> None:
    proc = run_cli("--version", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"host-kernel {__version__}"


def test_no_command_prints_help_and_exits_2(tmp_path: Path) -> None:
    proc = run_cli(cwd=tmp_path)
    assert proc.returncode == 2
    assert "usage: host-kernel" in proc.stderr


def test_top_level_help_lists_every_command(tmp_path: Path) -> None:
    proc = run_cli("--help", cwd=tmp_path)
    assert proc.returncode == 0
    for command in all_commands():
        assert command.name in proc.stdout


@pytest.mark.parametrize("name", [c.name for c in all_commands()])
def test_every_command_has_help(tmp_path: Path, name: str) -> None:
    proc = run_cli(name, "--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"usage: host-kernel {name}")


def test_quickstart_notebook_runs_cleanly_in_an_empty_workdir(tmp_path: Path) -> None:
    proc = run_cli("exec", QUICKSTART, "--workdir", tmp_path, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ", 0 errors" in summary_line(proc.stdout)
    assert (tmp_path / "results" / "summary.json").is_file()


def test_quickstart_notebook_is_a_valid_v4_5_notebook_with_cell_ids() -> None:
    # Its saved outputs (the rich displays) are compared by nbval: tests/test_notebooks.py.
    nb = nbformat.read(QUICKSTART, as_version=4)
    nbformat.validate(nb)
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    assert [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("id") for c in nb.cells)


def test_exec_blobs_takes_a_plain_path_and_refuses_a_store_it_cannot_use(tmp_path: Path) -> None:
    nb = write_notebook(tmp_path / "nb.ipynb", new_code_cell(
        "open('r.txt', 'w').write('kept')\nprint(host.save_artifact('r.txt').sha256)"))
    work = tmp_path / "work"
    work.mkdir()
    # A relative plain path: a folder (a shared file system's), resolved where exec runs.
    proc = run_cli("exec", nb, "--workdir", work, "--blobs", "shared blobs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sha = re.search(r"^([0-9a-f]{64})$", proc.stdout, re.M)
    assert sha is not None, proc.stdout
    from host_kernel.store.fsblobs import FsspecBlobStore

    assert FsspecBlobStore(str(tmp_path / "shared blobs")).read(sha[1]) == b"kept"

    for blobs, says in (("glob*", "cannot contain *, ? or ["),
                        ("nosuchproto://x/y", "Protocol not known"),
                        ("memory://", "names no folder or bucket")):
        proc = run_cli("exec", nb, "--workdir", work, "--blobs", blobs, cwd=tmp_path)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith("host-kernel exec: error: the Host could not start: "
                               "[bad_arguments] blobs: ") and says in line, line
    assert not list(tmp_path.glob("glob*"))


@pytest.mark.parametrize("argv", [
    ("ls", "--ledger", "mysql://u:hunter2@db/x"),
    ("audit", "--ledger", "mysql://u:hunter2@db/x"),
    ("show", "x", "--ledger", "mysql://u:hunter2@db/x?password=hunter2"),
    ("exec", "{nb}", "--ledger", "mysql://u:hunter2@db/x"),
    ("ls", "--ledger", "host=db user=u password=hunter2 dbname=x"),  # libpq's key=value
    ("audit", "--ledger", "u:hunter2@db/x"),
])
def test_a_ledger_url_of_the_wrong_kind_is_refused_without_its_password(
        argv: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from host_kernel.cli import main

    nb = write_notebook(tmp_path / "nb.ipynb", new_code_cell("1"))
    assert main([a.format(nb=nb) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "--ledger takes a postgresql:// URL" in err and "hunter2" not in err, err


@pytest.mark.parametrize("since", ["nan", "inf", "1e999", "yesterday"])
def test_audit_since_must_be_a_time(since: str, capsys: pytest.CaptureFixture[str]) -> None:
    from host_kernel.cli import main

    assert main(["audit", "--ledger", "postgresql://127.0.0.1:9/x", "--since", since]) == 2
    assert "argument --since" in capsys.readouterr().err


def test_view_blobs_goes_with_a_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from host_kernel.cli import main

    assert main(["view", str(tmp_path), "--blobs", "s3://bucket/x", "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err == "host-kernel view: error: --blobs goes with --ledger: a record folder holds " \
                  "its own blobs\n", err
