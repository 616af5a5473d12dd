"""Taking up an earlier session of the record: finding its events, and what the model is told.

Owns resume (docs/agent.md). Before any Host starts, :func:`resumable_records`
finds the session's events in the record folder and refuses a session that
is not an agent session, or one that already ended accepted with no
follow-up. Once the new Host holds the session, :class:`Resume` takes it up:
the system prompt is reconciled with the SYSTEM.md files, what a crashed run
left open (running cells, unanswered tool calls) is closed as the Host closed
it in its record, and the model is told plainly what survived the new kernel
generation. The fold of the earlier events into the conversation is
:mod:`.conversation`'s; the Host's own resume of its record is the Host's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

from .._errors import HostKernelError
from .._paths import default_record_dir
from .events import (
    EVENTS_FILE,
    CellCompleted,
    SessionResumed,
    SystemPromptEntry,
    ToolCallCompleted,
    UserInput,
    read_records,
)
from .session import SessionCore
from .sysprompt import reconcile

__all__ = ["Resume", "earlier_records", "resumable_records"]

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


def earlier_records(events_path: Path, session: str) -> list[dict[str, Any]]:
    """The records of ``session`` in the event stream at ``events_path`` (none: no file)."""
    if not events_path.is_file():
        return []
    return [r for r in read_records(events_path)
            if r is not None and r.get("session") == session]


def resumable_records(resume: str, task: str | None, *, workdir: str | Path,
                      record_dir: str | Path | None) -> list[dict[str, Any]]:
    """The events of session ``resume``, read before the Host starts; HostKernelError
    ``unknown_session`` when the record holds no agent session of that id, ValueError when
    it ended accepted and no follow-up ``task`` is given."""
    folder = Path(record_dir) if record_dir is not None else default_record_dir(
        Path(os.path.realpath(workdir)))
    earlier = earlier_records(folder / EVENTS_FILE, resume)
    if not any(r.get("kind") == "session_started" for r in earlier):
        raise HostKernelError(f"no agent session {resume} in {folder / EVENTS_FILE}: only a "
                              f"`host-kernel run` session can be resumed",
                              code="unknown_session")
    ended = [r for r in earlier if r.get("kind") in ("session_ended", "session_resumed")]
    if task is None and ended and ended[-1].get("kind") == "session_ended" and (
            ended[-1].get("data") or {}).get("outcome") == "accepted":
        raise ValueError(f"session {resume} already ended with an accepted completion; "
                         f"give a follow-up task to continue it")
    return earlier


class Resume(SessionCore):
    """A resumed session's first events, before its first turn."""

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
