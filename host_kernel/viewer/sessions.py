"""What the viewer's sessions list and session page show, a page at a time.

Owns the sessions list (each session told apart by its notebook, workspace,
request, mode, duration and status; searched with ``q``, filtered by status and
kind, fifty to a page) and one session's page (its facts, then its cells in
order, two hundred to a page, searched in their code and outputs and filtered
by status and by what they hold). A session page reads only the cells of the
page it shows: the cells are taken from the projection with SQL ``LIMIT`` and
``OFFSET``, and what is attached to them (receipts, artifacts, writes, loads,
refusals, submissions, each cell's ``cell_finished`` event) is read for those
cells alone, so a page costs the same in a session of ten cells or ten thousand.

It reads a verified ledger it is given and renders no HTML (the templates do).
Every value from the record is untrusted text.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..store.ledger import Ledger
from .pages import (
    CELLS_PER_PAGE,
    FAILED,
    NotFound,
    choose_output,
    receipt_summary,
    seconds,
    size,
    when,
)
from .verdicts import verdict_card

__all__ = ["CELLS_PER_PAGE", "CELL_KINDS", "SESSIONS_PER_PAGE", "SESSION_STATUSES", "Query",
           "session_page", "sessions_page"]

SESSIONS_PER_PAGE = 50
#: A session's status, as the list shows and filters it: its last verdict, or none.
SESSION_STATUSES = ("accepted", "refused", "no submission", "open")
#: What a cell can be filtered by holding: the name shown, and its projection table.
CELL_KINDS = {"receipt": "receipts", "artifact": "artifacts", "write": "writes",
              "load": "loads", "refusal": "refusals", "submission": "submissions"}
CELL_STATUSES = ("ok", "error", "timeout", "kernel_died", "host_died", "interrupted",
                 "running")
_WORDS = re.compile(r'"([^"]*)"|(\S+)')
#: Characters of a request the list shows (the whole is its tooltip).
REQUEST_CHARS = 140


@dataclass(frozen=True, slots=True)
class Query:
    """A page's search (``q``), filters and page number, as the request gave them."""

    q: str = ""
    status: str = ""
    kind: str = ""
    page: int = 1

    @classmethod
    def of(cls, params: Any) -> Query:
        """From a request's query parameters; a page that is not a number is page 1."""
        try:
            page = max(1, int(str(params.get("page") or 1)))
        except ValueError:
            page = 1
        return cls(str(params.get("q") or "").strip()[:200], str(params.get("status") or ""),
                   str(params.get("kind") or ""), page)

    def params(self, **changed: Any) -> dict[str, Any]:
        """The query parameters of this view (page 1 and empty ones left out), changed."""
        values = {"q": self.q, "status": self.status, "kind": self.kind, "page": self.page}
        values.update(changed)
        return {k: v for k, v in values.items() if v and not (k == "page" and v == 1)}

    @property
    def words(self) -> list[str]:
        """What ``q`` asks for, each to be found: its words, and each "quoted phrase" whole."""
        return [phrase or word for phrase, word in _WORDS.findall(self.q) if phrase or word]

    @property
    def filtered(self) -> bool:
        return bool(self.q or self.status or self.kind)


def _pages(total: int, per: int, query: Query) -> dict[str, Any]:
    count = max(1, math.ceil(total / per))
    page = min(query.page, count)
    return {"page": page, "count": count, "total": total, "per": per,
            "first": (page - 1) * per + 1 if total else 0, "last": min(page * per, total),
            "prev": query.params(page=page - 1) if page > 1 else None,
            "next": query.params(page=page + 1) if page < count else None}


def _text(value: Any) -> str:
    return "" if value is None else str(value)


# --------------------------------------------------------------------------- the list


def _started_fields(ledger: Ledger) -> dict[str, dict[str, Any]]:
    """Each session's notebook (``exec`` records it) from its ``session_started`` event."""
    found: dict[str, dict[str, Any]] = {}
    for row in ledger.query(
            "SELECT session, CASE WHEN json_valid(body) THEN json_extract(body, '$.notebook') "
            "END AS notebook FROM events WHERE kind = 'session_started' ORDER BY seq"):
        notebook = None
        try:
            value = json.loads(row["notebook"]) if row["notebook"] else None
        except (TypeError, ValueError):
            value = None
        if isinstance(value, dict) and isinstance(value.get("path"), str) and value["path"]:
            sha = value.get("sha256")
            notebook = {"path": value["path"], "name": os.path.basename(value["path"]),
                        "sha256": sha if isinstance(sha, str) else None}
        found.setdefault(row["session"], {"notebook": notebook})
    return found


