"""Copying a regular file into the blob store inside the kernel, and hashing the copy.

Owns the fast path of :meth:`FileBlobStore.put_stream
<host_kernel.store.blobs.FileBlobStore.put_stream>`: which sources may take it
(:func:`file_source`: a plain file object over a regular file), the copy from
the source's descriptor into the store's temporary file without the bytes
passing through Python (``copy_file_range``, else ``sendfile``, else ``pread``
and ``write`` through one buffer; each way takes over where the one before
stopped), and the hashing of that copy (:func:`copy_hashed`).

The digest is taken from the copy, never from the source: a thread reads the
temporary file back (from the page cache) a step behind the copy and hashes
it. The temporary file is the Host's, in a folder no confined process can
write, so the bytes hashed are the bytes kept, whatever a cell does to the
source meanwhile; and the hash costs wall time only where it outlasts the
copy and the fsync that follows it.

It does not own the temporary file (its name and folder, whether it is
fsynced, the rename into place: blobs.py), nor sources without a descriptor
of a regular file (blobs.py copies those through buffers that it hashes).
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import queue
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import BinaryIO

from .._errors import StorageError

__all__ = ["HASH_BUFFER", "STEP", "WAYS", "Copied", "copy_hashed", "file_source"]

#: The ways to copy, tried in this order; each takes over at the offset where the one
#: before stopped (not supported here, or at what it took for the end of the file).
WAYS: tuple[str, ...] = ("copy_file_range", "sendfile", "read")
#: Most bytes one copy call moves: the hash follows the copy at most this far behind.
STEP = 8 * 1024 * 1024
#: The hashing thread's one buffer, reused for every read of the copy (also the buffer
#: of the ``read`` way). Small enough to stay in a core's cache while it is hashed.
HASH_BUFFER = 1024 * 1024

#: What a way answers when this kernel, file system pair or seccomp filter does not
#: support it, rather than when the copy itself failed: the next way is tried.
_UNSUPPORTED = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                          errno.ENOTSUP, errno.EPERM})
#: File objects whose bytes are exactly their descriptor's, from their position on (a
#: subclass may transform what it reads, as gzip.GzipFile does over its fileno()).
_PLAIN_BUFFERED = (io.BufferedReader, io.BufferedRandom)


@dataclass(frozen=True, slots=True)
class Copied:
    """What :func:`copy_hashed` put into the temporary file."""

    sha256: str
    size: int
    #: Bytes copied by each way that copied any, in :data:`WAYS`' names.
    ways: Mapping[str, int]


def file_source(src: BinaryIO) -> tuple[int, int] | None:
    """``(fd, offset)`` when ``src`` may be copied from its descriptor, else None.

    Only a plain file object (``io.FileIO``, or an ``io.BufferedReader`` or
    ``io.BufferedRandom`` over one; not a subclass, which may transform what it
    reads) that is readable, over a regular file; ``offset`` is the position a
    read of ``src`` would start at (a buffered reader's buffer accounted for).
    A pipe, socket, ``BytesIO`` or closed file answers None: copy it through
    Python instead.
    """
    raw: object = src
    if type(src) in _PLAIN_BUFFERED and isinstance(src, _PLAIN_BUFFERED):
        raw = src.raw
    if type(raw) is not io.FileIO or not isinstance(raw, io.FileIO):
        return None
    try:
        if not src.readable():
            return None
        if src.writable():
            src.flush()  # what a read would flush first
        fd = raw.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return fd, src.tell()
    except (OSError, ValueError):
        return None


def copy_hashed(src: int, offset: int, dst: int, *, then: Callable[[], None] | None = None,
                ways: tuple[str, ...] = WAYS) -> Copied:
    """Copy ``src`` from ``offset`` to its end into ``dst``, and hash the copy.

    ``dst`` is an empty file open for reading and writing, at offset 0, that
    nothing else writes. The copy tries ``ways`` in order (a subset of
    :data:`WAYS`, for a caller that knows one fails); a way that answers
    "not supported" hands over to the next at the same offset, and so does one
    that reports the end, which the next confirms (some kernels report the end
    of a file whose size they do not know, in /proc or /sys, at once). A file
    still growing is copied until the copy catches up with it.

    ``then`` runs once the copy is complete, while the hash may still be
    catching up (the caller's fsync of ``dst``). The digest is of the bytes
    read back from ``dst``; raises StorageError when they are not as many as
    were copied. Any OSError of the copy, of ``then`` or of the reading back
    passes through; the hashing thread has ended when this returns or raises.
    """
    unknown = [way for way in ways if way not in WAYS]
    if unknown or not ways:
        raise ValueError(f"ways to copy must be some of {WAYS}, not {ways!r}")
    hasher = _Hasher(dst)
    try:
        size, by_way = _copy(src, offset, dst, ways, hasher.advance)
        if then is not None:
            then()
        digest, hashed = hasher.result()
    finally:
        hasher.stop()
    if hashed != size or os.fstat(dst).st_size != size:
        raise StorageError(f"the store's temporary copy holds {os.fstat(dst).st_size} bytes "
                           f"where {size} were copied; it was changed by something else")
    return Copied(digest, size, by_way)


def _copy(src: int, offset: int, dst: int, ways: tuple[str, ...],
          advance: Callable[[int], None]) -> tuple[int, dict[str, int]]:
    """Bytes copied, and by which way; ``advance`` is told each new total."""
    done = 0
    by_way: dict[str, int] = {}
    buf: memoryview | None = None
    for i, way in enumerate(ways):
        try:
            while True:
                if way == "copy_file_range":
                    n = os.copy_file_range(src, dst, STEP, offset + done)
                elif way == "sendfile":
                    n = os.sendfile(dst, src, offset + done, STEP)
                else:
                    if buf is None:
                        buf = memoryview(bytearray(HASH_BUFFER))
                    n = _read_write(src, offset + done, dst, buf)
                if n == 0:
                    break  # this way's end of the file; the next way, if any, confirms it
                done += n
                by_way[way] = by_way.get(way, 0) + n
                advance(done)
        except OSError as exc:
            if i == len(ways) - 1 or exc.errno not in _UNSUPPORTED:
                raise
    return done, by_way


def _read_write(src: int, at: int, dst: int, buf: memoryview) -> int:
    n = os.preadv(src, [buf], at)
    view = buf[:n]
    while view:
        view = view[os.write(dst, view):]
    return n


class _Hasher:
    """A thread hashing a file from its start up to each offset it is given.

    The copying thread calls :meth:`advance` with the bytes copied so far;
    this thread reads them back through one reusable buffer and hashes them.
    Both threads spend their time in the kernel or in hashlib, outside the GIL.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._sha = hashlib.sha256()
        self._hashed = 0
        self._todo: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="blob-hasher", daemon=True)
        self._thread.start()

    def advance(self, upto: int) -> None:
        """Hash up to ``upto``; raises what stopped the hashing, so the copy stops too."""
        if self._error is not None:
            raise self._error
        self._todo.put(upto)

    def result(self) -> tuple[str, int]:
        """The digest and how many bytes it covers, once all given has been hashed."""
        self.stop()
        if self._error is not None:
            raise self._error
        return self._sha.hexdigest(), self._hashed

    def stop(self) -> None:
        """End the thread (after what it was given); harmless when it has ended."""
        self._todo.put(None)
        self._thread.join()

    def _run(self) -> None:
        buf = memoryview(bytearray(HASH_BUFFER))
        try:
            while (upto := self._todo.get()) is not None:
                while self._hashed < upto:
                    n = os.preadv(self._fd, [buf[:min(len(buf), upto - self._hashed)]],
                                  self._hashed)
                    if n == 0:
                        raise StorageError("the store's temporary copy ended before the "
                                           "bytes copied into it; it was changed by "
                                           "something else")
                    self._sha.update(buf[:n])
                    self._hashed += n
        except BaseException as exc:  # noqa: BLE001 - handed to the copying thread
            self._error = exc
