"""The Host re-runs a declared test command itself: tree, runner, sandbox, limits, report.

Owns :class:`Reproducer` (one per Host, or per ``audit --reproduce``):
:meth:`Reproducer.run` takes a :class:`Plan` (the tree's files as blobs, the
parsed invocation, the limits) and returns the reproduction's section of the
verdict. The steps, in order:

1. build a fresh tree from the blob store (``tree.build_tree``) in a
   Host-owned folder outside the workspace and the record;
2. build the command: the Host's interpreter in isolated mode with no bytecode
   read or written beside sources, ``boot.py`` (the runner and the Host's
   reporter loaded before any tree folder is on the path), the runner's
   arguments with ``addopts`` overridden, the cache plugin off, the root and
   conftest search pinned to the tree, plugins loaded by name;
3. run it in a sandbox of its own (``host_kernel.sandbox``: writes only to its
   folder, reads nothing of the workspace or the record, no network unless
   allowed), with a wall-clock and an address-space limit, in a session of
   its own so a timeout takes down every process it started;
4. read the outcome from the report file the Host's plugin wrote, test by test.

Results are cached by (tree digest, argv, environment digest) for the life of
the Reproducer: submitting twice does not run the suite twice.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..sandbox.client import Sandbox, SandboxError, probe
from ..store.blobs import FileBlobStore
from .environment import (
    HashCheckCache,
    check_overlay,
    environment_digest,
    interpreter_identity,
    pycache_dir,
    run_env,
)
from .invocation import Invocation
from .tree import BaselineError, build_tree, tree_digest
from .world import HostOverlay, HostOverlays, reproduction_policy, requirements_of

__all__ = ["Limits", "Plan", "Reproducer", "read_report"]

#: Default memory bound (address space) of a reproduction.
DEFAULT_MEMORY = 4 * 1024**3
#: The smallest wall-clock bound, and the multiple of the agent's own run time.
MIN_TIMEOUT = 60.0
TIMEOUT_FACTOR = 10.0
#: How much of the run's output goes into the verdict.
OUTPUT_TAIL = 3000
#: pytest config files at the tree's root, in pytest's order, with the section that counts.
CONFIGS = (("pytest.ini", ""), (".pytest.ini", ""), ("pyproject.toml", "[tool.pytest"),
           ("tox.ini", "[pytest]"), ("setup.cfg", "[tool:pytest]"))

Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Limits:
    """Bounds of one reproduction; ``timeout`` None means 10× the agent's run, ≥ 60 s."""

    timeout: float | None = None
    memory: int | None = DEFAULT_MEMORY

    def seconds(self, agent_duration: float | None) -> float:
        if self.timeout is not None:
            return float(self.timeout)
        return max(MIN_TIMEOUT, TIMEOUT_FACTOR * float(agent_duration or 0.0))


@dataclass(frozen=True)
class Plan:
    """One test command to reproduce, on one tree."""

    command: str
    invocation: Invocation
    #: path → (sha256, mode): exactly the files the tree holds.
    manifest: Mapping[str, tuple[str, int]]
    agent_duration: float | None = None
    network: bool = False
    #: The files the agent declared (the rest of the tree is the baseline).
    declared: frozenset[str] = frozenset()


@dataclass
class _Run:
    folder: Path
    tree: Path
    report: Path
    out: Path
    err: Path
    argv: list[str] = field(default_factory=list)


