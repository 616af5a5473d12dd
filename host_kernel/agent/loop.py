"""The reference agent loop: a model, a Host, and nothing accepted that the record does not back.

Owns one session's turn cycle. Each **step** is one request to the model
(built from the layers of :mod:`.layers`) and what its reply asks for:

* fenced ```` ```python ```` blocks: each is one cell, run through
  ``Host.execute`` in order (after a cell that does not finish ``ok`` the
  rest of the reply is skipped); the Observations' texts go back as the next
  user message;
* a ``finalize_response`` tool call: its fields become a
  :class:`~host_kernel.verify.Submission` and go through ``Host.submit`` (the
  same verifier as ``host.submit_output``); a refusal returns as the tool
  result, listing every failed check; acceptance ends the session;
* ``host.submit_output`` called inside a cell ends the session too when the
  Host accepts it (the loop hears the verdict from the Host in-process, never
  from the cell's printed text);
* a plain message (no cell, no tool call) never ends the session. In
  ``analysis_run`` the conclusion gate reads it first: if it asserts a result
  and the session holds no evidence (no ``ok`` cell, no artifact, no receipt
  in the Host's record), the loop refuses it and says why; otherwise it asks
  for ``finalize_response``. So every accepted completion, in every mode,
  passed the verifier.

The loop ends on an accepted completion, at the step limit, on Ctrl-C (the
kernel is interrupted and the cell recorded as usual), or on an error it
cannot recover from (the provider failing after its retries). Before a
request whose conversation nears the token budget, a compaction runs the
summary fork on the older turns, with the Host's generation as the
authoritative kernel fact, and replaces them with the summary.

Every step is an event in ``<record>/agent-events.ndjson`` (:mod:`.events`);
the projection of the live stream is returned in :class:`AgentResult`.
It does not own the Host, the verifier, the prompts or the HTTP client.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Final

from .. import prompts
from .._errors import HostKernelError
from .._models import Observation, Verdict
from .._paths import default_record_dir
from ..host._host import Host
from ..host._pool import HostPool
from ..llm import ChatClient, ChatResult, LLMError, ToolCall
from ..modes import DEFAULT_MODE
from .conversation import SYSTEM_STYLES, Conversation, ConversationState
from .events import (
    EVENTS_FILE,
    ArtifactSaved,
    CellCompleted,
    CellProposed,
    CellStarted,
    CompactionCompleted,
    CompactionStarted,
    ErrorEvent,
    EventLog,
    GateDecided,
    KernelRestarted,
    MessageAppended,
    PromptRendered,
    ProviderBudget,
    ReceiptRecorded,
    SessionEnded,
    SessionResumed,
    SessionStarted,
    SubmissionVerdict,
    SubtaskFinished,
    SubtaskStarted,
    SystemPromptEntry,
    ToolCallCompleted,
    ToolCallStarted,
    ToolLoaded,
    UserInput,
    read_records,
)
from .layers import (
    DEFAULT_SEED,
    TOOLS,
    TOOLS_BY_NAME,
    SessionAnchors,
    Tier,
    ToolSpec,
    estimate_tokens,
    extract_cells,
    host_block,
    read_git_head,
    sha256_text,
    submission_from_arguments,
    task_message,
)
from .projection import Projection, Snapshot
from .sysprompt import Block, Layers, initial_entries, reconcile, resolve_blocks
from .worker import HostThread

__all__ = [
    "DEFAULT_COMPACT_AT",
    "DEFAULT_MAX_STEPS",
    "DEFAULT_TOKEN_BUDGET",
    "AgentResult",
    "Outcome",
    "Prices",
    "run_agent",
]

DEFAULT_MAX_STEPS: Final[int] = 30
DEFAULT_TOKEN_BUDGET: Final[int] = 100_000
#: Compact when the conversation's estimated tokens reach this share of the budget.
DEFAULT_COMPACT_AT: Final[float] = 0.8
#: Seconds to wait for an interrupted cell to come back before giving up on it.
INTERRUPT_WAIT: Final[float] = 10.0



class Outcome(enum.Enum):
    ACCEPTED = "accepted"        # a submission was accepted by the Host's verifier
    STEP_LIMIT = "step_limit"    # max_steps requests were made without an accepted one
    INTERRUPTED = "interrupted"  # the user pressed Ctrl-C (KeyboardInterrupt)
    ERROR = "error"              # the provider or the Host failed in a way the loop cannot fix
    BUDGET = "budget_exceeded"   # the priced spend passed budget_usd
    CANCELLED = "cancelled"      # the session was cut from outside (a sub-task's timeout)


class _BudgetExceeded(Exception):
    pass


class _Cancelled(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per million tokens, for a cost estimate where the provider reports none."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_mtok
                + completion_tokens * self.output_per_mtok) / 1_000_000


@dataclass(frozen=True, slots=True)
class AgentResult:
    """How a session ended. ``verdict`` is the last one the Host gave (accepted or not)."""

    outcome: Outcome
    verdict: Verdict | None
    steps: int
    session_id: str
    record_dir: Path
    events_path: Path
    snapshot: Snapshot
    reason: str | None = None
    final_message: str | None = None
    resumed: bool = False

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPTED


# ----------------------------------------------------------------------------- the session


class _Metered:
    """A ChatClient that reports each call of one purpose to the session's events."""

    def __init__(self, session: _Session, purpose: str) -> None:
        self._session = session
        self._purpose = purpose

    def chat(self, messages: Sequence[Mapping[str, Any]], *,
             tools: Sequence[Mapping[str, Any]] | None = None, max_tokens: int | None = None,
             stream: bool = False, temperature: float | None = None) -> ChatResult:
        hashes: dict[str, str | None] = {
            f"messages[{i}]": sha256_text(str(m.get("content") or ""))
            for i, m in enumerate(messages)}
        return self._session.call_llm(messages, self._purpose, hashes, tools=tools,
                                      max_tokens=max_tokens)


