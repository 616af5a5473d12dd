"""The agent's prompt layers: a typed inventory, and the assembly of a request from them.

Owns what the model is shown and where each piece sits:

* :data:`LAYERS`, the inventory: each layer named, classed **immutable**
  (part of the cacheable prefix) or **variable**, with where it is assembled;
* the immutable texts: :data:`PERSONA`, :data:`HOST_API_REFERENCE`, the
  ``finalize_response`` tool (:data:`FINALIZE_TOOL`) and its one-line map;
  :func:`system_prefix` joins them with :data:`host_kernel.prompts.SECURITY_GENERAL`
  into ``messages[0]``, the same bytes for every request of a session;
* the variable context: :class:`SessionAnchors` (date, workspace root, cwd,
  git branch read from ``.git/HEAD`` in-process, kernel generation, record
  location) and the task with its task-mode fragment, in ``messages[1]``;
* :class:`Conversation`, which holds the layers of one session and renders
  ``messages`` and the per-layer hashes that ``prompt_rendered`` events carry;
* reading a reply against these layers: its python cells
  (:func:`extract_cells`) and its ``finalize_response`` arguments as a
  :class:`~host_kernel.verify.Submission` (:func:`submission_from_arguments`).

It does not talk to a model, run cells or decide anything; :mod:`.loop` does.
Volatile facts never enter ``messages[0]``; the task-mode fragment is only
ever in the task's user message.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ..prompts import SECURITY_GENERAL, task_mode_prompt
from ..verify import Submission

__all__ = [
    "FINALIZE_FIELDS",
    "FINALIZE_TOOL",
    "HOST_API_REFERENCE",
    "LAYERS",
    "PERSONA",
    "TOOLS",
    "Conversation",
    "GitHead",
    "Layer",
    "LayerClass",
    "SessionAnchors",
    "estimate_tokens",
    "extract_cells",
    "read_git_head",
    "sha256_text",
    "submission_from_arguments",
    "system_prefix",
    "task_message",
    "tool_map",
]


class LayerClass(enum.Enum):
    IMMUTABLE = "immutable"  # belongs to the cacheable prefix; byte-stable for the session
    VARIABLE = "variable"    # may differ between requests; never in messages[0]


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer of the agent's prompt: what it holds and where it is assembled."""

    name: str
    layer_class: LayerClass
    where: str
    holds: str


LAYERS: Final[tuple[Layer, ...]] = (
    Layer("base_system", LayerClass.IMMUTABLE, "messages[0]",
          "persona, the host API reference, the security fragment (prompts.SECURITY_GENERAL)"),
    Layer("tool_map", LayerClass.IMMUTABLE, "end of messages[0]",
          "one line per native tool; full schemas go in the request's tools field"),
    Layer("environment", LayerClass.VARIABLE, "messages[1], first block",
          "date, workspace root, cwd, git branch (.git/HEAD, worktrees, detached HEAD), "
          "kernel generation, record location"),
    Layer("task", LayerClass.VARIABLE, "messages[1], after the environment",
          "the task text and prompts.task_mode_prompt(mode, armed)"),
    Layer("history", LayerClass.VARIABLE, "messages[2:]",
          "assistant messages with their cells and tool calls, Observations as user "
          "messages, tool results"),
    Layer("compaction_summary", LayerClass.VARIABLE, "messages[2] after a compaction",
          "the summary fork's handoff (nine headings), replacing older history"),
    Layer("request_options", LayerClass.VARIABLE, "outside messages",
          "model, max_tokens, temperature, stream, tools (the finalize_response schema)"),
)

# ----------------------------------------------------------------------------- immutable texts

