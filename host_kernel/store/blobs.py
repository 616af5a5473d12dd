"""The blob store: bytes addressed by their sha256, written atomically.

Layout under the store's root::

    blobs/sha256/ab/abcdef…   one file per distinct content, read-only
    tmp/                      partial copies; never visible under blobs/

A put copies in one pass, fsyncs, and renames into place; identical bytes are
stored once. A regular file is copied by the kernel into the store's own temp
file, and that copy is hashed (store/_copy.py), so a source rewritten during
the put cannot make the blob differ from its name; any other stream is hashed
from the buffers it is written from. A Host killed mid-put leaves at most a
file in ``tmp/``, which :meth:`FileBlobStore.sweep` removes.

Every file that is hashed and then used, a blob or a file put into the store,
is opened once, by :func:`open_regular`: without following a symlink, without
blocking (a FIFO opened for reading waits for a writer forever), and checked on
the open descriptor to be a regular file; the bytes hashed are the bytes used.
A read verifies: :meth:`FileBlobStore.read` returns a blob's bytes only when
they hash to its name. The refusals carry stable codes: ``not_regular_file``
(a FIFO, device, socket or directory), ``symlink_refused``, ``blob_missing``,
``blob_altered``.

This module owns the local-filesystem default and that safe opening
(:func:`open_regular`, :func:`open_beneath`, which the workspace and the
verifier use too). :class:`BlobStore` is the seam for another backend (object
storage).
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import re
import stat
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

from .._errors import FileProblem, HostCallError, PathRefused, StorageError
from .._procs import pid_alive
from ._copy import copy_hashed, file_source

__all__ = ["EMPTY_SHA256", "RACY_NS", "BlobRef", "BlobStore", "FileBlobStore", "Stamp",
           "file_kind", "open_beneath", "open_regular", "stamp"]

CHUNK = 4 * 1024 * 1024
#: Buffers in flight between the copying and the hashing thread (memory: BUFFERS * CHUNK).
BUFFERS = 4
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True, slots=True)
class BlobRef:
    sha256: str
    size: int


class BlobStore(Protocol):
    def put_file(self, path: str | Path) -> BlobRef: ...

    def put_stream(self, src: BinaryIO) -> BlobRef: ...

    def put_bytes(self, data: bytes) -> BlobRef: ...

    def open(self, sha256: str) -> BinaryIO: ...

    def read(self, sha256: str) -> bytes: ...

    def exists(self, sha256: str) -> bool: ...

    def hash_of(self, sha256: str) -> str | None: ...

    def __iter__(self) -> Iterator[str]: ...


# --------------------------------------------------------------------------- opening safely

_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symlink",
}


def file_kind(mode: int) -> str:
    """What a stat mode is, in words: "a FIFO (named pipe)", "a directory", "a regular file"."""
    return _KINDS.get(stat.S_IFMT(mode), "a regular file" if stat.S_ISREG(mode)
                      else "not a regular file")


def _not_regular(label: str, mode: int) -> FileProblem:
    return FileProblem(f"{label} is {file_kind(mode)}, not a regular file; only regular files "
                       f"can be read, hashed or saved", code="not_regular_file")


def _symlink(label: str) -> PathRefused:
    return PathRefused(f"{label} is a symlink where a regular file must be; give the path of "
                       f"the file itself", code="symlink_refused")


def open_regular(path: str | os.PathLike[str], *, follow_symlinks: bool = False,
                 dir_fd: int | None = None, label: str | None = None) -> BufferedReader:
    """Open a regular file for reading, once, without ever blocking.

    Whatever is at ``path`` is looked at before it is opened (so a device is
    never opened), then opened with ``O_NONBLOCK`` (a FIFO opened for reading
    would otherwise wait for a writer forever) and ``O_NOFOLLOW`` unless
    ``follow_symlinks``, then checked again on the open descriptor, which is
    what the caller reads: a swap between the look and the open is caught.
    ``O_NONBLOCK`` is cleared before the file is handed back.

    Raises FileProblem with code ``not_regular_file`` (a FIFO, device, socket
    or directory) or PathRefused with code ``symlink_refused`` (the last
    component is a symlink and ``follow_symlinks`` is false), both naming
    ``label`` (default: the path). A missing file raises FileNotFoundError;
    other OSErrors pass through.
    """
    label = label if label is not None else repr(os.fspath(path))
    try:
        before = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise _symlink(label) from None
        raise
    if stat.S_ISLNK(before.st_mode):
        raise _symlink(label)
    if not stat.S_ISREG(before.st_mode):
        raise _not_regular(label, before.st_mode)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) and not follow_symlinks:
            raise _symlink(label) from None
        if exc.errno == errno.ENXIO:  # a socket put in place since the look
            raise FileProblem(f"{label} is a socket, not a regular file; only regular files "
                              f"can be read, hashed or saved", code="not_regular_file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(label, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_beneath(root: str | os.PathLike[str], rel: str | PurePosixPath, *,
                 label: str | None = None) -> BufferedReader:
    """Open ``root/rel`` for reading, following no symlink on the way, and only a regular file.

    ``rel`` is a relative path with no symlink in it (the part under ``root``
    of a path that ``os.path.realpath`` returned): each folder is opened from
    the one before with ``O_NOFOLLOW``, so a folder swapped for a symlink
    after the path was resolved (one leading out of ``root``) is refused with
    ``symlink_refused`` instead of followed. The file itself goes through
    :func:`open_regular`. A missing file or folder raises FileNotFoundError.
    """
    pure = PurePosixPath(rel)
    label = label if label is not None else repr(pure.as_posix())
    if pure.is_absolute() or ".." in pure.parts:
        raise PathRefused(f"{label} must be a relative path inside its root")
    parts = pure.parts
    if not parts:
        raise FileProblem(f"{label} is a directory, not a regular file", code="not_regular_file")
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        for part in parts[:-1]:
            try:
                fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                   | os.O_CLOEXEC, dir_fd=fds[-1]))
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                try:
                    mode = os.stat(part, dir_fd=fds[-1], follow_symlinks=False).st_mode
                except OSError:
                    raise FileNotFoundError(errno.ENOENT, "no such folder", part) from None
                if stat.S_ISLNK(mode):
                    raise PathRefused(f"{label}: the folder {part!r} on its way is a symlink "
                                      f"(it was replaced after the path was resolved); it is "
                                      f"not followed", code="symlink_refused") from None
                raise FileNotFoundError(errno.ENOTDIR, f"{part!r} is not a folder",
                                        part) from None
        return open_regular(parts[-1], dir_fd=fds[-1], label=label)
    finally:
        for fd in fds:
            os.close(fd)


#: A blob's name: a sha256 digest in lower-case hex.
_DIGEST = re.compile("[0-9a-f]{64}")
#: A time stamp this close to now (ns) is not trusted to show a later change: file systems
#: stamp times from a coarse clock, some to the second or two, so a change in the same
#: tick as a look would leave the stamp as it was.
RACY_NS = 2_000_000_000
#: Blobs whose stamps a store remembers at most; past it, it starts again empty.
_HASHED_KEPT = 4096
#: A file's identity and content stamp: device, inode, size, modification and change time.
Stamp = tuple[int, int, int, int, int]


def stamp(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileBlobStore:
    """Blobs as read-only files under ``root/blobs/sha256``."""

    def __init__(self, root: str | Path, *, durable: bool = True) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs" / "sha256"
        self.tmp = self.root / "tmp"
        self.durable = durable
        #: Bytes copied into this store's temp files by each way of copying: the
        #: kernel's ``copy_file_range`` or ``sendfile``, ``read`` (a regular file through
        #: a buffer, where neither works), ``stream`` (a source with no descriptor of a
        #: regular file). Counted once a put's copy is complete.
        self.copied: Counter[str] = Counter()
        self._copied_lock = threading.Lock()
        #: digest -> the stamp of the blob's file when it was last hashed (:meth:`_intact`)
        self._hashed: dict[str, Stamp] = {}
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        if not _DIGEST.fullmatch(sha256):
            raise ValueError(f"not a sha256 digest: {sha256!r}")
        return Path(f"{self.blobs}/{sha256[:2]}/{sha256}")

    # -- writing

    def put_file(self, path: str | Path) -> BlobRef:
        """Copy ``path`` in, hashing while copying. Returns what was actually stored.

        ``path`` is opened once by :func:`open_regular` (no symlink followed at
        its last component, never blocking): a FIFO, device, socket or directory
        is refused with FileProblem ``not_regular_file``, a symlink with
        PathRefused ``symlink_refused``, before anything is copied.
        """
        try:
            src = open_regular(path)
        except HostCallError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror}") from exc
        with src:
            return self.put_stream(src)

    def put_bytes(self, data: bytes) -> BlobRef:
        digest = hashlib.sha256(data).hexdigest()
        if self._intact(digest):
            return BlobRef(digest, len(data))
        fd, tmp = self._tempfile()
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                self._sync(out)
            return self._commit(tmp, digest, len(data))
        except BaseException as exc:
            self._discard(tmp)
            raise self._storage_error(exc) from exc

    def put_stream(self, src: BinaryIO) -> BlobRef:
        """Copy an open file in from its position to its end. Returns what was stored.

        A plain file object over a regular file (what :func:`open_regular`
        returns) is copied by the kernel, descriptor to descriptor, into a temp
        file of the store's own, and that copy is read back and hashed a step
        behind (store/_copy.py): the digest is of the bytes kept, not of the
        source, which a cell may rewrite meanwhile, and the fsync overlaps the end
        of the hashing. Any other binary file (``BytesIO``, a pipe, a file object
        that transforms what it reads) is copied through buffers that are hashed
        as they are written. Either way the temp file is fsynced (when
        ``durable``) and renamed into place, or deleted when the blob is stored
        already or anything fails; memory stays bounded (a buffer or a few).
        The source is left at its end, as reading it would leave it.
        """
        source = file_source(src)
        if source is None:
            return self._put_buffered(src)
        start = source[1]
        fd, tmp = self._tempfile()
        try:
            try:
                sync = (lambda: os.fsync(fd)) if self.durable else None
                copied = copy_hashed(source[0], start, fd, then=sync)
            finally:
                os.close(fd)
            src.seek(start + copied.size)
            self._count(copied.ways)
            if self._intact(copied.sha256):
                self._discard(tmp)
                return BlobRef(copied.sha256, copied.size)
            return self._commit(tmp, copied.sha256, copied.size)
        except BaseException as exc:
            self._discard(tmp)
            raise self._storage_error(exc) from exc

    def _put_buffered(self, src: BinaryIO) -> BlobRef:
        """Copy a file with no descriptor of a regular file in, hashing while copying.

        One pass over ``src``: each chunk is written here while a second thread
        hashes it, so the bytes stored are the bytes hashed. hashlib and file
        writes both release the GIL, so the copy costs about max(write, hash)
        rather than their sum. Buffers rotate through a small free list, which
        bounds memory at ``BUFFERS * CHUNK``.
        """
        fd, tmp = self._tempfile()
        hasher = hashlib.sha256()
        free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(BUFFERS):
            free.put(bytearray(CHUNK))
        work: queue.SimpleQueue[tuple[bytearray, int] | None] = queue.SimpleQueue()

        def hash_chunks() -> None:
            while (item := work.get()) is not None:
                buf, n = item
                hasher.update(memoryview(buf)[:n])
                free.put(buf)

        worker = threading.Thread(target=hash_chunks, name="blob-hasher", daemon=True)
        worker.start()
        size = 0
        try:
            try:
                with os.fdopen(fd, "wb", buffering=0) as out:
                    while True:
                        buf = free.get()
                        n = src.readinto(buf)  # type: ignore[attr-defined]
                        if not n:
                            break
                        work.put((buf, n))  # hashed while it is written below
                        view = memoryview(buf)[:n]
                        while view:
                            view = view[out.write(view):]
                        size += n
                    work.put(None)
                    worker.join()
                    digest = hasher.hexdigest()
                    self._count({"stream": size})
                    if self._intact(digest):
                        # Stored already: these bytes are discarded, so need not reach disk.
                        self._discard(tmp)
                        return BlobRef(digest, size)
                    self._sync(out)
            finally:
                work.put(None)  # harmless after the worker ended; ends it on an error
                worker.join()
            return self._commit(tmp, digest, size)
        except BaseException as exc:
            self._discard(tmp)
            raise self._storage_error(exc) from exc

    def _count(self, ways: Mapping[str, int]) -> None:
        with self._copied_lock:
            self.copied.update(ways)

    def _tempfile(self, what: str = "blob") -> tuple[int, str]:
        try:
            return tempfile.mkstemp(dir=self.tmp, prefix=self.temp_prefix(what))
        except OSError as exc:
            raise StorageError(f"cannot create a temporary file in the blob store: {exc.strerror}") from exc

    def _sync(self, out: BinaryIO) -> None:
        out.flush()
        if self.durable:
            os.fsync(out.fileno())

    def _commit(self, tmp: str, digest: str, size: int) -> BlobRef:
        final = self.path(digest)
        if self._intact(digest):
            os.unlink(tmp)
            return BlobRef(digest, size)
        # Anything else at the name (altered bytes, a FIFO, a symlink) is replaced by the
        # bytes just written, which do hash to it.
        final.parent.mkdir(exist_ok=True)
        os.chmod(tmp, 0o444)
        os.replace(tmp, final)
        if self.durable:
            _fsync_dir(final.parent)
        return BlobRef(digest, size)

    @staticmethod
    def _discard(tmp: str) -> None:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass

    @staticmethod
    def _storage_error(exc: BaseException) -> BaseException:
        if isinstance(exc, StorageError) or not isinstance(exc, OSError):
            return exc
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return StorageError(f"the record's disk is full ({exc.strerror}); nothing was "
                                f"stored")
        return StorageError(f"cannot write to the blob store: {exc.strerror or exc}")

    @staticmethod
    def temp_prefix(what: str) -> str:
        """Temp files carry the writer's pid, so a sweep can tell abandoned ones apart."""
        return f"put-{os.getpid()}-{what}-"

    def sweep(self) -> int:
        """Remove partial puts left by processes that are gone. Returns how many."""
        removed = 0
        for leftover in self.tmp.glob("put-*"):
            pid = leftover.name.split("-")[1]
            if pid.isdigit() and pid_alive(int(pid)):
                continue  # a live Host (maybe in this very process) is writing it
            leftover.unlink(missing_ok=True)
            removed += 1
        return removed

    # -- reading

    def open(self, sha256: str) -> BufferedReader:
        """The blob's file, opened once, never blocking, a regular file only (not verified).

        Raises StorageError with code ``blob_missing``, ``not_regular_file`` (a
        FIFO, device, socket or directory put where the blob was) or
        ``symlink_refused``; any other error opening it is ``storage_error``.
        """
        label = f"blob {sha256[:12]}… in the record's store"
        try:
            return open_regular(self.path(sha256), label=label)
        except HostCallError as exc:
            raise StorageError(f"{exc.message}; the store was altered", code=exc.code) from None
        except FileNotFoundError:
            raise StorageError(f"{label} is missing", code="blob_missing") from None
        except OSError as exc:
            raise StorageError(f"cannot read {label}: {exc.strerror or exc}") from None

    def read(self, sha256: str) -> bytes:
        """The blob's bytes, read once and returned only if they hash to ``sha256``.

        Raises StorageError: ``blob_altered`` when the bytes read do not hash to
        the name, or any code of :meth:`open`. It never blocks: a FIFO in the
        blob's place is refused, not read.
        """
        with self.open(sha256) as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise StorageError(f"blob {sha256[:12]}… no longer hashes to its name; the store "
                               f"was altered", code="blob_altered")
        return data

    def exists(self, sha256: str) -> bool:
        """Whether a regular file (not a symlink, FIFO or other) is stored under the name."""
        try:
            return stat.S_ISREG(os.lstat(self.path(sha256)).st_mode)
        except OSError:
            return False

    def stored(self, sha256: str) -> bool:
        """Whether committing these bytes again would add nothing: the blob is everywhere
        this store keeps blobs (here, the record folder; a mirrored store adds its remote)."""
        return self.exists(sha256)

    def hash_of(self, sha256: str) -> str | None:
        """Re-hash the stored bytes; None when there are none to hash.

        None when the name is not a sha256 digest, the blob is missing, or what
        is there is not a regular file (a FIFO, device, socket, directory or
        symlink put in its place, refused without blocking): a caller comparing
        the result with ``sha256`` sees an unusable blob either way.
        """
        try:
            f = self.open(sha256)
        except (ValueError, StorageError):
            return None
        with f:
            return hashlib.file_digest(f, "sha256").hexdigest()

    def _intact(self, digest: str) -> bool:
        """Whether the blob is stored and its bytes hash to its name (a put of them adds
        nothing). A blob this store hashed is not read again while its file's stamp holds:
        device, inode, size, modification and change time, taken from the descriptor that
        was hashed. Writing a file moves its change time, which no process can set back;
        a stamp whose change time was within :data:`RACY_NS` of the hash is not kept (a
        change in the same clock tick would not move it)."""
        try:
            path = self.path(digest)
            st = os.lstat(path)
        except (ValueError, OSError):
            return False
        if self._hashed.get(digest) == stamp(st):  # the file it hashed, not changed since
            return True
        now = time.time_ns()
        try:
            f = self.open(digest)
        except StorageError:
            return False
        with f:
            before = stamp(os.fstat(f.fileno()))
            intact = hashlib.file_digest(f, "sha256").hexdigest() == digest
            after = stamp(os.fstat(f.fileno()))
        if intact and before == after and after[4] < now - RACY_NS:
            if len(self._hashed) >= _HASHED_KEPT:
                self._hashed.clear()
            self._hashed[digest] = after
        return intact

    def __iter__(self) -> Iterator[str]:
        """Every name under the store's folders, whatever it is (audit flags what is not a blob)."""
        for sub in sorted(os.scandir(self.blobs), key=lambda e: e.name):
            if sub.is_dir(follow_symlinks=False):
                with os.scandir(sub.path) as entries:
                    yield from sorted(e.name for e in entries)
