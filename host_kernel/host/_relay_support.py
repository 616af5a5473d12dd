"""The Host's side of the control kernel: cells that arrive relayed from a Jupyter frontend.

Owns what the relay (``host_kernel.control.relay``) needs from a Host and
``Host.execute`` does not give it: minting and recording a cell for an
``execute_request`` the relay forwards (so the call channel attributes the
cell's calls to it), recording the cell when the kernel has finished it, a
kernel death noticed by the relay, interrupts and shutdowns asked for by the
frontend, and continuing a session across the relay process's own restart
(a frontend's restart replaces the kernel process it launched, which is the
relay). It does not own the wire: the relay moves the messages; this module
only records what they meant.

The relay forwards one ``execute_request`` at a time, so "the cell the Host is
running" is exact: the cell is begun here before its request leaves the relay
and finished only after the kernel's reply and idle status came back.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from .._errors import KernelError, RecordError
from .._ids import mint_cell_id
from ..store.ledger import check_chain
from ._cells import RunningCell, join
from ._host import Host, HostState

__all__ = ["KernelSockets", "RelayHost", "ResumeState"]


@dataclass(frozen=True, slots=True)
class ResumeState:
    """What a relay process hands to the next one when the frontend restarts the kernel.

    ``last_seq``/``last_hash`` anchor the record: the next process refuses to
    continue the session if the event at ``last_seq`` no longer has that hash,
    or if events of this session were appended after it.
    """

    session: str
    generation: int
    tokens: tuple[str, ...]
    last_seq: int
    last_hash: str

    def to_dict(self) -> dict[str, Any]:
        return {"session": self.session, "generation": self.generation,
                "tokens": list(self.tokens), "last_seq": self.last_seq,
                "last_hash": self.last_hash}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResumeState:
        return cls(str(data["session"]), int(data["generation"]),
                   tuple(str(t) for t in data.get("tokens", ())), int(data["last_seq"]),
                   str(data["last_hash"]))


@dataclass(frozen=True, slots=True)
class KernelSockets:
    """The current generation's client sockets, which the relay polls and sends on.

    ``session`` signs with the kernel's key; the shell and stdin sockets share one
    identity, so the kernel's ``input_request`` comes back to this relay.
    """

    generation: int
    shell: Any
    control: Any
    stdin: Any
    iopub: Any
    session: Any


@dataclass(slots=True)
class _Relayed:
    running: RunningCell
    started: float
    #: lineage's work on the cell's code, done while the kernel runs it (prepare_cell)
    prepared: Any = None


class RelayHost(Host):
    """A Host whose cells come from a frontend through the relay, not from ``execute``.

    ``RelayHost(workdir, mode=..., record_dir=..., resume=ResumeState | None)``;
    with ``resume`` it continues that session with its next generation (reason
    ``"restart"``) instead of starting a new one.
    """

    def __init__(self, workdir: Any, mode: str | None = None, record_dir: Any = None, *,
                 resume: ResumeState | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("front", "jupyter")
        super().__init__(workdir, mode=mode, record_dir=record_dir, **kwargs)
        self._resume = resume
        self._cell: _Relayed | None = None
        if resume is not None:
            self.record.session_id = resume.session

    # ------------------------------------------------------------------ session

    @property
    def resumed(self) -> bool:
        return self._resume is not None

    def _orders_first(self) -> bool:
        # A new session starts as a Host's does (Host._begin_session); one continued across
        # a frontend's restart reads its record before its kernel starts.
        return self._resume is None and self._record_not_needed_to_start()

    def _begin_session(self) -> None:
        if self._resume is None:
            super()._begin_session()
            return
        self._adopt(self._resume)
        self.generations.prior = self._resume.generation
        self.generations.old_tokens.update(self._resume.tokens)
        self.generations.start("restart")

    def _adopt(self, resume: ResumeState) -> None:
        """Take over the session's events as this process's anchor, if they are intact."""
        assert self.ledger is not None
        problems = check_chain(self.ledger)
        if problems:
            raise RecordError(f"cannot continue session {resume.session}: the chain is broken "
                              f"({problems[0]})")
        # Every event's seq and hash, but only the first one's body: a long session's
        # outputs are not read back just to continue it.
        rows = self.ledger.query("SELECT seq, hash FROM events WHERE session = ? ORDER BY seq",
                                 (resume.session,))
        mine = {r["seq"]: r["hash"] for r in rows}
        if mine.get(resume.last_seq) != resume.last_hash or max(mine, default=0) != resume.last_seq:
            raise RecordError(f"cannot continue session {resume.session}: its events are not "
                              f"the ones the previous relay process left")
        first = self.ledger.query("SELECT kind, body FROM events WHERE seq = ?",
                                  (rows[0]["seq"],))
        started = json.loads(first[0]["body"]) if first and first[0]["kind"] == "session_started" \
            else None
        if started is None or started.get("workdir") != str(self.workdir):
            raise RecordError(f"cannot continue session {resume.session} from {self.workdir}")
        self.session.adopt_started(started)
        self.record.appended = mine

    def suspend(self) -> ResumeState:
        """Stop the kernel and the record for a frontend restart, leaving the session open.

        Returns what the next relay process needs to continue the session.
        """
        self._require_open()
        assert self.generations.kernel is not None
        state = ResumeState(self.session_id, self.generations.kernel.generation,
                            tuple(sorted(self.generations.old_tokens | {self.generations.kernel.token})),
                            max(self.record.appended), self.record.appended[max(self.record.appended)])
        self._teardown()
        self.state = HostState.CLOSED
        return state

    # ------------------------------------------------------------------ kernel

    def kernel_sockets(self) -> KernelSockets:
        """The sockets of the generation running now (they change at every restart)."""
        self._require_open()
        kernel = self.generations.kernel
        if kernel is None:
            raise KernelError("no kernel generation is running")
        kc = kernel.client
        return KernelSockets(kernel.generation, kc.shell_channel.socket,
                             kc.control_channel.socket, kc.stdin_channel.socket,
                             kc.iopub_channel.socket, kc.session)

    @property
    def runtime_dir(self) -> Any:
        """The private folder of the call socket and the kernel's IPC channels."""
        return self.generations.runtime_dir

    def kernel_alive(self) -> bool:
        return self.generations.kernel is not None and self.generations.kernel.is_alive()

    def interrupt_kernel(self, via: str) -> None:
        """Interrupt the kernel with a signal (for frontends that signal the relay)."""
        self.note("interrupt_requested", via=via)
        if self.generations.kernel is not None:
            self.generations.kernel.interrupt()

    def note(self, kind: str, **body: Any) -> None:
        """Record a frontend action (interrupt, shutdown) against the running cell, if any."""
        cell = self._cell
        self.record.append(kind, {"generation": self.generation,
                            "cell_id": None if cell is None else cell.running.cell_id, **body})

    # ------------------------------------------------------------------ cells

    @property
    def relayed_cell(self) -> str | None:
        return None if self._cell is None else self._cell.running.cell_id

    def begin_cell(self, code: str, *, frontend_cell_id: str | None, silent: bool) -> str:
        """Mint and record a cell for an execute_request about to be forwarded; returns its id.

        From here until :meth:`finish_cell`, calls from the kernel are attributed to it.
        """
        self._require_open()
        if self._cell is not None:
            raise KernelError("a relayed cell is still running; the relay sends one at a time")
        kernel = self.generations.kernel
        assert kernel is not None
        cell_id = mint_cell_id()
        body: dict[str, Any] = {"cell_id": cell_id, "generation": kernel.generation,
                                "code": code, "frontend_cell_id": frontend_cell_id}
        if silent:
            body["silent"] = True
        self.record.append("cell_started", body)
        running = RunningCell.now(cell_id, kernel.generation, kernel.token, code)
        self._cell = _Relayed(running, time.monotonic())
        self.cells.running = running
        return cell_id

    def prepare_cell(self) -> None:
        """Lineage's work on the running cell's code, once the kernel has the cell: done
        while it runs, not after its reply, which the frontend waits for."""
        if self._cell is not None and self._cell.prepared is None:
            self._cell.prepared = self.cells.prepare(self._cell.running.code)

    def finish_cell(self, status: str, execution_count: int | None,
                    outputs: list[dict[str, Any]], *, dropped_chars: int = 0,
                    notice: str | None = None,
                    output_cut: dict[str, Any] | None = None,
                    idle_missing: bool = False, reply_missing: bool = False) -> None:
        """Record the relayed cell's end: its status, execution count and outputs
        (``idle_missing``, ``reply_missing``: the relay ended it without the kernel's idle
        status, or without its execute_reply)."""
        relayed = self._cell
        if relayed is None:
            return
        self.cells.running = None
        self._cell = None
        cell = relayed.running
        settled = self.cells.settle_commands(cell.cell_id)
        notice = settled if notice is None else join(settled, notice)
        access = self.cells.pending_access.pop(cell.cell_id, None)
        body: dict[str, Any] = {
            "cell_id": cell.cell_id, "status": status, "execution_count": execution_count,
            "outputs": [self.redactor.deep(o) for o in outputs],
            "duration": time.monotonic() - relayed.started, "notice": notice,
        }
        if idle_missing:
            body["idle_missing"] = True
        if reply_missing:
            body["reply_missing"] = True
        if dropped_chars:
            body["dropped_chars"] = dropped_chars
        if output_cut:
            body["output_cut"] = output_cut
        if access is not None:
            body["access"] = access
        body.update(self.cells.cell_lineage(cell, access, relayed.prepared))
        self.record.append("cell_finished", body)
        self.cells.refusals.flush()  # one count per cause of this cell's refused calls

    def kernel_died(self, execution_count: int | None = None,
                    outputs: list[dict[str, Any]] | None = None) -> str:
        """The relay found the kernel dead: start the next generation and record the cell.

        Returns the notice the frontend is shown (also kept in the cell's record).
        """
        self._require_open()
        old = self.generation
        self.generations.start("kernel_died")
        notice = (f"The kernel died (generation {old}). The Host started generation "
                  f"{self.generation}: every variable, import and object in memory is gone. "
                  f"What survives: workspace files, saved artifacts and the record.")
        self.finish_cell("kernel_died", execution_count, outputs or [], notice=notice)
        return notice

    def restart_kernel(self, reason: str) -> int:
        """A fresh kernel (new generation); the relayed cell, if any, is recorded as ended."""
        self.finish_cell("kernel_died", None, [],
                         notice=f"the kernel was restarted ({reason}) while this cell ran")
        return self.restart(reason)
