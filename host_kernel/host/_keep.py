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
stat key did not change while it was copied and the file had settled before it,
:func:`~host_kernel.host._workspace.settled`), so lineage names the bytes stored
and each kept file is read and hashed once per content. A traced read whose
stamp (the stat key the tracer saw at its open,
:class:`~host_kernel.host._workspace.OpenStamps`) is the key of a cached hash
whose bytes are kept costs no look at the file at all; without a stamp, one
``stat``. Small files new to the store are put as one batch (:class:`_Batch`:
one flush of the file system before they are renamed into place and one after,
instead of two ``fsync`` calls each). What lineage ends up with is checked after it ran
(:meth:`InputKeeper.report`): a sha is listed as kept only when the store
returned it for bytes it holds, and a file that changed between the copy and
lineage's hash is listed twice, the bytes copied as kept and lineage's sha by
hash only.

It does not decide which accesses are a cell's reads (the tracer and
host/_cells.py do), nor what lineage makes of them (host/_lineage.py).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import itertools
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from io import BufferedReader
from typing import Any

from .._errors import HostCallError, PathRefused
from ..store.blobs import CHUNK, BlobRef, FileBlobStore, open_beneath
from ._workspace import FileStat, HashCache, Workspace, cached_hash, settled, stat_key

__all__ = ["DEFAULT_INPUT_BUDGET", "Copied", "CopyPass", "InputKeeper", "KeptInputs", "Known",
           "store_file"]

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
    #: one it found kept; None when the file had not settled, and nothing was cached):
    #: while lineage leaves that very entry in place, lineage's sha is its sha, and the
    #: report need not look at the file again.
    entry: tuple[FileStat, str, int] | None = field(default=None, compare=False, repr=False)


#: A read the copy pass found kept already, with nothing to do: (its path, the hash cache's
#: entry for it, whose key is the read's stamp or the Host's own stat of the file). A cell
#: reading ten thousand files it read before gets one of these per read, not a Copied.
Known = tuple[str, tuple[FileStat, str, int]]


@dataclass(slots=True)
class CopyPass:
    """What :meth:`InputKeeper.copy_reads` did for a cell's reads, in their order."""

    #: One per candidate read: a :class:`Copied` (looked at, stored, or not kept), or a
    #: :data:`Known` (kept already: nothing looked at, or one stat).
    items: list[Copied | Known] = field(default_factory=list)
    #: Path -> the stat key the Host itself took for a read it found kept already (an
    #: untraced read: no stamp), equal to the cached key: lineage may take the cached hash
    #: for it without a second stat (``cached_hash``'s ``known``).
    keys: dict[str, FileStat] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.items)

    def copied(self) -> list[Copied]:
        """Every item as a :class:`Copied` (a :data:`Known` as the copy of nothing)."""
        return [c if isinstance(c, Copied) else Copied(c[0], None, c[1][0][0], entry=c[1])
                for c in self.items]


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


#: A path that may have a part that is empty, ``.``, ``..`` or ``__pycache__`` (or is empty,
#: or absolute): ``//``, ``__pycache__``, a leading or trailing ``/``, or a ``.``/``..`` part.
_ODD = re.compile(r"\A\Z|\A/|/\Z|//|__pycache__|(?:\A|/)\.\.?(?:/|\Z)")


def _odd(rel: str) -> bool:
    """Whether ``rel`` may have a part that is empty, ``.``, ``..`` or ``__pycache__``."""
    return _ODD.search(rel) is not None


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


_libc = ctypes.CDLL(None, use_errno=True)
_syncfs = getattr(_libc, "syncfs", None)
#: Files in a batch from which one ``syncfs`` replaces an ``fsync`` each: it flushes the
#: whole file system, whatever else is writing to it, so it pays only for many files.
SYNCFS_FROM = 32


