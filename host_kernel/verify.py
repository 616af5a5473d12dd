"""The verifier: decides whether a submission is backed by the Host's own record.

Owns every check of ``submit_output`` (and the agent loop's
``finalize_response``) and its stable code. It reads only the record (the
ledger's projections and the blob store) and the workspace files as they are
now; it never trusts what the kernel says about itself, never runs code, and
fails closed when the record cannot be read.

The checks, by code, are listed in :data:`CHECKS`; docs/verification.md
explains each one. In an armed ``reusable_pipeline`` or ``codebase_change``
mode every check must pass. In a detected mode the code-declaration checks are
advice: reported, never refusing. ``analysis_run`` needs no declarations.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ._errors import HostCallError, StorageError
from ._ids import is_cell_id
from ._models import Check, Verdict
from .modes import TaskMode
from .schema import json_depth
from .store.blobs import FileBlobStore, open_beneath
from .store.ledger import Ledger

__all__ = ["CHECKS", "Submission", "verify", "RecordView", "LiveFiles", "RecordedFiles"]

#: Every check code, with the rule it holds. Stable: tools and docs depend on them.
CHECKS: dict[str, str] = {
    "record_unreadable": "the Host's record can be read",
    "output_not_json": "output is a JSON-serialisable dict",
    "output_too_large": "output stays within the size and depth bounds",
    "output_schema": "output matches output_schema when one is given",
    "schema_invalid": "output_schema, when given, is a valid JSON Schema: its patterns "
                      "compile and its $refs point inside it",
    "schema_too_costly": "output_schema can be checked within the Host's bounds (size, "
                         "nesting, steps, and time for its patterns and in all)",
    "completion_bullets": "completion_bullets is a list of 1 to 4 non-empty strings",
    "task_status": "task_status is completed, partial, blocked or failed when given",
    "claim_unbacked": "every file or artifact that output claims is backed by this session",
    "artifact_altered": "a claimed artifact's stored bytes still have its sha256",
    "declarations_missing": "source_files, entry_points, architecture_summary and "
                            "test_evidence are all given",
    "source_outside": "each source file is a workspace-relative path inside the workspace",
    "source_missing": "each source file exists",
    "source_not_regular_file": "each source file is a regular file (not a FIFO, device, "
                               "socket or directory)",
    "source_hash_mismatch": "a declared sha256 matches the file's current bytes",
    "source_not_saved": "each source file's current bytes were saved as an artifact of "
                        "this session",
    "entry_point_not_source": "each entry point is one of the source files",
    "entry_point_syntax": "each Python entry point compiles (it is never run)",
    "architecture_summary": "architecture_summary is a non-empty paragraph",
    "test_evidence_malformed": "test_evidence is a non-empty list of {command, "
                               "producing_cell_id}",
    "cell_id_unknown": "producing_cell_id is a cell the Host minted in this session",
    "cell_unfinished": "the producing cell finished and its output is recorded",
    "receipt_missing": "the producing cell holds a receipt for exactly that command",
    "exit_nonzero": "the receipt's exit status is 0",
    "masked_failure": "the command cannot hide a failing exit status",
    "runner_substituted": "the command ran the kernel's own runner (PATH and Python's "
                          "search paths not edited, executable not inside the workspace, "
                          "no module shadowing it in the working directory)",
    "stale_evidence": "every source file's current bytes are the bytes the command started with",
    "receipt_output_altered": "the receipt's stored output still has its sha256",
    "no_tests_ran": "the receipt's own output shows at least one test passed",
    "tests_failed": "the receipt's own output shows no failed or erroring test",
    "runner_unrecognised": "the verifier can read the runner's summary (pytest, unittest)",
    "evidence_after_submission": "the submitting cell comes after the producing cell",
}

STATUSES = ("completed", "partial", "blocked", "failed")
#: Environment variables that change which code a Python test runner executes.
RUNNER_ENV = frozenset({"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE",
                        "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "LD_PRELOAD", "LD_LIBRARY_PATH"})
MAX_OUTPUT_BYTES = 1024 * 1024
MAX_OUTPUT_DEPTH = 32
MAX_ENTRIES = 10_000

#: Keys of ``output`` whose values name files or artifacts the submission claims.
CLAIM_KEY = re.compile(
    r"^(artifacts?|artifact_ids?|files?|figures?|plots?|output_paths?|outputs?_files?|"
    r"saved_to|saved_files?|tables?|models?_path|report_path|paths?)$",
    re.IGNORECASE,
)
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
#: Shell constructs that can make a failing test command exit 0.
MASKING = (
    (re.compile(r"\|\|"), "'||'"),
    (re.compile(r"(?<![|&])\|(?![|&])"), "a pipe '|'"),
    (re.compile(r";"), "';'"),
    (re.compile(r"\n"), "a newline"),
    (re.compile(r"\$\("), "'$(…)'"),
    (re.compile(r"`"), "backticks"),
    (re.compile(r"(^|[\s;&|(])eval(\s|$)"), "'eval'"),
    (re.compile(r"(?<![&<>])&(?![&>])"), "a background '&'"),
)
PYTEST_COUNTS = re.compile(
    r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True, slots=True)
class Submission:
    """What a submitter declared. Values are as received: types are checked here."""

    output: Any
    completion_bullets: Any
    task_status: Any = None
    output_schema: Any = None
    source_files: Any = None
    entry_points: Any = None
    architecture_summary: Any = None
    test_evidence: Any = None
    #: Set by the Host when the output could not be serialised in the kernel.
    output_error: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Submission:
        """From the wire: unknown keys are ignored, missing ones are None (and fail checks)."""
        names = cls.__dataclass_fields__
        fields = {k: v for k, v in data.items() if k in names}
        fields.setdefault("output", None)
        fields.setdefault("completion_bullets", None)
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# --------------------------------------------------------------------------- what is read


class RecordView:
    """The parts of one session's record the verifier reads, loaded once per verdict."""

    def __init__(self, ledger: Ledger, blobs: FileBlobStore, session: str,
                 before: int | None = None) -> None:
        """Load ``session``'s record; with ``before``, only what existed before that seq."""
        self.ledger = ledger
        self.blobs = blobs
        self.session = session
        self._blob_ok: dict[str, bool] = {}
        limit = before if before is not None else 2**62

        def q(sql: str, params: tuple[Any, ...]) -> list[Any]:
            return ledger.query(sql, params + (limit,))

        self.cells = {r["cell_id"]: r for r in q(
            "SELECT cell_id, seq_started, seq_finished, status, outputs, generation "
            "FROM cells WHERE session = ? AND seq_started < ?", (session,))}
        self.artifacts = q("SELECT artifact_id, filename, sha256, source_path, seq, ts "
                           "FROM artifacts WHERE session = ? AND seq < ? ORDER BY seq",
                           (session,))
        self.artifact_shas = {r["sha256"] for r in self.artifacts}
        self.receipts: dict[str, list[dict[str, Any]]] = {}
        for r in q("SELECT cell_id, body, seq FROM receipts WHERE session = ? AND seq < ? "
                   "ORDER BY seq", (session,)):
            body = json.loads(r["body"])
            body["_seq"] = r["seq"]
            self.receipts.setdefault(r["cell_id"], []).append(body)
        self.written: dict[str, str] = {}  # path → sha256 of the session's last write
        rows = [(r["seq"], r["path"], r["sha256"]) for r in q(
            "SELECT seq, path, sha256 FROM writes WHERE session = ? AND seq < ? ORDER BY seq",
            (session,))]
        for body in (b for bodies in self.receipts.values() for b in bodies):
            for change in body.get("changes", ()):
                rows.append((body["_seq"], change["path"], change.get("sha256")))
        # The last write or command change of each path wins.
        for seq, path, sha in sorted(rows, key=lambda t: t[0]):
            if sha is None:
                self.written.pop(path, None)
            else:
                self.written[path] = sha

    def manifest(self, sha256: str) -> dict[str, str] | None:
        """A receipt's workspace manifest, or None when missing or altered."""
        data = self.blob_bytes(sha256)
        if data is None:
            return None
        try:
            manifest = json.loads(data)
        except ValueError:
            return None
        return manifest if isinstance(manifest, dict) else None

    def blob_ok(self, sha256: str) -> bool:
        """Whether the stored bytes still hash to ``sha256`` (re-hashed once per view).

        False too when the blob is missing or something other than a regular
        file is in its place (a FIFO is refused, never read).
        """
        known = self._blob_ok.get(sha256)
        if known is None:
            known = self._blob_ok[sha256] = self.blobs.hash_of(sha256) == sha256
        return known

    def blob_bytes(self, sha256: str) -> bytes | None:
        """A blob's bytes, read once and verified against its name; None when that fails."""
        try:
            data = self.blobs.read(sha256)
        except (StorageError, ValueError):
            self._blob_ok[sha256] = False
            return None
        self._blob_ok[sha256] = True
        return data


