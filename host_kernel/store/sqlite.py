"""The SQLite ledger, the embedded default: one file, one hash chain, and the replay
that rebuilds any ledger's projection in memory.

A writer remembers the last event it wrote or checked (its *known head*);
before each append, inside the write transaction, every event after that head
must chain on from it and carry a valid MAC, or the append is refused with
:class:`~host_kernel.store.base.ForeignEventError` and nothing is written. Events
from before the ``mac`` column existed have a NULL ``mac`` and are chain-checked
only. The record key is :mod:`host_kernel.store.keys`'s; the chain and its checks
are :mod:`host_kernel.store.chain`'s, the projection
:mod:`host_kernel.store.projection`'s.

Readers open the ledger with :meth:`SQLiteLedger.open_readonly`, which never
writes, never creates a table and never changes the journal mode
(:mod:`host_kernel.store.verified` builds the checked view readers use).
:func:`rebuild` replays the events of any ledger (this one or PostgreSQL's) into
a fresh in-memory SQLite ledger.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Self

from .._errors import RecordError
from .base import ChainProblem, Event, ForeignEventError, Head, Ledger, RecordRefused
from .chain import (
    _EVENT_COLUMNS,
    GENESIS,
    _foreign_message,
    _mac_ok,
    _mac_select,
    _per_session,
    check_chain,
    check_macs,
    event_hash,
    event_mac,
    read_events,
    replay_problems,
)
from .keys import KEY_BYTES, _writer_key
from .projection import _serialise, project

__all__ = ["SCHEMA", "SQLiteLedger", "collector_paused", "rebuild"]


# SQLite's primary result codes for a damaged file and for a file that is no database.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq     INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    ts      REAL NOT NULL,
    kind    TEXT NOT NULL,
    body    TEXT NOT NULL,
    prev    TEXT NOT NULL,
    hash    TEXT NOT NULL,
    mac     TEXT
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


# --------------------------------------------------------------------------- opening


def _connect(target: str) -> sqlite3.Connection:
    conn = sqlite3.connect(target, check_same_thread=False, isolation_level=None, timeout=30.0)
    conn.row_factory = sqlite3.Row
    return conn


def _read_error(exc: sqlite3.Error, doing: str) -> RecordError:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return RecordRefused(f"the ledger is damaged or cut short ({exc})", code="ledger_truncated")
    return RecordError(f"cannot {doing}: {exc}")


def _check_file(path: Path) -> bool:
    """Refuse a ledger file that is missing, empty, no SQLite database or visibly cut short.

    Returns whether a write-ahead log with content lies next to it.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header = f.read(100)
    except FileNotFoundError:
        raise RecordRefused(f"no ledger at {path}", code="record_missing") from None
    except OSError as exc:
        raise RecordRefused(f"cannot read {path}: {exc.strerror or exc}",
                            code="record_unreadable") from None
    if size == 0:
        raise RecordRefused(f"{path} is empty (0 bytes): no event was ever committed to it",
                            code="ledger_empty")
    if not header.startswith(b"SQLite format 3\x00"):
        raise RecordRefused(f"{path} is not a SQLite database (its header is wrong or cut)",
                            code="ledger_truncated")
    if len(header) < 100:
        raise RecordRefused(f"{path} is cut short inside its header ({size} bytes)",
                            code="ledger_truncated")
    wal = Path(f"{path}-wal")
    wal_has_content = wal.is_file() and wal.stat().st_size > 0
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    size_is_valid = header[24:28] == header[92:96]
    # Pages may still sit in the WAL (a checkpoint cut by a crash); only judge the file alone.
    if size_is_valid and not wal_has_content and size < pages * page_size:
        raise RecordRefused(f"{path} is cut short: {size} bytes, its header says "
                            f"{pages} pages of {page_size}", code="ledger_truncated")
    return wal_has_content


