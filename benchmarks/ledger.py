"""The ledger's two backends side by side: appends on SQLite and on PostgreSQL, alone and
with several writers at once, and ``audit --ledger`` over a night's worth of sessions.

The PostgreSQL server is the tests' own (tests/_pg.py: initdb and pg_ctl in a temporary
folder, fsync on, on this machine's disk), started once for these benchmarks and removed
after. Every append is a whole transaction, committed, as a Host makes it: it returns only
once the server has its WAL on disk, where the SQLite baseline (``synchronous=NORMAL``)
writes to the operating system without a flush. So ``ledger_append`` also times, in the
same loop, the least any durable commit costs on that server (a one-row INSERT in a
transaction of its own) and notes it beside the two: what the ledger adds is what lies
above that floor.
It does not own the timing discipline, the report or the registry (benchmarks/registry.py
lists :data:`LEDGER`).
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from benchmarks._harness import REPO, Plan, Result, fmt_seconds, interleaved, scratch, timed
from host_kernel.audit import audit_ledger
from host_kernel.store.ledger import SQLiteLedger
from host_kernel.store.pg import PostgresLedger

__all__ = ["LEDGER"]

#: A cell's two events, about the size a short cell makes.
_STARTED = {"cell_id": "", "generation": 1, "code": "df = pd.read_csv('data.csv')\n" * 3}
_FINISHED = {"cell_id": "", "status": "ok", "execution_count": 1,
             "outputs": [{"output_type": "stream", "name": "stdout", "text": "x" * 200}]}


@contextmanager
def _server() -> Iterator[object]:
    sys.path.insert(0, str(REPO / "tests"))
    import _pg

    why = _pg.unavailable()
    if why is not None:
        raise RuntimeError(f"no PostgreSQL server can run here: {why}")
    server = _pg.PgServer().start()
    saved = os.environ.get("XDG_CONFIG_HOME")
    with scratch() as config:
        os.environ["XDG_CONFIG_HOME"] = str(config)  # the ledger keys these benchmarks make
        try:
            yield server
        finally:
            server.stop()
            if saved is None:
                os.environ.pop("XDG_CONFIG_HOME", None)
            else:
                os.environ["XDG_CONFIG_HOME"] = saved


def _cells(ledger: SQLiteLedger | PostgresLedger, session: str, cells: int) -> None:
    for i in range(cells):
        cell = f"{session}-{i}"
        ledger.append(session, "cell_started", {**_STARTED, "cell_id": cell})
        ledger.append(session, "cell_finished", {**_FINISHED, "cell_id": cell})


def bench_ledger_append(plan: Plan) -> Result:
    import psycopg

    cells, n = plan.n(250, 50), plan.n(7, 3)
    events = 2 * cells
    with _server() as server, scratch() as root:
        url = server.create_database()  # type: ignore[attr-defined]
        pg = PostgresLedger(url)
        lite = SQLiteLedger(root / "ledger.sqlite")
        bare = psycopg.connect(url, autocommit=True)
        bare.execute("CREATE TABLE commit_floor (n bigint PRIMARY KEY)")
        count = iter(range(10**9))
        floor: list[float] = []

        def ours() -> float:
            return timed(lambda: _cells(pg, f"s{next(count)}", cells))

        def commits() -> None:
            for _ in range(events):
                bare.execute("INSERT INTO commit_floor VALUES (%s)", (next(count),))

        def base() -> float:
            took = timed(lambda: _cells(lite, f"s{next(count)}", cells))
            floor.append(timed(commits))  # not the baseline: noted beside it
            return took

        ours(), base()
        floor.clear()
        a, b = interleaved(n, ours, base)
        pg.close()
        lite.close()
        bare.close()
    least = statistics.median(floor)
    return Result("ledger_append", a, b, 4.0, notes=(
        f"{events} events per run, one writer",
        (f"PostgreSQL {events / min(a):,.0f} events/s, SQLite {events / min(b):,.0f} "
         f"events/s (best runs)"),
        (f"the same number of bare durable commits on the same server (a one-row INSERT "
         f"each, autocommit), interleaved: {fmt_seconds(least)}, "
         f"{least / statistics.median(b):.1f}× SQLite; ours ÷ them "
         f"{statistics.median(a) / least:.2f}×")))


def _concurrent(open_ledger: Callable[[], SQLiteLedger | PostgresLedger], writers: int,
                cells: int, tag: str) -> float:
    ledgers = [open_ledger() for _ in range(writers)]
    start = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def write(i: int) -> None:
        start.wait()
        try:
            _cells(ledgers[i], f"{tag}-w{i}", cells)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    for ledger in ledgers:
        ledger.close()
    if errors:
        raise errors[0]
    return elapsed


def bench_ledger_append_concurrent(plan: Plan) -> Result:
    writers, cells, n = 8, plan.n(60, 15), plan.n(5, 2)
    with _server() as server, scratch() as root:
        url = server.create_database()  # type: ignore[attr-defined]
        PostgresLedger(url).close()
        SQLiteLedger(root / "ledger.sqlite").close()
        count = iter(range(10**9))

        def ours() -> float:
            return _concurrent(lambda: PostgresLedger(url), writers, cells, f"p{next(count)}")

        def base() -> float:
            return _concurrent(lambda: SQLiteLedger(root / "ledger.sqlite"), writers, cells,
                               f"l{next(count)}")

        ours(), base()
        a, b = interleaved(n, ours, base)
    events = 2 * cells * writers
    return Result("ledger_append_concurrent", a, b, 4.0, notes=(
        f"{writers} writers (threads, a connection each, a session each), {events} events",
        f"PostgreSQL {events / min(a):,.0f} events/s, SQLite {events / min(b):,.0f} events/s "
        f"(best runs)"))


def bench_audit_ledger(plan: Plan) -> Result:
    sessions, cells, n = plan.n(200, 40), 25, plan.n(5, 2)
    with _server() as server:
        url = server.create_database()  # type: ignore[attr-defined]
        with PostgresLedger(url) as ledger:
            for s in range(sessions):
                session = f"session-{s:04d}"
                ledger.append(session, "session_started", {"workdir": "/nonexistent",
                                                           "mode": {"name": "none"}})
                _cells(ledger, session, cells)
                ledger.append(session, "session_ended", {})
            events = ledger.query("SELECT count(*) FROM events")[0][0]

        def ours() -> float:
            def run() -> None:
                report = audit_ledger(url)
                if not report.clean:
                    raise RuntimeError(f"audit found {report.findings[:3]}")
            return timed(run)

        def base() -> float:
            def read() -> None:
                import json

                with PostgresLedger.open_readonly(url) as reader:
                    for row in reader.query("SELECT body FROM events ORDER BY seq"):
                        json.loads(row[0])
            return timed(read)

        ours(), base()
        a, b = interleaved(n, ours, base)
    return Result("audit_ledger", a, b, 10.0, notes=(
        f"{sessions} sessions, {events:,} events", f"{events / min(a):,.0f} events/s audited "
        f"(chains, MACs, projection rebuilt and compared, blobs, submissions)"))


LEDGER: list[tuple[str, float, str, str, Callable[[Plan], Result]]] = [
    ("ledger_append", 4.0,
     "cells' events appended to a PostgreSQL ledger (a transaction each: session head "
     "locked, chain link, MAC, projection)",
     "the same appends to the SQLite ledger (WAL, synchronous=NORMAL)",
     bench_ledger_append),
    ("ledger_append_concurrent", 4.0,
     "8 writers at once into one PostgreSQL ledger, a session each",
     "8 writers at once into one SQLite ledger file",
     bench_ledger_append_concurrent),
    ("audit_ledger", 10.0,
     "`audit_ledger` over every session of a PostgreSQL ledger",
     "reading every event's body from the same database (`SELECT` and `json.loads`)",
     bench_audit_ledger),
]