def _status(ended: Any, verdicts: list[dict[str, Any]]) -> str:
    if verdicts:
        return "accepted" if verdicts[-1]["accepted"] else "refused"
    return "open" if ended is None else "no submission"


def _duration(started: Any, ended: Any) -> str:
    if ended is None or started is None:
        return ""
    return seconds(max(0.0, float(ended) - float(started)))


def session_rows(ledger: Ledger, only: str | None = None) -> list[dict[str, Any]]:
    """Every session (or ``only``), newest first, as the list shows it."""
    where, params = ("WHERE session = ?", (only,)) if only else ("", ())
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for table in ("generations", "receipts", "artifacts", "refusals"):
        for row in ledger.query(f"SELECT session, count(*) AS n FROM {table} {where} "
                                f"GROUP BY session", params):
            counts[row["session"]][table] = int(row["n"])
    for row in ledger.query(f"SELECT session, status, count(*) AS n FROM cells {where} "
                            f"GROUP BY session, status", params):
        counts[row["session"]]["cells"] += int(row["n"])
        if row["status"] in FAILED:
            counts[row["session"]]["failed_cells"] += int(row["n"])
    verdicts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in ledger.query(f"SELECT session, submission_id, accepted FROM submissions "
                            f"{where} ORDER BY seq", params):
        verdicts[row["session"]].append({"id": row["submission_id"],
                                         "accepted": bool(row["accepted"])})
    started = _started_fields(ledger)
    out = []
    for row in ledger.query(f"SELECT * FROM sessions {where} ORDER BY started DESC, session",
                            params):
        sid = row["session"]
        request = _text(row["request"])
        out.append({
            "id": sid, "started": when(row["started"]), "ended": when(row["ended"]),
            "open": row["ended"] is None, "duration": _duration(row["started"], row["ended"]),
            "mode": row["mode"] or "none", "armed": bool(row["armed"]),
            "front": _text(row["front"]), "workdir": _text(row["workdir"]),
            "workspace": os.path.basename(_text(row["workdir"]).rstrip("/")),
            "request": request, "request_short": _shorten(request, REQUEST_CHARS),
            "notebook": started.get(sid, {}).get("notebook"),
            "counts": {k: counts[sid].get(k, 0) for k in ("generations", "cells",
                                                           "failed_cells", "receipts",
                                                           "artifacts", "refusals")},
            "verdicts": verdicts.get(sid, []),
            "status": _status(row["ended"], verdicts.get(sid, [])),
        })
    return out


def _shorten(text: str, limit: int) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def _matches(s: dict[str, Any], query: Query) -> bool:
    if query.status and not (s["status"] == query.status
                             or (query.status == "open" and s["open"])):
        return False
    if query.kind and query.kind not in (s["mode"], s["front"]):
        return False
    if query.q:
        notebook = s["notebook"] or {}
        hay = " ".join([s["id"], s["workdir"], s["request"], s["mode"], s["front"],
                        _text(notebook.get("path"))]).casefold()
        return all(word.casefold() in hay for word in query.words)
    return True


def sessions_page(ledger: Ledger, query: Query = Query()) -> dict[str, Any]:
    """The sessions list: the page of sessions the search and filters keep, and the choices
    the filters offer (the modes and fronts the record holds)."""
    every = session_rows(ledger)
    kept = [s for s in every if _matches(s, query)]
    paging = _pages(len(kept), SESSIONS_PER_PAGE, query)
    start = (paging["page"] - 1) * SESSIONS_PER_PAGE
    modes = sorted({s["mode"] for s in every})
    fronts = sorted({s["front"] for s in every if s["front"]})
    return {"sessions": kept[start:start + SESSIONS_PER_PAGE], "paging": paging,
            "query": query, "all": len(every), "statuses": SESSION_STATUSES,
            "kinds": {"any": "any kind", "groups": [("mode", [(m, m) for m in modes]),
                                                    ("front", [(f, f) for f in fronts])]}}


