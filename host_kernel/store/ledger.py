"""The ledger: an append-only, hash-chained event log with projections.

The ``events`` table is the source of truth. Every other table (sessions,
generations, cells, refusals, writes, receipts, artifacts, submissions) is a
projection: :func:`project` folds one event into them, inside the same
transaction that appends the event, and :func:`rebuild` replays the events
alone into a fresh database. Each event stores the sha256 of the previous
event's hash (a chain), so an edited, inserted or deleted event is found by
:func:`check_chain`.

This module owns the SQLite default. The :class:`Ledger` protocol is the seam
for another backend (PostgreSQL): callers use only its methods. It does not
know what the events mean beyond projecting them; the Host decides that.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .._errors import RecordError

__all__ = [
    "GENESIS",
    "ChainProblem",
    "Event",
    "Ledger",
    "SQLiteLedger",
    "canonical_json",
    "check_chain",
    "event_hash",
    "rebuild",
]

#: The "previous hash" of the first event in a ledger.
GENESIS = "0" * 64

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq     INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    ts      REAL NOT NULL,
    kind    TEXT NOT NULL,
    body    TEXT NOT NULL,
    prev    TEXT NOT NULL,
    hash    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY, started REAL, ended REAL, workdir TEXT, mode TEXT,
    armed INTEGER, request TEXT, signals TEXT, host_version TEXT, front TEXT
);
CREATE TABLE IF NOT EXISTS generations (
    session TEXT, generation INTEGER, started REAL, reason TEXT, seq INTEGER,
    PRIMARY KEY (session, generation)
);
CREATE TABLE IF NOT EXISTS cells (
    cell_id TEXT PRIMARY KEY, session TEXT, generation INTEGER, seq_started INTEGER,
    seq_finished INTEGER, code TEXT, started REAL, ended REAL, status TEXT,
    execution_count INTEGER, outputs TEXT, frontend_cell_id TEXT, access TEXT
);
CREATE INDEX IF NOT EXISTS cells_by_session ON cells (session, seq_started);
CREATE TABLE IF NOT EXISTS refusals (
    seq INTEGER PRIMARY KEY, session TEXT, generation INTEGER, cell_id TEXT,
    call TEXT, code TEXT, reason TEXT
);
CREATE TABLE IF NOT EXISTS writes (
    seq INTEGER PRIMARY KEY, session TEXT, cell_id TEXT, path TEXT, sha256 TEXT,
    size INTEGER, op TEXT, ts REAL
);
CREATE INDEX IF NOT EXISTS writes_by_path ON writes (session, path);
CREATE TABLE IF NOT EXISTS receipts (
    receipt_id TEXT PRIMARY KEY, seq INTEGER, session TEXT, cell_id TEXT,
    generation INTEGER, command TEXT, exit_status INTEGER, ended REAL, body TEXT
);
CREATE INDEX IF NOT EXISTS receipts_by_cell ON receipts (cell_id);
CREATE TABLE IF NOT EXISTS artifacts (
    artifact_id TEXT PRIMARY KEY, seq INTEGER, session TEXT, cell_id TEXT,
    generation INTEGER, filename TEXT, sha256 TEXT, size INTEGER, media_type TEXT,
    source_path TEXT, ts REAL, lineage TEXT
);
CREATE INDEX IF NOT EXISTS artifacts_by_session ON artifacts (session);
CREATE TABLE IF NOT EXISTS loads (
    seq INTEGER PRIMARY KEY, session TEXT, cell_id TEXT, artifact_id TEXT, path TEXT
);
CREATE TABLE IF NOT EXISTS submissions (
    submission_id TEXT PRIMARY KEY, seq INTEGER, session TEXT, cell_id TEXT,
    accepted INTEGER, body TEXT
);
"""

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


