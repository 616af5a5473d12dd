"""Verification by reproduction: the Host re-runs the declared tests on the declared bytes.

The verifier (``host_kernel/verify/``) decides *whether* to reproduce; this
package does it. :func:`reproduce_evidence` turns a :class:`Request` (the
declared files as saved, the cited commands, the baseline) into checks and the
verdict's ``reproduction`` section. Modules:

- ``invocation``: the cited command parsed into a structured invocation;
- ``tree``: the workspace baseline and the tree built from the blob store;
- ``environment``: interpreter identity, overlay RECORD checks, variables;
- ``scan``: declared code that reaches into the runner, and native code;
- ``roles``: which files are tests or test configuration, and what a command reads;
- ``regression``: the baseline's own tests, at their baseline bytes, on the change;
- ``runner``: the confined, bounded run and its report;
- ``regenerate``: a ``regenerates`` declaration's commands, re-run on the declared
  files and the recorded inputs, must write the claimed artifacts' exact bytes
  (:func:`regenerate_artifacts`);
- ``boot`` and ``plugin``: the code that runs inside the reproduction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._errors import StorageError
from ..store.blobs import FileBlobStore
from .invocation import Invocation, InvocationRefused, parse
from .regenerate import Claimed, RegenEntry, RegenPlan, RegenRequest, regenerate_artifacts
from .regression import regression_runs
from .roles import is_test_file, read_by, test_role
from .runner import Limits, Plan, Reproducer
from .scan import CONFIG_FILES, native_code, runner_hooks
from .tree import BaselineError, load_manifest, record_baseline

__all__ = ["Claimed", "Limits", "RecordedRuns", "RegenEntry", "RegenRequest", "Reproducer",
           "Request", "Runs", "record_baseline", "regenerate_artifacts", "reproduce_evidence",
           "test_role"]

#: The outcome of a run → the check code that refuses it.
OUTCOME_CODES = {"tampered": "runner_tampered", "failed": "reproduction_failed",
                 "no_tests": "reproduction_no_tests", "incomplete": "reproduction_incomplete",
                 "timeout": "reproduction_timeout", "error": "reproduction_error",
                 "tests_not_run": "tests_not_run"}

Emit = Callable[[dict[str, Any]], None]
#: (code, ok, message) triples, turned into the verifier's Check objects by the caller.
Finding = tuple[str, bool, str]


class Runs(Protocol):
    """What runs plans: a live :class:`Reproducer`, or the record's own runs (audit)."""

    def environment(self) -> tuple[dict[str, Any], list[str]]: ...

    def run(self, plan: Plan, env_section: Mapping[str, Any],
            emit: Emit | None = None) -> dict[str, Any]: ...

    def regenerate(self, plan: RegenPlan, env_section: Mapping[str, Any],
                   emit: Emit | None = None) -> list[dict[str, Any]]: ...


class RecordedRuns:
    """The runs a verdict recorded, answered again for ``audit`` (nothing is executed).

    A plan is answered only when the record holds a run of the same tree (digest)
    and invocation; otherwise the reproduction cannot be vouched for.
    """

    def __init__(self, sections: Sequence[Mapping[str, Any]]) -> None:
        self.sections = [dict(s) for s in sections if isinstance(s, Mapping)]

    def environment(self) -> tuple[dict[str, Any], list[str]]:
        env = next((s.get("environment") for s in self.sections
                    if isinstance(s.get("environment"), dict)), None)
        return dict(env or {"digest": "", "interpreter": "?", "python": "?"}), []

    def run(self, plan: Plan, env_section: Mapping[str, Any],
            emit: Emit | None = None) -> dict[str, Any]:
        from .tree import tree_digest

        digest = tree_digest(plan.manifest)
        for section in self.sections:
            if section.get("tree_digest") == digest and \
                    section.get("invocation") == plan.invocation.to_dict():
                return {k: v for k, v in section.items() if k != "environment"}
        return {"outcome": "error", "tree_digest": digest,
                "error": "the record holds no reproduction of this tree and command"}

    def rederive(self, artifact_id: str, sha256: str,
                 emit: Emit | None = None) -> dict[str, Any]:
        """The recorded re-derivation of this artifact (with these bytes), if any."""
        found = next((s for s in self.sections if s.get("kind") == "rederivation"
                      and s.get("artifact_id") == artifact_id
                      and s.get("sha256") == sha256), None)
        return dict(found) if found is not None else {
            "kind": "rederivation", "artifact_id": artifact_id, "sha256": sha256,
            "outcome": "error", "detail": "the record holds no re-derivation of this artifact"}

    def regenerate(self, plan: RegenPlan, env_section: Mapping[str, Any],
                   emit: Emit | None = None) -> list[dict[str, Any]]:
        """Each command's recorded section, matched by tree digest and invocation."""
        from .tree import tree_digest

        digest = tree_digest(plan.manifest)
        out: list[dict[str, Any]] = []
        for step in plan.steps:
            found = next((s for s in self.sections if s.get("kind") == "regeneration"
                          and s.get("tree_digest") == digest
                          and s.get("invocation") == step.invocation()), None)
            out.append({k: v for k, v in found.items() if k != "environment"} if found else
                       {"kind": "regeneration", "command": step.command,
                        "invocation": step.invocation(), "tree_digest": digest,
                        "outcome": "error", "error": "the record holds no regeneration of "
                                                     "this tree and command"})
        return out


