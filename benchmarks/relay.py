"""Benchmarks of the control kernel against a plain ipykernel kernelspec, both started and
driven by the same jupyter_client code (KernelManager + BlockingKernelClient, over TCP as a
frontend connects), interleaved in one run:

- ``control_start``: launching the kernelspec until ``wait_for_ready`` returns (the first
  ``kernel_info_reply``, then jupyter_client's own IOPub check and 0.2 s IOPub flush,
  which both sides pay);
- ``relay_roundtrip``: one cell (``pass``) from ``execute_request`` to its reply and idle
  status;
- ``control_restart``: ``KernelManager.restart_kernel()`` (what JupyterLab's *Restart
  Kernel* calls) until the next cell's ``execute_reply`` arrives; its notes give the
  absolute median against :data:`RESTART_GOAL`.

Listed by benchmarks/registry.py.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

from jupyter_client.manager import KernelManager

from benchmarks import _instant as instant
from benchmarks._harness import Limit, Plan, Result, env_var, interleaved, scratch
from host_kernel.control.kernelspec import install

__all__ = ["BASELINE", "RELAY_BASELINE", "RELAY_OURS", "RESTART_GOAL", "RESTART_OURS",
           "START_OURS", "bench_control_restart", "bench_control_start",
           "bench_relay_roundtrip"]

BASELINE = ("the same client code against a plain ipykernel kernelspec "
            "(`python -m ipykernel_launcher -f {connection_file}`)")
START_OURS = ("launching the installed control kernelspec until `wait_for_ready()` returns "
              "(relay, Host, record, confined ipykernel)")
RELAY_OURS = ('`execute("pass")` + iopub idle + shell reply through the installed control '
              'kernel (relay, Host record, real ipykernel)')
RELAY_BASELINE = BASELINE + ", both over TCP as a frontend connects"
RESTART_OURS = ("`KernelManager.restart_kernel()` until the next `execute_reply` through the "
                "control kernel (the next relay process continues the session)")
#: Seconds: what a restart through the control kernel should take (issue 14).
RESTART_GOAL = 0.150

_ENV = {"PYDEVD_DISABLE_FILE_VALIDATION": "1"}


class _Frontend:
    """A kernel started and driven as a frontend does: KernelManager + BlockingKernelClient.

    ``replied_after`` is the seconds from launching the kernelspec to the kernel's first
    reply (a ``kernel_info_request`` sent at once); ``ready_after`` to ``wait_for_ready()``
    returning, which then asks again and waits out its 0.2 s IOPub flush.
    """

    def __init__(self, name: str, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.km = KernelManager(kernel_name=name)
        t0 = time.perf_counter()
        self.km.start_kernel(cwd=str(workdir), env={**os.environ, **_ENV, **(env or {})})
        self.kc: Any = self.km.client()
        self.kc.start_channels()
        try:
            asked = self.kc.kernel_info()
            while self.kc.get_shell_msg(timeout=60)["parent_header"].get("msg_id") != asked:
                pass
            self.replied_after = time.perf_counter() - t0
            self.kc.wait_for_ready(timeout=60)
        except (RuntimeError, Empty):
            self.stop()
            raise
        self.ready_after = time.perf_counter() - t0

    def cell(self, code: str) -> float:
        """Seconds from sending the request to having both its idle status and its reply."""
        kc = self.kc
        t0 = time.perf_counter()
        msg_id = kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        idle = reply = False
        while not (idle and reply):
            if not idle:
                msg = kc.get_iopub_msg(timeout=60)
                idle = (msg["parent_header"].get("msg_id") == msg_id
                        and msg["msg_type"] == "status"
                        and msg["content"]["execution_state"] == "idle")
            else:
                reply = self._replied(msg_id, code)
        return time.perf_counter() - t0

    def _replied(self, msg_id: str, code: str) -> bool:
        msg = self.kc.get_shell_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            return False
        if msg["content"]["status"] != "ok":
            raise RuntimeError(f"benchmark cell {code!r} failed: {msg['content']}")
        return True

    def restart(self) -> float:
        """Seconds from ``restart_kernel()`` to the ``execute_reply`` of the next cell, sent
        at once (the frontend's requests wait in its sockets for the new kernel)."""
        t0 = time.perf_counter()
        self.km.restart_kernel(now=False)
        msg_id = self.kc.execute("pass", store_history=True, allow_stdin=False)
        while not self._replied(msg_id, "pass"):
            pass
        elapsed = time.perf_counter() - t0
        self._settle()
        return elapsed

    def _settle(self) -> None:
        """Let the new kernel finish starting and empty IOPub, so one sample does not
        spill into the next."""
        self.kc.wait_for_ready(timeout=60)

    def stop(self) -> None:
        self.kc.stop_channels()
        if self.km.has_kernel:
            self.km.shutdown_kernel(now=False)
        self.km.cleanup_resources()


@contextlib.contextmanager
def _kernelspecs() -> Iterator[Path]:
    """A scratch folder, with the control kernel installed under it and findable, and
    the records of its workspaces kept under it too."""
    with scratch() as root:
        install(prefix=str(root / "prefix"))
        instant.install(root / "prefix" / "share" / "jupyter")  # the floor (benchmarks/_instant.py)
        with env_var("JUPYTER_PATH", str(root / "prefix" / "share" / "jupyter")), \
                env_var("XDG_STATE_HOME", str(root / "state")):
            yield root


@contextlib.contextmanager
def _pair(root: Path) -> Iterator[tuple[_Frontend, _Frontend]]:
    (root / "ours").mkdir()
    (root / "plain").mkdir()
    ours = _Frontend("host_kernel", root / "ours")
    try:
        plain = _Frontend("python3", root / "plain")
        try:
            yield ours, plain
        finally:
            plain.stop()
    finally:
        ours.stop()


def bench_control_start(plan: Plan) -> Result:
    n = plan.n(15, 3)
    with _kernelspecs() as root:
        count = iter(range(10 * n + 10))

        replied: dict[str, list[float]] = {"host_kernel": [], "python3": []}

        def start(name: str, env: dict[str, str] | None = None) -> float:
            workdir = root / f"{name}-{next(count)}"  # a new workspace (and record) each time
            workdir.mkdir()
            frontend = _Frontend(name, workdir, env)
            frontend.stop()
            if env is None:
                replied[name].append(frontend.replied_after)
            return frontend.ready_after

        cold_env = {"HOST_KERNEL_WARM": "off"}
        start("host_kernel")  # warm the file cache for both sides
        start("python3")
        cold: list[float] = []

        def ours() -> float:
            # The same kernelspec with its kernel started only after the relay's imports
            # (HOST_KERNEL_WARM=off, as before the early standby), timed in the same loop.
            cold.append(start("host_kernel", cold_env))
            return start("host_kernel")

        replied["host_kernel"].clear()
        replied["python3"].clear()
        a, b = interleaved(n, ours, lambda: start("python3"))
    first_ours, first_base = (statistics.median(replied[k][-n:])
                              for k in ("host_kernel", "python3"))
    return Result("control_start", a, b, 1.3, notes=(
        f"{n} starts each, each in a new workspace",
        f"to the first reply (a kernel_info_request sent at launch), before wait_for_ready's "
        f"IOPub flush: ours {first_ours * 1000:.0f} ms, baseline {first_base * 1000:.0f} ms, "
        f"{first_ours / first_base:.2f}×",
        f"with the kernel started after the imports (HOST_KERNEL_WARM=off): median "
        f"{statistics.median(cold) * 1000:.0f} ms, "
        f"{statistics.median(cold) / statistics.median(b):.2f}× the baseline",
        "both include jupyter_client's wait_for_ready: the kernel_info_reply, an IOPub check "
        "and its 0.2 s IOPub flush"))


def bench_relay_roundtrip(plan: Plan) -> Result:
    n = plan.n(200, 30)
    with _kernelspecs() as root, _pair(root) as (ours, plain):
        for _ in range(20):
            ours.cell("pass")
            plain.cell("pass")
        a, b = interleaved(n, lambda: ours.cell("pass"), lambda: plain.cell("pass"))
    return Result("relay_roundtrip", a, b, 1.10, notes=(f"{n} cells each",))


def bench_control_restart(plan: Plan) -> Result:
    n = plan.n(10, 2)
    with _kernelspecs() as root, _pair(root) as (ours, plain):
        ours.cell("pass")
        plain.cell("pass")
        a, b = interleaved(n, ours.restart, plain.restart)
    median = statistics.median(a)
    verdict = "met" if median < RESTART_GOAL else "NOT met"
    goal = Limit("median restart", median * 1000, RESTART_GOAL * 1000, "ms")
    return Result("control_restart", a, b, 1.0, limits=(goal,), notes=(
        f"{n} restarts each",
        f"ours {median * 1000:.0f} ms against the {RESTART_GOAL * 1000:.0f} ms goal: {verdict} "
        f"(why: docs/jupyter.md, Restart)"))


if __name__ == "__main__":  # pragma: no cover - python -m benchmarks.relay [--quick] [NAME...]
    import sys

    from benchmarks._harness import fmt_seconds

    benches = {"control_start": bench_control_start, "relay_roundtrip": bench_relay_roundtrip,
               "control_restart": bench_control_restart}
    chosen = [a for a in sys.argv[1:] if a in benches] or list(benches)
    for name in chosen:
        result = benches[name](Plan(quick="--quick" in sys.argv))
        print(f"{name}: ours {fmt_seconds(result.ours_median)}, plain "
              f"{fmt_seconds(result.baseline_median)}, ratio {result.ratio:.3f} "
              f"(target ≤ {result.target:g}); {result.extras()}", flush=True)
