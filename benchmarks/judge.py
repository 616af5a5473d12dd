"""Benchmarks of the judge's world: what the Host-built overlay costs a reproduction.

``reproduce_overlay`` times a submit whose session pip-installed a distribution (so the
Host's reproduction imports the overlay the Host installed itself, cached after the
first submit) against the same submit from a session that installed nothing, in one
interleaved loop. It does not own the timing discipline (benchmarks/_harness.py).
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks._harness import Plan, Result, interleaved, run_cell, scratch
from host_kernel import Host

__all__ = ["JUDGE"]

_DIST, _VERSION, _MODULE = "hk-bench-dist", "1.0", "hk_bench_dist"


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(folder: Path) -> Path:
    """A one-module pure-Python wheel, built by hand (no network, no build backend)."""
    info = f"{_MODULE}-{_VERSION}.dist-info"
    entries = {f"{_MODULE}/__init__.py": b"def one():\n    return 1\n",
               f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {_DIST}\n"
                                   f"Version: {_VERSION}\n".encode(),
               f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                b"Tag: py3-none-any\n"}
    rows = "".join(f"{rel},sha256={_digest(d)},{len(d)}\n" for rel, d in entries.items())
    entries[f"{info}/RECORD"] = (rows + f"{info}/RECORD,,\n").encode()
    path = folder / f"{_MODULE}-{_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for rel, data in entries.items():
            z.writestr(rel, data)
    return path


@contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _package() -> dict[str, str]:
    files = {"pkg/__init__.py": "", "pkg/core.py": "def add(a, b):\n    return a + b\n"}
    for i in range(20):
        files[f"tests/test_{i:02d}.py"] = (f"from pkg.core import add\n\n\ndef test_{i:02d}():\n"
                                           f"    assert add({i}, 1) == {i + 1}\n")
    return files


def _session(root: Path, wheel: Path | None) -> tuple[Host, Callable[[], float]]:
    """A started armed session with the package (and ``wheel`` installed), and a timed
    submit that empties the reproduction cache first (untimed), so each one re-runs."""
    import time

    from host_kernel.verify import Submission

    host = Host(root, mode="reusable_pipeline").start()
    files = _package()
    run_cell(host, "\n".join(f"host.write_file({p!r}, {c!r}); host.save_artifact({p!r})"
                             for p, c in files.items()))
    if wheel is not None:
        (root / wheel.name).write_bytes(wheel.read_bytes())
        run_cell(host, f"_r = host.bash('python -m pip install --no-index --no-deps -q "
                       f"./{wheel.name}')\nassert _r.exit_status == 0, _r")
    command = "python -m pytest -q tests"
    obs = host.execute(f"_r = host.bash({command!r})\nassert _r.exit_status == 0, _r")
    if obs.status != "ok":
        raise RuntimeError(obs.text)
    submission = Submission(
        output={"summary": "benchmark"}, completion_bullets=["wrote pkg.core with tests"],
        source_files=list(files), entry_points=["pkg/core.py"],
        architecture_summary="pkg.core owns the arithmetic; the tests check it.",
        test_evidence=[{"command": command, "producing_cell_id": obs.cell_id}])
    reproducer = host.reproducer()

    def submit() -> float:
        reproducer._cache.clear()
        t0 = time.perf_counter()
        verdict = host.submit(submission)
        elapsed = time.perf_counter() - t0
        if not verdict.accepted:
            raise RuntimeError(verdict.explain())
        return elapsed

    return host, submit


def bench_reproduce_overlay(plan: Plan) -> Result:
    n = plan.n(9, 3)
    with scratch() as root:
        wheels = root / "wheelhouse"
        wheels.mkdir()
        wheel = _wheel(wheels)
        (root / "with").mkdir()
        (root / "without").mkdir()
        with _env(PIP_FIND_LINKS=str(wheels), PIP_NO_INDEX="1",
                  XDG_CACHE_HOME=str(root / "cache")):
            with_host, ours = _session(root / "with", wheel)
            without_host, base = _session(root / "without", None)
            try:
                ours(), base()  # warm-up; the first submit installs the overlay (cached after)
                a, b = interleaved(n, ours, base)
            finally:
                with_host.close()
                without_host.close()
    return Result("reproduce_overlay", a, b, 1.05, notes=(
        f"{n} submits each; 22 files, 20 tests; the session with one pip-installed "
        f"distribution reproduces with the Host-built overlay, cached",))


JUDGE: list[tuple[str, float, str, str, Callable[[Plan], Result]]] = [
    ("reproduce_overlay", 1.05,
     ("`Host.submit` (reproduced) from a session that pip-installed one distribution: the "
      "Host installs it again itself (cached after the first submit) and the reproduction "
      "imports that overlay"),
     "the same submit from a session that installed nothing",
     bench_reproduce_overlay),
]
