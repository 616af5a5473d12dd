"""Benchmark of the control kernel: a cell's round trip through the relay against a plain
ipykernel, both driven by the same jupyter_client code, interleaved in one run.

Register with ``benchmark("relay_roundtrip", target=1.15, ours=RELAY_OURS,
baseline=RELAY_BASELINE)(bench_relay_roundtrip)``.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

from benchmarks.run import Plan, Result, env_var, interleaved, scratch
from host_kernel.control.kernelspec import install

__all__ = ["RELAY_BASELINE", "RELAY_OURS", "bench_relay_roundtrip"]

RELAY_OURS = ('`execute("pass")` + iopub idle + shell reply through the installed control '
              'kernel (relay, Host record, real ipykernel)')
RELAY_BASELINE = ("the same client code against a plain ipykernel (`python3` kernelspec), "
                  "both over TCP as a frontend connects")
TARGET = 1.15


class _Frontend:
    """A kernel started and driven as a frontend does: KernelManager + BlockingKernelClient."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.km = KernelManager(kernel_name=name)
        env = {**os.environ, "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
        self.km.start_kernel(cwd=str(workdir), env=env)
        self.kc: Any = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=60)
        except RuntimeError:
            self.stop()
            raise

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
                msg = kc.get_shell_msg(timeout=60)
                if msg["parent_header"].get("msg_id") == msg_id:
                    if msg["content"]["status"] != "ok":
                        raise RuntimeError(f"benchmark cell {code!r} failed: {msg['content']}")
                    reply = True
        return time.perf_counter() - t0

    def stop(self) -> None:
        self.kc.stop_channels()
        if self.km.has_kernel:
            self.km.shutdown_kernel(now=False)
        self.km.cleanup_resources()


def _jupyter_path(prefix: Path) -> contextlib.AbstractContextManager[None]:
    return env_var("JUPYTER_PATH", str(prefix / "share" / "jupyter"))


def bench_relay_roundtrip(plan: Plan) -> Result:
    n = plan.n(200, 30)
    with scratch() as root:
        (root / "ours").mkdir()
        (root / "plain").mkdir()
        install(prefix=str(root / "prefix"))
        with _jupyter_path(root / "prefix"):
            ours = _Frontend("host_kernel", root / "ours")
            try:
                plain = _Frontend("python3", root / "plain")
                try:
                    for _ in range(20):
                        ours.cell("pass")
                        plain.cell("pass")
                    a, b = interleaved(n, lambda: ours.cell("pass"), lambda: plain.cell("pass"))
                finally:
                    plain.stop()
            finally:
                ours.stop()
    return Result("relay_roundtrip", a, b, TARGET, notes=(f"{n} cells each",))


if __name__ == "__main__":  # pragma: no cover - python -m benchmarks.relay [--quick]
    import sys

    from benchmarks.run import fmt_seconds

    result = bench_relay_roundtrip(Plan(quick="--quick" in sys.argv))
    print(f"relay {fmt_seconds(result.ours_median)}, plain {fmt_seconds(result.baseline_median)}"
          f", ratio {result.ratio:.3f} (target ≤ {TARGET}); {result.extras()}")
