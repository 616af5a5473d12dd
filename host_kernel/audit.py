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

It never writes: the ledger is opened with
:meth:`~host_kernel.store.ledger.SQLiteLedger.open_readonly` and the blob
store is only read. An empty or truncated ledger is a failure, never a clean
record. Every finding code is listed in docs/record.md.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._errors import HostKernelError, RecordError
from ._paths import LEDGER_NAME
from .host._workspace import file_sha256
from .modes import TaskMode
from .reproduce import RecordedRuns, Reproducer
from .reproduce.world import recorded_requirements
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
from .verify import NOT_REPRODUCED, RecordedFiles, RecordView, Submission, verify

__all__ = ["AuditReport", "Finding", "audit"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing audit found wrong (``fatal``) or worth saying (drift, notes: not fatal)."""

    code: str
    where: str
    message: str
    fatal: bool = True

    def __str__(self) -> str:
        mark = "FAIL" if self.fatal else "warn"
        return f"{mark} [{self.code}] {self.where}: {self.message}"


@dataclass
class AuditReport:
    record: str
    events: int = 0
    blobs: int = 0
    receipts: int = 0
    artifacts: int = 0
    lineage_inputs: int = 0
    submissions: int = 0
    #: Test evidence entries re-run (``audit --reproduce``).
    reproduced: int = 0
    #: The hash of the record's last event (its chain head); None when it has no events.
    head: str | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not any(f.fatal for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["clean"] = self.clean
        return d

    def summary(self) -> str:
        verdict = "clean" if self.clean else "FAILED"
        return (f"audit {verdict}: {self.events} events, {self.blobs} blobs, {self.receipts} "
                f"receipts, {self.artifacts} artifacts, {self.lineage_inputs} lineage inputs, "
                f"{self.submissions} accepted submissions re-verified"
                + (f", {self.reproduced} test commands re-run" if self.reproduced else "")
                + "; "
                f"{sum(f.fatal for f in self.findings)} failures, "
                f"{sum(not f.fatal for f in self.findings)} warnings")


Progress = Callable[[str, int, int], None]


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


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
        report.findings.append(Finding("chain_broken", f"event {problem.seq}", problem.problem))
    progress("chain", report.events, report.events)
    _check_macs(ledger, root, report)
    _check_head(ledger, report, expect_head)
    # Everything below reads projections rebuilt from the events, never the tables on disk.
    trusted = rebuild(ledger)
    try:
        for drift in projection_drift(ledger, trusted):
            report.findings.append(Finding("projection_drift", f"{drift.table} {drift.key}",
                                           drift.problem))
        blobs = _blob_store(root)
        _check_blobs(trusted, blobs, report, progress)
        _check_receipts(trusted, blobs, report)
        _check_lineage(trusted, blobs, report, strict)
        _check_submissions(trusted, blobs, report, root if reproduce else None)
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
                                       problem.problem))
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


class _AbsentBlobs(FileBlobStore):
    """A record folder with no blob store yet: read as empty, and nothing created."""

    def __init__(self, root: Path) -> None:  # no super(): it would create the folders
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.tmp = root / "tmp"
        self.durable = False

    def __iter__(self) -> Iterator[str]:
        if self.blobs.is_dir():
            yield from super().__iter__()


def _blob_store(root: Path) -> FileBlobStore:
    """The record's blob store, opened without creating its folders (audit never writes)."""
    if (root / "blobs" / "sha256").is_dir() and (root / "tmp").is_dir():
        return FileBlobStore(root, durable=False)
    return _AbsentBlobs(root)


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


def _check_receipts(ledger: SQLiteLedger, blobs: FileBlobStore, report: AuditReport) -> None:
    for row in ledger.query("SELECT receipt_id, body FROM receipts ORDER BY seq"):
        report.receipts += 1
        body = json.loads(row["body"])
        for stream in ("stdout", "stderr"):
            sha = body.get(f"{stream}_sha256", "")
            actual = blobs.hash_of(sha) if isinstance(sha, str) and len(sha) == 64 else None
            if actual is None:
                report.findings.append(Finding("receipt_stream_missing",
                                               f"receipt {row['receipt_id']}",
                                               f"its {stream} blob is missing"))
            elif actual != sha:
                report.findings.append(Finding("receipt_stream_altered",
                                               f"receipt {row['receipt_id']}",
                                               f"its {stream} no longer hashes to the receipt's "
                                               f"digest"))
    # A receipt the record once had and no longer has shows as a break in the chain; a
    # receipt cited by an accepted submission is re-checked there too.


def _check_lineage(ledger: SQLiteLedger, blobs: FileBlobStore, report: AuditReport,
                   strict: bool) -> None:
    workdirs = {r["session"]: r["workdir"] for r in ledger.query(
        "SELECT session, workdir FROM sessions")}
    artifacts = {r["artifact_id"] for r in ledger.query("SELECT artifact_id FROM artifacts")}
    handles: set[str] = set()
    for r in ledger.query("SELECT body FROM events WHERE kind = 'subtask_collected'"):
        body = json.loads(r["body"])
        handles.add(body.get("handle"))
        artifacts.update(a.get("artifact_id") for a in body.get("artifacts", ()))
    for row in ledger.query("SELECT artifact_id, session, lineage FROM artifacts ORDER BY seq"):
        lineage = json.loads(row["lineage"]) if row["lineage"] else None
        if not lineage:
            continue
        for item in lineage.get("inputs", []):
            report.lineage_inputs += 1
            where = f"artifact {row['artifact_id']} input {item.get('key')}"
            if item.get("handle"):
                if item["handle"] not in handles:
                    report.findings.append(Finding("lineage_dangling", where,
                                                   "names a sub-task the record never collected"))
                continue
            if item.get("artifact_id"):
                if item["artifact_id"] not in artifacts:
                    report.findings.append(Finding("lineage_dangling", where,
                                                   "names an artifact the record does not hold"))
                continue
            path, sha = item.get("path"), item.get("sha256")
            base = workdirs.get(row["session"])
            if not path or not sha or not base:
                continue
            # Opened beneath the workspace: a symlink out of it is not followed.
            root = Path(os.path.realpath(base))
            current = file_sha256(root / path, root=root)
            if current != sha:
                now = "is gone" if current is None else f"now hashes to {current[:12]}…"
                report.findings.append(Finding(
                    "lineage_drift", where,
                    f"recorded {sha[:12]}… ({item.get('hashed_at', 'at save')}); the file {now}",
                    fatal=strict))


def _check_submissions(ledger: SQLiteLedger, blobs: FileBlobStore, report: AuditReport,
                       reproduce_from: Path | None = None) -> None:
    sessions = {r["session"]: r for r in ledger.query("SELECT * FROM sessions")}
    # As in the Host: the re-run may read neither the record nor any session's workspace.
    hidden = [reproduce_from, *{r["workdir"] for r in sessions.values() if r["workdir"]}]
    live = None if reproduce_from is None else Reproducer(blobs, hidden=hidden)
    try:
        for row in ledger.query("SELECT seq, session, body FROM submissions WHERE accepted = 1 "
                                "ORDER BY seq"):
            report.submissions += 1
            body = json.loads(row["body"])
            session = sessions.get(row["session"])
            where = f"submission {body.get('submission_id')}"
            if session is None:
                report.findings.append(Finding("submission_orphaned", where,
                                               "its session is not in the record"))
                continue
            mode = TaskMode(session["mode"], bool(session["armed"]),
                            tuple(json.loads(session["signals"] or "[]")))
            given = body.get("verdict") or {}
            recorded = given.get("reproduction") or []
            if live is not None:  # the import world the Host built, from its requirements
                live.requirements = recorded_requirements(recorded)
            runs: Any = live or RecordedRuns(recorded)
            if "reproduction" not in given and mode.enforced:
                runs = NOT_REPRODUCED
                report.findings.append(Finding(
                    "submission_not_reproduced", where, "accepted by a Host older than "
                    "verification by reproduction: its tests were judged from the agent's "
                    "receipt; the other checks are re-verified", fatal=False))
            view = RecordView(ledger, blobs, row["session"], before=row["seq"])
            verdict, _ = verify(Submission.from_dict(body.get("submission", {})), mode=mode,
                                view=view, files=RecordedFiles(body.get("seen", {}), blobs),
                                submission_id=body.get("submission_id", "?"),
                                submit_seq=row["seq"], submitting_cell=body.get("cell_id"),
                                runs=runs)
            if not verdict.accepted:
                failed = "; ".join(f"[{c.code}] {c.message}" for c in verdict.failed
                                   if not c.advisory)
                report.findings.append(Finding("submission_unbacked", where,
                                               f"no longer verifies from the record: {failed}"))
            if live is not None:
                report.reproduced += len(verdict.reproduction)
                _compare_runs(where, recorded, verdict.reproduction, report)
    finally:
        if live is not None:
            live.close()


def _compare_runs(where: str, recorded: list[dict[str, Any]], again: tuple[dict[str, Any], ...],
                  report: AuditReport) -> None:
    """A re-run must end as the recorded run did, with the same counts."""
    for run in again:
        same = [r for r in recorded if r.get("tree_digest") == run.get("tree_digest")
                and r.get("invocation") == run.get("invocation")]
        if not same:
            report.findings.append(Finding("reproduction_differs", where,
                                           f"{run.get('command')!r}: the record holds no run of "
                                           f"this tree and command"))
            continue
        was, now = same[0], run
        if (was.get("outcome"), was.get("counts")) != (now.get("outcome"), now.get("counts")):
            host = (was.get("environment") or {}).get("host_overlay") or {}
            missing = [m.get("requirement") for m in host.get("missing") or []
                       if isinstance(m, dict)]
            why = (f"; the Host could not install {', '.join(map(str, missing[:5]))} when it "
                   f"ran" if missing else "")
            report.findings.append(Finding(
                "reproduction_differs", where,
                f"{run.get('command')!r}: recorded {was.get('outcome')} {was.get('counts')}, "
                f"re-run {now.get('outcome')} {now.get('counts')}{why}"))


def print_progress(stage: str, done: int, total: int) -> None:
    """A progress line on stderr for long audits (used by the CLI)."""
    if total >= 1000:
        print(f"\raudit: {stage} {done}/{total}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- a PostgreSQL ledger


def audit_ledger(url: str, *, sessions: list[str] | None = None, since: float | None = None,
                 key: bytes | None = None, without_key: bool = False, blobs: str | None = None,
                 expect_heads: dict[str, str] | None = None, strict: bool = False,
                 progress: Progress = _no_progress) -> AuditReport:
    """Audit a PostgreSQL ledger: every session in it, or those named (``sessions``: ids
    or unique prefixes), or those started at or after ``since`` (a Unix time), all read
    in one snapshot of the database.

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
    """
    from .store.pg import PostgresLedger, redact_url

    report = AuditReport(redact_url(url))
    try:
        ledger = PostgresLedger.open_readonly(url)
    except RecordError as exc:
        report.findings.append(Finding("record_unreadable", report.record, exc.message))
        return report
    try:
        with collector_paused(), ledger.snapshot():
            _audit_ledger(ledger, report, sessions, since, key, without_key, blobs, strict,
                          progress)
            _check_heads(ledger, report, expect_heads or {})
    except RecordRefused as exc:
        report.findings.append(Finding(exc.code if exc.code in _LEDGER_CODES
                                       else "record_unreadable", report.record, exc.message))
    except RecordError as exc:
        report.findings.append(Finding("record_unreadable", report.record, exc.message))
    finally:
        ledger.close()
    return report


#: Refusals of a PostgreSQL ledger that audit reports under their own code.
_LEDGER_CODES = frozenset({"chain_broken", "event_unauthenticated", "record_key_missing",
                           "record_key_invalid", "record_missing"})


def _check_heads(ledger: Any, report: AuditReport, expected: dict[str, str]) -> None:
    """Each session kept elsewhere with its last event's hash must still end there."""
    for session, want in sorted(expected.items()):
        rows = ledger.query("SELECT n, hash FROM events WHERE session = ? ORDER BY n DESC "
                            "LIMIT 1", (session,))
        if not rows:
            report.findings.append(Finding("head_mismatch", f"session {session}",
                                           "the ledger holds no event of this session (it "
                                           "was removed)"))
            continue
        if rows[0]["hash"] == want:
            continue
        kept = ledger.query("SELECT n FROM events WHERE session = ? AND hash = ?",
                            (session, want))
        why = (f"the kept head is its event {kept[0][0]}; {rows[0]['n'] - kept[0][0]} events "
               f"follow it" if kept else "no event of the session has the kept hash (its "
               "tail was removed or rewritten)")
        report.findings.append(Finding("head_mismatch", f"session {session}",
                                       f"the session ends at {rows[0]['hash'][:16]}…, not "
                                       f"{want[:16]}…: {why}"))


def _select_sessions(ledger: Any, names: list[str] | None, since: float | None,
                     report: AuditReport, key: bytes | None) -> list[str] | None:
    """The sessions to audit (None: all of them); a name that matches none is a finding.

    A session's start is read from its first event only when that event holds together
    (and, with ``key``, carries a valid MAC): a session whose start cannot be trusted (its
    first event edited, removed) is audited whatever ``since`` says, so that no one can
    move a session out of an audit by its time."""
    from .store.pg import session_starts

    if names is None and since is None:
        return None
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


def _audit_ledger(ledger: Any, report: AuditReport, names: list[str] | None,
                  since: float | None, key: bytes | None, without_key: bool,
                  blobs_url: str | None, strict: bool, progress: Progress) -> None:
    from .store.pg import check_key, key_path, read_key, session_mac_problems

    where = report.record
    if not ledger.has_table("events"):
        report.findings.append(Finding("ledger_empty", where, "the database holds no ledger "
                                                              "(no events table)"))
        return
    missing_key: RecordRefused | None = None
    if key is None:
        try:
            key = read_key(key_path(ledger.ledger_id()))
        except RecordRefused as exc:  # missing, unreadable: fatal unless without_key
            missing_key = exc
    if key is not None:
        check_key(ledger, key)
    chosen = _select_sessions(ledger, names, since, report, key)
    if chosen is not None and not chosen:
        if not report.findings:
            report.findings.append(Finding("ledger_empty", where, "no session matches"))
        return
    count_sql = "SELECT count(*) FROM events"
    params: tuple[list[str], ...] = ()
    if chosen is not None:
        count_sql += " WHERE session = ANY(?)"
        params = (chosen,)
    report.events = int(ledger.query(count_sql, params)[0][0])
    if report.events == 0:
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
    for one in [None] if chosen is None else chosen:
        for problem in check_chain(ledger, one):
            report.findings.append(Finding("chain_broken", f"event {problem.seq}",
                                           problem.problem))
        if key is not None:
            for problem in session_mac_problems(ledger, key, one):
                report.findings.append(Finding("event_unauthenticated",
                                               f"event {problem.seq}", problem.problem))
    progress("chain", report.events, report.events)
    if any(f.fatal for f in report.findings):
        return  # a replay of rows that do not hold together would only refuse again
    trusted = rebuild(ledger, sessions=chosen, key=key) if chosen is not None \
        else rebuild(ledger, key=key)
    try:
        for drift in projection_drift(ledger, trusted, chosen):
            report.findings.append(Finding("projection_drift", f"{drift.table} {drift.key}",
                                           drift.problem))
        blobs, unreadable = ledger_blob_sources(trusted, blobs_url)
        report.findings += unreadable
        _check_named_blobs(trusted, blobs, report, progress)
        _check_receipts(trusted, blobs, report)
        _check_lineage(trusted, blobs, report, strict)
        _check_submissions(trusted, blobs, report, None)
        open_sessions = trusted.query("SELECT session FROM sessions WHERE ended IS NULL")
        if open_sessions:
            report.findings.append(Finding(
                "sessions_open", where, f"{len(open_sessions)} sessions have not ended (still "
                f"running, or their Host died and no Host has closed them yet): "
                f"{', '.join(r[0] for r in open_sessions[:5])}", fatal=False))
    finally:
        trusted.close()


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
    from .store.fsblobs import FsspecBlobStore
    from .store.pg import redact_url

    unreadable: list[Finding] = []

    stores: list[Any] = []
    named: list[str] = []
    folders: list[Path] = []
    for row in trusted.query("SELECT body FROM events WHERE kind = 'session_started' "
                             "ORDER BY seq"):
        body = json.loads(row["body"])
        if isinstance(body.get("blobs"), str) and body["blobs"] not in named:
            named.append(body["blobs"])
        if isinstance(body.get("record_dir"), str):
            folders.append(Path(body["record_dir"]))
    for one in [url] if url is not None else named:
        if one is None:
            continue
        try:
            stores.append(FsspecBlobStore(one))
        except (HostKernelError, ValueError, ImportError) as exc:
            unreadable.append(Finding("blobs_unreadable", redact_url(one),
                                      f"the blob store cannot be opened: {exc}"))
    for folder in dict.fromkeys(folders):
        if (folder / "blobs" / "sha256").is_dir():
            stores.append(_blob_store(folder))
    return _BlobSources(stores), unreadable


def _check_named_blobs(ledger: SQLiteLedger, blobs: Any, report: AuditReport,
                       progress: Progress) -> None:
    """Every blob an audited ledger's sessions name, present and hashing to its name."""
    names: dict[str, str] = {}
    for row in ledger.query("SELECT artifact_id, filename, sha256 FROM artifacts ORDER BY seq"):
        report.artifacts += 1
        names.setdefault(row["sha256"], f"artifact {row['artifact_id']} ({row['filename']})")
    for row in ledger.query("SELECT body FROM events WHERE kind = 'subtask_collected' "
                            "ORDER BY seq"):
        body = json.loads(row["body"])
        for artifact in body.get("artifacts", ()):
            names.setdefault(str(artifact.get("sha256")),
                             f"sub-task {body.get('handle')} artifact "
                             f"{artifact.get('artifact_id')}")
    for i, (sha, what) in enumerate(names.items(), 1):
        try:
            actual = blobs.hash_of(sha) if len(sha) == 64 else None
        except HostKernelError as exc:  # the store could not be reached: not proof of loss
            report.findings.append(Finding("blobs_unreadable", what, str(exc)))
            continue
        report.blobs += 1
        if actual is None:
            report.findings.append(Finding("blob_missing", what, "its blob is in no store the "
                                                                 "audit could read"))
        elif actual != sha:
            report.findings.append(Finding("blob_altered", f"blob {sha}",
                                           "stored bytes do not hash to the blob's name"))
        if i % 1000 == 0:
            progress("blobs", i, len(names))
