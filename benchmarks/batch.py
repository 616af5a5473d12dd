"""Throughput of ``host-kernel batch``: sessions per minute on 2 Dask workers against 1.

* ``batch_throughput``: the same small notebooks (read an input, write a file
  through the Host, save it as an artifact, submit) run by
  :func:`host_kernel.batch.run_batch` on a LocalCluster of two worker processes
  (ours) and of one (the baseline), each worker with its warm pool, each
  notebook a confined session of its own. What is timed is one whole batch on a
  cluster that is already up (the pools start with the batch, as they do for
  every batch); the figure is seconds per session, so the ratio is 2 workers'
  time over 1 worker's: 0.5 would be perfect scaling, and the target, 1.0, asks
  only that a second worker not slow a batch down. A session is CPU-bound (its
  kernel's start is most of it) and one worker already keeps two cores busy (its
  session, and its pool starting the next kernel), so on a 2-core machine the
  ratio sits near 1; it falls as the cores grow. The serial
  ``host-kernel exec`` of the same notebooks (one process, its own pool) is
  measured once for the notes.

It does not own the timing discipline, the report or the registry
(benchmarks/registry.py lists :data:`BATCH`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from benchmarks._harness import Plan, Result, interleaved, scratch

__all__ = ["BATCH"]


def _notebooks(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True)
    (folder / "base.txt").write_text("7\n")
    paths = []
    for i in range(n):
        cells = [new_code_cell(f"base = int(open('base.txt').read())\nrows = [base, {i}]"),
                 new_code_cell("host.write_file('out/rows.csv', ''.join(f'{r}\\n' "
                               "for r in rows))"),
                 new_code_cell("a = host.save_artifact('out/rows.csv')"),
                 new_code_cell("host.submit_output({'rows': rows}, ['wrote the rows'])")]
        path = folder / f"nb{i:02d}.ipynb"
        nbformat.write(new_notebook(cells=cells), path)
        paths.append(path)
    return paths


def _cluster(workers: int) -> tuple[Any, Any]:
    from distributed import Client

    from host_kernel.batch import local_cluster

    cluster = local_cluster(workers)
    return cluster, Client(cluster)


def bench_batch_throughput(plan: Plan) -> Result:
    from host_kernel.batch import Task, run_batch

    sessions, n = plan.n(12, 4), plan.n(5, 1)
    with scratch() as root:
        tasks = [Task.notebook(p) for p in _notebooks(root / "nbs", sessions)]
        one, two = _cluster(1), _cluster(2)
        runs = 0
        rates: dict[int, list[float]] = {1: [], 2: []}

        def per_session(client: Any, workers: int) -> Callable[[], float]:
            def run() -> float:
                nonlocal runs
                runs += 1
                result = run_batch(tasks, scheduler=client, workspaces=root / f"ws{runs}")
                if not result.accepted:
                    raise RuntimeError(f"batch not accepted: {result.failed}")
                rates[workers].append(result.sessions_per_minute)
                return result.seconds / sessions
            return run

        try:
            per_session(two[1], 2)(), per_session(one[1], 1)()  # warm-up: imports, caches
            rates = {1: [], 2: []}
            a, b = interleaved(n, per_session(two[1], 2), per_session(one[1], 1))
        finally:
            for cluster, client in (one, two):
                client.close()
                cluster.close()
        serial = _exec_serially(root, [str(t.source) for t in tasks])
    per_min = {w: sorted(r)[len(r) // 2] for w, r in rates.items()}
    return Result("batch_throughput", a, b, 1.0, notes=(
        f"{sessions} notebook sessions a batch, {os.cpu_count()} CPU cores",
        f"2 workers {per_min[2]:.0f} sessions/min, 1 worker {per_min[1]:.0f} sessions/min",
        f"serial `host-kernel exec` of the same notebooks {60 * sessions / serial:.0f} "
        f"sessions/min"))


def _exec_serially(root: Path, notebooks: list[str]) -> float:
    """Seconds for ``host-kernel exec`` to run the notebooks one after another (one
    process, its own warm pool), each in a copy of their folder."""
    work = root / "serial"
    work.mkdir()
    (work / "base.txt").write_text("7\n")
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "host_kernel", "exec", *notebooks,
                           "--workdir", str(work)], capture_output=True, text=True,
                          timeout=600)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"host-kernel exec failed: {done.stdout[-1000:]}{done.stderr}")
    return seconds


BATCH: list[tuple[str, float, str, str, Callable[[Plan], Result]]] = [
    ("batch_throughput", 1.0,
     "seconds per session of `run_batch` on a LocalCluster of 2 workers (each with its warm "
     "pool): small notebooks, each a confined session",
     "the same batch on 1 worker",
     bench_batch_throughput),
]