class Reproducer:
    """Runs plans for one Host (or one audit); holds the cache and the shared setup."""

    def __init__(self, blobs: FileBlobStore, *, hidden: Sequence[str | os.PathLike[str]] = (),
                 overlay: Path | None = None, limits: Limits | None = None,
                 confine: bool = True, base: Path | None = None,
                 overlays: HostOverlays | None = None) -> None:
        self.blobs = blobs
        self.hidden = [os.fspath(h) for h in hidden]
        #: The kernel's own overlay: read for its names and versions and checked, never
        #: imported by a reproduction (reproduce/world.py).
        self.overlay = overlay if overlay is not None and overlay.is_dir() else None
        #: Where the Host installs the session's distributions itself.
        self.overlays = overlays or HostOverlays()
        self._site: Path | None = None
        #: The requirement set to install instead of the kernel overlay's (``audit
        #: --reproduce`` sets the one a verdict recorded).
        self.requirements: list[str] | None = None
        self.limits = limits or Limits()
        self.confine = confine
        self._base = base
        self._own_base: Path | None = None
        self._cache: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._checked: HashCheckCache = {}
        self._pycache: Path | None = None
        self._lock = threading.Lock()
        self._count = 0

    # ------------------------------------------------------------------ environment

    def environment(self) -> tuple[dict[str, Any], list[str]]:
        """The environment section (interpreter, distributions, digest) and its problems."""
        identity = interpreter_identity()
        problems, overlay_dists, _ = check_overlay(self.overlay, self._checked)
        requirements, ignored = requirements_of(self.overlay)
        if self.requirements is not None:
            requirements, ignored = list(self.requirements), []
        try:
            host = self.overlays.get(requirements)
        except OSError as exc:
            host = HostOverlay(tuple(requirements), None, (),
                               tuple((r, f"the Host could not install it: {exc}")
                                     for r in requirements), "")
        self._site = host.path
        section = {
            "interpreter": identity["executable"], "python": identity["version"],
            "distributions": [f"{n}=={v}" for n, v in identity["distributions"]],
            "overlay": [f"{n}=={v}" for n, v in overlay_dists],
            "host_overlay": host.to_dict() | {"ignored": ignored},
            # The whole import world but the tree (each section has its tree digest):
            # the interpreter, its distributions, and what the Host installed.
            "digest": environment_digest(identity, host.digest),
        }
        return section, problems

    def pycache(self) -> Path:
        """The bytecode cache the runs read (chosen once, and checked then)."""
        if self._pycache is None:
            self._pycache = pycache_dir()
        return self._pycache

    def close(self) -> None:
        if self._own_base is not None:
            shutil.rmtree(self._own_base, ignore_errors=True)
            self._own_base = None

    def _folder(self) -> Path:
        with self._lock:
            if self._base is None and self._own_base is None:
                self._own_base = Path(tempfile.mkdtemp(prefix="hk-repro-"))
            base = self._base or self._own_base
            assert base is not None
            self._count += 1
            folder = base / f"r{self._count}"
        folder.mkdir(parents=True)
        return folder

    # ------------------------------------------------------------------ one run

    def run(self, plan: Plan, env_section: Mapping[str, Any],
            emit: Emit | None = None) -> dict[str, Any]:
        """Reproduce ``plan``; the verdict's section for it (``outcome`` says how it went)."""
        digest = tree_digest(plan.manifest)
        inv = plan.invocation
        key = (digest, json.dumps(inv.to_dict(), sort_keys=True), str(env_section["digest"]))
        cached = self._cache.get(key)
        if cached is not None:
            return dict(cached, cached=True)
        timeout = self.limits.seconds(plan.agent_duration)
        section: dict[str, Any] = {
            "command": plan.command, "invocation": inv.to_dict(), "tree_digest": digest,
            "tree_files": len(plan.manifest), "environment_digest": env_section["digest"],
            "interpreter": env_section["interpreter"], "python": env_section["python"],
            "limits": {"timeout": timeout, "memory": self.limits.memory},
            "cached": False,
        }
        folder = self._folder()
        try:
            run = _Run(folder, folder / "tree", folder / "report.jsonl", folder / "stdout",
                       folder / "stderr")
            try:
                build_tree(run.tree, plan.manifest, self.blobs)
            except BaselineError as exc:
                return section | {"outcome": "error", "error": exc.message,
                                  "error_code": exc.code}
            (folder / "declared.json").write_text(json.dumps(sorted(plan.declared)))
            run.argv = self._argv(run, inv)
            section["argv"] = run.argv[1:]
            # Opened before the run: the plugin removes the name once it has opened it.
            report_fd = os.open(run.report, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            started = time.monotonic()
            try:
                status, confined, error = self._launch(run, inv, timeout, plan.network)
                report = _read_all(report_fd)
            finally:
                os.close(report_fd)
            section["duration"] = round(time.monotonic() - started, 3)
            section["confined"] = confined
            section["exit_status"] = status
            section["output_tail"] = _tail(run.out, run.err)
            if error is not None:
                return section | {"outcome": "error", "error": error}
            if status is None:
                return section | {"outcome": "timeout"}
            section.update(read_report(report, status))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self._cache[key] = section
        return section

    def _argv(self, run: _Run, inv: Invocation) -> list[str]:
        boot = [sys.executable, "-I", "-B", "-X", f"pycache_prefix={self.pycache()}",
                "-m", "host_kernel.reproduce.boot", "--report", str(run.report),
                "--runner", inv.runner]
        # As `python -m` with PYTHONPATH would: its own folder first, then the overlay.
        if inv.cwd_on_path:
            boot += ["--path", str(run.tree / inv.cwd)]
        if self._site is not None:
            boot += ["--site", str(self._site)]  # after the standard library (boot.py)
        boot += ["--declared", str(run.folder / "declared.json")]
        if inv.runner == "unittest":
            return boot + ["--", *inv.args]
        config = self._config(run)
        plugins = [a for name in interpreter_identity().get("pytest_plugins", ())
                   for a in ("-p", name)]
        return boot + ["--", "-p", "no:cacheprovider", "-o", "addopts=", "-c", str(config),
                       "--rootdir", str(run.tree), "--confcutdir", str(run.tree),
                       *plugins, *inv.args]

    @staticmethod
    def _config(run: _Run) -> Path:
        """The tree's own pytest config at its root, or an empty one outside the tree (so
        none is searched for in the folders above it)."""
        for name, section in CONFIGS:
            path = run.tree / name
            if path.is_file():
                if not section:
                    return path
                try:
                    if section in path.read_text("utf-8", "replace"):
                        return path
                except OSError:
                    pass
        empty = run.folder / "pytest.ini"
        empty.write_text("[pytest]\n")
        return empty

    def _launch(self, run: _Run, inv: Invocation, timeout: float,
                network: bool) -> tuple[int | None, bool, str | None]:
        """Run the argv; (exit status or None on timeout, confined?, error)."""
        home, tmp = run.folder / "home", run.folder / "tmp"
        home.mkdir()
        tmp.mkdir()
        env = run_env(home, tmp)
        cwd = run.tree / inv.cwd  # parse() refused a folder that holds no declared file
        sandbox: Sandbox | None = None
        argv = run.argv
        confinement = probe(None, network=network) if self.confine else None
        if confinement is not None and confinement.active:
            policy = reproduction_policy(run.folder, interpreter_identity(), [
                str(p) for p in (self._site, self.pycache()) if p is not None],
                self.hidden, network=network)
            confinement = probe(policy, network=network)
            if confinement.active:
                sandbox = Sandbox(policy, confinement.abi, memory=self.limits.memory)
                argv = sandbox.argv(run.argv)
        with open(run.out, "wb") as out, open(run.err, "wb") as err:
            try:
                proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, start_new_session=True,
                                        pass_fds=sandbox.pass_fds if sandbox else ())
            except OSError as exc:
                if sandbox is not None:
                    sandbox.close()
                return None, sandbox is not None, f"the runner could not start: {exc}"
        try:
            if sandbox is not None:
                try:
                    sandbox.started()
                except SandboxError as exc:
                    _kill(proc)
                    return None, True, str(exc)
            elif self.limits.memory:
                try:
                    resource.prlimit(proc.pid, resource.RLIMIT_AS,
                                     (self.limits.memory, self.limits.memory))
                except OSError:
                    pass
            try:
                status: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                status = None
        finally:
            if sandbox is not None:
                sandbox.close()
            _kill(proc)
        return status, sandbox is not None, None


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """End the run's whole session (init takes its PID namespace with it)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _tail(out: Path, err: Path) -> str:
    text = ""
    for path in (out, err):
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - OUTPUT_TAIL))
                text += f.read().decode("utf-8", "replace")
        except OSError:
            pass
    return text[-OUTPUT_TAIL:]


def _read_all(fd: int, limit: int = 64 * 1024 * 1024) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit and (chunk := os.read(fd, 1 << 20)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def read_report(data: bytes, exit_status: int | None = 0) -> dict[str, Any]:
    """Counts and outcome from the plugin's report, test by test (never from stdout).

    The runner's own exit status must agree: a report of nothing but passes from a
    run that exited non-zero says the report was written by someone else.
    """
    phases: dict[str, list[tuple[str, str, bool]]] = {}
    texts: dict[str, str] = {}
    collected: dict[str, Any] | None = None
    finished: dict[str, Any] | None = None
    collect_errors: list[str] = []
    tampered: list[str] = []
    deselected = 0
    for line in data.splitlines()[:200_000]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("event")
        if kind == "phase":
            nodeid = str(event.get("nodeid"))
            phases.setdefault(nodeid, []).append((str(event.get("when")),
                                                  str(event.get("outcome")),
                                                  bool(event.get("xfail"))))
            if event.get("text") and nodeid not in texts:
                texts[nodeid] = str(event["text"])
        elif kind == "collected" and collected is None:
            collected = event
        elif kind == "deselected":
            deselected += int(event.get("count", 0))
        elif kind == "collect_error":
            collect_errors.append(f"{event.get('nodeid')}: {str(event.get('text'))[-400:]}")
        elif kind == "finished":
            finished = event
        elif kind == "tampered":
            tampered += [str(h) for h in event.get("hooks", ())]
    counts = {"collected": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
              "xfailed": 0, "deselected": deselected, "not_run": 0,
              "collect_errors": len(collect_errors)}
    failing: list[str] = []
    for nodeid, seen in phases.items():
        outcome = _test_outcome(seen)
        counts[outcome] += 1
        if outcome in ("failed", "errors"):
            failing.append(nodeid)
    if collected is not None:
        counts["collected"] = int(collected.get("before", 0))
        removed = int(collected.get("removed_count", 0))
        counts["deselected"] = max(deselected, removed)
    counts["not_run"] = max(0, counts["collected"] - len(phases))
    if tampered:
        outcome = "tampered"
    elif collect_errors or counts["failed"] or counts["errors"]:
        outcome = "failed"
    elif finished is None or collected is None or counts["deselected"] or counts["not_run"]:
        outcome = "incomplete"
    elif counts["passed"] < 1:
        outcome = "no_tests"
    elif exit_status != 0:
        outcome = "failed"
        collect_errors.append(f"the runner exited {exit_status} although its report shows "
                              f"no failure: the report was not the runner's own")
    else:
        outcome = "passed"
    return {"outcome": outcome, "counts": counts, "finished": finished is not None,
            "tampered": sorted(set(tampered))[:20],
            "failing": failing[:20], "failures": [texts[n][-800:] for n in failing[:3]
                                                  if n in texts] + collect_errors[:3]}


def _test_outcome(seen: list[tuple[str, str, bool]]) -> str:
    """One test's outcome from its phases (setup, call, teardown)."""
    outcome = "passed"
    for when, result, xfail in seen:
        if result == "failed":
            return "failed" if when == "call" else "errors"
        if result == "error":
            return "errors"
        if result == "skipped":
            outcome = "xfailed" if xfail else "skipped"
    if not any(when == "call" for when, _, _ in seen) and outcome == "passed":
        return "errors"  # set up and torn down, never called
    return outcome