#: A workspace file's bytes are kept for :meth:`LiveFiles.source` when at most this big.
KEEP_SOURCE_BYTES = 8 * 1024 * 1024


class LiveFiles:
    """The workspace as it is now: used when the Host verifies a submission.

    Each file is opened once per verdict, from the workspace root with no
    symlink followed after resolving and never blocking, and only when it is a
    regular file; the bytes compiled as an entry point are the bytes hashed.
    """

    def __init__(self, root: Path, record: Path) -> None:
        self.root = Path(os.path.realpath(root))
        self.record = Path(os.path.realpath(record))
        self._read: dict[str, tuple[str, bytes | None]] = {}

    def _real(self, rel: str) -> Path | None:
        real = Path(os.path.realpath(self.root / rel))
        inside = real == self.root or self.root in real.parents
        in_record = real == self.record or self.record in real.parents
        return real if inside and not in_record else None

    def inside(self, rel: str) -> bool:
        return self._real(rel) is not None

    def sha256(self, rel: str) -> str | None:
        """The file's sha256; None when it does not exist or is outside the workspace.

        Raises FileProblem ``not_regular_file`` (a FIFO, device, socket or
        directory) or PathRefused ``symlink_refused`` (a folder swapped for a
        symlink while it was opened), at once.
        """
        done = self._read.get(rel)
        if done is not None:
            return done[0]
        real = self._real(rel)
        if real is None:
            return None
        hasher = hashlib.sha256()
        kept: bytearray | None = bytearray()
        try:
            with open_beneath(self.root, real.relative_to(self.root).as_posix(),
                              label=repr(rel)) as f:
                while chunk := f.read(1024 * 1024):
                    hasher.update(chunk)
                    if kept is not None and len(kept) + len(chunk) <= KEEP_SOURCE_BYTES:
                        kept += chunk
                    else:
                        kept = None
        except OSError:
            return None
        sha = hasher.hexdigest()
        self._read[rel] = (sha, None if kept is None else bytes(kept))
        return sha

    def source(self, rel: str) -> bytes | None:
        """The bytes :meth:`sha256` hashed; None when unreadable.

        A file over KEEP_SOURCE_BYTES is read again, and its bytes are given
        only if they still have the sha256 first seen.
        """
        try:
            sha = self.sha256(rel)
        except HostCallError:
            return None
        if sha is None:
            return None
        kept = self._read[rel][1]
        if kept is not None:
            return kept
        real = self._real(rel)
        try:
            if real is None:
                return None
            with open_beneath(self.root, real.relative_to(self.root).as_posix()) as f:
                data = f.read()
        except (OSError, HostCallError):
            return None
        return data if hashlib.sha256(data).hexdigest() == sha else None


