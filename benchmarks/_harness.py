"""The benchmarks' harness: the timing discipline and the kernels and Hosts every benchmark uses.

Owns what a benchmark is given and returns (:class:`Plan`, :class:`Result`,
:class:`Limit`), the timing discipline (:func:`interleaved` alternates ours
with the baseline in one loop; a :class:`Result` compares their medians), the
plain-ipykernel baseline (:class:`BareKernel`), and the small helpers the
benchmarks share (:func:`scratch`, :func:`timed`, :func:`run_cell`,
:func:`host_start`, :func:`unconfined`, :class:`RssSampler`, …). It does not own
which benchmarks exist (benchmarks/registry.py lists them), nor the command
line and the report (benchmarks/run.py); benchmark modules import this module,
never those.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager

from host_kernel import Host

__all__ = ["MIB", "REPO", "SCRATCH_PREFIX", "BareKernel", "Limit", "Plan", "Result",
           "RssSampler", "bare_start", "env_var", "fmt_seconds", "host_start", "interleaved",
           "run_cell", "scratch", "timed", "unconfined"]

# Each benchmark measures what it names: none reaches for the user's kernel factory (or
# starts one) but benchmarks/factory.py, which serves its own.
os.environ["HOST_KERNEL_FACTORY"] = "off"

REPO = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
#: Prefix of every scratch folder, so a leftover is easy to find (and never looks
#: like the Host's own ``hk-*`` runtime folders).
SCRATCH_PREFIX = "host-kernel-bench-"


# ---------------------------------------------------------------------- what a benchmark returns


@dataclass(frozen=True, slots=True)
class Plan:
    """How much to measure: ``quick`` for a smoke run, else the full counts."""

    quick: bool

    def n(self, full: int, quick: int) -> int:
        return quick if self.quick else full


@dataclass(frozen=True, slots=True)
class Limit:
    """A secondary target measured alongside the timing (e.g. extra memory)."""

    label: str
    value: float
    limit: float
    unit: str

    @property
    def met(self) -> bool:
        return self.value <= self.limit

    def describe(self) -> str:
        return f"{self.label} {self.value:.1f} {self.unit} (target ≤ {self.limit:g} {self.unit})"


@dataclass(frozen=True, slots=True)
class Result:
    """Timings of one benchmark: ours and the baseline, in seconds, from the same run."""

    name: str
    ours: tuple[float, ...]
    baseline: tuple[float, ...]
    target: float
    limits: tuple[Limit, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ours_median(self) -> float:
        return statistics.median(self.ours)

    @property
    def baseline_median(self) -> float:
        return statistics.median(self.baseline)

    @property
    def ratio(self) -> float:
        return self.ours_median / self.baseline_median

    @property
    def met(self) -> bool:
        return self.ratio <= self.target and all(lim.met for lim in self.limits)

    def spread(self) -> str:
        return (f"range ours {fmt_seconds(min(self.ours))}–{fmt_seconds(max(self.ours))}, "
                f"baseline {fmt_seconds(min(self.baseline))}–{fmt_seconds(max(self.baseline))}")

    def extras(self) -> str:
        return "; ".join([lim.describe() for lim in self.limits] + list(self.notes)
                         + [self.spread()])


# ---------------------------------------------------------------------- helpers


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def interleaved(n: int, ours: Callable[[], float], baseline: Callable[[], float]
                ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Measure both ``n`` times in one loop, alternating which goes first."""
    a: list[float] = []
    b: list[float] = []
    for i in range(n):
        if i % 2 == 0:
            a.append(ours())
            b.append(baseline())
        else:
            b.append(baseline())
            a.append(ours())
    return tuple(a), tuple(b)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_cell(host: Host, code: str) -> float:
    """Time one ``Host.execute``; a cell that does not end ``ok`` spoils the benchmark."""
    t0 = time.perf_counter()
    obs = host.execute(code)
    elapsed = time.perf_counter() - t0
    if obs.status != "ok":
        raise RuntimeError(f"benchmark cell {code!r} ended {obs.status}:\n{obs.text}")
    return elapsed


class _PlainSpec(KernelSpecManager):
    """A plain ipykernel on this interpreter: the Host's launch line without its extension.

    ``launcher`` goes before the interpreter (``strace ...``, to run the kernel under it).
    """

    launcher: tuple[str, ...] = ()

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(argv=[*self.launcher, sys.executable, "-m", "ipykernel_launcher",
                                "-f", "{connection_file}"],
                          display_name="Python 3 (plain)", language="python", resource_dir="",
                          metadata={"debugger": False})


class BareKernel:
    """A plain ipykernel driven with nothing but jupyter_client, over IPC like the Host's.

    ``launcher`` is a command line the kernel runs under (``strace -f ...``); the kernel is
    then that command's child, in the same process group.
    """

    def __init__(self, workdir: Path, launcher: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.launcher = launcher
        self.runtime = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX + "kernel-"))
        env = dict(os.environ)
        env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # as the Host sets it
        self.env = env
        self.manager: Any = None
        self.client: Any = None

    def start(self) -> Self:
        spec = _PlainSpec()
        spec.launcher = self.launcher
        self.manager = KernelManager(transport="ipc", kernel_name="python3",
                                     kernel_spec_manager=spec,
                                     connection_file=str(self.runtime / "kernel.json"))
        self.manager.start_kernel(cwd=str(self.workdir), env=self.env)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        return self

    def execute(self, code: str) -> None:
        """execute_request, then the iopub idle status and the shell reply for it."""
        kc = self.client
        msg_id = kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        while True:
            msg = kc.get_iopub_msg(timeout=60)
            if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"):
                break
        while True:
            reply = kc.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                if reply["content"]["status"] != "ok":
                    raise RuntimeError(f"baseline cell {code!r} failed: {reply['content']}")
                return

    def stop(self) -> None:
        if self.client is not None:
            self.client.stop_channels()
        if self.manager is not None:
            if self.manager.has_kernel:
                self.manager.shutdown_kernel(now=True)
            self.manager.cleanup_resources(restart=False)
        shutil.rmtree(self.runtime, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RssSampler:
    """Samples this process's resident memory in a thread; ``extra`` is peak minus start."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.start_rss = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def rss() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc/self/status")

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            self._stop.wait(self.interval)

    def __enter__(self) -> Self:
        self.start_rss = self.peak = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())

    @property
    def extra(self) -> int:
        return self.peak - self.start_rss


def host_start(work: Path, check: Callable[[Host], None] | None = None, **kwargs: Any) -> float:
    """Seconds ``Host(work, **kwargs).start()`` takes, in a new folder ``work``; ``check``
    looks at the started Host before it is closed (and raises if it is not what was meant)."""
    work.mkdir()
    host = Host(work, **kwargs)
    try:
        took = timed(host.start)
        if check is not None:
            check(host)
        return took
    finally:
        host.close()


def bare_start(work: Path) -> float:
    """Seconds a plain ipykernel takes to start and be ready, in a new folder ``work``."""
    work.mkdir()
    bare = BareKernel(work)
    try:
        return timed(bare.start)
    finally:
        bare.stop()


@contextlib.contextmanager
def env_var(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` for the block, then as it was."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


def unconfined() -> contextlib.AbstractContextManager[None]:
    """Start Hosts in this block as if Landlock were missing (the documented test switch)."""
    return env_var("HOST_KERNEL_FAKE_NO_LANDLOCK", "1")


def fmt_seconds(s: float) -> str:
    if s < 1.0:
        return f"{s * 1000:.2f} ms"
    return f"{s:.3f} s"
