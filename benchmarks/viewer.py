"""Benchmark of the record viewer: one session page served over loopback HTTP.

``viewer_page`` builds a record of one session with many cells (each printing a
line), serves it with :class:`host_kernel.viewer.ViewerServer`, and times a GET of
the session's page (the chain checked, the projection rebuilt, the page rendered
and sent) against :func:`host_kernel.store.verified.open_verified` alone on the same
record: the verified read every reader must do. The ratio is what the viewer adds
to it.

It does not own the timing discipline, the report or the registry
(benchmarks/registry.py lists :data:`VIEWER`).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from benchmarks._harness import Plan, Result, interleaved, scratch, timed
from host_kernel import Host
from host_kernel.store.verified import open_verified
from host_kernel.viewer import ViewerServer

__all__ = ["VIEWER"]


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

            ours(), base()  # warm-up: imports, templates, disk cache
            a, b = interleaved(n, ours, base)
    return Result("viewer_page", a, b, 3.0,
                  notes=(f"a session of {cells} cells", f"{n} requests each"))


VIEWER: list[tuple[str, float, str, str, Callable[[Plan], Result]]] = [
    ("viewer_page", 3.0,
     "GET of one session's page from `host-kernel view` over loopback HTTP: the record "
     "verified, its projection rebuilt, every cell rendered",
     "`open_verified(record)` alone: the verified read every reader does",
     bench_viewer_page),
]
