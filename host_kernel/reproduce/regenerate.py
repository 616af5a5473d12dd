"""Regenerated artifacts: a declared command, re-run by the Host, must write their exact bytes.

An armed ``reusable_pipeline`` submission may declare ``regenerates=[{"command":
"python -m pkg …", "artifacts": [artifact id, …]}]``. This module owns what that
claim is held to, once the verifier has checked its shape and that every id is
an artifact of the session:

- :func:`plan_regeneration`: the tree and the commands. The tree is the declared
  files at their saved bytes plus, for each claimed artifact, the **recorded
  inputs** it was made from (its lineage's files that the declared files do not
  hold), at the bytes the record's blob store keeps; an input whose bytes are not
  there is left out and named. An input with a claimed artifact's own bytes is
  never placed (the command must make those, not copy them), and a tree that
  already holds a claimed artifact's bytes is refused before anything runs.
- :func:`parse_command`: ``python -m MODULE ARGS…`` or ``python SCRIPT.py
  ARGS…``, the module or script a declared file (the pipeline's own code, never a
  tool of the installation), optionally after ``cd DIR &&``; no shell, so no
  pipe, redirection, variable or substitution. The Host runs its own interpreter.
- :data:`LAUNCHER` and :func:`launcher_argv`: the few lines that start the
  command inside the sandbox (the tree's folder on the path as ``python -m`` or a
  script would put it, the Host-built overlay after the standard library).
- :func:`check_outputs` and :func:`regenerate_artifacts`: after each command,
  the file at each artifact's ``source_path`` in the tree, opened without
  following a symlink, must hash to the artifact's sha256; the findings
  (``regeneration_differs``) and the verdict's sections.

The commands run in order in one tree (a later step may read what an earlier one
wrote), each in the judge's world the test reproduction uses: a Host-owned
folder, an environment built from an allow-list, the sandbox that reads neither
the workspace nor the record, bounded in time and memory. That run is the
:class:`~host_kernel.reproduce.runner.Reproducer`'s (``regenerate``).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from .._errors import HostCallError, StorageError
from ..store.blobs import FileBlobStore, open_beneath
from .invocation import PYTHON, PYTHON_HARMLESS, InvocationRefused, _words

__all__ = ["LAUNCHER", "LAUNCHER_SHOWN", "Claimed", "CommandRefused", "RegenEntry",
           "RegenPlan", "RegenRequest", "Step", "check_outputs", "launcher_argv",
           "parse_command", "plan_regeneration", "regenerate_artifacts", "shown_argv"]

CODE = "regeneration_differs"
#: The sha256 of no bytes: an empty artifact is not "already in the tree" for that reason.
EMPTY_SHA = hashlib.sha256(b"").hexdigest()
#: How much of a failed command's standard error goes into the refusal.
STDERR_TAIL = 1200
_MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")

Emit = Callable[[dict[str, Any]], None]
Finding = tuple[str, bool, str]

#: Run as ``python -I -B -X pycache_prefix=… -c LAUNCHER [--path DIR] [--site DIR] --
#: (-m MODULE | SCRIPT) ARGS…`` in the tree. Standard input is the reproduction's unused
#: report pipe: /dev/null takes its place before the command's code runs.
LAUNCHER = """\
import os, runpy, sys
_n = os.open(os.devnull, os.O_RDONLY)
os.dup2(_n, 0)
os.close(_n)
_a = sys.argv[1:]
_i = _a.index("--")
_opts, _rest = _a[:_i], _a[_i + 1:]
_paths = [_opts[k + 1] for k in range(0, len(_opts), 2) if _opts[k] == "--path"]
_sites = [_opts[k + 1] for k in range(0, len(_opts), 2) if _opts[k] == "--site"]
sys.path[:] = [p for p in sys.path if p]
sys.path[:0] = _paths
_at = next((j for j, p in enumerate(sys.path) if p.endswith("site-packages")), len(sys.path))
sys.path[_at:_at] = _sites
if _rest[0] == "-m":
    sys.argv[:] = [_rest[1], *_rest[2:]]
    runpy.run_module(_rest[1], run_name="__main__", alter_sys=True)