@dataclass(frozen=True)
class Request:
    """What the verifier hands over once the declarations have passed."""

    mode: str
    #: Declared source files: path → sha256 of the saved bytes.
    sources: Mapping[str, str]
    #: (command, folder relative to the workspace, the agent's run time) per entry.
    evidence: Sequence[tuple[str, str, float | None]]
    #: The session's baseline event body (codebase_change), or None.
    baseline: Mapping[str, Any] | None = None
    network: bool = False
    #: Test files and test configuration this session wrote that exist now: path →
    #: (sha256 of the bytes now, or "" when unknown; the bytes of a config file, else None).
    written: Mapping[str, tuple[str, bytes | None]] = field(default_factory=dict)
    #: The submission's intended behaviour changes: (test node id or file, reason).
    intended: Sequence[tuple[str, str]] = ()


def _manifest(request: Request, blobs: FileBlobStore) -> dict[str, tuple[str, int]]:
    base: dict[str, tuple[str, int]] = {}
    if request.mode == "codebase_change":
        baseline = request.baseline or {}
        sha = baseline.get("manifest_sha256")
        if not isinstance(sha, str):
            why = baseline.get("reason") or "the session recorded no baseline"
            raise BaselineError(f"the workspace's baseline is unavailable ({why}); the Host "
                                f"cannot rebuild the workspace the change applies to",
                                code="baseline_unavailable")
        if baseline.get("trusted") is not True:
            why = baseline.get("untrusted") or ("it was recorded by a Host that did not judge "
                                                "whether a session could have written it")
            raise BaselineError(
                f"the workspace's baseline could have been written by a recorded session "
                f"({why}), so its tests cannot judge the change; name the baseline from "
                f"outside the session, a revision you reviewed: Host(baseline='REV'), "
                f"host-kernel exec --baseline REV or host-kernel run --baseline REV",
                code="baseline_untrusted")
        base = load_manifest(blobs, sha)
    for rel, sha in request.sources.items():
        base[rel] = (sha, base.get(rel, (sha, 0o644))[1])
    return base


