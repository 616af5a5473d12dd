"""Test evidence: the receipts a submission cites, and the hand-off to the reproducer.

Owns the checks of ``test_evidence`` (each entry names a finished cell of this
session, before the submitting one, holding a receipt for exactly that
command, which exited 0), of ``intended_changes`` (each a baseline test and a
reason, shown first in the verdict for a reviewer), and :func:`_reproduce`,
which asks host_kernel/reproduce to re-run the cited commands on the declared
files, handing it what the record says this session wrote (for
``test_undeclared``). The reproduction itself, and what its findings mean, live
in host_kernel/reproduce.
"""

from __future__ import annotations

from typing import Any

from .._errors import HostCallError
from .._ids import is_cell_id
from .._models import Check
from ..modes import TaskMode
from ..reproduce import Emit, Request, Runs, reproduce_evidence, test_role
from .checks import _Checks
from .submission import Submission

#: Bounds of the intended_changes declaration.
MAX_INTENDED = 200
MAX_REASON = 2000


def _check_evidence(sub: Submission, c: _Checks, source_paths: set[str]) -> None:
    view = c.view
    _check_intended(sub, c)
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


def _intended(value: Any) -> list[tuple[str, str]] | None:
    """intended_changes as (test, reason) pairs; None when it is not that shape."""
    if not isinstance(value, list) or len(value) > MAX_INTENDED:
        return None
    out: list[tuple[str, str]] = []
    for item in value:
        if not isinstance(item, dict):
            return None
        test, reason = item.get("test"), item.get("reason")
        if not isinstance(test, str) or not test.strip() or len(test) > 1000 or \
                not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
            return None
        out.append((test.strip(), reason.strip()))
    return out


def _check_intended(sub: Submission, c: _Checks) -> None:
    # Kept on the tally for _reproduce, which verifier.py calls without the submission.
    setattr(c, "intended", _intended(sub.intended_changes) or [])  # noqa: B010
    if sub.intended_changes is None:
        return
    if _intended(sub.intended_changes) is None:
        c.fail("intended_changes", f"intended_changes must be a list of at most "
                                   f"{MAX_INTENDED} {{'test': <a baseline test's node id or "
                                   f"file>, 'reason': <why its behaviour changes, at most "
                                   f"{MAX_REASON} characters>}}, each with both filled in")


def _show_intended(c: _Checks) -> list[tuple[str, str]]:
    """The declared intended changes, listed first among the checks, for a reviewer."""
    intended: list[tuple[str, str]] = getattr(c, "intended", [])
    if not intended:
        return []
    shown = "; ".join(f"{test}: {reason}" for test, reason in intended[:20])
    more = f" (and {len(intended) - 20} more)" if len(intended) > 20 else ""
    c.items.insert(0, Check("intended_changes", True, f"the change means to alter the "
                                                      f"behaviour these baseline tests check, "
                                                      f"for these reasons (read them first): "
                                                      f"{shown}{more}", c.advisory))
    return intended


def _written_tests(c: _Checks) -> dict[str, tuple[str, bytes | None]]:
    """Test files and test configuration the record says this session wrote, with their
    bytes' hash now; one removed since is left out (its hash None where it was looked at)."""
    out: dict[str, tuple[str, bytes | None]] = {}
    for rel in sorted(c.view.session_writes())[:10_000]:
        role = test_role(rel)
        if role not in ("test", "conftest", "config") or not c.files.inside(rel):
            continue
        sha = c.files.sha256(rel)
        if sha is None:
            if c.files.knows(rel):
                continue  # written, then removed before submitting
            sha = ""  # audit of a verdict that never looked: it may exist
        out[rel] = (sha, c.files.source(rel) if role == "config" and sha else None)
    return out


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
    intended = _show_intended(c)
    request = Request(mode.name, dict(c.sources), list(c.evidence), c.view.baseline, network,
                      written=_written_tests(c), intended=intended)
    try:
        findings, sections = reproduce_evidence(request, runs, c.view.blobs, emit)
    except (OSError, HostCallError) as exc:
        c.fail("reproduction_error", f"the Host could not reproduce the test evidence: {exc}")
        return []
    for code, ok, message in findings:
        (c.ok if ok else c.fail)(code, message)
    return sections
