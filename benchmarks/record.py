"""Benchmarks of what the Host records: artifacts saved, file accesses captured, submissions
verified and reproduced, records audited.

``save_artifact_100m``, ``save_artifact_1g`` and ``capture_10k`` time a cell
against the bare tools (``cp`` with an fsync and hashlib, a plain ipykernel);
``reproduce_submit`` a submit against the bare pytest run it reproduces;
``verify_200`` and ``audit_10k`` against an absolute target.

It does not own the timing discipline (benchmarks/_harness.py), the report or
the registry (benchmarks/registry.py lists :data:`RECORD`).
"""

from __future__ import annotations

import hashlib
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks._harness import (
    MIB,
    BareKernel,
    Limit,
    Plan,
    Result,
    RssSampler,
    fmt_seconds,
    interleaved,
    run_cell,
    scratch,
    timed,
)
from host_kernel import Host

__all__ = ["RECORD"]


def _write_random(path: Path, size: int) -> None:
    chunk = 4 * MIB
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(os.urandom(min(chunk, left)))
            left -= chunk


#: Whose CPU time the save's side counts: this process's, where the Host runs.
_OURS_CPU = "ours (the Host and the RSS sampler)"


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _bench_save_artifact(name: str, full_mib: int, quick_mib: int, full_n: int,
                         quick_n: int) -> Callable[[Plan], Result]:
    """A cell saving one random file of ``full_mib`` MiB (``quick_mib`` with --quick), against
    max(``cp`` + fsync of the copy, hashlib sha256 of the file), the two timed alone: the
    floor is copying the bytes durably or hashing them, whichever is slower.

    The notes add the CPU time each side spent (this process, where the Host runs, and
    ``cp``): a save must both copy and hash, so on a machine whose cores are busy
    elsewhere its time leans towards that sum rather than towards the slower of the two.
    """

    def bench(plan: Plan) -> Result:
        size = MIB * plan.n(full_mib, quick_mib)
        n = plan.n(full_n, quick_n)
        synced: list[float] = []
        shas: list[float] = []
        cpu: dict[str, list[float]] = {_OURS_CPU: [], "cp + fsync": [], "sha256": []}
        extra = 0
        with scratch() as root:
            big, copy = root / "big.bin", root / "big.copy"
            _write_random(big, size)
            (root / "small.bin").write_bytes(os.urandom(MIB))

            def copy_synced() -> float:
                def run() -> None:
                    subprocess.run(["cp", str(big), str(copy)], check=True)
                    fd = os.open(copy, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)

                c0 = _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN)
                t = timed(run)
                cpu["cp + fsync"].append(_cpu(resource.RUSAGE_SELF)
                                         + _cpu(resource.RUSAGE_CHILDREN) - c0)
                copy.unlink()
                return t

            def sha() -> float:
                def digest() -> None:
                    with open(big, "rb") as f:
                        hashlib.file_digest(f, "sha256")

                c0 = _cpu(resource.RUSAGE_SELF)
                t = timed(digest)
                cpu["sha256"].append(_cpu(resource.RUSAGE_SELF) - c0)
                return t

            def bare() -> float:
                c, s = copy_synced(), sha()
                synced.append(c)
                shas.append(s)
                return max(c, s)

            with Host(root) as host:
                saves = iter(range(1_000))

                def save() -> float:
                    nonlocal extra
                    # New bytes each time, so every save really stores the file (identical
                    # bytes would be found stored already).
                    with open(big, "r+b") as f:
                        f.write(next(saves).to_bytes(8, "little"))
                    with RssSampler() as rss:
                        c0 = _cpu(resource.RUSAGE_SELF)
                        t = run_cell(host, '_a = host.save_artifact("big.bin")')
                        cpu[_OURS_CPU].append(_cpu(resource.RUSAGE_SELF) - c0)
                    extra = max(extra, rss.extra)
                    return t

                # Warm-up: the cell path and the store (a small save), the file in the page
                # cache for all.
                run_cell(host, 'host.save_artifact("small.bin")')
                copy_synced(), sha()
                for spent in cpu.values():
                    spent.clear()
                ours, base = interleaved(n, save, bare)
                blobs = host.blobs
                ways = sorted(blobs.copied) if blobs is not None else []
            big.unlink()
        return Result(
            name, ours, base, 1.2,
            limits=(Limit("Host extra peak RSS", extra / MIB, 64, "MiB"),),
            notes=((f"{size // MIB} MiB file, {n} saves each; the store copied by "
                    f"{' + '.join(ways) or 'nothing'}"),
                   (f"baseline medians: cp + fsync {fmt_seconds(statistics.median(synced))}, "
                    f"sha256 {fmt_seconds(statistics.median(shas))}"),
                   "CPU medians: " + ", ".join(
                       f"{side} {fmt_seconds(statistics.median(spent))}"
                       for side, spent in cpu.items())))

    return bench


bench_save_artifact_100m = _bench_save_artifact("save_artifact_100m", 100, 16, 15, 3)
bench_save_artifact_1g = _bench_save_artifact("save_artifact_1g", 1024, 64, 3, 3)


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


RECORD: list[tuple[str, float, str, str, Callable[[Plan], Result]]] = [
    ("save_artifact_100m", 1.2,
     "a cell running `host.save_artifact` of a 100 MiB file (16 MiB with --quick)",
     "max(`cp` of the file + fsync of the copy, hashlib sha256 of the file), each timed alone",
     bench_save_artifact_100m),
    ("save_artifact_1g", 1.2,
     "a cell running `host.save_artifact` of a 1 GiB file (64 MiB with --quick)",
     "max(`cp` of the file + fsync of the copy, hashlib sha256 of the file), each timed alone",
     bench_save_artifact_1g),
    ("verify_200", 1.0,
     ("`Host.submit` of an armed submission: 200 source files, 20 test-evidence "
      "entries (chain checked, projection rebuilt, every check)"),
     "the absolute target, 200 ms (the ratio is ours / 200 ms)",
     bench_verify),
    ("reproduce_submit", 1.3,
     ("`Host.submit` of an armed `reusable_pipeline` submission: 200 source files, "
      "one test-evidence entry `python -m pytest -q tests` (50 fast tests) reproduced "
      "by the Host (tree built, sandboxed pytest run, every check, verdict recorded); "
      "the reproduction cache is emptied before each submit so each one really re-runs"),
     ("`subprocess.run([sys.executable, '-m', 'pytest', '-q', 'tests'])` in the "
      "workspace, same interpreter, its `__pycache__` warm"),
     bench_reproduce_submit),
    ("capture_10k", 1.15,
     "a cell opening and reading 10,000 small workspace files in a default `Host()` (confined "
     "and traced: each open seen by the tracer, each file's bytes kept once)",
     "the same cell in a plain ipykernel (nothing observed)",
     bench_capture),
    ("audit_10k", 1.0,
     "`host_kernel.audit.audit` of a record holding 10,000 artifacts (with lineage)",
     "the absolute target, 10 s (the ratio is ours / 10 s)",
     bench_audit),
]
