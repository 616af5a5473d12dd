"""Benchmark of a long session: per-cell cost, Host memory, audit and export over 20,000 cells.

Owns ``long_session``. One Host runs a 20,000-cell session (2,000 with
``--quick``) of small cells such as an agent writes (assignments, prints, a
displayed value, now and then a ``host.write_file``). It reports:

- the per-cell cost late in the session against early: the median of cells
  19,001–20,000 (ours) against the median of cells 1–1,000 of a second, fresh
  Host run interleaved with them, cell for cell, so a change in the machine's
  load moves both sides alike (the ratio); and, in the notes, the same session's
  own cells 1–1,000 against 19,001–20,000, which load changes over the run can
  move;
- the Host's memory: this process's resident set (the Host runs in it), its
  largest rise over cells 1,001–19,000, over the value after the first 1,000
  (target ≤ 100 MiB; the last 1,000 run beside a second Host, whose memory
  would count too, so the notes give the value after them separately);
- ``host_kernel.audit.audit`` and ``host_kernel.export.export_notebook`` of a
  session of a tenth of the size and of the long one (each the median of five,
  the two records taking turns), in events per second, and the time per event
  of the long one over the short one (linear is 1.0; target ≤ 1.25 each).

It does not own the timing discipline, the report or the registry
(benchmarks/registry.py lists it).
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

from benchmarks._harness import Limit, Plan, Result, RssSampler, interleaved, run_cell, scratch
from host_kernel import Host
from host_kernel.audit import audit
from host_kernel.export import export_notebook

__all__ = ["LONG_BASELINE", "LONG_OURS", "TARGET", "bench_long_session", "session_cell"]

LONG_OURS = ("the median cell of cells 19,001–20,000 of one 20,000-cell session of small "
             "agent-like cells (assignments, prints, values, a `host.write_file` every 500)")
LONG_BASELINE = ("cells 1–1,000 of the same cells in a fresh Host, each run beside one "
                 "late cell of the long session (interleaved)")
#: Late cells may cost at most this much more than early ones.
TARGET = 1.10
#: The Host's memory may grow at most this much over the session.
RSS_LIMIT_MIB = 100.0
#: The time per event of auditing (exporting) the long session over the short one.
LINEAR_LIMIT = 1.25


def session_cell(i: int) -> str:
    """The ``i``-th cell (from 0) of the benchmark's session: the same cycle throughout."""
    if i % 500 == 499:
        return f"_ = host.write_file('notes/n{i % 7}.txt', 'cell {i}')"
    step = i % 4
    if step == 0:
        return f"v{i % 64} = {i}"
    if step == 1:
        return f"w = v{(i - 1) % 64} * 2"
    if step == 2:
        return "print(w)"
    return "w"


def _run_session(host: Host, first: int, last: int, times: list[float],
                 rss: list[int]) -> None:
    for i in range(first, last):
        times.append(run_cell(host, session_cell(i)))
        if i % 100 == 0:
            rss.append(RssSampler.rss())


def _audit_export(record: Path, session: str) -> tuple[float, float, int]:
    """Seconds to audit the record, seconds to export the session, and its event count."""
    gc.collect()
    t0 = time.perf_counter()
    report = audit(record)
    audited = time.perf_counter() - t0
    if not report.clean:
        raise RuntimeError(f"the long session's record does not audit clean: "
                           f"{report.summary()}")
    gc.collect()
    t0 = time.perf_counter()
    nb = export_notebook(record, session)
    exported = time.perf_counter() - t0
    if not nb.cells:
        raise RuntimeError("the export of the long session holds no cells")
    return audited, exported, report.events


def _rates(records: list[tuple[Path, str]], rounds: int) -> list[tuple[float, float, int]]:
    """Median seconds to audit and to export each record, and its event count; the
    records take turns, ``rounds`` times, so a change in load reaches all of them."""
    runs: list[list[tuple[float, float, int]]] = [[] for _ in records]
    for _ in range(rounds):
        for i, (record, session) in enumerate(records):
            runs[i].append(_audit_export(record, session))
    return [(statistics.median(a for a, _, _ in r), statistics.median(e for _, e, _ in r),
             r[0][2]) for r in runs]


def bench_long_session(plan: Plan) -> Result:
    cells = plan.n(20_000, 2_000)
    window = cells // 20
    short = cells // 10
    with scratch() as root:
        for name in ("long", "fresh", "short"):
            (root / name).mkdir()
        # The short session first, alone in its record, for the audit and export at 1/10.
        with Host(root / "short", record_dir=root / "short-record") as host:
            _run_session(host, 0, short, [], [])
            short_session = host.session_id

        early: list[float] = []
        samples: list[int] = []
        started = time.perf_counter()
        with Host(root / "long", record_dir=root / "long-record") as host:
            _run_session(host, 0, window, early, samples)
            base_rss = peak_rss = RssSampler.rss()
            samples.clear()
            _run_session(host, window, cells - window, [], samples)
            peak_rss = max([peak_rss, *samples])
            with Host(root / "fresh", record_dir=root / "fresh-record") as fresh:
                late_i = iter(range(cells - window, cells))
                fresh_i = iter(range(window))
                late, fresh_early = interleaved(
                    window, lambda: run_cell(host, session_cell(next(late_i))),
                    lambda: run_cell(fresh, session_cell(next(fresh_i))))
            end_rss = RssSampler.rss()  # the second Host's leftovers included
            long_session = host.session_id
        elapsed = time.perf_counter() - started
        (short_audit, short_export, short_events), (long_audit, long_export, long_events) = \
            _rates([(root / "short-record", short_session),
                    (root / "long-record", long_session)], 5)

    growth_mib = (peak_rss - base_rss) / 2**20
    audit_linear = (long_audit / long_events) / (short_audit / short_events)
    export_linear = (long_export / long_events) / (short_export / short_events)
    same = statistics.median(late) / statistics.median(early)
    return Result(
        "long_session", late, fresh_early, TARGET,
        limits=(Limit("Host RSS growth", growth_mib, RSS_LIMIT_MIB, "MiB"),
                Limit(f"audit time per event, {cells:,} ÷ {short:,} cells", audit_linear,
                      LINEAR_LIMIT, "×"),
                Limit(f"export time per event, {cells:,} ÷ {short:,} cells", export_linear,
                      LINEAR_LIMIT, "×")),
        notes=(f"RSS growth over cells {window + 1:,}–{cells - window:,}, the long Host "
               f"alone; after all {cells:,} cells, a second Host started and closed beside "
               f"it: {(end_rss - base_rss) / 2**20:+.1f} MiB",
               f"{cells:,} cells in {elapsed:.0f} s; same session, cells "
               f"{cells - window + 1:,}–{cells:,} ÷ 1–{window:,}: {same:.3f}× "
               f"({statistics.median(late) * 1e3:.2f} ms ÷ "
               f"{statistics.median(early) * 1e3:.2f} ms)",
               f"audit {short_events / short_audit:,.0f} events/s at {short_events:,} events, "
               f"{long_events / long_audit:,.0f} events/s at {long_events:,}",
               f"export {short_events / short_export:,.0f} events/s at {short_events:,} events, "
               f"{long_events / long_export:,.0f} events/s at {long_events:,}"),
    )
