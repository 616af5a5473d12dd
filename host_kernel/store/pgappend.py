"""The PostgreSQL ledger's append in one statement, one transaction, one round trip.

Owns :class:`OneStatementAppend`, the part of
:class:`~host_kernel.store.pg.PostgresLedger` that appends an event where the
session's head is where this writer left it (a Host appending to its own
session, nearly always): the head moved on and the next ``seq`` drawn, the
event inserted with it and the projection's rows written, as one prepared
statement sent with its ``BEGIN`` and ``COMMIT`` in one message. Where the
head is elsewhere the statement writes nothing and fails on a constraint, and
the ledger's two-step append (store/pg.py) reads the head and decides as it
always did. It owns the SQL that statement is built from; the connection, the
known heads, what a lost reply means and the two-step append stay in pg.py.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import Any

from .._errors import RecordError
from .base import Event, Head
from .chain import GENESIS, event_hash, event_mac
from .pgwire import _no_nul, _pg_sql
from .projection import project

__all__ = ["OneStatementAppend"]


class OneStatementAppend:
    """The one-statement append, for :class:`~host_kernel.store.pg.PostgresLedger` (which
    holds the connection ``_conn``, psycopg as ``_psycopg``, the heads this writer knows
    ``_known``, the append whose outcome is unknown ``_pending``, its last head ``_last``,
    and the statements prepared on its connection ``_prepared``/``_statements``)."""

    _conn: Any
    _psycopg: Any
    _known: dict[str, Head]
    _pending: tuple[int, Event] | None
    _last: Head | None
    _prepared: dict[str, str]
    _statements: int

    def _append_at_known_head(self, session: str, kind: str, body: dict[str, Any], key: bytes,
                              text: str, field: str | None, ts: float) -> Event | None:
        """The append as one statement in one transaction and one round trip, linked to the
        head this writer knows for ``session`` (none: a new session): the head moved on and
        the next ``seq`` drawn only if the session's ``heads`` row still says exactly that
        (its row lock held to the commit, as ``SELECT … FOR UPDATE`` holds it), the event
        inserted with that ``seq``, and the projection's rows.

        None, with nothing written, when the statement fails for the session or the
        tables (the head is elsewhere: another writer, a session this writer has not
        seen; a table altered): :meth:`_append` then reads the head and decides as it
        always did. Any other error (an outage, a lock held past ``lock_timeout``) is
        raised as it is; a connection lost under it leaves the event pending, to be
        looked for by the next attempt (:meth:`_landed`)."""
        known = self._known.get(session)
        n, prev = (1, GENESIS) if known is None else (known.seq + 1, known.hash)
        digest = event_hash(prev, n, session, ts, kind, text)
        event = Event(0, session, ts, kind, body, prev, digest)
        self._pending = (n, event)
        statements = _Statements()
        project(statements, _DRAWN, session, ts, kind, body,  # type: ignore[arg-type]
                text, field)
        head, head_params = ((_NEW_HEAD, (session, n, digest)) if known is None else
                             (_NEXT_HEAD, (n, digest, session, known.seq, known.hash)))
        parts = [head, _EVENT]
        values: list[Any] = [*head_params, session, n, ts, kind, text, prev, digest,
                             event_mac(key, digest)]
        for i, (sql, params) in enumerate(statements.taken):
            drawn = tuple(j for j, p in enumerate(params) if p is _DRAWN)
            parts.append(f"p{i} AS ({_pg_sql(sql, drawn)})")
            values += [_no_nul(p) for p in params if p is not _DRAWN]
        statement = f"WITH {', '.join(parts)} SELECT seq FROM e"
        conn = self._conn
        try:
            name = self._prepared.get(statement) or self._prepare(statement)
            # BEGIN, the statement and COMMIT as one message: one round trip, the plan made
            # once per connection, and a COMMIT whose reply, when it is lost, the next
            # attempt recognises (_landed). The values are quoted by psycopg's client-side
            # binding (ClientCursor), as literals of the prepared statement's types.
            cursor = self._psycopg.ClientCursor(conn)
            cursor.execute(f"BEGIN; EXECUTE {name}({', '.join(['%s'] * len(values))}); "
                           f"COMMIT", values)
        except self._psycopg.Error as exc:
            if conn.closed or conn.broken:
                raise
            if self._rolled_back():
                self._pending = None  # nothing of it was committed
            if exc.sqlstate == "26000":  # the statement is gone from the server's session
                self._prepared.pop(statement, None)
            if str(exc.sqlstate or "")[:2] not in _NOT_AT_KNOWN_HEAD:
                raise
            return None  # then the two-step append
        except BaseException:  # interrupted (Ctrl-C): no transaction is left open
            with contextlib.suppress(self._psycopg.Error):
                if not (conn.closed or conn.broken) and self._rolled_back():
                    self._pending = None
            raise
        cursor.nextset()  # past BEGIN's result, to the statement's
        row = cursor.fetchone()
        if row is None or type(row[0]) is not int:  # committed, but as no seq reads back
            raise RecordError(f"the ledger's events table was altered: {kind} was appended to "
                              f"session {session} but its seq does not read back as a number")
        seq = row[0]
        self._pending = None
        self._known[session] = Head(n, digest)
        self._last = Head(seq, digest)
        return Event(seq, session, ts, kind, body, prev, digest)

    def _rolled_back(self) -> bool:
        """End the transaction an append left open on the connection (it failed, or was
        interrupted before its COMMIT), rolled back; whether there was one."""
        if self._conn.info.transaction_status == self._psycopg.pq.TransactionStatus.IDLE:
            return False
        self._conn.execute("ROLLBACK")
        return True

    def _prepare(self, statement: str) -> str:
        """Prepare ``statement`` (psycopg's ``%s`` placeholders) on this connection, under a
        name no statement of this writer had before; its name."""
        self._statements += 1
        name = f"hk_append_{self._statements}"
        self._conn.execute(f"PREPARE {name} AS {_numbered(statement)}")
        self._prepared[statement] = name
        return name


#: The session's head moved on, and the next ``seq`` drawn, only where the ``heads`` row is
#: still the one this writer knows (an existing session), or a row made for a new session.
_NEXT_HEAD = ("h AS (UPDATE heads SET n = %s, hash = %s, seq = nextval('events_seq') "
              "WHERE session = %s AND n = %s AND hash = %s RETURNING seq)")
_NEW_HEAD = ("h AS (INSERT INTO heads (session, n, hash, seq) VALUES (%s, %s, %s, "
             "nextval('events_seq')) ON CONFLICT (session) DO NOTHING RETURNING seq)")
#: The event, with the ``seq`` its head drew. Where the head was elsewhere ``h`` returns
#: no row, the ``seq`` is NULL and its NOT NULL constraint fails the whole statement: a
#: row is written only together with its event, its head and its projection.
_EVENT = ("e AS (INSERT INTO events (seq, session, n, ts, kind, body, prev, hash, mac) "
          "VALUES ((SELECT seq FROM h), %s, %s, %s, %s, %s, %s, %s, %s) RETURNING seq)")
#: SQLSTATE classes with which the one-statement append gives way to the two-step one: a
#: constraint (the head elsewhere, a row already there), data or a column of another type
#: (a table altered), and its prepared statement gone from the connection's session.
_NOT_AT_KNOWN_HEAD = frozenset({"22", "23", "26", "42"})


class _DrawnSeq(int):
    """The ``seq`` the one-statement append draws, not known before it runs: the
    projection's statements read it from the statement's head (``h``)."""


_DRAWN = _DrawnSeq(0)


class _Statements:
    """What :func:`project` needs of a connection, taking its statements to be run in the
    append's one statement rather than running them."""

    def __init__(self) -> None:
        self.taken: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.taken.append((sql, tuple(params)))


@functools.lru_cache(maxsize=256)
def _numbered(statement: str) -> str:
    """``statement`` with psycopg's placeholders (``%s``, and ``%%`` for a ``%``) as
    PostgreSQL's own (``$1``, ``$2``…), for ``PREPARE``."""
    out: list[str] = []
    place, i = 0, 0
    while i < len(statement):
        ch = statement[i]
        if ch == "%" and statement[i + 1:i + 2] == "s":
            place += 1
            out.append(f"${place}")
            i += 2
        elif ch == "%" and statement[i + 1:i + 2] == "%":
            out.append("%")
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)
