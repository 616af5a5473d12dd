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
   its own so a timeout takes down every process it started; and, at the same
   time, the **collection run**: the same launch with ``--collect``, in a
   sandbox of its own, on a copy of the tree that neither run can write;
4. read each run's report as it goes, over a pipe (``channel.py``), and judge
   the outcome test by test against the collection run, the runner's exit
   status and its own terminal summary (``outcome.py``), with every declared
   test file required to show a passing test (``collection.py``).

The same folder, environment, sandbox and limits run a ``regenerates``
declaration's commands (:meth:`Reproducer.regenerate`: the tree is the declared
files plus the recorded inputs, and what each command must write is judged in
``regenerate.py``).

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
from .channel import Capture, Captured, Stream
from .collection import expected_files, file_of
from .environment import (
    HashCheckCache,
    check_overlay,
    environment_digest,
    interpreter_identity,
    pycache_dir,
    run_env,
)
from .invocation import Invocation
from .outcome import Run, judge, read_report
from .regenerate import RegenPlan, Step, check_outputs, launcher_argv, shown_argv
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
    """One process of a reproduction: the test run, or its collection run."""

    #: The run's own folder (home, temp, its config): the only one it may write.
    folder: Path
    tree: Path
    collect: bool = False
    argv: list[str] = field(default_factory=list)


@dataclass
class _Started:
    """A run under way: its process (None if it could not start), sandbox and pipes."""

    run: _Run
    capture: Capture
    proc: subprocess.Popen[bytes] | None = None
    sandbox: Sandbox | None = None
    error: str | None = None


