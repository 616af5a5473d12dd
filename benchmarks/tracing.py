"""Benchmarks of OS-level file tracing (host_kernel/sandbox/trace.py) against a bare kernel.

Each benchmark runs the same cell in three kernels, started side by side in one
run and timed in one loop that rotates which goes first: a traced ``Host()``
(ours), a ``Host(trace=False)`` (confined, lineage from the kernel's audit hook
instead) and a plain ipykernel driven by jupyter_client (the baseline,
:class:`benchmarks._harness.BareKernel`). The ratio is ``Host()`` ÷ bare; the notes
give ``Host(trace=False)`` beside it and ``Host()`` ÷ ``Host(trace=False)``, the
tracer's own cost. ``trace_files`` also times the bare kernel started under
``strace -f --seccomp-bpf -e trace=openat``, the usual way to watch opens
from outside, when ``strace`` works here.

It does not own the timing discipline, the report or the registry
(benchmarks/registry.py lists :data:`TRACING`).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._harness import MIB, BareKernel, Plan, Result, fmt_seconds, run_cell, scratch, timed
from host_kernel import Host

__all__ = ["TRACING", "rotated"]

STRACE = ("strace", "-f", "--seccomp-bpf", "-e", "trace=openat", "-o", "/dev/null")


def rotated(n: int, sides: list[Callable[[], float]]) -> list[tuple[float, ...]]:
    """Time every side ``n`` times in one loop, rotating which goes first each round."""
    times: list[list[float]] = [[] for _ in sides]
    k = len(sides)
    for i in range(n):
        for j in range(k):
            side = (i + j) % k
            times[side].append(sides[side]())
    return [tuple(t) for t in times]


def _strace_works() -> str | None:
    """Why the strace baseline cannot run here, or None when it can."""
    if shutil.which("strace") is None:
        return "strace is not installed"
    proc = subprocess.run([*STRACE, "true"], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        return f"strace fails here: {proc.stderr.decode(errors='replace').strip()[:200]}"
    return None


def _start_host(work: Path, trace: bool) -> Host:
    host = Host(work, trace=trace).start()
    try:
        _require_tracing(host, trace)
    except RuntimeError:
        host.close()
        raise
    return host


def _require_tracing(host: Host, trace: bool) -> None:
    """Refuse to compare a Host that is not what its column says."""
    if host.confinement is None or not host.confinement.active:
        raise RuntimeError(f"confinement is not active here ({host.confinement}): the tracer "
                           f"runs in the sandbox, so the tracing benchmarks need it")
    status = host.tracing.get("status")
    if trace and status != "seccomp":
        raise RuntimeError(f"Host() is not traced here: {host.tracing}")
    if not trace and status == "seccomp":
        raise RuntimeError("Host(trace=False) is traced")


class _Trio:
    """The three kernels a cell is compared in: Host(), Host(trace=False) and bare.

    ``prepare(folder)`` fills each workspace before its kernel starts; ``setup``
    is an untimed cell run in all of them; ``strace`` adds the bare kernel under
    strace, in the bare kernel's workspace.
    """

    def __init__(self, root: Path, prepare: Callable[[Path], None], setup: str,
                 strace: bool = False) -> None:
        self.root = root
        self.prepare = prepare
        self.setup = setup
        self.strace = strace
        self.traced: Host | None = None
        self.untraced: Host | None = None
        self.bare: BareKernel | None = None
        self.straced: BareKernel | None = None
        #: Each timed Host cell's ``Observation.duration`` (request sent to reply and idle
        #: status received), by side: the rest of its time is the Host's work after the reply.
        self.rounds: dict[str, list[float]] = {"traced": [], "untraced": []}
        #: The first warm-up run of the measured cell, by side (traced, untraced, bare): the
        #: cold one, when a Host hashes and keeps every file it reads for the first time.
        self.first: tuple[float, ...] = ()
        #: Which supervisor served the traced Host's kernel: "c" or "python" (trace.py).
        self.supervisor = "?"

    def __enter__(self) -> _Trio:
        try:
            for side in ("traced", "untraced", "bare"):
                (self.root / side).mkdir()
                self.prepare(self.root / side)
            self.traced = _start_host(self.root / "traced", trace=True)
            kernel = self.traced.generations.kernel
            if kernel is not None:
                self.supervisor = str(kernel.hello.get("supervisor", "?"))
            self.untraced = _start_host(self.root / "untraced", trace=False)
            self.bare = BareKernel(self.root / "bare").start()
            if self.strace:
                self.straced = BareKernel(self.root / "bare", launcher=STRACE).start()
            for run in self.sides(self.setup):
                run()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for kernel in (self.straced, self.bare):
            if kernel is not None:
                kernel.stop()
        for host in (self.untraced, self.traced):
            if host is not None:
                host.close()

    def sides(self, code: str) -> list[Callable[[], float]]:
        """Timers of ``code`` in: Host(), Host(trace=False), bare[, bare under strace]."""
        traced, untraced, bare = self.traced, self.untraced, self.bare
        if traced is None or untraced is None or bare is None:
            raise RuntimeError("the kernels are not started")
        out: list[Callable[[], float]] = [
            lambda: self._host_cell(traced, code, self.rounds["traced"]),
            lambda: self._host_cell(untraced, code, self.rounds["untraced"]),
            lambda: timed(lambda: bare.execute(code))]
        if self.straced is not None:
            straced = self.straced
            out.append(lambda: timed(lambda: straced.execute(code)))
        return out

    @staticmethod
    def _host_cell(host: Host, code: str, rounds: list[float]) -> float:
        t0 = time.perf_counter()
        obs = host.execute(code)
        elapsed = time.perf_counter() - t0
        if obs.status != "ok":
            raise RuntimeError(f"benchmark cell {code!r} ended {obs.status}:\n{obs.text}")
        rounds.append(obs.duration)
        return elapsed

    def measure(self, code: str, n: int, warmup: int) -> list[tuple[float, ...]]:
        for i in range(warmup):
            times = tuple(run() for run in self.sides(code))
            if i == 0:
                self.first = times
        for kept in self.rounds.values():
            kept.clear()
        return rotated(n, self.sides(code))


def _result(name: str, target: float, times: list[tuple[float, ...]], *notes: str,
            rounds: dict[str, list[float]] | None = None) -> Result:
    """Host() against bare; Host(trace=False), strace (when timed) and the Hosts' kernel
    round trips (``rounds``, when kept) go in the notes, each with its ratio to bare."""
    traced, untraced, bare = times[:3]
    t, u, b = (statistics.median(x) for x in (traced, untraced, bare))
    extra = [f"Host(trace=False) {fmt_seconds(u)} ({u / b:.3f}× bare, range "
             f"{fmt_seconds(min(untraced))}–{fmt_seconds(max(untraced))})",
             f"the tracer's own cost, Host() ÷ Host(trace=False): {t / u:.3f}×"]
    if rounds is not None:
        rt, ru = (statistics.median(rounds[k]) for k in ("traced", "untraced"))
        extra.append(f"kernel round trip alone (`Observation.duration`, request sent to reply "
                     f"and idle; the rest is the Host's work after the reply): Host() "
                     f"{fmt_seconds(rt)} ({rt / b:.3f}× bare), Host(trace=False) "
                     f"{fmt_seconds(ru)} ({ru / b:.3f}× bare)")
    if len(times) > 3:
        s = statistics.median(times[3])
        extra.append(f"bare kernel under `{' '.join(STRACE)}` {fmt_seconds(s)} "
                     f"({s / b:.3f}× bare)")
    return Result(name, traced, bare, target, notes=(*notes, *extra))


# ---------------------------------------------------------------------- benchmarks


def bench_trace_files(plan: Plan) -> Result:
    count = plan.n(10_000, 2_000)
    n = plan.n(9, 3)

    def prepare(work: Path) -> None:
        (work / "files").mkdir()
        for i in range(count):
            (work / "files" / f"f{i:05d}.txt").write_text(f"file {i}\n")

    setup = "import os\npaths = sorted(os.path.join('files', p) for p in os.listdir('files'))"
    code = "for p in paths: open(p).read()"
    why_no_strace = _strace_works()
    with scratch() as root, _Trio(root, prepare, setup, strace=why_no_strace is None) as trio:
        times = trio.measure(code, n, warmup=1)
    notes = [f"{count} files, {n} cells each; Host() includes taking the traced accesses "
             f"and the lineage bookkeeping, Host(trace=False) the audit hook's reports",
             f"supervisor: {trio.supervisor}"]
    if trio.first:
        first, bare_first = trio.first[0], trio.first[2]
        notes.append(f"first run, cold (every file hashed and its bytes kept for the first "
                     f"time): Host() {fmt_seconds(first)}, bare {fmt_seconds(bare_first)} "
                     f"({first / bare_first:.3f}×, target ≤ 3×)")
    if why_no_strace is not None:
        notes.append(f"no strace figure: {why_no_strace}")
    return _result("trace_files", 1.6, times, *notes, rounds=trio.rounds)


def _write_csv(path: Path, size: int) -> int:
    """About ``size`` bytes of CSV: a header, then one block of 50,000 random rows repeated."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = 50_000
    frame = pd.DataFrame({
        "id": np.arange(rows),
        "category": rng.choice(["alpha", "beta", "gamma", "delta"], rows),
        **{f"x{i}": rng.normal(size=rows).round(6) for i in range(6)},
        "count": rng.integers(0, 1_000_000, rows),
    })
    header, _, block = frame.to_csv(index=False).partition("\n")
    data = block.encode()
    lines = 0
    with open(path, "wb") as f:
        f.write(header.encode() + b"\n")
        written = 0
        while written < size:
            f.write(data)
            written += len(data)
            lines += rows
    return lines


