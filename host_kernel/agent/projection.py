"""The projection of an agent's event stream: a frozen snapshot, folded one record at a time.

Owns :class:`Snapshot` and :func:`fold`, which turns a snapshot and one
record (as :class:`~host_kernel.agent.events.EventLog` wrote it) into the next
snapshot, plus :class:`Projection` (a fold that is also a log listener) and
:func:`replay` (a fold over a file). The fold:

* never raises: an unknown kind (a log from another version) is counted in
  ``unknown_kinds``, a record it cannot read in ``malformed``;
* never mutates a snapshot it returned: snapshots are frozen and hold tuples;
* reports ``None`` rather than an inferred number where the stream cannot
  say: no usage reported means no token total, no price means no cost.

It reads records only; it writes nothing and decides nothing.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .events import read_records, sessions_in

__all__ = [
    "CellLifecycle",
    "CompactionState",
    "CostTotals",
    "ErrorSummary",
    "Projection",
    "Snapshot",
    "SubtaskSummary",
    "TokenTotals",
    "ToolCallLifecycle",
    "VerdictSummary",
    "fold",
    "replay",
]

# ----------------------------------------------------------------------------- the snapshot


@dataclass(frozen=True, slots=True)
class TokenTotals:
    """Token counts summed over the calls whose provider reported usage.

    ``reported`` and ``unreported`` count calls; a total is ``None`` while no
    call reported usage (unknown is not zero).
    """

    prompt: int | None = None
    completion: int | None = None
    total: int | None = None
    reported: int = 0
    unreported: int = 0


@dataclass(frozen=True, slots=True)
class CostTotals:
    """Cost in USD summed over priced samples; unpriced samples are only counted."""

    usd: float | None = None
    priced: int = 0
    unpriced: int = 0


@dataclass(frozen=True, slots=True)
class CellLifecycle:
    """One proposed cell, keyed by the loop's proposal id, with the Host's cell id once run."""

    proposal: str
    step: int
    # proposed | running | ok | error | timeout | kernel_died | interrupted | skipped | host_died
    state: str
    cell_id: str | None = None
    generation: int | None = None
    duration: float | None = None
    receipts: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCallLifecycle:
    call_id: str
    name: str
    step: int
    state: str  # started | accepted | refused | ok | error
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class VerdictSummary:
    submission_id: str
    accepted: bool
    via: str
    failed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    seq: int | None
    where: str
    type: str
    message: str


@dataclass(frozen=True, slots=True)
class CompactionState:
    state: str = "idle"  # idle | running | failed (the last attempt's outcome)
    count: int = 0
    failures: int = 0
    last_estimated_tokens: int | None = None
    last_kernel_generation: int | None = None


@dataclass(frozen=True, slots=True)
class SubtaskSummary:
    """One sub-task the session delegated (host.delegate), and what it cost once collected."""

    handle: str
    state: str  # started | the child's outcome once collected
    task: str | None = None
    accepted: bool | None = None
    session: str | None = None
    cost_usd: float | None = None
    priced: int = 0
    unpriced: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the projection knows after some events. Frozen; holds tuples only."""

    events: int = 0
    session: str | None = None
    task: str | None = None
    mode: str | None = None
    armed: bool | None = None
    model: str | None = None
    outcome: str | None = None  # None while the session runs
    steps: int = 0
    requests: int = 0
    tokens: TokenTotals = field(default_factory=TokenTotals)
    costs: CostTotals = field(default_factory=CostTotals)
    #: The largest prompt a provider reported (tokens): the context gauge's input.
    largest_prompt: int | None = None
    kernel_generation: int | None = None
    cells: tuple[CellLifecycle, ...] = ()
    tool_calls: tuple[ToolCallLifecycle, ...] = ()
    receipts: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ()
    verdicts: tuple[VerdictSummary, ...] = ()
    gates: tuple[tuple[bool | None, bool], ...] = ()  # (asserts_result, backed) per gate
    errors: tuple[ErrorSummary, ...] = ()
    compaction: CompactionState = field(default_factory=CompactionState)
    #: System prompt entries (append and replace) and how many were replace.
    system_entries: int = 0
    system_replaces: int = 0
    messages: int = 0
    resumes: int = 0
    loaded_tools: tuple[str, ...] = ()
    subtasks: tuple[SubtaskSummary, ...] = ()
    unknown_kinds: tuple[tuple[str, int], ...] = ()
    malformed: int = 0

    @property
    def spend_usd(self) -> float:
        """The priced spend: this session's priced calls plus its collected sub-tasks'."""
        return (self.costs.usd or 0.0) + sum(t.cost_usd or 0.0 for t in self.subtasks)

    @property
    def subtask_unpriced(self) -> int:
        return sum(t.unpriced for t in self.subtasks)

    def cell(self, key: str) -> CellLifecycle | None:
        """A cell by proposal id or by the Host's cell id."""
        for c in self.cells:
            if key in (c.proposal, c.cell_id):
                return c
        return None

    def tool_call(self, call_id: str) -> ToolCallLifecycle | None:
        return next((t for t in self.tool_calls if t.call_id == call_id), None)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def render(self) -> str:
        """A human-readable summary, as ``host-kernel trace`` prints it."""
        t, c = self.tokens, self.costs
        lines = [
            f"session   {self.session or '?'}",
            f"task      {_short(self.task or '?', 100)}",
            f"mode      {self.mode or '?'}" + (" (armed)" if self.armed else ""),
            f"model     {self.model or '?'}",
            f"outcome   {self.outcome or 'running (no session_ended event)'}",
            f"steps     {self.steps}, provider calls {self.requests}, events {self.events}",
            "tokens    " + (f"prompt {t.prompt}, completion {t.completion}, total {t.total}"
                           if t.reported else "unknown")
            + f" (usage reported by {t.reported} of {t.reported + t.unreported} calls)",
            "cost      " + (f"${c.usd:.6f}" if c.usd is not None else "unknown")
            + f" ({c.priced} priced, {c.unpriced} unpriced)"
            + (f"; sub-tasks ${sum(t.cost_usd or 0.0 for t in self.subtasks):.6f} "
               f"({self.subtask_unpriced} unpriced)" if self.subtasks else ""),
            (f"system prompt  {self.system_entries} entries ({self.system_replaces} replace), "
             f"resumed {self.resumes} time(s), loaded tools: "
             f"{', '.join(self.loaded_tools) or 'none'}"),
            "largest prompt  " + (f"{self.largest_prompt} tokens" if self.largest_prompt
                                  is not None else "unknown"),
            f"kernel generation  {self.kernel_generation if self.kernel_generation else '?'}",
            (f"compaction  {self.compaction.state}, {self.compaction.count} done, "
             f"{self.compaction.failures} failed"),
            f"cells ({len(self.cells)}):",
        ]
        for cell in self.cells:
            extra = ""
            if cell.receipts:
                extra += f", {len(cell.receipts)} receipt(s)"
            if cell.artifacts:
                extra += f", {len(cell.artifacts)} artifact(s)"
            dur = f", {cell.duration:.2f} s" if cell.duration is not None else ""
            lines.append(f"  step {cell.step:>3} {cell.proposal:<8} {cell.state:<11} "
                         f"{cell.cell_id or '-'} (gen {cell.generation or '?'}{dur}{extra})")
        lines.append(f"tool calls ({len(self.tool_calls)}):")
        for call in self.tool_calls:
            lines.append(f"  step {call.step:>3} {call.name} {call.state}: "
                         f"{_short(call.detail or '', 90)}")
        lines.append(f"verdicts ({len(self.verdicts)}):")
        for v in self.verdicts:
            what = "accepted" if v.accepted else "refused [" + ", ".join(v.failed) + "]"
            lines.append(f"  {v.submission_id} via {v.via}: {what}")
        if self.subtasks:
            lines.append(f"sub-tasks ({len(self.subtasks)}):")
            for sub in self.subtasks:
                cost = f", ${sub.cost_usd:.6f}" if sub.cost_usd is not None else ""
                lines.append(f"  {sub.handle} {sub.state}{cost}: {_short(sub.task or '', 80)}")
        lines.append(f"errors ({len(self.errors)}):")
        for e in self.errors:
            lines.append(f"  {e.where}: {e.type}: {_short(e.message, 100)}")
        if self.unknown_kinds or self.malformed:
            unknown = ", ".join(f"{k} x{n}" for k, n in self.unknown_kinds) or "none"
            lines.append(f"not understood: unknown kinds {unknown}; malformed {self.malformed}")
        return "\n".join(lines) + "\n"


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ----------------------------------------------------------------------------- folding