# The persona. Contract: says how the agent acts (fenced python cells run by
# the Host, one Observation per cell, finalize_response or host.submit_output
# to finish) and what survives a kernel restart. No volatile fact (date, path,
# generation, mode) may be written here: it is the head of the cached prefix.
PERSONA: Final[str] = """\
You are a careful notebook agent. You work in a Jupyter kernel that a trusted \
Host drives and records. You act by writing Python code cells; the Host runs \
them and shows you what happened.

How to act:
- Put code to run in fenced blocks that start with ```python and end with ```. \
Each block is one cell. Several blocks in one reply run in order; if one \
fails, the rest of that reply is skipped.
- After your reply, the Host answers with one Observation per cell: its \
output, errors and any notice (a timeout, a kernel restart). Read it before \
you go on. Never claim an output you have not seen in an Observation.
- Variables, imports and objects persist between cells while the kernel lives. \
When the kernel dies or restarts, the generation number grows and everything \
in memory is gone: only workspace files, saved artifacts and the record remain.
- Work in small verifiable steps. Check results in cells instead of reasoning \
about what code would print.
- A reply with no code cell and no tool call is read as your final message; \
it does not end the session. To finish, call the finalize_response tool (or \
call host.submit_output in a cell). The Host verifies your claims against its \
own record: a refusal lists every failed check, so fix them and submit again."""

# The host API reference. Contract: every call of DESIGN.md section 4 that the
# kernel's `host` object offers, with what it returns; stable text.
HOST_API_REFERENCE: Final[str] = """\
The `host` object (already defined in every cell; paths are relative to the \
workspace root and may not leave it):
- host.write_file(path, content) -> FileRecord: the Host writes the file \
atomically (parents created). Use it for every source file you deliver.
- host.edit_file(path, old, new) -> FileRecord: replace text that appears \
exactly once.
- host.read_file(path, binary=False) -> str (or bytes).
- host.bash(command, timeout=None) -> Receipt: the Host runs `bash -c command` \
in the kernel's cwd and environment, streams its output into the cell and \
keeps a receipt (exit status, output hashes). A non-zero exit does not raise: \
read receipt.exit_status. Commands run with subprocess or os.system leave no \
receipt.
- host.save_artifact(path, filename=None) -> Artifact: copy a file into the \
content-addressed artifact store, with its lineage; artifact.artifact_id is \
its id.
- host.load_artifact(artifact_id, path=None) -> str; host.artifacts() -> list \
of this session's artifacts.
- host.lineage(artifact_id) -> Lineage: what flowed into an artifact.
- host.submit_output(output, completion_bullets, *, task_status=None, \
output_schema=None, source_files=None, entry_points=None, \
architecture_summary=None, test_evidence=None) -> Verdict; raises \
SubmissionRefused listing every failed check.
- host.cell_id, host.generation, host.mode: where you are."""

#: The fields of ``finalize_response``: those of ``host.submit_output``, plus
#: ``summary`` (a plain-text answer, folded into ``output["summary"]``).
FINALIZE_FIELDS: Final[tuple[str, ...]] = (
    "output", "summary", "completion_bullets", "task_status", "output_schema",
    "source_files", "entry_points", "architecture_summary", "test_evidence",
)

FINALIZE_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": "finalize_response",
        "description": (
            "Finish the task: submit the final answer and, for code tasks, the code "
            "declarations. The Host verifies every claim against its own record, exactly as "
            "host.submit_output does; a refusal comes back listing each failed check."),
        "parameters": {
            "type": "object",
            "properties": {
                "output": {
                    "type": "object",
                    "description": "The result as a JSON object. Files or artifacts it names "
                                   "(under keys such as files, artifacts, figures) must be "
                                   "backed by this session's record."},
                "summary": {
                    "type": "string",
                    "description": "The answer in plain words; stored as output.summary."},
                "completion_bullets": {
                    "type": "array", "items": {"type": "string"}, "minItems": 1,
                    "maxItems": 4,
                    "description": "1 to 4 bullets, each saying what was done."},
                "task_status": {
                    "type": "string",
                    "enum": ["completed", "partial", "blocked", "failed"]},
                "output_schema": {
                    "type": "object",
                    "description": "A JSON Schema that output must match (optional)."},
                "source_files": {
                    "type": "array",
                    "items": {"anyOf": [
                        {"type": "string"},
                        {"type": "object",
                         "properties": {"path": {"type": "string"},
                                        "sha256": {"type": "string"}},
                         "required": ["path"]}]},
                    "description": "Workspace-relative source files, each saved as an "
                                   "artifact with its current bytes."},
                "entry_points": {
                    "type": "array", "items": {"type": "string"},
                    "description": "Source files a user runs; each must compile."},
                "architecture_summary": {
                    "type": "string",
                    "description": "One paragraph: what each module owns."},
                "test_evidence": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "command": {"type": "string",
                                        "description": "exactly as run with host.bash"},
                            "producing_cell_id": {
                                "type": "string",
                                "description": "the id on the '[cell id: …]' line of the "
                                               "Observation of the cell that ran it"}},
                        "required": ["command", "producing_cell_id"]},
                    "description": "Test commands run through host.bash, with their cells."},
            },
            "required": ["completion_bullets"],
        },
    },
}

