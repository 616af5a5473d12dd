"""The PostgreSQL ledger: the same events, chains and projections, in one shared database.

Many Hosts, on many machines, append to one PostgreSQL database at once (a batch on a
Dask cluster; docs/scale.md). The SQLite ledger keeps one hash chain per file; here
each **session** has its own chain, so Hosts of different sessions never wait on each
other and a reader checks one session without reading the others:

- ``events`` holds every event: ``seq`` (one increasing number over the whole ledger,
  from a sequence, with gaps where a transaction rolled back), ``session``, ``n`` (the
  event's place in its session's chain, 1, 2, 3… with no gap), ``ts``, ``kind``,
  ``body``, ``prev`` (the hash of the session's event ``n - 1``, or :data:`GENESIS`),
  ``hash`` = :func:`~host_kernel.store.chain.event_hash` over ``(prev, n, session, ts,
  kind, body)``, and ``mac``, HMAC-SHA256 of the hash under the record key.
- ``heads`` holds each session's last ``(n, hash, seq)``. An append moves the session's
  row on only from the head its writer knows, and holds the row's lock to its commit (one
  prepared statement, one round trip); where the head is elsewhere it locks the row
  first (``SELECT … FOR UPDATE``) and checks what moved it. So a session's chain is
  linear however many writers hold the key; sessions interleave freely.
- The projection tables are those of the SQLite ledger, filled by the same
  :func:`~host_kernel.store.projection.project` in the append's transaction.
- ``ledger_meta`` keeps the ledger's id (random, made with the schema) and a check
  value of the record key (an HMAC of a constant), so a writer holding another key is
  refused before it writes anything.

The record key does not live in the database (whoever can write the database must not
be able to forge MACs). :func:`~host_kernel.store.keys.key_path` finds it: the
``HOST_KERNEL_LEDGER_KEY`` file, else ``$XDG_CONFIG_HOME/host_kernel/ledger-keys/<ledger
id>.key``, made (0600, written whole, then linked into place) by the first writer. A
batch driver reads it once (:func:`ledger_key`) and hands the bytes to its workers.

A Host holds a PostgreSQL advisory lock on its session for as long as its connection
lives (:meth:`PostgresLedger.claim`); the server drops the lock when the Host's process
dies, so another Host can tell a session whose Host is gone from one that still runs
(:meth:`PostgresLedger.try_claim`) on any machine, and close it.

A server that is away (refused connections, a restart, a dropped connection: see
:func:`~host_kernel.store.retry.pg_unavailable`) is waited for, each operation up to the
writer's ``patience``, on a new connection that takes this writer's sessions' locks again.
An append is the same event on every attempt (its ``ts`` is fixed at the first), so one
whose commit went through but whose reply was lost is found by its hash and taken as done,
never appended twice. Just after the server starts, :meth:`~PostgresLedger.try_claim`
does not take a session its Host may still be reconnecting to (:data:`RECONNECT_GRACE`).

Readers use :meth:`PostgresLedger.open_readonly` (never a write; a view or any other
relation standing in for a ledger table is refused) and the same checks and rebuild
as for SQLite, per session, inside one read-only snapshot
(:meth:`PostgresLedger.snapshot`); the replay checks each row it folds
(:func:`~host_kernel.store.chain.replay_problems`), so what was checked is what is shown.
PostgreSQL ``text`` cannot hold the character U+0000: a projection column stores
U+FFFD in its place, the event itself keeps it (JSON escapes it), and the comparison
of stored and rebuilt projections allows for exactly that.

The chain and its checks, the projection and the record key are shared with the SQLite
ledger (:mod:`~host_kernel.store.chain`, :mod:`~host_kernel.store.projection`,
:mod:`~host_kernel.store.keys`); this module never imports it. URLs, the tables' DDL and
SQL over psycopg are :mod:`~host_kernel.store.pgwire`'s; the waiting is
:mod:`~host_kernel.store.retry`'s.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

from .._errors import RecordError, StoreUnavailable
from .base import ChainProblem, Event, ForeignEventError, Head, RecordRefused
from .chain import (
    _EVENT_COLUMNS,
    GENESIS,
    _advance,
    _foreign_message,
    _link_problems,
    event_hash,
    event_mac,
    read_events,
    replay_problems,
    session_chain_problems,
    session_mac_problems,
    session_starts,
)
from .keys import KEY_BYTES, KEY_ENV, _key_check, key_path, keys_folder, read_key
from .pgappend import OneStatementAppend
from .pgschema import PG_SCHEMA, create_schema, plain_tables
from .pgwire import (
    Row,
    _no_nul,
    _pg_error,
    _pg_reason,
    _pg_sql,
    _Projector,
    is_postgres_url,
    redact_url,
)
from .projection import _serialise, project
from .retry import Patience, pg_unavailable, say_on_stderr

__all__ = ["KEY_ENV", "PG_SCHEMA", "PostgresLedger", "check_key", "is_postgres_url", "key_path",
           "keys_folder", "ledger_key", "read_key", "redact_url", "replay_problems",
           "session_chain_problems", "session_mac_problems", "session_starts"]



T = TypeVar("T")

#: Seconds after the server starts during which :meth:`PostgresLedger.try_claim` leaves
#: alone a session whose last event is older than the start: its Host, cut off by the
#: restart, is taking its connection up again (its waits are at most
#: :attr:`~host_kernel.store.retry.Backoff.most` seconds each).
RECONNECT_GRACE = 60.0



def ledger_key(url: str, *, create: bool = True) -> bytes:
    """The record key of the PostgreSQL ledger at ``url``, as its writers use it.

    With ``create`` (a writer, or a batch driver that hands the key to its workers) the
    ledger's schema and key are made when missing; without, the ledger is only read
    and a missing key is ``record_key_missing``.
    """
    if create:
        with PostgresLedger(url) as writer:
            assert writer._key is not None
            return writer._key
    with PostgresLedger.open_readonly(url) as reader:
        return read_key(key_path(reader.ledger_id()))


def _lock_id(session: str) -> int:
    """The advisory lock number of a session: 8 bytes of its sha256, as a signed bigint."""
    return int.from_bytes(hashlib.sha256(b"hk-session:" + session.encode("utf-8",
                                         "surrogatepass")).digest()[:8], "big", signed=True)


class PostgresLedger(OneStatementAppend):
    """A ledger in a PostgreSQL database (psycopg 3); see the module for its layout.

    ``key``: the record key (default: :func:`ledger_key` of ``url``). A writer creates
    the schema if it is missing and refuses a key that is not the ledger's
    (``record_key_invalid``). :meth:`open_readonly` opens a reader that never writes.
    ``patience``: seconds each operation waits for a server that is away (refused
    connections, a restart) before it raises StoreUnavailable; 0 (the default here; a
    Host passes its ``store_patience``) waits not at all.
    """

    #: Each session has its own chain (SQLite: one chain per file).
    chain_scope = "session"
    dialect = "postgresql"

    def __init__(self, url: str, *, key: bytes | None = None, readonly: bool = False,
                 connect_timeout: float = 30.0, lock_timeout: float = 120.0,
                 patience: float = 0.0, say: Callable[[str], None] = say_on_stderr) -> None:
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
        #: Sessions this writer held and lost (another Host took them up while its
        #: connection was down): nothing more is appended to them.
        self._lost: set[str] = set()
        #: The ledger's tables this connection has seen (:meth:`has_table`).
        self._tables: set[str] = set()
        if key is not None and len(key) != KEY_BYTES:
            raise RecordRefused(f"a record key is {KEY_BYTES} bytes, not {len(key)}",
                                code="record_key_invalid")
        self._key = key
        self._connect_timeout = connect_timeout
        #: How long a statement waits for a lock (a session's heads row, a table) before
        #: it fails: anyone who can connect could otherwise hold one and hang the Host.
        self._lock_timeout = lock_timeout
        self._patience = Patience(patience, "the ledger", say=say)
        #: The event an append is committing, until it is known to be in: its place
        #: ``n`` and the event. After a lost reply the next attempt finds it by its hash.
        self._pending: tuple[int, Event] | None = None
        #: Events an append that raised (StoreUnavailable) did commit, found by a later
        #: append: the session's writer takes them as its own (SessionRecord.append).
        self.adopted: list[Event] = []
        #: Sessions whose lock is to be taken again on a new connection.
        self._reclaim: list[str] = []
        #: (pid, backend_start) of the server's end of this connection: once the
        #: connection is lost, the server may not have noticed yet, and still hold its locks.
        self._backend: tuple[int, Any] | None = None
        #: The server processes of this writer's connections that dropped since it last
        #: took back every session it held: (pid, backend_start), the newest last.
        self._lost_backends: list[tuple[int, Any]] = []
        self._in_snapshot = False
        #: The one-statement appends prepared on this connection (statement: its name), and
        #: how many were ever prepared (each name is new).
        self._prepared: dict[str, str] = {}
        self._statements = 0
        self._conn: Any = None
        try:
            self._patiently("connect", lambda: None)
            self._patiently("open the ledger",
                            self._plain_tables if readonly else self._create_schema)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open_readonly(cls, url: str, *, key: bytes | None = None) -> PostgresLedger:
        """A reader: every statement runs in a read-only transaction; nothing is created."""
        return cls(url, key=key, readonly=True)

    # -- the connection, and riding out a server that is away

    def _patiently(self, doing: str, operation: Callable[[], T]) -> T:
        """``operation()`` on a live connection (a new one, with this writer's sessions
        taken again, when the last one dropped), again while the server is away and
        ``patience`` allows (:class:`~host_kernel.store.retry.Patience`). A refusal is
        RecordError naming what was being done; past the bound, StoreUnavailable."""
        psycopg = self._psycopg

        def attempt() -> T:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._reconnect()
            if self._reclaim:
                self._take_back()
            return operation()

        def unavailable(exc: Exception) -> str | None:
            if isinstance(exc, _Lingering):
                return str(exc)
            if not isinstance(exc, psycopg.Error):
                return None
            conn = self._conn  # None: a connect failed (libpq's message alone tells)
            lost = conn is not None and (conn.closed or conn.broken)
            return _pg_reason(exc, self.url) if pg_unavailable(
                exc.sqlstate, str(exc), connection_lost=lost) else None

        def failed(message: str) -> Exception:
            return StoreUnavailable(f"cannot {doing} (PostgreSQL ledger at "
                                    f"{redact_url(self.url)}): {message}")

        with self._lock:
            try:
                if self._in_snapshot:  # a snapshot is one transaction: never taken up again
                    try:
                        return operation()
                    except psycopg.Error as exc:
                        # ...but an outage is said as one, so a reader that retries whole
                        # reads (the batch's read-back) starts its snapshot again
                        reason = unavailable(exc)
                        if reason is not None:
                            raise failed(reason) from None
                        raise
                return self._patience.run(attempt, unavailable, failed)
            except psycopg.Error as exc:
                raise _pg_error(exc, doing, self.url) from None

    def _connect(self) -> Any:
        """A connection set up as every statement of the ledger needs it (psycopg's
        errors raised as they are: :meth:`_patiently` tells an outage from a refusal)."""
        conn = self._psycopg.connect(self.url, autocommit=True, row_factory=_rows,
                                     connect_timeout=max(1, int(self._connect_timeout)),
                                     application_name="host_kernel")
        try:
            # The ledger's tables are always those of its own schema: a table of the same
            # name that someone made in another schema on the search path is never read.
            # Every double read back exactly as written (the hash covers ts), whatever the
            # server's or the role's default. One round trip for the three (and the
            # reader's read-only default): a task's Host and its read-back each connect.
            settings = [f"SET search_path = {PG_SCHEMA}", "SET extra_float_digits = 3",
                        f"SET lock_timeout = {max(1, int(self._lock_timeout * 1000))}"]
            if self.readonly:
                settings.append("SET default_transaction_read_only = on")
            conn.execute("; ".join(settings))
            encoding, started = conn.execute(
                "SELECT current_setting('server_encoding'), (SELECT backend_start FROM "
                "pg_catalog.pg_stat_activity WHERE pid = pg_backend_pid())").fetchone() or \
                ("", None)
            if str(encoding).upper() not in ("UTF8", "UTF-8"):
                raise RecordRefused(f"the database at {redact_url(self.url)} stores text as "
                                    f"{encoding}, not UTF8: events would not read back as "
                                    f"written", code="record_unreadable")
        except BaseException:
            conn.close()
            raise
        if not self.readonly:
            # A writer prepares its appends itself (:meth:`_prepare`). psycopg's own
            # preparing would, after a rollback, deallocate them all, and takes a statement
            # it prepares in a pipeline that an error aborts first for prepared all the same.
            conn.prepare_threshold = None
        self._backend = (conn.info.backend_pid, started)
        return conn

    def _reconnect(self) -> None:
        """A new connection in place of one that dropped (a server restart, a network
        cut) or never was; the sessions this writer held are to be taken again
        (:meth:`_take_back`) before anything else is done on it."""
        old, self._conn = self._conn, None
        self._prepared = {}  # they lived in the old connection's session
        if old is not None:
            with contextlib.suppress(Exception):
                old.close()
            if self._backend is not None:  # the last eight (a drop while taking back adds one)
                self._lost_backends = [*self._lost_backends[-7:], self._backend]
            self._reclaim = sorted(set(self._reclaim) | self._claimed)
            self._claimed = set()
        self._conn = self._connect()

    def _take_back(self) -> None:
        """Take again the lock of each session this writer held before its connection
        dropped; each must still end where this writer left it (or with the event it was
        committing when the reply was lost). Otherwise (another Host closed it as
        abandoned meanwhile, or holds it) ForeignEventError, and this writer appends
        nothing more to that session."""
        conn = self._conn
        for session in list(self._reclaim):
            if not _one(conn.execute("SELECT pg_try_advisory_lock(%s)", (_lock_id(session),))):
                holder = self._lock_holder(session)
                mine = [lost for lost in self._lost_backends if lost[0] == holder]
                if holder is None or mine:
                    # This writer's own lost connection, which the server has not noticed is
                    # gone: end it (the same backend, not one that took its pid since). None:
                    # it ended between the two looks (a loaded server's, often). Try again.
                    for lost in mine:
                        with contextlib.suppress(self._psycopg.Error):  # else: the server will
                            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_catalog."
                                         "pg_stat_activity WHERE pid = %s AND "
                                         "backend_start = %s", lost)
                    raise _Lingering(f"the server still holds session {session} for this "
                                     f"Host's lost connection")
                self._reclaim.remove(session)
                self._lost.add(session)
                raise ForeignEventError(
                    f"the connection to the ledger dropped and another Host now holds session "
                    f"{session}; nothing more is appended to it",
                    problems=[ChainProblem(0, "the session is held by another Host")])
            self._reclaim.remove(session)
            self._claimed.add(session)
            rows = conn.execute("SELECT n, hash FROM heads WHERE session = %s",
                                (session,)).fetchall()
            now = Head(rows[0][0], rows[0][1]) if rows and rows[0][0] else None
            pending = self._pending
            ours = pending is not None and pending[1].session == session and \
                now == Head(pending[0], pending[1].hash)
            if now != self._known.get(session) and not ours:
                self._lost.add(session)
                raise ForeignEventError(
                    f"the connection to the ledger dropped, and session {session} was changed "
                    f"meanwhile (another Host closed it as abandoned); nothing more is "
                    f"appended to it", problems=[ChainProblem(0 if now is None else now.seq,
                                                              "the session's chain moved on")])
        self._lost_backends = []  # every session taken back: none of them holds one now

    def _lock_holder(self, session: str) -> int | None:
        """The server process that holds ``session``'s advisory lock, if any."""
        key = _lock_id(session) & 0xFFFFFFFFFFFFFFFF
        row = self._conn.execute(
            "SELECT pid FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted AND "
            "classid::bigint = %s AND objid::bigint = %s AND objsubid = 1",
            (key >> 32, key & 0xFFFFFFFF)).fetchone()
        return None if row is None else int(row[0])

    def _plain_tables(self) -> bool:
        """Whether the ledger's tables exist (False: an empty database); refuses one
        whose tables are not plain tables (:func:`~.pgschema.plain_tables`)."""
        found = plain_tables(self._conn)
        self._tables.update(found)
        return "events" in found

    def _create_schema(self) -> None:
        self._key = create_schema(self._conn, self._key, self.url, self._plain_tables,
                                  self.ledger_id)

    def ledger_id(self) -> str:
        """The ledger's id, made with its schema; its key file is named after it."""
        rows = self.query("SELECT value FROM ledger_meta WHERE name = 'ledger_id'") \
            if self.has_table("ledger_meta") else []
        if not rows:
            raise RecordRefused(f"no ledger at {redact_url(self.url)} (no host_kernel schema)",
                                code="record_missing")
        return str(rows[0][0])

    def key(self) -> bytes | None:
        """The record key this ledger was opened with (a writer always has one)."""
        return self._key

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Run every query inside in one read-only, repeatable-read transaction: the
        checks and the replay of a reader see the same rows, whatever is written meanwhile.
        Its queries are not tried again on a new connection (the snapshot would not be
        one any more): a connection lost inside it fails the read."""
        with self._lock:
            conn = self._conn
            if conn is not None and not (conn.closed or conn.broken) and \
                    conn.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
                yield  # already inside one
                return
            self._patiently("read the ledger", lambda: self._conn.execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"))
            self._in_snapshot = True
            try:
                yield
            finally:
                self._in_snapshot = False
                try:
                    self._conn.execute("ROLLBACK")
                except self._psycopg.Error:
                    pass

    def _folder(self) -> str:
        return f"--ledger {redact_url(self.url)}"

    # -- writing

    def append(self, session: str, kind: str, body: dict[str, Any]) -> Event:
        """Append one event to ``session``'s chain and fold it into the projections, in
        one transaction. Raises ForeignEventError, appending nothing, when events of the
        session after this writer's known head break its chain or lack a valid MAC.

        While the server is away the append waits (``patience``) and tries again, with
        the same event (its ``ts`` fixed at the first attempt): an attempt whose commit
        went through but whose reply was lost is found by its hash and is not appended
        twice. Past the bound, StoreUnavailable."""
        if self.readonly or self._key is None:
            raise RecordRefused(f"the ledger at {redact_url(self.url)} was opened read-only",
                                code="record_readonly")
        key = self._key
        if session in self._lost:
            raise ForeignEventError(f"session {session} was taken up by another Host while "
                                    f"this writer's connection was down; nothing was appended",
                                    problems=[ChainProblem(0, "the session was lost")])
        text, field = _serialise(kind, body)
        ts = time.time()
        return self._patiently(f"append {kind} to the ledger",
                               lambda: self._append(session, kind, body, key, text, field, ts))

    def _append(self, session: str, kind: str, body: dict[str, Any], key: bytes, text: str,
                field: str | None, ts: float) -> Event:
        if self._pending is None:  # else an append's outcome is unknown: read the head
            done = self._append_at_known_head(session, kind, body, key, text, field, ts)
            if done is not None:
                return done
        conn = self._conn
        # The session's head is not where this writer left it (or the tables refused the
        # one statement, or an append's reply was lost): two round trips, the head read
        # and locked with the next seq, then whatever moved it checked (an append of this
        # writer's that did commit among it), the event, the head moved on, the projection
        # and the commit, pipelined.
        with conn.pipeline(), conn.transaction():
            head = "SELECT n, hash, nextval('events_seq') FROM heads WHERE " \
                   "session = %s FOR UPDATE"
            row = conn.execute(head, (session,)).fetchone()
            if row is None:
                conn.execute("INSERT INTO heads VALUES (%s, 0, %s, 0) "
                             "ON CONFLICT (session) DO NOTHING", (session, GENESIS))
                row = conn.execute(head, (session,)).fetchone()
            assert row is not None  # inserted just before, in this transaction
            if type(row[0]) is not int or type(row[1]) is not str:
                raise ForeignEventError(
                    f"session {session}'s row in heads holds no usable head (the heads "
                    f"table was altered); nothing was appended",
                    problems=[ChainProblem(0, "the session's head is unreadable")])
            # Head(n, hash): the session's last place in its chain, not a seq.
            tail = None if row[0] == 0 else Head(row[0], row[1])
            seq = row[2]
            if tail != self._known.get(session) and tail is not None:
                landed = self._landed(session, tail, key)
                if landed is not None:
                    if landed.hash == event_hash(landed.prev, tail.seq, session, ts, kind, text):
                        return landed  # this append, committed by an attempt whose reply was lost
                    self.adopted.append(landed)  # an earlier one's, which raised
            if tail != self._known.get(session):
                if session in self._claimed and session in self._known:
                    # Nobody else writes a session this writer holds: whatever moved
                    # its chain (a Host that took it over) ends this writer's part.
                    raise ForeignEventError(
                        f"session {session} was changed by another writer while this "
                        f"one held it; nothing was appended",
                        problems=[ChainProblem(0 if tail is None else tail.seq,
                                               "the session's chain moved on")])
                self._accept_others(session, key, tail)
            n, prev = (1, GENESIS) if tail is None else (tail.seq + 1, tail.hash)
            digest = event_hash(prev, n, session, ts, kind, text)
            event = Event(seq, session, ts, kind, body, prev, digest)
            self._pending = (n, event)
            conn.execute(
                "INSERT INTO events (seq, session, n, ts, kind, body, prev, hash, mac) "
                "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                (seq, session, n, ts, kind, text, prev, digest, event_mac(key, digest)))
            conn.execute("UPDATE heads SET n = %s, hash = %s, seq = %s "
                         "WHERE session = %s", (n, digest, seq, session))
            project(_Projector(conn), seq, session, ts, kind, body,  # type: ignore[arg-type]
                    text, field)
        self._pending = None
        self._known[session] = Head(n, digest)
        self._last = Head(seq, digest)
        return event

    def _landed(self, session: str, tail: Head, key: bytes) -> Event | None:
        """The event this writer was committing when its reply was lost, if it is the
        session's last now (``tail``): the same hash, linked to this writer's known head,
        with a valid MAC. Taken as this writer's own: the known head moves on to it."""
        pending = self._pending
        if pending is None or pending[1].session != session or \
                tail != Head(pending[0], pending[1].hash):
            return None
        mine = pending[1]
        row = self._conn.execute(f"SELECT n, {_EVENT_COLUMNS} FROM events WHERE session = %s "
                                 f"AND n = %s", (session, tail.seq)).fetchone()
        if row is None or _link_problems(row, mine.prev, tail.seq, key) or \
                row["hash"] != mine.hash:
            return None  # not the event this writer made: the usual checks decide
        self._pending = None
        self._known[session] = tail
        self._last = Head(row["seq"], mine.hash)
        return Event(row["seq"], session, mine.ts, mine.kind, mine.body, mine.prev, mine.hash)

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
        if tail is None and known_n:
            problems.append(ChainProblem(known_n, "the session's head is gone from heads"))
        if tail is not None and tail.seq < known_n:
            problems.append(ChainProblem(tail.seq, f"the session's chain now ends here, before "
                                                   f"event {known_n} (events removed)"))
        prev, expected, prev_seq = known_hash, known_n + 1, 0
        for r in self._conn.execute(f"SELECT n, {_EVENT_COLUMNS} FROM events WHERE session = "
                                    f"%s AND n > %s ORDER BY n", (session, known_n)).fetchall():
            problems.extend(_link_problems(r, prev, expected, key, prev_seq))
            prev, expected, prev_seq = _advance(r, prev, expected, prev_seq)
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
        if not self._claim(session, grace=False):
            raise RecordError(f"session {session} is held by another Host that is still "
                              f"connected to the ledger", code="session_running")

    def try_claim(self, session: str) -> bool:
        """Take ``session``'s lock if no live Host holds it; whether it was taken.

        Just after the server started (for :data:`RECONNECT_GRACE` seconds), a session
        whose last event is older than the server's start is not taken: its Host may be
        waiting to connect again (docs/scale.md, "When a store is unavailable"), and the
        restart alone must not make it look abandoned."""
        return self._claim(session, grace=True)

    def _claim(self, session: str, *, grace: bool) -> bool:
        with self._lock:
            if session in self._claimed:
                return True
            return self._patiently("lock a session", lambda: self._take_lock(session, grace))

    def _take_lock(self, session: str, grace: bool) -> bool:
        conn = self._conn
        lock = _lock_id(session)
        if not _one(conn.execute("SELECT pg_try_advisory_lock(%s)", (lock,))):
            return False
        if grace:
            since, started, last = conn.execute(
                "SELECT extract(epoch FROM now() - pg_postmaster_start_time()), extract(epoch "
                "FROM pg_postmaster_start_time()), (SELECT e.ts FROM heads h JOIN events e ON "
                "e.seq = h.seq WHERE h.session = %s)", (session,)).fetchone()
            if float(since) < RECONNECT_GRACE and (type(last) is not float
                                                    or last < float(started)):
                conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))
                return False
        self._claimed.add(session)
        return True

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
        # A table once seen stays known (a reader asks for each before it reads it: ten
        # round trips a task's read-back); one that is not there is asked for again.
        if name in self._tables:
            return True
        found = bool(self.query("SELECT 1 FROM information_schema.tables WHERE "
                                "table_schema = ? AND table_name = ?", (PG_SCHEMA, name)))
        if found:
            self._tables.add(name)
        return found

    def sessions(self) -> list[str]:
        """Every session with events, in the order they started."""
        return [r[0] for r in self.query("SELECT session FROM events WHERE n = 1 "
                                         "ORDER BY seq")]

    def events(self, session: str | None = None) -> Iterator[Event]:
        return read_events(self, session)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        # Text with U+0000 cannot be sent; it is stored as U+FFFD (see the module).
        statement, values = _pg_sql(sql), tuple(_no_nul(p) for p in params)
        return self._patiently("read the ledger", lambda: list(
            self._conn.execute(statement, values).fetchall()))

    def close(self) -> None:
        with self._lock:
            self._claimed.clear()
            self._reclaim = []
            if self._conn is not None:
                self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@functools.lru_cache(maxsize=256)