def bench_trace_csv(plan: Plan) -> Result:
    size = MIB * plan.n(200, 20)
    n = plan.n(5, 3)
    with scratch() as root:
        csv = root / "data.csv"  # written once, hard-linked into each workspace
        lines = _write_csv(csv, size)
        actual = csv.stat().st_size

        def prepare(work: Path) -> None:
            os.link(csv, work / "data.csv")

        code = f"_df = pd.read_csv('data.csv')\nassert len(_df) == {lines}\ndel _df"
        with _Trio(root, prepare, "import pandas as pd") as trio:
            times = trio.measure(code, n, warmup=1)
        return _result("trace_csv", 1.05, times,
                   f"{actual / MIB:.0f} MiB, {lines:,} rows × 9 columns; {n} cells each",
                   rounds=trio.rounds)


def bench_trace_numpy(plan: Plan) -> Result:
    n = plan.n(15, 5)
    setup = ("import numpy as np\n"
             "_a = np.random.default_rng(0).random((1000, 1000))")
    code = "for _ in range(6):\n    _b = _a @ _a\n_s = float(_b.sum())"
    with scratch() as root, _Trio(root, lambda work: None, setup) as trio:
        times = trio.measure(code, n, warmup=2)
    return _result("trace_numpy", 1.02, times,
                   f"six 1000×1000 float64 matrix products, no I/O; {n} cells each",
                   rounds=trio.rounds)


