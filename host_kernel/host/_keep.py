"""Keeping the bytes a session read: each input file copied into the record's blob store.

Owns :class:`InputKeeper`: which reads of a cell (or of a ``host.bash`` command)
have their bytes kept, the session's budget of kept bytes (``input_budget``,
docs/record.md "Inputs kept"), deduplication by sha256, and the copy itself
(:func:`store_file`): the workspace file is opened once, beneath the workspace
with no symlink followed, copied inside the kernel into a temporary file of the
store, and the copy is hashed, so a blob's name is the digest of exactly the
bytes under it. Past the budget an input is kept by hash only, and the cell's
record says so.

The copy runs **before** lineage hashes the reads and leaves its hash in the
session's :data:`~host_kernel.host._workspace.HashCache` under the rule of
:func:`~host_kernel.host._workspace.cached_sha256` (cached only when the file's
stat key did not change while it was copied), so lineage's hash of a kept file
costs one ``stat`` and names the bytes stored: each kept file is read and
hashed once. What lineage ends up with is checked after it ran
(:meth:`InputKeeper.report`): a sha is listed as kept only when the store
returned it for bytes it holds, and a file that changed between the copy and
lineage's hash is listed twice, the bytes copied as kept and lineage's sha by
hash only.

It does not decide which accesses are a cell's reads (the tracer and
host/_cells.py do), nor what lineage makes of them (host/_lineage.py).
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from io import BufferedReader
from typing import Any

from .._errors import HostCallError
from ..store.blobs import CHUNK, BlobRef, FileBlobStore, open_beneath
from ._workspace import FileStat, HashCache, Workspace, cached_sha256, stat_key

__all__ = ["DEFAULT_INPUT_BUDGET", "Copied", "InputKeeper", "KeptInputs", "store_file"]

#: Bytes of input files one session keeps by default.
DEFAULT_INPUT_BUDGET = 4 * 2**30
#: Files up to this size are read whole and stored with one write; larger ones stream.
SMALL = 1 << 20
#: Copies in flight at once (a durable put waits on fsync; a large one on hashing).
WORKERS = 4
#: Bytes one ``copy_file_range`` call moves.
COPY_STEP = 64 * 2**20


@dataclass(frozen=True, slots=True)
class Copied:
    """What the copy pass did for one read: the sha and size of the bytes it stored (None
    when nothing was stored: past the budget, already kept, unreadable)."""

    path: str
    sha256: str | None
    size: int
    #: Why the store refused the bytes (a full disk), when it did.
    error: str | None = None
    #: The hash cache's entry for the path after the copy pass (the one it made, or the
    #: one it found kept): while lineage leaves that very entry in place, lineage's sha
    #: is its sha, and the report need not look at the file again.
    entry: tuple[FileStat, str, int] | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class KeptInputs:
    """One cell's ``inputs_kept``, gathered from its commands and its own reads."""

    kept: dict[tuple[str, str], int] = field(default_factory=dict)
    by_hash_only: dict[tuple[str, str], int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.kept or self.by_hash_only)

    def merge(self, other: KeptInputs) -> None:
        self.kept.update(other.kept)
        self.by_hash_only.update(other.by_hash_only)
        self.errors += other.errors

    def record(self, budget: int, used: int) -> dict[str, Any]:
        """The ``inputs_kept`` body: a (path, sha) kept is never also by hash only."""
        body: dict[str, Any] = {
            "kept": [[p, s, n] for (p, s), n in self.kept.items()],
            "by_hash_only": [[p, s, n] for (p, s), n in self.by_hash_only.items()
                             if (p, s) not in self.kept],
            "budget": budget, "used": used}
        if self.errors:
            body["error"] = "; ".join(dict.fromkeys(self.errors))
        return body


def _copy_into(src: int, dst: int, size: int) -> None:
    """At most ``size`` bytes from ``src``'s offset to ``dst``'s (a file still growing is
    copied as it was when opened): inside the kernel (``copy_file_range``) where the file
    systems allow it, else through a buffer."""
    left = size
    while left > 0:
        try:
            n = os.copy_file_range(src, dst, min(left, COPY_STEP))
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                 errno.EPERM):
                raise
            break
        if n == 0:
            return  # shorter than it was: copied up to its end
        left -= n
    buf = bytearray(CHUNK)
    while left > 0:
        n = os.readv(src, [memoryview(buf)[:min(left, CHUNK)]])
        if n == 0:
            return
        view = memoryview(buf)[:n]
        while view:
            view = view[os.write(dst, view):]
        left -= n