else:
    sys.argv[:] = _rest
    runpy.run_path(_rest[0], run_name="__main__")
"""


#: How the launcher shows in a verdict's ``argv`` (its text is this module's, by digest).
LAUNCHER_SHOWN = f"<LAUNCHER sha256:{hashlib.sha256(LAUNCHER.encode()).hexdigest()[:16]}>"


class CommandRefused(ValueError):
    """A regenerates command the Host cannot run as written; the message says why."""


@dataclass(frozen=True)
class Claimed:
    """One artifact a command claims to write, as the record holds it."""

    artifact_id: str
    #: Where it was saved from, relative to the workspace (so: to the tree).
    path: str
    sha256: str
    #: Its lineage's file inputs: (path as recorded, sha256).
    inputs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RegenEntry:
    """One declared command and the artifacts it claims."""

    command: str
    artifacts: tuple[Claimed, ...]


@dataclass(frozen=True)
class RegenRequest:
    """What the verifier hands over once the declaration and the tests have passed."""

    #: Declared source files: path → sha256 of the saved bytes.
    sources: Mapping[str, str]
    entries: Sequence[RegenEntry]
    network: bool = False


@dataclass(frozen=True)
class Step:
    """One command as the Host will run it."""

    command: str
    #: The folder it runs in, relative to the tree ("." for the root).
    cwd: str
    #: ("-m", MODULE) or (SCRIPT,), the script relative to ``cwd`` as written.
    target: tuple[str, ...]
    args: tuple[str, ...]
    artifacts: tuple[Claimed, ...]

    def invocation(self) -> dict[str, Any]:
        return {"runner": "python", "regenerate": True, "cwd": self.cwd,
                "target": list(self.target), "args": list(self.args),
                "artifacts": [[a.artifact_id, a.path, a.sha256] for a in self.artifacts]}


@dataclass(frozen=True)
class RegenPlan:
    """The tree and the commands of one regeneration."""

    #: path → (sha256, mode): exactly the files the tree holds before the first command.
    manifest: Mapping[str, tuple[str, int]]
    steps: tuple[Step, ...]
    #: What became of the recorded inputs: ``placed``; ``missing`` ([path, sha256]: the
    #: store lacks the bytes); ``outside`` (outside the workspace, or in a declared file's
    #: way); ``regenerated`` (with a claimed artifact's bytes: left for a command to make).
    inputs: Mapping[str, list[Any]] = field(default_factory=dict)
    network: bool = False


class RegenerationRuns(Protocol):
    """What runs a regeneration: a live Reproducer, or the record's own runs (audit)."""

    def environment(self) -> tuple[dict[str, Any], list[str]]: ...

    def regenerate(self, plan: RegenPlan, env_section: Mapping[str, Any],
                   emit: Emit | None = None) -> list[dict[str, Any]]: ...


def _inside(rel: str) -> str | None:
    if not rel or "\x00" in rel:
        return None
    pure = PurePosixPath(os.path.normpath(rel))
    if pure.is_absolute() or (pure.parts and pure.parts[0] == "..") or str(pure) == ".":
        return None
    return pure.as_posix()


