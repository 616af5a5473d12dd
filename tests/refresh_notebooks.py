"""Re-run the example notebooks and save their outputs: ``python tests/refresh_notebooks.py``.

The saved outputs of the cells tagged ``nbval-check-output`` (the rich displays)
are what ``tests/test_notebooks.py`` compares nbval's run with, so a change to a
card or to the lineage drawing means running this and committing the notebooks.
Each notebook runs under its own kernelspec (installed into a scratch prefix, as
the tests do), in a scratch workspace; only its outputs and execution counts are
written back.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from host_kernel.cli import main as cli_main

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ("quickstart", "reusable_pipeline", "artifact_audit")


def refresh(scratch: Path) -> None:
    prefix = scratch / "prefix"
    for extra in ([], ["--mode", "reusable_pipeline", "--name", "host_kernel_pipeline"]):
        if cli_main(["install", "--prefix", str(prefix), *extra]) != 0:
            raise SystemExit("could not install the kernelspecs")
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    for name in NAMES:
        path = NOTEBOOKS / f"{name}.ipynb"
        nb = nbformat.read(path, as_version=4)
        workdir = scratch / name
        workdir.mkdir()
        NotebookClient(nb, timeout=120, record_timing=False,
                       resources={"metadata": {"path": str(workdir)}}).execute()
        nbformat.validate(nb)
        nbformat.write(nb, path)
        print(f"refreshed {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="hk-refresh-") as scratch:
        refresh(Path(scratch))
    sys.exit(0)
