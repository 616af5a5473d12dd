"""Benchmarks of starts with the user's kernel factory running (host_kernel/factory).

Every other benchmark runs with ``HOST_KERNEL_FACTORY=off`` (benchmarks/_harness.py),
so each measures what it names. These serve a factory of their own (two standbys,
in a scratch folder) and time the first kernel of a session from every front:

- ``factory_start``: ``Host(workdir).start()`` up to its first ``pass`` cell's
  Observation, against a plain ipykernel's start and first ``execute("pass")``
  through jupyter_client;
- ``factory_exec``: ``host-kernel exec`` of a one-cell notebook, as a process, against
  a process that starts a plain ipykernel through jupyter_client and runs the cell;
- ``factory_control_start``: the control kernelspec started by a frontend up to
  ``wait_for_ready``, against the python3 kernelspec;
- ``factory_control_restart``: a restart through the kernelspec up to the next cell's
  reply, against the python3 kernelspec's.

Before each sample the factory has its standbys ready and the machine a moment
to settle (as between a person's sessions). The user's zygote runs beside the factory
(as the first launch of a day starts it), so ``exec`` and the kernelspec's launches are
forked from it with the Host imported (docs/jupyter.md, "What starts when", step 0).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat

from benchmarks import _instant as instant
from benchmarks._harness import (
    BareKernel,
    Limit,
    Plan,
    Result,
    env_var,
    interleaved,
    run_cell,
    scratch,
)
from benchmarks.relay import _Frontend, _kernelspecs, _pair
from host_kernel import Host
from host_kernel._launch import socket_path
from host_kernel.factory._client import FactoryPool
from host_kernel.factory._place import DIR_ENV, FACTORY_ENV, Place
from host_kernel.host._kernel import pinned

__all__ = ["FACTORY", "require_factory_start", "served"]

#: The issue's bound on a warm start with the factory running.
WARM_LIMIT = 0.050
#: The bound on a restart through the kernelspec.
RESTART_LIMIT = 0.150
SETTLE = 0.3


@contextlib.contextmanager
def served(root: Path, size: int = 2) -> Iterator[Callable[[], None]]:
    """A factory in ``root/factory``, with the environment pointing at it; yields a call
    that waits until every standby is ready."""
    folder = root / "factory"
    folder.mkdir(mode=0o700)
    place = Place(folder)
    env = {k: v for k, v in os.environ.items() if k != FACTORY_ENV}
    proc = subprocess.Popen([*pinned("host_kernel.factory._server"), "--foreground",
                             "--folder", str(folder), "--size", str(size), "--idle", "600"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready() -> None:
        deadline = time.monotonic() + 120
        while True:
            factory, _ = FactoryPool.reach(start=False, place=place)
            if factory is not None:
                factory.close()
                folders = factory.hello.get("folders", [])
                if len(folders) >= size and all((Path(f) / "standby-ready").exists()
                                                for f in folders):
                    time.sleep(SETTLE)
                    return
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the factory did not fill")
            time.sleep(0.02)

    # The user's zygote beside it, as the first launch would have started it: kernelspec
    # launches and exec are forked from it (host_kernel/control/_zygote.py).
    zygote = subprocess.Popen([pinned("host_kernel.control._zygote")[0], "-P",
                               *pinned("host_kernel.control._zygote")[1:], "--foreground",
                               "--folder", str(folder), "--idle", "600"],
                              env=env, cwd="/", stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    saved = os.environ.pop(FACTORY_ENV, None)
    try:
        with env_var(DIR_ENV, str(folder)):
            ready()
            deadline = time.monotonic() + 120
            while not socket_path(place).exists():
                if time.monotonic() > deadline or zygote.poll() is not None:
                    raise RuntimeError("the zygote did not start")
                time.sleep(0.02)
            yield ready
    finally:
        if saved is not None:
            os.environ[FACTORY_ENV] = saved
        for p in (zygote, proc):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def require_factory_start(host: Host) -> None:
    assert host.ledger is not None
    row = next(iter(host.ledger.query(
        "SELECT body FROM events WHERE kind = 'generation_started' AND session = ? "
        "ORDER BY seq LIMIT 1", (host.session_id,))))
    warm = json.loads(row["body"]).get("warm", {})
    if not (warm.get("used") and warm.get("factory")):
        raise RuntimeError(f"the Host did not start from the factory: {warm.get('reason')}")


def bench_factory_start(plan: Plan) -> Result:
    n = plan.n(15, 4)
    with scratch() as root, served(root) as ready:
        count = iter(range(10 * n + 10))

        def ours() -> float:
            ready()
            work = root / f"ours-{next(count)}"
            work.mkdir()
            t0 = time.perf_counter()
            host = Host(work).start()
            try:
                run_cell(host, "pass")
                took = time.perf_counter() - t0
                require_factory_start(host)
            finally:
                host.close()
            return took

        def base() -> float:
            work = root / f"bare-{next(count)}"
            work.mkdir()
            bare = BareKernel(work)
            t0 = time.perf_counter()
            try:
                bare.start()
                bare.execute("pass")
                return time.perf_counter() - t0
            finally:
                bare.stop()

        ours(), base()
        a, b = interleaved(n, ours, base)
    return _limited(Result("factory_start", a, b, 1.0, notes=(f"{n} starts each",)),
                    "median start to first pass", WARM_LIMIT)


BARE_SCRIPT = """
import sys, tempfile
from jupyter_client.manager import KernelManager
km = KernelManager(kernel_name="python3", transport="ipc",
                   connection_file=tempfile.mkdtemp() + "/k.json")
