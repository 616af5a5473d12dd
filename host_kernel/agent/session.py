"""One agent session's state over its started Host, and its metered calls to the model.

Owns :class:`SessionCore`: the settings a session was given, its event log
and the two folds fed from it (the projection and the conversation state),
the counters the turn cycle keeps, and :meth:`SessionCore.call_llm`, the one
door to the provider (each call an event, priced, and refused once the
session is over its budget or cut from outside). The parts of the turn cycle
build on it: :mod:`.cells`, :mod:`.tools`, :mod:`.forks`, :mod:`.resume`;
:mod:`.loop` puts them together. It does not decide what a reply means.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import date
from typing import Any

from .._models import Verdict
from ..host._host import Host
from ..llm import ChatClient, ChatResult
from .conversation import Conversation, ConversationState
from .events import EVENTS_FILE, EventLog, MessageAppended, PromptRendered, ProviderBudget
from .layers import SessionAnchors, estimate_tokens, read_git_head, sha256_text, task_message
from .projection import Projection
from .result import BudgetExceeded, Cancelled, Prices
from .sysprompt import Block
from .worker import HostThread

__all__ = ["Metered", "SessionCore"]


class Metered:
    """A ChatClient that reports each call of one purpose to the session's events."""

    def __init__(self, session: SessionCore, purpose: str) -> None:
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


class SessionCore:
    """What one agent session holds over one started Host; :mod:`.loop` runs it."""

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
        self._ledger_seen = max(host.record.appended, default=0)
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

    def _say(self, message: dict[str, Any], source: str) -> None:
        """Add one message to the history: as an event, which the conversation folds."""
        self.log.emit(MessageAppended(message, source))

    def _anchors(self) -> SessionAnchors:
        workdir = str(self.host.workdir)
        return SessionAnchors(self.started_day, workdir, workdir,
                              read_git_head(workdir).describe(), self.generation,
                              str(self.host.record_dir))

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
            raise Cancelled("the session was cut from outside (its time limit as a sub-task)")
        if self.budget_usd is None:
            return
        snap = self.projection.snapshot
        spent = snap.spend_usd
        if spent > self.budget_usd:
            unpriced = snap.costs.unpriced + snap.subtask_unpriced
            raise BudgetExceeded(
                f"the priced spend ${spent:.6f} passed the budget ${self.budget_usd:.6f}; "
                f"{unpriced} provider call(s) reported no price and are not in that sum")
