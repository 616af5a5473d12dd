"""The blob store: bytes addressed by their sha256, written atomically.

Layout under the store's root::

    blobs/sha256/ab/abcdef…   one file per distinct content, read-only
    tmp/                      partial copies; never visible under blobs/

A put copies in one pass that hashes while it writes, fsyncs, and renames into
place; identical bytes are stored once. A Host killed mid-put leaves at most a
file in ``tmp/``, which :meth:`FileBlobStore.sweep` removes.

This module owns the local-filesystem default. :class:`BlobStore` is the seam
for another backend (object storage).
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from .._errors import StorageError
from .._procs import pid_alive

__all__ = ["BlobRef", "BlobStore", "FileBlobStore", "EMPTY_SHA256"]

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

    def put_bytes(self, data: bytes) -> BlobRef: ...

    def open(self, sha256: str) -> BinaryIO: ...

    def exists(self, sha256: str) -> bool: ...

    def hash_of(self, sha256: str) -> str | None: ...

    def __iter__(self) -> Iterator[str]: ...



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
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError(f"not a sha256 digest: {sha256!r}")
        return self.blobs / sha256[:2] / sha256

    # -- writing

    def put_file(self, path: str | Path) -> BlobRef:
        """Copy ``path`` in, hashing while copying. Returns what was actually stored."""
        try:
            src = open(path, "rb")
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror}") from exc
        with src:
            return self._put_stream(src)

    def put_bytes(self, data: bytes) -> BlobRef:
        digest = hashlib.sha256(data).hexdigest()
        if self.exists(digest):
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

    def _put_stream(self, src: BinaryIO) -> BlobRef:
        """One pass over ``src``: each chunk is written here while a second thread hashes it.

        hashlib and file writes both release the GIL, so the copy costs about
        max(write, hash) rather than their sum. Buffers rotate through a small
        free list, which bounds memory at ``BUFFERS * CHUNK``.
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
                    if self.exists(digest):
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
        if final.exists():
            os.unlink(tmp)
            return BlobRef(digest, size)
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

    def open(self, sha256: str) -> BinaryIO:
        return open(self.path(sha256), "rb")

    def read(self, sha256: str) -> bytes:
        with self.open(sha256) as f:
            return f.read()

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).exists()

    def hash_of(self, sha256: str) -> str | None:
        """Re-hash the stored bytes; None when the blob is missing."""
        try:
            f = self.open(sha256)
        except FileNotFoundError:
            return None
        with f:
            return hashlib.file_digest(f, "sha256").hexdigest()  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[str]:
        for sub in sorted(self.blobs.iterdir()):
            if sub.is_dir():
                for blob in sorted(sub.iterdir()):
                    yield blob.name
