"""The hash chain both ledgers share: how an event is serialised, hashed and
authenticated, how events are read back, and every check of a chain.

Each event stores the sha256 of the previous event's hash (a chain), so an edited,
inserted or deleted event is found by :func:`check_chain`; each also carries a ``mac``,
HMAC-SHA256 of its hash under the record key (:mod:`host_kernel.store.keys`), and
:func:`check_macs` finds the events no holder of the key wrote. A SQLite ledger has one
chain per file; a PostgreSQL ledger one per session (:func:`session_chain_problems`,
:func:`session_mac_problems`, :func:`session_starts`), and a replay of one checks every
row it folds (:func:`replay_problems`).

Both backends import this module and never each other. It reads a ledger only through
the :class:`~host_kernel.store.base.Ledger` protocol; it creates no table and does not
fold events into the projection (:mod:`host_kernel.store.projection` does).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator, Sequence
from typing import Any

from .base import ChainProblem, Event, Ledger, RecordRefused

__all__ = ["GENESIS", "canonical_json", "check_chain", "check_macs", "event_hash", "event_mac",
           "read_events", "replay_problems", "session_chain_problems", "session_mac_problems",
           "session_starts"]


#: The "previous hash" of the first event in a ledger.
GENESIS = "0" * 64

#: The columns of an event, as both ledgers store them (PostgreSQL adds ``n``).
_EVENT_COLUMNS = "seq, session, ts, kind, body, prev, hash, mac"


# --------------------------------------------------------------------------- values


def canonical_json(value: Any) -> str:
    """The one serialisation used for event bodies and hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def event_hash(prev: str, seq: int, session: str, ts: float, kind: str, body: str) -> str:
    material = "\n".join((prev, str(seq), session, repr(ts), kind, body))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


def event_mac(key: bytes, digest: str) -> str:
    """HMAC-SHA256 under the record key of an event's hash (its hex text), as hex."""
    return hmac.digest(key, digest.encode("utf-8"), "sha256").hex()


def _mac_ok(key: bytes, digest: object, mac: object) -> bool:
    if not isinstance(mac, str) or not isinstance(digest, str):
        return False  # a column altered to another type holds no MAC of ours
    return hmac.compare_digest(mac.encode("utf-8", "surrogateescape"),
                               event_mac(key, digest).encode("ascii"))


def read_events(ledger: Ledger, session: str | None = None) -> Iterator[Event]:
    """The ledger's events (``session``'s only, when given) in ``seq`` order."""
    sql = "SELECT * FROM events"
    params: tuple[Any, ...] = ()
    if session is not None:
        sql += " WHERE session = ?"
        params = (session,)
    for row in ledger.query(sql + " ORDER BY seq", params):
        yield Event(row["seq"], row["session"], row["ts"], row["kind"],
                    json.loads(row["body"]), row["prev"], row["hash"])


def _foreign_message(problems: Sequence[ChainProblem], folder: str) -> str:
    seqs = sorted({p.seq for p in problems})
    shown = ", ".join(map(str, seqs[:10])) + (f" and {len(seqs) - 10} more" if len(seqs) > 10
                                              else "")
    return (f"the ledger holds events that break its chain or that no holder of the record "
            f"key wrote: event {shown} ({problems[0]}). Run `host-kernel audit {folder}`")


# --------------------------------------------------------------------------- checks


def _mac_select(ledger: Ledger) -> str:
    """``mac``, or ``NULL AS mac`` for a ledger from before MACs (read-only, not migrated)."""
    if _per_session(ledger):
        return "mac"
    columns = ledger.query("SELECT name FROM pragma_table_info('events')")
    return "mac" if any(r[0] == "mac" for r in columns) else "NULL AS mac"


def _per_session(ledger: Ledger) -> bool:
    """Whether each session has a chain of its own (PostgreSQL) rather than the whole file
    one (SQLite)."""
    return getattr(ledger, "chain_scope", "ledger") == "session"


def check_chain(ledger: Ledger, session: str | None = None) -> list[ChainProblem]:
    """Walk the chain; return every place where it breaks (empty when intact).

    A ledger with a chain per session (PostgreSQL) walks each session's, or only
    ``session``'s; SQLite's one chain is always walked whole.
    """
    if _per_session(ledger):
        return session_chain_problems(ledger, session)
    problems: list[ChainProblem] = []
    prev = GENESIS
    expected_seq = 1
    for row in ledger.query("SELECT seq, session, ts, kind, body, prev, hash FROM events "
                            "ORDER BY seq"):
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


