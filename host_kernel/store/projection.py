"""The projection: the tables folded from the events, the same in every backend.

The ``events`` table is the source of truth. Every other table (sessions,
generations, cells, refusals, writes, receipts, artifacts, loads, submissions) is a
projection: :func:`project` folds one event into them, inside the same transaction
that appends the event, and :func:`~host_kernel.store.sqlite.rebuild` replays the
events alone into a fresh database. This module does not know what the events mean
beyond projecting them (the Host decides that); it creates no table (each backend
has its schema) and checks no chain.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from .base import Ledger
from .chain import canonical_json

__all__ = ["PROJECTION_TABLES", "project", "projection_rows"]


#: Every projection table and its key columns, in the order audit reports them.
PROJECTION_TABLES = (
    ("sessions", "session"),
    ("generations", "session, generation"),
    ("cells", "cell_id"),
    ("refusals", "seq"),
    ("writes", "seq"),
    ("receipts", "receipt_id"),
    ("artifacts", "artifact_id"),
    ("loads", "seq"),
    ("submissions", "submission_id"),
)


def _j(value: Any) -> str | None:
    return None if value is None else canonical_json(value)


#: The field of each kind whose value the projection stores as JSON of its own, and that
#: can be large (a cell's outputs, an artifact's lineage): serialised once, for both.
_PROJECTED_FIELD = {"cell_finished": "outputs", "artifact_saved": "lineage"}


def _serialise(kind: str, body: dict[str, Any]) -> tuple[str, str | None]:
    """``canonical_json(body)``, and the canonical JSON of its projected field (None when
    the kind has none, or the field is absent or empty), each serialised once.

    The field's value is serialised alone and put in the place of a random
    placeholder in the rest of the body's JSON: text for text, so the result is
    exactly ``canonical_json(body)`` (a nested value serialises the same wherever it
    sits). A placeholder that shows up more than once (it never does) falls back to
    serialising the whole body.
    """
    name = _PROJECTED_FIELD.get(kind)
    value = None if name is None else body.get(name)
    if not value:
        return canonical_json(body), None if value is None else canonical_json(value)
    field = canonical_json(value)
    mark = canonical_json(f"\ue000{os.urandom(16).hex()}")
    rest = canonical_json({**body, name: mark[1:-1]})
    if rest.count(mark) != 1:
        return canonical_json(body), field
    return rest.replace(mark, field, 1), field


def project(conn: sqlite3.Connection, seq: int, session: str, ts: float, kind: str,
            body: dict[str, Any], text: str | None = None, field: str | None = None) -> None:
    """Fold one event into the projection tables. Pure in the events: no clock, no I/O.

    ``text`` (the body's canonical JSON) and ``field`` (that of the kind's projected
    field, see :func:`_serialise`) save serialising again what the caller already has;
    given or not, the rows are the same.
    """
    if kind == "session_started":
        mode = body.get("mode") or {}
        conn.execute(
            "INSERT INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?)",
            (session, ts, None, body.get("workdir"), mode.get("name"), int(bool(mode.get("armed"))),
             body.get("request"), _j(mode.get("signals", [])), body.get("host_version"),
             body.get("front")),
        )
    elif kind == "session_ended":
        conn.execute("UPDATE sessions SET ended = ? WHERE session = ?", (ts, session))
    elif kind == "session_resumed":
        # A new Host process took the session up again (host-kernel run --resume).
        conn.execute("UPDATE sessions SET ended = NULL WHERE session = ?", (session,))
    elif kind == "generation_started":
        conn.execute(
            "INSERT INTO generations VALUES (?,?,?,?,?)",
            (session, body["generation"], ts, body.get("reason"), seq),
        )
    elif kind == "cell_started":
        conn.execute(
            "INSERT INTO cells (cell_id, session, generation, seq_started, code, started, "
            "status, frontend_cell_id) VALUES (?,?,?,?,?,?,?,?)",
            (body["cell_id"], session, body["generation"], seq, body["code"], ts, "running",
             body.get("frontend_cell_id")),
        )
    elif kind == "cell_finished":
        conn.execute(
            "UPDATE cells SET seq_finished = ?, ended = ?, status = ?, execution_count = ?, "
            "outputs = ?, access = ? WHERE cell_id = ? AND session = ?",
            (seq, ts, body["status"], body.get("execution_count"),
             field if field is not None else _j(body.get("outputs")),
             _j(body.get("access")), body["cell_id"], session),
        )
    elif kind == "call_refused":
        conn.execute(
            "INSERT INTO refusals VALUES (?,?,?,?,?,?,?)",
            (seq, session, body.get("generation"), body.get("cell_id"), body.get("call"),
             body.get("code"), body.get("reason")),
        )
    elif kind == "file_written":
        conn.execute(
            "INSERT INTO writes VALUES (?,?,?,?,?,?,?,?)",
            (seq, session, body.get("cell_id"), body["path"], body.get("sha256"),
             body.get("size"), body.get("op", "write"), ts),
        )
    elif kind == "receipt_recorded":
        conn.execute(
            "INSERT INTO receipts VALUES (?,?,?,?,?,?,?,?,?)",
            (body["receipt_id"], seq, session, body["cell_id"], body["generation"],
             body["command"], body.get("exit_status"), body.get("ended"),
             canonical_json(body) if text is None else text),
        )
    elif kind == "artifact_saved":
        conn.execute(
            "INSERT INTO artifacts VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (body["artifact_id"], seq, session, body.get("cell_id"), body.get("generation"),
             body["filename"], body["sha256"], body["size"], body.get("media_type"),
             body.get("source_path"), ts,
             field if field is not None else _j(body.get("lineage"))),
        )
    elif kind == "artifact_loaded":
        conn.execute(
            "INSERT INTO loads VALUES (?,?,?,?,?)",
            (seq, session, body.get("cell_id"), body["artifact_id"], body.get("path")),
        )
    elif kind == "submission_verdict":
        conn.execute(
            "INSERT INTO submissions VALUES (?,?,?,?,?,?)",
            (body["submission_id"], seq, session, body.get("cell_id"),
             int(bool(body.get("accepted"))), canonical_json(body) if text is None else text),
        )
    # Unknown kinds stay in the chain; the projection has nothing to fold.


def projection_rows(ledger: Ledger) -> dict[str, list[tuple[Any, ...]]]:
    """Every projection table's rows in a stable order, for comparing two ledgers."""
    return {
        table: [tuple(r) for r in ledger.query(f"SELECT * FROM {table} ORDER BY {key}")]
        for table, key in PROJECTION_TABLES
    }
