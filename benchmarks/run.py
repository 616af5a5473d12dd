"""Benchmarks of the Host against the bare tools it wraps, measured in one process run.

Owns the command line (``python -m benchmarks.run [--quick] [--only NAME ...]
[--out PATH]``): running what :data:`~benchmarks.registry.BENCHMARKS` lists,
the console table and the markdown report. It does not own what is measured
(every benchmark drives the public :class:`host_kernel.Host` API and, for its
baseline, plain jupyter_client, ``subprocess``, ``cp`` or ``hashlib``), nor the
timing discipline (benchmarks/_harness.py: ours and the baseline interleaved
in the same loop, medians), nor which benchmarks exist (benchmarks/registry.py).

Adding a benchmark is one function in a benchmark module that gets the
:class:`~benchmarks._harness.Plan` (quick or full) and returns a
:class:`~benchmarks._harness.Result`, and its row in that module's table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import host_kernel
from benchmarks._harness import REPO, SCRATCH_PREFIX, Limit, Plan, Result, fmt_seconds
from benchmarks.registry import BENCHMARKS, Benchmark, benchmark

__all__ = ["BENCHMARKS", "Benchmark", "Limit", "Plan", "Result", "benchmark", "main"]

DEFAULT_OUT = REPO / "docs" / "benchmarks.md"


# ---------------------------------------------------------------------- reporting


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu count": str(os.cpu_count()),
        "python": platform.python_version(),
        "host_kernel": host_kernel.__version__,
        "load average at the end (1, 5, 15 min)": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


HEADERS = ("benchmark", "ours (median)", "baseline (median)", "ratio", "target", "met?")


def rows(results: list[Result]) -> list[tuple[str, ...]]:
    return [(r.name, fmt_seconds(r.ours_median), fmt_seconds(r.baseline_median),
             f"{r.ratio:.3f}×", f"≤ {r.target:g}×", "yes" if r.met else "NO")
            for r in results]


def console_table(results: list[Result]) -> str:
    table = [HEADERS, *rows(results)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        if r.extras():
            lines.append(f"  {r.name}: {r.extras()}")
    return "\n".join(lines)


def markdown(results: list[Result], plan: Plan, command: str) -> str:
    out = ["# Benchmarks", "",
           ("The Host against the bare tools it wraps, both measured in the same process run "
            "(warmed up, interleaved in one loop, medians). The ratio is ours ÷ baseline; the "
            "target is the most overhead the project accepts."), "",
           f"Produced by `{command}`" + (" (quick run: fewer iterations, smaller files)."
                                         if plan.quick else "."), "",
           ("Figures from a shared or busy machine move from run to run (see the load average "
            "and each benchmark's range below); compare ratios from one run, not across runs."),
           "",
           "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    out += ["| " + " | ".join(row) + " |" for row in rows(results)]
    out += ["", "## What each benchmark times", ""]
    for r in results:
        b = BENCHMARKS[r.name]
        out.append(f"- **{r.name}**: ours is {b.ours}; baseline is {b.baseline}."
                   + (f" {r.extras()}." if r.extras() else ""))
    out += ["", "## Machine", ""]
    out += [f"- {k}: {v}" for k, v in machine().items()]
    out += ["", ("Rerun with `python -m benchmarks.run` (all, full counts; a few minutes) or "
            "`python -m benchmarks.run --quick`; see `benchmarks/README.md`."), ""]
    return "\n".join(out)


# ---------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Time the Host against bare jupyter_client, subprocess, cp and hashlib, "
                    "in one process run, and write a markdown report.")
    parser.add_argument("--quick", action="store_true",
                        help="fewer iterations and a 64 MiB artifact instead of 1 GiB")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=list(BENCHMARKS),
                        help=f"run only these ({', '.join(BENCHMARKS)})")
    parser.add_argument("--out", metavar="PATH", type=Path, default=None,
                        help=f"the markdown report (default: {DEFAULT_OUT.relative_to(REPO)}; "
                             f"with --quick, no report unless --out is given)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plan = Plan(quick=args.quick)
    names = args.only or list(BENCHMARKS)
    out: Path | None = args.out if args.out is not None else (None if plan.quick
                                                              else DEFAULT_OUT)
    command = "python -m benchmarks.run" + (" --quick" if plan.quick else "") + (
        " --only " + " ".join(names) if args.only else "")
    results: list[Result] = []
    # Records live under $XDG_STATE_HOME by default: keep the benchmarks' in a scratch folder.
    state = tempfile.mkdtemp(prefix=SCRATCH_PREFIX + "state-")
    saved_state = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = state
    try:
        _run_all(names, plan, results)
    finally:
        shutil.rmtree(state, ignore_errors=True)
        if saved_state is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = saved_state
    print()
    print(console_table(results))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(markdown(results, plan, command))
        print(f"\nreport written to {out}")
    return 0


def _run_all(names: list[str], plan: Plan, results: list[Result]) -> None:
    for name in names:
        print(f"running {name} ...", flush=True)
        t0 = time.perf_counter()
        r = BENCHMARKS[name].run(plan)
        results.append(r)
        print(f"  ours {fmt_seconds(r.ours_median)}, baseline {fmt_seconds(r.baseline_median)},"
              f" ratio {r.ratio:.3f}× (target ≤ {r.target:g}×, "
              f"{'met' if r.met else 'NOT met'}); {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