def reproduce_evidence(request: Request, runs: Runs, blobs: FileBlobStore,
                       emit: Emit | None = None) -> tuple[list[Finding], list[dict[str, Any]]]:
    """Reproduce every test_evidence entry; findings for the verdict and its sections."""
    findings: list[Finding] = []
    try:
        manifest = _manifest(request, blobs)
    except BaselineError as exc:
        return [(exc.code, False, exc.message)], []
    invocations: list[tuple[str, float | None, Invocation]] = []
    for command, cwd, duration in request.evidence:
        try:
            invocations.append((command, duration, parse(command, cwd, manifest)))
        except InvocationRefused as exc:
            findings.append((exc.code, False, f"test evidence {command!r}: {exc.message}"))
    uncovered = _uncited_tests(request.sources, [inv for _, _, inv in invocations])
    if uncovered and len(invocations) == len(request.evidence):
        findings.append(("selection_not_allowed", False, f"declared test files that no test "
                                                         f"evidence command runs: "
                                                         f"{', '.join(uncovered[:5])}; cite "
                                                         f"paths that hold every declared test "
                                                         f"(a trivial test file is not "
                                                         f"evidence for the others)"))
    declared: dict[str, bytes] = {}
    for rel, sha in request.sources.items():
        if not rel.endswith(".py") and rel.rsplit("/", 1)[-1] not in CONFIG_FILES:
            continue  # data: not read here (it may be large), only copied into the tree
        try:
            declared[rel] = blobs.read(sha)
        except StorageError:
            continue  # reported by the tree build
    roots = {"."} | {inv.cwd for _, _, inv in invocations if inv.cwd_on_path} | {
        rel.rsplit("/", 1)[0] if "/" in rel else "." for rel in manifest
        if rel.rsplit("/", 1)[-1].startswith("test") and rel.endswith(".py")}
    native = _native(request.sources, blobs)
    if native:
        findings.append(("native_code_declared", False, "declared files a loader would run "
                                                        "without any reading of them, so "
                                                        "nothing vouches for what they do in "
                                                        "the Host's run: " + "; ".join(native[:6])
                                                        + "; declare source instead, and build "
                                                        "nothing the tests load"))
    hooks = runner_hooks(declared, roots)
    if hooks:
        findings.append(("runner_tampered", False, "declared code reaches into the test "
                                                   "runner, so its outcome cannot be trusted: "
                                                   + "; ".join(hooks[:6])))
    env_section, problems = runs.environment()
    if problems:
        findings.append(("environment_tampered", False, "the session's package overlay is not "
                                                        "what pip installed: "
                                                        + "; ".join(problems[:6])))
    sections: list[dict[str, Any]] = []
    if any(not ok for _, ok, _ in findings):
        return findings, sections
    omitted = _undeclared(request, [inv for _, _, inv in invocations], blobs)
    if emit is not None and invocations:
        emit({"stream": "stdout", "text": f"reproducing {len(invocations)} test "
                                          f"command{'s' if len(invocations) != 1 else ''} "
                                          f"on a tree of {len(manifest)} files…\n"})
    for command, duration, inv in invocations:
        plan = Plan(command, inv, manifest, duration, request.network,
                    frozenset(request.sources))
        section = runs.run(plan, env_section, emit)
        section = dict(section, environment=env_section)
        sections.append(section)
        findings.append(_unavailable(_judge(command, section), env_section))
        # A run refused for one reason can also leave declared test files unrun (runner.py).
        findings += [(str(code), False, f"test evidence {command!r}: {why}")
                     for code, why in section.get("also") or ()]
        if emit is not None:
            emit({"stream": "stdout", "text": f"  {command}: {_summary(section)}\n"})
    if omitted:
        findings.append(("test_undeclared", False, "test files or test configuration this "
                                                   "session wrote, which the cited command "
                                                   "collects or reads in the workspace, are "
                                                   "not declared, so the Host's run judged "
                                                   "less than the workspace holds: "
                                                   + "; ".join(omitted[:10]) + "; declare "
                                                   "each in source_files (saved), or remove "
                                                   "it"))
    if request.mode == "codebase_change" and all(ok for _, ok, _ in findings):
        more, extra = _regression(request, manifest, runs, env_section, blobs, emit)
        findings += more
        sections += extra
    return findings, sections


def _native(sources: Mapping[str, str], blobs: FileBlobStore) -> list[str]:
    """Each declared file that is native code or loader-run (scan.native_code)."""
    found: list[str] = []
    for rel, sha in sorted(sources.items()):
        try:
            with blobs.open(sha) as src:
                why = native_code(rel, src)
        except (StorageError, OSError):
            continue  # reported by the tree build
        if why is not None:
            found.append(why)
    return found


def _undeclared(request: Request, invocations: Sequence[Invocation],
                blobs: FileBlobStore) -> list[str]:
    """Test files and configs the session wrote, left out, that a cited command reads."""
    baseline: dict[str, tuple[str, int]] = {}
    sha = (request.baseline or {}).get("manifest_sha256")
    if request.mode == "codebase_change" and isinstance(sha, str):
        baseline = load_manifest(blobs, sha)
    found: list[str] = []
    for rel, (now, data) in sorted(request.written.items()):
        if rel in request.sources or (rel in baseline and baseline[rel][0] == now):
            continue  # judged at these bytes: declared, or the baseline's own
        for inv in invocations:
            why = read_by(inv, rel, data)
            if why is not None:
                found.append(f"{rel} ({why})")
                break
    return found


