"""Before and after in one run: the same benchmarks on two revisions of the tree, interleaved.

``python -m benchmarks.compare --base REV --only start execute_pass bash_true``
checks out ``REV`` into a temporary git worktree, then runs
``python -m benchmarks.run --quick --only …`` alternately on that tree and on
this one (``--rounds`` times each, base first in odd rounds and second in even
ones, so a drift in the machine's load falls on both), each run importing
``host_kernel`` from its own tree. It prints, per benchmark, the median of each
tree's medians and their ratio (after / before): the figure a behaviour-preserving
change must keep near 1.0. It owns no timing of its own: benchmarks/run.py's
figures are parsed from its output.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._harness import REPO

__all__ = ["main"]

_LINE = re.compile(r"^running (\S+) \.\.\.$|^  ours ([\d.]+) (ms|s), baseline ([\d.]+) (ms|s)")


def _seconds(value: str, unit: str) -> float:
    return float(value) / (1000.0 if unit == "ms" else 1.0)


def run_tree(tree: Path, names: list[str]) -> dict[str, tuple[float, float]]:
    """One ``benchmarks.run --quick`` on ``tree``: each benchmark's (ours, baseline) medians."""
    env = os.environ | {"PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--only", *names],
                         cwd=tree, env=env, capture_output=True, text=True, check=True).stdout
    found: dict[str, tuple[float, float]] = {}
    current = None
    for line in out.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        if m.group(1):
            current = m.group(1)
        elif current is not None:
            found[current] = (_seconds(m.group(2), m.group(3)), _seconds(m.group(4), m.group(5)))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__)
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--only", nargs="+", required=True, metavar="NAME")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hk-compare-") as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=REPO,
                       check=True, capture_output=True)
        runs: dict[str, list[dict[str, tuple[float, float]]]] = {"before": [], "after": []}
        try:
            for i in range(args.rounds):
                order = [("before", base), ("after", REPO)]
                for label, tree in order if i % 2 == 0 else reversed(order):
                    print(f"round {i + 1}: {label} ...", flush=True)
                    runs[label].append(run_tree(tree, args.only))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO,
                           check=False, capture_output=True)
    print(f"\n{'benchmark':<14} {'before':>10} {'after':>10} {'after/before':>13}   "
          f"(medians of {args.rounds} runs each; load {os.getloadavg()[0]:.2f})")
    for name in args.only:
        before = statistics.median(r[name][0] for r in runs["before"] if name in r)
        after = statistics.median(r[name][0] for r in runs["after"] if name in r)
        print(f"{name:<14} {before * 1000:>8.2f}ms {after * 1000:>8.2f}ms {after / before:>12.3f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
