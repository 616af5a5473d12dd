"""Benchmark of the record viewer: session pages served over loopback HTTP.

``viewer_page`` builds a record of one session with many cells (each printing a
line) by a real Host, serves it with :class:`host_kernel.viewer.ViewerServer`, and
times a GET of the session's page against
:func:`host_kernel.store.verified.open_verified` alone on the same record: the
verified read every reader must do. Each GET re-hashes the record's files and
serves the projection verified from them (host_kernel/viewer/reads.py).

``viewer_page_10k`` times GETs of pages of a 10,000-cell session (200 cells to a
page: the first, a middle one, the last, a searched one) against the absolute
target of 300 ms per page. Its record is written through the Host's own ledger
writer (:class:`~host_kernel.store.ledger.SQLiteLedger`: the hash chain, the MACs
and the projection as a Host writes them), 10,000 ``cell_started`` /
``cell_finished`` pairs shaped as a Host records them, because running 10,000
cells through a kernel would take the benchmark minutes on its own. The first
GET, which verifies the record from the start, is reported in the notes.

It does not own the timing discipline, the report or the registry
(benchmarks/registry.py lists :data:`VIEWER`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import httpx

from benchmarks._harness import Plan, Result, fmt_seconds, interleaved, scratch, timed
from host_kernel import Host
from host_kernel.store.ledger import SQLiteLedger
from host_kernel.store.verified import open_verified
from host_kernel.viewer import ViewerServer

__all__ = ["VIEWER", "write_cells"]


def bench_viewer_page(plan: Plan) -> Result:
    cells, n = plan.n(1000, 100), plan.n(15, 4)
    with scratch() as root:
        (root / "ws").mkdir()
        record = root / "record"
        with Host(root / "ws", record_dir=record) as host:
            for i in range(cells):
                host.execute(f"print('line', {i})")
            session = host.session_id
        with ViewerServer(record) as server, httpx.Client(timeout=60) as client:
            page = f"http://127.0.0.1:{server.port}/session/{session}?token={server.token}"

            def ours() -> float:
                return timed(lambda: client.get(page).raise_for_status())

            def base() -> float:
                return timed(lambda: open_verified(record).close())

            ours(), base()  # warm-up: imports, templates, disk cache, the first verification
            a, b = interleaved(n, ours, base)
    return Result("viewer_page", a, b, 3.0,
                  notes=(f"a session of {cells} cells", f"{n} requests each"))


def write_cells(record: Path, workdir: Path, session: str, count: int) -> None:
    """A record of one session of ``count`` cells, each printing a line, written through
    the Host's ledger writer with the bodies a Host records."""
    record.mkdir(parents=True)
    with SQLiteLedger(record / "ledger.sqlite") as ledger:
        ledger.append(session, "session_started", {
            "workdir": str(workdir), "mode": {"name": "analysis_run", "armed": False},
            "front": "api", "request": "print ten thousand lines"})
        ledger.append(session, "generation_started", {"generation": 1, "reason": "start"})
        for i in range(count):
            cell = f"c{i:06d}-{'x' * 8}"
            ledger.append(session, "cell_started", {
                "cell_id": cell, "generation": 1, "code": f"print('line', {i})"})
            ledger.append(session, "cell_finished", {
                "cell_id": cell, "generation": 1, "status": "ok", "execution_count": i + 1,
                "duration": 0.004, "notice": None, "traced": {},
                "outputs": [{"output_type": "stream", "name": "stdout",
                             "text": f"line {i}\n"}]})
        ledger.append(session, "session_ended", {})


def bench_viewer_page_10k(plan: Plan) -> Result:
    cells, n = plan.n(10_000, 2_000), plan.n(5, 2)
    last = (cells + 199) // 200
    pages = {"first": "?page=1", "middle": f"?page={last // 2}", "last": f"?page={last}",
             "searched": f"?q=line+{cells - 1}"}
    with scratch() as root:
        record, session = root / "record", "bench-10k"
        write_cells(record, root, session, cells)
        with ViewerServer(record) as server, httpx.Client(timeout=120) as client:
            base = f"http://127.0.0.1:{server.port}/session/{session}"

            def get(query: str) -> float:
                url = f"{base}{query}&token={server.token}"
                return timed(lambda: client.get(url).raise_for_status())

            first = get(pages["first"])  # the record verified from the start
            by_page: dict[str, list[float]] = {name: [] for name in pages}
            for _ in range(n):
                for name, query in pages.items():
                    by_page[name].append(get(query))
    medians = ", ".join(f"{name} {fmt_seconds(statistics.median(times))}"
                        for name, times in by_page.items())
    ours = tuple(t for times in by_page.values() for t in times)
    return Result("viewer_page_10k", ours, (0.3,) * len(ours), 1.0,
                  notes=(f"a session of {cells} cells, 200 to a page; {n} rounds of each page",
                         f"medians by page: {medians}",
                         f"the first GET, the record verified from the start: {fmt_seconds(first)}"))


VIEWER: list[tuple[str, float, str, str, Callable[[Plan], Result]]] = [
    ("viewer_page", 3.0,
     ("GET of one session's page from `host-kernel view` over loopback HTTP: the record's "
      "files re-hashed, its verified projection read, the page's 200 cells rendered"),
     "`open_verified(record)` alone: the verified read every reader does",
     bench_viewer_page),
    ("viewer_page_10k", 1.0,
     ("GET of a page (200 cells) of a 10,000-cell session from `host-kernel view`: the "
      "first, a middle, the last and a searched page, the record's files re-hashed on each"),
     "the absolute target, 300 ms per page (the ratio is ours / 300 ms)",
     bench_viewer_page_10k),
]
