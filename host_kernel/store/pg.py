"""The PostgreSQL ledger: the same events, chains and projections, in one shared database.

Many Hosts, on many machines, append to one PostgreSQL database at once (a batch on a
Dask cluster; docs/scale.md). The SQLite ledger keeps one hash chain per file; here
each **session** has its own chain, so Hosts of different sessions never wait on each
other and a reader checks one session without reading the others:

- ``events`` holds every event: ``seq`` (one increasing number over the whole ledger,
  from a sequence, with gaps where a transaction rolled back), ``session``, ``n`` (the
  event's place in its session's chain, 1, 2, 3… with no gap), ``ts``, ``kind``,
  ``body``, ``prev`` (the hash of the session's event ``n - 1``, or :data:`GENESIS`),
  ``hash`` = :func:`~host_kernel.store.ledger.event_hash` over ``(prev, n, session, ts,
  kind, body)``, and ``mac``, HMAC-SHA256 of the hash under the record key.
- ``heads`` holds each session's last ``(n, hash, seq)``. An append locks the session's
  row (``SELECT … FOR UPDATE``), so a session's chain is linear however many writers
  hold the key; sessions interleave freely.
- The projection tables are those of the SQLite ledger, filled by the same
  :func:`~host_kernel.store.ledger.project` in the append's transaction.
- ``ledger_meta`` keeps a check value of the record key (an HMAC of a constant), so a
  writer holding another key is refused before it writes anything.

The record key does not live in the database (whoever can write the database must not
be able to forge MACs). :func:`ledger_key` finds it: the ``HOST_KERNEL_LEDGER_KEY``
file, else ``$XDG_CONFIG_HOME/host_kernel/ledger-keys/<server-and-database>.key``,
created (0600) by the first writer. A batch driver reads it once and hands the bytes
to its workers.

A Host holds a PostgreSQL advisory lock on its session for as long as its connection
lives (:meth:`PostgresLedger.claim`); the server drops the lock when the Host's process
dies, so another Host can tell a session whose Host is gone from one that still runs
(:meth:`PostgresLedger.try_claim`) on any machine, and close it.

Readers use :meth:`PostgresLedger.open_readonly` (a read-only transaction per query,
never a write) and the same checks and rebuild as for SQLite, per session.
PostgreSQL ``text`` cannot hold the character U+0000: a projection column stores
U+FFFD in its place, the event itself keeps it (JSON escapes it), and the comparison
of stored and rebuilt projections allows for exactly that.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Self

from .._errors import RecordError
from .ledger import (
    _EVENT_COLUMNS,
    GENESIS,
    KEY_BYTES,
    ChainProblem,
    Event,
    ForeignEventError,
    Head,
    RecordRefused,
    _foreign_message,
    _mac_ok,
    _serialise,
    event_hash,
    event_mac,
    project,
    read_events,
)

__all__ = ["KEY_ENV", "PG_SCHEMA", "PostgresLedger", "is_postgres_url", "key_file", "ledger_key",
           "redact_url", "session_chain_problems"]

#: The environment variable naming the record key file of a PostgreSQL ledger.
KEY_ENV = "HOST_KERNEL_LEDGER_KEY"

_KEY_CHECK = b"host_kernel ledger key check v1"

#: The PostgreSQL schema (namespace) that holds the ledger's tables, in any database.
PG_SCHEMA = "host_kernel"

SCHEMA = """
CREATE SEQUENCE IF NOT EXISTS events_seq;
CREATE TABLE IF NOT EXISTS ledger_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq     BIGINT PRIMARY KEY,
    session TEXT NOT NULL,
    n       BIGINT NOT NULL,
    ts      DOUBLE PRECISION NOT NULL,
    kind    TEXT NOT NULL,
    body    TEXT NOT NULL,
    prev    TEXT NOT NULL,
    hash    TEXT NOT NULL,
    mac     TEXT,
    UNIQUE (session, n)
);
CREATE INDEX IF NOT EXISTS events_by_kind ON events (kind, seq);
CREATE TABLE IF NOT EXISTS heads (
    session TEXT PRIMARY KEY, n BIGINT NOT NULL, hash TEXT NOT NULL, seq BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY, started DOUBLE PRECISION, ended DOUBLE PRECISION, workdir TEXT,
    mode TEXT, armed BIGINT, request TEXT, signals TEXT, host_version TEXT, front TEXT
);
CREATE TABLE IF NOT EXISTS generations (
    session TEXT, generation BIGINT, started DOUBLE PRECISION, reason TEXT, seq BIGINT,
    PRIMARY KEY (session, generation)
);
CREATE TABLE IF NOT EXISTS cells (
    cell_id TEXT PRIMARY KEY, session TEXT, generation BIGINT, seq_started BIGINT,
    seq_finished BIGINT, code TEXT, started DOUBLE PRECISION, ended DOUBLE PRECISION,
    status TEXT, execution_count BIGINT, outputs TEXT, frontend_cell_id TEXT, access TEXT
);
CREATE INDEX IF NOT EXISTS cells_by_session ON cells (session, seq_started);
CREATE TABLE IF NOT EXISTS refusals (
    seq BIGINT PRIMARY KEY, session TEXT, generation BIGINT, cell_id TEXT,
    call TEXT, code TEXT, reason TEXT
);
CREATE INDEX IF NOT EXISTS refusals_by_session ON refusals (session);
CREATE TABLE IF NOT EXISTS writes (
    seq BIGINT PRIMARY KEY, session TEXT, cell_id TEXT, path TEXT, sha256 TEXT,
    size BIGINT, op TEXT, ts DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS writes_by_path ON writes (session, path);
CREATE TABLE IF NOT EXISTS receipts (
    receipt_id TEXT PRIMARY KEY, seq BIGINT, session TEXT, cell_id TEXT,
    generation BIGINT, command TEXT, exit_status BIGINT, ended DOUBLE PRECISION, body TEXT
);
CREATE INDEX IF NOT EXISTS receipts_by_cell ON receipts (cell_id);
CREATE INDEX IF NOT EXISTS receipts_by_session ON receipts (session);
CREATE TABLE IF NOT EXISTS artifacts (
    artifact_id TEXT PRIMARY KEY, seq BIGINT, session TEXT, cell_id TEXT,
    generation BIGINT, filename TEXT, sha256 TEXT, size BIGINT, media_type TEXT,
    source_path TEXT, ts DOUBLE PRECISION, lineage TEXT
);
CREATE INDEX IF NOT EXISTS artifacts_by_session ON artifacts (session);
CREATE TABLE IF NOT EXISTS loads (
    seq BIGINT PRIMARY KEY, session TEXT, cell_id TEXT, artifact_id TEXT, path TEXT
);
CREATE INDEX IF NOT EXISTS loads_by_session ON loads (session);
CREATE TABLE IF NOT EXISTS submissions (
    submission_id TEXT PRIMARY KEY, seq BIGINT, session TEXT, cell_id TEXT,
    accepted BIGINT, body TEXT
);
CREATE INDEX IF NOT EXISTS submissions_by_session ON submissions (session);
"""

#: The advisory lock that serialises creating the schema (any constant of our own).
_SCHEMA_LOCK = 0x686B5F736368656D  # "hk_schem"


def is_postgres_url(value: object) -> bool:
    """Whether ``value`` is a ``postgresql://`` (or ``postgres://``) URL."""
    return isinstance(value, str) and value.split("://", 1)[0].lower() in ("postgresql",
                                                                          "postgres")


def redact_url(url: str) -> str:
    """``url`` without its password, for messages and records."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def _where(url: str) -> str:
    """The server and database a URL names (no user, no password): the key file's name."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    host = parts.hostname or (query.get("host") or ["local"])[0]
    port = parts.port or int((query.get("port") or ["5432"])[0])
    database = parts.path.lstrip("/") or (query.get("dbname") or [""])[0] or \
        (parts.username or "")
    return f"{host}:{port}/{database}"


def _key_path(url: str) -> Path:
    named = os.environ.get(KEY_ENV)
    if named:
        return Path(named)
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    name = hashlib.sha256(_where(url).encode("utf-8")).hexdigest()[:24]
    return base / "host_kernel" / "ledger-keys" / f"{name}.key"


def key_file(url: str) -> Path:
    """Where the record key of the PostgreSQL ledger at ``url`` is kept (see the module)."""
    return _key_path(url)


def ledger_key(url: str, *, create: bool = True) -> bytes:
    """The record key of the PostgreSQL ledger at ``url``, read from its key file; made
    (32 random bytes, mode 0600) when there is none and ``create``.

    Raises RecordRefused: ``record_key_missing`` (no file, and not ``create``, or
    unreadable), ``record_key_invalid`` (not 32 bytes).
    """
    path = _key_path(url)
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            pass
        except OSError as exc:
            raise RecordError(f"cannot create the ledger key {path}: "
                              f"{exc.strerror or exc}") from None
        else:
            try:
                os.write(fd, os.urandom(KEY_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
    deadline = time.monotonic() + 2.0
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RecordRefused(f"no record key for the ledger at {redact_url(url)}: {path} "
                                f"does not exist (set {KEY_ENV} to the key file the ledger's "
                                f"writers use)", code="record_key_missing") from None
        except OSError as exc:
            raise RecordRefused(f"cannot read the ledger key {path}: {exc.strerror or exc}",
                                code="record_key_missing") from None
        try:
            key = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
        if len(key) == KEY_BYTES:
            return key
        if time.monotonic() > deadline:  # another writer may be between create and write
            raise RecordRefused(f"{path} holds {len(key)} bytes, not {KEY_BYTES}",
                                code="record_key_invalid")
        time.sleep(0.01)


def _key_check(key: bytes) -> str:
    return hmac.digest(key, _KEY_CHECK, "sha256").hex()


def _lock_id(session: str) -> int:
    """The advisory lock number of a session: 8 bytes of its sha256, as a signed bigint."""
    return int.from_bytes(hashlib.sha256(b"hk-session:" + session.encode("utf-8",
                                         "surrogatepass")).digest()[:8], "big", signed=True)


@functools.lru_cache(maxsize=512)
def _pg_sql(sql: str) -> str:
    """SQLite's ``?`` placeholders as psycopg's ``%s`` (and a literal ``%`` doubled),
    outside quoted strings; the SQL the ledger's callers write is otherwise the same."""
    out: list[str] = []
    quote: str | None = None
    for ch in sql:
        if quote is not None:
            out.append("%%" if ch == "%" else ch)
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    return "".join(out)


def _no_nul(value: Any) -> Any:
    return value.replace("\x00", "\ufffd") if isinstance(value, str) and "\x00" in value \
        else value


class Row(tuple[Any, ...]):
    """A result row read by index or by column name, like :class:`sqlite3.Row`."""

    _index: dict[str, int] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_factory(cursor: Any) -> Any:
    names = [c.name for c in cursor.description or ()]
    cls = type("Row", (Row,), {"_index": {n: i for i, n in enumerate(names)}})
    return lambda values: cls(values)


class _Projector:
    """What :func:`project` needs of a connection, over a psycopg one."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._conn.execute(_pg_sql(sql), [_no_nul(p) for p in params])


def _pg_error(exc: Exception, doing: str, url: str) -> RecordError:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return RecordError(f"cannot {doing} (PostgreSQL ledger at {redact_url(url)}): {message}")


class PostgresLedger:
    """A ledger in a PostgreSQL database (psycopg 3); see the module for its layout.

    ``key``: the record key (default: :func:`ledger_key` of ``url``). A writer creates
    the schema if it is missing and refuses a key that is not the ledger's
    (``record_key_invalid``). :meth:`open_readonly` opens a reader that never writes.
    """

    #: Each session has its own chain (SQLite: one chain per file).
    chain_scope = "session"
    dialect = "postgresql"

    def __init__(self, url: str, *, key: bytes | None = None, readonly: bool = False,
                 connect_timeout: float = 30.0) -> None:
        try:
            import psycopg
        except ImportError:
            raise RecordError("the PostgreSQL ledger needs psycopg: pip install "
                              "'psycopg[binary]'") from None
        self._psycopg = psycopg
        self.url = url
        self.path: Path | None = None
        self.readonly = readonly
        self.wal_skipped = False
        self._lock = threading.RLock()
        self._known: dict[str, Head] = {}
        self._last: Head | None = None
        self._claimed: set[str] = set()
        if not readonly and key is None:
            key = ledger_key(url)
        if key is not None and len(key) != KEY_BYTES:
            raise RecordRefused(f"a record key is {KEY_BYTES} bytes, not {len(key)}",
                                code="record_key_invalid")
        self._key = key
        try:
            self._conn = psycopg.connect(url, autocommit=True, row_factory=_row_factory,
                                         connect_timeout=max(1, int(connect_timeout)),
                                         application_name="host_kernel")
        except psycopg.Error as exc:
            raise _pg_error(exc, "connect", url) from None
        try:
            # The ledger's tables are always those of its own schema: a table of the same
            # name that someone made in another schema on the search path is never read.
            self._conn.execute(f"SET search_path = {PG_SCHEMA}")
            if readonly:
                self._conn.execute("SET default_transaction_read_only = on")
            else:
                self._create_schema()
        except BaseException as exc:
            self._conn.close()
            if isinstance(exc, psycopg.Error):
                raise _pg_error(exc, "open the ledger", url) from None
            raise

    @classmethod
    def open_readonly(cls, url: str, *, key: bytes | None = None) -> PostgresLedger:
        """A reader: every statement runs in a read-only transaction; nothing is created."""
        return cls(url, key=key, readonly=True)

    def _create_schema(self) -> None:
        assert self._key is not None
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            self._conn.execute(f"CREATE SCHEMA IF NOT EXISTS {PG_SCHEMA}")
            self._conn.execute(SCHEMA)
            check = _key_check(self._key)
            self._conn.execute("INSERT INTO ledger_meta VALUES ('key_check', %s) "
                               "ON CONFLICT (name) DO NOTHING", (check,))
            row = self._conn.execute("SELECT value FROM ledger_meta WHERE name = "
                                     "'key_check'").fetchone()
        if row is None or not hmac.compare_digest(str(row[0]), check):
            raise RecordRefused(
                f"the record key in {key_file(self.url)} is not the key of the ledger at "
                f"{redact_url(self.url)} (its events were written with another one); "
                f"point {KEY_ENV} at the ledger's key file", code="record_key_invalid")

    def _folder(self) -> str:
        return f"--ledger {redact_url(self.url)}"

    # -- writing

    def append(self, session: str, kind: str, body: dict[str, Any]) -> Event:
        """Append one event to ``session``'s chain and fold it into the projections, in
        one transaction. Raises ForeignEventError, appending nothing, when events of the
        session after this writer's known head break its chain or lack a valid MAC."""
        if self.readonly or self._key is None:
            raise RecordRefused(f"the ledger at {redact_url(self.url)} was opened read-only",
                                code="record_readonly")
        key = self._key
        text, field = _serialise(kind, body)
        psycopg = self._psycopg
        with self._lock:
            conn = self._conn
            try:
                # Two round trips: the session's head (locked) with the next seq, then the
                # event, the head moved on, the projection and the commit, pipelined.
                with conn.pipeline(), conn.transaction():
                    head = "SELECT n, hash, nextval('events_seq') FROM heads WHERE " \
                           "session = %s FOR UPDATE"
                    row = conn.execute(head, (session,)).fetchone()
                    if row is None:
                        conn.execute("INSERT INTO heads VALUES (%s, 0, %s, 0) "
                                     "ON CONFLICT (session) DO NOTHING", (session, GENESIS))
                        row = conn.execute(head, (session,)).fetchone()
                    assert row is not None  # inserted just before, in this transaction
                    # Head(n, hash): the session's last place in its chain, not a seq.
                    tail = None if row[0] == 0 else Head(row[0], row[1])
                    seq = row[2]
                    if tail != self._known.get(session):
                        self._accept_others(session, key, tail)
                    n, prev = (1, GENESIS) if tail is None else (tail.seq + 1, tail.hash)
                    ts = time.time()
                    digest = event_hash(prev, n, session, ts, kind, text)
                    conn.execute(
                        "INSERT INTO events (seq, session, n, ts, kind, body, prev, hash, mac) "
                        "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                        (seq, session, n, ts, kind, text, prev, digest, event_mac(key, digest)))
                    conn.execute("UPDATE heads SET n = %s, hash = %s, seq = %s "
                                  "WHERE session = %s", (n, digest, seq, session))
                    project(_Projector(conn), seq, session, ts, kind, body,  # type: ignore[arg-type]
                            text, field)
            except psycopg.Error as exc:
                raise _pg_error(exc, f"append {kind} to the ledger", self.url) from None
            self._known[session] = Head(n, digest)
            self._last = Head(seq, digest)
        return Event(seq, session, ts, kind, body, prev, digest)

    def _accept_others(self, session: str, key: bytes, tail: Head | None) -> None:
        """Take events other key holders appended to ``session`` after the known head
        (a resumed or recovered session), if its chain runs on unbroken and each carries a
        valid MAC; else raise ForeignEventError."""
        known_n, known_hash = self._known.get(session, Head(0, GENESIS))
        problems: list[ChainProblem] = []
        if known_n:
            row = self._conn.execute("SELECT hash, seq FROM events WHERE session = %s AND "
                                     "n = %s", (session, known_n)).fetchone()
            if row is None or row[0] != known_hash:
                problems.append(ChainProblem(known_n, "this ledger wrote or checked it, and it "
                                                      "is now gone or changed"))
        if tail is not None and tail.seq < known_n:
            problems.append(ChainProblem(tail.seq, f"the session's chain now ends here, before "
                                                   f"event {known_n} (events removed)"))
        prev, expected = known_hash, known_n + 1
        for r in self._conn.execute(f"SELECT n, {_EVENT_COLUMNS} FROM events WHERE session = "
                                    f"%s AND n > %s ORDER BY n", (session, known_n)):
            problems.extend(_link_problems(r, prev, expected, key))
            prev, expected = r["hash"], r["n"] + 1
        if problems:
            raise ForeignEventError(_foreign_message(problems, self._folder()) +
                                    "; nothing was appended", problems=problems)
        if tail is None:
            self._known.pop(session, None)
        else:
            self._known[session] = tail

    # -- who holds a session

    def claim(self, session: str) -> None:
        """Hold ``session`` for as long as this ledger's connection lives (an advisory lock
        the server drops when the process dies). Raises RecordError when another live
        connection holds it."""
        if session in self._claimed:
            return
        if not self.try_claim(session):
            raise RecordError(f"session {session} is held by another Host that is still "
                              f"connected to the ledger", code="session_running")

    def try_claim(self, session: str) -> bool:
        """Take ``session``'s lock if no live Host holds it; whether it was taken."""
        with self._lock:
            if session in self._claimed:
                return True
            try:
                taken = bool(_one(self._conn.execute("SELECT pg_try_advisory_lock(%s)",
                                                     (_lock_id(session),))))
            except self._psycopg.Error as exc:
                raise _pg_error(exc, "lock a session", self.url) from None
            if taken:
                self._claimed.add(session)
            return taken

    def release(self, session: str) -> None:
        """Give ``session``'s lock back (after closing a session whose Host died)."""
        with self._lock:
            if session not in self._claimed:
                return
            self._claimed.discard(session)
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (_lock_id(session),))
            except self._psycopg.Error:
                pass  # the lock goes with the connection anyway

    # -- reading

    def head(self, session: str | None = None) -> Head | None:
        """The last event (``Head(seq, hash)``) of ``session``, or of the whole ledger by
        ``seq``; None when there is none."""
        if session is None:
            rows = self.query("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
        else:
            rows = self.query("SELECT seq, hash FROM events WHERE session = ? "
                              "ORDER BY n DESC LIMIT 1", (session,))
        return Head(rows[0]["seq"], rows[0]["hash"]) if rows else None

    @property
    def known_head(self) -> Head | None:
        """The last event this writer appended (``Head(seq, hash)``); None before any."""
        return self._last

    def has_table(self, name: str) -> bool:
        return bool(self.query("SELECT 1 FROM information_schema.tables WHERE table_schema = "
                               "? AND table_name = ?", (PG_SCHEMA, name)))

    def sessions(self) -> list[str]:
        """Every session with events, in the order they started."""
        return [r[0] for r in self.query("SELECT session FROM events WHERE n = 1 "
                                         "ORDER BY seq")]

    def events(self, session: str | None = None) -> Iterator[Event]:
        return read_events(self, session)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            try:
                return list(self._conn.execute(_pg_sql(sql), tuple(params)).fetchall())
            except self._psycopg.Error as exc:
                raise _pg_error(exc, "read the ledger", self.url) from None

    def close(self) -> None:
        with self._lock:
            self._claimed.clear()
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _one(cursor: Any) -> Any:
    """The first column of the one row a statement returns."""
    row = cursor.fetchone()
    assert row is not None
    return row[0]


def _link_problems(r: Any, prev: str, expected: int, key: bytes | None) -> list[ChainProblem]:
    """What is wrong with one event of a session's chain, given the one before it."""
    problems: list[ChainProblem] = []
    seq, n = r["seq"], r["n"]
    if n != expected:
        problems.append(ChainProblem(seq, f"the session's chain jumps from event {expected - 1}"
                                          f" to {n} (events deleted)"))
    if r["prev"] != prev:
        problems.append(ChainProblem(seq, "previous-hash link does not match the session's "
                                          "event before"))
    if event_hash(r["prev"], n, r["session"], r["ts"], r["kind"], r["body"]) != r["hash"]:
        problems.append(ChainProblem(seq, f"{r['kind']} event content does not match its hash "
                                          f"(edited)"))
    if key is not None:
        if r["mac"] is None:
            problems.append(ChainProblem(seq, "has no MAC (not written by a holder of the "
                                              "record key)"))
        elif not _mac_ok(key, r["hash"], r["mac"]):
            problems.append(ChainProblem(seq, "its MAC does not match the record key (not "
                                              "written by a holder of the key)"))
    return problems


def session_chain_problems(ledger: PostgresLedger, session: str | None = None,
                           key: bytes | None = None) -> list[ChainProblem]:
    """Walk each session's chain (or ``session``'s): every break, and, with ``key``, every
    event its MAC does not vouch for; also a session whose recorded head is not its last
    event (its tail removed). Empty when intact."""
    problems: list[ChainProblem] = []
    where, params = ("WHERE session = ?", (session,)) if session is not None else ("", ())
    current: str | None = None
    prev, expected = GENESIS, 1
    last: dict[str, tuple[int, str]] = {}
    for r in ledger.query(f"SELECT n, {_EVENT_COLUMNS} FROM events {where} "
                          f"ORDER BY session, n", params):
        if r["session"] != current:
            current, prev, expected = r["session"], GENESIS, 1
        problems.extend(_link_problems(r, prev, expected, key))
        prev, expected = r["hash"], r["n"] + 1
        last[r["session"]] = (r["n"], r["hash"])
    for h in ledger.query(f"SELECT session, n, hash, seq FROM heads {where}", params):
        if h["n"] == 0:
            continue
        have = last.get(h["session"])
        if have is None or have != (h["n"], h["hash"]):
            problems.append(ChainProblem(h["seq"], f"session {h['session']}'s chain should end "
                                                   f"at its event {h['n']}, and it does not "
                                                   f"(events removed or rewritten)"))
    return sorted(problems, key=lambda p: p.seq)