class RecordedFiles:
    """The workspace as the verdict saw it: used by ``audit`` to re-verify offline."""

    def __init__(self, seen: Mapping[str, str | None], blobs: FileBlobStore) -> None:
        self.seen = seen
        self.blobs = blobs

    def inside(self, rel: str) -> bool:
        return True

    def sha256(self, rel: str) -> str | None:
        return self.seen.get(rel)

    def source(self, rel: str) -> bytes | None:
        sha = self.seen.get(rel)
        if sha is None:
            return None
        try:
            return self.blobs.read(sha)
        except (StorageError, ValueError):
            return None


class _Recording:
    """Wraps a files view and remembers every hash it gave, so audit can re-verify.

    A file the view refused to read (not a regular file, a symlink met while
    opening it) hashes to None here; :attr:`refused` keeps why, for the check
    that reports it.
    """

    def __init__(self, files: Any, seen: dict[str, str | None]) -> None:
        self.files = files
        self.seen = seen
        self.refused: dict[str, HostCallError] = {}

    def inside(self, rel: str) -> bool:
        return bool(self.files.inside(rel))

    def sha256(self, rel: str) -> str | None:
        if rel not in self.seen:
            try:
                self.seen[rel] = self.files.sha256(rel)
            except HostCallError as exc:
                self.seen[rel] = None
                self.refused[rel] = exc
        return self.seen[rel]

    def source(self, rel: str) -> bytes | None:
        data: bytes | None = self.files.source(rel)
        return data