#: The native tools sent in every turn's ``tools`` field, in order.
TOOLS: Final[tuple[dict[str, Any], ...]] = (FINALIZE_TOOL,)

_TOOL_LINES: Final[dict[str, str]] = {
    "finalize_response": "submit the final answer and code declarations; the Host verifies "
                         "them (same checks as host.submit_output) and a refusal lists what "
                         "failed.",
}


def tool_map(tools: Sequence[Mapping[str, Any]] = TOOLS) -> str:
    """One line per tool: ``- name: what it is for``."""
    lines = ["Tools (their full schemas are in the request's tools field):"]
    for tool in tools:
        fn = tool["function"]
        lines.append(f"- {fn['name']}: {_TOOL_LINES.get(fn['name'], fn.get('description', ''))}")
    return "\n".join(lines)


def system_prefix(tools: Sequence[Mapping[str, Any]] = TOOLS) -> str:
    """``messages[0]``: persona, host API, security fragment, tool map. Constant per tool set."""
    return "\n\n".join((PERSONA, HOST_API_REFERENCE, SECURITY_GENERAL, tool_map(tools)))


# ----------------------------------------------------------------------------- variable context


@dataclass(frozen=True, slots=True)
class GitHead:
    """What ``.git/HEAD`` says about a workspace, read without running git."""

    found: bool
    branch: str | None = None
    detached_at: str | None = None
    worktree: bool = False
    problem: str | None = None

    def describe(self) -> str:
        if not self.found:
            return "none (not inside a git repository)"
        if self.problem:
            return f"unknown ({self.problem})"
        where = " (linked worktree)" if self.worktree else ""
        if self.branch is not None:
            return self.branch + where
        return f"detached HEAD at {self.detached_at}{where}"


_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def read_git_head(start: str | os.PathLike[str]) -> GitHead:
    """Find the repository holding ``start`` and read its HEAD, in-process.

    Walks up from ``start`` to the first ``.git``: a folder (an ordinary
    checkout) or a file holding ``gitdir: <path>`` (a linked worktree or a
    submodule), whose HEAD is then read. ``ref: refs/heads/NAME`` gives the
    branch NAME; a bare object id is a detached HEAD.
    """
    here = Path(os.path.realpath(start))
    for folder in (here, *here.parents):
        dotgit = folder / ".git"
        if not os.path.lexists(dotgit):
            continue
        worktree = False
        try:
            if dotgit.is_file():
                text = dotgit.read_text(encoding="utf-8", errors="replace").strip()
                if not text.startswith("gitdir:"):
                    return GitHead(True, problem=".git is a file without a gitdir: line")
                gitdir = Path(text[len("gitdir:"):].strip())
                if not gitdir.is_absolute():
                    gitdir = folder / gitdir
                worktree = True
            else:
                gitdir = dotgit
            head = (gitdir / "HEAD").read_text(encoding="utf-8", errors="replace").strip()
        except OSError as exc:
            return GitHead(True, problem=f"cannot read HEAD: {exc.strerror or exc}")
        if head.startswith("ref:"):
            ref = head[4:].strip()
            name = ref.removeprefix("refs/heads/")
            return GitHead(True, branch=name, worktree=worktree)
        if _SHA.match(head):
            return GitHead(True, detached_at=head[:12], worktree=worktree)
        return GitHead(True, problem="HEAD holds neither a ref nor an object id")
    return GitHead(False)