def canonical_json(value: Any) -> str:
    """The one serialisation used for event bodies and hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def event_hash(prev: str, seq: int, session: str, ts: float, kind: str, body: str) -> str:
    material = "\n".join((prev, str(seq), session, repr(ts), kind, body))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Event:
    """One row of the chain."""

    seq: int
    session: str
    ts: float
    kind: str
    body: dict[str, Any]
    prev: str
    hash: str


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """Where and how the chain breaks."""

    seq: int
    problem: str

    def __str__(self) -> str:
        return f"event {self.seq}: {self.problem}"


class Ledger(Protocol):
    """What the Host needs from a ledger backend."""

    path: Path | None

    def append(self, session: str, kind: str, body: dict[str, Any]) -> Event: ...

    def events(self, session: str | None = None) -> Iterator[Event]: ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------- projection


def _j(value: Any) -> str | None:
    return None if value is None else canonical_json(value)


def project(conn: sqlite3.Connection, seq: int, session: str, ts: float, kind: str,
            body: dict[str, Any]) -> None:
    """Fold one event into the projection tables. Pure in the events: no clock, no I/O."""
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
            (seq, ts, body["status"], body.get("execution_count"), _j(body.get("outputs")),
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
             body["command"], body.get("exit_status"), body.get("ended"), canonical_json(body)),
        )
    elif kind == "artifact_saved":
        conn.execute(
            "INSERT INTO artifacts VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (body["artifact_id"], seq, session, body.get("cell_id"), body.get("generation"),
             body["filename"], body["sha256"], body["size"], body.get("media_type"),
             body.get("source_path"), ts, _j(body.get("lineage"))),
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
             int(bool(body.get("accepted"))), canonical_json(body)),
        )
    # Unknown kinds stay in the chain; the projection has nothing to fold.


# --------------------------------------------------------------------------- SQLite ledger


def _connect(target: str) -> sqlite3.Connection:
    conn = sqlite3.connect(target, check_same_thread=False, isolation_level=None, timeout=30.0)
    conn.row_factory = sqlite3.Row
    return conn


class SQLiteLedger:
    """The embedded ledger: one SQLite file in WAL mode.

    One connection, guarded by a lock, serves every thread of a Host. Appends run
    in ``BEGIN IMMEDIATE`` so several Hosts sharing one record keep one chain.
    ``synchronous=NORMAL`` in WAL mode: a commit survives the Host being killed;
    only a power loss can lose the last transactions (see docs/record.md).
    """

    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else Path(path)
        try:
            self._conn = _connect(":memory:" if path is None else str(path))
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise RecordError(f"cannot open the ledger at {path}: {exc}") from exc
        self._lock = threading.RLock()

    # -- writing

    def append(self, session: str, kind: str, body: dict[str, Any]) -> Event:
        text = canonical_json(body)
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                row = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
                seq, prev = (1, GENESIS) if row is None else (row["seq"] + 1, row["hash"])
                ts = time.time()
                digest = event_hash(prev, seq, session, ts, kind, text)
                conn.execute(
                    "INSERT INTO events VALUES (?,?,?,?,?,?,?)",
                    (seq, session, ts, kind, text, prev, digest),
                )
                project(conn, seq, session, ts, kind, body)
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise RecordError(f"cannot append {kind} to the ledger: {exc}") from exc
                raise
        return Event(seq, session, ts, kind, body, prev, digest)

    # -- reading

    def events(self, session: str | None = None) -> Iterator[Event]:
        sql = "SELECT * FROM events"
        params: tuple[Any, ...] = ()
        if session is not None:
            sql += " WHERE session = ?"
            params = (session,)
        for row in self.query(sql + " ORDER BY seq", params):
            yield Event(row["seq"], row["session"], row["ts"], row["kind"],
                        json.loads(row["body"]), row["prev"], row["hash"])

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as exc:
                raise RecordError(f"cannot read the ledger: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SQLiteLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- checks


def check_chain(ledger: Ledger) -> list[ChainProblem]:
    """Walk the chain; return every place where it breaks (empty when intact)."""
    problems: list[ChainProblem] = []
    prev = GENESIS
    expected_seq = 1
    for row in ledger.query("SELECT * FROM events ORDER BY seq"):
        seq = row["seq"]
        if seq != expected_seq:
            problems.append(ChainProblem(seq, f"sequence jumps from {expected_seq - 1} to {seq}"
                                              " (events deleted)"))
        if row["prev"] != prev:
            problems.append(ChainProblem(seq, "previous-hash link does not match the event before"))
        digest = event_hash(row["prev"], seq, row["session"], row["ts"], row["kind"], row["body"])
        if digest != row["hash"]:
            problems.append(ChainProblem(seq, f"{row['kind']} event content does not match its"
                                              " hash (edited)"))
        prev = row["hash"]
        expected_seq = seq + 1
    return problems


def rebuild(ledger: Ledger) -> SQLiteLedger:
    """Replay the events alone into a fresh in-memory ledger's projections."""
    fresh = SQLiteLedger(None)
    conn = fresh._conn
    conn.execute("BEGIN")
    seq = 0
    try:
        for row in ledger.query("SELECT * FROM events ORDER BY seq"):
            seq = row["seq"]
            conn.execute("INSERT INTO events VALUES (?,?,?,?,?,?,?)", tuple(row))
            body = json.loads(row["body"])
            if not isinstance(body, dict):
                raise TypeError("body is not an object")
            project(conn, seq, row["session"], row["ts"], row["kind"], body)
    except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
        fresh.close()
        raise RecordError(f"event {seq} cannot be replayed ({type(exc).__name__}: {exc}); "
                          f"the record was altered") from exc
    conn.execute("COMMIT")
    return fresh


def projection_rows(ledger: Ledger) -> dict[str, list[tuple[Any, ...]]]:
    """Every projection table's rows in a stable order, for comparing two ledgers."""
    return {
        table: [tuple(r) for r in ledger.query(f"SELECT * FROM {table} ORDER BY {key}")]
        for table, key in PROJECTION_TABLES
    }
