"""Optional: our session start and ``pass`` cell beside openai4s 0.3.1's, in one run.

Owns one comparison, run by hand (it is not in the benchmark registry, and it
needs the package index): it makes a scratch folder, a virtual environment in
it, installs ``openai4s==0.3.1`` there with that environment's pip, and drives
openai4s's persistent Python kernel (``openai4s.kernel.Kernel``: a worker
process speaking JSON lines over pipes) from a small driver running in that
environment, while this process drives :class:`host_kernel.Host`. Starts and
cells are interleaved, one of ours then one of theirs (alternating which goes
first), and compared by median:

- **session start**: ours is ``Host(workdir).start()`` and a first
  ``execute("pass")``; theirs is ``Kernel(cwd=workdir)`` and a first
  ``execute("pass")``. Each in a fresh workspace.
- **pass cell**: ``Host.execute("pass")`` against ``Kernel.execute("pass")``.

The two do different work, and the report says so: ours speaks the Jupyter
protocol to a real ipykernel, confines it when the machine allows, and commits
two events to its hash-chained ledger per cell; openai4s's kernel alone keeps
no record of the cell (its action ledger belongs to its agent engine) and
reports its own sandbox state, which is printed as it gives it.

Where openai4s cannot be installed or started it prints one line saying why,
``skipped: ...``, and exits 0. The scratch folder is removed at the end.

Run ``python -m benchmarks.openai4s_side_by_side [--starts N] [--cells N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.factory import require_factory_start, served
from host_kernel import Host

__all__ = ["PACKAGE", "main"]

PACKAGE = "openai4s==0.3.1"
SCRATCH_PREFIX = "host-kernel-bench-openai4s-"

#: Runs in the openai4s environment: one command per stdin line, one JSON answer per line.
DRIVER = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
from openai4s.kernel import Kernel

kernel = None

def answer(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()

def cell():
    t0 = time.perf_counter()
    result = kernel.execute("pass")
    elapsed = time.perf_counter() - t0
    if result.get("error"):
        raise RuntimeError(f"the pass cell failed: {result['error']}")
    return elapsed

for line in sys.stdin:
    command, _, arg = line.strip().partition(" ")
    try:
        if command == "start":
            t0 = time.perf_counter()
            kernel = Kernel(cwd=arg)
            cell()
            elapsed = time.perf_counter() - t0
            status = getattr(getattr(kernel, "_sandbox", None), "status", None)
            answer(seconds=elapsed, sandbox=None if status is None else {
                "state": getattr(status, "state", None),
                "detail": getattr(status, "detail", None)})
        elif command == "cell":
            answer(seconds=cell())
        elif command == "stop":
            if kernel is not None:
                kernel.shutdown()
                kernel = None
            answer(seconds=0.0)
        else:
            answer(error=f"unknown command {command!r}")
    except Exception as exc:
        answer(error=f"{type(exc).__name__}: {exc}")
"""


class Skip(Exception):
    """openai4s cannot be installed or run here; the message says why."""


def _venv(root: Path) -> Path:
    """A fresh virtual environment under ``root`` with openai4s installed; its python."""
    env = root / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(env)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        raise Skip(f"cannot make a virtual environment: {made.stderr.strip()[-300:]}")
    python = env / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", PACKAGE],
        capture_output=True, text=True)
    if installed.returncode != 0:
        raise Skip(f"cannot install {PACKAGE}: {installed.stderr.strip()[-300:]}")
    return python


