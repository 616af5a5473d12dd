"""``audit --ledger``'s one pass over a ledger's events: read once, chains checked, replayed.

Owns three steps of :func:`~host_kernel.audit_ledger.audit_ledger`: reading the
audited events once, in one query (:func:`read_events`); one pass over those
rows that vouches for each session whose chain, hashes, MACs and ``heads`` row
hold together (:func:`quick_chains`), deciding nothing that
:func:`~host_kernel.store.chain.session_chain_problems` would not (a session it
cannot vouch for is walked again by that function, which says what is wrong);
and the projection rebuilt from those same checked rows (:func:`replay`). It
reads and never writes; findings, sessions' verdicts and the other checks stay
in audit_ledger.py.
"""

from __future__ import annotations

import hmac
import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from ._errors import RecordError
from .store.chain import GENESIS, event_hash, event_mac
from .store.ledger import SQLiteLedger
from .store.projection import project

__all__ = ["quick_chains", "read_events", "replay"]


#: The columns of an event as the audit reads them, in this order.
_ROW = "n, seq, session, ts, kind, body, prev, hash, mac"


def read_events(ledger: Any, chosen: Sequence[str] | None) -> list[tuple[Any, ...]]:
    """The events of every session (of ``chosen``), in ``seq`` order, as plain tuples of
    :data:`_ROW`'s columns."""
    where, params = ("WHERE session = ANY(?)", (list(chosen),)) if chosen is not None \
        else ("", ())
    return [tuple(r) for r in ledger.query(f"SELECT {_ROW} FROM events {where} ORDER BY seq",
                                           params)]


def quick_chains(ledger: Any, rows: Sequence[tuple[Any, ...]], chosen: Sequence[str] | None,
                  key: bytes | None) -> tuple[set[str], bool]:
    """One pass over ``rows`` (every event of the sessions, in ``seq`` order): the sessions
    whose chain it cannot vouch for, and whether some row or ``heads`` row names no session.

    A session it vouches for holds together as
    :func:`~host_kernel.store.chain.session_chain_problems` requires (each column of its
    type, ``n`` 1, 2, 3… in ``seq`` order, each link, each hash, with ``key`` each MAC, and
    its ``heads`` row at its last event); any other session is checked again by that
    function, which says what is wrong. So this pass decides nothing that function would
    not, and reads nothing more."""
    state: dict[str, tuple[str, int, int]] = {}  # session: (last hash, next n, last seq)
    doubtful: set[str] = set()
    stray = False
    for n, seq, session, ts, kind, body, prev, digest, mac in rows:
        if type(session) is not str:
            stray = True
            continue
        if session in doubtful:
            continue
        want_prev, want_n, last_seq = state.get(session, (GENESIS, 1, 0))
        if type(n) is int and type(seq) is int and type(ts) is float and \
                type(kind) is str and type(body) is str and type(prev) is str and \
                type(digest) is str and (mac is None or type(mac) is str) and \
                seq > last_seq and n == want_n and prev == want_prev and \
                event_hash(prev, n, session, ts, kind, body) == digest and \
                (key is None or (mac is not None and _mac_matches(key, digest, mac))):
            state[session] = (digest, n + 1, seq)
        else:
            doubtful.add(session)
    where, params = ("WHERE session = ANY(?)", (list(chosen),)) if chosen is not None \
        else ("", ())
    for h in ledger.query(f"SELECT session, n, hash FROM heads {where}", params):
        session, n, digest = h[0], h[1], h[2]
        if n == 0:
            continue  # a session made and never appended to
        if type(session) is not str:
            stray = True
            continue
        last = state.get(session)
        if last is None or (last[1] - 1, last[0]) != (n, digest):
            doubtful.add(session)
    return doubtful, stray


def _mac_matches(key: bytes, digest: str, mac: str) -> bool:
    return hmac.compare_digest(mac.encode("utf-8", "surrogateescape"),
                               event_mac(key, digest).encode("ascii"))


def replay(rows: Sequence[tuple[Any, ...]], sessions: set[str]) -> SQLiteLedger:
    """The events of ``sessions`` among ``rows`` (``seq`` order, their chains and MACs
    checked in this snapshot) folded into a fresh in-memory ledger, as
    :func:`~host_kernel.store.sqlite.rebuild` folds them: the same rows checked and
    replayed, read once. Raises RecordError when an event cannot be replayed."""
    fresh = SQLiteLedger(None)
    conn = fresh._conn
    seq: Any = 0
    try:
        conn.execute("BEGIN")
        mine = [r for r in rows if r[2] in sessions]
        conn.executemany("INSERT INTO events (seq, session, ts, kind, body, prev, hash, mac) "
                         "VALUES (?,?,?,?,?,?,?,?)", [r[1:] for r in mine])
        for _, seq, session, ts, kind, text, _, _, _ in mine:
            body = json.loads(text)
            if not isinstance(body, dict):
                raise TypeError("body is not an object")
            project(conn, seq, session, ts, kind, body)
        conn.execute("COMMIT")
    except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
        fresh.close()
        raise RecordError(f"event {seq} cannot be replayed ({type(exc).__name__}: {exc}); "
                          f"the record was altered") from exc
    except BaseException:
        fresh.close()
        raise
    return fresh