# --------------------------------------------------------------------------- the checks


@dataclass
class _Checks:
    """The checks of one verdict, and what they read."""

    view: RecordView
    files: Any  # LiveFiles or RecordedFiles
    submit_seq: int
    submitting_cell: str | None
    advisory: bool = False
    items: list[Check] = field(default_factory=list)

    def fail(self, code: str, message: str) -> None:
        self.items.append(Check(code, False, message, self.advisory))

    def ok(self, code: str, message: str = "") -> None:
        self.items.append(Check(code, True, message or CHECKS[code], self.advisory))

    def passed(self, code: str) -> bool:
        return not any(c.code == code and not c.ok for c in self.items)


def _claims(value: Any, under_claim: bool = False, found: list[str] | None = None) -> list[str]:
    """Strings in ``output`` that name files or artifacts (under claim-like keys)."""
    found = [] if found is None else found
    if isinstance(value, dict):
        for k, v in value.items():
            claim = under_claim or bool(CLAIM_KEY.match(str(k)))
            if under_claim and isinstance(v, str) and k not in ("path", "artifact_id", "file",
                                                               "filename", "id"):
                continue
            _claims(v, claim, found)
    elif isinstance(value, list):
        for v in value:
            _claims(v, under_claim, found)
    elif under_claim and isinstance(value, str) and value.strip():
        found.append(value.strip())
    return found


def _check_every_mode(sub: Submission, c: _Checks) -> None:
    out = sub.output
    if sub.output_error is not None or not isinstance(out, dict):
        what = sub.output_error or f"it is a {type(out).__name__}"
        c.fail("output_not_json", f"output must be a JSON-serialisable dict ({what}); pass a "
                                  f"dict of plain values")
    else:
        text = json.dumps(out)
        if len(text.encode("utf-8")) > MAX_OUTPUT_BYTES or json_depth(out, MAX_OUTPUT_DEPTH) > \
                MAX_OUTPUT_DEPTH:
            c.fail("output_too_large", f"output is over {MAX_OUTPUT_BYTES} bytes or "
                                       f"{MAX_OUTPUT_DEPTH} levels deep; save large results as "
                                       f"artifacts and name them in output")
        else:
            c.ok("output_not_json")
            if sub.output_schema is not None:
                _check_schema(out, sub.output_schema, c)
            _check_claims(out, c)
    bullets = sub.completion_bullets
    if (not isinstance(bullets, list) or not 1 <= len(bullets) <= 4
            or not all(isinstance(b, str) and b.strip() for b in bullets)):
        c.fail("completion_bullets", "completion_bullets must be a list of 1 to 4 non-empty "
                                     "strings, each saying what was done")
    else:
        c.ok("completion_bullets")
    if sub.task_status is not None and sub.task_status not in STATUSES:
        c.fail("task_status", f"task_status {sub.task_status!r} is not one of "
                              f"{', '.join(STATUSES)}")
    elif sub.task_status is not None:
        c.ok("task_status")


