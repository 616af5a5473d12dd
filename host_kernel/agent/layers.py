"""The agent's prompt layers: a typed inventory, the texts of the prefix, and the tools.

Owns what the model is shown and where each piece sits:

* :data:`LAYERS`, the inventory: each layer named, classed **immutable**
  (part of the cacheable prefix) or **variable**, with where it is assembled;
* the immutable texts: the built-in seed (:data:`DEFAULT_SEED`: :data:`PERSONA`
  and :data:`HOST_API_REFERENCE`) and the Host block (:func:`host_block`: the
  security fragment, the tool map, the skill-retrieval rules and the catalog
  lines). Which blocks a session sends, and when they change, is the system
  prompt's log (:mod:`.sysprompt`), rendered by :mod:`.conversation`;
* the **tools** and their tiers (:data:`TOOL_SPECS`): a frequent tool is shown
  with its arguments in the prefix and sent with its full schema; a rare tool
  is one line in the prefix and a stub in the ``tools`` field, and its schema
  is loaded on demand into the loaded-tools block (:func:`loaded_tools_block`)
  of the variable context, so the prefix and the ``tools`` field never change;
* the variable context's pieces: :class:`SessionAnchors` (date, workspace
  root, cwd, git branch read from ``.git/HEAD`` in-process, kernel generation,
  record location) and the task with its task-mode fragment;
* reading a reply against these layers: its python cells
  (:func:`extract_cells`) and its ``finalize_response`` arguments as a
  :class:`~host_kernel.verify.Submission` (:func:`submission_from_arguments`).

It does not talk to a model, run cells or decide anything; :mod:`.loop` does.
Volatile facts never enter a system message; the task-mode fragment is only
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..prompts import SECURITY_GENERAL, SKILL_RETRIEVAL, task_mode_prompt
from ..verify import Submission

__all__ = [
    "DEFAULT_SEED",
    "FINALIZE_FIELDS",
    "FINALIZE_TOOL",
    "HOST_API_REFERENCE",
    "LAYERS",
    "PERSONA",
    "TOOLS",
    "TOOLS_BY_NAME",
    "TOOL_SPECS",
    "GitHead",
    "Layer",
    "LayerClass",
    "SessionAnchors",
    "Tier",
    "ToolSpec",
    "estimate_tokens",
    "extract_cells",
    "host_block",
    "loaded_tools_block",
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
    Layer("base_system", LayerClass.IMMUTABLE, "leading system messages",
          "the system prompt's log (agent/sysprompt.py): the seed (SYSTEM.md, else the "
          "persona and the host API reference) and the APPEND_SYSTEM.md blocks; it changes "
          "only by a recorded replace/append entry"),
    Layer("tool_map", LayerClass.IMMUTABLE, "the last leading system message (the Host block)",
          "the security fragment (prompts.SECURITY_GENERAL), the tool map (frequent tools "
          "with their arguments, rare tools one line each), the skill-retrieval rules and "
          "the skills catalog lines; full schemas of frequent tools go in the tools field"),
    Layer("environment", LayerClass.VARIABLE, "first user message, first block",
          "date, workspace root, cwd, git branch (.git/HEAD, worktrees, detached HEAD), "
          "kernel generation, record location"),
    Layer("task", LayerClass.VARIABLE, "first user message, after the environment",
          "the task text and prompts.task_mode_prompt(mode, armed)"),
    Layer("loaded_tools", LayerClass.VARIABLE, "first user message, last block",
          "full schemas of the rare tools loaded by tool_view or by a bad call, in load order"),
    Layer("history", LayerClass.VARIABLE, "after the first user message",
          "assistant messages with their cells and tool calls, Observations as user "
          "messages, tool results"),
    Layer("compaction_summary", LayerClass.VARIABLE, "before the history, after a compaction",
          "the summary fork's handoff (nine headings), replacing older history"),
    Layer("request_options", LayerClass.VARIABLE, "outside messages",
          "model, max_tokens, temperature, stream, tools (frequent tools' schemas, rare "
          "tools' stubs: the same bytes for the whole session)"),
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
- Put code to run in fenced blocks that start with ```python and end with ```, \
or call the execute tool with it. Each block (or call) is one cell. Several in \
one reply run in order; if one fails, the rest of that reply is skipped.
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
architecture_summary=None, test_evidence=None, intended_changes=None, \
regenerates=None, rederive=None) -> Verdict; raises SubmissionRefused listing every \
failed check.
- host.slice(artifact_id) -> Slice: the smallest set of this session's cells that \
makes the artifact (.to_script()); rederive=True in submit_output asks the Host to \
re-run it in a fresh kernel and accept only the same bytes.
- host.skills.list(collection=None, offset=0), host.skills.search(query), \
host.skills.get(name): the skills catalog, as the skill tools give it.
- host.delegate(task, inputs=[paths, folders or artifact ids], mode=None, \
timeout=None) -> Subtask: start a sub-task (a child agent with its own kernel and \
record) on copies of the inputs, in a folder of its own; host.collect(subtask, \
timeout=None) -> SubtaskResult (.accepted, .output, .artifacts, .error); \
result.load(artifact_id, path=None) copies one of its artifacts into the workspace.
- host.cell_id, host.generation, host.mode: where you are."""