def parse_command(command: str,
                  files: Collection[str]) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(cwd, target, args) of a regenerates command over a tree holding ``files``.

    Raises :class:`CommandRefused` when it is not ``[cd DIR &&] python[3[.x]] [-B|-u|…]
    (-m MODULE | SCRIPT.py) ARGS…`` with DIR a folder of the tree and SCRIPT a file of it.
    """
    form = ("write it as 'python -m MODULE ARGS…' or 'python SCRIPT.py ARGS…' (a declared "
            "script), optionally after 'cd DIR &&', with no pipes, ';', redirections, "
            "variables or substitutions: the Host runs it without a shell")
    try:
        words = _words(command)
    except InvocationRefused:
        raise CommandRefused(f"it is not one plain command; {form}") from None
    known = set(files)
    folders = {p.rsplit("/", i)[0] for p in known for i in range(1, p.count("/") + 1)}
    here = "."
    while len(words) >= 2 and words[0] == "cd":
        moved = None if os.path.isabs(words[1]) else _inside(os.path.join(here, words[1]))
        if moved is None or moved not in folders:
            raise CommandRefused(f"'cd {words[1]}' is not a folder of the declared files")
        here, words = moved, words[2:]
    if not words or not PYTHON.fullmatch(os.path.basename(words[0])):
        first = words[0] if words else ""
        raise CommandRefused(f"{first!r} is not python; {form}")
    rest = words[1:]
    while rest and rest[0] in PYTHON_HARMLESS:
        rest = rest[1:]
    if not rest:
        raise CommandRefused(f"it names no module or script; {form}")
    if rest[0] == "-m":
        if len(rest) < 2 or not _MODULE.fullmatch(rest[1]):
            raise CommandRefused(f"'-m' needs a module name; {form}")
        # The pipeline's own code, not a tool of the installation (`-m zipfile -e` would
        # unpack a declared archive of the artifact, `-m shutil`-like tools copy it).
        base = rest[1].replace(".", "/")
        if not any(_inside(os.path.join(here, rel)) in known
                   for rel in (base + ".py", base + "/__main__.py")):
            raise CommandRefused(f"module {rest[1]!r} is not a declared file (no {base}.py "
                                 f"or {base}/__main__.py among source_files"
                                 f"{'' if here == '.' else f' under {here}'}); regenerates runs "
                                 f"the pipeline's own code, so declare it, saved")
        return here, ("-m", rest[1]), tuple(rest[2:])
    if rest[0] == "-c":
        raise CommandRefused("'python -c' runs code written in the command, not the declared "
                             "files; put that code in a declared module and run it with -m")
    if rest[0].startswith("-"):
        raise CommandRefused(f"python flag {rest[0]!r} is not one the Host reproduces "
                             f"(-B, -u, -b, -q are); {form}")
    script = None if os.path.isabs(rest[0]) else _inside(os.path.join(here, rest[0]))
    if script is None or script not in known:
        raise CommandRefused(f"the script {rest[0]!r} is not a declared file; declare it in "
                             f"source_files (saved), or run a declared module with -m")
    return here, (rest[0],), tuple(rest[1:])


def plan_regeneration(request: RegenRequest, blobs: FileBlobStore
                      ) -> tuple[RegenPlan | None, list[Finding]]:
    """The plan, or the findings that refuse it before anything runs."""
    manifest: dict[str, tuple[str, int]] = {rel: (sha, 0o644)
                                            for rel, sha in request.sources.items()}
    findings: list[Finding] = []
    steps: list[Step] = []
    for i, entry in enumerate(request.entries):
        try:
            cwd, target, args = parse_command(entry.command, manifest)
        except CommandRefused as exc:
            why = f"regenerates[{i}] {entry.command!r} cannot run: {exc}"
            findings.append((CODE, False, why))
            continue
        steps.append(Step(entry.command, cwd, target, args, entry.artifacts))
    claimed = {a.sha256 for e in request.entries for a in e.artifacts}
    inputs: dict[str, list[Any]] = {"placed": [], "missing": [], "outside": [],
                                    "regenerated": []}
    for entry in request.entries:
        for artifact in entry.artifacts:
            for path, sha in artifact.inputs:
                rel = None if path.startswith("/") else _inside(path)
                if rel is None or _clashes(rel, manifest):
                    shown = path if rel is None else (f"{rel} (a file or folder of the tree is "
                                                      f"in its way)")
                    if shown not in inputs["outside"]:
                        inputs["outside"].append(shown)
                    continue
                if rel in manifest:
                    continue  # the declared bytes (or an input placed already) stand
                if sha in claimed:
                    if rel not in inputs["regenerated"]:
                        inputs["regenerated"].append(rel)
                    continue
                if blobs.hash_of(sha) != sha:
                    if [rel, sha] not in inputs["missing"]:
                        inputs["missing"].append([rel, sha])
                    continue
                manifest[rel] = (sha, 0o644)
                inputs["placed"].append(rel)
    # A tree that already holds an artifact's bytes lets a command copy them.
    for i, entry in enumerate(request.entries):
        for artifact in entry.artifacts:
            if artifact.sha256 == EMPTY_SHA:
                continue
            holders = sorted(rel for rel, (sha, _) in manifest.items() if sha == artifact.sha256)
            if holders:
                what = ("a declared file" if holders[0] in request.sources
                        else "a recorded input")
                findings.append((CODE, False, (
                    f"regenerates[{i}] {entry.command!r}: the tree the Host builds already "
                    f"holds artifact {artifact.artifact_id} ({artifact.path})'s exact bytes at "
                    f"{holders[0]} ({what}), so the command could copy them rather than make "
                    f"them; leave that file out of source_files, and make the artifact from "
                    f"its inputs")))
    if findings:
        return None, findings
    return RegenPlan(manifest, tuple(steps), inputs, request.network), []


def _clashes(rel: str, manifest: Mapping[str, Any]) -> bool:
    """Whether a file at ``rel`` cannot sit beside the tree's files: one of its folders is a
    file of the tree, or it is a folder of the tree."""
    parts = rel.split("/")
    if any("/".join(parts[:n]) in manifest for n in range(1, len(parts))):
        return True
    return rel not in manifest and any(p.startswith(rel + "/") for p in manifest)


def launcher_argv(pycache: Path, site: Path | None, tree: Path, step: Step) -> list[str]:
    """The Host's own command for ``step`` (its interpreter, isolated, no bytecode written)."""
    folder = tree / step.cwd
    if step.target[0] == "-m":
        path = folder  # as `python -m` does: the working folder first
    else:
        path = (folder / step.target[0]).parent  # as `python SCRIPT`: the script's folder
    argv = [sys.executable, "-I", "-B", "-X", f"pycache_prefix={pycache}", "-c", LAUNCHER,
            "--path", os.path.normpath(path)]
    if site is not None:
        argv += ["--site", str(site)]
    return argv + ["--", *step.target, *step.args]


