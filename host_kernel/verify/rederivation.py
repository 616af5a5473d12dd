"""``rederive=True``: a claimed artifact is accepted only when its slice re-derives it.

Owns the ``not_rederived`` check: which artifacts the output claims (the same
claims :mod:`host_kernel.verify.claims` backs), asking ``runs`` to re-derive each
(the live Host runs the slice in a fresh confined kernel, see
:mod:`host_kernel.host._rederive`; ``audit`` answers from the sections the verdict
recorded), and turning each outcome into a check. It runs nothing itself.
"""

from __future__ import annotations

from typing import Any

from .checks import _Checks
from .claims import _claims
from .submission import Submission

__all__ = ["check_rederive"]

#: Most artifacts one submission may ask to re-derive.
MAX_REDERIVED = 20


def _claimed(out: Any, c: _Checks) -> list[Any]:
    by_id = {r["artifact_id"]: r for r in c.view.artifacts}
    by_name: dict[str, Any] = {}
    for r in c.view.artifacts:
        by_name[r["filename"]] = r
        if r["source_path"]:
            by_name[r["source_path"]] = r
    rows: dict[str, Any] = {}
    for claim in _claims(out) if isinstance(out, dict) else []:
        row = by_id.get(claim) or by_name.get(claim)
        if row is not None:
            rows.setdefault(row["artifact_id"], row)
    return list(rows.values())


def check_rederive(sub: Submission, c: _Checks, runs: Any, emit: Any) -> list[dict[str, Any]]:
    """Re-derive each claimed artifact when the submission asks; the sections to record."""
    if sub.rederive is None or sub.rederive is False:
        return []
    if sub.rederive is not True:
        c.fail("not_rederived", f"rederive must be True or False, not "
                                f"{type(sub.rederive).__name__}")
        return []
    rows = _claimed(sub.output, c)
    if not rows:
        c.fail("not_rederived", "rederive=True, but the output claims no artifact of this "
                                "session: name the artifact ids (or files saved as artifacts) "
                                "under a key such as 'artifacts'")
        return []
    if len(rows) > MAX_REDERIVED:
        c.fail("not_rederived", f"rederive=True asks for {len(rows)} artifacts; at most "
                                f"{MAX_REDERIVED} are re-derived per submission")
        return []
    rederive = getattr(runs, "rederive", None)
    if rederive is None:
        c.fail("not_rederived", "this Host cannot re-derive artifacts here")
        return []
    sections: list[dict[str, Any]] = []
    for row in rows:
        section = dict(rederive(row["artifact_id"], row["sha256"], emit))
        sections.append(section)
        outcome = section.get("outcome")
        name = f"artifact {row['artifact_id']} ({row['filename']})"
        if outcome == "reproduced":
            c.ok("not_rederived", f"{name} re-derived from its slice of "
                                  f"{len(section.get('cells') or ())} cell(s)")
        else:
            c.fail("not_rederived", f"{name} was not re-derived from its slice: {outcome}: "
                                    f"{str(section.get('detail', ''))[:600]}")
    return sections
