"""Running a reply's cells on the Host, and telling the event log what the record gained.

Owns :class:`CellRunner`: each cell proposed, started and completed as events,
run through ``Host.execute`` on the Host thread (Ctrl-C interrupts the kernel
and the cell is recorded as usual); after each, the receipts, artifacts and
sub-tasks the ledger gained, the Host's verdicts (a ``host.submit_output``
in the cell) and a kernel restart. It does not read the reply (the loop
finds the cells) and decides no acceptance: the verdicts are the Host's.
"""

from __future__ import annotations

import json
from typing import Final

from .._models import Observation
from .events import (
    ArtifactSaved,
    CellCompleted,
    CellProposed,
    CellStarted,
    KernelRestarted,
    ReceiptRecorded,
    SubmissionVerdict,
    SubtaskFinished,
    SubtaskStarted,
)
from .session import SessionCore

__all__ = ["INTERRUPT_WAIT", "CellRunner"]

#: Seconds to wait for an interrupted cell to come back before giving up on it.
INTERRUPT_WAIT: Final[float] = 10.0


class CellRunner(SessionCore):
    """The cells of a reply (or of the execute tool), run in order on the Host."""

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