Handler = Callable[[Snapshot, Mapping[str, Any], Mapping[str, Any]], Snapshot]


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _add(a: int | None, b: int | None) -> int | None:
    if b is None:
        return a
    return b if a is None else a + b


def _upsert_cell(snap: Snapshot, proposal: str, step: int,
                 change: Callable[[CellLifecycle], CellLifecycle]) -> Snapshot:
    cells = list(snap.cells)
    for i, c in enumerate(cells):
        if c.proposal == proposal:
            cells[i] = change(c)
            return dataclasses.replace(snap, cells=tuple(cells))
    cells.append(change(CellLifecycle(proposal, step, "proposed")))
    return dataclasses.replace(snap, cells=tuple(cells))


def _attach_to_cell(snap: Snapshot, cell_id: Any, receipt: str | None = None,
                    artifact: str | None = None) -> Snapshot:
    cells = list(snap.cells)
    for i, c in enumerate(cells):
        if c.cell_id is not None and c.cell_id == cell_id:
            if receipt is not None:
                cells[i] = dataclasses.replace(c, receipts=(*c.receipts, receipt))
            if artifact is not None:
                cells[i] = dataclasses.replace(c, artifacts=(*c.artifacts, artifact))
            return dataclasses.replace(snap, cells=tuple(cells))
    return snap  # a receipt of a cell the loop did not run (the stream cannot say more)