def _connect_readonly(path: Path) -> tuple[sqlite3.Connection, bool]:
    """A connection that cannot write; also whether committed events in the WAL were skipped.

    ``mode=ro`` reads the write-ahead log, but SQLite then creates ``-wal`` and
    ``-shm`` files if they are missing, and needs them to exist or the folder
    to be writable. So ``mode=ro`` is used only when both files are already
    there (a Host has the record open, or died); otherwise ``immutable=1``,
    which reads the database file alone and touches nothing.
    """
    wal_has_content = _check_file(path)
    both = Path(f"{path}-wal").is_file() and Path(f"{path}-shm").is_file()
    target = "file:" + urllib.parse.quote(os.path.abspath(path))
    modes = ["mode=ro", "immutable=1"] if both else ["immutable=1"]
    last: sqlite3.Error | None = None
    for mode in modes:
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(f"{target}?{mode}", uri=True, check_same_thread=False,
                                   isolation_level=None, timeout=30.0)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA query_only = 1")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn, wal_has_content and mode == "immutable=1"
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            error = _read_error(exc, f"open {path} read-only")
            if isinstance(error, RecordRefused):
                raise error from exc
            last = exc
    raise RecordRefused(f"cannot open {path} read-only: {last}", code="record_unreadable")


def _add_mac_column(conn: sqlite3.Connection) -> None:
    """Give a ledger from before MACs its ``mac`` column (NULL for the events already there)."""
    def has_mac() -> bool:
        return any(r[1] == "mac" for r in conn.execute("PRAGMA table_info(events)"))

    if has_mac():
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not has_mac():  # another writer may have added it meanwhile
            conn.execute("ALTER TABLE events ADD COLUMN mac TEXT")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


# --------------------------------------------------------------------------- SQLite ledger