class Theirs:
    """The driver process in the openai4s environment."""

    def __init__(self, python: Path, root: Path) -> None:
        driver = root / "driver.py"
        driver.write_text(DRIVER)
        self.proc = subprocess.Popen([str(python), str(driver)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, cwd=root)
        self.sandbox: Any = None

    def ask(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise Skip("the openai4s driver exited")
        answer: dict[str, Any] = json.loads(reply)
        if "error" in answer:
            raise Skip(f"openai4s failed: {answer['error']}")
        return answer

    def start(self, workdir: Path) -> float:
        answer = self.ask(f"start {workdir}")
        self.sandbox = answer.get("sandbox")
        return float(answer["seconds"])

    def cell(self) -> float:
        return float(self.ask("cell")["seconds"])

    def stop(self) -> None:
        self.ask("stop")

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _our_start(root: Path, i: int | str, factory: bool = False) -> tuple[float, Host]:
    work = root / f"ours-{i}"
    work.mkdir()
    t0 = time.perf_counter()
    host = Host(work, record_dir=root / f"ours-{i}-record", factory=factory).start()
    obs = host.execute("pass")
    elapsed = time.perf_counter() - t0
    if obs.status != "ok":
        host.close()
        raise RuntimeError(f"our pass cell ended {obs.status}: {obs.text}")
    return elapsed, host


def _our_cell(host: Host) -> float:
    t0 = time.perf_counter()
    obs = host.execute("pass")
    elapsed = time.perf_counter() - t0
    if obs.status != "ok":
        raise RuntimeError(f"our pass cell ended {obs.status}: {obs.text}")
    return elapsed


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.2f} ms"


def compare(root: Path, starts: int, cells: int) -> str:
    """Run the comparison in ``root``; the report as text."""
    python = _venv(root)
    theirs = Theirs(python, root)
    ours_start: list[float] = []
    their_start: list[float] = []
    ours_cell: list[float] = []
    their_cell: list[float] = []
    ours_warm: list[float] = []
    host: Host | None = None
    try:
        with served(root) as ready:  # ours with the user's kernel factory running
            for i in range(starts):
                ready()
                seconds, started = _our_start(root, f"warm-{i}", factory=True)
                try:
                    require_factory_start(started)
                finally:
                    started.close()
                ours_warm.append(seconds)
        for i in range(starts):
            (root / f"theirs-{i}").mkdir()
            last = i == starts - 1
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                if side == 0:
                    seconds, started = _our_start(root, i)
                    ours_start.append(seconds)
                    if last:
                        host = started
                    else:
                        started.close()
                else:
                    their_start.append(theirs.start(root / f"theirs-{i}"))
                    if not last:
                        theirs.stop()
        assert host is not None
        for _ in range(20):  # warm both
            _our_cell(host)
            theirs.cell()
        for i in range(cells):
            if i % 2 == 0:
                ours_cell.append(_our_cell(host))
                their_cell.append(theirs.cell())
            else:
                their_cell.append(theirs.cell())
                ours_cell.append(_our_cell(host))
        confinement = host.confinement.status if host.confinement is not None else "?"
        tracing = host.tracing.get("status")
        theirs.stop()
    finally:
        if host is not None:
            host.close()
        theirs.close()
    sandbox = theirs.sandbox or {}
    rows = [("session start (to a first pass cell)", ours_start, their_start),
            ("  ours with the kernel factory running", ours_warm, their_start),
            ("pass cell", ours_cell, their_cell)]
    lines = [f"host_kernel against {PACKAGE}, interleaved in one run "
             f"({starts} starts, {cells} cells each; medians)", ""]
    lines.append(f"{'':38s} {'ours':>10s} {'openai4s':>10s} {'ours/theirs':>12s}")
    for label, a, b in rows:
        lines.append(f"{label:38s} {_ms(a):>10s} {_ms(b):>10s} "
                     f"{statistics.median(a) / statistics.median(b):>11.2f}×")
    lines += ["",
              f"ours: Host with ipykernel over the Jupyter protocol, confinement {confinement}, "
              f"tracing {tracing}; two ledger commits per cell",
              f"openai4s: Kernel (JSON-lines worker over pipes), sandbox "
              f"{sandbox.get('state')} ({sandbox.get('detail')}); no record of the cell",
              f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.openai4s_side_by_side",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--starts", type=int, default=5, help="session starts each (5)")
    parser.add_argument("--cells", type=int, default=200, help="pass cells each (200)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    try:
        print(compare(root, max(1, args.starts), max(1, args.cells)))
    except Skip as why:
        print(f"skipped: {why}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