# --------------------------------------------------------------------------- one session


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _cell_filter(session_id: str, query: Query) -> tuple[str, list[Any]]:
    where = ["session = ?"]
    params: list[Any] = [session_id]
    if query.status:
        where.append("status = ?")
        params.append(query.status)
    if query.kind in CELL_KINDS:
        where.append(f"cell_id IN (SELECT cell_id FROM {CELL_KINDS[query.kind]} "
                     f"WHERE session = ?)")
        params.append(session_id)
    for word in query.words:
        where.append("(code LIKE ? ESCAPE '\\' OR outputs LIKE ? ESCAPE '\\' "
                     "OR cell_id = ?)")
        params += [_like(word), _like(word), word]
    return " AND ".join(where), params


def _attached(ledger: Ledger, session_id: str, cells: list[str]
              ) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """What each of ``cells`` holds, read for those cells alone."""
    by_cell: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    if not cells:
        return by_cell
    marks = ",".join("?" * len(cells))
    params = (session_id, *cells)
    for r in ledger.query(f"SELECT * FROM receipts WHERE session = ? AND cell_id IN ({marks}) "
                          f"ORDER BY seq", params):
        body = _json(r["body"])
        by_cell[r["cell_id"]]["receipts"].append(receipt_summary(body, r["receipt_id"]))
    for r in ledger.query(f"SELECT * FROM artifacts WHERE session = ? AND cell_id IN ({marks}) "
                          f"ORDER BY seq", params):
        by_cell[r["cell_id"]]["artifacts"].append(
            {"id": r["artifact_id"], "filename": r["filename"], "size": size(r["size"]),
             "media_type": r["media_type"], "sha256": r["sha256"]})
    for r in ledger.query(f"SELECT * FROM writes WHERE session = ? AND cell_id IN ({marks}) "
                          f"ORDER BY seq", params):
        by_cell[r["cell_id"]]["writes"].append({"path": r["path"], "op": r["op"],
                                                "size": size(r["size"])})
    for r in ledger.query(f"SELECT * FROM loads WHERE session = ? AND cell_id IN ({marks}) "
                          f"ORDER BY seq", params):
        by_cell[r["cell_id"]]["loads"].append({"artifact": r["artifact_id"], "path": r["path"]})
    for r in ledger.query(f"SELECT * FROM refusals WHERE session = ? AND cell_id IN ({marks}) "
                          f"ORDER BY seq", params):
        by_cell[r["cell_id"]]["refusals"].append(
            {"call": r["call"], "code": r["code"], "reason": r["reason"]})
    for r in ledger.query(f"SELECT submission_id, cell_id, accepted, body FROM submissions "
                          f"WHERE session = ? AND cell_id IN ({marks}) ORDER BY seq", params):
        by_cell[r["cell_id"]]["submissions"].append(
            verdict_card(r["submission_id"], bool(r["accepted"]), _json(r["body"])))
    return by_cell