def _regression(request: Request, manifest: Mapping[str, tuple[str, int]], runs: Runs,
                env_section: Mapping[str, Any], blobs: FileBlobStore, emit: Emit | None,
                ) -> tuple[list[Finding], list[dict[str, Any]]]:
    """The baseline's own tests at their baseline bytes, on the baseline and on the change."""
    baseline = load_manifest(blobs, str((request.baseline or {})["manifest_sha256"]))
    durations = [d for _, _, d in request.evidence if isinstance(d, (int, float))]

    def run(plan: Plan) -> dict[str, Any]:
        section = dict(runs.run(plan, env_section, emit), environment=env_section)
        if emit is not None:
            emit({"stream": "stdout", "text": f"  {plan.command}: {_summary(section)}\n"})
        return section

    return regression_runs(manifest, baseline, request.sources, request.intended, run, blobs,
                           max(durations) if durations else None, request.network)


def _unavailable(finding: Finding, env_section: Mapping[str, Any]) -> Finding:
    """A failed run whose import world lacks what the session installed is refused as
    ``environment_unavailable``, naming what the Host could not install: the tests may
    fail for want of it. A run that passes without it stands."""
    code, ok, message = finding
    host = env_section.get("host_overlay") or {}
    missing = [m for m in host.get("missing") or [] if isinstance(m, Mapping)]
    if ok or not missing or code == "runner_tampered":
        return finding
    named = "; ".join(f"{m.get('requirement')} ({m.get('why')})" for m in missing[:5])
    return ("environment_unavailable", False,
            f"the session installed distributions the Host could not install itself from "
            f"the index or wheelhouse pip is configured with: {named}; the declared tests "
            f"fail without them ({code}: {message[:600]}). Install only what the index "
            f"serves (name==version), or declare the code the tests need.")


def _uncited_tests(sources: Mapping[str, str], invocations: Sequence[Invocation]) -> list[str]:
    """Declared test files under none of the commands' paths (a command without paths
    runs its own folder). Choosing *which files* run is selection too."""
    roots = [p for inv in invocations for p in (inv.paths or (inv.cwd,))]

    def cited(rel: str) -> bool:
        return any(root == "." or rel == root or rel.startswith(root.rstrip("/") + "/")
                   for root in roots)

    return sorted(rel for rel in sources if is_test_file(rel) and not cited(rel))


def _summary(section: Mapping[str, Any]) -> str:
    counts = section.get("counts") or {}
    shown = ", ".join(f"{v} {k}" for k, v in counts.items() if v and k != "collected")
    took = section.get("duration")
    return (f"{section.get('outcome')}"
            + (f" ({shown})" if shown else "")
            + (f" in {took:.2f}s" if isinstance(took, (int, float)) else "")
            + (" (cached)" if section.get("cached") else ""))


def _judge(command: str, section: Mapping[str, Any]) -> Finding:
    outcome = section.get("outcome")
    label = f"test evidence {command!r}"
    counts = section.get("counts") or {}
    tail = str(section.get("output_tail") or "")[-1200:]
    if outcome == "passed":
        return ("reproduced", True, f"{label}: the Host re-ran it on the declared files: "
                                    f"{_summary(section)}")
    code = OUTCOME_CODES.get(str(outcome), "reproduction_error")
    if outcome == "failed":
        failing = ", ".join(section.get("failing") or []) or "collection"
        detail = "\n".join(section.get("failures") or [])[-1200:] or tail
        why = (f"on the declared files alone, {counts.get('failed', 0)} test(s) failed and "
               f"{counts.get('errors', 0) + counts.get('collect_errors', 0)} errored "
               f"({failing}); a file the tests need may be undeclared. Output:\n{detail}")
    elif outcome == "tampered":
        why = ("while the Host's run went on, declared code hooked the runner: "
               + "; ".join(section.get("tampered") or []))
    elif outcome == "no_tests":
        why = (f"no test passed when the Host ran it ({_summary(section)}); the evidence must "
               f"run at least one test")
    elif outcome == "incomplete":
        ended = "" if section.get("finished") else ", and the run ended before the runner finished"
        why = (f"not every collected test ran ({counts.get('collected', 0)} collected, "
               f"{counts.get('deselected', 0)} deselected, {counts.get('not_run', 0)} not run"
               f"{ended}); nothing may skip the declared tests. Output:\n{tail}")
    elif outcome == "timeout":
        limit = (section.get("limits") or {}).get("timeout") or 0
        why = (f"the Host's run passed its {limit:g} s limit and was stopped with every "
               f"process it started; make the tests finish in time (unless the Host sets "
               f"another, the limit is 10 times your own run, at least 60 s)")
    elif outcome == "tests_not_run":
        why = str(section.get("why"))
    else:
        why = f"the Host could not run it: {section.get('error')}"
    return (code, False, f"{label}: {why}")
