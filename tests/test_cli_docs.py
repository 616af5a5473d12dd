"""docs/cli.md's examples run: every command line of its ``bash`` blocks, with its exit code.

How the examples are written, and what this test fills in, is the last section
of docs/cli.md ("The examples in this file").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from host_kernel.store.ledger import SQLiteLedger

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "cli.md"

_EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")
_NOT_RUN = re.compile(r"\s+#\s*not run:\s*(.*)$")
PLACEHOLDERS = ("SESSION_ID", "CELL_ID", "RECEIPT_ID", "ARTIFACT_ID", "VERDICT_ID", "HASH")


def examples() -> list[tuple[int, str]]:
    """``(line number, command line)`` of every ``host-kernel`` line in a bash block."""
    found: list[tuple[int, str]] = []
    in_bash = False
    for number, line in enumerate(DOC.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            in_bash = not in_bash and line.strip() == "```bash"
            continue
        if in_bash and line.strip().startswith("host-kernel"):
            found.append((number, line.strip()))
    return found


def test_the_doc_has_examples_and_says_why_one_is_not_run() -> None:
    lines = examples()
    assert len(lines) >= 20
    for number, line in lines:
        skipped = _NOT_RUN.search(line)
        assert skipped is None or skipped.group(1).strip(), f"cli.md:{number}: say why"
        assert "\t" not in line


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """The scratch workspace the examples run in, and the environment they run with."""
    root = tmp_path_factory.mktemp("docs")
    ws = root / "ws"
    (ws / "notebooks").mkdir(parents=True)
    (ws / "work").mkdir()
    shutil.copy(REPO / "notebooks" / "quickstart.ipynb", ws / "notebooks")
    rich = new_notebook(cells=[
        new_markdown_cell("# an analysis"),
        new_code_cell("host.write_file('data.csv', 'x\\n1\\n2\\n')\n"
                      "r = host.bash('wc -l data.csv')"),
        new_code_cell("a = host.save_artifact('data.csv')\na.artifact_id"),
        new_code_cell("host.submit_output({'rows': 2}, ['counted the rows of data.csv'], "
                      "task_status='completed')"),
    ])
    for name in ("nb.ipynb", "analysis.ipynb"):
        nbformat.write(rich, ws / name)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "host-kernel"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m host_kernel \"$@\"\n")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "XDG_STATE_HOME": str(root / "state"), "TMPDIR": str(root)}
    env.pop("FORCE_COLOR", None)
    yield ws, env


def fill(line: str, ws: Path, env: dict[str, str]) -> str:
    """The line with its placeholders replaced by ids from the workspace's record."""
    if not any(p in line for p in PLACEHOLDERS):
        return line

    def first(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "host_kernel", *args, "--json"], cwd=ws,
                              env=env, capture_output=True, text=True, timeout=60, check=True)
        data = json.loads(proc.stdout)
        return str(data["rows"][-1][next(iter(data["rows"][-1]))])

    values = {
        "SESSION_ID": lambda: first("ls"),
        "CELL_ID": lambda: first("ls", "--cells"),
        "RECEIPT_ID": lambda: first("ls", "--receipts"),
        "ARTIFACT_ID": lambda: first("ls", "--artifacts"),
        "VERDICT_ID": lambda: first("ls", "--verdicts"),
    }
    for name, value in values.items():
        if name in line:
            line = line.replace(name, value())
    if "HASH" in line:
        record = json.loads(subprocess.run(
            [sys.executable, "-m", "host_kernel", "ls", "--json"], cwd=ws, env=env,
            capture_output=True, text=True, timeout=60, check=True).stdout)["record"]
        with SQLiteLedger.open_readonly(Path(record) / "ledger.sqlite") as ledger:
            head = ledger.head()
        assert head is not None
        line = line.replace("HASH", head.hash)
    return line


def test_every_example_in_cli_md_runs_with_its_exit_code(
        workspace: tuple[Path, dict[str, str]]) -> None:
    ws, env = workspace
    ran = 0
    for number, line in examples():
        if _NOT_RUN.search(line):
            continue
        expected = 0
        match = _EXIT.search(line)
        if match:
            expected = int(match.group(1))
            line = line[:match.start()]
        command = fill(line, ws, env)
        proc = subprocess.run(["bash", "-c", command], cwd=ws, env=env, capture_output=True,
                              text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
        where = f"docs/cli.md:{number}: {command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        assert proc.returncode == expected, where
        assert "Traceback" not in proc.stderr, where
        ran += 1
    assert ran >= 15
