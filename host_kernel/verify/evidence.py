"""Test evidence: the receipts a submission cites, and the hand-off to the reproducer.

Owns the checks of ``test_evidence`` (each entry names a finished cell of this
session, before the submitting one, holding a receipt for exactly that
command, which exited 0) and :func:`_reproduce`, which asks
host_kernel/reproduce to re-run the cited commands on the declared files. The
reproduction itself, and what its findings mean, live in host_kernel/reproduce.
"""

from __future__ import annotations

from typing import Any

from .._errors import HostCallError
from .._ids import is_cell_id
from ..modes import TaskMode
from ..reproduce import Emit, Request, Runs, reproduce_evidence
from .checks import _Checks
from .submission import Submission


def _check_evidence(sub: Submission, c: _Checks, source_paths: set[str]) -> None:
    view = c.view
    evidence = sub.test_evidence
    if evidence is None:
        return
    if not isinstance(evidence, list) or not evidence or len(evidence) > 1000 or not all(
            isinstance(e, dict) and isinstance(e.get("command"), str)
            and e.get("producing_cell_id") is not None for e in evidence):
        c.fail("test_evidence_malformed", "test_evidence must be a non-empty list of "
                                          "{'command': <exact string run with host.bash>, "
                                          "'producing_cell_id': <the id from that cell's "
                                          "[cell id: …] line>}")
        return
    for entry in evidence:
        command, cell_id = entry["command"], entry["producing_cell_id"]
        label = f"test evidence {command!r}"
        cell = view.cells.get(cell_id) if isinstance(cell_id, str) else None
        if cell is None:
            why = ("a number, like an execution count or cell index, is not a cell id"
                   if isinstance(cell_id, (int, float)) or (isinstance(cell_id, str)
                                                            and cell_id.strip().isdigit())
                   else "that id was not minted by this Host in this session"
                   if is_cell_id(cell_id) else "it is not a cell id")
            c.fail("cell_id_unknown", f"{label}: producing_cell_id {cell_id!r} is unknown "
                                      f"({why}); the real id is on the '[cell id: …]' line "
                                      f"that begins the Observation of the cell that ran the "
                                      f"command")
            continue
        if cell["seq_finished"] is None or cell["outputs"] is None:
            c.fail("cell_unfinished", f"{label}: cell {cell_id} has not finished, so its output "
                                      f"is not recorded; submit in a later cell")
        if cell["seq_started"] >= c.submit_seq or cell_id == c.submitting_cell:
            c.fail("evidence_after_submission", f"{label}: cell {cell_id} does not come before "
                                                f"the submitting cell; run the tests, then "
                                                f"submit in a later cell")
        receipts = [r for r in view.receipts.get(cell_id, []) if r["command"] == command]
        if not receipts:
            ran = [r["command"] for r in view.receipts.get(cell_id, [])]
            hint = (f"it ran {ran!r} through host.bash" if ran else
                    "it ran no command through host.bash (subprocess, os.system and printed "
                    "output leave no receipt)")
            c.fail("receipt_missing", f"{label}: cell {cell_id} holds no receipt for exactly "
                                      f"that command; {hint}")
            continue
        receipt = receipts[-1]
        _check_receipt(label, receipt, c)
        c.evidence.append((command, view.relative_cwd(receipt.get("cwd")),
                           receipt.get("duration")))


def _check_receipt(label: str, receipt: dict[str, Any], c: _Checks) -> None:
    """The agent really ran the command and it exited 0: history, not the acceptance
    (the reproduction decides that)."""
    if receipt.get("timed_out") or receipt.get("exit_status") != 0:
        how = ("timed out" if receipt.get("timed_out")
               else f"exited {receipt.get('exit_status')}")
        c.fail("exit_nonzero", f"{label}: the command {how}; fix the failure and run it again")


#: ``runs=`` for a verdict given before reproduction existed: ``audit`` re-verifies the
#: rest and says, as a warning, that the tests were judged by the older rules.
NOT_REPRODUCED: Any = object()


def _reproduce(c: _Checks, mode: TaskMode, runs: Runs | None, emit: Emit | None,
               network: bool) -> list[dict[str, Any]]:
    if runs is NOT_REPRODUCED:
        return []
    if runs is None:
        c.fail("reproduction_error", "nothing here can reproduce the test evidence, so it "
                                     "cannot be accepted")
        return []
    request = Request(mode.name, dict(c.sources), list(c.evidence), c.view.baseline, network)
    try:
        findings, sections = reproduce_evidence(request, runs, c.view.blobs, emit)
    except (OSError, HostCallError) as exc:
        c.fail("reproduction_error", f"the Host could not reproduce the test evidence: {exc}")
        return []
    for code, ok, message in findings:
        (c.ok if ok else c.fail)(code, message)
    return sections
