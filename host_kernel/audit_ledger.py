"""The audit of a PostgreSQL ledger, session by session.

Owns :func:`audit_ledger`. Every session is checked on its own and gets a verdict of
its own (:class:`~host_kernel.audit_checks.SessionAudit`): **sound**; **damaged**, with
its first problem (the finding's code, the event's ``seq`` in the ledger and its place
in the session's chain, what was expected there, and the message); or **not checked**
(a blob store it names could not be reached, or the audit stopped before it was done).
A damaged session is left out of what follows its chain check (nothing is rebuilt from
events that do not hold together) and the audit goes on with the next one, so one
edited event never hides what is still intact. A problem of the ledger as a whole is
reported as such and stops the audit: no ledger there, its events table or another of
its tables missing, a key that is not the ledger's (``record_key_invalid``) or none
(``record_key_missing``), a database that cannot be read.

It also owns where a ledger's blobs are read from (:func:`ledger_blob_sources`, which
the viewer uses too). It reads the ledger through
:class:`~host_kernel.store.pg.PostgresLedger`'s reader, in one read-only snapshot, and
the chain's own checks (:mod:`host_kernel.store.chain`); it never writes. The audited
events are read once, in one query: each session's chain and MACs are checked on those
rows in one pass, and the projection is rebuilt from the very rows checked; only a
session that pass cannot vouch for is walked again by the chain's own checks, which say
what is wrong with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ._errors import HostKernelError, RecordError
from .audit_checks import (
    AuditReport,
    Finding,
    Progress,
    SessionAudit,
    Tally,
    blob_store,
    check_lineage,
    check_receipts,
    check_submissions,
    no_progress,
)
from .audit_pass import quick_chains, read_events, replay
from .store.base import ChainProblem
from .store.chain import GENESIS, event_hash, event_mac
from .store.ledger import RecordRefused, SQLiteLedger, collector_paused, rebuild
from .store.projection import PROJECTION_TABLES
from .store.verified import projection_drift

__all__ = ["audit_ledger", "ledger_blob_sources"]


def audit_ledger(url: str, *, sessions: list[str] | None = None, since: float | None = None,
                 key: bytes | None = None, without_key: bool = False, blobs: str | None = None,
                 expect_heads: dict[str, str] | None = None, strict: bool = False,
                 progress: Progress = no_progress) -> AuditReport:
    """Audit a PostgreSQL ledger: every session in it, or those named (``sessions``: ids
    or unique prefixes), or those started at or after ``since`` (a Unix time), all read
    in one snapshot of the database, each session on its own (``report.sessions``).

    Each session's chain and every event's MAC (``key``: default, the ledger's key file,
    :func:`host_kernel.store.pg.key_path`; a missing key is the fatal
    ``record_key_missing`` unless ``without_key``, which checks the chains only and says
    so with ``macs_unchecked``), the projection rows of those sessions against their
    events, then the same checks as for a record folder over the rebuilt projection:
    the blobs the sessions name (artifacts, receipts' outputs, collected sub-tasks'),
    lineage drift, and every accepted submission re-verified. Blobs are read from
    ``blobs`` (an fsspec URL), else from the store the sessions recorded
    (``session_started``'s ``blobs``), else from each session's own record folder when it
    is on this machine; a blob found in none is ``blob_missing``. ``expect_heads`` maps
    session ids to the hash their last event had when it was kept elsewhere (a batch's
    summaries): a session missing or ending elsewhere is ``head_mismatch``. Read-only.

    ``report.findings`` holds the ledger's own findings, then every session's; a session
    whose chain breaks is damaged and skipped by the checks after it, the others go on.
    """
    from .store.pg import PostgresLedger, redact_url

    report = AuditReport(redact_url(url), sessions=[])
    audits: dict[str, SessionAudit] = {}
    try:
        ledger = PostgresLedger.open_readonly(url)
    except RecordError as exc:
        report.findings.append(Finding("record_unreadable", report.record, exc.message))
        return report
    try:
        with collector_paused(), ledger.snapshot():
            _audit_ledger(ledger, report, audits, sessions, since, key, without_key, blobs,
                          strict, progress)
            _check_heads(ledger, Tally(report, audits), expect_heads or {})
    except RecordRefused as exc:
        report.findings.append(Finding(exc.code if exc.code in _LEDGER_CODES
                                       else "record_unreadable", report.record, exc.message))
    except RecordError as exc:
        report.findings.append(Finding("record_unreadable", report.record, exc.message))
    finally:
        ledger.close()
    report.sessions = list(audits.values())
    report.findings += [f for a in report.sessions for f in a.findings]
    return report


#: Refusals of a PostgreSQL ledger that audit reports under their own code.
_LEDGER_CODES = frozenset({"chain_broken", "event_unauthenticated", "record_key_missing",
                           "record_key_invalid", "record_missing", "projection_drift"})


def _audit_ledger(ledger: Any, report: AuditReport, audits: dict[str, SessionAudit],
                  names: list[str] | None, since: float | None, key: bytes | None,
                  without_key: bool, blobs_url: str | None, strict: bool,
                  progress: Progress) -> None:
    from .store.pg import check_key, key_path, read_key

    where = report.record
    if not ledger.has_table("events"):
        report.findings.append(Finding("ledger_empty", where, "the database holds no ledger "
                                                              "(no events table)"))
        return
    whole = names is None and since is None
    if whole:  # listed first: a stop for the ledger leaves each of them "not checked"
        _list_sessions(ledger, audits, None)
    _require_tables(ledger)
    missing_key: RecordRefused | None = None
    if key is None:
        try:
            key = read_key(key_path(ledger.ledger_id()))
        except RecordRefused as exc:  # missing, unreadable: fatal unless without_key
            missing_key = exc
    if key is not None:
        check_key(ledger, key)
    if not whole:
        chosen = _select_sessions(ledger, names, since, report, key)
        if not chosen:
            if not report.findings:
                report.findings.append(Finding("ledger_empty", where, "no session matches"))
            return
        _list_sessions(ledger, audits, chosen)
    report.events = sum(a.events for a in audits.values())
    if not audits:
        report.findings.append(Finding("ledger_empty", where, "the ledger holds no events; an "
                                                              "empty record is no evidence"))
        return
    if missing_key is not None:
        if not without_key:
            raise missing_key
        report.findings.append(Finding("macs_unchecked", where, f"{missing_key.message}; the "
                                       f"events' MACs were not checked, only their chains",
                                       fatal=False))
    progress("chain", 0, report.events)
    # Every event of the audited sessions read once, in one query: their chains and MACs
    # are checked on these rows, and the projection is rebuilt from these same rows.
    rows = read_events(ledger, None if whole else list(audits))
    _check_chains(ledger, audits, rows, whole, key, progress)
    progress("chain", report.events, report.events)
    sound = [s for s, a in audits.items() if not a.findings]
    trusted, sound = _rebuild(ledger, audits, sound, rows, key)
    del rows
    if trusted is None:
        return
    try:
        tally = Tally(report, audits)
        _check_drift(ledger, trusted, audits, sound, whole, tally)
        blobs, cannot_open = _blob_sources(trusted, blobs_url, tally)
        _check_named_blobs(trusted, blobs, tally, progress, cannot_open)
        check_receipts(trusted, blobs, tally)
        check_lineage(trusted, blobs, tally, strict)
        check_submissions(trusted, blobs, tally, None)
        _place(trusted, audits, sound)
        open_sessions = trusted.query("SELECT session FROM sessions WHERE ended IS NULL")
        if open_sessions:
            report.findings.append(Finding(
                "sessions_open", where, f"{len(open_sessions)} sessions have not ended (still "
                f"running, or their Host died and no Host has closed them yet): "
                f"{', '.join(r[0] for r in open_sessions[:5])}", fatal=False))
        for s in sound:
            audits[s].checked = True
    finally:
        trusted.close()


def _require_tables(ledger: Any) -> None:
    """A ledger missing one of its tables is refused as a whole (nothing in it can be
    checked against what is not there)."""
    for table in ("heads", *(t for t, _ in PROJECTION_TABLES)):
        if not ledger.has_table(table):
            raise RecordRefused(f"the ledger has no {table} table (it was dropped, or this is "
                                f"not a whole ledger); no session can be checked",
                                code="record_unreadable" if table == "heads"
                                else "projection_drift")


def _list_sessions(ledger: Any, audits: dict[str, SessionAudit],
                   chosen: Sequence[str] | None) -> None:
    """Every session (of ``chosen``) with events, or with only a ``heads`` row that says it
    had some, in the order they started, each with how many events it holds."""
    where, params = ("WHERE session = ANY(?)", (list(chosen),)) if chosen is not None \
        else ("", ())
    found: dict[str, tuple[int, int]] = {}
    for r in ledger.query(f"SELECT session, min(seq) AS first, count(*) AS events FROM events "
                          f"{where} GROUP BY session", params):
        if type(r["session"]) is not str:
            raise RecordRefused("the events table's session column holds no text (the table "
                                "was altered); no session can be named", code="chain_broken")
        found[r["session"]] = (r["first"] if type(r["first"]) is int else 0, int(r["events"]))
    heads = ledger.query(f"SELECT session, n, seq FROM heads {where}", params) \
        if ledger.has_table("heads") else []
    for h in heads:
        if type(h["session"]) is str and h["session"] not in found and h["n"] != 0:
            found[h["session"]] = (h["seq"] if type(h["seq"]) is int else 0, 0)
    for session in sorted(found, key=lambda s: (found[s][0], s)):
        audits[session] = SessionAudit(session, events=found[session][1])


def _select_sessions(ledger: Any, names: list[str] | None, since: float | None,
                     report: AuditReport, key: bytes | None) -> list[str]:
    """The sessions to audit; a name that matches none is a finding.

    A session's start is read from its first event only when that event holds together
    (and, with ``key``, carries a valid MAC): a session whose start cannot be trusted (its
    first event edited, removed) is audited whatever ``since`` says, so that no one can
    move a session out of an audit by its time."""
    from .store.pg import session_starts

    everyone = session_starts(ledger, key)
    chosen = [s for s, ts in everyone if since is None or ts is None or ts >= since]
    if names is not None:
        picked: list[str] = []
        for name in names:
            hits = [s for s in chosen if s == name] or [s for s in chosen if s.startswith(name)]
            if len(hits) != 1:
                report.findings.append(Finding(
                    "record_missing", f"session {name}",
                    "no session of the ledger has this id or prefix" if not hits else
                    f"the prefix names {len(hits)} sessions; give more of the id"))
                continue
            picked.append(hits[0])
        chosen = picked
    return chosen


# ---------------------------------------------------------------------- chains


def _check_chains(ledger: Any, audits: dict[str, SessionAudit], rows: Sequence[tuple[Any, ...]],
                  whole: bool, key: bytes | None, progress: Progress) -> None:
    """Each session's chain and MACs, on ``rows``; a session whose chain breaks gets its
    problems, the first described (where in the chain, what was expected there)."""
    from .store.pg import session_chain_problems

    doubtful, stray = quick_chains(ledger, rows, None if whole else list(audits), key)
    if stray or not doubtful <= audits.keys():
        _check_chains_exactly(ledger, audits, whole, key, progress)
        return
    _judge_chains(ledger, audits, key, progress, lambda session: session_chain_problems(
        ledger, session, key) if session in doubtful else [])


def _judge_chains(ledger: Any, audits: dict[str, SessionAudit], key: bytes | None,
                  progress: Progress, problems_of: Callable[[str], list[ChainProblem]]
                  ) -> None:
    """Each session's verdict on its chain: its findings (nothing more is checked of it),
    or all its events verified."""
    for i, (session, audit) in enumerate(audits.items(), 1):
        problems = problems_of(session)
        if problems:
            _chain_findings(ledger, audit, problems, key)
            audit.checked = True  # nothing more is checked of it: its verdict is in
        else:
            audit.events_verified = audit.events
        progress("sessions", i, len(audits))


def _check_chains_exactly(ledger: Any, audits: dict[str, SessionAudit], whole: bool,
                          key: bytes | None, progress: Progress) -> None:
    """:func:`_check_chains` for a ledger whose events or heads name no session (a column
    altered): every chain walked by the chain's own checks, which say where."""
    from .store.pg import session_chain_problems

    everywhere: list[ChainProblem] = []
    if whole:  # one walk over the whole ledger; one per session only where it breaks
        everywhere = session_chain_problems(ledger, None, key)
        if not everywhere:
            for a in audits.values():
                a.events_verified = a.events
            return
    _judge_chains(ledger, audits, key, progress,
                  lambda session: session_chain_problems(ledger, session, key))
    if everywhere and not any(a.findings for a in audits.values()):
        raise RecordRefused(f"the ledger's chains break outside any session it names "
                            f"({everywhere[0]}); the events table was altered",
                            code="chain_broken")


#: The Python type each column of ``events`` reads back as (see store/chain.py).
_TYPES: dict[str, tuple[type, ...]] = {
    "seq": (int,), "n": (int,), "ts": (float,), "session": (str,), "kind": (str,),
    "body": (str,), "prev": (str,), "hash": (str,), "mac": (str, type(None))}


def _odd(r: Any) -> bool:
    return any(type(r[c]) not in types for c, types in _TYPES.items())


def _chain_findings(ledger: Any, audit: SessionAudit, problems: list[ChainProblem],
                    key: bytes | None) -> None:
    """The session's chain problems as findings, the first in chain order first, with its
    place in the chain and what was expected there."""
    session = audit.session
    rows = ledger.query("SELECT n, seq, session, ts, kind, body, prev, hash, mac FROM events "
                        "WHERE session = ? ORDER BY seq", (session,))
    chain = sorted(rows, key=lambda r: r["n"] if type(r["n"]) is int else float("inf"))
    by_seq = {r["seq"]: r for r in chain if type(r["seq"]) is int}
    heads = ledger.query("SELECT n, hash, seq FROM heads WHERE session = ?", (session,))
    head = heads[0] if heads else None

    def row_of(p: ChainProblem) -> Any:
        if p.seq in by_seq:
            return by_seq[p.seq]
        return next((r for r in chain if _odd(r)), None) if p.seq == 0 else None

    def place(p: ChainProblem) -> float:
        r = row_of(p)
        if r is not None and type(r["n"]) is int:
            return float(r["n"])
        return float(head["n"]) if head is not None and type(head["n"]) is int \
            else float("inf")

    ordered = sorted(problems, key=place)
    for i, p in enumerate(ordered):
        r = row_of(p)
        n = r["n"] if r is not None and type(r["n"]) is int else None
        code = "event_unauthenticated" if "MAC" in p.problem else "chain_broken"
        if i:
            audit.findings.append(Finding(code, f"event {p.seq}", p.problem, session=session,
                                          seq=p.seq, session_seq=n))
            continue
        at_row = next((j for j, x in enumerate(chain) if x is r), None)
        before = chain[at_row - 1] if at_row else None
        broken = r is not None and _row_broken(r, before, key)
        at, expected = _expected(p, r if broken else None, before, head,
                                 chain[-1] if chain else None)
        audit.findings.append(Finding(code, f"event {p.seq}", p.problem, session=session,
                                      seq=p.seq, session_seq=at, expected=expected))
        audit.events_verified = at_row if broken and at_row is not None else len(chain)


def _expected(p: ChainProblem, r: Any, before: Any, head: Any,
              last: Any) -> tuple[int | None, str]:
    """Where in its session's chain (the event's ``n``) problem ``p`` was found, and what
    was expected there, in words: at row ``r`` (the event before it in the chain:
    ``before``), or, when ``r`` is None, at the session's end (its heads row ``head``,
    its last event ``last``). The chain's own checks decided that there is a problem;
    this only reads the rows again to say what it is."""
    if r is None:
        if head is not None and type(head["n"]) is int and type(head["hash"]) is str:
            ends = "" if last is None or type(last["n"]) is not int else \
                f"; it ends at its event {last['n']}"
            return head["n"], (f"the session's chain to end at its event {head['n']} "
                               f"({head['hash'][:16]}…), as its heads row says{ends}")
        return None, p.problem
    if _odd(r):
        return (r["n"] if type(r["n"]) is int else None,
                "every column of its row to hold a value of the column's type")
    n = r["n"]
    want_n, want_prev = (1, GENESIS) if before is None or _odd(before) else \
        (before["n"] + 1, before["hash"])
    if before is not None and not _odd(before) and r["seq"] <= before["seq"]:
        return n, (f"a seq after {before['seq']}, that of its event {before['n']} (events "
                   f"reordered)")
    if n != want_n:
        return n, f"its event {want_n} here, after its event {want_n - 1}"
    if r["prev"] != want_prev:
        return n, (f"a link to its event {want_n - 1}'s hash ({want_prev[:16]}…)"
                   if want_n > 1 else "the link of a session's first event (all zeros)")
    actual = event_hash(r["prev"], n, r["session"], r["ts"], r["kind"], r["body"])
    if actual != r["hash"]:
        return n, (f"content hashing to {r['hash'][:16]}…, its recorded hash (it hashes to "
                   f"{actual[:16]}…)")
    return n, "a MAC of its hash under the ledger's record key"


def _row_broken(r: Any, before: Any, key: bytes | None) -> bool:
    """Whether row ``r`` itself fails a check of its link (else the session's head does)."""
    if _odd(r) or (before is not None and _odd(before)):
        return True
    want_n, want_prev = (1, GENESIS) if before is None else (before["n"] + 1, before["hash"])
    if (before is not None and r["seq"] <= before["seq"]) or r["n"] != want_n \
            or r["prev"] != want_prev:
        return True
    if event_hash(r["prev"], r["n"], r["session"], r["ts"], r["kind"], r["body"]) != r["hash"]:
        return True
    return key is not None and r["mac"] != event_mac(key, r["hash"])


# ---------------------------------------------------------------------- the rebuilt projection


def _rebuild(ledger: Any, audits: dict[str, SessionAudit], sound: list[str],
             rows: Sequence[tuple[Any, ...]],
             key: bytes | None) -> tuple[SQLiteLedger | None, list[str]]:
    """The projection rebuilt from the ``sound`` sessions' events (their ``rows``, checked
    just before), and the sessions it holds: a session whose events cannot be replayed is
    damaged and left out, the others are rebuilt without it."""
    if not sound:
        return None, []
    try:
        return replay(rows, set(sound)), sound
    except RecordError:
        pass  # one session's events cannot be replayed: find which, one by one
    good: list[str] = []
    for session in sound:
        try:
            rebuild(ledger, session, key=key).close()
        except RecordRefused as exc:
            code = exc.code if exc.code in ("chain_broken", "event_unauthenticated") \
                else "record_unreadable"
            audits[session].findings.append(Finding(code, f"session {session}", exc.message,
                                                    session=session))
            audits[session].checked = True
            continue
        except RecordError as exc:
            ledger.query("SELECT 1")  # a ledger that cannot be read any more stops here
            audits[session].findings.append(Finding("record_unreadable", f"session {session}",
                                                    exc.message, session=session))
            audits[session].checked = True
            continue
        good.append(session)
    return (rebuild(ledger, sessions=good, key=key) if good else None), good


def _check_drift(ledger: Any, trusted: SQLiteLedger, audits: dict[str, SessionAudit],
                 sound: list[str], whole: bool, tally: Tally) -> None:
    """The stored projection rows against the rebuilt ones, each difference given to the
    session whose row it is; a row of no session audited is the ledger's (a whole-ledger
    audit compares every stored row, those of sessions with no events among them)."""
    drift = projection_drift(ledger, trusted, None if whole else sound)
    if not drift:
        return
    owners = _row_owners(ledger, trusted, {d.table for d in drift})
    checked = set(sound)
    for d in drift:
        finding = Finding("projection_drift", f"{d.table} {d.key}", d.problem,
                          expected="the row as the session's events make it"
                          if "differ" in d.problem else None)
        mine = [s for s in owners.get((d.table, d.key), ()) if s in audits]
        if not mine:
            tally.found(finding)
        for session in mine:
            if session in checked:  # a damaged session's rows are rebuilt from nothing
                tally.found(finding, session)


def _row_owners(ledger: Any, trusted: SQLiteLedger,
                tables: set[str]) -> dict[tuple[str, str], set[Any]]:
    """``(table, key as Drift names it)``: the sessions the rows so keyed belong to, stored
    or rebuilt."""
    owners: dict[tuple[str, str], set[Any]] = {}
    for table, key in PROJECTION_TABLES:
        if table not in tables:
            continue
        for side in (ledger, trusted):
            for r in side.query(f"SELECT session, {key} FROM {table}"):
                values = tuple(_no_nul(v) for v in tuple(r)[1:])
                owners.setdefault((table, "/".join(str(v) for v in values)), set()).add(r[0])
    return owners


def _no_nul(value: Any) -> Any:
    """As the stored projection holds text (PostgreSQL's text has no U+0000)."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


def _place(trusted: SQLiteLedger, audits: dict[str, SessionAudit], sound: list[str]) -> None:
    """Each sound session's findings at an event: that event's place in its chain."""
    for session in sound:
        audit = audits[session]
        for i, f in enumerate(audit.findings):
            if f.seq is not None and f.session_seq is None:
                n = trusted.query("SELECT count(*) FROM events WHERE session = ? AND seq <= ?",
                                  (session, f.seq))[0][0]
                audit.findings[i] = replace(f, session_seq=int(n))


def _check_heads(ledger: Any, tally: Tally, expected: dict[str, str]) -> None:
    """Each session kept elsewhere with its last event's hash must still end there."""
    for session, want in sorted(expected.items()):
        rows = ledger.query("SELECT n, hash FROM events WHERE session = ? ORDER BY n DESC "
                            "LIMIT 1", (session,))
        where = f"session {session}"
        if not rows:
            tally.found(Finding("head_mismatch", where, "the ledger holds no event of this "
                                                        "session (it was removed)"), session)
            continue
        if rows[0]["hash"] == want:
            continue
        kept = ledger.query("SELECT n FROM events WHERE session = ? AND hash = ?",
                            (session, want))
        why = (f"the kept head is its event {kept[0][0]}; {rows[0]['n'] - kept[0][0]} events "
               f"follow it" if kept else "no event of the session has the kept hash (its "
               "tail was removed or rewritten)")
        tally.found(Finding("head_mismatch", where, f"the session ends at "
                            f"{rows[0]['hash'][:16]}…, not {want[:16]}…: {why}",
                            seq=None, session_seq=rows[0]["n"],
                            expected=f"its last event to hash to {want[:16]}…"), session)


# ---------------------------------------------------------------------- blobs


class _BlobSources:
    """Blobs read from the first of several stores that has them, each read verified."""

    def __init__(self, stores: list[Any]) -> None:
        self.stores = stores

    def _find(self, sha256: str) -> Any:
        for store in self.stores:
            if store.exists(sha256):
                return store
        return None

    def exists(self, sha256: str) -> bool:
        return self._find(sha256) is not None

    def hash_of(self, sha256: str) -> str | None:
        store = self._find(sha256)
        return None if store is None else store.hash_of(sha256)

    def read(self, sha256: str) -> bytes:
        store = self._find(sha256)
        if store is None:
            return self.stores[0].read(sha256) if self.stores else b""
        return bytes(store.read(sha256))

    def open(self, sha256: str) -> Any:
        store = self._find(sha256) or (self.stores[0] if self.stores else None)
        if store is None:
            raise FileNotFoundError(sha256)
        return store.open(sha256)

    def __iter__(self) -> Iterator[str]:
        return iter(())


def ledger_blob_sources(trusted: SQLiteLedger, url: str | None) -> tuple[Any, list[Finding]]:
    """Where a PostgreSQL ledger's blobs are, read from its verified projection
    ``trusted``: the store at ``url`` when given, else the stores its sessions named, then
    each session's record folder on this machine (all read-only; each read verified). With
    them, a ``blobs_unreadable`` finding for each store that could not be opened."""
    sources, unreadable, _ = _open_stores(trusted, url)
    return sources, [finding for _, finding in unreadable]


def _open_stores(trusted: SQLiteLedger, url: str | None) -> tuple[
        _BlobSources, list[tuple[str, Finding]], dict[str, str]]:
    """The stores, each store that could not be opened (its URL, the finding), and the
    store each session named."""
    from .store.fsblobs import FsspecBlobStore
    from .store.pg import redact_url

    unreadable: list[tuple[str, Finding]] = []
    stores: list[Any] = []
    named: dict[str, str] = {}
    folders: list[Path] = []
    for row in trusted.query("SELECT session, body FROM events WHERE kind = 'session_started' "
                             "ORDER BY seq"):
        body = json.loads(row["body"])
        if isinstance(body.get("blobs"), str):
            named.setdefault(row["session"], body["blobs"])
        if isinstance(body.get("record_dir"), str):
            folders.append(Path(body["record_dir"]))
    for one in [url] if url is not None else list(dict.fromkeys(named.values())):
        if one is None:
            continue
        try:
            stores.append(FsspecBlobStore(one))
        except (HostKernelError, ValueError, ImportError) as exc:
            unreadable.append((one, Finding("blobs_unreadable", redact_url(one),
                                            f"the blob store cannot be opened: {exc}")))
    for folder in dict.fromkeys(folders):
        if (folder / "blobs" / "sha256").is_dir():
            stores.append(blob_store(folder))
    return _BlobSources(stores), unreadable, named


def _blob_sources(trusted: SQLiteLedger, url: str | None,
                  tally: Tally) -> tuple[_BlobSources, dict[str, str]]:
    """The stores to read blobs from; each store that could not be opened is the ledger's
    finding, and each session that relies on one (it named it, or it is ``url``) is
    mapped to it: a blob of that session found nowhere was not looked for everywhere."""
    from .store.pg import redact_url

    sources, unreadable, named = _open_stores(trusted, url)
    for _, finding in unreadable:
        tally.found(finding)
    gone = {one for one, _ in unreadable}
    if url is not None:
        everyone = [r[0] for r in trusted.query("SELECT session FROM sessions")]
        return sources, ({s: redact_url(url) for s in everyone} if url in gone else {})
    return sources, {s: redact_url(one) for s, one in named.items() if one in gone}


def _check_named_blobs(ledger: SQLiteLedger, blobs: Any, tally: Tally, progress: Progress,
                       cannot_open: dict[str, str]) -> None:
    """Every blob an audited ledger's sessions name, present and hashing to its name; a
    blob several sessions name is read once and counts for each of them."""
    names: dict[str, tuple[str, int | None, list[str]]] = {}
    for row in ledger.query("SELECT artifact_id, seq, session, filename, sha256 FROM "
                            "artifacts ORDER BY seq"):
        tally.count("artifacts", row["session"])
        what = f"artifact {row['artifact_id']} ({row['filename']})"
        names.setdefault(row["sha256"], (what, row["seq"], []))[2].append(row["session"])
    for row in ledger.query("SELECT seq, session, body FROM events WHERE kind = "
                            "'subtask_collected' ORDER BY seq"):
        body = json.loads(row["body"])
        for artifact in body.get("artifacts", ()):
            what = f"sub-task {body.get('handle')} artifact {artifact.get('artifact_id')}"
            names.setdefault(str(artifact.get("sha256")), (what, row["seq"], []))[2].append(
                row["session"])
    for i, (sha, (what, seq, owners)) in enumerate(names.items(), 1):
        for finding, session in _one_blob(blobs, sha, what, seq, owners, cannot_open, tally):
            tally.found(finding, session)
        if i % 1000 == 0:
            progress("blobs", i, len(names))


def _one_blob(blobs: Any, sha: str, what: str, seq: int | None, owners: list[str],
              cannot_open: dict[str, str], tally: Tally) -> Iterator[tuple[Finding, str]]:
    sessions = list(dict.fromkeys(owners))
    try:
        actual = blobs.hash_of(sha) if len(sha) == 64 else None
    except HostKernelError as exc:  # the store could not be reached: not proof of loss
        for s in sessions:
            yield Finding("blobs_unreadable", what, str(exc), seq=seq), s
        return
    tally.count("blobs")
    if actual == sha:
        for s in sessions:
            tally.count("blobs", s, total=False)
        return
    for s in sessions:
        if actual is None and s in cannot_open:
            yield Finding("blobs_unreadable", what, f"its blob is in no store the audit could "
                          f"read, and {cannot_open[s]} could not be opened", seq=seq), s
        elif actual is None:
            yield Finding("blob_missing", what, "its blob is in no store the audit could read",
                          seq=seq, expected=f"a blob with sha256 {sha[:16]}…"), s
        else:
            yield Finding("blob_altered", f"blob {sha}", "stored bytes do not hash to the "
                          "blob's name", seq=seq, expected=f"bytes hashing to {sha[:16]}…"), s