def shown_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as the verdict records it: after the interpreter, the launcher by digest."""
    return [LAUNCHER_SHOWN if a == LAUNCHER else a for a in argv[1:]]


def check_outputs(tree: Path, step: Step) -> list[dict[str, Any]]:
    """Each claimed artifact as the command left it: ``got`` its sha256 (None when it was not
    written, is not a regular file, or is a symlink: ``why`` says which)."""
    out: list[dict[str, Any]] = []
    for artifact in step.artifacts:
        got: str | None = None
        why = ""
        try:
            with open_beneath(tree, artifact.path, label=repr(artifact.path)) as f:
                hasher = hashlib.sha256()
                while chunk := f.read(1 << 20):
                    hasher.update(chunk)
                got = hasher.hexdigest()
        except FileNotFoundError:
            why = "was not written"
        except HostCallError as exc:
            why = f"is not a regular file ({exc.message})"
        except OSError as exc:
            why = f"could not be read ({exc.strerror or exc})"
        if got is not None and got != artifact.sha256:
            why = f"differs: expected sha256 {artifact.sha256[:16]}…, got {got[:16]}…"
        out.append({"artifact_id": artifact.artifact_id, "path": artifact.path,
                    "expected": artifact.sha256, "got": got, "why": why})
    return out


def regenerate_artifacts(request: RegenRequest, runs: RegenerationRuns, blobs: FileBlobStore,
                         emit: Emit | None = None
                         ) -> tuple[list[Finding], list[dict[str, Any]]]:
    """Run every regenerates command; findings for the verdict and its sections."""
    try:
        plan, refused = plan_regeneration(request, blobs)
    except (StorageError, OSError) as exc:
        return [(CODE, False, f"the Host could not build the regeneration's tree: {exc}")], []
    if plan is None:
        return refused, []
    env_section, _ = runs.environment()  # its problems were the test reproduction's to judge
    if emit is not None:
        count = sum(len(s.artifacts) for s in plan.steps)
        emit({"stream": "stdout", "text": f"regenerating {count} artifact"
                                          f"{'s' if count != 1 else ''} with "
                                          f"{len(plan.steps)} command"
                                          f"{'s' if len(plan.steps) != 1 else ''} on a tree of "
                                          f"{len(plan.manifest)} files…\n"})
    sections = [dict(s, environment=env_section)
                for s in runs.regenerate(plan, env_section, emit)]
    findings = [_judge(i, s, plan) for i, s in enumerate(sections)]
    if emit is not None:
        for s in sections:
            emit({"stream": "stdout", "text": f"  {s.get('command')}: {s.get('outcome')}"
                                              f"{' (cached)' if s.get('cached') else ''}\n"})
    return findings, sections


def _inputs_note(plan: RegenPlan) -> str:
    notes = []
    missing = plan.inputs.get("missing") or []
    if missing:
        notes.append("inputs the artifacts were made from whose bytes the record does not "
                     "hold, so the tree lacks them: "
                     + ", ".join(f"{p} ({s[:12]}…)" for p, s in missing[:8])
                     + "; declare them in source_files (saved) or save them as artifacts")
    outside = plan.inputs.get("outside") or []
    if outside:
        notes.append("inputs the tree cannot hold (outside the workspace, or where a "
                     "declared file or folder is): "
                     + ", ".join(str(p) for p in outside[:8]))
    return (" " + "; ".join(notes) + ".") if notes else ""


def _judge(i: int, section: Mapping[str, Any], plan: RegenPlan) -> Finding:
    label = f"regenerates[{i}] {section.get('command')!r}"
    outcome = section.get("outcome")
    outputs = [o for o in section.get("artifacts") or [] if isinstance(o, Mapping)]
    placed = len(plan.inputs.get("placed") or [])
    world = "the declared files" + (f" and {placed} recorded input{'s' if placed != 1 else ''}"
                                    if placed else "")
    if outcome == "passed" and section.get("confined") is False:
        return (CODE, False, (f"{label}: it wrote the claimed bytes, but the Host could not "
                              f"confine it here (no sandbox policy), so it could have copied "
                              f"them from anywhere the kernel left them; an unconfined "
                              f"regeneration vouches for nothing"))
    if outcome == "passed":
        shown = ", ".join(f"{o.get('path')} ({str(o.get('artifact_id'))[:8]}…)"
                          for o in outputs[:10])
        many = "s" if len(outputs) != 1 else ""
        return (CODE, True, (f"{label}: the Host re-ran it on {world} and it wrote the exact "
                             f"bytes of {len(outputs)} artifact{many}: {shown}"))
    stderr = str(section.get("stderr_tail") or "").strip()
    tail = f" Standard error, last lines:\n{stderr[-STDERR_TAIL:]}" if stderr else ""
    status = section.get("exit_status")
    wrong = "; ".join(f"artifact {o.get('artifact_id')} at {o.get('path')} {o.get('why')}"
                      for o in outputs if o.get("why"))
    if outcome == "differs":
        why = (f"the Host re-ran it on {world}; it exited {status}, but {wrong}; the "
               f"declared files must make these bytes themselves")
    elif outcome == "failed":
        why = (f"the Host re-ran it on {world} and it exited {status}, so it regenerated "
               f"nothing; a file it needs may be undeclared")
    elif outcome == "timeout":
        limit = (section.get("limits") or {}).get("timeout") or 0
        why = (f"the Host's run passed its {limit:g} s limit and was stopped with every "
               f"process it started")
    elif outcome == "not_run":
        why = "not run: an earlier regenerates command failed, and the steps share one tree"
    else:
        why = f"the Host could not run it: {section.get('error')}"
    return (CODE, False, f"{label}: {why}.{_inputs_note(plan)}{tail}")
