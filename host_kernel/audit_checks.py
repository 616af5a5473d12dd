"""What both audits share: the report and its findings, and the checks run over a
projection rebuilt from checked events.

Owns :class:`Finding` (one thing found), :class:`AuditReport` (what an audit checked
and found), :class:`SessionAudit` (one session of a PostgreSQL ledger's audit: sound,
damaged with its first problem, or not checked, and what of it was verified),
:class:`Tally` (where a check puts what it found and counted: the report's totals and,
in a ledger's audit, the session it belongs to), the blob store of a record folder
opened without writing, and the checks of receipts, lineage and accepted submissions.

It opens no ledger and decides nothing about what is audited: :mod:`host_kernel.audit`
audits a record folder, :mod:`host_kernel.audit_ledger` a PostgreSQL ledger, and both
hand these checks a projection rebuilt from events they checked. It never writes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .host._workspace import file_sha256
from .modes import TaskMode
from .reproduce import RecordedRuns, Reproducer
from .reproduce.world import recorded_requirements
from .store.blobs import FileBlobStore
from .store.ledger import SQLiteLedger
from .verify import NOT_REPRODUCED, RecordedFiles, RecordView, Submission, verify

__all__ = ["NOT_CHECKED", "AuditReport", "Finding", "Progress", "SessionAudit", "Tally",
           "blob_store", "check_lineage", "check_receipts", "check_submissions", "no_progress"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing audit found wrong (``fatal``) or worth saying (drift, notes: not fatal)."""

    code: str
    where: str
    message: str
    fatal: bool = True
    #: The session it belongs to (a ledger's audit); None for the ledger or folder as a whole.
    session: str | None = None
    #: The ledger-wide ``seq`` of the event it was found at, when there is one.
    seq: int | None = None
    #: That event's place in its session's chain (1, 2, 3…), when known.
    session_seq: int | None = None
    #: What the audit expected to find there, in words.
    expected: str | None = None

    def __str__(self) -> str:
        mark = "FAIL" if self.fatal else "warn"
        return f"{mark} [{self.code}] {self.where}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """``code``, ``where``, ``message``, ``fatal``, and each of the rest that is known."""
        d: dict[str, Any] = {"code": self.code, "where": self.where, "message": self.message,
                             "fatal": self.fatal}
        for name in ("session", "seq", "session_seq", "expected"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        return d


#: Finding codes that say a session could not be checked (a blob store out of reach), not
#: that anything of it is damaged.
NOT_CHECKED = frozenset({"blobs_unreadable"})


@dataclass
class SessionAudit:
    """One session of a ledger's audit: what of it was verified, and what was found.

    ``status`` is ``sound`` (checked, nothing fatal), ``damaged`` (a fatal finding that
    proves damage: its first one is :attr:`problem`) or ``not_checked`` (a blob store it
    names could not be reached, or the audit stopped before it was done).
    """

    session: str
    #: How many events of the session the ledger holds.
    events: int = 0
    #: Events verified: all of them, or those before the first break in the chain.
    events_verified: int = 0
    artifacts: int = 0
    #: Blobs the session names that were read and hash to their names.
    blobs: int = 0
    receipts: int = 0
    lineage_inputs: int = 0
    #: Accepted verdicts re-verified from the record.
    verdicts: int = 0
    #: Whether every check of the session was run to its end.
    checked: bool = False
    findings: list[Finding] = field(default_factory=list)

    @property
    def status(self) -> str:
        fatal = [f for f in self.findings if f.fatal]
        if any(f.code not in NOT_CHECKED for f in fatal):
            return "damaged"
        return "not_checked" if fatal or not self.checked else "sound"

    @property
    def problem(self) -> Finding | None:
        """The first fatal finding: the first that proves damage, when one does."""
        fatal = [f for f in self.findings if f.fatal]
        damage = [f for f in fatal if f.code not in NOT_CHECKED]
        return (damage or fatal)[0] if fatal else None

    def verified(self) -> dict[str, int]:
        return {"events": self.events_verified, "artifacts": self.artifacts,
                "blobs": self.blobs, "receipts": self.receipts, "verdicts": self.verdicts}

    def to_dict(self) -> dict[str, Any]:
        problem = self.problem
        first = None if problem is None else {
            "code": problem.code, "seq": problem.seq, "session_seq": problem.session_seq,
            "expected": problem.expected, "message": problem.message, "where": problem.where}
        return {"id": self.session, "status": self.status, "events": self.events,
                "verified": self.verified(), "problem": first,
                "problems": sum(f.fatal for f in self.findings)}

    def line(self) -> str:
        """One line: the status, the session, and its first problem or what was verified."""
        status = self.status.replace("_", " ")
        problem = self.problem
        if problem is None:
            v = self.verified()
            return (f"{status:<11} {self.session}  {_n(v['events'], 'event')}, "
                    f"{_n(v['artifacts'], 'artifact')}, {_n(v['blobs'], 'blob')}, "
                    f"{_n(v['verdicts'], 'verdict')}" + ("" if self.checked else
                                                          "; its checks did not finish"))
        place = (f"event {problem.session_seq} (seq {problem.seq})"
                 if problem.session_seq is not None and problem.seq is not None
                 else problem.where)
        more = sum(f.fatal for f in self.findings) - 1
        return (f"{status:<11} {self.session}  {place}: [{problem.code}] {problem.message}"
                + (f"; expected {problem.expected}" if problem.expected else "")
                + (f" (and {more} more)" if more > 0 else ""))


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


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
    #: A ledger's audit: each session's own verdict, in the order they started (None for
    #: a record folder).
    sessions: list[SessionAudit] | None = None

    @property
    def clean(self) -> bool:
        return not any(f.fatal for f in self.findings)

    def counts(self) -> dict[str, int]:
        """How many sessions are sound, damaged, not checked (a ledger's audit)."""
        statuses = [s.status for s in self.sessions or ()]
        return {name: statuses.count(name) for name in ("sound", "damaged", "not_checked")}

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)
                             if f.name not in ("findings", "sessions")}
        d["findings"] = [f.to_dict() for f in self.findings]
        if self.sessions is not None:
            d["sessions"] = [s.to_dict() for s in self.sessions]
            d.update(self.counts())
        d["clean"] = self.clean
        return d

    def summary(self) -> str:
        verdict = "clean" if self.clean else "FAILED"
        sessions = ""
        if self.sessions is not None:
            c = self.counts()
            sessions = (f"{_n(c['sound'], 'session')} sound, {c['damaged']} damaged, "
                        f"{c['not_checked']} not checked; ")
        return (f"audit {verdict}: {sessions}{self.events} events, {self.blobs} blobs, "
                f"{self.receipts} receipts, {self.artifacts} artifacts, {self.lineage_inputs} "
                f"lineage inputs, {self.submissions} accepted submissions re-verified"
                + (f", {self.reproduced} test commands re-run" if self.reproduced else "")
                + "; "
                f"{sum(f.fatal for f in self.findings)} failures, "
                f"{sum(not f.fatal for f in self.findings)} warnings")


