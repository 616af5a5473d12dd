"""The agent loop's event stream: typed events and their NDJSON log.

Owns two things:

* the **event types**: one frozen dataclass per kind, each naming its ``kind``;
* the **log**: :class:`EventLog` appends every event as one JSON line to
  ``<record>/agent-events.ndjson`` and hands the very record it wrote (parsed
  back from that line) to its listeners, so what is folded live and what is
  replayed from the file are the same values.

The projection that folds these records into a snapshot is
:mod:`.projection`. This module does not own the Host's ledger. The ledger is evidence (hash-chained,
verified); this stream is observability for people and tools watching an
agent. Nothing here decides acceptance.

A record on disk::

    {"v": 1, "seq": 7, "ts": 1700000000.1, "session": "<host session uuid>",
     "kind": "cell_completed", "data": {...the event's fields...}}
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final, TextIO

__all__ = [
    "EVENTS_FILE",
    "EVENT_TYPES",
    "AgentEvent",
    "ArtifactSaved",
    "CellCompleted",
    "CellProposed",
    "CellStarted",
    "CompactionCompleted",
    "CompactionStarted",
    "ErrorEvent",
    "EventLog",
    "GateDecided",
    "KernelRestarted",
    "MessageAppended",
    "PromptRendered",
    "ProviderBudget",
    "ReceiptRecorded",
    "SessionEnded",
    "SessionResumed",
    "SessionStarted",
    "SubmissionVerdict",
    "SubtaskFinished",
    "SubtaskStarted",
    "SystemPromptEntry",
    "ToolCallCompleted",
    "ToolCallStarted",
    "ToolLoaded",
    "UserInput",
    "progress_line",
    "read_records",
    "sessions_in",
]

#: The log's file name inside a record folder.
EVENTS_FILE: Final[str] = "agent-events.ndjson"
#: Version of the record layout written by :class:`EventLog`.
RECORD_VERSION: Final[int] = 1
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


# ----------------------------------------------------------------------------- event types


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """Base of every event type; ``kind`` names it on the wire."""

    kind: ClassVar[str] = "event"

    def data(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class SessionStarted(AgentEvent):
    kind: ClassVar[str] = "session_started"
    task: str
    mode: str
    armed: bool
    model: str | None
    workdir: str
    record_dir: str
    max_steps: int
    token_budget: int
    stream: bool
    system_style: str = "separate"  # separate | single (agent/conversation.py)
    #: For a sub-task: the parent's session, the cell that delegated, the handle, the
    #: parent's record folder. None for a session started by a person.
    parent: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class SessionEnded(AgentEvent):
    kind: ClassVar[str] = "session_ended"
    # accepted | step_limit | interrupted | error | budget_exceeded | cancelled
    outcome: str
    steps: int
    accepted: bool
    submission_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class UserInput(AgentEvent):
    kind: ClassVar[str] = "user_input"
    text: str
    source: str = "task"  # task | interrupt | resume (a follow-up given with --resume)


@dataclass(frozen=True, slots=True)
class PromptRendered(AgentEvent):
    """One request about to be sent: which layers it holds, by sha256."""

    kind: ClassVar[str] = "prompt_rendered"
    request: int
    purpose: str  # turn | summary_fork | conclusion_gate
    step: int
    layer_hashes: dict[str, str | None]
    messages: int
    chars: int
    estimated_tokens: int


@dataclass(frozen=True, slots=True)
class ProviderBudget(AgentEvent):
    """What one provider call consumed. ``None`` means the provider did not say."""

    kind: ClassVar[str] = "provider_budget"
    request: int
    purpose: str
    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None
    cost_usd: float | None
    cost_source: str | None  # provider | prices | None
    duration: float


@dataclass(frozen=True, slots=True)
class CellProposed(AgentEvent):
    kind: ClassVar[str] = "cell_proposed"
    proposal: str  # "s<step>c<n>", the loop's own key until the Host mints the cell id
    step: int
    code: str


@dataclass(frozen=True, slots=True)
class CellStarted(AgentEvent):
    kind: ClassVar[str] = "cell_started"
    proposal: str
    step: int


@dataclass(frozen=True, slots=True)
class CellCompleted(AgentEvent):
    kind: ClassVar[str] = "cell_completed"
    proposal: str
    step: int
    cell_id: str | None  # None when the cell was skipped (an earlier cell of the reply failed)
    status: str  # ok | error | timeout | kernel_died | interrupted | skipped | host_died
    generation: int | None
    duration: float | None
    notice: str | None = None


@dataclass(frozen=True, slots=True)
class ReceiptRecorded(AgentEvent):
    kind: ClassVar[str] = "receipt"
    cell_id: str
    receipt_id: str
    command: str
    exit_status: int | None


@dataclass(frozen=True, slots=True)
class ArtifactSaved(AgentEvent):
    kind: ClassVar[str] = "artifact"
    cell_id: str | None
    artifact_id: str
    filename: str
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class ToolCallStarted(AgentEvent):
    kind: ClassVar[str] = "tool_call_started"
    call_id: str
    name: str
    step: int
    arguments_error: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallCompleted(AgentEvent):
    kind: ClassVar[str] = "tool_call_completed"
    call_id: str
    name: str
    outcome: str  # accepted | refused | ok | error
    detail: str


@dataclass(frozen=True, slots=True)
class SubmissionVerdict(AgentEvent):
    kind: ClassVar[str] = "submission_verdict"
    submission_id: str
    accepted: bool
    via: str  # finalize_response | cell
    cell_id: str | None
    failed: list[str]
    mode: str
    armed: bool


@dataclass(frozen=True, slots=True)
class GateDecided(AgentEvent):
    """The conclusion gate's reading of a plain final message (analysis_run)."""

    kind: ClassVar[str] = "gate_decided"
    step: int
    asserts_result: bool | None  # None: the gate's answer was unusable (treated as YES)
    backed: bool
    evidence: dict[str, int]