class _Batch:
    """Small inputs on their way into a :class:`FileBlobStore`, made durable together.

    Each is written, as it is read, to a temp file of the store's (named with the
    Host's pid, as the store's own puts are, so a sweep can tell leftovers apart);
    :meth:`commit` then flushes the store's file system once (``syncfs``), renames
    each into place under its digest, and flushes once more: what the store's own
    put does with two ``fsync`` calls per blob (one for the bytes, one for the
    folder), here done once for all of them. The same digest is written once.
    With fewer than :data:`SYNCFS_FROM` files (``syncfs`` flushes the whole file
    system, other writers' data included), or without ``syncfs``, each temp file and
    each folder is synced one by one.
    """

    def __init__(self, store: FileBlobStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._prefix = store.temp_prefix("input") + secrets.token_hex(4) + "-"
        self._names = itertools.count()
        self._dir: int | None = None
        #: sha256 -> the temp file holding its bytes (a name under the store's tmp/).
        self.staged: dict[str, str] = {}
        #: read path -> bytes of the budget it holds until the batch is settled.
        self.reserved: dict[str, int] = {}
        #: sha256 -> why its bytes could not be stored.
        self.failed: dict[str, str] = {}
        self._moved: set[str] = set()

    def _tmp(self) -> int:
        with self._lock:
            if self._dir is None:
                self._dir = os.open(self.store.tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            return self._dir

    def add(self, sha: str, data: bytes) -> None:
        """Write ``data`` (whose digest is ``sha``) to a temp file, unless it is staged."""
        folder = self._tmp()
        with self._lock:
            if sha in self.staged:
                return
            name = self.staged[sha] = f"{self._prefix}{next(self._names)}"
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444,
                         dir_fd=folder)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        except OSError as exc:
            with self._lock:
                self.failed[sha] = str(FileBlobStore._storage_error(exc))
            raise

    def fail_all(self, why: str) -> None:
        for sha in self.staged:
            self.failed.setdefault(sha, why)
        self._discard()

    def commit(self) -> None:
        """Make every staged blob durable under its name (see the class docstring)."""
        if not self.staged:
            self._discard()
            return
        folder = self._tmp()
        store = self.store
        durable = store.durable
        blobs = os.open(store.blobs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        subfolders: dict[str, int] = {}
        many = len(self.staged) >= SYNCFS_FROM
        try:
            if durable:
                self._flush(folder, [name for sha, name in self.staged.items()
                                     if sha not in self.failed], (), many)
            for sha, name in self.staged.items():
                if sha in self.failed:
                    continue
                try:
                    sub = subfolders.get(sha[:2])
                    if sub is None:
                        try:
                            os.mkdir(sha[:2], dir_fd=blobs)
                        except FileExistsError:
                            pass
                        sub = subfolders[sha[:2]] = os.open(
                            sha[:2], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                            dir_fd=blobs)
                    try:
                        os.stat(sha, dir_fd=sub, follow_symlinks=False)
                    except FileNotFoundError:
                        pass
                    else:
                        if store._intact(sha):
                            continue  # stored already; anything else there is replaced
                    os.replace(name, sha, src_dir_fd=folder, dst_dir_fd=sub)
                    self._moved.add(sha)
                except OSError as exc:
                    self.failed[sha] = str(FileBlobStore._storage_error(exc))
            if durable and subfolders:
                self._flush(folder, [], subfolders.values(), many)
        finally:
            for fd in subfolders.values():
                os.close(fd)
            os.close(blobs)
            self._discard()

    def _flush(self, folder: int, names: list[str], folders: Iterable[int],
               many: bool) -> None:
        """Everything written so far on the store's file system made durable: one
        ``syncfs`` for ``many`` files, or (fewer, or where it fails) each temp file
        (``names``) and folder synced."""
        if many and _syncfs is not None and _syncfs(folder) == 0:
            return
        for name in names:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=folder)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for fd in folders:
            os.fsync(fd)

    def _discard(self) -> None:
        """Remove the temp files not renamed into place, and let go of the folder."""
        with self._lock:
            folder, self._dir = self._dir, None
        if folder is None:
            return
        try:
            for sha, name in self.staged.items():
                if sha in self._moved:
                    continue
                try:
                    os.unlink(name, dir_fd=folder)
                except FileNotFoundError:
                    pass
        finally:
            os.close(folder)


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
        odd, record = _ODD.search, self._record_prefix
        for rel in dict.fromkeys([r for r in reads if isinstance(r, str)]):
            if odd(rel) is None:  # most are plain (the tracer's are)
                if record is None or not rel.startswith(record):
                    out.append(rel)
                    continue
                parts: list[str] | tuple[()] = ()
            else:
                parts = rel.split("/")
            if "__pycache__" in parts:
                continue
            if any(p in ("", ".", "..") for p in parts) or (
                    record is not None and rel.startswith(record)):
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
        """:meth:`copy_reads`, each read as a :class:`Copied`."""
        return self.copy_reads(reads).copied()

    def copy_reads(self, reads: Iterable[object]) -> CopyPass:
        """Store the bytes of each read not kept yet, within the budget; the hash of each
        stored file goes into the hash cache. One item per candidate, in order.

        A read whose stamp (the stat key the tracer saw at its open, handed over with
        these reads: :class:`~host_kernel.host._workspace.OpenStamps`) is the key of a
        cached hash whose bytes are kept costs nothing more: no file is looked at, and its
        item is a :data:`Known`; without a stamp, one ``stat`` (its key goes in
        :attr:`CopyPass.keys`). Small files not kept yet are stored as one batch
        (:class:`_Batch`): one flush of the file system for all of them instead of two
        ``fsync`` calls each."""
        reads = list(reads)
        rels = self.candidates(reads)
        out = CopyPass()
        if not rels:
            return out
        if self.budget <= 0:
            out.items = [Copied(rel, None, 0) for rel in rels]
            return out
        stamps = self.workspace.stamps.for_reads(reads)
        cache, stored = self.cache, self._stored
        items: list[Copied | Known | None] = []
        todo: list[tuple[int, str]] = []
        for rel in rels:
            hit = cache.get(rel)
            if hit is not None and hit[1] in stored:
                stamp = stamps.get(rel)
                if stamp is not None:
                    if stamp == hit[0]:
                        # The open found the file under the key its cached hash was taken with.
                        items.append((rel, hit))
                        continue
                elif self._stat_matches(rel, hit[0]):
                    out.keys[rel] = hit[0]
                    items.append((rel, hit))
                    continue
            todo.append((len(items), rel))
            items.append(None)
        if len(todo) == 1:
            i, rel = todo[0]
            items[i] = self._copy_one(rel)
        elif todo:
            store = self._store()
            # A store of another kind (one that mirrors each put elsewhere) puts one by one.
            batch = _Batch(store) if type(store) is FileBlobStore else None
            # A few threads, each with its share of the files in turn (not a task per file).
            workers = min(WORKERS, len(todo))
            shares = [todo[i::workers] for i in range(workers)]
            done: dict[str, Copied] = {}
            try:
                with ThreadPoolExecutor(workers, thread_name_prefix="keep-input") as pool:
                    for share, found in zip(shares, pool.map(
                            lambda share: [self._copy_one(rel, batch) for _, rel in share],
                            shares), strict=True):
                        done.update(zip((rel for _, rel in share), found, strict=True))
            finally:
                if batch is not None:
                    self._settle(batch, done)
            for i, rel in todo:
                items[i] = done[rel]
        out.items = items  # type: ignore[assignment]  # every None was filled above
        return out

    def _stat_matches(self, rel: str, key: FileStat) -> bool:
        """Whether ``rel``'s stat key (no symlink followed) is ``key`` now: one stat."""
        try:
            st = os.stat(os.path.join(self.workspace.root, rel), follow_symlinks=False)
        except OSError:
            return False
        return stat_key(st) == key

    def _open(self, rel: str) -> BufferedReader | None:
        """``rel`` opened beneath the root with no symlink followed, checked to be a regular
        file; None when it is gone, not a regular file, or leads out of the workspace."""
        root = self.workspace.root
        try:
            # A plain path is opened as named; one with a symlink on its way is resolved
            # (one leading out, or into the record, is refused) and its target opened.
            return open_beneath(root, rel, label=repr(rel))
        except PathRefused:
            pass
        except (OSError, HostCallError):
            return None
        try:
            real = self.workspace.resolve(rel)
            if "__pycache__" in real.parts:
                return None
            return open_beneath(root, real.relative_to(root).as_posix(), label=repr(rel))
        except (OSError, HostCallError):
            return None  # gone, not a regular file, or swapped for a symlink

    def _copy_one(self, rel: str, batch: _Batch | None = None) -> Copied:
        src = self._open(rel)
        if src is None:
            return Copied(rel, None, 0)
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
            if batch is not None and size <= SMALL:
                return self._stage(rel, src, key, taken, batch)
            ref: BlobRef | None = None
            entry = None
            try:
                store = self._store()
                ref = (store.put_bytes(src.read(size)) if size <= SMALL
                       else store_file(store, src, size))
                if (ref.size == size and stat_key(os.fstat(src.fileno())) == key
                        and settled(key[2], taken)):
                    # As cached_sha256 would: the key held while these bytes were read,
                    # and no rewrite in the clock tick of its change time can share it.
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

    def _stage(self, rel: str, src: BufferedReader, key: FileStat, taken: int,
               batch: _Batch) -> Copied:
        """A small file's bytes read, hashed and written to one of the batch's temp files;
        its reserved size is settled by :meth:`_settle`, after the batch is committed. The
        cache gets the hash as :meth:`_copy_one` gives it (same key, file settled)."""
        batch.reserved[rel] = key[0]
        try:
            data = src.read(key[0])
            sha = hashlib.sha256(data).hexdigest()
            entry = None
            if (len(data) == key[0] and stat_key(os.fstat(src.fileno())) == key
                    and settled(key[2], taken)):
                entry = self.cache[rel] = (key, sha, taken)
            with self._lock:
                known = sha in self._stored
            if not known:
                batch.add(sha, data)
        except Exception as exc:  # noqa: BLE001 - a full disk: this input by hash only
            return Copied(rel, None, key[0], f"{rel}: {exc}")
        return Copied(rel, sha, len(data), entry=entry)

    def _settle(self, batch: _Batch, done: dict[str, Copied]) -> None:
        """Commit the batch, then settle what each staged read reserved: a sha the store
        now holds is kept (and counted once); one it could not store is an error, and the
        read is kept by hash only."""
        try:
            batch.commit()
        except Exception as exc:  # noqa: BLE001 - a full disk: these inputs by hash only
            batch.fail_all(f"{type(exc).__name__}: {exc}")
        with self._lock:
            for rel, reserved in batch.reserved.items():
                self.used -= reserved
                c = done.get(rel)
                if c is None or c.sha256 is None:
                    continue
                error = batch.failed.get(c.sha256)
                if error is not None:
                    done[rel] = Copied(rel, None, c.size, f"{rel}: {error}", entry=c.entry)
                elif c.sha256 not in self._stored:
                    self._stored[c.sha256] = c.size
                    self.used += c.size

    # -- the report (after lineage hashed the reads)

    def report(self, copied: Iterable[Copied | Known] | CopyPass) -> KeptInputs:
        """Each read as lineage hashed it (the hash cache's answer): kept when the store
        holds those bytes, else by hash only; bytes copied that lineage does not name (the
        file changed after the copy) are listed as kept under their own sha."""
        out = KeptInputs()
        cache, stored, kept = self.cache, self._stored, out.kept
        for c in (copied.items if isinstance(copied, CopyPass) else copied):
            if not isinstance(c, Copied):
                rel, entry = c  # a Known
                if cache.get(rel) is entry:
                    # Lineage left the very entry the pass found kept: its sha is lineage's.
                    size = stored.get(entry[1])
                    if size is not None:
                        kept[(rel, entry[1])] = size
                        continue
                c = Copied(rel, None, entry[0][0], entry=entry)
            if c.error is not None:
                out.errors.append(c.error)
            if c.sha256 is not None:
                kept[(c.path, c.sha256)] = c.size
            now = cache.get(c.path)
            found = (now[:2] if now is not None and now is c.entry
                     else cached_hash(self.workspace.root, c.path, cache))
            if found is None:
                continue  # gone, or no longer a regular file: lineage has no sha either
            key, sha = found
            if sha in stored:
                kept[(c.path, sha)] = stored[sha]
            else:
                out.by_hash_only[(c.path, sha)] = key[0]  # the size of the bytes hashed
        return out

    def keep(self, reads: Iterable[object]) -> KeptInputs:
        """Copy, then report at once: for reads lineage hashes right after (a command's)."""
        try:
            return self.report(self.copy_reads(reads))
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