#: ``progress(stage, done, total)``: how far a long audit is.
Progress = Callable[[str, int, int], None]


def no_progress(stage: str, done: int, total: int) -> None:
    pass


#: The counter of a session that each of the report's counters adds to.
_SESSION_COUNTER = {"artifacts": "artifacts", "blobs": "blobs", "receipts": "receipts",
                    "lineage_inputs": "lineage_inputs", "submissions": "verdicts"}


class Tally:
    """Where the checks put what they find and count: the report, and in a ledger's audit
    (``sessions``) the session each item belongs to as well."""

    def __init__(self, report: AuditReport,
                 sessions: dict[str, SessionAudit] | None = None) -> None:
        self.report = report
        self.sessions = sessions

    def _audit(self, session: object) -> SessionAudit | None:
        if self.sessions is None or not isinstance(session, str):
            return None
        return self.sessions.get(session)

    def found(self, finding: Finding, session: object = None) -> None:
        """A finding of ``session`` (kept with that session), else of the whole record."""
        audit = self._audit(session)
        if audit is None:
            self.report.findings.append(finding)
        else:
            audit.findings.append(replace(finding, session=audit.session))

    def count(self, what: str, session: object = None, *, total: bool = True) -> None:
        """One more ``what`` (a counter of the report) checked, of ``session`` when given;
        ``total``: add it to the report's count too."""
        if total:
            setattr(self.report, what, getattr(self.report, what) + 1)
        audit = self._audit(session)
        if audit is not None and what in _SESSION_COUNTER:
            name = _SESSION_COUNTER[what]
            setattr(audit, name, getattr(audit, name) + 1)


