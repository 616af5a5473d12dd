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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ._errors import HostCallError, StorageError
from ._ids import is_cell_id
from ._models import Check, Verdict
from .modes import TaskMode
from .reproduce import Emit, Request, Runs, reproduce_evidence
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
    "evidence_after_submission": "the submitting cell comes after the producing cell",
    "source_bytecode": "each source file is source, not compiled bytecode",
    "claim_missing": "every path output names exists",
    # Verification by reproduction (host_kernel/reproduce, docs/verification.md).
    "runner_unrecognised": "the cited command is one plain pytest or unittest invocation "
                           "the Host can reproduce",
    "selection_not_allowed": "the cited command does not choose which tests run",
    "test_path_undeclared": "each test path the command names is a declared file or a "
                            "folder of them",
    "baseline_unavailable": "the workspace's baseline (codebase_change) is in the record",
    "runner_tampered": "declared code does not reach into the test runner (its hooks, "
                       "internals or plugin manager)",
    "environment_tampered": "every file of the session's package overlay is what its "
                            "distribution's RECORD lists",
    "reproduced": "the Host re-ran the command on the declared files and every test ran, "
                  "at least one passed and none failed",
    "reproduction_failed": "no test failed or errored when the Host re-ran the command",
    "reproduction_no_tests": "at least one test passed when the Host re-ran the command",
    "reproduction_incomplete": "every test collected from the declared paths ran",
    "reproduction_timeout": "the reproduction finished within its time limit",
    "reproduction_error": "the Host could run the reproduction",
}

#: Codes of checks that read the agent's command string and printed output. Reproduction
#: does their job now; the codes stay reserved (never reused with another meaning).
RETIRED: dict[str, str] = {
    "masked_failure": "the command cannot hide a failing exit status",
    "runner_substituted": "the command ran the kernel's own runner",
    "stale_evidence": "every source file's current bytes are the bytes the command started "
                      "with",
    "receipt_output_altered": "the receipt's stored output still has its sha256",
    "no_tests_ran": "the receipt's own output shows at least one test passed",
    "tests_failed": "the receipt's own output shows no failed or erroring test",
}

STATUSES = ("completed", "partial", "blocked", "failed")
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

        session_row = ledger.query("SELECT workdir FROM sessions WHERE session = ?", (session,))
        self.workdir = session_row[0]["workdir"] if session_row else None
        self.baseline: dict[str, Any] | None = None
        for r in q("SELECT body FROM events WHERE session = ? AND kind = 'baseline_recorded' "
                   "AND seq < ?", (session,)):
            self.baseline = json.loads(r["body"])
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
            started: dict[str, str] | None = None
            # Files whose bytes the command may have left as they were (their earlier
            # bytes unknown, their size unchanged): not its work, fail closed.
            unproven = set(body.get("changes_unproven") or ())
            for change in body.get("changes", ()):
                sha = change.get("sha256")
                if change.get("path") in unproven:
                    continue
                if change.get("change") == "modified" and sha is not None:
                    # Bytes the file already had when the command started were not produced
                    # by it (a `touch` is not work).
                    if started is None:
                        ref = body.get("workspace_manifest_sha256")
                        started = (self.manifest(ref) if isinstance(ref, str) else None) or {}
                    if started.get(change["path"]) == sha:
                        continue
                rows.append((body["_seq"], change["path"], sha))
        # The last write or command change of each path wins.
        for seq, path, sha in sorted(rows, key=lambda t: t[0]):
            if sha is None:
                self.written.pop(path, None)
            else:
                self.written[path] = sha

    def relative_cwd(self, cwd: Any) -> str:
        """A receipt's folder relative to the workspace ("." for the root; ".." when outside)."""
        if not isinstance(cwd, str) or not self.workdir:
            return "."
        rel = os.path.relpath(cwd, self.workdir)
        return rel.replace(os.sep, "/")

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

    def is_dir(self, rel: str) -> bool:
        real = self._real(rel)
        return real is not None and real.is_dir() and not os.path.islink(self.root / rel)

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

    def is_dir(self, rel: str) -> bool:
        return self.seen.get(rel.rstrip("/") + "/") == "directory"

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

    def is_dir(self, rel: str) -> bool:
        key = rel.rstrip("/") + "/"
        if key not in self.seen:
            self.seen[key] = "directory" if self.files.is_dir(rel) else None
        return self.seen[key] == "directory"


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
    #: Declared source files that passed their checks: path → sha256 of the saved bytes.
    sources: dict[str, str] = field(default_factory=dict)
    #: Test evidence whose receipt was found: (command, workspace-relative cwd, duration).
    evidence: list[tuple[str, str, float | None]] = field(default_factory=list)

    def fail(self, code: str, message: str) -> None:
        self.items.append(Check(code, False, message, self.advisory))

    def ok(self, code: str, message: str = "") -> None:
        self.items.append(Check(code, True, message or CHECKS[code], self.advisory))

    def passed(self, code: str) -> bool:
        return not any(c.code == code and not c.ok for c in self.items)


