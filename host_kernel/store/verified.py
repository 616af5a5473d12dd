"""Readers that verify: a record checked end to end before anything in it is shown.

Owns :func:`open_verified`, the one way a reader (``host-kernel lineage``,
``receipt``, ``export``, and any later viewer) opens a record: read-only, the
hash chain checked, every MAC checked when the record key can be read, the
projection rebuilt from the events alone and compared with the projection
tables on disk. It hands back only the rebuilt projection, so a stored value
that disagrees with the events is never shown; it refuses the record instead,
with a :class:`~host_kernel.store.base.RecordRefused` whose ``code`` says
why. It also owns :func:`projection_drift`, the comparison that ``audit``
reports finding by finding, and :func:`record_folder`, how a reader turns the
path it was given (a record folder or a workspace) into a record folder.

It never writes the record. It does not check blobs or re-verify submissions;
``host_kernel.audit`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from .._errors import RecordError, StoreUnavailable
from .._paths import LEDGER_NAME, LEGACY_RECORD_NAME, default_record_dir, find_record
from .base import Ledger, RecordRefused
from .chain import check_chain, check_macs, session_mac_problems
from .keys import key_path, load_record_key, read_key
from .pgwire import redact_url
from .projection import PROJECTION_TABLES
from .sqlite import SQLiteLedger, rebuild

__all__ = ["Drift", "LedgerRecord", "event_count", "open_verified", "open_verified_ledger",
           "projection_drift", "record_folder"]


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """A record kept in a PostgreSQL ledger (``url``): every session of it, or ``session``.

    The readers (:func:`open_verified`, and through it ``ls``, ``show``, ``lineage``,
    ``receipt``, ``export``) take one wherever they take a record folder.
    """

    url: str
    session: str | None = None

    def __str__(self) -> str:
        return f"--ledger {redact_url(self.url)}" + (
            f" session {self.session}" if self.session else "")


@overload
def record_folder(path: LedgerRecord) -> LedgerRecord: ...


@overload
def record_folder(path: str | Path) -> Path: ...


def record_folder(path: str | Path | LedgerRecord) -> Path | LedgerRecord:
    """The record folder ``path`` names: a record folder itself, or a workspace whose record
    is at its default place (outside it) or in its legacy ``.host_kernel`` folder.

    Raises RecordRefused (``record_missing``) when ``path`` is a file or there is
    no ledger in any of those places. A :class:`LedgerRecord` is handed back as it is.
    """
    if isinstance(path, LedgerRecord):
        return path
    root = Path(path)
    if root.is_file():
        raise RecordRefused(f"{path} is a file, not a record folder or a workspace",
                            code="record_missing")
    found = find_record(root)
    if found is None:
        raise RecordRefused(f"no record at {path}: no {LEDGER_NAME} in it, in its default "
                            f"record folder {default_record_dir(root)}, or in "
                            f"{root / LEGACY_RECORD_NAME}", code="record_missing")
    return found


@dataclass(frozen=True, slots=True)
class Drift:
    """One projection row on disk that the events do not produce as stored."""

    table: str
    key: str
    problem: str

    def __str__(self) -> str:
        return f"{self.table} {self.key}: {self.problem}"


def _key_text(values: tuple[Any, ...]) -> str:
    return "/".join(str(v) for v in values)


def _no_nul(value: Any) -> Any:
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


def _table_rows(ledger: Ledger, table: str, key: str, sessions: Sequence[str] | None = None,
                nul: bool = False) -> dict[tuple[Any, ...], dict[str, Any]] | None:
    if not ledger.has_table(table):
        return None
    names = [k.strip() for k in key.split(",")]
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    where = ""
    params: tuple[list[str], ...] = ()
    if sessions is not None:  # a PostgreSQL ledger: one array parameter
        where, params = "WHERE session = ANY(?)", (list(sessions),)
    for row in ledger.query(f"SELECT * FROM {table} {where} ORDER BY {key}", params):
        values = dict(zip(row.keys(), tuple(row), strict=True))
        if nul:
            values = {k: _no_nul(v) for k, v in values.items()}
        rows[tuple(values[n] for n in names)] = values
    return rows


def projection_drift(stored: Ledger, rebuilt: Ledger,
                     sessions: Sequence[str] | None = None) -> list[Drift]:
    """Every difference between the projection tables of ``stored`` and of ``rebuilt``
    (only ``sessions``' rows of ``stored``, when given: a PostgreSQL ledger whose
    ``rebuilt`` holds those sessions alone).

    Names the table, the row's key and the columns that differ, never the
    values (a drifted value is not to be shown as if it meant something). A
    PostgreSQL projection stores U+FFFD for U+0000 (its text cannot hold it): the
    rebuilt rows are compared with that replacement made.
    """
    found: list[Drift] = []
    nul = getattr(stored, "dialect", "sqlite") == "postgresql"
    for table, key in PROJECTION_TABLES:
        # The rebuilt ledger holds only the sessions it was rebuilt from.
        truth = _table_rows(rebuilt, table, key, nul=nul) or {}
        disk = _table_rows(stored, table, key, sessions)
        if disk is None:
            if truth:
                found.append(Drift(table, "*", "the table is missing from the ledger file"))
            continue
        for k in sorted(truth.keys() - disk.keys(), key=repr):
            found.append(Drift(table, _key_text(k), "row missing on disk (the events have it)"))
        for k in sorted(disk.keys() - truth.keys(), key=repr):
            found.append(Drift(table, _key_text(k), "row on disk that no event produces"))
        for k in sorted(disk.keys() & truth.keys(), key=repr):
            want, have = truth[k], disk[k]
            columns = sorted(c for c in want.keys() | have.keys() if want.get(c) != have.get(c)
                             or (c in want) != (c in have))
            if columns:
                found.append(Drift(table, _key_text(k), f"stored {', '.join(columns)} "
                                   f"differ{'s' if len(columns) == 1 else ''} from the events"))
    return found


def event_count(ledger: Ledger) -> int:
    """How many events the ledger holds; 0 when it has no events table at all."""
    if not ledger.has_table("events"):
        return 0
    return int(ledger.query("SELECT count(*) FROM events")[0][0])


def _refuse(problems: list[Any], what: str, code: str, root: Path) -> RecordRefused:
    more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
    return RecordRefused(f"{what} ({problems[0]}{more}); run `host-kernel audit {root}`",
                         code=code)


def open_verified(record_dir: str | Path | LedgerRecord) -> SQLiteLedger:
    """The record's projection rebuilt from its checked events, in memory; the caller closes it.

    Refuses, raising RecordRefused, with ``code``:

    - ``record_missing``: no ``ledger.sqlite`` in ``record_dir``;
    - ``ledger_empty``: a zero-byte ledger, or one with no events;
    - ``ledger_truncated``: not a SQLite database, or damaged or cut short;
    - ``chain_broken``: an event edited, inserted or deleted;
    - ``event_unauthenticated``: an event whose MAC the record key does not vouch
      for (checked only when ``record.key`` can be read);
    - ``record_unreadable``: an event the projection cannot replay;
    - ``projection_drift``: the projection tables on disk disagree with the events.

    A :class:`LedgerRecord` is opened with :func:`open_verified_ledger`.
    """
    if isinstance(record_dir, LedgerRecord):
        return open_verified_ledger(record_dir.url, record_dir.session)
    root = Path(record_dir)
    with SQLiteLedger.open_readonly(root / LEDGER_NAME) as stored:
        if event_count(stored) == 0:
            raise RecordRefused(f"the ledger in {root} holds no events", code="ledger_empty")
        problems = check_chain(stored)
        if problems:
            raise _refuse(problems, "the record's hash chain is broken", "chain_broken", root)
        try:
            key: bytes | None = load_record_key(root)
        except RecordRefused:
            key = None  # a reader that cannot read the key checks the chain only
        if key is not None:
            forged = check_macs(stored, key)
            if forged:
                raise _refuse(forged, "the record holds events no holder of its key wrote",
                              "event_unauthenticated", root)
        try:
            rebuilt = rebuild(stored)
        except (RecordRefused, StoreUnavailable):  # an outage stays one: it may be retried
            raise
        except RecordError as exc:
            raise RecordRefused(exc.message, code="record_unreadable") from exc
        try:
            drift = projection_drift(stored, rebuilt)
        except BaseException:
            rebuilt.close()
            raise
    if drift:
        rebuilt.close()
        raise _refuse(drift, "the projection tables on disk disagree with the events",
                      "projection_drift", root)
    return rebuilt


def open_verified_ledger(url: str, session: str | None = None, *,
                         key: bytes | None = None) -> SQLiteLedger:
    """:func:`open_verified` for a PostgreSQL ledger: ``session``'s projection (or every
    session's) rebuilt in memory from its checked chain, after the same checks, all in
    one read-only snapshot of the database.

    ``key``: the ledger's record key (default: its key file, as
    :func:`host_kernel.store.keys.key_path` finds it). Unlike a SQLite record, whose folder
    Landlock keeps from the kernel, a database on the network may have writers without
    the key: a PostgreSQL ledger is never shown without its MACs checked, and a missing
    key is ``record_key_missing``. Refuses with the same codes as :func:`open_verified`;
    ``record_missing`` when ``session`` has no events there.
    """
    from .pg import PostgresLedger, check_key

    where = f"--ledger {redact_url(url)}"
    with PostgresLedger.open_readonly(url) as stored, stored.snapshot():
        if not stored.has_table("events"):
            raise RecordRefused(f"the ledger at {redact_url(url)} holds no events",
                                code="ledger_empty")
        if key is None:
            key = read_key(key_path(stored.ledger_id()))
        check_key(stored, key)
        if session is not None and not stored.query(
                "SELECT 1 FROM events WHERE session = ? LIMIT 1", (session,)):
            raise RecordRefused(f"no session {session} in the ledger at {redact_url(url)}",
                                code="record_missing")
        problems = check_chain(stored, session)
        if problems:
            raise RecordRefused(f"the record's hash chain is broken ({problems[0]}); run "
                                f"`host-kernel audit {where}`", code="chain_broken")
        forged = session_mac_problems(stored, key, session)
        if forged:
            raise RecordRefused(f"the record holds events no holder of its key wrote "
                                f"({forged[0]}); run `host-kernel audit {where}`",
                                code="event_unauthenticated")
        try:
            rebuilt = rebuild(stored, session, key=key)
        except (RecordRefused, StoreUnavailable):  # an outage stays one: it may be retried
            raise
        except RecordError as exc:
            raise RecordRefused(exc.message, code="record_unreadable") from exc
        try:
            drift = projection_drift(stored, rebuilt,
                                     None if session is None else [session])
        except BaseException:
            rebuilt.close()
            raise
    if drift:
        rebuilt.close()
        raise RecordRefused(f"the projection tables on disk disagree with the events "
                            f"({drift[0]}); run `host-kernel audit {where}`",
                            code="projection_drift")
    return rebuilt