# ---------------------------------------------------------------------- blobs


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


def blob_store(root: Path) -> FileBlobStore:
    """The record's blob store, opened without creating its folders (audit never writes)."""
    if (root / "blobs" / "sha256").is_dir() and (root / "tmp").is_dir():
        return FileBlobStore(root, durable=False)
    return _AbsentBlobs(root)


# ---------------------------------------------------------------------- the checks


def check_receipts(ledger: SQLiteLedger, blobs: Any, tally: Tally) -> None:
    """Every receipt's stdout and stderr blobs present and hashing to its digests."""
    for row in ledger.query("SELECT receipt_id, seq, session, body FROM receipts ORDER BY seq"):
        tally.count("receipts", row["session"])
        body = json.loads(row["body"])
        for stream in ("stdout", "stderr"):
            sha = body.get(f"{stream}_sha256", "")
            actual = blobs.hash_of(sha) if isinstance(sha, str) and len(sha) == 64 else None
            where = f"receipt {row['receipt_id']}"
            if actual is None:
                tally.found(Finding("receipt_stream_missing", where,
                                    f"its {stream} blob is missing", seq=row["seq"],
                                    expected=f"its {stream} in the blob store"),
                            row["session"])
            elif actual != sha:
                tally.found(Finding("receipt_stream_altered", where,
                                    f"its {stream} no longer hashes to the receipt's digest",
                                    seq=row["seq"],
                                    expected=f"{stream} bytes hashing to {str(sha)[:16]}…"),
                            row["session"])
    # A receipt the record once had and no longer has shows as a break in the chain; a
    # receipt cited by an accepted submission is re-checked there too.


def check_lineage(ledger: SQLiteLedger, blobs: Any, tally: Tally, strict: bool) -> None:
    """Every artifact's lineage inputs: sub-tasks and artifacts it names are in the record,
    and each input file still hashes as recorded (drift, fatal only when ``strict``)."""
    workdirs = {r["session"]: r["workdir"] for r in ledger.query(
        "SELECT session, workdir FROM sessions")}
    artifacts = {r["artifact_id"] for r in ledger.query("SELECT artifact_id FROM artifacts")}
    handles: set[str] = set()
    for r in ledger.query("SELECT body FROM events WHERE kind = 'subtask_collected'"):
        body = json.loads(r["body"])
        handles.add(body.get("handle"))
        artifacts.update(a.get("artifact_id") for a in body.get("artifacts", ()))
    for row in ledger.query("SELECT artifact_id, seq, session, lineage FROM artifacts "
                            "ORDER BY seq"):
        lineage = json.loads(row["lineage"]) if row["lineage"] else None
        if not lineage:
            continue
        session = row["session"]
        for item in lineage.get("inputs", []):
            tally.count("lineage_inputs", session)
            where = f"artifact {row['artifact_id']} input {item.get('key')}"
            if item.get("handle"):
                if item["handle"] not in handles:
                    tally.found(Finding("lineage_dangling", where, "names a sub-task the "
                                        "record never collected", seq=row["seq"]), session)
                continue
            if item.get("artifact_id"):
                if item["artifact_id"] not in artifacts:
                    tally.found(Finding("lineage_dangling", where, "names an artifact the "
                                        "record does not hold", seq=row["seq"]), session)
                continue
            path, sha = item.get("path"), item.get("sha256")
            base = workdirs.get(session)
            if not path or not sha or not base:
                continue
            # Opened beneath the workspace: a symlink out of it is not followed.
            root = Path(os.path.realpath(base))
            current = file_sha256(root / path, root=root)
            if current != sha:
                now = "is gone" if current is None else f"now hashes to {current[:12]}…"
                tally.found(Finding(
                    "lineage_drift", where,
                    f"recorded {sha[:12]}… ({item.get('hashed_at', 'at save')}); the file {now}",
                    fatal=strict, seq=row["seq"]), session)