def _json(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _unattached(ledger: Ledger, session_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in ledger.query("SELECT * FROM refusals WHERE session = ? AND cell_id IS NULL "
                          "ORDER BY seq", (session_id,)):
        out.append({"call": r["call"], "code": r["code"], "reason": r["reason"]})
    for r in ledger.query("SELECT submission_id, accepted FROM submissions WHERE session = ? "
                          "AND cell_id IS NULL ORDER BY seq", (session_id,)):
        out.append({"call": "submit", "id": r["submission_id"], "accepted": bool(r["accepted"])})
    return out


def session_page(ledger: Ledger, session_id: str, query: Query = Query()) -> dict[str, Any]:
    """One session: its facts, and the page of its cells the search and filters keep, each
    with its outputs and what it holds, a line where each kernel generation started."""
    rows = session_rows(ledger, session_id)
    if not rows:
        raise NotFound(f"no session {session_id!r} in this record")
    where, params = _cell_filter(session_id, query)
    total = int(ledger.query(f"SELECT count(*) FROM cells WHERE {where}", params)[0][0])
    paging = _pages(total, CELLS_PER_PAGE, query)
    offset = (paging["page"] - 1) * CELLS_PER_PAGE
    # One cell before the page too, to know whether the page starts a generation.
    before = 1 if offset else 0
    cells = ledger.query(f"SELECT * FROM cells WHERE {where} ORDER BY seq_started "
                         f"LIMIT ? OFFSET ?", (*params, CELLS_PER_PAGE + before,
                                               offset - before))
    previous = cells[0]["generation"] if before and cells else None
    cells = cells[before:]
    ids = [c["cell_id"] for c in cells]
    attached = _attached(ledger, session_id, ids)
    seqs = [c["seq_finished"] for c in cells if c["seq_finished"] is not None]
    finished: dict[str, dict[str, Any]] = {}
    if seqs:
        for r in ledger.query(f"SELECT body FROM events WHERE seq IN "
                              f"({','.join('?' * len(seqs))})", seqs):
            body = _json(r["body"])
            finished[str(body.get("cell_id"))] = body
    generations = {int(g["generation"]): g for g in ledger.query(
        "SELECT * FROM generations WHERE session = ? ORDER BY generation", (session_id,))}
    timeline: list[dict[str, Any]] = []
    for c in cells:
        gen = c["generation"]
        if gen != previous and gen in generations:
            g = generations[gen]
            timeline.append({"type": "generation", "generation": gen, "reason": g["reason"],
                             "started": when(g["started"])})
        previous = gen
        body = finished.get(c["cell_id"], {})
        outputs = _json_list(c["outputs"])
        duration = body.get("duration")
        if not isinstance(duration, (int, float)) and c["ended"] is not None:
            duration = c["ended"] - c["started"]
        held = attached.get(c["cell_id"], {})
        timeline.append({
            "type": "cell", "id": c["cell_id"], "frontend_id": c["frontend_cell_id"],
            "code": c["code"] or "", "status": c["status"], "generation": gen,
            "execution_count": c["execution_count"], "started": when(c["started"]),
            "duration": seconds(duration if isinstance(duration, (int, float)) else None),
            "notice": body.get("notice") if isinstance(body.get("notice"), str) else None,
            "outputs": [choose_output(o) for o in outputs if isinstance(o, dict)],
            **{k: held.get(k, []) for k in ("receipts", "artifacts", "writes", "loads",
                                             "refusals", "submissions")},
        })
    summary = dict(rows[0], confinement=confinement(ledger, session_id))
    return {"session": summary, "timeline": timeline, "unattached": _unattached(ledger,
                                                                                  session_id),
            "workdir": summary["workdir"], "task": summary["request"],
            "paging": paging, "query": query, "cells_total": summary["counts"]["cells"],
            "statuses": CELL_STATUSES,
            "kinds": {"any": "holding anything",
                      "groups": [(None, [(k, f"with a {k}") for k in CELL_KINDS])]}}


def confinement(ledger: Ledger, session_id: str) -> str:
    """How the session's kernels were confined, from its start and its generations' events."""
    bodies: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in ledger.query("SELECT kind, body FROM events WHERE session = ? AND kind IN "
                            "('session_started', 'generation_started') ORDER BY seq",
                            (session_id,)):
        bodies[row["kind"]].append(_json(row["body"]))
    started = (bodies.get("session_started") or [{}])[0]
    statuses = [str(g["confinement"].get("status")) for g in bodies.get("generation_started", [])
                if isinstance(g.get("confinement"), dict)]
    session = started.get("confinement")
    session = session if isinstance(session, dict) else {}
    network = "" if session.get("network", True) else ", no network"
    if statuses and all(s == "landlock" for s in statuses):
        abi = session.get("abi")
        return f"Landlock{f' ABI {abi}' if abi else ''}{network}"
    if statuses and any(s == "landlock" for s in statuses):
        return f"Landlock in {statuses.count('landlock')} of {len(statuses)} generations"
    reason = session.get("reason")
    return f"none ({reason})" if reason else "none"


def _json_list(text: Any) -> list[Any]:
    try:
        value = json.loads(text) if text else []
    except (TypeError, ValueError):
        return []
    return value if isinstance(value, list) else []
