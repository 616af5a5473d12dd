"""The example notebooks run green under the control kernel, with nbclient and with nbval,
and leave a record that holds every cell and audits clean; their saved outputs show the
rich displays (receipt, artifact, verdict and lineage cards), which nbval compares after
sanitising what changes from run to run (tests/nbval_sanitize.cfg)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from test_control_kernel import hk_folders, kernelspecs

from host_kernel._paths import default_record_dir
from host_kernel.audit import audit
from host_kernel.export import export_notebook
from host_kernel.store.ledger import SQLiteLedger, rebuild

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ("quickstart", "reusable_pipeline", "artifact_audit")
SANITIZE = Path(__file__).resolve().parent / "nbval_sanitize.cfg"
CHECKED = "nbval-check-output"  # the cells whose saved outputs nbval compares
MAX_NOTEBOOK_BYTES = 48_000


@pytest.fixture(scope="module")
def jupyter_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with kernelspecs(tmp_path_factory.mktemp("specs")) as prefix:
        yield prefix


def code_sources(nb: object) -> list[str]:
    return [c.source for c in nb.cells  # type: ignore[attr-defined]
            if c.cell_type == "code" and c.source.strip()]


def session_cells(record: Path) -> dict[str, list[tuple[str, str]]]:
    """session → [(code, status)] in order, read from a projection rebuilt from the events."""
    with SQLiteLedger(record / "ledger.sqlite") as ledger:
        trusted = rebuild(ledger)
    try:
        found: dict[str, list[tuple[str, str]]] = {}
        for row in trusted.query("SELECT session, code, status FROM cells ORDER BY seq_started"):
            found.setdefault(row["session"], []).append((row["code"], row["status"]))
        return found
    finally:
        trusted.close()


def assert_clean(record: Path) -> None:
    report = audit(record)
    assert report.clean, [str(f) for f in report.findings]


def cards(cell: object) -> list[str]:
    """The kinds of host_kernel cards in a code cell's saved outputs."""
    htmls = [out.get("data", {}).get("text/html", "")
             for out in cell.outputs]  # type: ignore[attr-defined]
    return [kind for html in htmls for kind in re.findall(r"data-hk-card='(\w+)'", html)]


@pytest.mark.parametrize("name", NAMES)
def test_notebooks_are_committed_valid_with_small_saved_outputs(name: str) -> None:
    path = NOTEBOOKS / f"{name}.ipynb"
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    assert nb.metadata.kernelspec.name.startswith("host_kernel")
    checked = [c for c in nb.cells if CHECKED in c.metadata.get("tags", [])]
    assert checked
    for cell in checked:  # a card as the last expression, saved, for nbval to compare
        [result] = [o for o in cell.outputs if o.output_type == "execute_result"]
        assert cards(cell) and result.data["text/plain"] and result.data["text/markdown"]


def test_the_notebooks_show_a_receipt_an_artifact_a_verdict_and_a_lineage() -> None:
    shown = {kind for name in NAMES
             for cell in nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4).cells
             if cell.cell_type == "code" for kind in cards(cell)}
    assert shown >= {"receipt", "artifact", "verdict", "lineage"}


@pytest.mark.parametrize("name", NAMES)
def test_nbclient_runs_each_notebook_and_the_record_holds_every_cell(
        name: str, jupyter_path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    workdir, tmpdir = tmp_path / "ws", tmp_path / "tmp"
    workdir.mkdir()
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    if name == "reusable_pipeline":  # armed by the environment rather than the kernelspec
        env["HOST_KERNEL_MODE"] = "reusable_pipeline"
    client = NotebookClient(nb, kernel_name="host_kernel", timeout=60,
                            resources={"metadata": {"path": str(workdir)}})
    client.execute(env=env)
    record = default_record_dir(workdir)
    [(session, cells)] = session_cells(record).items()
    assert [code for code, _ in cells] == code_sources(nb)
    assert {status for _, status in cells} == {"ok"}
    assert_clean(record)
    exported = export_notebook(record)
    assert [c.source for c in exported.cells] == code_sources(nb)
    assert exported.metadata["host_kernel"]["session"] == session
    assert exported.metadata["host_kernel"]["front"] == "jupyter"
    if name == "reusable_pipeline":
        assert exported.metadata["host_kernel"]["armed"] is True
        verdicts = [s["accepted"] for s in exported.metadata["host_kernel"]["submissions"]]
        assert verdicts == [True, False]
        assert "reproduction_failed" in exported.metadata["host_kernel"]["submissions"][1]["failed"]
    assert hk_folders(tmpdir) == []


def test_nbval_passes_every_notebook_under_its_own_kernelspec(jupyter_path: Path,
                                                               tmp_path: Path) -> None:
    for name in NAMES:
        shutil.copy(NOTEBOOKS / f"{name}.ipynb", tmp_path)
    tmpdir = tmp_path.parent / f"{tmp_path.name}-tmp"
    tmpdir.mkdir()
    env = {**os.environ, "JUPYTER_PATH": str(jupyter_path / "share" / "jupyter"),
           "TMPDIR": str(tmpdir)}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        # `-o addopts=`: the sanitiser's path lies in this repository, so pytest takes the
        # repository's pyproject.toml as the run's ini file, and its `-n auto` would hand
        # the notebooks to xdist workers, under which nbval silently runs a fraction of
        # the cells.
        [sys.executable, "-m", "pytest", "-o", "addopts=", "--nbval-lax", "-p",
         "no:cacheprovider", "-q",
         "--nbval-sanitize-with", str(SANITIZE),
         "--nbval-kernel-startup-timeout", "60", *(f"{n}.ipynb" for n in NAMES)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    sessions = session_cells(default_record_dir(tmp_path))
    assert len(sessions) == len(NAMES)
    expected = sorted(len(code_sources(nbformat.read(NOTEBOOKS / f"{n}.ipynb", as_version=4)))
                      for n in NAMES)
    assert sorted(len(cells) for cells in sessions.values()) == expected
    for cells in sessions.values():
        assert {status for _, status in cells} == {"ok"}
    assert_clean(default_record_dir(tmp_path))
    # nbval kills each kernel (SIGKILL to the relay): the relay's sentinel still removes
    # the Host's runtime folder
    deadline = time.monotonic() + 5
    while hk_folders(tmpdir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hk_folders(tmpdir) == []