def check_submissions(ledger: SQLiteLedger, blobs: Any, tally: Tally,
                      reproduce_from: Path | None = None) -> None:
    """Every accepted submission re-verified from the record alone; with
    ``reproduce_from`` (a record folder) its test evidence re-run and compared."""
    sessions = {r["session"]: r for r in ledger.query("SELECT * FROM sessions")}
    # As in the Host: the re-run may read neither the record nor any session's workspace.
    hidden = [reproduce_from, *{r["workdir"] for r in sessions.values() if r["workdir"]}]
    live = None if reproduce_from is None else Reproducer(blobs, hidden=hidden)
    try:
        for row in ledger.query("SELECT seq, session, body FROM submissions WHERE accepted = 1 "
                                "ORDER BY seq"):
            _check_submission(ledger, blobs, tally, row, sessions.get(row["session"]), live)
    finally:
        if live is not None:
            live.close()


def _check_submission(ledger: SQLiteLedger, blobs: Any, tally: Tally, row: Any,
                      session: Any, live: Reproducer | None) -> None:
    tally.count("submissions", row["session"])
    body = json.loads(row["body"])
    where = f"submission {body.get('submission_id')}"

    def found(code: str, message: str, fatal: bool = True) -> None:
        tally.found(Finding(code, where, message, fatal=fatal, seq=row["seq"]), row["session"])

    if session is None:
        found("submission_orphaned", "its session is not in the record")
        return
    mode = TaskMode(session["mode"], bool(session["armed"]),
                    tuple(json.loads(session["signals"] or "[]")))
    given = body.get("verdict") or {}
    recorded = given.get("reproduction") or []
    if live is not None:  # the import world the Host built, from its requirements
        live.requirements = recorded_requirements(recorded)
    runs: Any = live or RecordedRuns(recorded)
    if "reproduction" not in given and mode.enforced:
        runs = NOT_REPRODUCED
        found("submission_not_reproduced", "accepted by a Host older than verification by "
              "reproduction: its tests were judged from the agent's receipt; the other "
              "checks are re-verified", fatal=False)
    view = RecordView(ledger, blobs, row["session"], before=row["seq"])
    verdict, _ = verify(Submission.from_dict(body.get("submission", {})), mode=mode,
                        view=view, files=RecordedFiles(body.get("seen", {}), blobs),
                        submission_id=body.get("submission_id", "?"),
                        submit_seq=row["seq"], submitting_cell=body.get("cell_id"),
                        runs=runs)
    if not verdict.accepted:
        failed = "; ".join(f"[{c.code}] {c.message}" for c in verdict.failed
                           if not c.advisory)
        found("submission_unbacked", f"no longer verifies from the record: {failed}")
    if live is not None:
        tally.report.reproduced += len(verdict.reproduction)
        _compare_runs(recorded, verdict.reproduction, found)


def _compare_runs(recorded: list[dict[str, Any]], again: tuple[dict[str, Any], ...],
                  found: Callable[[str, str], None]) -> None:
    """A re-run must end as the recorded run did, with the same counts."""
    for run in again:
        same = [r for r in recorded if r.get("tree_digest") == run.get("tree_digest")
                and r.get("invocation") == run.get("invocation")]
        if not same:
            found("reproduction_differs", f"{run.get('command')!r}: the record holds no run "
                                          f"of this tree and command")
            continue
        was, now = same[0], run
        if (was.get("outcome"), was.get("counts")) != (now.get("outcome"), now.get("counts")):
            host = (was.get("environment") or {}).get("host_overlay") or {}
            missing = [m.get("requirement") for m in host.get("missing") or []
                       if isinstance(m, dict)]
            why = (f"; the Host could not install {', '.join(map(str, missing[:5]))} when it "
                   f"ran" if missing else "")
            found("reproduction_differs",
                  f"{run.get('command')!r}: recorded {was.get('outcome')} {was.get('counts')}, "
                  f"re-run {now.get('outcome')} {now.get('counts')}{why}")
