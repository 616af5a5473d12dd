"""The viewer's verified reads: every request served from a record proved unchanged.

Owns :class:`VerifiedReads`, through which each page and download of the viewer
reads its record. A record folder's projection is rebuilt by
:func:`~host_kernel.store.verified.open_verified` (chain, MACs, replay, drift)
and kept in memory together with the sha256 of every file that verification
read: the ledger file, its write-ahead log and shared-memory index when they
are there, and the record key. Each later request hashes those files again
and uses the kept projection only when every digest is the same, so what it
shows is what a fresh ``open_verified`` of the same bytes would show; any
change of any byte (an edit, even one that restores the size and time, or a
live Host appending) makes the next request verify the record again from the
start. A refused record keeps nothing, and neither does a record one of whose
files cannot be hashed (a symlink, say). A PostgreSQL ledger has no files to
hash and is verified afresh on every request.

It never writes the record, and it decides nothing about what a page shows.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .._paths import LEDGER_NAME
from ..store.keys import KEY_NAME
from ..store.ledger import SQLiteLedger
from ..store.verified import LedgerRecord, open_verified

__all__ = ["VerifiedReads", "fingerprint"]

#: Bytes hashed at a time.
_CHUNK = 1 << 20


def _digest(path: Path) -> str:
    """The sha256 of the file at ``path`` (not following a symlink), or why there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"unreadable {exc.errno}"
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:  # a FIFO or a folder in its place: no bytes to name
        return f"unreadable {exc.errno}"
    return digest.hexdigest()


def fingerprint(record_dir: Path) -> tuple[str, ...]:
    """The digests of every file :func:`open_verified` reads in ``record_dir``."""
    ledger = record_dir / LEDGER_NAME
    return tuple(_digest(p) for p in (ledger, Path(f"{ledger}-wal"), Path(f"{ledger}-shm"),
                                      record_dir / KEY_NAME))


class VerifiedReads:
    """The verified projection of one record, for one request at a time.

    :meth:`open` yields a ledger to read (never to write) while holding the lock, so
    the projection kept for a record folder is never closed under a reader."""

    def __init__(self, record: Path | LedgerRecord) -> None:
        self.record = record
        self._lock = threading.Lock()
        self._kept: tuple[tuple[str, ...], SQLiteLedger] | None = None
        #: How many requests verified the record from the start (for the tests).
        self.verifications = 0

    @contextmanager
    def open(self) -> Iterator[SQLiteLedger]:
        """The record's verified projection; raises RecordRefused as open_verified does."""
        with self._lock:
            if isinstance(self.record, LedgerRecord):
                self.verifications += 1
                ledger = open_verified(self.record)
                try:
                    yield ledger
                finally:
                    ledger.close()
                return
            yield self._current(self.record)

    def _current(self, root: Path) -> SQLiteLedger:
        before = fingerprint(root)
        if self._kept is not None and self._kept[0] == before:
            return self._kept[1]
        self._forget()
        self.verifications += 1
        ledger = open_verified(root)  # RecordRefused: nothing kept
        # Kept only if no byte moved while it was verified, and every file could be hashed
        # (one that cannot, a symlink say, names no bytes): otherwise what was verified may
        # not be what the digests name, and the next request verifies again.
        kept = fingerprint(root) == before and not any(d.startswith("unreadable")
                                                       for d in before)
        self._kept = (before if kept else ("unkept",), ledger)
        return ledger

    def _forget(self) -> None:
        if self._kept is not None:
            self._kept[1].close()
            self._kept = None

    def close(self) -> None:
        with self._lock:
            self._forget()