@dataclass(frozen=True, slots=True)
class KernelRestarted(AgentEvent):
    kind: ClassVar[str] = "kernel_restarted"
    previous: int
    generation: int
    cell_id: str | None


@dataclass(frozen=True, slots=True)
class CompactionStarted(AgentEvent):
    kind: ClassVar[str] = "compaction_started"
    step: int
    estimated_tokens: int
    budget: int
    messages_before: int


@dataclass(frozen=True, slots=True)
class CompactionCompleted(AgentEvent):
    kind: ClassVar[str] = "compaction_completed"
    step: int
    ok: bool
    messages_after: int
    summary_chars: int
    missing_headings: list[str]
    kernel_generation: int
    #: The summary that replaced older history, and how many history messages it
    #: replaced (from the front): what a rebuild needs to redo the compaction.
    summary: str | None = None
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class SystemPromptEntry(AgentEvent):
    """One positioned entry of the system prompt's log (:mod:`.sysprompt`)."""

    kind: ClassVar[str] = "system_prompt"
    op: str  # append | replace
    text: str
    source: str = ""


@dataclass(frozen=True, slots=True)
class MessageAppended(AgentEvent):
    """One message added to the conversation's history, exactly as the model will see it.

    The conversation is rebuilt from these (with the system entries and compactions),
    live and on resume, so what was sent and what a resume sends are the same bytes.
    """

    kind: ClassVar[str] = "message"
    message: dict[str, Any]
    source: str  # model | observation | tool_result | resume


@dataclass(frozen=True, slots=True)
class ToolLoaded(AgentEvent):
    """A rare tool's full schema was put into the loaded-tools block of the context."""

    kind: ClassVar[str] = "tool_loaded"
    name: str
    why: str  # tool_view | bad_arguments


@dataclass(frozen=True, slots=True)
class SessionResumed(AgentEvent):
    """A new process took the session up again (``host-kernel run --resume``)."""

    kind: ClassVar[str] = "session_resumed"
    previous_outcome: str | None  # the outcome the last run ended with; None: it crashed
    generation: int
    max_steps: int
    reconciled: int  # system prompt entries appended by the reconciliation (0: unchanged)
    model: str | None = None
    #: A system style other than the session's, from this resume on; None: unchanged.
    system_style: str | None = None


@dataclass(frozen=True, slots=True)
class SubtaskStarted(AgentEvent):
    kind: ClassVar[str] = "subtask_started"
    handle: str
    task: str
    cell_id: str | None
    folder: str
    record_dir: str
    depth: int


@dataclass(frozen=True, slots=True)
class SubtaskFinished(AgentEvent):
    kind: ClassVar[str] = "subtask_finished"
    handle: str
    outcome: str  # accepted | step_limit | error | timeout | cancelled | ...
    accepted: bool
    session: str | None
    cost_usd: float | None
    priced: int
    unpriced: int
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ErrorEvent(AgentEvent):
    kind: ClassVar[str] = "error"
    where: str
    type: str
    message: str


EVENT_TYPES: Final[tuple[type[AgentEvent], ...]] = (
    SessionStarted, SessionEnded, UserInput, PromptRendered, ProviderBudget, CellProposed,
    CellStarted, CellCompleted, ReceiptRecorded, ArtifactSaved, ToolCallStarted,
    ToolCallCompleted, SubmissionVerdict, GateDecided, KernelRestarted, CompactionStarted,
    CompactionCompleted, ErrorEvent, SystemPromptEntry, MessageAppended, ToolLoaded,
    SessionResumed, SubtaskStarted, SubtaskFinished,
)


# ----------------------------------------------------------------------------- the log


Listener = Callable[[dict[str, Any]], None]


