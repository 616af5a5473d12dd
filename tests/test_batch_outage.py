"""A batch rides out its PostgreSQL ledger going away: the server stopped for 15 s in the
middle of a 20-task batch and started again, and every task still ends accepted, each in
one accepted session, no event in twice, the ledger's audit clean (issue 30).

Everything is real: a two-worker Dask LocalCluster, real Hosts and confined kernels, the
suite's PostgreSQL server (tests/_pg.py) halted and resumed under them by
:meth:`PgServer.outage`, started once three sessions have begun (found by direct SQL,
polled in a thread), so that it lands mid-batch however loaded the machine is.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import nbformat
import pytest
from _helpers import batch_cluster
from _pg import PgServer, direct_sql
from distributed import Client
from nbformat.v4 import new_code_cell, new_notebook

from host_kernel.audit import audit_ledger
from host_kernel.batch import Task, TaskSummary, run_batch

TASKS = 20
OUTAGE = 15.0
#: Sessions begun (a ``session_started`` event in the ledger) when the server is stopped.
STARTED_BEFORE_OUTAGE = 3
#: Notebooks that sleep 3 s mid-session (more than the sessions started at the trigger).
SLOW_SESSIONS = 6


def notebooks(folder: Path, n: int) -> list[Path]:
    """``n`` small notebooks (as benchmarks/batch.py's): read an input, write a file
    through the Host, save it as an artifact, submit."""
    folder.mkdir(parents=True)
    (folder / "base.txt").write_text("7\n")
    paths = []
    for i in range(n):
        # The first few sessions (those running when the outage is set off) take a few
        # seconds, so the server goes down under them however slowly it stops.
        pause = "import time\ntime.sleep(3)\n" if i < SLOW_SESSIONS else ""
        cells = [new_code_cell(f"base = int(open('base.txt').read())\nrows = [base, {i}]"),
                 new_code_cell(pause + "host.write_file('out/rows.csv', ''.join(f'{r}\\n' "
                               "for r in rows))"),
                 new_code_cell("a = host.save_artifact('out/rows.csv')"),
                 new_code_cell("host.submit_output({'rows': rows}, ['wrote the rows'])")]
        path = folder / f"nb{i:02d}.ipynb"
        nbformat.write(new_notebook(cells=cells), path)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """A two-worker LocalCluster (its workers' temp folder its own); the multiprocessing
    resource tracker its workers start is stopped after, when it was not running before."""
    with batch_cluster("hkbo-") as c:
        yield c


@pytest.fixture
def server(pg_server: PgServer, pg_url: str) -> Iterator[PgServer]:
    """The suite's server, started again at the end whatever the test did to it (before
    ``pg_url`` drops its database)."""
    yield pg_server
    if not pg_server.started:
        pg_server.resume()


class OutageMidBatch:
    """A thread that polls the ledger's database (direct SQL) until ``after`` sessions
    have a ``session_started`` event, then stops the server for ``seconds`` and starts it
    again (:meth:`PgServer.outage`). ``began`` and ``ended`` are the wall-clock times
    around the outage, ``finished_before`` how many tasks had finished when it began."""

    def __init__(self, server: PgServer, url: str, after: int, seconds: float,
                 finished: list[TaskSummary], deadline: float = 120.0) -> None:
        self.server, self.url, self.after, self.seconds = server, url, after, seconds
        self.finished, self.deadline = finished, deadline
        self.began: float | None = None
        #: When the server was down (its stop had returned).
        self.down: float | None = None
        self.ended: float | None = None
        self.finished_before: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="outage-mid-batch",
                                        daemon=True)

    def _started(self) -> int:
        try:
            rows = direct_sql(self.url, "SELECT COUNT(DISTINCT session) FROM events "
                                        "WHERE kind = 'session_started'")
        except Exception:  # noqa: BLE001 - no schema yet: no session has begun
            return 0
        return int(str(rows[0][0]))

    def _run(self) -> None:
        stop = time.monotonic() + self.deadline
        while self._started() < self.after:
            if time.monotonic() > stop:
                self.error = TimeoutError(f"fewer than {self.after} sessions began in "
                                          f"{self.deadline:.0f} s")
                return
            time.sleep(0.05)
        self.finished_before = len(self.finished)
        self.began = time.time()
        outage = self.server.outage(self.seconds)
        outage.join()
        self.down = getattr(outage, "halted", None)
        self.ended = time.time()
        self.error = getattr(outage, "error", None)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(self.deadline + self.seconds + 120)


def test_a_fifteen_second_server_restart_mid_batch_leaves_every_task_accepted_once(
        client: Client, server: PgServer, pg_url: str, tmp_path: Path) -> None:
    tasks = [Task.notebook(p) for p in notebooks(tmp_path / "nbs", TASKS)]
    blobs = f"file://{tmp_path / 'blobs'}"
    finished: list[TaskSummary] = []
    t0 = time.time()
    with OutageMidBatch(server, pg_url, STARTED_BEFORE_OUTAGE, OUTAGE, finished) as outage:
        result = run_batch(tasks, scheduler=client, workspaces=tmp_path / "ws", ledger=pg_url,
                           blobs=blobs, on_result=finished.append)
    batch_ended = time.time()
    assert outage.error is None, outage.error
    assert outage.began is not None and outage.ended is not None
    assert server.started
    # The outage landed mid-batch: tasks were still to finish when it began, and the batch
    # went on after the server was back (the bug: the rest errored at once, and the batch
    # ended before the server returned).
    assert outage.finished_before is not None and outage.finished_before < TASKS
    assert outage.ended - outage.began >= OUTAGE
    assert batch_ended > outage.ended, (
        f"the batch ended {outage.ended - batch_ended:.1f} s before the server was back")

    # Every task accepted: none an error for the outage, nor failed.
    bad = [(s.name, s.outcome, s.attempt, s.detail, s.cause, s.error)
           for s in result.summaries if s.outcome != "accepted"]
    assert not bad, f"{len(bad)} of {TASKS} tasks not accepted " \
                    f"(outage {outage.began - t0:.1f}–{outage.ended - t0:.1f} s into the " \
                    f"batch): {bad}"
    assert sorted(s.name for s in finished) == sorted(s.name for s in result.summaries)
    sessions = {s.name: s.session_id for s in result.summaries}
    assert None not in sessions.values() and len(set(sessions.values())) == TASKS

    # Each task has exactly one accepted session, the one its summary names.
    workdirs = {str(r[0]): str(r[1]) for r in direct_sql(pg_url, "SELECT session, workdir "
                                                                  "FROM sessions")}
    accepted: dict[str, list[str]] = defaultdict(list)
    for session, in direct_sql(pg_url, "SELECT DISTINCT session FROM submissions "
                                       "WHERE accepted = 1"):
        accepted[Path(workdirs[str(session)]).parent.name].append(str(session))
    assert {name: len(ids) for name, ids in accepted.items()} == {
        s.name: 1 for s in result.summaries}, dict(accepted)
    assert {name: ids[0] for name, ids in accepted.items()} == sessions

    # No event in twice: no (session, hash) twice, each session's numbers 1, 2, 3… with
    # no gap, each cell started and finished once.
    rows = direct_sql(pg_url, "SELECT session, n, kind, body, hash, ts FROM events "
                              "ORDER BY session, n")
    twice = Counter((r[0], r[4]) for r in rows)
    assert [k for k, c in twice.items() if c > 1] == []
    numbers: dict[str, list[int]] = defaultdict(list)
    cells: Counter[tuple[str, str, str]] = Counter()
    stamps: dict[str, list[float]] = defaultdict(list)
    for session, n, kind, body, _, ts in rows:
        numbers[str(session)].append(int(str(n)))
        stamps[str(session)].append(float(str(ts)))
        if kind in ("cell_started", "cell_finished"):
            cells[(str(session), str(kind), json.loads(str(body))["cell_id"])] += 1
    first = min(ns[0] for ns in numbers.values())
    gaps = {s: ns for s, ns in numbers.items() if ns != list(range(first, first + len(ns)))}
    assert gaps == {}, gaps
    assert cells and set(cells.values()) == {1}, [k for k, c in cells.items() if c > 1]
    for session in sessions.values():
        ran = {(k, c) for s, k, c in cells if s == session}
        assert {c for k, c in ran if k == "cell_started"} == \
            {c for k, c in ran if k == "cell_finished"}, session
    # The outage hit sessions that were running: one wrote before the server was down
    # and after it was back.
    assert outage.down is not None
    spanned = [s for s, ts in stamps.items()
               if min(ts) < outage.down and max(ts) > outage.ended]
    assert spanned, "no session was running across the outage"

    # The ledger's audit: every session sound, no fatal finding, heads as summarised.
    report = audit_ledger(pg_url, blobs=blobs,
                          expect_heads={str(s.session_id): str(s.head)
                                        for s in result.summaries})
    assert report.clean, [str(f) for f in report.findings if f.fatal]
    assert report.counts()["damaged"] == 0 and report.counts()["not_checked"] == 0
    assert report.submissions >= TASKS and report.artifacts >= TASKS
