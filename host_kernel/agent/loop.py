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

The turn cycle and :func:`run_agent` are this module's; the parts a turn
runs each live in their own: :mod:`.session` (the session's state and its
metered model calls), :mod:`.cells`, :mod:`.tools`, :mod:`.forks` (the
conclusion gate and compaction), :mod:`.resume`, and :mod:`.result` (what
it returns). Sub-tasks are run by a :class:`~.subtasks.SubtaskRunner` given
:func:`run_agent` itself.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from .._errors import HostKernelError
from ..host._host import Host
from ..host._options import HostOptions
from ..host._pool import HostPool
from ..llm import ChatClient, ChatResult, LLMError
from .conversation import SYSTEM_STYLES
from .events import (
    EVENTS_FILE,
    ErrorEvent,
    SessionEnded,
    SessionStarted,
    SystemPromptEntry,
    UserInput,
)
from .forks import Forks
from .layers import DEFAULT_SEED, TOOLS, extract_cells, host_block
from .result import AgentResult, BudgetExceeded, Cancelled, Outcome, Prices
from .resume import Resume, earlier_records, resumable_records
from .subtasks import DelegationConfig, SubtaskRunner
from .sysprompt import Layers, initial_entries, resolve_blocks
from .tools import ToolCalls
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

_CUT_OFF: Final[str] = (
    "[Host] Your reply was cut off at the token limit before it held a complete ```python "
    "cell or a tool call. Send a shorter reply: one small cell at a time.")


def _assistant_message(result: ChatResult, call_ids: list[str]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function",
             "function": {"name": call.name, "arguments": call.raw_arguments or "{}"}}
            for cid, call in zip(call_ids, result.tool_calls, strict=True)]
    return message



# ----------------------------------------------------------------------------- the session


class _Session(ToolCalls, Forks, Resume):
    """One agent session over one started Host. Used once, by :func:`run_agent`."""

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
        except BudgetExceeded as exc:
            outcome, reason = Outcome.BUDGET, str(exc)
        except Cancelled as exc:
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


# ----------------------------------------------------------------------------- entry point


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
    baseline: str | None = None,
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
    ``baseline`` names the revision a ``codebase_change`` session is judged against
    (``Host(baseline=)``, docs/verification.md).
    """
    from ..skills import Catalog

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
        earlier = resumable_records(resume, task, workdir=workdir, record_dir=record_dir)
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
    # The runner's children are sessions of this very function.
    delegator = SubtaskRunner(llm, config, run_child=run_agent, prices=prices,
                              system_layers=layers, skills=catalog) if config else None
    options = HostOptions(front="agent", pool=pool, spare=spare, resume=resume,
                          delegator=delegator, skills=catalog,
                          hide_paths=tuple(map(str, hide_paths)), ledger=ledger,
                          ledger_key=ledger_key, blobs=blobs, baseline=baseline)
    host = Host(workdir, mode=mode, request=task if resume is None else None,
                record_dir=record_dir, options=options)
    worker = HostThread()  # made once the Host's arguments were accepted: never left running
    try:
        worker.call(host.start)
        if on_host is not None:
            on_host(host)
        original = task
        if earlier is not None:
            # Read again now that the Host holds the session: nothing can have been added.
            earlier = earlier_records(host.record_dir / EVENTS_FILE, host.session_id)
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