def check_macs(ledger: Ledger, key: bytes, session: str | None = None) -> list[ChainProblem]:
    """Every event whose MAC the record key does not vouch for (empty when all do).

    Events with no MAC are accepted only before the first event that has one:
    they were written before the ledger had a ``mac`` column. A MAC-less event
    after that, or a MAC that does not match, was not written by a key holder.
    """
    if _per_session(ledger):  # no events from before MACs there: every one must have one
        where, params = ("WHERE session = ?", (session,)) if session is not None else ("", ())
        return [ChainProblem(r["seq"], "has no MAC (not written by a holder of the record "
                                       "key)" if r["mac"] is None else
                             "its MAC does not match the record key (not written by a holder "
                             "of the key)")
                for r in ledger.query(f"SELECT seq, hash, mac FROM events {where} ORDER BY seq",
                                      params)
                if not _mac_ok(key, r["hash"], r["mac"])]
    problems: list[ChainProblem] = []
    seen_mac = False
    for row in ledger.query(f"SELECT seq, hash, {_mac_select(ledger)} FROM events ORDER BY seq"):
        mac = row["mac"]
        if mac is None:
            if seen_mac:
                problems.append(ChainProblem(row["seq"], "has no MAC, though events before it "
                                                         "do (not written by a holder of the "
                                                         "record key)"))
            continue
        seen_mac = True
        if not _mac_ok(key, row["hash"], mac):
            problems.append(ChainProblem(row["seq"], "its MAC does not match the record key "
                                                     "(not written by a holder of the key)"))
    return problems


# --------------------------------------------------------------------------- per session


#: The Python type each column of ``events`` reads back as, as the schema made it.
_EVENT_TYPES: dict[str, tuple[type, ...]] = {
    "seq": (int,), "n": (int,), "ts": (float,), "session": (str,), "kind": (str,),
    "body": (str,), "prev": (str,), "hash": (str,), "mac": (str, type(None))}


def _odd_columns(r: Any) -> list[str]:
    """The columns of an events row that do not hold what the schema makes them hold (a
    column whose type was changed, or whose NOT NULL was dropped): such a row is never
    hashed or compared, only reported."""
    return [c for c, types in _EVENT_TYPES.items()
            # r is a row: ``in`` on it would look among its values, not its columns
            if c in r.keys() and type(r[c]) not in types]  # noqa: SIM118


def _seq_of(r: Any) -> int:
    """The row's ``seq`` for a ChainProblem (0 when it is not a number)."""
    return r["seq"] if type(r["seq"]) is int else 0


def _advance(r: Any, prev: str, expected: int, prev_seq: int) -> tuple[str, int, int]:
    """What the next event of the chain is checked against after ``r``: its hash, its
    place ``n + 1``, its ``seq`` (what was expected, where ``r`` holds no usable value)."""
    return (r["hash"] if type(r["hash"]) is str else prev,
            r["n"] + 1 if type(r["n"]) is int else expected + 1,
            r["seq"] if type(r["seq"]) is int else prev_seq)


def _link_problems(r: Any, prev: str, expected: int, key: bytes | None,
                   prev_seq: int = 0) -> list[ChainProblem]:
    """What is wrong with one event of a session's chain, given the one before it (its
    hash, its place ``n``, its ``seq``)."""
    odd = _odd_columns(r)
    if odd:
        verb = "holds" if len(odd) == 1 else "hold"
        return [ChainProblem(_seq_of(r), f"its {', '.join(odd)} {verb} no value of the "
                                         f"column's type (the events table was altered)")]
    problems: list[ChainProblem] = []
    seq, n = r["seq"], r["n"]
    if seq <= prev_seq:  # seq is not hashed; its order within a session is checked here
        problems.append(ChainProblem(seq, f"its seq comes before that of the session's event "
                                          f"{expected - 1} (events reordered)"))
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


