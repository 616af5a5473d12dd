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

import enum
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Final

from .. import prompts
from .._errors import HostKernelError
from .._models import Observation, Verdict
from ..host._host import Host
from ..host._pool import HostPool
from ..llm import ChatClient, ChatResult, LLMError, ToolCall
from ..modes import DEFAULT_MODE
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
    PromptRendered,
    ProviderBudget,
    ReceiptRecorded,
    SessionEnded,
    SessionStarted,
    SubmissionVerdict,
    ToolCallCompleted,
    ToolCallStarted,
    UserInput,
)
from .layers import (
    TOOLS,
    Conversation,
    SessionAnchors,
    estimate_tokens,
    extract_cells,
    read_git_head,
    sha256_text,
    submission_from_arguments,
    system_prefix,
    task_message,
)
from .projection import Projection, Snapshot
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


class _Session:
    """One agent session over one started Host. Used once, by :func:`run_agent`."""

    def __init__(self, host: Host, worker: HostThread, llm: ChatClient, task: str, *,
                 max_steps: int, token_budget: int, compact_at: float, stream: bool,
                 max_tokens: int | None, temperature: float | None,
                 cell_timeout: float | None, prices: Prices | None,
                 on_progress: Callable[[dict[str, Any]], None] | None) -> None:
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
        config = getattr(llm, "config", None)
        self.model: str | None = getattr(config, "model", None)
        self.projection = Projection()
        self.events_path = host.record_dir / EVENTS_FILE
        listeners: list[Callable[[dict[str, Any]], None]] = [self.projection]
        if on_progress is not None:
            listeners.append(on_progress)
        self.log = EventLog(self.events_path, host.session_id, listeners)
        self.step = 0
        self.requests = 0
        self.last_prompt_tokens: int | None = None
        self.last_verdict: Verdict | None = None
        #: How many of the Host's verdicts (Host.verdicts) the log has been told of.
        self._verdicts_seen = 0
        self.final_message: str | None = None
        self.generation = host.generation
        self.started_day = date.today().isoformat()
        self.task = task
        self.conv = Conversation(system_prefix(TOOLS), self._anchors(),
                                 task_message(task, host.mode.name, host.mode.armed))

    # -- the run

    def run(self) -> AgentResult:
        host, mode = self.host, self.host.mode
        self.log.emit(SessionStarted(self.task, mode.name, mode.armed, self.model,
                                     str(host.workdir), str(host.record_dir), self.max_steps,
                                     self.token_budget, self.stream))
        self.log.emit(UserInput(self.task))
        outcome = Outcome.STEP_LIMIT
        reason: str | None = f"the step limit ({self.max_steps}) was reached"
        try:
            while self.step < self.max_steps:
                self.step += 1
                if self._turn():
                    outcome, reason = Outcome.ACCEPTED, None
                    break
        except KeyboardInterrupt:
            outcome, reason = Outcome.INTERRUPTED, "interrupted by the user (Ctrl-C)"
            self.log.emit(UserInput("interrupt", source="interrupt"))
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
                           reason, self.final_message)

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
        self.conv.history.append(_assistant_message(result, call_ids))
        cells = extract_cells(result.content)
        texts: list[str] = []
        accepted = False
        if cells:
            texts, accepted = self._run_cells(cells)
        for call_id, call in zip(call_ids, result.tool_calls, strict=True):
            content, ok = self._tool_call(call_id, call, already_accepted=accepted)
            accepted = accepted or ok
            self.conv.history.append({"role": "tool", "tool_call_id": call_id,
                                      "content": content})
        if accepted:
            return True
        if not cells and not result.tool_calls:
            texts = [_CUT_OFF if result.finish_reason == "length"
                     else self._plain_message(result.content)]
        if texts:
            self.conv.history.append({"role": "user", "content": "\n\n".join(texts)})
        return False

    # -- the model

    def call_llm(self, messages: Sequence[Mapping[str, Any]], purpose: str,
                 hashes: dict[str, str | None], *,
                 tools: Sequence[Mapping[str, Any]] | None = None,
                 max_tokens: int | None = None) -> ChatResult:
        self.requests += 1
        request = self.requests
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

    # -- cells

    def _run_cells(self, cells: list[str]) -> tuple[list[str], bool]:
        proposals = [f"s{self.step}c{i + 1}" for i in range(len(cells))]
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
        if already_accepted:
            outcome, content = "error", ("not run: a submission from a cell of this reply was "
                                         "already accepted; the session has ended")
        elif call.name != "finalize_response":
            outcome, content = "error", (f"there is no tool named {call.name!r}. The only tool "
                                         f"is finalize_response; act by writing ```python cells.")
        elif call.arguments_error is not None:
            outcome, content = "error", (f"finalize_response was not run: its {call.arguments_error}"
                                         f". Send its arguments as one JSON object.")
        else:
            submission, notes = submission_from_arguments(call.arguments)
            future = self.worker.submit(lambda: self.host.submit(submission))
            verdict = future.result()
            self._drain_verdicts()
            accepted = verdict.accepted
            outcome = "accepted" if accepted else "refused"
            content = verdict.explain() + "".join(f"\nNote: {n}." for n in notes)
        self.log.emit(ToolCallCompleted(call_id, call.name, outcome, content[:2000]))
        return content, accepted

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
        conv = self.conv
        messages = conv.messages()
        estimate = max(estimate_tokens(messages, TOOLS), self.last_prompt_tokens or 0)
        if estimate < self.compact_at * self.token_budget:
            return
        last_assistant = max((i for i, m in enumerate(conv.history)
                              if m.get("role") == "assistant"), default=0)
        if last_assistant == 0:
            return  # nothing older than the latest exchange to summarise
        older, kept = conv.history[:last_assistant], conv.history[last_assistant:]
        self.log.emit(CompactionStarted(self.step, estimate, self.token_budget, len(messages)))
        generation = self.host.generation
        summarised = messages[1:2] + ([messages[2]] if conv.summary is not None else []) + older
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
        conv.summary = (
            "## Summary of earlier work\n"
            "[Host] Older turns of this session were replaced by this summary. The Host's "
            f"fact, which overrides anything below: the kernel is at generation {generation}; "
            "only files, artifacts and the record survive a restart.\n\n" + text.strip())
        conv.history = kept
        self.last_prompt_tokens = None  # the provider's count described the longer history
        self.log.emit(CompactionCompleted(self.step, True, len(conv.messages()), len(text), [],
                                          generation))


