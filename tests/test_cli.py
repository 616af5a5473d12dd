"""The ``host-kernel`` command line, run as a real subprocess: exit codes, output, help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_raw_cell

from host_kernel import __version__
from host_kernel.cli import COMMANDS

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


def summary_line(stdout: str) -> str:
    return stdout.rstrip("\n").splitlines()[-1]


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
    record = tmp_path / ".host_kernel"
    assert summary_line(proc.stdout).startswith("=== 2 cells run, 0 errors")
    assert summary_line(proc.stdout).endswith(f"record: {record}")
    assert (record / "ledger.sqlite").is_file()
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
    for command in COMMANDS:
        assert command.name in proc.stdout


@pytest.mark.parametrize("name", [c.name for c in COMMANDS])
def test_every_command_has_help(tmp_path: Path, name: str) -> None:
    proc = run_cli(name, "--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"usage: host-kernel {name}")


def test_quickstart_notebook_runs_cleanly_in_an_empty_workdir(tmp_path: Path) -> None:
    proc = run_cli("exec", QUICKSTART, "--workdir", tmp_path, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ", 0 errors" in summary_line(proc.stdout)
    assert (tmp_path / "results" / "summary.json").is_file()


def test_quickstart_notebook_is_committed_clean() -> None:
    nb = nbformat.read(QUICKSTART, as_version=4)
    nbformat.validate(nb)
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert all(c.get("id") for c in nb.cells)