class SQLiteLedger:
    """The embedded ledger: one SQLite file in WAL mode.

    One connection, guarded by a lock, serves every thread of a Host. Appends run
    in ``BEGIN IMMEDIATE`` so several Hosts sharing one record keep one chain;
    each checks, in that transaction, that whatever other writers appended since
    its known head chains on and carries a valid MAC (:class:`ForeignEventError`
    otherwise). ``synchronous=NORMAL`` in WAL mode: a commit survives the Host
    being killed; only a power loss can lose the last transactions (see
    docs/record.md).

    A writer (the default) creates the schema and the record key if they are
    missing and refuses a ledger whose chain is broken (``chain_broken``) or
    that holds events its key does not vouch for (:class:`ForeignEventError`).
    :meth:`open_readonly` opens a reader that never writes.
    """

    def __init__(self, path: str | Path | None, *, readonly: bool = False) -> None:
        self.path = None if path is None else Path(path)
        self.readonly = readonly
        #: True when a reader could not read the write-ahead log and saw only the main file.
        self.wal_skipped = False
        self._lock = threading.RLock()
        self._key: bytes | None = None
        self._known: Head | None = None
        if readonly:
            if self.path is None:
                raise RecordRefused("an in-memory ledger cannot be opened read-only",
                                    code="record_missing")
            self._conn, self.wal_skipped = _connect_readonly(self.path)
            return
        try:
            self._conn = _connect(":memory:" if path is None else str(path))
        except sqlite3.Error as exc:
            raise RecordError(f"cannot open the ledger at {path}: {exc}") from exc
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            # One transaction for every table and index: one commit, not one each.
            self._conn.executescript(f"BEGIN IMMEDIATE;\n{SCHEMA}\nCOMMIT;")
            _add_mac_column(self._conn)
            self._key = (os.urandom(KEY_BYTES) if self.path is None
                         else _writer_key(self.path.parent, self._conn))
            self._check_before_writing()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise RecordError(f"cannot open the ledger at {path}: {exc}") from exc
        except BaseException:
            self._conn.close()
            raise

    @classmethod
    def open_readonly(cls, path: str | Path) -> SQLiteLedger:
        """Open ``path`` for reading only: no table is created, no pragma changes the file,
        no ``-wal``/``-shm`` file is left that was not there.

        Raises RecordRefused: ``record_missing`` (no file), ``ledger_empty`` (zero
        bytes), ``ledger_truncated`` (not a SQLite database, or cut short),
        ``record_unreadable``. A ledger with no events table opens; callers check
        :meth:`has_table`.
        """
        return cls(path, readonly=True)

    def _check_before_writing(self) -> None:
        """Refuse to extend a broken or forged chain; remember its head as known."""
        assert self._key is not None  # set just before, in __init__
        self._conn.execute("BEGIN")  # one snapshot: no writer can slip in between the checks
        try:
            problems = check_chain(self)
            if problems:
                more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
                raise RecordRefused(
                    f"the ledger's hash chain is broken ({problems[0]}{more}); it will not be "
                    f"extended. Run `host-kernel audit {self._folder()}`", code="chain_broken")
            forged = check_macs(self, self._key)
            if forged:
                raise ForeignEventError(_foreign_message(forged, self._folder()), problems=forged)
            self._known = self.head()
        finally:
            self._conn.execute("COMMIT")

    def _folder(self) -> str:
        return "RECORD" if self.path is None else str(self.path.parent)

    # -- writing

    def append(self, session: str, kind: str, body: dict[str, Any]) -> Event:
        """Append one event and fold it into the projections, in one transaction.

        Raises ForeignEventError, appending nothing, when events after this
        ledger's known head break the chain or lack a valid MAC.
        """
        return self.append_many(session, [(kind, body)])[0]

    def append_many(self, session: str, events: Sequence[tuple[str, dict[str, Any]]]
                    ) -> list[Event]:
        """Append several events, each chained on the one before, in ONE transaction: all
        of them are in the ledger afterwards, or none (a failure rolls every one back).

        The same checks as :meth:`append` (ForeignEventError, appending nothing, when events
        after the known head break the chain or lack a valid MAC), made once.
        """
        if self.readonly or self._key is None:
            raise RecordRefused(f"the ledger at {self.path} was opened read-only",
                                code="record_readonly")
        key = self._key
        prepared = [(kind, body, *_serialise(kind, body)) for kind, body in events]
        out: list[Event] = []
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                row = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC "
                                   "LIMIT 1").fetchone()
                tail = None if row is None else Head(row["seq"], row["hash"])
                if tail != self._known:
                    self._accept_others(conn, key, tail)
                seq, prev = (0, GENESIS) if tail is None else (tail.seq, tail.hash)
                for kind, body, text, field in prepared:
                    seq += 1
                    ts = time.time()
                    digest = event_hash(prev, seq, session, ts, kind, text)
                    conn.execute(
                        f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                        (seq, session, ts, kind, text, prev, digest, event_mac(key, digest)),
                    )
                    project(conn, seq, session, ts, kind, body, text, field)
                    out.append(Event(seq, session, ts, kind, body, prev, digest))
                    prev = digest
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    kinds = ", ".join(kind for kind, _ in events)
                    raise RecordError(f"cannot append {kinds} to the ledger: {exc}") from exc
                raise
            if out:
                self._known = Head(out[-1].seq, out[-1].hash)
        return out

    def _accept_others(self, conn: sqlite3.Connection, key: bytes, tail: Head | None) -> None:
        """Take events other writers appended after the known head, if a key holder wrote
        each one and the chain runs on unbroken; else raise ForeignEventError."""
        known_seq, known_hash = self._known if self._known is not None else (0, GENESIS)
        problems: list[ChainProblem] = []
        if known_seq:
            row = conn.execute("SELECT hash FROM events WHERE seq = ?", (known_seq,)).fetchone()
            if row is None or row["hash"] != known_hash:
                problems.append(ChainProblem(known_seq, "this ledger wrote or checked it, and it "
                                                        "is now gone or changed"))
        if tail is not None and tail.seq < known_seq:
            problems.append(ChainProblem(tail.seq, f"the ledger now ends here, before event "
                                                   f"{known_seq} (events removed)"))
        prev, expected = known_hash, known_seq + 1
        for r in conn.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE seq > ? ORDER BY seq",
                              (known_seq,)):
            seq = r["seq"]
            if seq != expected:
                problems.append(ChainProblem(seq, f"sequence jumps from {expected - 1} to {seq}"))
            if r["prev"] != prev:
                problems.append(ChainProblem(seq, "previous-hash link does not match the event "
                                                  "before"))
            if event_hash(r["prev"], seq, r["session"], r["ts"], r["kind"], r["body"]) != r["hash"]:
                problems.append(ChainProblem(seq, "content does not match its hash"))
            if r["mac"] is None:
                problems.append(ChainProblem(seq, "has no MAC (not written by a holder of the "
                                                  "record key)"))
            elif not _mac_ok(key, r["hash"], r["mac"]):
                problems.append(ChainProblem(seq, "its MAC does not match the record key"))
            prev, expected = r["hash"], seq + 1
        if problems:
            raise ForeignEventError(_foreign_message(problems, self._folder()) +
                                    "; nothing was appended", problems=problems)
        self._known = tail

    # -- reading

    def head(self) -> Head | None:
        """The ledger's last event now, as ``Head(seq, hash)``; None when it has none.

        This reads the file: with several writers it may be another writer's event.
        :attr:`known_head` is the last one this object wrote or checked.
        """
        rows = self.query("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
        return Head(rows[0]["seq"], rows[0]["hash"]) if rows else None

    @property
    def known_head(self) -> Head | None:
        """The last event this writer appended or verified (no I/O); None before any."""
        return self._known

    def has_table(self, name: str) -> bool:
        return bool(self.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                               (name,)))

    def events(self, session: str | None = None) -> Iterator[Event]:
        return read_events(self, session)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as exc:
                raise _read_error(exc, "read the ledger") from exc

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- replay


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a pass over a whole ledger.

    Such a pass (rebuild, audit, export) builds many containers that live until it
    ends and hold no reference cycles; the collector, set off again and again as they
    pile up, walks every one of them each time, so a 20,000-cell session took twice
    as long per event to export as a 2,000-cell one. Reference counting still frees
    all of it; the collector runs again, if it ran before, when the pass ends.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def rebuild(ledger: Ledger, session: str | None = None,
            sessions: Sequence[str] | None = None, key: bytes | None = None) -> SQLiteLedger:
    """Replay the events alone into a fresh in-memory ledger's projections.

    On a ledger with a chain per session (PostgreSQL), ``session`` (or ``sessions``)
    replays only those sessions' events; SQLite's are always replayed whole. There the
    replay also checks the very rows it replays (each session's links, its hashes, the
    ``seq`` order, and with ``key``, default the ledger's own, every MAC) and raises
    RecordRefused (``chain_broken``, ``event_unauthenticated``) rather than replay rows
    that another query would not have shown.
    """
    with collector_paused():
        return _rebuild(ledger, session, sessions, key)