# ----------------------------------------------------------------------------- entry point


def run_agent(
    task: str,
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
) -> AgentResult:
    """Run one agent session on ``task`` in ``workdir`` and return how it ended.

    ``mode`` arms a task mode; without it the mode is detected from ``task``
    and only advises. ``llm`` is any :class:`~host_kernel.llm.ChatClient`
    (an :class:`~host_kernel.llm.LLMClient` for a real server). ``pool``
    (a :class:`~host_kernel.HostPool`) starts the kernel warm; ``spare`` keeps the
    next generation's kernel started, so a restart (asked for, or after the kernel
    died) is a swap. The session
    makes at most ``max_steps`` model turns; compaction runs when the
    conversation reaches ``compact_at * token_budget`` estimated tokens.
    ``on_progress`` gets every event record as it is written (see
    :func:`.events.progress_line`). Ctrl-C is caught: the running cell is interrupted
    and recorded and the result's outcome is ``interrupted``.
    """
    if not isinstance(task, str) or not task.strip():
        raise ValueError("task must be a non-empty string")
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    if token_budget < 1 or not 0 < compact_at <= 1:
        raise ValueError("token_budget must be positive and compact_at in (0, 1]")
    worker = HostThread()
    host = Host(workdir, mode=mode, request=task, record_dir=record_dir, front="agent",
                          pool=pool, spare=spare)
    try:
        worker.call(host.start)
        session = _Session(host, worker, llm, task, max_steps=max_steps, token_budget=token_budget,
                           compact_at=compact_at, stream=stream, max_tokens=max_tokens,
                           temperature=temperature, cell_timeout=cell_timeout, prices=prices,
                           on_progress=on_progress)
        return session.run()
    finally:
        closing = worker.submit(host.close)
        try:
            closing.result(timeout=60)
        except BaseException:  # noqa: BLE001 - the Host thread is stuck: close from here
            host.close()
        worker.stop(timeout=5)