#: File name endings that make a bare string in ``output`` a claim that a file exists.
FILE_SUFFIXES = frozenset("""
csv tsv json jsonl ndjson parquet feather arrow orc avro h5 hdf5 hdf nc zarr npy npz pkl pickle
joblib pt pth ckpt safetensors onnx txt md rst log yaml yml toml ini cfg xml html htm pdf png jpg
jpeg gif svg webp tif tiff bmp eps ps py ipynb r sql sqlite sqlite3 db duckdb xlsx xls ods docx
pptx zip gz tgz tar bz2 xz zst mp4 mov wav mp3 flac sh js ts css dot mmd geojson shp tex bib
""".split())
_SUFFIX = re.compile(r"\.([A-Za-z][A-Za-z0-9]{0,9})$")


def _pathlike(value: str) -> bool:
    """A whole string that names a file: it ends like a file name, or starts like a path."""
    if not 1 < len(value) <= 1024 or any(ch.isspace() for ch in value) or "://" in value:
        return False
    if value.startswith(("/", "./", "../", "~/")):
        return True
    m = _SUFFIX.search(value)
    return m is not None and m.group(1).lower() in FILE_SUFFIXES


def _claims(value: Any, under_claim: bool = False, found: list[str] | None = None) -> list[str]:
    """Strings in ``output`` that name files or artifacts, at any depth under any key.

    Under a claim-like key (``artifacts``, ``files``, ``figures``…) every string
    is a claim (in nested objects, the ``path``/``file``/``id`` values); anywhere
    else a string is a claim when it looks like a path or a file name, or is a UUID.
    """
    found = [] if found is None else found
    if isinstance(value, dict):
        for k, v in value.items():
            claim = under_claim or bool(CLAIM_KEY.match(str(k)))
            if under_claim and isinstance(v, str) and k not in ("path", "artifact_id", "file",
                                                               "filename", "id"):
                _claims(v, False, found)
                continue
            _claims(v, claim, found)
    elif isinstance(value, list):
        for v in value:
            _claims(v, under_claim, found)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        if under_claim or _pathlike(text) or UUID.match(text):
            found.append(text)
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
        if rel is None and view.workdir and claim.startswith(view.workdir.rstrip("/") + "/"):
            rel = _norm(claim[len(view.workdir.rstrip("/")) + 1:])
        problems += not _check_path_claim(claim, rel, c)
    if not problems:
        c.ok("claim_unbacked", f"{len(claims)} claimed file(s)/artifact(s) backed")


def _unbacked_name(claim: str, c: _Checks, hint: str = "") -> None:
    """A claim that names nothing in the workspace: an unknown artifact id, or a missing path."""
    if UUID.match(claim):
        c.fail("claim_unbacked", f"{claim} is not an artifact of this session; "
                                 f"host.artifacts() lists the real ids")
    else:
        c.fail("claim_missing", f"{claim!r} does not exist in the workspace; claim only files "
                                f"that exist{hint}")


