"""Offline audit: re-check a record folder from its own contents, without a kernel.

Owns the reviewer's question "is this record still what the Host wrote, and
does every accepted submission still stand?". It checks, in order: that the
ledger file is a whole SQLite database holding events; the hash chain of the
events; every event's MAC under the record key (when ``record.key`` can be
read); the chain's head against one the caller kept (``expect_head``); the
projection tables on disk against the projection rebuilt from the events;
every blob's sha256; every receipt's stored stdout and stderr digests; every
artifact's blob; every lineage input's recorded hash against the workspace
file now (drift: reported, fatal only when strict); and every accepted
submission, re-verified from the record alone (the source hashes the verdict
saw, the receipts and artifacts before it, and the reproduction the verdict
recorded for the same tree and command). With ``reproduce=True`` it also
re-runs every accepted submission's test evidence from the record (declared
files and baseline from the blob store) and compares the outcome with the
recorded one (``reproduction_differs``).

It also owns how a long audit's progress is shown (:func:`print_progress`), and is
where callers import every audit name: the report and the checks both audits share
are :mod:`host_kernel.audit_checks`'s, the audit of a PostgreSQL ledger, session by
session, :mod:`host_kernel.audit_ledger`'s (:func:`audit_ledger`).

It never writes: the ledger is opened with
:meth:`~host_kernel.store.ledger.SQLiteLedger.open_readonly` and the blob
store is only read. An empty or truncated ledger is a failure, never a clean
record. Every finding code is listed in docs/record.md.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ._errors import RecordError
from ._paths import LEDGER_NAME
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
)
from .audit_checks import no_progress as _no_progress
from .audit_ledger import audit_ledger, ledger_blob_sources
from .store.blobs import FileBlobStore
from .store.ledger import (
    KEY_NAME,
    RecordRefused,
    SQLiteLedger,
    check_chain,
    check_macs,
    collector_paused,
    load_record_key,
    rebuild,
)
from .store.verified import event_count, projection_drift

__all__ = ["AuditReport", "Finding", "ProgressLines", "SessionAudit", "audit", "audit_ledger",
           "ledger_blob_sources", "print_progress"]


def audit(record_dir: str | Path, *, strict: bool = False, expect_head: str | None = None,
          progress: Progress = _no_progress, reproduce: bool = False) -> AuditReport:
    """Audit the record folder; ``strict`` makes lineage drift fatal.

    ``expect_head``: the hash of the last event as it was kept elsewhere (printed
    by ``host-kernel exec``, returned by the Host); a record whose last event
    differs fails with ``head_mismatch``.
    """
    root = Path(record_dir)
    report = AuditReport(str(root))
    db = root / LEDGER_NAME
    if not db.is_file():
        report.findings.append(Finding("record_missing", str(root), f"no {LEDGER_NAME} here"))
        return report
    try:
        ledger = SQLiteLedger.open_readonly(db)
    except RecordError as exc:
        report.findings.append(_unreadable(exc, db))
        return report
    try:
        with collector_paused():
            _audit(ledger, root, report, strict, expect_head, progress, reproduce)
    except RecordError as exc:
        report.findings.append(_unreadable(exc, db))
    finally:
        ledger.close()
    return report


#: RecordRefused codes that audit reports under their own name.
_OWN_CODES = frozenset({"record_missing", "ledger_empty", "ledger_truncated"})


def _unreadable(exc: RecordError, db: Path) -> Finding:
    code = exc.code if isinstance(exc, RecordRefused) and exc.code in _OWN_CODES \
        else "record_unreadable"
    return Finding(code, str(db), exc.message)


def _audit(ledger: SQLiteLedger, root: Path, report: AuditReport, strict: bool,
           expect_head: str | None, progress: Progress, reproduce: bool = False) -> None:
    db = str(root / LEDGER_NAME)
    if ledger.wal_skipped:
        report.findings.append(Finding(
            "wal_unread", db, "its write-ahead log could not be read (no -shm file next to it, "
                              "or no permission); events committed only to the log were not "
                              "audited", fatal=False))
    damage = [r[0] for r in ledger.query("PRAGMA quick_check")]
    if damage != ["ok"]:
        report.findings.append(Finding("ledger_truncated", db, "SQLite finds the file damaged: "
                                       + "; ".join(map(str, damage[:3]))))
        return
    report.events = event_count(ledger)
    if report.events == 0:
        what = "no events" if ledger.has_table("events") else "no events table"
        report.findings.append(Finding("ledger_empty", db, f"the ledger holds {what}; an empty "
                                                           f"record is no evidence of anything"))
        return
    progress("chain", 0, report.events)
    for problem in check_chain(ledger):
        report.findings.append(Finding("chain_broken", f"event {problem.seq}", problem.problem,
                                       seq=problem.seq))
    progress("chain", report.events, report.events)
    _check_macs(ledger, root, report)
    _check_head(ledger, report, expect_head)
    # Everything below reads projections rebuilt from the events, never the tables on disk.
    trusted = rebuild(ledger)
    try:
        for drift in projection_drift(ledger, trusted):
            report.findings.append(Finding("projection_drift", f"{drift.table} {drift.key}",
                                           drift.problem))
        blobs = blob_store(root)
        tally = Tally(report)
        _check_blobs(trusted, blobs, report, progress)
        check_receipts(trusted, blobs, tally)
        check_lineage(trusted, blobs, tally, strict)
        check_submissions(trusted, blobs, tally, root if reproduce else None)
    finally:
        trusted.close()


def _check_macs(ledger: SQLiteLedger, root: Path, report: AuditReport) -> None:
    try:
        key = load_record_key(root)
    except RecordRefused as exc:
        report.findings.append(Finding("macs_unchecked", str(root / KEY_NAME),
                                       f"{exc.message}; the events' MACs were not checked, "
                                       f"only their chain", fatal=False))
        return
    for problem in check_macs(ledger, key):
        report.findings.append(Finding("event_unauthenticated", f"event {problem.seq}",
                                       problem.problem, seq=problem.seq))
    if ledger.has_table("events") and any(r[0] == "mac" for r in ledger.query(
            "SELECT name FROM pragma_table_info('events')")):
        legacy = ledger.query("SELECT count(*) FROM events WHERE mac IS NULL")[0][0]
    else:
        legacy = report.events
    if legacy:
        report.findings.append(Finding("events_without_mac", str(root / LEDGER_NAME),
                                       f"{legacy} events were written before the ledger had "
                                       f"MACs; they are checked by the chain only", fatal=False))


def _check_head(ledger: SQLiteLedger, report: AuditReport, expect_head: str | None) -> None:
    head = ledger.head()
    report.head = None if head is None else head.hash
    if expect_head is None or head is None:
        return
    expected = expect_head.strip().lower()
    if head.hash == expected:
        return
    rows = ledger.query("SELECT seq FROM events WHERE hash = ? ORDER BY seq LIMIT 1",
                        (expected,))
    if rows:
        seq = rows[0][0]
        why = (f"the expected head is event {seq}; {head.seq - seq} events follow it"
               if seq < head.seq else f"the expected head is event {seq}")
    else:
        why = "no event has the expected hash (the record was rewritten, or it is another one)"
    report.findings.append(Finding("head_mismatch", f"event {head.seq}",
                                   f"the record ends at {head.hash[:16]}…, not "
                                   f"{expected[:16]}…: {why}"))


def _check_blobs(ledger: SQLiteLedger, blobs: FileBlobStore, report: AuditReport,
                 progress: Progress) -> None:
    names = list(blobs)
    report.blobs = len(names)
    for i, name in enumerate(names, 1):
        if blobs.hash_of(name) != name:
            report.findings.append(Finding("blob_altered", f"blob {name}",
                                           "stored bytes do not hash to the blob's name"))
        if i % 1000 == 0:
            progress("blobs", i, len(names))
    for row in ledger.query("SELECT artifact_id, filename, sha256 FROM artifacts ORDER BY seq"):
        report.artifacts += 1
        if not blobs.exists(row["sha256"]):
            report.findings.append(Finding("blob_missing", f"artifact {row['artifact_id']}",
                                           f"the blob of {row['filename']} is missing"))
    # A collected sub-task's artifacts are kept in this record too (host.collect imports them).
    for row in ledger.query("SELECT body FROM events WHERE kind = 'subtask_collected' "
                            "ORDER BY seq"):
        body = json.loads(row["body"])
        for artifact in body.get("artifacts", ()):
            if not blobs.exists(str(artifact.get("sha256"))):
                report.findings.append(Finding(
                    "blob_missing", f"sub-task {body.get('handle')} artifact "
                    f"{artifact.get('artifact_id')}",
                    f"the collected blob of {artifact.get('filename')} is missing"))



# ---------------------------------------------------------------------- progress


#: The least a stage must have to do for its progress to be shown (items; default 1000).
_WORTH_SHOWING = {"sessions": 20}


@dataclass
class _Stage:
    shown_at: float = float("-inf")
    tenth: int = -1
    done: int = -1


class ProgressLines:
    """A long audit's progress on ``stream`` (default: ``sys.stderr`` as it is when called),
    ``progress(stage, done, total)``.

    On a terminal: one line rewritten in place (``\\r``), at most ten times a second, ended
    by a newline when the stage is done. Anywhere else (a pipe, a file, a CI log): a whole
    line per update shown, at most one a second unless the stage has moved on by a tenth
    of its total, and always its last, so a log holds lines, never carriage returns.
    A stage with less to do than 1000 items (20 sessions) shows nothing.
    """

    #: Seconds between two updates shown, on a terminal and elsewhere.
    TERMINAL_INTERVAL = 0.1
    LINE_INTERVAL = 1.0

    def __init__(self, stream: TextIO | None = None, *, prefix: str = "audit") -> None:
        self.stream = stream
        self.prefix = prefix
        self._stages: dict[str, _Stage] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if total < _WORTH_SHOWING.get(stage, 1000):
            return
        stream = self.stream if self.stream is not None else sys.stderr
        state = self._stages.get(stage)
        if state is None or done < state.done:  # a stage begun again starts afresh
            state = self._stages[stage] = _Stage()
        last = done >= total
        if last and state.done >= total:
            return  # its last line is already shown
        now = time.monotonic()
        tenth = min(10, done * 10 // total)
        try:
            terminal = stream.isatty()
        except (AttributeError, ValueError):
            terminal = False
        text = f"{self.prefix}: {stage} {done}/{total}"
        if terminal:
            if not last and now - state.shown_at < self.TERMINAL_INTERVAL:
                state.done = done
                return
            print(f"\r{text}", end="\n" if last else "", file=stream, flush=True)
        else:
            if not last and now - state.shown_at < self.LINE_INTERVAL and tenth <= state.tenth:
                state.done = done
                return
            print(text, file=stream, flush=True)
        state.shown_at, state.tenth, state.done = now, tenth, done


_progress = ProgressLines()


def print_progress(stage: str, done: int, total: int) -> None:
    """A long audit's progress on stderr, as :class:`ProgressLines` shows it (used by the
    CLI): lines rewritten in place on a terminal, whole lines anywhere else."""
    _progress(stage, done, total)
