"""Benchmarks of the Host against the bare tools it wraps, measured in one process run.

Owns the benchmark registry, the timing discipline (warm-up, interleaving ours
with the baseline in the same loop, medians), the console table and the
markdown report. It does not own what is measured: every benchmark drives the
public :class:`host_kernel.Host` API and, for its baseline, plain
jupyter_client, ``subprocess``, ``cp`` or ``hashlib``.

Run ``python -m benchmarks.run [--quick] [--only NAME ...] [--out PATH]``.
Adding a benchmark is one function decorated with :func:`benchmark`; it gets
the :class:`Plan` (quick or full) and returns a :class:`Result`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import os
import platform
import shutil
import statistics
import subprocess
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

import host_kernel
from host_kernel import Host

__all__ = ["BENCHMARKS", "Benchmark", "Limit", "Plan", "Result", "benchmark", "main"]

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "benchmarks.md"
MIB = 1024 * 1024
#: Prefix of every scratch folder, so a leftover is easy to find (and never looks
#: like the Host's own ``hk-*`` runtime folders).
SCRATCH_PREFIX = "host-kernel-bench-"


# ---------------------------------------------------------------------- registry


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


@dataclass(frozen=True, slots=True)
class Benchmark:
    name: str
    target: float
    ours: str
    baseline: str
    run: Callable[[Plan], Result]


#: Every benchmark, in the order they run and are reported.
BENCHMARKS: dict[str, Benchmark] = {}


def benchmark(name: str, *, target: float, ours: str,
              baseline: str) -> Callable[[Callable[[Plan], Result]], Callable[[Plan], Result]]:
    """Register a benchmark; ``ours`` and ``baseline`` say in words what each side times."""

    def register(fn: Callable[[Plan], Result]) -> Callable[[Plan], Result]:
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} is registered twice")
        BENCHMARKS[name] = Benchmark(name, target, ours, baseline, fn)
        return fn

    return register


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


# ---------------------------------------------------------------------- benchmarks


@benchmark("execute_pass", target=0.90,
           ours='`Host.execute("pass")`: the whole Observation, record appended (the Host\'s '
                'kernel runs without IPython\'s history database, see docs/record.md)',
           baseline='a plain ipykernel as it comes (default settings), jupyter_client '
                    '`execute("pass")` + iopub idle + shell reply')
def bench_execute_pass(plan: Plan) -> Result:
    """Also times a third side, reported in the notes: the plain ipykernel with the
    settings the Host starts its kernel with (``kernel_argv``), given as an IPython
    config file, so the ratio splits into what the settings save and what the Host adds."""
    import ast

    from host_kernel.host._kernel import kernel_argv

    settings = [a[2:] for a in kernel_argv(None) if a.startswith("--") and "=" in a
                and not a.startswith(("--IPKernelApp.extra_extensions",
                                      "--IPKernelApp.parent_handle"))]

    def literal(text: str) -> str:
        try:
            return repr(ast.literal_eval(text))
        except (ValueError, SyntaxError):
            return repr(text)

    n = plan.n(200, 30)
    with scratch() as root, contextlib.ExitStack() as stack:
        for name in ("ours", "bare", "tuned"):
            (root / name).mkdir()
        profile = root / "ipython" / "profile_default"
        profile.mkdir(parents=True)
        (profile / "ipython_kernel_config.py").write_text("".join(
            f"c.{name} = {literal(value)}\n"
            for name, value in (s.split("=", 1) for s in settings)))
        host = stack.enter_context(Host(root / "ours"))
        bare = stack.enter_context(BareKernel(root / "bare"))
        tuned = BareKernel(root / "tuned")
        stack.callback(tuned.stop)
        tuned.env["IPYTHONDIR"] = str(root / "ipython")
        tuned.start()
        sides: list[Callable[[], float]] = [
            lambda: run_cell(host, "pass"), lambda: timed(lambda: bare.execute("pass")),
            lambda: timed(lambda: tuned.execute("pass"))]
        for _ in range(20):
            for side in sides:
                side()
        times: list[list[float]] = [[], [], []]
        for i in range(n):  # one loop, rotating which side goes first
            for j in range(len(sides)):
                k = (i + j) % len(sides)
                times[k].append(sides[k]())
    ours, base, same = (tuple(t) for t in times)
    return Result("execute_pass", ours, base, 0.90, notes=(
        f"{n} runs each",
        f"the plain ipykernel with the Host's kernel settings ({', '.join(settings)}): "
        f"{fmt_seconds(statistics.median(same))}; ours ÷ it "
        f"{statistics.median(ours) / statistics.median(same):.3f}×, it ÷ baseline "
        f"{statistics.median(same) / statistics.median(base):.3f}×"))


@benchmark("start", target=1.1,
           ours="`Host.start()`: record opened, call server up, kernel started and ready",
           baseline="`KernelManager.start_kernel` + `client.wait_for_ready` (plain ipykernel)")
def bench_start(plan: Plan) -> Result:
    n = plan.n(5, 3)
    with scratch() as root:
        runs = iter(range(10 * n + 10))

        def ours() -> float:
            return host_start(root / f"ours-{next(runs)}")

        def base() -> float:
            return bare_start(root / f"bare-{next(runs)}")

        ours(), base()  # warm-up: imports, disk cache
        a, b = interleaved(n, ours, base)
    return Result("start", a, b, 1.1, notes=(f"{n} starts each",))


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


def _require_confined(host: Host) -> None:
    if host.confinement is None or not host.confinement.active:
        raise RuntimeError(f"confinement is not active here ({host.confinement}): the "
                           f"confinement benchmarks compare confined against unconfined")


@benchmark("confined_start", target=1.05,
           ours="`Host.start()` confined (Landlock, user+PID namespace, sandbox init)",
           baseline="`Host.start()` with confinement off (HOST_KERNEL_FAKE_NO_LANDLOCK=1)")
def bench_confined_start(plan: Plan) -> Result:
    n = plan.n(9, 3)
    with scratch() as root:
        runs = iter(range(10 * n + 10))

        def start(confined: bool) -> float:
            work = root / f"ws-{next(runs)}"
            work.mkdir()
            if confined:
                host = Host(work)
                elapsed = timed(host.start)
                _require_confined(host)
            else:
                with unconfined():
                    host = Host(work)
                    elapsed = timed(host.start)
            host.close()
            return elapsed

        start(True), start(False)  # warm-up: imports, disk cache
        a, b = interleaved(n, lambda: start(True), lambda: start(False))
    return Result("confined_start", a, b, 1.05, notes=(f"{n} starts each",))


def _confined_pair(plan: Plan, name: str, code: str, full: int, quick: int) -> Result:
    n = plan.n(full, quick)
    with scratch() as root:
        (root / "confined").mkdir()
        (root / "open").mkdir()
        with Host(root / "confined") as confined:
            _require_confined(confined)
            with unconfined():
                free = Host(root / "open").start()
            try:
                for _ in range(10):
                    run_cell(confined, code)
                    run_cell(free, code)
                a, b = interleaved(n, lambda: run_cell(confined, code),
                                   lambda: run_cell(free, code))
            finally:
                free.close()
    return Result(name, a, b, 1.05, notes=(f"{n} cells each",))


@benchmark("confined_pass", target=1.05,
           ours='`Host.execute("pass")` in a confined kernel',
           baseline='`Host.execute("pass")` with confinement off, same run')
def bench_confined_pass(plan: Plan) -> Result:
    return _confined_pair(plan, "confined_pass", "pass", 200, 30)


@benchmark("confined_bash_true", target=1.05,
           ours='a cell running `host.bash("true")`, started confined by the sandbox\'s init',
           baseline='the same cell with confinement off (the Host spawns bash itself)')
def bench_confined_bash_true(plan: Plan) -> Result:
    return _confined_pair(plan, "confined_bash_true", "_ = host.bash('true')", 100, 30)


def _bash_pair(plan: Plan, name: str, command: str, target: float, full: int, quick: int,
               warmup: int) -> Result:
    n = plan.n(full, quick)
    with scratch() as root, Host(root) as host:
        run_cell(host, "import subprocess")
        ours_code = f"_ = host.bash({command!r})"
        base_code = f"_ = subprocess.run({command!r}, shell=True)"
        for _ in range(warmup):
            run_cell(host, ours_code)
            run_cell(host, base_code)
        a, b = interleaved(n, lambda: run_cell(host, ours_code),
                           lambda: run_cell(host, base_code))
    return Result(name, a, b, target, notes=(f"{n} cells each",))


@benchmark("bash_true", target=1.5,
           ours='a cell running `host.bash("true")` (receipt recorded)',
           baseline='a cell running `subprocess.run("true", shell=True)`, same Host')
def bench_bash_true(plan: Plan) -> Result:
    return _bash_pair(plan, "bash_true", "true", 1.5, 100, 30, warmup=5)


@benchmark("bash_1s", target=1.02,
           ours='a cell running `host.bash("sleep 1")`',
           baseline='a cell running `subprocess.run("sleep 1", shell=True)`, same Host')
def bench_bash_1s(plan: Plan) -> Result:
    return _bash_pair(plan, "bash_1s", "sleep 1", 1.02, 5, 3, warmup=1)


def _write_random(path: Path, size: int) -> None:
    chunk = 4 * MIB
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(os.urandom(min(chunk, left)))
            left -= chunk


@benchmark("save_artifact_1g", target=1.2,
           ours="a cell running `host.save_artifact` of a 1 GiB file (64 MiB with --quick)",
           baseline="max(`cp` of the file, hashlib sha256 of the file), each timed alone")
def bench_save_artifact(plan: Plan) -> Result:
    size = MIB * plan.n(1024, 64)
    n = 3
    cps: list[float] = []
    shas: list[float] = []
    extra = 0
    with scratch() as root:
        big, copy = root / "big.bin", root / "big.copy"
        _write_random(big, size)

        def copy_file(sync: bool) -> float:
            def run() -> None:
                subprocess.run(["cp", str(big), str(copy)], check=True)
                if sync:
                    fd = os.open(copy, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)

            t = timed(run)
            copy.unlink()
            return t

        def sha() -> float:
            def digest() -> None:
                with open(big, "rb") as f:
                    hashlib.file_digest(f, "sha256")

            return timed(digest)

        def bare() -> float:
            c, s = copy_file(sync=False), sha()
            cps.append(c)
            shas.append(s)
            return max(c, s)

        with Host(root) as host:

            saves = iter(range(1_000))

            def save() -> float:
                nonlocal extra
                # New bytes each time, so every save really stores 1 GiB (identical bytes
                # would be found stored already and skip the fsync).
                with open(big, "r+b") as f:
                    f.write(next(saves).to_bytes(8, "little"))
                with RssSampler() as rss:
                    t = run_cell(host, '_a = host.save_artifact("big.bin")')
                extra = max(extra, rss.extra)
                return t

            run_cell(host, "pass")
            copy_file(sync=False), sha()  # warm-up: the file is in the page cache for all
            ours, base = interleaved(n, save, bare)
        # Not part of the baseline: what durability costs, since the store fsyncs and cp not.
        synced = [copy_file(sync=True) for _ in range(n)]
        big.unlink()
    return Result(
        "save_artifact_1g", ours, base, 1.2,
        limits=(Limit("Host extra peak RSS", extra / MIB, 64, "MiB"),),
        notes=(f"{size // MIB} MiB file, {n} saves each",
               (f"medians: cp {fmt_seconds(statistics.median(cps))}, sha256 "
               f"{fmt_seconds(statistics.median(shas))}, cp + fsync (not in the baseline: "
               f"the store fsyncs, cp does not) {fmt_seconds(statistics.median(synced))}")))


@benchmark("verify_200", target=1.0,
           ours="`Host.submit` of an armed submission: 200 source files, 20 test-evidence "
                "entries (chain checked, projection rebuilt, every check)",
           baseline="the absolute target, 200 ms (the ratio is ours / 200 ms)")
def bench_verify(plan: Plan) -> Result:
    from host_kernel.verify import Submission

    n = plan.n(15, 5)
    files = {f"pkg/mod_{i:03d}.py": f"VALUE = {i}\n" for i in range(199)}
    files["tests/test_pkg.py"] = ("import unittest\n\n\nclass T(unittest.TestCase):\n"
                                  "    def test_ok(self):\n        self.assertTrue(True)\n")
    with scratch() as root, Host(root, mode="reusable_pipeline") as host:
        writes = "\n".join(f"host.write_file({p!r}, {c!r}); host.save_artifact({p!r})"
                            for p, c in files.items())
        run_cell(host, writes)
        command = "python -m unittest discover -s tests -q"
        cells = []
        for _ in range(20):
            obs = host.execute(f"_r = host.bash({command!r})")
            cells.append(obs.cell_id)
        submission = Submission(
            output={"summary": "benchmark"}, completion_bullets=["wrote 199 modules"],
            source_files=list(files), entry_points=["pkg/mod_000.py"],
            architecture_summary="Each pkg module owns one constant; the test holds them.",
            test_evidence=[{"command": command, "producing_cell_id": c} for c in cells])
        host.submit(submission)  # warm-up
        ours = []
        for _ in range(n):
            t0 = time.perf_counter()
            verdict = host.submit(submission)
            ours.append(time.perf_counter() - t0)
            if not verdict.accepted:
                raise RuntimeError(verdict.explain())
        events = host.ledger.query("SELECT count(*) FROM events")[0][0]
    return Result("verify_200", tuple(ours), (0.2,) * n, 1.0,
                  notes=(f"{n} verdicts; record of {events} events",))


def _reproduce_package() -> dict[str, str]:
    """200 files: ``pkg/__init__.py``, 149 small modules and 50 one-test files that import them."""
    files = {"pkg/__init__.py": '"""A package of small modules."""\n'}
    for i in range(149):
        files[f"pkg/m{i:03d}.py"] = (f"# module {i}\n\n\ndef value():\n    return {i}\n\n\n"
                                     f"def double(x):\n    return 2 * x + value() - {i}\n")
    for i in range(50):
        files[f"tests/test_{i:03d}.py"] = (f"from pkg import m{i:03d}\n\n\ndef test_{i:03d}():\n"
                                           f"    assert m{i:03d}.value() == {i}\n"
                                           f"    assert m{i:03d}.double(3) == 6\n")
    return files


@benchmark("reproduce_submit", target=1.3,
           ours="`Host.submit` of an armed `reusable_pipeline` submission: 200 source files, "
                "one test-evidence entry `python -m pytest -q tests` (50 fast tests) reproduced "
                "by the Host (tree built, sandboxed pytest run, every check, verdict recorded); "
                "the reproduction cache is emptied before each submit so each one really re-runs",
           baseline="`subprocess.run([sys.executable, '-m', 'pytest', '-q', 'tests'])` in the "
                    "workspace, same interpreter, its `__pycache__` warm")
def bench_reproduce_submit(plan: Plan) -> Result:
    from host_kernel.verify import Submission

    n = plan.n(9, 3)
    files = _reproduce_package()
    assert len(files) == 200
    command = "python -m pytest -q tests"
    durations: list[float] = []  # the reproduction's own run, as its section reports it
    rests: list[float] = []  # the rest of each submit
    confined: set[bool] = set()  # whether the reproductions ran in their sandbox
    with scratch() as root, Host(root, mode="reusable_pipeline") as host:
        writes = "\n".join(f"host.write_file({p!r}, {c!r}); host.save_artifact({p!r})"
                            for p, c in files.items())
        run_cell(host, writes)
        obs = host.execute(f"_r = host.bash({command!r})\nassert _r.exit_status == 0, _r")
        if obs.status != "ok":
            raise RuntimeError(f"the test command failed in the Host:\n{obs.text}")
        submission = Submission(
            output={"summary": "benchmark"}, completion_bullets=["wrote 149 modules, 50 tests"],
            source_files=list(files), entry_points=["pkg/__init__.py"],
            architecture_summary="Each pkg module owns two small functions; each test checks "
                                 "one module.",
            test_evidence=[{"command": command, "producing_cell_id": obs.cell_id}])
        reproducer = host.reproducer()

        def ours() -> float:
            # The Host caches reproductions by tree digest for the session: empty the cache
            # (untimed) so every timed submit runs the suite again.
            reproducer._cache.clear()
            t0 = time.perf_counter()
            verdict = host.submit(submission)
            elapsed = time.perf_counter() - t0
            if not verdict.accepted:
                raise RuntimeError(verdict.explain() + "\n" + "\n".join(
                    f"  {c.code}: {c.message}" for c in verdict.failed))
            section = verdict.reproduction[0]
            if section["cached"] is not False or section.get("outcome") != "passed":
                raise RuntimeError(f"the submit did not reproduce the tests: {section}")
            durations.append(float(section["duration"]))
            rests.append(elapsed - float(section["duration"]))
            confined.add(bool(section.get("confined")))
            return elapsed

        def base() -> float:
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests"], cwd=root,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
            elapsed = time.perf_counter() - t0
            if proc.returncode != 0:
                raise RuntimeError(f"the baseline pytest run failed:\n{proc.stdout.decode()}")
            return elapsed

        ours(), base()  # warm-up: imports, bytecode caches, disk cache
        durations.clear()
        rests.clear()
        a, b = interleaved(n, ours, base)
    return Result("reproduce_submit", a, b, 1.3, notes=(
        f"{n} submits each; 200 files, 50 tests; reproduction sandboxed: "
        f"{'/'.join('yes' if c else 'no' for c in sorted(confined, reverse=True))}",
        (f"medians: the reproduction's own duration (its pytest run) "
         f"{fmt_seconds(statistics.median(durations))}, the rest of submit "
         f"{fmt_seconds(statistics.median(rests))}")))


@benchmark("capture_10k", target=1.15,
           ours="a cell opening and reading 10,000 small workspace files, audit hook on",
           baseline="the same cell in a plain ipykernel (no audit hook)")
def bench_capture(plan: Plan) -> Result:
    n = plan.n(7, 3)
    count = plan.n(10_000, 2_000)
    code = (f"for _i in range({count}):\n"
            f"    with open(f'files/f{{_i}}.txt') as _f:\n        _f.read()")
    with scratch() as root:
        for side in ("ours", "bare"):
            (root / side / "files").mkdir(parents=True)
            for i in range(count):
                (root / side / "files" / f"f{i}.txt").write_text(str(i))
        with Host(root / "ours") as host, BareKernel(root / "bare") as bare:
            run_cell(host, code)
            bare.execute(code)
            ours, base = interleaved(n, lambda: run_cell(host, code),
                                     lambda: timed(lambda: bare.execute(code)))
    return Result("capture_10k", ours, base, 1.15,
                  notes=(f"{count} files, {n} cells each; ours includes reporting the "
                         f"accesses to the Host and its lineage bookkeeping",))


@benchmark("audit_10k", target=1.0,
           ours="`host_kernel.audit.audit` of a record holding 10,000 artifacts (with lineage)",
           baseline="the absolute target, 10 s (the ratio is ours / 10 s)")
def bench_audit(plan: Plan) -> Result:
    from host_kernel.audit import audit
    from host_kernel.store.blobs import FileBlobStore
    from host_kernel.store.ledger import SQLiteLedger

    count = plan.n(10_000, 1_000)
    n = plan.n(3, 1)
    with scratch() as root:
        record = root / ".host_kernel"
        (root / "data.csv").write_text("x\n1\n")
        data_sha = hashlib.sha256(b"x\n1\n").hexdigest()
        store = FileBlobStore(record, durable=False)
        with SQLiteLedger(record / "ledger.sqlite") as ledger:
            session = "bench"
            ledger.append(session, "session_started", {
                "workdir": str(root), "mode": {"name": "analysis_run", "armed": False}})
            ledger.append(session, "generation_started", {"generation": 1, "reason": "start"})
            ledger.append(session, "cell_started", {"cell_id": "c1", "generation": 1,
                                                    "code": "save"})
            for i in range(count):
                ref = store.put_bytes(f"artifact {i}\n".encode())
                ledger.append(session, "artifact_saved", {
                    "artifact_id": f"00000000-0000-4000-8000-{i:012d}", "filename": f"a{i}.txt",
                    "sha256": ref.sha256, "size": ref.size, "media_type": "text/plain",
                    "cell_id": "c1", "generation": 1, "source_path": f"a{i}.txt",
                    "lineage": {"inputs": [{"key": "file:data.csv", "path": "data.csv",
                                            "sha256": data_sha, "method": "observed",
                                            "via_cell": "c1", "hashed_at": "cell_end"}],
                                "truncated": False}})
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            report = audit(record)
            times.append(time.perf_counter() - t0)
            if not report.clean:
                raise RuntimeError(report.summary())
    return Result("audit_10k", tuple(times), (10.0,) * n, 1.0,
                  notes=(f"{count} artifacts, {n} audits",))


# ---------------------------------------------------------------------- reporting


def fmt_seconds(s: float) -> str:
    if s < 1.0:
        return f"{s * 1000:.2f} ms"
    return f"{s:.3f} s"


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu count": str(os.cpu_count()),
        "python": platform.python_version(),
        "host_kernel": host_kernel.__version__,
        "load average at the end (1, 5, 15 min)": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


HEADERS = ("benchmark", "ours (median)", "baseline (median)", "ratio", "target", "met?")


def rows(results: list[Result]) -> list[tuple[str, ...]]:
    return [(r.name, fmt_seconds(r.ours_median), fmt_seconds(r.baseline_median),
             f"{r.ratio:.3f}×", f"≤ {r.target:g}×", "yes" if r.met else "NO")
            for r in results]


def console_table(results: list[Result]) -> str:
    table = [HEADERS, *rows(results)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        if r.extras():
            lines.append(f"  {r.name}: {r.extras()}")
    return "\n".join(lines)


def markdown(results: list[Result], plan: Plan, command: str) -> str:
    out = ["# Benchmarks", "",
           ("The Host against the bare tools it wraps, both measured in the same process run "
            "(warmed up, interleaved in one loop, medians). The ratio is ours ÷ baseline; the "
            "target is the most overhead the project accepts."), "",
           f"Produced by `{command}`" + (" (quick run: fewer iterations, smaller files)."
                                         if plan.quick else "."), "",
           ("Figures from a shared or busy machine move from run to run (see the load average "
            "and each benchmark's range below); compare ratios from one run, not across runs."),
           "",
           "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    out += ["| " + " | ".join(row) + " |" for row in rows(results)]
    out += ["", "## What each benchmark times", ""]
    for r in results:
        b = BENCHMARKS[r.name]
        out.append(f"- **{r.name}**: ours is {b.ours}; baseline is {b.baseline}."
                   + (f" {r.extras()}." if r.extras() else ""))
    out += ["", "## Machine", ""]
    out += [f"- {k}: {v}" for k, v in machine().items()]
    out += ["", ("Rerun with `python -m benchmarks.run` (all, full counts; a few minutes) or "
            "`python -m benchmarks.run --quick`; see `benchmarks/README.md`."), ""]
    return "\n".join(out)


# ---------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Time the Host against bare jupyter_client, subprocess, cp and hashlib, "
                    "in one process run, and write a markdown report.")
    parser.add_argument("--quick", action="store_true",
                        help="fewer iterations and a 64 MiB artifact instead of 1 GiB")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=list(BENCHMARKS),
                        help=f"run only these ({', '.join(BENCHMARKS)})")
    parser.add_argument("--out", metavar="PATH", type=Path, default=None,
                        help=f"the markdown report (default: {DEFAULT_OUT.relative_to(REPO)}; "
                             f"with --quick, no report unless --out is given)")
    return parser


def _register_fronts() -> None:
    """Benchmarks that live in their own modules: beside the front they measure
    (benchmarks/relay.py), or with more sides than ours and a baseline (benchmarks/tracing.py),
    or long (benchmarks/session.py).
    """
    if "relay_roundtrip" in BENCHMARKS:
        return
    from benchmarks.agent import AGENT
    from benchmarks.bash_scale import BASH_SCALE
    from benchmarks.batch import BATCH
    from benchmarks.ledger import LEDGER
    from benchmarks.pool import POOL
    from benchmarks.relay import (
        BASELINE,
        RELAY_BASELINE,
        RELAY_OURS,
        RESTART_OURS,
        START_OURS,
        bench_control_restart,
        bench_control_start,
        bench_relay_roundtrip,
    )
    from benchmarks.session import LONG_BASELINE, LONG_OURS, bench_long_session
    from benchmarks.session import TARGET as LONG_TARGET
    from benchmarks.tracing import TRACING
    from benchmarks.viewer import VIEWER

    benchmark("control_start", target=1.3, ours=START_OURS,
              baseline=BASELINE)(bench_control_start)
    benchmark("relay_roundtrip", target=1.10, ours=RELAY_OURS,
              baseline=RELAY_BASELINE)(bench_relay_roundtrip)
    benchmark("control_restart", target=1.0, ours=RESTART_OURS,
              baseline=BASELINE)(bench_control_restart)
    for name, target, ours, baseline, run in POOL:
        benchmark(name, target=target, ours=ours, baseline=baseline)(run)
    for name, target, ours, baseline, run in (*TRACING, *BASH_SCALE, *VIEWER, *AGENT,
                                              *LEDGER, *BATCH):
        benchmark(name, target=target, ours=ours, baseline=baseline)(run)
    benchmark("long_session", target=LONG_TARGET, ours=LONG_OURS,
              baseline=LONG_BASELINE)(bench_long_session)


def main(argv: list[str] | None = None) -> int:
    _register_fronts()
    args = build_parser().parse_args(argv)
    plan = Plan(quick=args.quick)
    names = args.only or list(BENCHMARKS)
    out: Path | None = args.out if args.out is not None else (None if plan.quick
                                                              else DEFAULT_OUT)
    command = "python -m benchmarks.run" + (" --quick" if plan.quick else "") + (
        " --only " + " ".join(names) if args.only else "")
    results: list[Result] = []
    # Records live under $XDG_STATE_HOME by default: keep the benchmarks' in a scratch folder.
    state = tempfile.mkdtemp(prefix=SCRATCH_PREFIX + "state-")
    saved_state = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = state
    try:
        _run_all(names, plan, results)
    finally:
        shutil.rmtree(state, ignore_errors=True)
        if saved_state is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = saved_state
    print()
    print(console_table(results))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(markdown(results, plan, command))
        print(f"\nreport written to {out}")
    return 0


def _run_all(names: list[str], plan: Plan, results: list[Result]) -> None:
    for name in names:
        print(f"running {name} ...", flush=True)
        t0 = time.perf_counter()
        r = BENCHMARKS[name].run(plan)
        results.append(r)
        print(f"  ours {fmt_seconds(r.ours_median)}, baseline {fmt_seconds(r.baseline_median)},"
              f" ratio {r.ratio:.3f}× (target ≤ {r.target:g}×, "
              f"{'met' if r.met else 'NOT met'}); {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
