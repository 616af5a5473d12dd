"""Benchmarks of the cell path: a Host's start, a ``pass`` cell, ``host.bash``, and confinement.

``execute_pass``, ``start``, ``bash_true`` and ``bash_1s`` time the Host
against the bare tools it wraps (a plain ipykernel driven by jupyter_client,
``subprocess.run`` in the same kernel); ``confined_start``, ``confined_pass``
and ``confined_bash_true`` time a confined Host against one with confinement
off, in the same run.

It does not own the timing discipline (benchmarks/_harness.py), the report or
the registry (benchmarks/registry.py lists :data:`CELLS`).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable

from benchmarks._harness import (
    BareKernel,
    Plan,
    Result,
    bare_start,
    fmt_seconds,
    host_start,
    interleaved,
    run_cell,
    scratch,
    timed,
    unconfined,
)
from host_kernel import Host

__all__ = ["CELLS"]


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


def _require_confined(host: Host) -> None:
    if host.confinement is None or not host.confinement.active:
        raise RuntimeError(f"confinement is not active here ({host.confinement}): the "
                           f"confinement benchmarks compare confined against unconfined")


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


def bench_confined_pass(plan: Plan) -> Result:
    return _confined_pair(plan, "confined_pass", "pass", 200, 30)


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


def bench_bash_true(plan: Plan) -> Result:
    return _bash_pair(plan, "bash_true", "true", 1.3, 100, 30, warmup=5)


def bench_bash_1s(plan: Plan) -> Result:
    return _bash_pair(plan, "bash_1s", "sleep 1", 1.02, 5, 3, warmup=1)


CELLS: list[tuple[str, float, str, str, Callable[[Plan], Result]]] = [
    ("execute_pass", 0.90,
     ('`Host.execute("pass")`: the whole Observation, record appended (the Host\'s '
      'kernel runs without IPython\'s history database, see docs/record.md)'),
     ('a plain ipykernel as it comes (default settings), jupyter_client '
      '`execute("pass")` + iopub idle + shell reply'),
     bench_execute_pass),
    ("start", 1.1,
     "`Host.start()`: record opened, call server up, kernel started and ready",
     "`KernelManager.start_kernel` + `client.wait_for_ready` (plain ipykernel)",
     bench_start),
    ("confined_start", 1.05,
     "`Host.start()` confined (Landlock, user+PID namespace, sandbox init)",
     "`Host.start()` with confinement off (HOST_KERNEL_FAKE_NO_LANDLOCK=1)",
     bench_confined_start),
    ("confined_pass", 1.05,
     '`Host.execute("pass")` in a confined kernel',
     '`Host.execute("pass")` with confinement off, same run',
     bench_confined_pass),
    ("confined_bash_true", 1.05,
     'a cell running `host.bash("true")`, started confined by the sandbox\'s init',
     'the same cell with confinement off (the Host spawns bash itself)',
     bench_confined_bash_true),
    ("bash_true", 1.3,
     'a cell running `host.bash("true")` (receipt recorded)',
     'a cell running `subprocess.run("true", shell=True)`, same Host',
     bench_bash_true),
    ("bash_1s", 1.02,
     'a cell running `host.bash("sleep 1")`',
     'a cell running `subprocess.run("sleep 1", shell=True)`, same Host',
     bench_bash_1s),
]