def _provider_cost(raw: Any) -> float | None:
    """A cost the provider reported in its usage block (OpenRouter and others), if any."""
    bodies = raw if isinstance(raw, list) else [raw]
    for body in reversed(bodies):
        usage = body.get("usage") if isinstance(body, dict) else None
        cost = usage.get("cost") if isinstance(usage, dict) else None
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            return float(cost)
    return None


def _assistant_message(result: ChatResult, call_ids: list[str]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function",
             "function": {"name": call.name, "arguments": call.raw_arguments or "{}"}}
            for cid, call in zip(call_ids, result.tool_calls, strict=True)]
    return message


def _transcript(messages: Sequence[Mapping[str, Any]]) -> str:
    """The summary fork's input: each message under a label saying who said it."""
    parts = []
    for m in messages:
        role = m.get("role")
        label = {"user": "user / Host", "assistant": "agent", "tool": "tool result"}.get(
            str(role), str(role))
        parts.append(f"--- {label} ---\n{m.get('content') or ''}".rstrip())
        for call in m.get("tool_calls") or ():
            fn = call.get("function", {})
            parts.append(f"--- agent tool call {fn.get('name')} ---\n{fn.get('arguments')}")
    return "\n\n".join(parts)


_NO_EVIDENCE: Final[str] = (
    "[Host] Refused: your message asserts a result, but this session's record holds no "
    "evidence for it: no cell has finished ok since the task was given, no artifact was "
    "saved and no command receipt exists. Nothing is accepted that the Host's record does "
    "not back. Compute the result in a ```python cell, then call finalize_response.")
_FINALIZE_PLEASE: Final[str] = (
    "[Host] Your message states a result, but a plain message does not end the session. "
    "Call the finalize_response tool with this answer (summary or output) and 1 to 4 "
    "completion_bullets, so the Host can verify it against its record.")
_CUT_OFF: Final[str] = (
    "[Host] Your reply was cut off at the token limit before it held a complete ```python "
    "cell or a tool call. Send a shorter reply: one small cell at a time.")
_KEEP_GOING: Final[str] = (
    "[Host] Your reply has no ```python cell and no tool call. There is no person to answer "
    "questions: decide and continue with a cell, or call finalize_response when the task is "
    "done.")


_RESUMED: Final[str] = (
    "[Host] This session was resumed by a new Host process{how}. The kernel is now "
    "generation {generation}: nothing that lived in memory in an earlier generation "
    "exists any more (variables, imports, loaded data, open handles are gone). What "
    "survives: the workspace files, the artifacts saved in this session "
    "(host.artifacts()), and the record. Re-create what you need from files and "
    "artifacts before you use it.")
_UNANSWERED: Final[str] = (
    "[Host] No result: the run stopped before this call finished{how}. Cells it was "
    "running are recorded with status host_died; check the workspace before relying on "
    "what it did.")