km.start_kernel(cwd=sys.argv[1])
kc = km.client(); kc.start_channels(); kc.wait_for_ready(timeout=60)
reply = kc.execute_interactive("pass", timeout=60)
assert reply["content"]["status"] == "ok"
kc.stop_channels(); km.shutdown_kernel(now=True)
"""


def bench_factory_exec(plan: Plan) -> Result:
    n = plan.n(9, 3)
    with scratch() as root, served(root) as ready:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("pass")])
        count = iter(range(10 * n + 10))

        def ours() -> float:
            ready()
            work = root / f"ours-{next(count)}"
            work.mkdir()
            nbformat.write(nb, work / "one.ipynb")
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "host_kernel", "exec", "one.ipynb"],
                           cwd=work, check=True, capture_output=True)
            return time.perf_counter() - t0

        def base() -> float:
            work = root / f"bare-{next(count)}"
            work.mkdir()
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", BARE_SCRIPT, str(work)], check=True,
                           capture_output=True)
            return time.perf_counter() - t0

        ours(), base()
        a, b = interleaved(n, ours, base)
    return Result("factory_exec", a, b, 1.0, notes=(
        f"{n} runs each, each a new process in a new folder",
        "ours includes the session's record closed and its summary printed",
        "ours forked by the user's zygote"))


def bench_factory_control_start(plan: Plan) -> Result:
    n = plan.n(15, 3)
    with _kernelspecs() as root, served(root) as ready:
        count = iter(range(10 * n + 10))

        ready_after: dict[str, list[float]] = {"host_kernel": [], "python3": [], instant.NAME: []}

        def start(name: str) -> float:
            if name == "host_kernel":
                ready()
            workdir = root / f"{name}-{next(count)}"
            workdir.mkdir()
            frontend = _Frontend(name, workdir)
            frontend.stop()
            ready_after[name].append(frontend.ready_after)
            return frontend.replied_after

        start("host_kernel")
        start("python3")
        a, b = interleaved(n, lambda: start("host_kernel"), lambda: start("python3"))
        floor = statistics.median(start(instant.NAME) for _ in range(n))
    settled_ours, settled_base = (statistics.median(ready_after[k][-n:])
                                  for k in ("host_kernel", "python3"))
    return _limited(Result("factory_control_start", a, b, 1.0, notes=(
        f"{n} starts each, each in a new workspace",
        "timed to the kernel's first reply (a kernel_info_request sent at launch), as issue "
        "32 asks",
        f"the floor, an instant kernel (benchmarks/_instant.py: it binds its ports as soon "
        f"as it has ZeroMQ and answers at once; {n} starts after the others): "
        f"{floor * 1000:.1f} ms, ours ÷ it {statistics.median(a) / floor:.2f}×; the "
        f"frontend connects before any kernel has bound its ports, and libzmq tries again "
        f"100-200 ms later (docs/jupyter.md)",
        f"to jupyter_client's wait_for_ready returning (another kernel_info and its 0.2 s "
        f"IOPub flush): ours {settled_ours * 1000:.0f} ms, baseline "
        f"{settled_base * 1000:.0f} ms, {settled_ours / settled_base:.2f}×")),
        "median start to first reply", WARM_LIMIT)


def bench_factory_control_restart(plan: Plan) -> Result:
    n = plan.n(10, 2)
    with _kernelspecs() as root, served(root) as ready, _pair(root) as (ours, plain):
        ours.cell("pass")
        plain.cell("pass")

        def restart_ours() -> float:
            ready()
            return ours.restart()

        a, b = interleaved(n, restart_ours, plain.restart)
        (root / "instant").mkdir()
        fastest = _Frontend(instant.NAME, root / "instant")
        try:
            floor = statistics.median(fastest.restart() for _ in range(n))
        finally:
            fastest.stop()
    return _limited(Result("factory_control_restart", a, b, 1.0, notes=(
        f"{n} restarts each",
        f"the floor, an instant kernel's restart (benchmarks/_instant.py; {n} restarts "
        f"after the others): {floor * 1000:.1f} ms, ours ÷ it "
        f"{statistics.median(a) / floor:.2f}×; jupyter_client polls the old process every "
        f"0.1 s, then the frontend's channels reconnect 100-200 ms after they lost it "
        f"(docs/jupyter.md)")),
        "median restart to next reply", RESTART_LIMIT)


def _limited(result: Result, label: str, limit: float) -> Result:
    return Result(result.name, result.ours, result.baseline, result.target,
                  limits=(Limit(label, result.ours_median * 1000, limit * 1000, "ms"),),
                  notes=result.notes)


FACTORY: list[tuple[str, float, str, str, Callable[[Plan], Result]]] = [
    ("factory_start", 1.0,
     "`Host(workdir).start()` + first `pass` Observation, the factory running",
     "plain ipykernel: `start_kernel` + `wait_for_ready` + `execute(\"pass\")`",
     bench_factory_start),
    ("factory_exec", 1.0,
     "`host-kernel exec one.ipynb` (one `pass` cell) as a process, the factory running",
     "a process starting a plain ipykernel through jupyter_client and running `pass`",
     bench_factory_exec),
    ("factory_control_start", 1.0,
     "control kernelspec launched by a frontend to its first reply (`kernel_info`), the "
     "factory running", "the python3 kernelspec, same", bench_factory_control_start),
    ("factory_control_restart", 1.0,
     "restart through the control kernelspec to the next cell's reply, the factory running",
     "the python3 kernelspec's restart, same", bench_factory_control_restart),
]
