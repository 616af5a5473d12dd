"""``host.bash`` in a large workspace: the first command of a session and later ones.

Owns ``bash_big_workspace``: a scratch workspace of about 100,000 files and 2 GB
(a copy of this interpreter's site-packages as a virtualenv's, a ``git clone`` of
this repository, and data: many small files plus sparse large ones), built once; in
it a cell running ``host.bash("true")`` is timed against a cell running
``subprocess.run(["true"])`` in the same kernel, interleaved, medians. The first
call of each of several fresh Hosts is timed apart from later calls (a Limit).
benchmarks/registry.py lists :data:`BASH_SCALE`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from host_kernel import Host

from ._harness import REPO, Limit, Plan, Result, interleaved, run_cell, scratch

__all__ = ["BASH_SCALE", "build_workspace"]

TARGET = 1.5
FILES = 100_000
BYTES = 2 * 1024 ** 3
OURS = "a cell running `host.bash(\"true\")` (receipt recorded)"
BASE = "`subprocess.run([\"true\"])` cell, same kernel"


def _count(root: Path) -> tuple[int, int]:
    files = size = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            files += 1
            size += st.st_size
    return files, size


def build_workspace(root: Path, files: int = FILES, total: int = BYTES) -> str:
    """Fill ``root``; return a sentence saying what was built."""
    site = Path(sysconfig.get_paths()["purelib"])
    venv = root / ".venv" / "lib" / "python3.11" / "site-packages"
    venv.parent.mkdir(parents=True)
    subprocess.run(["cp", "-a", str(site), str(venv)], check=True)
    subprocess.run(["git", "clone", "-q", str(REPO), str(root / "repo")], check=True)
    have, size = _count(root)
    data = root / "data"
    small = max(0, files - have - 20)
    for i in range(small):
        folder = data / "small" / f"{i // 1000:03}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        with open(folder / f"r{i:06}.csv", "wb") as f:
            f.write(os.urandom(512))
    size += small * 512
    big = data / "big"
    big.mkdir(parents=True)
    for i in range(20):
        with open(big / f"part{i:02}.bin", "wb") as f:
            f.write(os.urandom(1 << 20))  # a real first MiB, then a hole
            f.truncate(max(1 << 20, (total - size) // 20))
    have, size = _count(root)
    return (f"workspace: {have:,} files, {size / 1024 ** 3:.2f} GB (site-packages of this "
            f"interpreter copied as .venv, a git clone of this repository, {small:,} small "
            f"random files, 20 sparse files)")


def _first_calls(root: Path, rounds: int) -> tuple[list[float], list[float]]:
    """In each of ``rounds`` fresh Hosts, the first host.bash cell and the first
    subprocess.run cell, the order alternating."""
    ours: list[float] = []
    base: list[float] = []
    for i in range(rounds):
        with Host(root) as host:
            run_cell(host, "import subprocess")
            sides: list[tuple[list[float], Callable[[], float]]] = [
                (ours, lambda: run_cell(host, "_ = host.bash('true')")),
                (base, lambda: run_cell(host, "_ = subprocess.run(['true'])"))]
            for into, run in (sides if i % 2 == 0 else sides[::-1]):
                into.append(run())
    return ours, base


def bench_bash_big_workspace(plan: Plan) -> Result:
    n = plan.n(60, 15)
    rounds = plan.n(5, 2)
    with scratch() as root:
        ws = root / "ws"
        ws.mkdir()
        t0 = time.perf_counter()
        built = build_workspace(ws)
        built += f", built in {time.perf_counter() - t0:.0f} s"
        first_ours, first_base = _first_calls(ws, rounds)
        with Host(ws) as host:
            run_cell(host, "import subprocess")
            for _ in range(5):
                run_cell(host, "_ = host.bash('true')")
                run_cell(host, "_ = subprocess.run(['true'])")
            a, b = interleaved(n, lambda: run_cell(host, "_ = host.bash('true')"),
                               lambda: run_cell(host, "_ = subprocess.run(['true'])"))
    first = statistics.median(first_ours) / statistics.median(first_base)
    notes = (built, f"later calls: {n} cells each, interleaved, one Host",
             f"first calls: {rounds} fresh Hosts, medians ours "
             f"{statistics.median(first_ours) * 1e3:.2f} ms, baseline "
             f"{statistics.median(first_base) * 1e3:.2f} ms")
    return Result("bash_big_workspace", a, b, TARGET,
                  limits=(Limit("first call ratio", first, TARGET, "×"),), notes=notes)


BASH_SCALE: tuple[tuple[str, float, str, str, Callable[[Plan], Any]], ...] = (
    ("bash_big_workspace", TARGET, OURS + " in a ~100,000-file, ~2 GB workspace; later "
     "calls (the first call of fresh Hosts as a limit)", BASE, bench_bash_big_workspace),
)