def bench_trace_pass(plan: Plan) -> Result:
    n = plan.n(200, 30)
    with scratch() as root, _Trio(root, lambda work: None, "pass") as trio:
        times = trio.measure("pass", n, warmup=20)
    return _result("trace_pass", 1.05, times, f"{n} cells each", rounds=trio.rounds)


def bench_trace_start(plan: Plan) -> Result:
    n = plan.n(7, 3)
    with scratch() as root:
        runs = iter(range(1_000))

        def host(trace: bool) -> float:
            work = root / f"host-{next(runs)}"
            work.mkdir()
            h = Host(work, trace=trace)
            try:
                elapsed = timed(lambda: (h.start(), run_cell(h, "pass")))
                _require_tracing(h, trace)
                return elapsed
            finally:
                h.close()

        def bare() -> float:
            work = root / f"bare-{next(runs)}"
            work.mkdir()
            kernel = BareKernel(work)
            try:
                return timed(lambda: (kernel.start(), kernel.execute("pass")))
            finally:
                kernel.stop()

        sides: list[Callable[[], float]] = [lambda: host(True), lambda: host(False), bare]
        for side in sides:  # warm-up: imports, disk cache
            side()
        times = rotated(n, sides)
    return _result("trace_start", 1.1, times, f"{n} starts each, each in a new workspace")


#: (name, target, ours, baseline, run), listed by benchmarks/registry.py in this order.
TRACING: tuple[tuple[str, float, str, str, Callable[[Plan], Any]], ...] = (
    ("trace_files", 1.6,
     "a cell `for p in paths: open(p).read()` over 10,000 small workspace files (2,000 with "
     "--quick), in a traced `Host()`",
     "the same cell in a plain ipykernel (jupyter_client, same interpreter)",
     bench_trace_files),
    ("trace_csv", 1.05,
     "a cell `pd.read_csv` of a 200 MiB CSV in the workspace (20 MiB with --quick), traced "
     "`Host()`",
     "the same cell in a plain ipykernel", bench_trace_csv),
    ("trace_numpy", 1.02,
     "a numpy cell with no I/O (six 1000×1000 matrix products), traced `Host()`",
     "the same cell in a plain ipykernel", bench_trace_numpy),
    ("trace_pass", 1.05, 'a `"pass"` cell in a traced `Host()`',
     "the same cell in a plain ipykernel", bench_trace_pass),
    ("trace_start", 1.1,
     "a traced `Host()` from `start()` to the Observation of its first cell (`pass`)",
     "`KernelManager.start_kernel` + `wait_for_ready` + the reply to a first `pass` cell",
     bench_trace_start),
)
