"""The table of every benchmark, by name, in the order they run and are reported.

Owns :data:`BENCHMARKS` and what a row of it holds (:class:`Benchmark`: the
name, the target ratio, what each side times in words, the function). Each
benchmark module exports its functions (most as a table of rows); this module
imports them all and lists them. It does not own the timing discipline
(benchmarks/_harness.py) nor the command line and the report
(benchmarks/run.py); no benchmark module imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from benchmarks._harness import Plan, Result
from benchmarks.agent import AGENT
from benchmarks.bash_scale import BASH_SCALE
from benchmarks.batch import BATCH
from benchmarks.cells import CELLS
from benchmarks.derive import DERIVE
from benchmarks.factory import FACTORY
from benchmarks.judge import JUDGE
from benchmarks.keep import KEEP
from benchmarks.ledger import LEDGER
from benchmarks.pool import POOL
from benchmarks.record import RECORD
from benchmarks.relay import (
    BASELINE,
    RELAY_BASELINE,
    RELAY_OURS,
    RESTART_OURS,
    START_OURS,
    bench_control_restart,
    bench_control_start,
    bench_relay_roundtrip,
)
from benchmarks.session import LONG_BASELINE, LONG_OURS, bench_long_session
from benchmarks.session import TARGET as LONG_TARGET
from benchmarks.tracing import TRACING
from benchmarks.viewer import VIEWER

__all__ = ["BENCHMARKS", "Benchmark", "benchmark"]


@dataclass(frozen=True, slots=True)
class Benchmark:
    name: str
    target: float
    ours: str
    baseline: str
    run: Callable[[Plan], Result]


#: Every benchmark, in the order they run and are reported.
BENCHMARKS: dict[str, Benchmark] = {}


def benchmark(name: str, *, target: float, ours: str,
              baseline: str) -> Callable[[Callable[[Plan], Result]], Callable[[Plan], Result]]:
    """Register a benchmark; ``ours`` and ``baseline`` say in words what each side times."""

    def register(fn: Callable[[Plan], Result]) -> Callable[[Plan], Result]:
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} is registered twice")
        BENCHMARKS[name] = Benchmark(name, target, ours, baseline, fn)
        return fn

    return register


def _fill() -> None:
    """Every benchmark into :data:`BENCHMARKS`: the Host against the bare tools first
    (benchmarks/cells.py, benchmarks/record.py), then those beside the front they measure
    (benchmarks/relay.py), with more sides than ours and a baseline (benchmarks/tracing.py),
    or long (benchmarks/session.py)."""
    for name, target, ours, baseline, run in (*CELLS, *RECORD, *KEEP, *DERIVE, *JUDGE):
        benchmark(name, target=target, ours=ours, baseline=baseline)(run)
    benchmark("control_start", target=1.3, ours=START_OURS,
              baseline=BASELINE)(bench_control_start)
    benchmark("relay_roundtrip", target=1.10, ours=RELAY_OURS,
              baseline=RELAY_BASELINE)(bench_relay_roundtrip)
    benchmark("control_restart", target=1.0, ours=RESTART_OURS,
              baseline=BASELINE)(bench_control_restart)
    for name, target, ours, baseline, run in (*POOL, *FACTORY):
        benchmark(name, target=target, ours=ours, baseline=baseline)(run)
    for name, target, ours, baseline, run in (*TRACING, *BASH_SCALE, *VIEWER, *AGENT,
                                              *LEDGER, *BATCH):
        benchmark(name, target=target, ours=ours, baseline=baseline)(run)
    benchmark("long_session", target=LONG_TARGET, ours=LONG_OURS,
              baseline=LONG_BASELINE)(bench_long_session)


_fill()
