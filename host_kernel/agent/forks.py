"""The loop's two side requests to the model: the conclusion gate and the summary fork.

Owns :class:`Forks`. A plain message (no cell, no tool call) never ends a
session; in ``analysis_run`` the **conclusion gate** reads it first, and the
Host's record decides the answer: a message that asserts a result with no
evidence behind it (no ``ok`` cell, no artifact, no receipt) is refused and
told why, one that has evidence is asked for ``finalize_response``. Before a
request whose conversation nears the token budget, **compaction** runs the
summary fork on the older turns, with the Host's generation as the
authoritative kernel fact, and replaces them with the summary (when it holds
every heading the contract asks for). Both requests are metered like a turn.
The prompts themselves are :mod:`host_kernel.prompts`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from .. import prompts
from ..llm import LLMError
from ..modes import DEFAULT_MODE
from .events import CompactionCompleted, CompactionStarted, ErrorEvent, GateDecided
from .layers import TOOLS, estimate_tokens
from .session import Metered, SessionCore

__all__ = ["Forks"]


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
_KEEP_GOING: Final[str] = (
    "[Host] Your reply has no ```python cell and no tool call. There is no person to answer "
    "questions: decide and continue with a cell, or call finalize_response when the task is "
    "done.")


class Forks(SessionCore):
    """The conclusion gate on a plain message, and compaction before a long request."""

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
            answer = prompts.render("conclusion_gate", content, Metered(self, "conclusion_gate"))
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
                                  Metered(self, "summary_fork"), kernel_generation=generation)
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
