"""Offline audit: re-check a record folder from its own contents, without a kernel.

Owns the reviewer's question "is this record still what the Host wrote, and
does every accepted submission still stand?". It checks, in order: the hash
chain of the events; every blob's sha256; every receipt's stored stdout and
stderr digests; every artifact's blob; every lineage input's recorded hash
against the workspace file now (drift: reported, fatal only when strict); and
every accepted submission, re-verified from the record alone (the source hashes
the verdict saw, the receipts and artifacts before it). It never changes the
record.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._errors import RecordError
from .host._workspace import file_sha256
from .modes import TaskMode
from .store.blobs import FileBlobStore
from .store.ledger import SQLiteLedger, check_chain, rebuild
from .verify import RecordedFiles, RecordView, Submission, verify

__all__ = ["AuditReport", "Finding", "audit"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing audit found wrong (``fatal``) or worth saying (drift, not fatal)."""

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
                f"{self.submissions} accepted submissions re-verified; "
                f"{sum(f.fatal for f in self.findings)} failures, "
                f"{sum(not f.fatal for f in self.findings)} warnings")


Progress = Callable[[str, int, int], None]


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


def audit(record_dir: str | Path, *, strict: bool = False,
          progress: Progress = _no_progress) -> AuditReport:
    """Audit the record folder; ``strict`` makes lineage drift fatal."""
    root = Path(record_dir)
    report = AuditReport(str(root))
    db = root / "ledger.sqlite"
    if not db.is_file():
        report.findings.append(Finding("record_missing", str(root), "no ledger.sqlite here"))
        return report
    try:
        ledger = SQLiteLedger(db)
    except RecordError as exc:
        report.findings.append(Finding("record_unreadable", str(db), str(exc)))
        return report
    try:
        _audit(ledger, FileBlobStore(root, durable=False), report, strict, progress)
    except RecordError as exc:
        report.findings.append(Finding("record_unreadable", str(db), str(exc)))
    finally:
        ledger.close()
    return report


def _audit(ledger: SQLiteLedger, blobs: FileBlobStore, report: AuditReport, strict: bool,
           progress: Progress) -> None:
    report.events = ledger.query("SELECT count(*) FROM events")[0][0]
    progress("chain", 0, report.events)
    for problem in check_chain(ledger):
        report.findings.append(Finding("chain_broken", f"event {problem.seq}", problem.problem))
    progress("chain", report.events, report.events)
    # Everything below reads projections rebuilt from the events, never the tables on disk.
    trusted = rebuild(ledger)
    try:
        _check_blobs(trusted, blobs, report, progress)
        _check_receipts(trusted, blobs, report)
        _check_lineage(trusted, blobs, report, strict)
        _check_submissions(trusted, blobs, report)
    finally:
        trusted.close()


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
    for row in ledger.query("SELECT artifact_id, session, lineage FROM artifacts ORDER BY seq"):
        lineage = json.loads(row["lineage"]) if row["lineage"] else None
        if not lineage:
            continue
        for item in lineage.get("inputs", []):
            report.lineage_inputs += 1
            where = f"artifact {row['artifact_id']} input {item.get('key')}"
            if item.get("artifact_id"):
                if item["artifact_id"] not in artifacts:
                    report.findings.append(Finding("lineage_dangling", where,
                                                   "names an artifact the record does not hold"))
                continue
            path, sha = item.get("path"), item.get("sha256")
            base = workdirs.get(row["session"])
            if not path or not sha or not base:
                continue
            current = file_sha256(Path(base) / path)
            if current != sha:
                now = "is gone" if current is None else f"now hashes to {current[:12]}…"
                report.findings.append(Finding(
                    "lineage_drift", where,
                    f"recorded {sha[:12]}… ({item.get('hashed_at', 'at save')}); the file {now}",
                    fatal=strict))


def _check_submissions(ledger: SQLiteLedger, blobs: FileBlobStore, report: AuditReport) -> None:
    sessions = {r["session"]: r for r in ledger.query("SELECT * FROM sessions")}
    for row in ledger.query("SELECT seq, session, body FROM submissions WHERE accepted = 1 "
                            "ORDER BY seq"):
        report.submissions += 1
        body = json.loads(row["body"])
        session = sessions.get(row["session"])
        if session is None:
            report.findings.append(Finding("submission_orphaned", f"submission "
                                           f"{body.get('submission_id')}", "its session is "
                                           "not in the record"))
            continue
        mode = TaskMode(session["mode"], bool(session["armed"]),
                        tuple(json.loads(session["signals"] or "[]")))
        view = RecordView(ledger, blobs, row["session"], before=row["seq"])
        verdict, _ = verify(Submission.from_dict(body.get("submission", {})), mode=mode,
                            view=view, files=RecordedFiles(body.get("seen", {}), blobs),
                            submission_id=body.get("submission_id", "?"), submit_seq=row["seq"],
                            submitting_cell=body.get("cell_id"))
        if not verdict.accepted:
            failed = "; ".join(f"[{c.code}] {c.message}" for c in verdict.failed
                               if not c.advisory)
            report.findings.append(Finding("submission_unbacked",
                                           f"submission {body.get('submission_id')}",
                                           f"no longer verifies from the record: {failed}"))


def print_progress(stage: str, done: int, total: int) -> None:
    """A progress line on stderr for long audits (used by the CLI)."""
    if total >= 1000:
        print(f"\raudit: {stage} {done}/{total}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)