def _rebuild(ledger: Ledger, session: str | None, sessions: Sequence[str] | None,
             key: bytes | None) -> SQLiteLedger:
    fresh = SQLiteLedger(None)
    conn = fresh._conn
    seq = 0
    where: str = ""
    params: tuple[Any, ...] = ()
    if _per_session(ledger):
        if session is not None:
            where, params = "WHERE session = ?", (session,)
        elif sessions is not None:  # one array parameter, however many sessions
            where, params = "WHERE session = ANY(?)", (list(sessions),)
    per_session = _per_session(ledger)
    try:
        rows = ledger.query(f"SELECT seq, session, ts, kind, body, prev, hash, "
                            f"{_mac_select(ledger)}{', n' if per_session else ''} FROM events "
                            f"{where} ORDER BY seq", params)
        if per_session:
            if key is None:
                key = getattr(ledger, "key", lambda: None)()
            replay_problems(rows, key)
        conn.execute("BEGIN")
        for row in rows:
            seq = row["seq"]
            conn.execute(f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                         tuple(row)[:8])
            body = json.loads(row["body"])
            if not isinstance(body, dict):
                raise TypeError("body is not an object")
            project(conn, seq, row["session"], row["ts"], row["kind"], body)
    except RecordError:
        fresh.close()
        raise
    except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
        fresh.close()
        raise RecordError(f"event {seq} cannot be replayed ({type(exc).__name__}: {exc}); "
                          f"the record was altered") from exc
    conn.execute("COMMIT")
    fresh._known = fresh.head()
    return fresh