#: The fields of ``finalize_response``: those of ``host.submit_output``, plus
#: ``summary`` (a plain-text answer, folded into ``output["summary"]``).
FINALIZE_FIELDS: Final[tuple[str, ...]] = (
    "output", "summary", "completion_bullets", "task_status", "output_schema",
    "source_files", "entry_points", "architecture_summary", "test_evidence",
    "intended_changes", "regenerates", "rederive",
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
                "intended_changes": {
                    "type": "array",
                    "items": {"type": "object",
                              "properties": {"test": {"type": "string"},
                                             "reason": {"type": "string"}},
                              "required": ["test", "reason"]},
                    "description": "codebase_change: baseline tests whose behaviour the "
                                   "change means to alter, each with why."},
                "regenerates": {
                    "type": "array",
                    "items": {"type": "object",
                              "properties": {"command": {"type": "string"},
                                             "artifacts": {"type": "array",
                                                           "items": {"type": "string"}}},
                              "required": ["command", "artifacts"]},
                    "description": "reusable_pipeline: commands (python -m pkg … or python "
                                   "script.py …) the Host re-runs on the declared files; "
                                   "each must write its artifacts' exact bytes."},
                "rederive": {
                    "type": "boolean",
                    "description": "True: accepted only when the Host re-derives every "
                                   "artifact output names from its slice, in a fresh kernel."},
            },
            "required": ["completion_bullets"],
        },
    },
}

class Tier(enum.Enum):
    FREQUENT = "frequent"  # full argument sketch in the stable prefix, full schema in tools
    RARE = "rare"          # one line in the prefix; schema loaded on demand (tool_view)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A native tool: its tier, the line the prefix gives it, and its full schema."""

    name: str
    tier: Tier
    summary: str
    parameters: Mapping[str, Any]
    #: For a frequent tool: its arguments as the prefix shows them, ``name(args)``.
    sketch: str = ""

    def full_schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.summary,
            "parameters": json.loads(json.dumps(self.parameters))}}

    def request_schema(self) -> dict[str, Any]:
        """What the request's ``tools`` field carries: a frequent tool's full schema; for
        a rare one a stub that takes any object, so the field never changes when a
        schema is loaded (the arguments are checked by the loop, against the full one)."""
        if self.tier is Tier.FREQUENT:
            return self.full_schema()
        return {"type": "function", "function": {
            "name": self.name,
            "description": f"{self.summary} Rare tool: its arguments are given by "
                           f"tool_view(name={self.name!r}).",
            "parameters": {"type": "object", "additionalProperties": True}}}


_EXECUTE_PARAMETERS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "the cell's Python code"}},
    "required": ["code"], "additionalProperties": False}