@dataclass
class _Ended:
    status: int | None
    confined: bool
    error: str | None
    captured: Captured


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
            run = _Run(folder / "run", folder / "run" / "tree")
            # The collection run reads a copy no process of either run can write.
            col = _Run(folder / "collect" / "own", folder / "collect" / "tree", collect=True)
            try:
                build_tree(run.tree, plan.manifest, self.blobs)
            except BaselineError as exc:
                return section | {"outcome": "error", "error": exc.message,
                                  "error_code": exc.code}
            _copy_tree(run.tree, col.tree, plan.manifest)
            col.folder.mkdir()
            for r in (run, col):
                (r.folder / "declared.json").write_text(json.dumps(sorted(plan.declared)))
                r.argv = self._argv(r, inv)
            section["argv"] = run.argv[1:]
            started = time.monotonic()
            deadline = started + timeout
            launched = [self._start(r, r.tree / inv.cwd, plan.network) for r in (run, col)]
            ran, collected = [self._end(s, deadline) for s in launched]
            section["duration"] = round(time.monotonic() - started, 3)
            section["confined"] = ran.confined
            section["exit_status"] = ran.status
            section["output_tail"] = ran.captured.tail(OUTPUT_TAIL)
            if ran.error is not None or collected.error is not None:
                return section | {"outcome": "error", "error": ran.error or
                                  f"the collection run: {collected.error}"}
            if ran.status is None:
                return section | {"outcome": "timeout"}
            if collected.status is None:
                return section | {"outcome": "timeout", "error": "the collection run did "
                                                                 "not finish in time"}
            section.update(judge(
                Run(ran.captured, ran.status), Run(collected.captured, collected.status),
                runner=inv.runner, expected=expected_files(inv, plan.declared, plan.manifest),
                file_of=file_of(inv, plan.manifest)))
            section["collection"] = dict(section.get("collection") or {},
                                         confined=collected.confined)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self._cache[key] = section
        return section

    def regenerate(self, plan: RegenPlan, env_section: Mapping[str, Any],
                   emit: Emit | None = None) -> list[dict[str, Any]]:
        """Run a regeneration's commands in order, in one tree built from ``plan``'s
        manifest, each confined and bounded as a test run is; a section per command
        (``outcome``: passed, differs, failed, timeout, error, not_run)."""
        digest = tree_digest(plan.manifest)
        key = (f"regenerate:{digest}", json.dumps([s.invocation() for s in plan.steps]),
               str(env_section["digest"]))
        cached = self._cache.get(key)
        if cached is not None:
            return [dict(s, cached=True) for s in cached["sections"]]
        timeout = self.limits.seconds(None)
        base: dict[str, Any] = {
            "kind": "regeneration", "tree_digest": digest, "tree_files": len(plan.manifest),
            "inputs": dict(plan.inputs), "environment_digest": env_section["digest"],
            "interpreter": env_section["interpreter"], "python": env_section["python"],
            "limits": {"timeout": timeout, "memory": self.limits.memory}, "cached": False}
        sections: list[dict[str, Any]] = []
        folder = self._folder()
        try:
            run = _Run(folder / "run", folder / "run" / "tree")
            try:
                build_tree(run.tree, plan.manifest, self.blobs)
                error = None
            except BaselineError as exc:
                error = exc.message
            failed = error is not None
            for step in plan.steps:
                section = base | {"command": step.command, "invocation": step.invocation()}
                if failed:
                    sections.append(section | ({"outcome": "error", "error": error}
                                               if error else {"outcome": "not_run"}))
                    error = None
                    continue
                section.update(self._regenerate_step(run, step, plan.network, timeout))
                sections.append(section)
                failed = section["outcome"] != "passed"
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self._cache[key] = {"sections": sections}
        return sections

    def _regenerate_step(self, run: _Run, step: Step, network: bool,
                         timeout: float) -> dict[str, Any]:
        run.argv = launcher_argv(self.pycache(), self._site, run.tree, step)
        started = time.monotonic()
        ended = self._end(self._start(run, run.tree / step.cwd, network), started + timeout)
        out: dict[str, Any] = {
            "argv": shown_argv(run.argv), "duration": round(time.monotonic() - started, 3),
            "confined": ended.confined, "exit_status": ended.status,
            "output_tail": ended.captured.tail(OUTPUT_TAIL),
            "stderr_tail": bytes(ended.captured.err.tail).decode("utf-8", "replace")[-2000:]}
        if ended.error is not None:
            return out | {"outcome": "error", "error": ended.error}
        if ended.status is None:
            return out | {"outcome": "timeout"}
        outputs = check_outputs(run.tree, step)
        if ended.status != 0:
            return out | {"outcome": "failed", "artifacts": outputs}
        ok = all(not o["why"] for o in outputs)
        return out | {"outcome": "passed" if ok else "differs", "artifacts": outputs}

    def _argv(self, run: _Run, inv: Invocation) -> list[str]:
        boot = [sys.executable, "-I", "-B", "-X", f"pycache_prefix={self.pycache()}",
                "-m", "host_kernel.reproduce.boot", "--channel", "0",
                "--runner", inv.runner, "--root", str(run.tree)]
        if run.collect:
            boot.append("--collect")
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
        # The terminal summary is compared with the reports: never quieter than -q. boot.py
        # imports the plugins before pytest does (pytest then warns it cannot rewrite them).
        quieter = ["--verbosity=-1"] if _verbosity(inv.args) < -1 else []
        return boot + ["--", "-p", "no:cacheprovider", "-o", "addopts=", "-c", str(config),
                       "--rootdir", str(run.tree), "--confcutdir", str(run.tree),
                       *plugins, *inv.args, *quieter,
                       "-W", "ignore::pytest.PytestAssertRewriteWarning"]

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

    def _start(self, run: _Run, cwd: Path, network: bool) -> _Started:
        """Start one run in ``cwd`` (a folder of its tree: parse() refused one that holds no
        declared file), its pipes read as it goes (``channel.py``)."""
        home, tmp = run.folder / "home", run.folder / "tmp"
        home.mkdir(exist_ok=True)
        tmp.mkdir(exist_ok=True)
        env = run_env(home, tmp)
        started = _Started(run, Capture())
        argv = run.argv
        confinement = probe(None, network=network) if self.confine else None
        if confinement is not None and confinement.active:
            reads = [str(p) for p in (self._site, self.pycache()) if p is not None]
            if run.collect:
                reads.append(str(run.tree))  # read, never written
            policy = reproduction_policy(run.folder, interpreter_identity(), reads,
                                         self.hidden, network=network)
            confinement = probe(policy, network=network)
            if confinement.active:
                started.sandbox = Sandbox(policy, confinement.abi, memory=self.limits.memory)
                argv = started.sandbox.argv(run.argv)
        stdin, stdout, stderr = started.capture.child_fds()
        try:
            started.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                start_new_session=True,
                pass_fds=started.sandbox.pass_fds if started.sandbox else ())
        except OSError as exc:
            started.capture.close()
            if started.sandbox is not None:
                started.sandbox.close()
            started.error = f"the runner could not start: {exc}"
            return started
        started.capture.start()
        if started.sandbox is not None:
            try:
                started.sandbox.started()
            except SandboxError as exc:
                started.error = str(exc)
        elif self.limits.memory:
            try:
                resource.prlimit(started.proc.pid, resource.RLIMIT_AS,
                                 (self.limits.memory, self.limits.memory))
            except OSError:
                pass
        return started

    def _end(self, started: _Started, deadline: float) -> _Ended:
        """Wait for a run until ``deadline``; end it with everything it started, and take
        what was read. ``status`` is None on a timeout."""
        confined = started.sandbox is not None
        proc = started.proc
        if proc is None:
            return _Ended(None, confined, started.error, Captured([], b"", False, Stream(),
                                                                  Stream()))
        status: int | None = None
        try:
            if started.error is None:
                try:
                    status = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    status = None
        finally:
            if started.sandbox is not None:
                started.sandbox.close()
            _kill(proc)
        return _Ended(status, confined, started.error, started.capture.finish())


def _copy_tree(src: Path, dest: Path, manifest: Mapping[str, tuple[str, int]]) -> None:
    """A copy of the tree just built (``sendfile``, no second read of the store)."""
    made: set[str] = set()
    for rel, (_, mode) in manifest.items():
        target = dest / rel
        parent = str(target.parent)
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        shutil.copyfile(src / rel, target)
        os.chmod(target, mode)


def _verbosity(args: Sequence[str]) -> int:
    """pytest's verbosity from the flags the Host reproduces (``-q`` lowers, ``-v`` raises)."""
    level = 0
    words = list(args)
    for i, word in enumerate(words):
        if word in ("-q", "--quiet"):
            level -= 1
        elif word in ("-qq", "-qqq"):
            level -= len(word) - 1
        elif word in ("-v", "--verbose", "-vv", "-vvv"):
            level += 1 if word in ("-v", "--verbose") else len(word) - 1
        elif word.startswith("--verbosity"):
            value = word.split("=", 1)[1] if "=" in word else \
                (words[i + 1] if i + 1 < len(words) else "0")
            try:
                level = int(value)
            except ValueError:
                pass
    return level


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