def _row_class(names: tuple[str, ...]) -> type[Row]:
    return type("Row", (Row,), {"_index": {n: i for i, n in enumerate(names)}})


def _rows(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    """psycopg's row factory for the ledger's connections: rows read by index and by
    column name (:class:`~host_kernel.store.pgwire.Row`), one class per set of column
    names (an append reads three results, a statement's and its BEGIN's and COMMIT's)."""
    return _row_class(tuple(c.name for c in cursor.description or ()))


class _Lingering(Exception):
    """The server still holds a session's lock for this writer's own lost connection (it
    has not noticed it is gone): the attempt is made again once the server lets it go."""


def _one(cursor: Any) -> Any:
    """The first column of the one row a statement returns."""
    row = cursor.fetchone()
    assert row is not None
    return row[0]


def check_key(ledger: PostgresLedger, key: bytes) -> None:
    """Refuse (``record_key_invalid``) a key that is not the one the ledger's writers
    checked in (its ``key_check``): one clear refusal rather than every event's MAC
    failing. A ledger without a check value passes: its MACs are still checked, each."""
    rows = ledger.query("SELECT value FROM ledger_meta WHERE name = 'key_check'") \
        if ledger.has_table("ledger_meta") else []
    if rows and not hmac.compare_digest(str(rows[0][0]), _key_check(key)):
        raise RecordRefused(f"the record key given is not the key of the ledger at "
                            f"{redact_url(ledger.url)} (its writers use another one); point "
                            f"{KEY_ENV} at the ledger's key file", code="record_key_invalid")