def session_chain_problems(ledger: Ledger, session: str | None = None,
                           key: bytes | None = None) -> list[ChainProblem]:
    """Walk each session's chain (or ``session``'s): every break, and, with ``key``, every
    event its MAC does not vouch for; also a session whose recorded head is not its last
    event (its tail removed). Empty when intact."""
    problems: list[ChainProblem] = []
    where, params = ("WHERE session = ?", (session,)) if session is not None else ("", ())
    current: str | None = None
    prev, expected, prev_seq = GENESIS, 1, 0
    last: dict[str, tuple[int, str]] = {}
    for r in ledger.query(f"SELECT n, {_EVENT_COLUMNS} FROM events {where} "
                          f"ORDER BY session, n", params):
        if r["session"] != current:
            current, prev, expected, prev_seq = r["session"], GENESIS, 1, 0
        problems.extend(_link_problems(r, prev, expected, key, prev_seq))
        prev, expected, prev_seq = _advance(r, prev, expected, prev_seq)
        if type(r["session"]) is str:  # else reported above: no chain to end
            last[r["session"]] = (r["n"], r["hash"])
    for h in ledger.query(f"SELECT session, n, hash, seq FROM heads {where}", params):
        if h["n"] == 0:
            continue
        have = last.get(h["session"])
        if have is None or have != (h["n"], h["hash"]):
            problems.append(ChainProblem(h["seq"] if type(h["seq"]) is int else 0,
                                         f"session {h['session']}'s chain should end "
                                                   f"at its event {h['n']}, and it does not "
                                                   f"(events removed or rewritten)"))
    return sorted(problems, key=lambda p: p.seq)


def session_mac_problems(ledger: Ledger, key: bytes,
                         session: str | None = None) -> list[ChainProblem]:
    """Every event (of ``session``, when given) whose MAC ``key`` does not vouch for, in
    ``seq`` order; a row whose hash or MAC is not text (the table altered) among them."""
    where, params = ("WHERE session = ?", (session,)) if session is not None else ("", ())
    return [ChainProblem(r["seq"] if type(r["seq"]) is int else 0,
                         "has no MAC (not written by a holder of the record key)"
                         if r["mac"] is None else "its MAC does not match the record key "
                                                  "(not written by a holder of the key)")
            for r in ledger.query(f"SELECT seq, hash, mac FROM events {where} ORDER BY seq",
                                  params)
            if type(r["hash"]) is not str or not _mac_ok(key, r["hash"], r["mac"])]



def session_starts(ledger: Ledger, key: bytes | None) -> list[tuple[str, float | None]]:
    """Every session of the ledger (with events, or only a ``heads`` row), in the order
    they started, with the time its first event vouches for: None when that event is
    missing, was edited, or (with ``key``) carries no valid MAC, so that a selection by
    time never leaves out a session whose start cannot be trusted."""
    found: dict[str, tuple[int, float | None]] = {}
    for r in ledger.query(f"SELECT DISTINCT ON (session) n, {_EVENT_COLUMNS} FROM events "
                          f"ORDER BY session, n"):
        if type(r["session"]) is not str:
            continue  # no session can be named by it; a whole-ledger audit reports it
        trusted = not _link_problems(r, GENESIS, 1, key)
        found[r["session"]] = (r["seq"] if trusted else 0, r["ts"] if trusted else None)
    for h in ledger.query("SELECT session FROM heads WHERE n <> 0"):
        if type(h["session"]) is str and h["session"] not in found:
            found[h["session"]] = (0, None)  # its events are gone: its head says it had some
    return [(s, ts) for s, (_, ts) in sorted(found.items(), key=lambda item: item[1][0])]


def replay_problems(rows: Sequence[Any], key: bytes | None) -> None:
    """Check the rows a replay is about to fold (``seq`` order, whole sessions): each
    session's chain from its first event, and with ``key`` every MAC. Raises
    RecordRefused (``chain_broken`` or ``event_unauthenticated``) at the first problem,
    so what is replayed is what was checked, row for row."""
    state: dict[str, tuple[str, int, int]] = {}  # session: (prev hash, next n, last seq)
    for r in rows:
        session = r["session"] if type(r["session"]) is str else repr(r["session"])
        prev, expected, prev_seq = state.get(session, (GENESIS, 1, 0))
        problems = _link_problems(r, prev, expected, key, prev_seq)
        if problems:
            forged = [p for p in problems if "MAC" in p.problem]
            raise RecordRefused(f"the events read for the replay do not hold together "
                                f"({problems[0]}); the record was altered",
                                code="event_unauthenticated" if forged and len(forged) ==
                                len(problems) else "chain_broken")
        state[session] = _advance(r, prev, expected, prev_seq)