def _check_claims(out: dict[str, Any], c: _Checks) -> None:
    view = c.view
    claims = _claims(out)
    by_id = {r["artifact_id"]: r for r in view.artifacts}
    by_name: dict[str, Any] = {}
    for r in view.artifacts:
        by_name[r["filename"]] = r
        if r["source_path"]:
            by_name[r["source_path"]] = r
    problems = 0
    for claim in claims[:MAX_ENTRIES]:
        row = by_id.get(claim) or by_name.get(claim) or by_name.get(_norm(claim) or "")
        if row is not None:
            if not view.blob_ok(row["sha256"]):
                problems += 1
                c.fail("artifact_altered", f"artifact {row['artifact_id']} ({row['filename']})"
                                           f" no longer matches its sha256 in the store; save "
                                           f"it again with host.save_artifact")
            continue
        rel = _norm(claim)
        written = view.written.get(rel) if rel else None
        if written is not None and c.files.sha256(rel) == written:
            continue
        problems += 1
        if UUID.match(claim):
            c.fail("claim_unbacked", f"{claim} is not an artifact of this session; "
                                     f"host.artifacts() lists the real ids")
        elif written is not None:
            c.fail("claim_unbacked", f"{claim!r} changed since this session wrote it; save it "
                                     f"with host.save_artifact after its last change")
        else:
            c.fail("claim_unbacked", f"{claim!r} is not an artifact of this session nor a file "
                                     f"it wrote through host; save it with "
                                     f"host.save_artifact({claim!r}) and claim that")
    if not problems:
        c.ok("claim_unbacked", f"{len(claims)} claimed file(s)/artifact(s) backed")


def _norm(claim: str) -> str | None:
    if not claim or "\x00" in claim:
        return None
    pure = PurePosixPath(claim)
    if pure.is_absolute() or ".." in pure.parts:
        return None
    return pure.as_posix()