TOOL_SPECS: Final[tuple[ToolSpec, ...]] = (
    ToolSpec("execute", Tier.FREQUENT,
             "Run one Python cell through the Host (as a ```python block would); the result "
             "is the cell's Observation.", _EXECUTE_PARAMETERS, "execute(code: str)"),
    ToolSpec("finalize_response", Tier.FREQUENT, FINALIZE_TOOL["function"]["description"],
             FINALIZE_TOOL["function"]["parameters"],
             "finalize_response(completion_bullets: list[str] (1 to 4), summary?: str, "
             "output?: object, task_status?: completed|partial|blocked|failed, "
             "output_schema?: object, source_files?: list[path | {path, sha256}], "
             "entry_points?: list[path], architecture_summary?: str, "
             "test_evidence?: list[{command, producing_cell_id}], "
             "intended_changes?: list[{test, reason}], "
             "regenerates?: list[{command, artifacts}], rederive?: bool)"),
    ToolSpec("tool_view", Tier.FREQUENT,
             "Load a rare tool's full arguments into the loaded-tools block of your context.",
             {"type": "object", "properties": {"name": {"type": "string"}},
              "required": ["name"], "additionalProperties": False},
             "tool_view(name: str)"),
    ToolSpec("list_skills", Tier.RARE,
             "Page through the skills catalog: names and summaries, with the exact total and "
             "next_offset while more remain.",
             {"type": "object", "properties": {
                 "collection": {"type": ["string", "null"],
                                "enum": ["bundled", "user", "project", None],
                                "description": "one collection, or null for all"},
                 "offset": {"type": "integer", "minimum": 0}},
              "additionalProperties": False}),
    ToolSpec("search_skills", Tier.RARE,
             "Find skills by literal word overlap with one or several queries; the best "
             "matches come with their bodies.",
             {"type": "object", "properties": {
                 "query": {"anyOf": [
                     {"type": "string", "minLength": 1},
                     {"type": "array", "items": {"type": "string", "minLength": 1},
                      "minItems": 1, "maxItems": 10}]}},
              "required": ["query"], "additionalProperties": False}),
    ToolSpec("skill_view", Tier.RARE, "Read one skill's whole body by its name.",
             {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}},
              "required": ["name"], "additionalProperties": False}),
)

#: The native tools by name.
TOOLS_BY_NAME: Final[dict[str, ToolSpec]] = {t.name: t for t in TOOL_SPECS}
#: The native tools sent in every turn's ``tools`` field, in order: byte-stable.
TOOLS: Final[tuple[dict[str, Any], ...]] = tuple(t.request_schema() for t in TOOL_SPECS)


def tool_map(specs: Sequence[ToolSpec] = TOOL_SPECS) -> str:
    """The tools as the prefix shows them: frequent ones with their arguments, rare ones
    on one line each."""
    lines = ["Tools. Frequent, with their arguments:"]
    lines += [f"- {t.sketch or t.name}: {t.summary}" for t in specs if t.tier is Tier.FREQUENT]
    rare = [t for t in specs if t.tier is Tier.RARE]
    if rare:
        lines.append("Rare, one line each (tool_view(name) loads a rare tool's arguments; a "
                     "call with wrong arguments loads them too):")
        lines += [f"- {t.name}: {t.summary}" for t in rare]
    return "\n".join(lines)


#: The built-in seed of the system prompt (used when no layer has a SYSTEM.md).
DEFAULT_SEED: Final[str] = PERSONA + "\n\n" + HOST_API_REFERENCE


def host_block(catalog_lines: str | None = None,
               specs: Sequence[ToolSpec] = TOOL_SPECS) -> str:
    """The Host's fixed block, last of the system blocks: the security fragment, the
    tool map and, when the catalog holds skills, the skill-retrieval rules and the
    catalog lines. It is recorded in the prompt's log like the file blocks."""
    parts = [SECURITY_GENERAL, tool_map(specs)]
    if catalog_lines:
        parts += [SKILL_RETRIEVAL, catalog_lines]
    return "\n\n".join(parts)


def system_prefix(catalog_lines: str | None = None) -> tuple[str, ...]:
    """The system blocks of a session with no SYSTEM.md files: the seed, the Host block."""
    return (DEFAULT_SEED, host_block(catalog_lines))


def loaded_tools_block(names: Sequence[str]) -> str | None:
    """The loaded-tools block: full schemas of the rare tools loaded so far, in load order."""
    specs = [TOOLS_BY_NAME[n] for n in names if n in TOOLS_BY_NAME]
    if not specs:
        return None
    lines = ["## Loaded tools (call them with these arguments)"]
    for spec in specs:
        lines.append(f"### {spec.name}\n{spec.summary}\n" + json.dumps(
            spec.parameters, sort_keys=True, ensure_ascii=False))
    return "\n".join(lines)


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
        test_evidence=args.get("test_evidence"),
        intended_changes=args.get("intended_changes"), regenerates=args.get("regenerates"),
        rederive=args.get("rederive"))
    return submission, notes
