"""What the verifier reads: one session's record, and the workspace as a verdict saw it.

Owns :class:`RecordView` (the ledger's projections and the blob store, loaded
once per verdict), :class:`RecordedFiles` (the workspace as recorded, for
``audit``) and :class:`_Recording` (which remembers every hash a verdict was
given). The live workspace, :class:`~host_kernel.verify.LiveFiles`, is in the
package's ``__init__``. Nothing here decides a check.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from .._errors import HostCallError, StorageError
from ..store.blobs import FileBlobStore
from ..store.ledger import Ledger


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
        self.artifacts = q("SELECT artifact_id, filename, sha256, source_path, seq, ts, "
                           "lineage FROM artifacts WHERE session = ? AND seq < ? ORDER BY seq",
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
        self._limit = limit

    def session_writes(self) -> set[str]:
        """Every workspace path this session's record says it wrote or moved into place,
        whatever became of it since: ``host.write_file``/``edit_file``, what a
        ``host.bash`` command changed (its receipt's changes and traced writes), and what
        a cell's own code and its child processes wrote (the tracer's account; where a
        cell was not traced, the kernel's audit hook, a hint that can only add paths)."""
        paths: set[str] = {r["path"] for r in self.ledger.query(
            "SELECT path FROM writes WHERE session = ? AND seq < ?", (self.session, self._limit))}

        def add(traced: Any) -> None:
            if not isinstance(traced, dict):
                return
            for key in ("writes", "between"):
                paths.update(p for p in traced.get(key) or () if isinstance(p, str))
            for pair in traced.get("renames") or ():
                if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], str):
                    paths.add(pair[1])

        for body in (b for bodies in self.receipts.values() for b in bodies):
            paths.update(c["path"] for c in body.get("changes", ())
                         if isinstance(c, dict) and isinstance(c.get("path"), str)
                         and c.get("change") != "removed")
            add(body.get("traced"))
        for r in self.ledger.query("SELECT body FROM events WHERE session = ? AND "
                                   "kind = 'cell_finished' AND seq < ?",
                                   (self.session, self._limit)):
            body = json.loads(r["body"])
            add(body.get("traced"))
            add(body.get("access"))
        return {p for p in paths if p and not p.startswith("/")}

    def artifact_inputs(self, row: Any) -> tuple[tuple[str, str], ...]:
        """An artifact row's lineage inputs that are files, as (path, sha256), in the order
        recorded: a file read, at its recorded path; a read of bytes this session saved as
        an artifact, which lineage records by artifact id without the path it was read at,
        at every path this session saved those bytes from (the named artifact's first)."""
        try:
            lineage = json.loads(row["lineage"]) if row["lineage"] else {}
        except (TypeError, ValueError):
            return ()
        items = lineage.get("inputs") if isinstance(lineage, dict) else None
        saved_at = {r["artifact_id"]: r["source_path"] for r in self.artifacts}
        out: dict[tuple[str, str], None] = {}
        for item in items if isinstance(items, list) else ():
            if not isinstance(item, dict) or not isinstance(item.get("sha256"), str):
                continue
            sha = item["sha256"]
            paths = [item.get("path")]
            if paths[0] is None and isinstance(item.get("artifact_id"), str):
                paths = [saved_at.get(item["artifact_id"])] + [
                    r["source_path"] for r in self.artifacts if r["sha256"] == sha]
            for path in paths:
                if isinstance(path, str):
                    out.setdefault((path, sha), None)
        return tuple(out)

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

    def knows(self, rel: str) -> bool:
        """Whether the verdict looked at ``rel`` (a None hash then means it did not exist)."""
        return rel in self.seen

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

    def knows(self, rel: str) -> bool:
        """False only when the files are as a verdict recorded them and it never looked at
        ``rel``: its hash then says nothing of whether it existed."""
        knows = getattr(self.files, "knows", None)
        return True if knows is None else bool(knows(rel))

    def is_dir(self, rel: str) -> bool:
        key = rel.rstrip("/") + "/"
        if key not in self.seen:
            self.seen[key] = "directory" if self.files.is_dir(rel) else None
        return self.seen[key] == "directory"