def _entries(value: Any, key: str) -> list[tuple[str, str | None]] | None:
    """Normalise source_files / entry_points to (path, declared sha256) pairs."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or len(value) > MAX_ENTRIES:
        return None
    out: list[tuple[str, str | None]] = []
    for item in value:
        if isinstance(item, str):
            out.append((item, None))
        elif isinstance(item, dict) and isinstance(item.get(key), str):
            sha = item.get("sha256")
            out.append((item[key], sha if isinstance(sha, str) else None))
        else:
            return None
    return out


def _check_declarations(sub: Submission, c: _Checks) -> None:
    view, files = c.view, c.files
    missing = [n for n in ("source_files", "entry_points", "architecture_summary",
                           "test_evidence") if getattr(sub, n) in (None, [], "", {})]
    if missing:
        c.fail("declarations_missing", f"missing {', '.join(missing)}: pass them as keyword "
                                       f"arguments of host.submit_output")
    sources = _entries(sub.source_files, "path") if sub.source_files is not None else []
    if sources is None:
        c.fail("source_outside", "source_files must be a list of workspace-relative paths or "
                                 "{'path': …, 'sha256': …} objects")
        sources = []
    source_paths: set[str] = set()
    for path, declared in sources:
        rel = _norm(path)
        if rel is None or not files.inside(rel):
            c.fail("source_outside", f"source file {path!r} is not a path inside the workspace")
            continue
        source_paths.add(rel)
        current = files.sha256(rel)
        refused = files.refused.get(rel)
        if refused is not None and refused.code == "symlink_refused":
            c.fail("source_outside", f"source file {refused.message}")
            continue
        if refused is not None:
            c.fail("source_not_regular_file", f"source file {refused.message}; declare the "
                                              f"files that hold the code")
            continue
        if current is None:
            c.fail("source_missing", f"source file {rel!r} does not exist")
            continue
        if declared is not None and declared != current:
            c.fail("source_hash_mismatch", f"{rel!r}: declared sha256 {declared[:12]}… is not "
                                           f"the file's current {current[:12]}…")
        if current not in view.artifact_shas:
            c.fail("source_not_saved", f"{rel!r}'s current bytes were never saved as an "
                                       f"artifact of this session; call "
                                       f"host.save_artifact({rel!r}) after its last change")
    entries = _entries(sub.entry_points, "path") if sub.entry_points is not None else []
    for path, _ in entries or []:
        rel = _norm(path)
        if rel is None or rel not in source_paths:
            c.fail("entry_point_not_source", f"entry point {path!r} is not one of the "
                                             f"declared source_files")
            continue
        if rel.endswith(".py"):
            data = files.source(rel)
            if data is None:
                continue  # already reported as source_missing
            try:
                compile(data, rel, "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                line = getattr(exc, "lineno", None)
                c.fail("entry_point_syntax", f"entry point {rel!r} does not compile"
                                             f"{f' (line {line})' if line else ''}: "
                                             f"{getattr(exc, 'msg', exc)}")
    if entries is None:
        c.fail("entry_point_not_source", "entry_points must be a list of paths")
    summary = sub.architecture_summary
    if summary is not None and (not isinstance(summary, str) or len(summary.split()) < 5):
        c.fail("architecture_summary", "architecture_summary must be a paragraph (at least a "
                                       "sentence) saying what each module owns")
    _check_evidence(sub, c, source_paths)
    for code in ("source_outside", "source_missing", "source_not_regular_file",
                 "source_hash_mismatch", "source_not_saved", "entry_point_not_source",
                 "entry_point_syntax", "architecture_summary", "declarations_missing"):
        if c.passed(code):
            c.ok(code)


def _check_evidence(sub: Submission, c: _Checks, source_paths: set[str]) -> None:
    view = c.view
    evidence = sub.test_evidence
    if evidence is None:
        return
    if not isinstance(evidence, list) or not evidence or len(evidence) > 1000 or not all(
            isinstance(e, dict) and isinstance(e.get("command"), str)
            and e.get("producing_cell_id") is not None for e in evidence):
        c.fail("test_evidence_malformed", "test_evidence must be a non-empty list of "
                                          "{'command': <exact string run with host.bash>, "
                                          "'producing_cell_id': <the id from that cell's "
                                          "[cell id: …] line>}")
        return
    for entry in evidence:
        command, cell_id = entry["command"], entry["producing_cell_id"]
        label = f"test evidence {command!r}"
        cell = view.cells.get(cell_id) if isinstance(cell_id, str) else None
        if cell is None:
            why = ("a number, like an execution count or cell index, is not a cell id"
                   if isinstance(cell_id, (int, float)) or (isinstance(cell_id, str)
                                                            and cell_id.strip().isdigit())
                   else "that id was not minted by this Host in this session"
                   if is_cell_id(cell_id) else "it is not a cell id")
            c.fail("cell_id_unknown", f"{label}: producing_cell_id {cell_id!r} is unknown "
                                      f"({why}); the real id is on the '[cell id: …]' line "
                                      f"that begins the Observation of the cell that ran the "
                                      f"command")
            continue
        if cell["seq_finished"] is None or cell["outputs"] is None:
            c.fail("cell_unfinished", f"{label}: cell {cell_id} has not finished, so its output "
                                      f"is not recorded; submit in a later cell")
        if cell["seq_started"] >= c.submit_seq or cell_id == c.submitting_cell:
            c.fail("evidence_after_submission", f"{label}: cell {cell_id} does not come before "
                                                f"the submitting cell; run the tests, then "
                                                f"submit in a later cell")
        receipts = [r for r in view.receipts.get(cell_id, []) if r["command"] == command]
        if not receipts:
            ran = [r["command"] for r in view.receipts.get(cell_id, [])]
            hint = (f"it ran {ran!r} through host.bash" if ran else
                    "it ran no command through host.bash (subprocess, os.system and printed "
                    "output leave no receipt)")
            c.fail("receipt_missing", f"{label}: cell {cell_id} holds no receipt for exactly "
                                      f"that command; {hint}")
            continue
        receipt = receipts[-1]
        _check_receipt(label, command, receipt, view, c, source_paths)


def _runner(segment: str) -> str | None:
    """``pytest`` or ``unittest`` when the segment's command runs that test runner.

    Only the command itself counts: ``pytest …``, ``py.test …`` or
    ``python[3[.x]] -m pytest|unittest …``, after optional ``VAR=value`` words and
    ``env``. A runner's name elsewhere (an argument, a comment) does not.
    """
    try:
        words = shlex.split(segment, comments=True)
    except ValueError:
        return None
    while words and (words[0] == "env" or ("=" in words[0] and
                                           words[0].split("=", 1)[0].isidentifier())):
        words = words[1:]
    if not words:
        return None
    first = os.path.basename(words[0])
    if first in ("pytest", "py.test"):
        return "pytest"
    if re.fullmatch(r"python(\d+(\.\d+)?)?", first) and len(words) > 2 and words[1] == "-m":
        module = words[2].split(".")[0]
        if module in ("pytest", "unittest"):
            return module
    return None


def _stale_sources(receipt: dict[str, Any], view: RecordView, c: _Checks,
                   source_paths: set[str]) -> list[str]:
    """Source files whose current bytes are not the bytes the command started with.

    Each receipt points at a manifest (in the blob store) of the workspace files'
    sha256 when the command started: the bytes the tests actually ran on.
    """
    sha = receipt.get("workspace_manifest_sha256")
    manifest = view.manifest(sha) if isinstance(sha, str) else None
    if manifest is None:
        return sorted(source_paths)
    return sorted(p for p in source_paths if manifest.get(p) != c.files.sha256(p))


def _check_receipt(label: str, command: str, receipt: dict[str, Any], view: RecordView,
                   c: _Checks, source_paths: set[str]) -> None:
    if receipt.get("timed_out") or receipt.get("exit_status") != 0:
        c.fail("exit_nonzero", f"{label}: the command "
                               f"{'timed out' if receipt.get('timed_out') else 'exited ' + str(receipt.get('exit_status'))}"
                               f"; fix the failure and run it again")
    masks = [name for pattern, name in MASKING if pattern.search(command)]
    segments = [seg.strip() for seg in command.split("&&")]
    runner_at = [i for i, seg in enumerate(segments) if _runner(seg)]
    if runner_at and runner_at[-1] != len(segments) - 1:
        masks.append("a command after the test runner (it can print a forged result)")
    if masks:
        c.fail("masked_failure", f"{label}: {', '.join(masks)} can hide a failing exit status; "
                                 f"run the test command on its own ('&&' and redirections are "
                                 f"fine)")
    runner_env = sorted(RUNNER_ENV & set(receipt.get("env_changed", ())))
    if receipt.get("path_differs") or receipt.get("executable_in_workspace") or runner_env \
            or receipt.get("shadowed_modules"):
        why = ("PATH was edited in the kernel" if receipt.get("path_differs")
               else f"the executable {receipt.get('executable')} is inside the workspace"
               if receipt.get("executable_in_workspace")
               else f"{', '.join(runner_env)} changed in the kernel" if runner_env
               else f"the working directory holds {', '.join(receipt['shadowed_modules'])}, "
                    f"which 'python -m' would import instead of the real runner")
        c.fail("runner_substituted", f"{label}: {why}; run the real test runner with the "
                                     f"kernel's own environment")
    stale = _stale_sources(receipt, view, c, source_paths)
    if stale:
        c.fail("stale_evidence", f"{label}: {', '.join(stale[:5])} changed after this command "
                                 f"started (the tests ran on other bytes); run the tests again "
                                 f"and cite the new cell")
    sha = receipt.get("stdout_sha256", "")
    err_sha = receipt.get("stderr_sha256", "")
    out = view.blob_bytes(sha) if isinstance(sha, str) else None
    err = view.blob_bytes(err_sha) if isinstance(err_sha, str) else None
    if out is None or err is None:
        c.fail("receipt_output_altered", f"{label}: the recorded output no longer matches its "
                                         f"sha256; the record was altered")
        return
    _check_test_output(label, command, out.decode("utf-8", "replace"),
                       err.decode("utf-8", "replace"), c)


def _check_test_output(label: str, command: str, stdout: str, stderr: str, c: _Checks) -> None:
    # The runner is the last command of the line (anything after it is masked_failure),
    # so its own summary is the last one in the stream it writes to.
    runner = _runner(command.split("&&")[-1].strip())
    if runner == "pytest":
        summary = _pytest_summary(stdout)
        if not summary:
            c.fail("no_tests_ran", f"{label}: its output has no pytest result line, so no test "
                                   f"is shown to have run (--collect-only runs none)")
            return
        bad = summary.get("failed", 0) + summary.get("errors", 0) + summary.get("error", 0)
        if bad:
            c.fail("tests_failed", f"{label}: pytest reported {summary.get('failed', 0)} "
                                   f"failed and {summary.get('errors', summary.get('error', 0))}"
                                   f" errors")
        elif summary.get("passed", 0) < 1:
            c.fail("no_tests_ran", f"{label}: pytest passed no test ({summary}); the evidence "
                                   f"must run at least one test")
        return
    if runner == "unittest":
        ran = re.findall(r"^Ran (\d+) tests? in [\d.]+s$", stderr, re.MULTILINE)
        verdicts = re.findall(r"^(OK|FAILED)\b", stderr, re.MULTILINE)
        if not ran or int(ran[-1]) < 1:
            c.fail("no_tests_ran", f"{label}: unittest ran no test")
        elif not verdicts or verdicts[-1] != "OK":
            c.fail("tests_failed", f"{label}: unittest did not report OK")
        return
    c.fail("runner_unrecognised", f"{label}: the verifier reads pytest and unittest results; "
                                  f"run the tests with 'python -m pytest' or "
                                  f"'python -m unittest'")


def _pytest_summary(stdout: str) -> dict[str, int] | None:
    """Counts from pytest's final line (``… in 0.12s``) on stdout, or None when there is none.

    Only the last such line counts, whatever it says: ``3 tests collected in 0.01s``
    (``--collect-only``) has no ``passed`` count, so no test is shown to have run.
    """
    for line in reversed(_ANSI.sub("", stdout).splitlines()):
        stripped = line.strip().strip("=").strip()
        if re.search(r" in [\d.]+s( \([\d:.]+\))?$", stripped):
            counts: dict[str, int] = {}
            for n, what in PYTEST_COUNTS.findall(stripped):
                counts[what] = counts.get(what, 0) + int(n)
            return counts
    return None


# --------------------------------------------------------------------------- output_schema

def _check_schema(out: Any, schema: Any, c: _Checks) -> None:
    """``output`` against ``output_schema``, bounded (host_kernel/schema.py)."""
    from .schema import check_output_schema

    failure = check_output_schema(out, schema)
    if failure is None:
        c.ok("output_schema")
    else:
        c.fail(*failure)


# --------------------------------------------------------------------------- entry point


def verify(sub: Submission, *, mode: TaskMode, view: RecordView, files: Any,
           submission_id: str, submit_seq: int, submitting_cell: str | None
           ) -> tuple[Verdict, dict[str, str | None]]:
    """Run every check; returns the Verdict and the source hashes it saw (for audit)."""
    seen: dict[str, str | None] = {}
    files = _Recording(files, seen)
    checks = _Checks(view, files, submit_seq, submitting_cell)
    _check_every_mode(sub, checks)
    declared = any(getattr(sub, n) is not None for n in (
        "source_files", "entry_points", "architecture_summary", "test_evidence"))
    if mode.enforced:
        _check_declarations(sub, checks)
    elif (mode.detected and mode.name != "analysis_run") or declared:
        advice = _Checks(view, files, submit_seq, submitting_cell, advisory=True)
        _check_declarations(sub, advice)
        checks.items.extend(advice.items)
    accepted = all(c.ok or c.advisory for c in checks.items)
    return Verdict(submission_id, accepted, mode.name, mode.armed, tuple(checks.items)), seen


def unreadable_verdict(submission_id: str, mode: TaskMode, error: Exception) -> Verdict:
    """Fail closed: the record could not be read, so nothing can be shown to back the claim."""
    return Verdict(submission_id, False, mode.name, mode.armed, (
        Check("record_unreadable", False, f"the Host could not read its record ({error}); "
                                          f"nothing can be accepted until it can"),))
