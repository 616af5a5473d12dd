"""The record key: where each backend keeps it, how a first writer makes it, how it is
read. It does not compute or check MACs (:mod:`host_kernel.store.chain` does).

A SQLite record's key is ``record.key``, 32 random bytes next to the ledger (mode
0600, made by the first writer that opens the record; every legitimate writer reads
the same key). Any process that can read it is trusted as a writer.

A PostgreSQL ledger's key does not live in the database (whoever can write the
database must not be able to forge MACs). :func:`key_path` finds it: the
``HOST_KERNEL_LEDGER_KEY`` file, else ``$XDG_CONFIG_HOME/host_kernel/ledger-keys/<ledger
id>.key``, made (0600, written whole, then linked into place) by the first writer.
"""

from __future__ import annotations

import hmac
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from .._errors import RecordError
from .base import RecordRefused

__all__ = ["KEY_BYTES", "KEY_ENV", "KEY_NAME", "key_path", "keys_folder", "load_record_key",
           "read_key", "read_key_file"]


#: The record key's file name, next to ``ledger.sqlite``.
KEY_NAME = "record.key"
KEY_BYTES = 32


#: The environment variable naming the record key file of a PostgreSQL ledger.
KEY_ENV = "HOST_KERNEL_LEDGER_KEY"

_KEY_CHECK = b"host_kernel ledger key check v1"


# --------------------------------------------------------------------------- SQLite keys


def load_record_key(record_dir: str | Path) -> bytes:
    """The record key of the record folder, read only; never creates it.

    Raises RecordRefused: ``record_key_missing`` when there is none (or it cannot
    be read), ``record_key_invalid`` when it is not 32 bytes.
    """
    return read_key_file(Path(record_dir) / KEY_NAME, f"no {KEY_NAME} in {record_dir}")


def read_key_file(path: Path, missing: str) -> bytes:
    """The 32 bytes of the key file ``path``, opened without following a symlink.

    Raises RecordRefused: ``record_key_missing`` (``missing`` when there is no file, or
    it cannot be read), ``record_key_invalid`` (not 32 bytes).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RecordRefused(missing, code="record_key_missing") from None
    except OSError as exc:
        raise RecordRefused(f"cannot read {path}: {exc.strerror or exc}",
                            code="record_key_missing") from None
    try:
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise RecordRefused(f"{path} holds {len(key)} bytes, not {KEY_BYTES}",
                            code="record_key_invalid")
    return key


def _writer_key(record_dir: Path, conn: sqlite3.Connection) -> bytes:
    """The record key for a writer: read it, or make it (O_EXCL, 0600) if there is none."""
    path = record_dir / KEY_NAME
    if not path.exists() and conn.execute(
            "SELECT 1 FROM events WHERE mac IS NOT NULL LIMIT 1").fetchone() is not None:
        # Authenticated events without their key: a fresh key would not vouch for them.
        raise RecordRefused(
            f"the ledger holds events authenticated with a record key, but {path} is gone; "
            "the record will not be extended (audit it, or start a new record)",
            code="record_key_missing")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except FileExistsError:
        return _read_key_of_writer(record_dir)
    except OSError as exc:
        raise RecordError(f"cannot create the record key {path}: {exc.strerror or exc}") from exc
    try:
        os.write(fd, os.urandom(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        dir_fd = os.open(record_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # the key itself is synced; a directory that cannot be synced is no reason to stop
    return _read_key_of_writer(record_dir)


def _read_key_of_writer(record_dir: Path) -> bytes:
    # Another writer may be between its O_EXCL create and its write: wait a moment for it.
    deadline = time.monotonic() + 2.0
    while True:
        try:
            return load_record_key(record_dir)
        except RecordRefused as exc:
            if exc.code != "record_key_invalid" or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


# --------------------------------------------------------------------------- PostgreSQL keys


def keys_folder() -> Path:
    """Where PostgreSQL ledgers' record keys are kept by default, one file per ledger
    (``<ledger id>.key``); hidden from every kernel."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "host_kernel" / "ledger-keys"


def key_path(ledger_id: str) -> Path:
    """The key file of the ledger whose id (in its ``ledger_meta``) is ``ledger_id``:
    ``$HOST_KERNEL_LEDGER_KEY`` when set, else ``<keys_folder>/<ledger_id>.key``."""
    named = os.environ.get(KEY_ENV)
    if named:
        return Path(named)
    if not ledger_id.isalnum():  # the id is read from the database: never a path
        raise RecordRefused(f"the ledger's id {ledger_id[:40]!r} is not one host_kernel made",
                            code="record_key_invalid")
    return keys_folder() / f"{ledger_id}.key"


def _make_key(path: Path) -> None:
    """Write 32 random bytes to ``path`` (mode 0600) if no file is there: written whole
    to a temporary file, then linked into place, so no reader ever sees a short key."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".key-", dir=path.parent)
    try:
        os.write(fd, os.urandom(KEY_BYTES))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another writer made it first: theirs is the key
    except OSError as exc:
        raise RecordError(f"cannot create the ledger key {path}: {exc.strerror or exc}") from None
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(tmp)


def read_key(path: Path) -> bytes:
    """The record key in ``path``. Raises RecordRefused: ``record_key_missing`` (no file,
    or unreadable), ``record_key_invalid`` (not 32 bytes)."""
    return read_key_file(path, f"no record key: {path} does not exist (set {KEY_ENV} to "
                               f"the key file the ledger's writers use)")


def _key_check(key: bytes) -> str:
    return hmac.digest(key, _KEY_CHECK, "sha256").hex()