@dataclass(frozen=True, slots=True)
class SessionAnchors:
    """The environment block of ``messages[1]``: the session's volatile facts."""

    date: str
    workspace: str
    cwd: str
    git_branch: str
    kernel_generation: int
    record_dir: str

    def render(self) -> str:
        return (
            "## Session\n"
            f"date: {self.date}\n"
            f"workspace root: {self.workspace}\n"
            f"cwd (where cells start): {self.cwd}\n"
            f"git branch: {self.git_branch}\n"
            f"kernel generation: {self.kernel_generation} (the Host's count; it grows at "
            f"each kernel restart, and memory does not survive one)\n"
            f"record: {self.record_dir}"
        )


def task_message(task: str, mode_name: str, armed: bool) -> str:
    """The task block: the task text, then the task-mode fragment (none for analysis_run)."""
    fragment = task_mode_prompt(mode_name, armed)
    text = f"## Task\n{task}"
    return f"{text}\n\n{fragment}" if fragment else text


# ----------------------------------------------------------------------------- assembly


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


def estimate_tokens(messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] = ()) -> int:
    """A rough token count (4 characters a token) of messages and tool schemas."""
    chars = sum(len(_canonical(m)) for m in messages) + sum(len(_canonical(t)) for t in tools)
    return math.ceil(chars / 4)


@dataclass
class Conversation:
    """The layers of one session, and the messages they render to.

    ``system`` is fixed at construction and never reassigned: every request
    of the session starts with the same ``messages[0]``. ``anchors`` changes
    only when a fact in it does (the kernel generation after a restart).
    ``summary`` is set by a compaction, which also drops the history it
    summarised.
    """

    system: str
    anchors: SessionAnchors
    task_block: str
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: str | None = None

    def messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.anchors.render() + "\n\n" + self.task_block},
        ]
        if self.summary is not None:
            out.append({"role": "user", "content": self.summary})
        out.extend(self.history)
        return out

    def layer_hashes(self, options: Mapping[str, Any]) -> dict[str, str | None]:
        """sha256 of each layer as it stands: the ``prompt_rendered`` event's payload."""
        base, _, _ = self.system.rpartition("\n\n")
        return {
            "messages[0]": sha256_text(self.system),
            "base_system": sha256_text(base),
            "tool_map": sha256_text(self.system[len(base) + 2:]),
            "environment": sha256_text(self.anchors.render()),
            "task": sha256_text(self.task_block),
            "compaction_summary": None if self.summary is None else sha256_text(self.summary),
            "history": sha256_text(_canonical(self.history)),
            "request_options": sha256_text(_canonical(dict(options))),
        }


# ----------------------------------------------------------------------------- reading replies

_CELL: Final[re.Pattern[str]] = re.compile(
    r"^ {0,3}```[ \t]*(?:python3?|py|ipython)[ \t]*\n(.*?)^ {0,3}```[ \t]*$",
    re.DOTALL | re.MULTILINE)


def extract_cells(text: str) -> list[str]:
    """The code of each fenced python block in ``text``, in order (empty blocks dropped)."""
    return [m.group(1) for m in _CELL.finditer(text or "") if m.group(1).strip()]


def submission_from_arguments(args: Mapping[str, Any]) -> tuple[Submission, list[str]]:
    """A ``finalize_response`` call's arguments as a Submission, and notes for the model.

    ``summary`` is folded into ``output["summary"]`` (an ``output`` that has its
    own ``summary`` keeps it). Unknown fields are ignored and named in the notes.
    """
    notes: list[str] = []
    unknown = sorted(k for k in args if k not in FINALIZE_FIELDS)
    if unknown:
        notes.append(f"ignored unknown field(s): {', '.join(unknown)}")
    output = args.get("output")
    summary = args.get("summary")
    if summary is not None:
        if output is None:
            output = {"summary": summary}
        elif isinstance(output, dict) and "summary" not in output:
            output = {**output, "summary": summary}
    submission = Submission(
        output=output, completion_bullets=args.get("completion_bullets"),
        task_status=args.get("task_status"), output_schema=args.get("output_schema"),
        source_files=args.get("source_files"), entry_points=args.get("entry_points"),
        architecture_summary=args.get("architecture_summary"),
        test_evidence=args.get("test_evidence"))
    return submission, notes