def store_file(store: FileBlobStore, src: BufferedReader, size: int) -> BlobRef:
    """Store at most ``size`` bytes of ``src`` (from its offset) as a blob, and return what
    was stored: the copy is made inside the kernel, then the copy itself is hashed, so the
    blob's name is the digest of exactly the bytes under it. Identical bytes already
    stored are not stored again."""
    fd, tmp = tempfile.mkstemp(dir=store.tmp, prefix=store.temp_prefix("input"))
    try:
        try:
            _copy_into(src.fileno(), fd, size)
            os.lseek(fd, 0, os.SEEK_SET)
            with open(fd, "rb", buffering=0, closefd=False) as copy:
                digest = hashlib.file_digest(copy, "sha256").hexdigest()
            stored = os.fstat(fd).st_size
            if store._intact(digest):
                os.unlink(tmp)
                return BlobRef(digest, stored)
            if store.durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        return store._commit(tmp, digest, stored)
    except BaseException as exc:
        store._discard(tmp)
        raise store._storage_error(exc) from exc


class InputKeeper:
    """The session's kept inputs: what it stored, what that cost, and each cell's report.

    ``store`` gives the record's blob store (opened with the record); ``cache`` is
    the hash cache lineage uses. Thread-safe: ``host.bash`` commands keep their
    reads from the call's thread while a cell may end in another.
    """

    def __init__(self, workspace: Workspace, cache: HashCache, budget: int,
                 store: Callable[[], FileBlobStore]) -> None:
        self.workspace = workspace
        self.cache = cache
        #: Most bytes of distinct inputs this session keeps; 0 keeps none.
        self.budget = budget
        #: Bytes of distinct inputs kept so far (each sha counted once).
        self.used = 0
        self._store = store
        #: sha256 → size of the bytes this session stored (or found stored) as an input.
        self._stored: dict[str, int] = {}
        self._lock = threading.Lock()
        #: cell id → what its commands kept, reported with the cell's own reads.
        self._pending: dict[str, KeptInputs] = {}
        record = workspace.record
        #: The record folder as a workspace path ("rec/"), when it lies inside (legacy).
        self._record_prefix = (record.relative_to(workspace.root).as_posix() + "/"
                               if workspace.contains(record) and record != workspace.root
                               else None)

    # -- which reads

    def candidates(self, reads: Iterable[object]) -> list[str]:
        """The reads whose bytes may be kept, in order, once each: not in ``__pycache__``
        and, for a path not spelt plainly (``./``, ``..``, absolute) or under the record
        folder, one that resolves inside the workspace and outside the record. Each copy
        checks its path again, fully (:meth:`_copy_one`); this is the cheap sieve."""
        out: list[str] = []
        for rel in dict.fromkeys(r for r in reads if isinstance(r, str)):
            parts = rel.split("/")
            if "__pycache__" in parts:
                continue
            if any(p in ("", ".", "..") for p in parts) or (
                    self._record_prefix is not None and rel.startswith(self._record_prefix)):
                try:
                    real = self.workspace.resolve(rel)
                except HostCallError:
                    continue  # outside the workspace, into the record, or not a path
                if real == self.workspace.root or "__pycache__" in real.parts:
                    continue
            out.append(rel)
        return out

    # -- the copy pass (before lineage hashes the reads)

    def copy(self, reads: Iterable[object]) -> list[Copied]:
        """Store the bytes of each read not kept yet, within the budget; the hash of each
        stored file goes into the hash cache. Returns one :class:`Copied` per candidate."""
        rels = self.candidates(reads)
        if not rels:
            return []
        if self.budget <= 0:
            return [Copied(rel, None, 0) for rel in rels]
        done: dict[str, Copied] = {}
        todo: list[str] = []
        for rel in rels:
            known = self._kept_already(rel)
            if known is None:
                todo.append(rel)
            else:
                done[rel] = known
        if len(todo) == 1:
            done[todo[0]] = self._copy_one(todo[0])
        elif todo:
            with ThreadPoolExecutor(min(WORKERS, len(todo)),
                                    thread_name_prefix="keep-input") as pool:
                done.update(zip(todo, pool.map(self._copy_one, todo), strict=True))
        return [done[rel] for rel in rels]

    def _kept_already(self, rel: str) -> Copied | None:
        """A read whose bytes are known (hash cache, same stat key) and kept: no I/O but a stat."""
        hit = self.cache.get(rel)
        if hit is None or hit[1] not in self._stored:
            return None
        try:
            key = stat_key(os.stat(os.path.join(self.workspace.root, rel),
                                   follow_symlinks=False))
        except OSError:
            return None
        return Copied(rel, None, key[0], entry=hit) if key == hit[0] else None

    def _copy_one(self, rel: str) -> Copied:
        root = self.workspace.root
        try:
            # Resolved (a symlink leading out, or into the record, is refused), then opened
            # beneath the root with no symlink followed and checked to be a regular file.
            real = self.workspace.resolve(rel)
            if "__pycache__" in real.parts:
                return Copied(rel, None, 0)
            src = open_beneath(root, real.relative_to(root).as_posix(), label=repr(rel))
        except (OSError, HostCallError):
            return Copied(rel, None, 0)  # gone, not a regular file, or swapped for a symlink
        with src:
            try:
                taken = time.time_ns()
                key = stat_key(os.fstat(src.fileno()))
            except OSError:
                return Copied(rel, None, 0)
            size = key[0]
            hit = self.cache.get(rel)
            with self._lock:
                if hit is not None and hit[0] == key and hit[1] in self._stored:
                    return Copied(rel, None, size, entry=hit)
                if self.used + size > self.budget:
                    return Copied(rel, None, size)  # kept by hash only
                self.used += size  # reserved; settled below
            ref: BlobRef | None = None
            entry = None
            try:
                store = self._store()
                ref = (store.put_bytes(src.read(size)) if size <= SMALL
                       else store_file(store, src, size))
                if ref.size == size and stat_key(os.fstat(src.fileno())) == key:
                    # As cached_sha256 would: the key held while these bytes were read.
                    entry = self.cache[rel] = (key, ref.sha256, taken)
            except Exception as exc:  # noqa: BLE001 - a full disk: this input by hash only
                return Copied(rel, None, size, f"{rel}: {exc}")
            finally:
                with self._lock:
                    self.used -= size
                    if ref is not None and ref.sha256 not in self._stored:
                        self._stored[ref.sha256] = ref.size
                        self.used += ref.size
        return Copied(rel, ref.sha256, ref.size, entry=entry)

    # -- the report (after lineage hashed the reads)

    def report(self, copied: Iterable[Copied]) -> KeptInputs:
        """Each read as lineage hashed it (the hash cache's answer): kept when the store
        holds those bytes, else by hash only; bytes copied that lineage does not name (the
        file changed after the copy) are listed as kept under their own sha."""
        out = KeptInputs()
        for c in copied:
            if c.error is not None:
                out.errors.append(c.error)
            if c.sha256 is not None:
                out.kept[(c.path, c.sha256)] = c.size
            now = self.cache.get(c.path)
            sha = (now[1] if now is not None and now is c.entry
                   else cached_sha256(self.workspace.root, c.path, self.cache))
            if sha is None:
                continue  # gone, or no longer a regular file: lineage has no sha either
            if sha in self._stored:
                out.kept[(c.path, sha)] = self._stored[sha]
            else:
                hit = self.cache.get(c.path)
                out.by_hash_only[(c.path, sha)] = (hit[0][0] if hit is not None
                                                   and hit[1] == sha else c.size)
        return out

    def keep(self, reads: Iterable[object]) -> KeptInputs:
        """Copy, then report at once: for reads lineage hashes right after (a command's)."""
        try:
            return self.report(self.copy(reads))
        except Exception as exc:  # noqa: BLE001 - keeping is evidence, never blocks the call
            failed = KeptInputs()
            failed.errors.append(f"{type(exc).__name__}: {exc}")
            return failed

    # -- per cell

    def command_finished(self, cell_id: str, body: dict[str, Any]) -> None:
        """Keep what a ``host.bash`` command read (its traced reads, less the files it
        changed), to be reported with its cell; call it before lineage hashes them."""
        traced = body.get("traced")
        if not isinstance(traced, dict):
            return  # untraced: lineage names its inputs from the command line, not kept
        changed = {c.get("path") for c in body.get("changes", ()) if isinstance(c, dict)}
        reads = [r for r in traced.get("reads", ()) if isinstance(r, str) and r not in changed]
        if not reads:
            return
        found = self.keep(reads)
        with self._lock:
            self._pending.setdefault(cell_id, KeptInputs()).merge(found)

    def cell_finished(self, cell_id: str, own: KeptInputs | None) -> dict[str, Any] | None:
        """The cell's ``inputs_kept`` (its commands' and its own reads), or None when it
        read nothing. Forgets what commands of earlier cells left behind."""
        with self._lock:
            found = self._pending.pop(cell_id, None) or KeptInputs()
            self._pending.clear()  # a command's keep that outlived its cell
            used = self.used
        if own is not None:
            found.merge(own)
        return found.record(self.budget, used) if found or found.errors else None