def _check_path_claim(claim: str, rel: str | None, c: _Checks) -> bool:
    """A claimed path must exist and hold bytes this session produced; True when it does."""
    view = c.view
    if rel is None:
        # Absolute, or leading out with "..": it may exist, but not in this workspace.
        there = claim if claim.startswith("/") else os.path.join(view.workdir or "/", claim)
        if view.workdir and os.path.lexists(there) and not UUID.match(claim):
            c.fail("claim_unbacked", f"{claim!r} is outside the workspace, where this session "
                                     f"produces nothing; save it into the workspace and claim "
                                     f"that")
        else:
            _unbacked_name(claim, c)
        return False
    current = c.files.sha256(rel)
    if current is None and c.files.is_dir(rel):
        if any(p.startswith(rel.rstrip("/") + "/") and c.files.sha256(p) == sha
               for p, sha in view.written.items()):
            return True
        c.fail("claim_unbacked", f"folder {claim!r} holds no file this session produced")
        return False
    if current is None:
        _unbacked_name(claim, c, " (or save it as an artifact and claim its id)")
        return False
    written = view.written.get(rel)
    if written == current:
        return True
    if written is not None:
        c.fail("claim_unbacked", f"{claim!r} changed since this session wrote it; save it "
                                 f"with host.save_artifact after its last change")
    else:
        c.fail("claim_unbacked", f"{claim!r} was not produced by this session (not written "
                                 f"through host, and no host.bash command changed its bytes); "
                                 f"save it with host.save_artifact({claim!r}) and claim that")
    return False


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
        if rel.endswith((".pyc", ".pyo")) or "__pycache__" in rel.split("/"):
            c.fail("source_bytecode", f"{rel!r} is compiled bytecode; declare the .py source "
                                      f"it comes from (bytecode is never reproduced)")
            continue
        if current not in view.artifact_shas:
            c.fail("source_not_saved", f"{rel!r}'s current bytes were never saved as an "
                                       f"artifact of this session; call "
                                       f"host.save_artifact({rel!r}) after its last change")
        else:
            c.sources[rel] = current
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
                 "source_hash_mismatch", "source_not_saved", "source_bytecode",
                 "entry_point_not_source", "entry_point_syntax", "architecture_summary",
                 "declarations_missing"):
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
        _check_receipt(label, receipt, c)
        c.evidence.append((command, view.relative_cwd(receipt.get("cwd")),
                           receipt.get("duration")))


def _check_receipt(label: str, receipt: dict[str, Any], c: _Checks) -> None:
    """The agent really ran the command and it exited 0: history, not the acceptance
    (the reproduction decides that)."""
    if receipt.get("timed_out") or receipt.get("exit_status") != 0:
        how = ("timed out" if receipt.get("timed_out")
               else f"exited {receipt.get('exit_status')}")
        c.fail("exit_nonzero", f"{label}: the command {how}; fix the failure and run it again")


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
           submission_id: str, submit_seq: int, submitting_cell: str | None,
           runs: Runs | None = None, emit: Emit | None = None, network: bool = False,
           ) -> tuple[Verdict, dict[str, str | None]]:
    """Run every check; returns the Verdict and the source hashes it saw (for audit).

    In an enforced mode whose other checks pass, ``runs`` reproduces each test
    evidence entry (a live :class:`~host_kernel.reproduce.Reproducer`, or the
    record's own runs when ``audit`` re-verifies); without it the submission
    cannot be accepted (``reproduction_error``).
    """
    seen: dict[str, str | None] = {}
    files = _Recording(files, seen)
    checks = _Checks(view, files, submit_seq, submitting_cell)
    _check_every_mode(sub, checks)
    declared = any(getattr(sub, n) is not None for n in (
        "source_files", "entry_points", "architecture_summary", "test_evidence"))
    sections: list[dict[str, Any]] = []
    if mode.enforced:
        _check_declarations(sub, checks)
        if all(c.ok for c in checks.items):
            sections = _reproduce(checks, mode, runs, emit, network)
    elif (mode.detected and mode.name != "analysis_run") or declared:
        advice = _Checks(view, files, submit_seq, submitting_cell, advisory=True)
        _check_declarations(sub, advice)
        checks.items.extend(advice.items)
    accepted = all(c.ok or c.advisory for c in checks.items)
    return Verdict(submission_id, accepted, mode.name, mode.armed, tuple(checks.items),
                   tuple(sections)), seen


#: ``runs=`` for a verdict given before reproduction existed: ``audit`` re-verifies the
#: rest and says, as a warning, that the tests were judged by the older rules.
NOT_REPRODUCED: Any = object()


def _reproduce(c: _Checks, mode: TaskMode, runs: Runs | None, emit: Emit | None,
               network: bool) -> list[dict[str, Any]]:
    if runs is NOT_REPRODUCED:
        return []
    if runs is None:
        c.fail("reproduction_error", "nothing here can reproduce the test evidence, so it "
                                     "cannot be accepted")
        return []
    request = Request(mode.name, dict(c.sources), list(c.evidence), c.view.baseline, network)
    try:
        findings, sections = reproduce_evidence(request, runs, c.view.blobs, emit)
    except (OSError, HostCallError) as exc:
        c.fail("reproduction_error", f"the Host could not reproduce the test evidence: {exc}")
        return []
    for code, ok, message in findings:
        (c.ok if ok else c.fail)(code, message)
    return sections


def unreadable_verdict(submission_id: str, mode: TaskMode, error: Exception) -> Verdict:
    """Fail closed: the record could not be read, so nothing can be shown to back the claim."""
    return Verdict(submission_id, False, mode.name, mode.armed, (
        Check("record_unreadable", False, f"the Host could not read its record ({error}); "
                                          f"nothing can be accepted until it can"),))
