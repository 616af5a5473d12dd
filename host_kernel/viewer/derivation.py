"""What the record viewer shows of an artifact's slice and of its re-derivations.

Owns turning :func:`~host_kernel.lineage.slice.compute_slice` (read from the
verified ledger the page already holds) into plain values for the artifact
page ("N of M cells", each cell with why it is there, the inputs, what cannot be
re-run), the slice as a script or notebook to download, and the record's
``artifact_rederived`` events (the body :meth:`Rederivation.record_body
<host_kernel.host._rederive.Rederivation.record_body>` writes) as the latest
outcome of each artifact, for the artifact page and the session page's badges.

It runs nothing (a re-derivation is ``host-kernel rederive`` or
``Host.rederive``), renders no HTML (the templates do, autoescaped) and writes
nothing. Every value from the record is untrusted text and is handed on as text;
a field of an unexpected type is shown as absent rather than trusted.
"""

from __future__ import annotations

import json
from typing import Any

from .._errors import FileProblem
from ..lineage.slice import Slice, compute_slice
from ..store.ledger import Ledger
from .pages import NotFound, cell_link, seconds, when

__all__ = [
    "OUTCOME_BADGES",
    "mark_rederivations",
    "rederivation_section",
    "rederivations",
    "slice_notebook",
    "slice_script",
    "slice_section",
]

#: The outcomes a re-derivation records, and the badge each is drawn with; any other
#: value is drawn as a warning.
OUTCOME_BADGES = {"reproduced": "good", "differs": "bad", "failed": "bad",
                  "lineage_incomplete": "warn"}
#: How many characters of a sha256 the page shows (the full one is its tooltip).
SHORT_SHA = 12


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _text(value: Any) -> str:
    return "" if value is None else str(value)


# --------------------------------------------------------------------------- the slice


def _slice(ledger: Ledger, artifact_id: str) -> Slice:
    """The artifact's slice; NotFound (the download's 404) when there is none, saying why."""
    if not ledger.query("SELECT 1 FROM artifacts WHERE artifact_id = ?", (artifact_id,)):
        raise NotFound(f"no artifact {artifact_id!r} in this record")
    try:
        return compute_slice(ledger, artifact_id)
    except FileProblem as exc:
        raise NotFound(f"no slice: {exc.message}") from None


def slice_section(ledger: Ledger, artifact_id: str) -> dict[str, Any]:
    """The artifact page's slice: ``problem`` (why there is none) or its cells, inputs and
    what cannot be re-derived here. Each cell links into its session's timeline when the
    record holds that cell."""
    try:
        sliced = compute_slice(ledger, artifact_id)
    except FileProblem as exc:
        return {"problem": exc.message}
    shown = {r["cell_id"] for r in ledger.query("SELECT cell_id FROM cells WHERE session = ?",
                                                (sliced.session,))}
    cells = []
    previous: int | None = None
    for cell in sliced.cells:
        cells.append({
            "id": cell.cell_id, "generation": cell.generation, "why": cell.why,
            "code": cell.code, "status": cell.status,
            "restarted": previous is not None and cell.generation != previous,
            "link": (cell_link(ledger, sliced.session, cell.cell_id)
                     if cell.cell_id in shown else None),
        })
        previous = cell.generation
    return {
        "problem": None, "count": len(sliced.cells), "of": sliced.session_cells,
        "session": sliced.session, "cells": cells,
        "inputs": [{"path": i.path, "sha256": i.sha256, "short": i.sha256[:SHORT_SHA]}
                   for i in sliced.inputs],
        "unsupported": list(sliced.unsupported), "notes": list(sliced.notes),
        "makes": list(sliced.makes),
    }


def slice_script(ledger: Ledger, artifact_id: str) -> tuple[str, bytes]:
    """The download name and bytes of the slice as a Python script (:meth:`Slice.to_script`)."""
    sliced = _slice(ledger, artifact_id)
    return f"{sliced.filename}.slice.py", sliced.to_script().encode("utf-8")


def slice_notebook(ledger: Ledger, artifact_id: str) -> tuple[str, bytes]:
    """The download name and bytes of the slice as an nbformat v4 notebook
    (:meth:`Slice.to_notebook`)."""
    sliced = _slice(ledger, artifact_id)
    text = json.dumps(sliced.to_notebook(), indent=1) + "\n"  # as `host-kernel slice` writes it
    return f"{sliced.filename}.slice.ipynb", text.encode("utf-8")


# --------------------------------------------------------------------------- re-derivations


def rederivations(ledger: Ledger, artifact_id: str | None = None
                  ) -> dict[str, dict[str, Any]]:
    """The latest ``artifact_rederived`` event of each artifact (or of ``artifact_id``), in
    any session of the record, as the page shows it (see :func:`_rederivation`)."""
    latest: dict[str, dict[str, Any]] = {}
    for row in ledger.query("SELECT seq, ts, session, body FROM events "
                            "WHERE kind = 'artifact_rederived' ORDER BY seq"):
        try:
            body = json.loads(row["body"])
        except ValueError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("artifact_id"), str):
            continue
        if artifact_id is not None and body["artifact_id"] != artifact_id:
            continue
        latest[body["artifact_id"]] = _rederivation(body, row)
    return latest


def _rederivation(body: dict[str, Any], row: Any) -> dict[str, Any]:
    outcome = _text(body.get("outcome")) or "unknown"
    comparison = body.get("comparison") if isinstance(body.get("comparison"), dict) else None
    not_needed = body.get("not_needed")
    took = body.get("seconds")
    return {
        "outcome": outcome, "badge": OUTCOME_BADGES.get(outcome, "warn"),
        "detail": _text(body.get("detail")),
        "cells": _strings(body.get("cells")),
        "session_cells": body.get("session_cells") if isinstance(
            body.get("session_cells"), int) else None,
        "missing": _strings(body.get("missing")),
        "not_needed": _strings(not_needed) if isinstance(not_needed, list) else None,
        "seconds": seconds(float(took)) if isinstance(took, (int, float)) else "",
        "comparison": None if comparison is None else {
            k: _text(comparison.get(k)) for k in ("outcome", "kind", "summary", "diff", "hint")},
        "when": when(row["ts"]), "session": row["session"], "seq": row["seq"],
    }


def rederivation_section(ledger: Ledger, artifact_id: str) -> dict[str, Any] | None:
    """The artifact's latest re-derivation as the page shows it; None when it has none."""
    return rederivations(ledger, artifact_id).get(artifact_id)


def mark_rederivations(ledger: Ledger, page: dict[str, Any]) -> dict[str, Any]:
    """A session page (:func:`~host_kernel.viewer.pages.session_page`) with each listed
    artifact given ``rederived``: its latest re-derivation, or None."""
    latest = rederivations(ledger)
    for item in page.get("timeline", ()):
        for artifact in item.get("artifacts", ()):
            artifact["rederived"] = latest.get(artifact["id"])
    return page