def _validate(spec: ToolSpec, arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the tool's full schema, or None when they do."""
    from jsonschema import Draft202012Validator

    errors = sorted(Draft202012Validator(dict(spec.parameters)).iter_errors(dict(arguments)),
                    key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    return "; ".join(
        (f"{'.'.join(map(str, e.absolute_path))}: " if e.absolute_path else "") + e.message
        for e in errors[:5])


class _Session:
    """One agent session over one started Host. Used once, by :func:`run_agent`."""

    def __init__(self, host: Host, worker: HostThread, llm: ChatClient, task: str, *,
                 max_steps: int, token_budget: int, compact_at: float, stream: bool,
                 max_tokens: int | None, temperature: float | None,
                 cell_timeout: float | None, prices: Prices | None,
                 on_progress: Callable[[dict[str, Any]], None] | None,
                 blocks: list[Block], system_style: str | None, catalog: Any,
                 budget_usd: float | None, earlier: list[dict[str, Any]] | None,
                 follow_up: str | None, cancel: threading.Event | None,
                 parent: dict[str, str] | None = None) -> None:
        self.host = host
        self.worker = worker
        self.llm = llm
        self.max_steps = max_steps
        self.token_budget = token_budget
        self.compact_at = compact_at
        self.stream = stream
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.cell_timeout = cell_timeout
        self.prices = prices
        #: The system blocks the configuration gives (resolved before the Host started).
        self.blocks = blocks
        self.catalog = catalog
        self.budget_usd = budget_usd
        self.follow_up = follow_up
        self.cancel = cancel
        self.parent = parent
        config = getattr(llm, "config", None)
        self.model: str | None = getattr(config, "model", None)
        self.projection = Projection()
        self.state = ConversationState()
        #: The session's records from earlier runs (a resume), else None.
        self.resumed = earlier is not None
        for record in earlier or ():
            self.projection.feed(record)
            self.state.feed(record)
        self.events_path = host.record_dir / EVENTS_FILE
        listeners: list[Callable[[dict[str, Any]], None]] = [self.projection, self.state]
        if on_progress is not None:
            listeners.append(on_progress)
        self.log = EventLog(self.events_path, host.session_id, listeners,
                            start_seq=self.state.last_seq)
        self.step = self.projection.snapshot.steps
        self.requests = 0
        self.last_prompt_tokens: int | None = None
        self.last_verdict: Verdict | None = None
        #: How many of the Host's verdicts (Host.verdicts) the log has been told of.
        self._verdicts_seen = 0
        #: The ledger seq up to which sub-task events were reported.
        self._ledger_seen = max(host._appended, default=0)
        self.final_message: str | None = None
        self.generation = host.generation
        self.started_day = date.today().isoformat()
        self.task = task
        #: None: the session's own (recorded at its start, or at a resume that changed it).
        self.style_given = system_style
        self.conv = Conversation(self.state, self._anchors(),
                                 task_message(task, host.mode.name, host.mode.armed),
                                 system_style=system_style or self.state.system_style)
        #: Cells run through the execute tool in this step (their proposals: s<step>t<n>).
        self._tool_cells = 0
        delegator = host.delegator
        if delegator is not None and budget_usd is not None:
            delegator.budget_left = self._budget_left
        self._stopped_reply = False

    # -- the run

    def run(self) -> AgentResult:
        host, mode = self.host, self.host.mode
        outcome = Outcome.STEP_LIMIT
        reason: str | None = f"the step limit ({self.max_steps}) was reached"
        first = self.step
        try:
            if self.resumed:
                self._take_up()
            else:
                self.log.emit(SessionStarted(self.task, mode.name, mode.armed, self.model,
                                             str(host.workdir), str(host.record_dir),
                                             self.max_steps, self.token_budget, self.stream,
                                             self.conv.system_style, self.parent))
                for entry in initial_entries(self.blocks):
                    self.log.emit(SystemPromptEntry(entry.op, entry.text, entry.source))
                self.log.emit(UserInput(self.task))
            while self.step - first < self.max_steps:
                self._check_limits()
                self.step += 1
                if self._turn():
                    outcome, reason = Outcome.ACCEPTED, None
                    break
        except KeyboardInterrupt:
            outcome, reason = Outcome.INTERRUPTED, "interrupted by the user (Ctrl-C)"
            self.log.emit(UserInput("interrupt", source="interrupt"))
        except _BudgetExceeded as exc:
            outcome, reason = Outcome.BUDGET, str(exc)
        except _Cancelled as exc:
            outcome, reason = Outcome.CANCELLED, str(exc)
        except (LLMError, HostKernelError) as exc:
            where = "provider" if isinstance(exc, LLMError) else "host"
            outcome, reason = Outcome.ERROR, f"{type(exc).__name__}: {exc}"
            self.log.emit(ErrorEvent(where, type(exc).__name__, str(exc)[:2000]))
        except Exception as exc:  # noqa: BLE001 - a bug must still end the record cleanly
            outcome, reason = Outcome.ERROR, f"{type(exc).__name__}: {exc}"
            self.log.emit(ErrorEvent("loop", type(exc).__name__, str(exc)[:2000]))
        accepted = outcome is Outcome.ACCEPTED
        self.log.emit(SessionEnded(
            outcome.value, self.step, accepted,
            self.last_verdict.submission_id if self.last_verdict else None, reason))
        self.log.close()
        return AgentResult(outcome, self.last_verdict, self.step, host.session_id,
                           host.record_dir, self.events_path, self.projection.snapshot,
                           reason, self.final_message, self.resumed)

    def _take_up(self) -> None:
        """Resume: reconcile the system prompt, answer what the last run left open, and
        tell the model plainly what survived."""
        added = reconcile(self.state.entries, self.blocks)
        for entry in added:
            self.log.emit(SystemPromptEntry(entry.op, entry.text, entry.source))
        previous = self.projection.snapshot.outcome  # None: the last run never ended
        how = "" if previous is not None else " (the last run stopped without ending: it crashed)"
        self._close_crashed_run()
        for call_id in self.state.dangling_tool_calls():
            self._say({"role": "tool", "tool_call_id": call_id,
                       "content": _UNANSWERED.format(how=how)}, "resume")
        style = self.style_given if self.style_given not in (None, self.state.system_style) \
            else None
        self.log.emit(SessionResumed(previous, self.host.generation, self.max_steps, len(added),
                                     self.model, style))
        notice = _RESUMED.format(how=how, generation=self.host.generation)
        if self.state.history and self.state.history[-1].get("role") == "assistant" \
                and not self.state.history[-1].get("tool_calls"):
            notice += (" Your last reply was not answered before the run stopped; cells of it "
                       "that were running are recorded with status host_died.")
        if self.follow_up:
            self.log.emit(UserInput(self.follow_up, source="resume"))
            notice += "\n\n## Follow-up task\n" + self.follow_up
        self._say({"role": "user", "content": notice}, "resume")

    def _close_crashed_run(self) -> None:
        """What a crashed run left open in the stream: its running cells and tool calls
        are closed, as the Host closed them in its record (``host_died``)."""
        snap = self.projection.snapshot
        for cell in snap.cells:
            if cell.state in ("proposed", "running"):
                status = "host_died" if cell.state == "running" else "skipped"
                self.log.emit(CellCompleted(cell.proposal, cell.step, None, status, None, None,
                                            "the run stopped before this cell finished"))
        for call in snap.tool_calls:
            if call.state == "started":
                self.log.emit(ToolCallCompleted(call.call_id, call.name, "error",
                                                "the run stopped before this call finished"))

    def _say(self, message: dict[str, Any], source: str) -> None:
        """Add one message to the history: as an event, which the conversation folds."""
        self.log.emit(MessageAppended(message, source))

    def _anchors(self) -> SessionAnchors:
        workdir = str(self.host.workdir)
        return SessionAnchors(self.started_day, workdir, workdir,
                              read_git_head(workdir).describe(), self.generation,
                              str(self.host.record_dir))

    def _turn(self) -> bool:
        """One step; True when a submission was accepted."""
        self._maybe_compact()
        options = {"model": self.model, "max_tokens": self.max_tokens,
                   "temperature": self.temperature, "stream": self.stream, "tools": TOOLS}
        result = self.call_llm(self.conv.messages(), "turn", self.conv.layer_hashes(options),
                               tools=TOOLS, max_tokens=self.max_tokens)
        self.final_message = result.content
        call_ids = [c.id or f"call_{self.step}_{i}" for i, c in enumerate(result.tool_calls)]
        self._say(_assistant_message(result, call_ids), "model")
        cells = extract_cells(result.content)
        texts: list[str] = []
        accepted = False
        self._stopped_reply = False
        self._tool_cells = 0
        if cells:
            texts, accepted = self._run_cells(cells)
        for call_id, call in zip(call_ids, result.tool_calls, strict=True):
            content, ok = self._tool_call(call_id, call, already_accepted=accepted)
            accepted = accepted or ok
            self._say({"role": "tool", "tool_call_id": call_id, "content": content},
                      "tool_result")
        if accepted:
            return True
        if not cells and not result.tool_calls:
            texts = [_CUT_OFF if result.finish_reason == "length"
                     else self._plain_message(result.content)]
        if texts:
            self._say({"role": "user", "content": "\n\n".join(texts)}, "observation")
        return False

    # -- the model

    def call_llm(self, messages: Sequence[Mapping[str, Any]], purpose: str,
                 hashes: dict[str, str | None], *,
                 tools: Sequence[Mapping[str, Any]] | None = None,
                 max_tokens: int | None = None) -> ChatResult:
        self._check_limits()
        self.requests += 1
        request = self.projection.snapshot.requests + 1
        estimate = estimate_tokens(messages, tools or ())
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        self.log.emit(PromptRendered(request, purpose, self.step, hashes, len(messages), chars,
                                     estimate))
        t0 = time.monotonic()
        result = self.llm.chat(messages, tools=tools, max_tokens=max_tokens,
                               stream=self.stream, temperature=self.temperature)
        usage = result.usage
        cost, source = _provider_cost(result.raw), "provider"
        if cost is None and usage is not None and self.prices is not None:
            cost, source = self.prices.cost(usage.prompt_tokens, usage.completion_tokens), "prices"
        self.log.emit(ProviderBudget(
            request, purpose, result.model,
            None if usage is None else usage.prompt_tokens,
            None if usage is None else usage.completion_tokens,
            None if usage is None else usage.total_tokens,
            cost, source if cost is not None else None, round(time.monotonic() - t0, 6)))
        if purpose == "turn" and usage is not None:
            self.last_prompt_tokens = usage.prompt_tokens + usage.completion_tokens
        return result

    def _budget_left(self) -> float | None:
        """Dollars left of the budget now (a sub-task runs with them as its own)."""
        if self.budget_usd is None:
            return None
        return max(0.0, self.budget_usd - self.projection.snapshot.spend_usd)

    def _check_limits(self) -> None:
        """Before any provider call: stop when cut from outside or over the budget."""
        if self.cancel is not None and self.cancel.is_set():
            raise _Cancelled("the session was cut from outside (its time limit as a sub-task)")
        if self.budget_usd is None:
            return
        snap = self.projection.snapshot
        spent = snap.spend_usd
        if spent > self.budget_usd:
            unpriced = snap.costs.unpriced + snap.subtask_unpriced
            raise _BudgetExceeded(
                f"the priced spend ${spent:.6f} passed the budget ${self.budget_usd:.6f}; "
                f"{unpriced} provider call(s) reported no price and are not in that sum")

    # -- cells

    def _run_cells(self, cells: list[str], proposals: list[str] | None = None
                   ) -> tuple[list[str], bool]:
        """Run cells in order, each under its proposal id (``s<step>c<n>`` by default)."""
        proposals = proposals or [f"s{self.step}c{i + 1}" for i in range(len(cells))]
        for proposal, code in zip(proposals, cells, strict=True):
            self.log.emit(CellProposed(proposal, self.step, code))
        texts: list[str] = []
        stopped: int | None = None
        accepted = False
        for i, (proposal, code) in enumerate(zip(proposals, cells, strict=True)):
            if stopped is not None or accepted:
                self.log.emit(CellCompleted(proposal, self.step, None, "skipped", None, None))
                continue
            self.log.emit(CellStarted(proposal, self.step))
            obs, interrupted = self._execute(code)
            if obs is not None:
                self.log.emit(CellCompleted(proposal, self.step, obs.cell_id, obs.status,
                                            obs.generation, round(obs.duration, 6), obs.notice))
                self._record_facts(obs.cell_id)
            accepted = self._drain_verdicts()
            notice = self._check_generation(obs.cell_id if obs is not None else None)
            if interrupted or obs is None:
                raise KeyboardInterrupt
            head = f"[cell {i + 1} of {len(cells)}: {obs.status}]\n" if len(cells) > 1 else ""
            texts.append(head + (obs.text or "(no output)") + (notice or ""))
            if obs.status != "ok":
                stopped = i
                self._stopped_reply = True
        if stopped is not None and stopped + 1 < len(cells):
            texts.append(f"[Host] The {len(cells) - stopped - 1} later cell(s) of your reply were "
                         f"not run, because cell {stopped + 1} did not finish ok.")
        return texts, accepted

    def _execute(self, code: str) -> tuple[Observation | None, bool]:
        """Run one cell on the Host thread; on Ctrl-C interrupt the kernel and wait for it."""
        future = self.worker.submit(lambda: self.host.execute(code, timeout=self.cell_timeout))
        try:
            return future.result(), False
        except KeyboardInterrupt:
            self.worker.interrupt_kernel(self.host.kernel_pid)
            try:
                return future.result(timeout=INTERRUPT_WAIT), True
            except BaseException:  # noqa: BLE001 - a second Ctrl-C or a stuck kernel
                return None, True

    def _record_facts(self, cell_id: str) -> None:
        ledger, session = self.host.ledger, self.host.session_id
        if ledger is None:
            return
        for row in ledger.query("SELECT receipt_id, command, exit_status FROM receipts "
                                "WHERE cell_id = ? AND session = ? ORDER BY seq",
                                (cell_id, session)):
            self.log.emit(ReceiptRecorded(cell_id, row["receipt_id"], row["command"],
                                          row["exit_status"]))
        for row in ledger.query("SELECT artifact_id, filename, sha256, size FROM artifacts "
                                "WHERE cell_id = ? AND session = ? ORDER BY seq",
                                (cell_id, session)):
            self.log.emit(ArtifactSaved(cell_id, row["artifact_id"], row["filename"],
                                        row["sha256"], row["size"]))
        self._record_subtasks()

    def _record_subtasks(self) -> None:
        """The sub-tasks the Host started and collected since the last look."""
        ledger = self.host.ledger
        assert ledger is not None
        rows = ledger.query("SELECT seq, kind, body FROM events WHERE session = ? AND seq > ? "
                            "AND kind IN ('subtask_started', 'subtask_collected') ORDER BY seq",
                            (self.host.session_id, self._ledger_seen))
        for row in rows:
            self._ledger_seen = max(self._ledger_seen, row["seq"])
            body = json.loads(row["body"])
            if row["kind"] == "subtask_started":
                self.log.emit(SubtaskStarted(body["handle"], body["task"], body.get("cell_id"),
                                             body["folder"], body["record_dir"],
                                             int(body.get("depth", 1))))
            else:
                spend = body.get("spend") or {}
                self.log.emit(SubtaskFinished(body["handle"], body["outcome"],
                                              bool(body.get("accepted")), body.get("session"),
                                              spend.get("usd"), int(spend.get("priced", 0)),
                                              int(spend.get("unpriced", 0)), body.get("error")))

    def _check_generation(self, cell_id: str | None) -> str | None:
        """After a kernel restart: update the anchors and say so in the next message."""
        now = self.host.generation
        if now == self.generation:
            return None
        previous, self.generation = self.generation, now
        self.log.emit(KernelRestarted(previous, now, cell_id))
        self.conv.anchors = self._anchors()
        return (f"\n[Host] The kernel is now generation {now} (it was {previous}). Nothing that "
                f"lived in memory in generation {previous} exists any more; re-create what you "
                f"need from files and artifacts.")

    def _drain_verdicts(self) -> bool:
        """Emit the verdicts the Host gave since the last drain; True if one was accepted."""
        accepted = False
        given = self.host.verdicts(self._verdicts_seen)
        self._verdicts_seen += len(given)
        for verdict, cell_id in given:
            self.last_verdict = verdict
            failed = [c.code for c in verdict.failed if not c.advisory]
            self.log.emit(SubmissionVerdict(
                verdict.submission_id, verdict.accepted,
                "cell" if cell_id is not None else "finalize_response", cell_id, failed,
                verdict.mode, verdict.armed))
            accepted = accepted or verdict.accepted
        return accepted

    # -- tools

    def _tool_call(self, call_id: str, call: ToolCall, *,
                   already_accepted: bool) -> tuple[str, bool]:
        self.log.emit(ToolCallStarted(call_id, call.name, self.step, call.arguments_error))
        accepted = False
        outcome = "error"
        spec = TOOLS_BY_NAME.get(call.name)
        if already_accepted:
            content = ("not run: a submission from a cell of this reply was already accepted; "
                       "the session has ended")
        elif spec is None:
            content = (f"there is no tool named {call.name!r}. The tools are "
                       f"{', '.join(TOOLS_BY_NAME)}; or act by writing ```python cells.")
        else:
            problem = (f"its {call.arguments_error}. Send its arguments as one JSON object"
                       if call.arguments_error is not None else _validate(spec, call.arguments))
            if problem is not None:
                content = f"{call.name} was not run: {problem}."
                if spec.tier is Tier.RARE:
                    content += "\n" + self._load_tool(spec, "bad_arguments")
            else:
                outcome, content, accepted = self._run_tool(spec, call)
        self.log.emit(ToolCallCompleted(call_id, call.name, outcome, content[:2000]))
        return content, accepted

    def _load_tool(self, spec: ToolSpec, why: str) -> str:
        """Put a rare tool's schema into the loaded-tools block (once); say so."""
        if spec.name not in self.state.loaded_tools:
            self.log.emit(ToolLoaded(spec.name, why))
        return (f"The full arguments of {spec.name} are now in the loaded-tools block of your "
                f"context:\n" + json.dumps(spec.parameters, sort_keys=True, ensure_ascii=False))

    def _run_tool(self, spec: ToolSpec, call: ToolCall) -> tuple[str, str, bool]:
        """(outcome, content, accepted) of a call whose arguments fit the schema."""
        args = call.arguments
        name = spec.name
        if name == "finalize_response":
            submission, notes = submission_from_arguments(args)
            future = self.worker.submit(lambda: self.host.submit(submission))
            verdict = future.result()
            self._drain_verdicts()
            outcome = "accepted" if verdict.accepted else "refused"
            return outcome, verdict.explain() + "".join(f"\nNote: {n}." for n in notes), \
                verdict.accepted
        if name == "execute":
            if self._stopped_reply:
                return "error", ("not run: an earlier cell of this reply did not finish ok, "
                                 "so the rest of the reply is skipped"), False
            self._tool_cells += 1
            texts, accepted = self._run_cells([args["code"]],
                                              [f"s{self.step}t{self._tool_cells}"])
            return "ok", "\n\n".join(texts), accepted
        if name == "tool_view":
            target = TOOLS_BY_NAME.get(args["name"])
            if target is None:
                return "error", (f"there is no tool named {args['name']!r}; the tools are "
                                 f"{', '.join(TOOLS_BY_NAME)}"), False
            if target.tier is Tier.FREQUENT:
                return "ok", (f"{target.name} is a frequent tool: its full arguments are "
                              f"already in the tool map and the tools field."), False
            return "ok", self._load_tool(target, "tool_view"), False
        return self._skill_tool(name, args)

    def _skill_tool(self, name: str, args: Mapping[str, Any]) -> tuple[str, str, bool]:
        from ..skills import SkillError

        catalog = self.catalog
        if catalog is None:
            return "error", "no skills catalog is available in this session", False
        try:
            if name == "list_skills":
                page = catalog.list(args.get("collection"), args.get("offset", 0))
                return "ok", json.dumps(page.to_dict(), ensure_ascii=False, indent=1), False
            if name == "search_skills":
                hits = catalog.search(args["query"])
                return "ok", _render_hits(hits), False
            skill = catalog.get(args["name"])
            return "ok", f"# skill {skill.name} ({skill.collection})\n{skill.body}", False
        except SkillError as exc:
            return "error", str(exc), False

    # -- a plain final message

    def _plain_message(self, content: str) -> str:
        if self.host.mode.name != DEFAULT_MODE:
            return _KEEP_GOING
        asserts = self._gate(content)
        evidence = self._evidence()
        backed = any(evidence.values())
        self.log.emit(GateDecided(self.step, asserts, backed, evidence))
        if asserts is False:
            return _KEEP_GOING
        return _FINALIZE_PLEASE if backed else _NO_EVIDENCE

    def _gate(self, content: str) -> bool | None:
        """The conclusion gate's answer; None (treated as YES) when it cannot be had."""
        if not content.strip():
            return False
        try:
            answer = prompts.render("conclusion_gate", content, _Metered(self, "conclusion_gate"))
            return prompts.parse_gate(answer)
        except (LLMError, prompts.PromptAnswerError) as exc:
            self.log.emit(ErrorEvent("conclusion_gate", type(exc).__name__, str(exc)[:2000]))
            return None

    def _evidence(self) -> dict[str, int]:
        """What in this session's record could back a result: ok cells, artifacts, receipts."""
        ledger, session = self.host.ledger, self.host.session_id
        if ledger is None:
            return {"ok_cells": 0, "artifacts": 0, "receipts": 0}

        def count(sql: str) -> int:
            return int(ledger.query(sql, (session,))[0][0])

        return {
            "ok_cells": count("SELECT COUNT(*) FROM cells WHERE session = ? AND status = 'ok'"),
            "artifacts": count("SELECT COUNT(*) FROM artifacts WHERE session = ?"),
            "receipts": count("SELECT COUNT(*) FROM receipts WHERE session = ?"),
        }

    # -- compaction

    def _maybe_compact(self) -> None:
        conv, state = self.conv, self.state
        messages = conv.messages()
        estimate = max(estimate_tokens(messages, TOOLS), self.last_prompt_tokens or 0)
        if estimate < self.compact_at * self.token_budget:
            return
        last_assistant = max((i for i, m in enumerate(state.history)
                              if m.get("role") == "assistant"), default=0)
        if last_assistant == 0:
            return  # nothing older than the latest exchange to summarise
        older = state.history[:last_assistant]
        self.log.emit(CompactionStarted(self.step, estimate, self.token_budget, len(messages)))
        generation = self.host.generation
        lead = len(conv.system_messages())
        summarised = messages[lead:lead + 1] + ([messages[lead + 1]]
                                                if state.summary is not None else []) + older
        try:
            text = prompts.render("summary_fork", _transcript(summarised),
                                  _Metered(self, "summary_fork"), kernel_generation=generation)
        except LLMError as exc:
            self.log.emit(ErrorEvent("compaction", type(exc).__name__, str(exc)[:2000]))
            self.log.emit(CompactionCompleted(self.step, False, len(messages), 0, [], generation))
            return
        missing = prompts.check_summary(text)
        if missing:
            self.log.emit(ErrorEvent("compaction", "SummaryContract",
                                     f"the summary lacks heading(s) {', '.join(missing)}; "
                                     f"the history is kept as it was"))
            self.log.emit(CompactionCompleted(self.step, False, len(messages), len(text),
                                              missing, generation))
            return
        summary = (
            "## Summary of earlier work\n"
            "[Host] Older turns of this session were replaced by this summary. The Host's "
            f"fact, which overrides anything below: the kernel is at generation {generation}; "
            "only files, artifacts and the record survive a restart.\n\n" + text.strip())
        after = lead + 2 + len(state.history) - last_assistant
        self.last_prompt_tokens = None  # the provider's count described the longer history
        self.log.emit(CompactionCompleted(self.step, True, after, len(text), [], generation,
                                          summary, last_assistant))


def _render_hits(hits: Sequence[Any]) -> str:
    """search_skills' answer: the best matches with their bodies, the rest by name."""
    if not hits:
        return ("no skill shares a word with the query (the search is literal: try the "
                "surface words a skill would use, or list_skills)")
    parts = [f"{len(hits)} skill(s) matched:"]
    for i, hit in enumerate(hits):
        skill = hit.skill
        head = (f"- {skill.name} ({skill.collection}, score {hit.score}, matched "
                f"{', '.join(hit.matched)}): {skill.summary}")
        parts.append(head if i >= SEARCH_BODIES else
                     f"{head}\n```markdown\n{skill.body.strip()}\n```")
    return "\n".join(parts)


#: How many of the best search hits come with their bodies.
SEARCH_BODIES: Final[int] = 3


# ----------------------------------------------------------------------------- entry point


def _earlier_records(events_path: Path, session: str) -> list[dict[str, Any]]:
    if not events_path.is_file():
        return []
    return [r for r in read_records(events_path)
            if r is not None and r.get("session") == session]


def run_agent(
    task: str | None = None,
    *,
    workdir: str | Path,
    mode: str | None = None,
    llm: ChatClient,
    max_steps: int = DEFAULT_MAX_STEPS,
    record_dir: str | Path | None = None,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    compact_at: float = DEFAULT_COMPACT_AT,
    stream: bool = False,
    max_tokens: int | None = None,
    temperature: float | None = None,
    cell_timeout: float | None = None,
    prices: Prices | None = None,
    pool: HostPool | None = None,
    spare: bool = True,
    resume: str | None = None,
    budget_usd: float | None = None,
    system_layers: Layers | None = None,
    system_style: str | None = None,
    skills: Any = None,
    delegation: Any = None,
    cancel: threading.Event | None = None,
    on_host: Callable[[Host], None] | None = None,
    hide_paths: tuple[str | Path, ...] = (),
    parent: dict[str, str] | None = None,
    ledger: str | None = None,
    ledger_key: bytes | None = None,
    blobs: str | None = None,
) -> AgentResult:
    """Run one agent session on ``task`` in ``workdir`` and return how it ended.

    ``mode`` arms a task mode; without it the mode is detected from ``task``
    and only advises. ``llm`` is any :class:`~host_kernel.llm.ChatClient`
    (an :class:`~host_kernel.llm.LLMClient` for a real server). ``pool``
    (a :class:`~host_kernel.HostPool`) starts the kernel warm; ``spare`` keeps the
    next generation's kernel started, so a restart (asked for, or after the kernel
    died) is a swap. The session makes at most ``max_steps`` model turns;
    compaction runs when the conversation reaches ``compact_at * token_budget``
    estimated tokens. ``on_progress`` gets every event record as it is written
    (see :func:`.events.progress_line`). Ctrl-C is caught: the running cell is
    interrupted and recorded and the result's outcome is ``interrupted``.

    ``resume`` takes up an earlier session of the record (docs/agent.md): its
    conversation is rebuilt from its events, the system prompt reconciled with the
    SYSTEM.md files, a new kernel generation started; ``task``, if given, is a
    follow-up. ``budget_usd`` stops the run when the priced spend passes it.
    ``system_layers`` are the folders SYSTEM.md files come from (default: the
    package, ``$XDG_CONFIG_HOME/host_kernel``, ``WORKDIR/.host_kernel``);
    ``system_style`` is ``separate`` (leading system messages) or ``single`` (None:
    ``separate`` for a new session, the session's own on a resume).
    ``skills`` is a :class:`~host_kernel.skills.Catalog` (default: the three
    collections). ``delegation`` (a :class:`~.delegation.DelegationConfig`, or
    False) bounds ``host.delegate``. ``cancel``, when set, cuts the session before
    its next model call; ``on_host`` sees the started Host (for a parent that may
    have to interrupt its kernel); ``hide_paths`` are folders the confined kernel may
    not read (a sub-task's parent workspace); ``parent`` links a sub-task's events to
    the session and cell that delegated it. ``ledger``, ``ledger_key`` and ``blobs``
    go to the Host: a PostgreSQL ledger by URL, its record key, an fsspec blob store
    (docs/scale.md); the agent's own event stream stays in the record folder.
    """
    from ..skills import Catalog
    from .delegation import DelegationConfig, Delegator

    if resume is None and (not isinstance(task, str) or not task.strip()):
        raise ValueError("task must be a non-empty string")
    if task is not None and (not isinstance(task, str) or not task.strip()):
        raise ValueError("a follow-up task must be a non-empty string")
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    if token_budget < 1 or not 0 < compact_at <= 1:
        raise ValueError("token_budget must be positive and compact_at in (0, 1]")
    if budget_usd is not None and (isinstance(budget_usd, bool) or not isinstance(
            budget_usd, (int, float)) or budget_usd < 0):
        raise ValueError("budget_usd must be a non-negative number of dollars")
    if resume is not None and mode is not None:
        raise ValueError("a resumed session keeps its own mode; leave mode out")
    earlier = None
    if resume is not None:
        folder = Path(record_dir) if record_dir is not None else default_record_dir(
            Path(os.path.realpath(workdir)))
        earlier = _earlier_records(folder / EVENTS_FILE, resume)
        if not any(r.get("kind") == "session_started" for r in earlier):
            raise HostKernelError(f"no agent session {resume} in {folder / EVENTS_FILE}: only a "
                                  f"`host-kernel run` session can be resumed",
                                  code="unknown_session")
        ended = [r for r in earlier if r.get("kind") in ("session_ended", "session_resumed")]
        if task is None and ended and ended[-1].get("kind") == "session_ended" and (
                ended[-1].get("data") or {}).get("outcome") == "accepted":
            raise ValueError(f"session {resume} already ended with an accepted completion; "
                             f"give a follow-up task to continue it")
    if system_style is not None and system_style not in SYSTEM_STYLES:
        raise ValueError(f"system_style must be one of {', '.join(SYSTEM_STYLES)}")
    layers = system_layers or Layers.default(workdir)
    catalog = skills if skills is not None else Catalog.default(workdir)
    # Read before the Host starts: a SYSTEM.md that cannot be used stops nothing half-way.
    lines = catalog.catalog_lines() if len(catalog) else None
    blocks = resolve_blocks(layers, DEFAULT_SEED, host_block=host_block(lines))
    config = DelegationConfig() if delegation is None else delegation
    if config and config.cell_timeout is None and cell_timeout is not None:
        config = dataclasses.replace(config, cell_timeout=cell_timeout)
    delegator = Delegator(llm, config, prices=prices, system_layers=layers,
                          skills=catalog) if config else None
    host = Host(workdir, mode=mode, request=task if resume is None else None,
                record_dir=record_dir, front="agent", pool=pool, spare=spare, resume=resume,
                delegator=delegator, skills=catalog, hide_paths=hide_paths, ledger=ledger,
                ledger_key=ledger_key, blobs=blobs)
    worker = HostThread()  # made once the Host's arguments were accepted: never left running
    try:
        worker.call(host.start)
        if on_host is not None:
            on_host(host)
        original = task
        if earlier is not None:
            # Read again now that the Host holds the session: nothing can have been added.
            earlier = _earlier_records(host.record_dir / EVENTS_FILE, host.session_id)
            started = next(r for r in earlier if r.get("kind") == "session_started")
            original = str((started.get("data") or {}).get("task") or "")
        assert original is not None
        if delegator is not None:
            delegator.attach(host)
        session = _Session(host, worker, llm, original, max_steps=max_steps,
                           token_budget=token_budget, compact_at=compact_at, stream=stream,
                           max_tokens=max_tokens, temperature=temperature,
                           cell_timeout=cell_timeout, prices=prices, on_progress=on_progress,
                           blocks=blocks, system_style=system_style, catalog=catalog,
                           budget_usd=budget_usd, earlier=earlier,
                           follow_up=task if resume is not None else None, cancel=cancel,
                           parent=parent)
        return session.run()
    finally:
        if delegator is not None:
            delegator.shutdown()
        closing = worker.submit(host.close)
        try:
            closing.result(timeout=60)
        except BaseException:  # noqa: BLE001 - the Host thread is stuck: close from here
            host.close()
        worker.stop(timeout=5)
