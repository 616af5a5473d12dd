"""A realistic batch into a real PostgreSQL ledger, this tree against an earlier commit's.

``python benchmarks/batch_pg.py --before REV`` (from the project's root) times the
same batch with the code of ``REV`` (unpacked with ``git archive`` into a temporary
folder) and with this tree, interleaved, ``--rounds`` times each, and prints
medians and their ratio. A batch is ``--tasks`` notebook sessions (each reads a
2,000-row CSV, computes, writes four files through the Host, runs one
``host.bash`` command, saves an artifact and submits: eight cells) on a
LocalCluster of ``--workers`` worker processes with their warm pools, every
session into one PostgreSQL ledger started here with Debian's ``initdb``
(tests/_pg.py's server). Each batch runs in a process of its own whose
``PYTHONPATH`` puts one tree first, so its workers and their kernels run that
tree's code; it reports which ``host_kernel`` it imported, and the figures are
refused when it is not the tree asked for. Measured per batch:

* wall seconds and sessions a minute (after a warm-up batch of two on the same
  cluster: imports, the pools' first standbys);
* the median task's seconds, as its worker measured it;
* CPU seconds per session of the PostgreSQL server (its processes' times from
  ``/proc``). The batch's own processes are not summed: a kernel's process is
  reaped inside its sandbox, so ``getrusage`` of the batch's process misses most of
  the kernels' time; docs/scale.md says how the kernels' CPU was measured.

It is not part of ``python -m benchmarks.run``: it needs a commit to compare
with and a PostgreSQL installation. docs/scale.md ("Throughput") has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CSV_ROWS = 2000


def notebooks(folder: Path, n: int) -> list[Path]:
    """``n`` notebooks of eight cells each, beside the CSV they read."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.csv").write_text(
        "x,y\n" + "".join(f"{i},{i * i % 97}\n" for i in range(CSV_ROWS)))
    paths = []
    for i in range(n):
        cells = [
            new_markdown_cell("# The mean of y"),
            new_code_cell("import csv, json, statistics\n"
                          "rows = list(csv.DictReader(open('data.csv')))"),
            new_code_cell(f"ys = [int(r['y']) for r in rows]\nm = statistics.mean(ys) + {i}\nm"),
            new_code_cell("host.write_file('out/summary.json', json.dumps({'mean': m}))"),
            new_code_cell("r = host.bash('wc -l data.csv')\nr.exit_status"),
            new_code_cell("for k in range(3):\n    host.write_file(f'out/part{k}.txt', str(k * m))"),
            new_code_cell("a = host.save_artifact('out/summary.json')"),
            new_code_cell("host.submit_output({'mean': m}, ['computed the mean of y'])"),
        ]
        path = folder / f"nb{i:02d}.ipynb"
        nbformat.write(new_notebook(cells=cells), path)
        paths.append(path)
    return paths


# --------------------------------------------------------------------------- one batch


def child(args: argparse.Namespace) -> None:
    """One timed batch with whichever host_kernel this process imports; JSON on stdout."""
    from distributed import Client

    import host_kernel
    from host_kernel.batch import Task, local_cluster, run_batch

    work = Path(args.work)
    tasks = [Task.notebook(p, name=p.stem) for p in notebooks(work / "nbs", args.tasks)]
    cluster = local_cluster(args.workers)
    client = Client(cluster)
    try:
        run_batch(tasks[:2], scheduler=client, ledger=args.ledger, workspaces=work / "warm")
        t0 = time.perf_counter()
        result = run_batch(tasks, scheduler=client, ledger=args.ledger,
                           workspaces=work / "timed")
        seconds = time.perf_counter() - t0
    finally:
        client.close()
        cluster.close()
    tasks_s = sorted(s.seconds or 0.0 for s in result.summaries)
    print(json.dumps({"host_kernel": host_kernel.__file__, "seconds": seconds,
                      "accepted": sum(s.outcome == "accepted" for s in result.summaries),
                      "tasks": len(tasks),
                      "task_median": tasks_s[len(tasks_s) // 2]}))


def _server_cpu(pids_of: str) -> float:
    """CPU seconds of the processes whose command line holds ``pids_of`` (PostgreSQL's
    server and its backends, found by its data folder)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if pids_of.encode() in cmd or b"postgres:" in cmd:
            fields = stat.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick
    return total


def one_batch(tree: Path, ledger: str, tasks: int, workers: int, pg_folder: str
              ) -> dict[str, Any]:
    """Run :func:`child` in a process whose imports come from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    server = _server_cpu(pg_folder)
    with tempfile.TemporaryDirectory(prefix="hk-batch-pg-") as work:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", "--work", work,
             "--ledger", ledger, "--tasks", str(tasks), "--workers", str(workers)],
            capture_output=True, text=True, env=env, cwd=work, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the batch with {tree} failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["host_kernel"].startswith(str(tree)):
        raise RuntimeError(f"the batch meant for {tree} imported {out['host_kernel']}")
    if out["accepted"] != tasks:
        raise RuntimeError(f"only {out['accepted']} of {tasks} tasks accepted with {tree}")
    # The warm-up's two sessions ran on the same server: its CPU is shared out over all.
    out["pg_cpu_per_session"] = (_server_cpu(pg_folder) - server) / (tasks + 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="the commit to compare with (a git revision)")
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="also write the report (Markdown) to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--ledger", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    if not args.before:
        parser.error("--before REV is needed (the commit to compare this tree with)")
    sys.path.insert(0, str(ROOT / "tests"))
    from _pg import PgServer, unavailable

    why = unavailable()
    if why:
        print(f"batch_pg: cannot run: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hk-before-") as scratch:
        before = Path(scratch) / "tree"
        before.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before],
                             capture_output=True, text=True, check=True).stdout.strip()
        here = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                                "host_kernel"], capture_output=True, text=True,
                               check=True).stdout.strip()
        server = PgServer().start()
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        loads = []
        try:
            for i in range(args.rounds):
                order = [("before", before), ("after", ROOT)]
                for side, tree in order if i % 2 == 0 else order[::-1]:
                    url = server.create_database()
                    loads.append(os.getloadavg()[0])
                    runs[side].append(one_batch(tree, url, args.tasks, args.workers,
                                                str(server.folder)))
                    print(f"round {i + 1} {side}: {runs[side][-1]['seconds']:.1f} s",
                          file=sys.stderr)
        finally:
            server.stop()
    report = _report(runs, args, rev, here + (" + uncommitted changes" if dirty else ""),
                     loads)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")
    return 0


def _report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace, rev: str,
            here: str, loads: list[float]) -> str:
    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    rows = [("sessions a minute", lambda s: 60 * args.tasks / med(s, "seconds"), "{:.1f}"),
            ("batch wall seconds", lambda s: med(s, "seconds"), "{:.1f}"),
            ("task seconds (median task)", lambda s: med(s, "task_median"), "{:.2f}"),
            ("CPU seconds a session (PostgreSQL)", lambda s: med(s, "pg_cpu_per_session"),
             "{:.3f}")]
    lines = [f"{args.tasks} notebook sessions a batch, {args.workers} workers, PostgreSQL "
             f"ledger; medians of {args.rounds} interleaved batches each; "
             f"{os.cpu_count()} cores, load average at the batches' starts "
             f"{min(loads):.1f}–{max(loads):.1f}", "",
             f"| figure | before ({rev}) | after ({here}) | after ÷ before |",
             "|---|---|---|---|"]
    for name, get, fmt in rows:
        b, a = get("before"), get("after")
        lines.append(f"| {name} | {fmt.format(b)} | {fmt.format(a)} | "
                     f"{a / b if b else float('nan'):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