def _session_started(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    return dataclasses.replace(s, session=r.get("session"), task=d.get("task"),
                               mode=d.get("mode"), armed=d.get("armed"), model=d.get("model"),
                               kernel_generation=1)


def _session_ended(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    return dataclasses.replace(s, outcome=str(d["outcome"]), steps=max(s.steps, d["steps"]))


def _prompt_rendered(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    step = d.get("step")
    return dataclasses.replace(s, steps=max(s.steps, step if isinstance(step, int) else 0))


def _provider_budget(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    prompt, completion = _int_or_none(d.get("prompt_tokens")), _int_or_none(
        d.get("completion_tokens"))
    total = _int_or_none(d.get("total_tokens"))
    t = s.tokens
    if prompt is None:
        tokens = dataclasses.replace(t, unreported=t.unreported + 1)
    else:
        if total is None:
            total = prompt + (completion or 0)
        tokens = TokenTotals(_add(t.prompt, prompt), _add(t.completion, completion or 0),
                             _add(t.total, total), t.reported + 1, t.unreported)
    cost = d.get("cost_usd")
    c = s.costs
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        costs = CostTotals((c.usd or 0.0) + float(cost), c.priced + 1, c.unpriced)
    else:
        costs = dataclasses.replace(c, unpriced=c.unpriced + 1)
    largest = s.largest_prompt
    if prompt is not None and (largest is None or prompt > largest):
        largest = prompt
    return dataclasses.replace(s, requests=s.requests + 1, tokens=tokens, costs=costs,
                               largest_prompt=largest)


def _cell_proposed(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    return _upsert_cell(s, str(d["proposal"]), int(d["step"]), lambda c: c)


def _cell_started(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    return _upsert_cell(s, str(d["proposal"]), int(d["step"]),
                        lambda c: dataclasses.replace(c, state="running"))


def _cell_completed(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    def change(c: CellLifecycle) -> CellLifecycle:
        return dataclasses.replace(c, state=str(d["status"]), cell_id=d.get("cell_id"),
                                   generation=_int_or_none(d.get("generation")),
                                   duration=d.get("duration"))

    return _upsert_cell(s, str(d["proposal"]), int(d["step"]), change)


def _receipt(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    s = dataclasses.replace(s, receipts=(*s.receipts, str(d["receipt_id"])))
    return _attach_to_cell(s, d.get("cell_id"), receipt=str(d["receipt_id"]))


def _artifact(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    s = dataclasses.replace(s, artifacts=(*s.artifacts, str(d["artifact_id"])))
    return _attach_to_cell(s, d.get("cell_id"), artifact=str(d["artifact_id"]))


def _tool_call_started(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    call = ToolCallLifecycle(str(d["call_id"]), str(d["name"]), int(d.get("step") or 0),
                             "started", d.get("arguments_error"))
    return dataclasses.replace(s, tool_calls=(*s.tool_calls, call))


def _tool_call_completed(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    calls = list(s.tool_calls)
    for i in range(len(calls) - 1, -1, -1):
        if calls[i].call_id == d["call_id"]:
            calls[i] = dataclasses.replace(calls[i], state=str(d["outcome"]),
                                           detail=d.get("detail"))
            return dataclasses.replace(s, tool_calls=tuple(calls))
    calls.append(ToolCallLifecycle(str(d["call_id"]), str(d["name"]), 0, str(d["outcome"]),
                                   d.get("detail")))
    return dataclasses.replace(s, tool_calls=tuple(calls))


def _submission_verdict(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    verdict = VerdictSummary(str(d["submission_id"]), bool(d["accepted"]), str(d.get("via")),
                             tuple(str(x) for x in d.get("failed") or ()))
    return dataclasses.replace(s, verdicts=(*s.verdicts, verdict))


def _gate_decided(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    asserts = d.get("asserts_result")
    return dataclasses.replace(s, gates=(*s.gates, (asserts if isinstance(asserts, bool)
                                                    else None, bool(d.get("backed")))))


def _kernel_restarted(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    return dataclasses.replace(s, kernel_generation=int(d["generation"]))


def _compaction_started(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    comp = dataclasses.replace(s.compaction, state="running",
                               last_estimated_tokens=_int_or_none(d.get("estimated_tokens")))
    return dataclasses.replace(s, compaction=comp)


def _compaction_completed(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    c = s.compaction
    if d.get("ok"):
        comp = dataclasses.replace(c, state="idle", count=c.count + 1,
                                   last_kernel_generation=_int_or_none(d.get("kernel_generation")))
    else:
        comp = dataclasses.replace(c, state="failed", failures=c.failures + 1)
    return dataclasses.replace(s, compaction=comp)


def _error(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    seq = r.get("seq")
    err = ErrorSummary(seq if isinstance(seq, int) else None, str(d.get("where")),
                       str(d.get("type")), str(d.get("message")))
    return dataclasses.replace(s, errors=(*s.errors, err))


def _nothing(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    return s


def _system_prompt(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    replace = d["op"] == "replace"
    return dataclasses.replace(s, system_entries=s.system_entries + 1,
                               system_replaces=s.system_replaces + int(replace))


def _message(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    return dataclasses.replace(s, messages=s.messages + 1)


def _tool_loaded(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    name = d["name"]
    if not isinstance(name, str):
        raise TypeError("a tool name is a string")  # counted as malformed
    if name in s.loaded_tools:
        return s
    return dataclasses.replace(s, loaded_tools=(*s.loaded_tools, name))


def _session_resumed(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    generation = _int_or_none(d.get("generation"))
    return dataclasses.replace(s, outcome=None, resumes=s.resumes + 1,
                               kernel_generation=generation or s.kernel_generation)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _subtask_started(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    task = SubtaskSummary(str(d["handle"]), "started", _str_or_none(d.get("task")))
    return dataclasses.replace(s, subtasks=(*s.subtasks, task))


def _subtask_finished(s: Snapshot, d: Mapping[str, Any], r: Mapping[str, Any]) -> Snapshot:
    cost = d.get("cost_usd")
    usd = float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None
    session = _str_or_none(d.get("session"))
    priced, unpriced = _int_or_none(d.get("priced")) or 0, _int_or_none(d.get("unpriced")) or 0
    tasks = list(s.subtasks)
    for i, t in enumerate(tasks):
        if t.handle == str(d["handle"]):
            tasks[i] = dataclasses.replace(
                t, state=str(d["outcome"]), accepted=bool(d.get("accepted")),
                session=session, cost_usd=usd, priced=priced, unpriced=unpriced)
            return dataclasses.replace(s, subtasks=tuple(tasks))
    tasks.append(SubtaskSummary(str(d["handle"]), str(d["outcome"]), None,
                                bool(d.get("accepted")), session, usd, priced, unpriced))
    return dataclasses.replace(s, subtasks=tuple(tasks))


_HANDLERS: Final[dict[str, Handler]] = {
    "session_started": _session_started,
    "session_ended": _session_ended,
    "user_input": _nothing,
    "prompt_rendered": _prompt_rendered,
    "provider_budget": _provider_budget,
    "cell_proposed": _cell_proposed,
    "cell_started": _cell_started,
    "cell_completed": _cell_completed,
    "receipt": _receipt,
    "artifact": _artifact,
    "tool_call_started": _tool_call_started,
    "tool_call_completed": _tool_call_completed,
    "submission_verdict": _submission_verdict,
    "gate_decided": _gate_decided,
    "kernel_restarted": _kernel_restarted,
    "compaction_started": _compaction_started,
    "compaction_completed": _compaction_completed,
    "error": _error,
    "system_prompt": _system_prompt,
    "message": _message,
    "tool_loaded": _tool_loaded,
    "session_resumed": _session_resumed,
    "subtask_started": _subtask_started,
    "subtask_finished": _subtask_finished,
}


def fold(snapshot: Snapshot, record: Any) -> Snapshot:
    """The snapshot after one more record. Never raises; never changes ``snapshot``.

    An unknown kind (a log from another version) is counted in
    ``unknown_kinds``; a record that is not an object, has no kind, or whose
    data a handler cannot read is counted in ``malformed``.
    """
    counted = dataclasses.replace(snapshot, events=snapshot.events + 1)
    if not isinstance(record, Mapping) or not isinstance(record.get("kind"), str):
        return dataclasses.replace(counted, malformed=counted.malformed + 1)
    kind = record["kind"]
    handler = _HANDLERS.get(kind)
    if handler is None:
        unknown = dict(counted.unknown_kinds)
        unknown[kind] = unknown.get(kind, 0) + 1
        return dataclasses.replace(counted, unknown_kinds=tuple(sorted(unknown.items())))
    data = record.get("data")
    if not isinstance(data, Mapping):
        return dataclasses.replace(counted, malformed=counted.malformed + 1)
    try:
        return handler(counted, data, record)
    except Exception:  # noqa: BLE001 - a projection never raises on what it reads
        return dataclasses.replace(counted, malformed=counted.malformed + 1)


class Projection:
    """Folds records one at a time; usable as an :class:`EventLog` listener."""

    def __init__(self, snapshot: Snapshot | None = None) -> None:
        self.snapshot = snapshot or Snapshot()

    def __call__(self, record: Any) -> None:
        self.feed(record)

    def feed(self, record: Any) -> Snapshot:
        self.snapshot = fold(self.snapshot, record)
        return self.snapshot




def replay(path: str | os.PathLike[str], session: str | None = None) -> Snapshot:
    """Fold a log file into a snapshot: ``session``'s records, or the last session's.

    Lines that are not JSON objects count as malformed records of the chosen session.
    """
    if session is None:
        found = sessions_in(path)
        session = found[-1] if found else None
    projection = Projection()
    for record in read_records(path):
        if record is None or record.get("session") == session:
            projection.feed(record)
    return projection.snapshot
