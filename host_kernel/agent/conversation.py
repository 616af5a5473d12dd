"""The conversation as a fold of the agent's events, and the messages it renders to.

Owns :class:`ConversationState`, which folds an agent session's event records
(as :class:`~host_kernel.agent.events.EventLog` wrote them) into what the
model is sent: the system prompt's entries, the history messages, the
compaction summary, the loaded tools. The live loop feeds it from its log
(it is a listener), and a resume feeds it from the file: the same records,
the same fold, so a resumed session sends the bytes it sent before.

:class:`Conversation` renders a state, with the session's anchors and task
block, into ``messages``: the effective system blocks as leading system
messages (or one joined string for a provider that takes one), the first
user message (environment, task, loaded tools), the summary, the history.

It decides nothing and writes nothing: the loop emits, this module folds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .events import read_records
from .layers import SessionAnchors, loaded_tools_block
from .sysprompt import Entry, effective, join_single, to_openai

__all__ = ["SYSTEM_STYLES", "Conversation", "ConversationState", "rebuild"]

#: How the system blocks go out: ``separate`` leading system messages (OpenAI-compatible
#: chat), or ``single``, one system message joined with ``---`` (templates that take one).
SYSTEM_STYLES: Final[tuple[str, ...]] = ("separate", "single")


@dataclass
class ConversationState:
    """What an agent session's events say the model is sent. Fed one record at a time.

    Only what the messages need: how a session ran (its steps, its outcome) is the
    projection's (:mod:`.projection`).
    """

    entries: list[Entry] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: str | None = None
    loaded_tools: list[str] = field(default_factory=list)
    system_style: str = "separate"
    #: The last seq of the session's records (a resumed log goes on from it).
    last_seq: int = 0

    def __call__(self, record: Any) -> None:
        self.feed(record)

    def feed(self, record: Any) -> None:
        """Fold one record. Records of other kinds, and malformed ones, change nothing."""
        if not isinstance(record, Mapping):
            return
        seq = record.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            self.last_seq = max(self.last_seq, seq)
        data = record.get("data")
        if not isinstance(data, Mapping):
            return
        kind = record.get("kind")
        if kind in ("session_started", "session_resumed"):
            if data.get("system_style") in SYSTEM_STYLES:
                self.system_style = data["system_style"]
        elif kind == "system_prompt":
            op, text = data.get("op"), data.get("text")
            if op in ("append", "replace") and isinstance(text, str):
                source = data.get("source")
                self.entries.append(Entry(op, text, source if isinstance(source, str) else "",
                                          seq if isinstance(seq, int) else None))
        elif kind == "message":
            message = data.get("message")
            if isinstance(message, Mapping) and isinstance(message.get("role"), str):
                self.history.append(dict(message))
        elif kind == "compaction_completed":
            summary, dropped = data.get("summary"), data.get("dropped")
            if data.get("ok") and isinstance(summary, str) and isinstance(dropped, int):
                self.summary = summary
                self.history = self.history[dropped:]
        elif kind == "tool_loaded":
            name = data.get("name")
            if isinstance(name, str) and name not in self.loaded_tools:
                self.loaded_tools.append(name)

    @property
    def system_blocks(self) -> tuple[str, ...]:
        return effective(self.entries)

    def dangling_tool_calls(self) -> list[str]:
        """Ids of the last assistant message's tool calls that have no tool result."""
        for i in range(len(self.history) - 1, -1, -1):
            message = self.history[i]
            if message.get("role") != "assistant":
                continue
            answered = {m.get("tool_call_id") for m in self.history[i + 1:]
                        if m.get("role") == "tool"}
            calls = message.get("tool_calls")
            return [str(c["id"]) for c in calls if isinstance(c, Mapping)
                    and isinstance(c.get("id"), str) and c["id"] not in answered] \
                if isinstance(calls, list) else []
        return []


def rebuild(records: Iterable[Any] | str | Path, session: str) -> ConversationState:
    """The state of ``session`` after every record of it (an events file or its records)."""
    if isinstance(records, (str, Path)):
        records = read_records(records)
    state = ConversationState()
    for record in records:
        if isinstance(record, Mapping) and record.get("session") == session:
            state.feed(record)
    return state


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


class Conversation:
    """A session's state rendered into messages, with its anchors and task block.

    ``anchors`` changes only when a fact in it does (the kernel generation after a
    restart, a resume); everything else comes from ``state``, fed by the session's log.
    """

    def __init__(self, state: ConversationState, anchors: SessionAnchors, task_block: str,
                 *, system_style: str = "separate") -> None:
        if system_style not in SYSTEM_STYLES:
            raise ValueError(f"system_style must be one of {', '.join(SYSTEM_STYLES)}")
        self.state = state
        self.anchors = anchors
        self.task_block = task_block
        self.system_style = system_style

    def system_messages(self) -> list[dict[str, Any]]:
        blocks = self.state.system_blocks
        if self.system_style == "single":
            return [{"role": "system", "content": join_single(blocks)}] if blocks else []
        return list(to_openai(blocks))

    def first_user(self) -> str:
        text = self.anchors.render() + "\n\n" + self.task_block
        loaded = loaded_tools_block(self.state.loaded_tools)
        return text if loaded is None else text + "\n\n" + loaded

    def messages(self) -> list[dict[str, Any]]:
        out = self.system_messages()
        out.append({"role": "user", "content": self.first_user()})
        if self.state.summary is not None:
            out.append({"role": "user", "content": self.state.summary})
        out.extend(self.state.history)
        return out

    def layer_hashes(self, options: Mapping[str, Any]) -> dict[str, str | None]:
        """sha256 of each layer as it stands: the ``prompt_rendered`` event's payload."""
        system = self.system_messages()
        blocks = self.state.system_blocks
        loaded = loaded_tools_block(self.state.loaded_tools)
        return {
            "system": _sha(_canonical(system)),
            "base_system": _sha(_canonical(list(blocks[:-1]))),
            "tool_map": _sha(blocks[-1]) if blocks else None,
            "environment": _sha(self.anchors.render()),
            "task": _sha(self.task_block),
            "loaded_tools": None if loaded is None else _sha(loaded),
            "compaction_summary": None if self.state.summary is None
            else _sha(self.state.summary),
            "history": _sha(_canonical(self.state.history)),
            "request_options": _sha(_canonical(dict(options))),
        }