class EventLog:
    """Appends events as NDJSON lines and hands each written record to its listeners.

    One log per agent session. ``path`` is opened for appending (several
    sessions may share one record folder: each record names its session).
    A listener that raises is detached and the failure is logged as an
    ``error`` event, so a broken progress printer never stops the agent.
    """

    def __init__(self, path: str | os.PathLike[str], session: str,
                 listeners: Iterable[Listener] = (), *, start_seq: int = 0) -> None:
        """``start_seq``: the session's last seq already in the file (a resumed session
        goes on counting from it)."""
        self.path = Path(path)
        self.session = session
        self._listeners = list(listeners)
        self._lock = threading.Lock()
        self._seq = start_seq
        self._file: TextIO | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        if _ends_mid_line(self.path):
            # A process killed mid-write left half a line: end it, so the next record
            # is a line of its own (a replay counts the half line as malformed).
            self._file.write("\n")
            self._file.flush()

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def emit(self, event: AgentEvent) -> dict[str, Any]:
        """Append ``event``; return the record as written (and as a replay will read it)."""
        with self._lock:
            if self._file is None:
                raise ValueError("the event log is closed")
            self._seq += 1
            record = {"v": RECORD_VERSION, "seq": self._seq, "ts": round(time.time(), 6),
                      "session": self.session, "kind": event.kind, "data": event.data()}
            line = json.dumps(record, ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False, default=str)
            # A lone surrogate (a model can send one, escaped, in its JSON) cannot be
            # written as UTF-8: it is kept as U+FFFD, in the file and for the listeners.
            line = _SURROGATE.sub("\ufffd", line)
            self._file.write(line + "\n")
            self._file.flush()
            written: dict[str, Any] = json.loads(line)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(written)
            except Exception as exc:  # noqa: BLE001 - observers never stop the loop
                self._listeners.remove(listener)
                self.emit(ErrorEvent("listener", type(exc).__name__, str(exc)[:500]))
        return written

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _ends_mid_line(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False


def read_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any] | None]:
    """Each line of an events file parsed; ``None`` for a line that is not a JSON object."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                yield None
                continue
            yield value if isinstance(value, dict) else None


def sessions_in(path: str | os.PathLike[str]) -> list[str]:
    """The session ids of a log, in the order their first record appears."""
    seen: dict[str, None] = {}
    for record in read_records(path):
        if record is not None and isinstance(record.get("session"), str):
            seen.setdefault(record["session"], None)
    return list(seen)


# ----------------------------------------------------------------------------- progress


def progress_line(record: Mapping[str, Any]) -> str | None:
    """One short line for a person watching, or ``None`` for events not worth a line."""
    kind, d = record.get("kind"), record.get("data") or {}
    if kind == "session_started":
        armed = " (armed)" if d.get("armed") else ""
        return (f"session started: mode {d.get('mode')}{armed}, model {d.get('model')}, "
                f"up to {d.get('max_steps')} steps; record {d.get('record_dir')}")
    if kind == "prompt_rendered" and d.get("purpose") == "turn":
        return f"step {d.get('step')}: asking the model (~{d.get('estimated_tokens')} tokens)"
    if kind == "cell_completed":
        dur = d.get("duration")
        took = f", {dur:.2f} s" if isinstance(dur, (int, float)) else ""
        return (f"step {d.get('step')}: cell {d.get('proposal')} {d.get('status')}"
                f"{' ' + d['cell_id'] if d.get('cell_id') else ''}{took}")
    if kind == "kernel_restarted":
        return f"kernel restarted: generation {d.get('previous')} -> {d.get('generation')}"
    if kind == "tool_call_completed" and d.get("outcome") == "error":
        return f"{d.get('name')}: error: {d.get('detail')}"
    if kind == "submission_verdict":
        failed = d.get("failed") or []
        what = "accepted" if d.get("accepted") else f"refused [{', '.join(failed)}]"
        return f"submission via {d.get('via')}: {what}"
    if kind == "gate_decided":
        return (f"step {d.get('step')}: plain final message; asserts a result: "
                f"{d.get('asserts_result')}, backed by the record: {d.get('backed')}")
    if kind == "compaction_started":
        return (f"compacting history (~{d.get('estimated_tokens')} tokens, budget "
                f"{d.get('budget')})")
    if kind == "compaction_completed":
        return ("compaction done" if d.get("ok") else "compaction failed; history kept") + (
            f": {d.get('messages_after')} messages")
    if kind == "session_resumed":
        return (f"session resumed in kernel generation {d.get('generation')} (it had ended: "
                f"{d.get('previous_outcome') or 'crashed'}); system prompt entries appended: "
                f"{d.get('reconciled')}")
    if kind == "tool_loaded":
        return f"tool {d.get('name')}: full schema loaded ({d.get('why')})"
    if kind == "subtask_started":
        return f"sub-task {d.get('handle')} started in {d.get('folder')}"
    if kind == "subtask_finished":
        return f"sub-task {d.get('handle')} finished: {d.get('outcome')}"
    if kind == "error":
        return f"error ({d.get('where')}): {d.get('type')}: {d.get('message')}"
    if kind == "session_ended":
        reason = f" ({d.get('reason')})" if d.get("reason") else ""
        return f"session ended: {d.get('outcome')} after {d.get('steps')} steps{reason}"
    return None
