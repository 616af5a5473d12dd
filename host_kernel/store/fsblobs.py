"""Blob stores beyond the local folder: any fsspec file system, and a local store mirrored to one.

:class:`FsspecBlobStore` keeps blobs on whatever fsspec reaches (a shared file
system path, ``s3://bucket/prefix``, ``gs://…``, ``memory://…``) in the layout
of :class:`~host_kernel.store.blobs.FileBlobStore`::

    <root>/blobs/sha256/ab/abcdef…   one object per distinct content
    <root>/tmp/put-<pid>-blob-<random>   partial uploads; never visible under blobs/

A put streams to a temp key while hashing, then moves it under its name, or
deletes it when that name is taken already: the same bytes are stored once, and
a reader never sees a partial blob under ``blobs/``. On a local file system the
move is ``os.replace`` after an fsync; elsewhere it is ``fs.mv`` (a rename
where the file system has one, a server-side copy and delete on S3 and GCS,
whose objects appear whole or not at all). Reads verify: :meth:`read` returns
bytes only when they hash to the name, and the file :meth:`open` returns raises
``blob_altered`` when its end is reached and what it gave does not hash to the
name. Failures of the store itself (network, permission, a missing bucket)
are StorageError with code ``storage_error``, naming the URL without any user
name, password or query (:func:`display_url`).

Given a ``patience`` (the Host passes its ``store_patience``), a remote store waits
for itself: an operation that fails because the store is unavailable (5xx, throttling,
a connection refused or reset: :func:`~host_kernel.store.retry.blob_unavailable`) is
made again with backoff, printing one line per wait, and past the bound fails with
code ``store_unavailable``. A put is made again whole, from its source (a file is
opened again, a stream sought back); it is content-addressed, so a put made twice
stores the blob once, and temp keys a failed attempt could not remove are removed
after the next put that succeeds.

:class:`MirroredBlobStore` is the Host's store when it is given a remote: the
local record folder stays the store of record (the Host captures outputs into
its ``tmp/`` and reads blobs as files), and every blob committed there is
written through to the remote; a blob missing locally is read from the remote,
verified.

:func:`open_blob_store` picks a store for a path or URL. fsspec is imported only
when a remote store is made, so ``import host_kernel`` does not need it. See
docs/blobs.md for what is atomic on which store.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from .._errors import HostKernelError, StorageError
from .blobs import CHUNK, BlobRef, BlobStore, FileBlobStore, _fsync_dir, open_regular
from .retry import Patience, blob_unavailable, say_on_stderr

T = TypeVar("T")

__all__ = ["FsspecBlobStore", "MirroredBlobStore", "display_url", "open_blob_store"]

#: Part size of remote uploads: what a put holds in memory (S3's smallest part is 5 MiB).
UPLOAD_BLOCK = 8 * 1024 * 1024
_USERINFO = re.compile(r"(?<=://)[^/?#@\s]*@")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(::[A-Za-z][A-Za-z0-9+.\-]*)*://")
#: Storage options whose string values are never printed (keys, secrets, tokens, passwords).
_SECRET_OPTION = re.compile(r"secret|password|passwd|token|key|credential|sas|signature", re.I)


def display_url(url: str) -> str:
    """``url`` as it may be printed: no user name or password, no query (where tokens go)."""
    shown = _USERINFO.sub("", url)
    return shown.split("?", 1)[0] if "://" in shown else shown


def _secrets_of(url: str, options: Mapping[str, Any]) -> list[str]:
    """Every string that must not appear in a message: the URL's user info, secret options."""
    found = [m.group(0)[:-1] for m in _USERINFO.finditer(url)]
    if "?" in url and "://" in url:
        found.append(url.split("?", 1)[1])

    def walk(mapping: Mapping[str, Any]) -> None:
        for name, value in mapping.items():
            if isinstance(value, Mapping):
                walk(value)
            elif isinstance(value, str) and _SECRET_OPTION.search(str(name)):
                found.append(value)

    walk(options)
    for userinfo in list(found):
        found.extend(userinfo.split(":"))
    return sorted({s for s in found if len(s) >= 4}, key=len, reverse=True)


def _check_name(sha256: str) -> None:
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError(f"not a sha256 digest: {sha256!r}")


class FsspecBlobStore:
    """Blobs under ``<root>/blobs/sha256`` of an fsspec file system, put through ``<root>/tmp``.

    ``url`` names the root: ``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``file:///srv/blobs``, ``memory://name`` or a plain path. ``storage_options``
    go to the file system (for S3: ``endpoint_url``, ``key``, ``secret``,
    ``client_kwargs``…); fsspec adds those of its configuration and of
    ``FSSPEC_<PROTOCOL>_<OPTION>`` variables (``FSSPEC_S3_ENDPOINT_URL``), read
    when fsspec is first imported, and botocore those of ``AWS_*`` variables.

    Listings are never trusted for a single blob: each look at one invalidates
    the file system's listing cache for it first, so ``exists`` after a put
    (this process's or another's) is not stale.

    ``patience``: seconds each operation on a remote store waits for it while it is
    unavailable (see the module); None (the default) reports every failure at once as
    ``storage_error``. A local file system is never waited for.
    """

    def __init__(self, url: str, *, storage_options: Mapping[str, Any] | None = None,
                 patience: float | None = None,
                 say: Callable[[str], None] = say_on_stderr) -> None:
        import fsspec  # type: ignore[import-untyped]  # only remote stores need it
        from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

        options = dict(storage_options or {})
        self.url = display_url(url)
        self._secrets = _secrets_of(url, options)
        try:
            fs, root = fsspec.core.url_to_fs(url, **options)
        except (ImportError, ValueError) as exc:
            raise ValueError(f"cannot use {self.url} as a blob store: "
                             f"{self._scrub(str(exc))}") from None
        except Exception as exc:  # any backend's failure to connect
            raise self._failure(exc, f"connect to the blob store at {self.url}") from exc
        self.fs: Any = fs
        self.root: str = str(root).rstrip("/")
        if not self.root:
            raise ValueError(f"{self.url} names no folder or bucket to keep blobs in")
        if any(c in self.root for c in "*?["):
            # fs.mv would expand them as a glob pattern
            raise ValueError(f"{self.url}: a blob store's path cannot contain *, ? or [")
        #: A local file system gets os-level writes: fsync, then an atomic rename.
        self.local = isinstance(fs, LocalFileSystem)
        self._patience = None if patience is None or self.local else \
            Patience(patience, "the blob store", say=say)
        #: Temp keys of failed puts that could not be removed then (the store was away).
        self._stale: set[str] = set()
        if self.local:
            with self._errors(f"create the blob store at {self.url}"):
                os.makedirs(self._join("blobs", "sha256"), exist_ok=True)
                os.makedirs(self._join("tmp"), exist_ok=True)

    def __repr__(self) -> str:
        return f"FsspecBlobStore({self.url!r})"

    def _join(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def key(self, sha256: str) -> str:
        """Where the blob lives on the file system; ValueError for a name that is no sha256."""
        _check_name(sha256)
        return self._join("blobs", "sha256", sha256[:2], sha256)

    # -- errors

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _USERINFO.sub("", text)

    def _failure(self, exc: BaseException, doing: str) -> StorageError:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return StorageError(f"cannot {doing}: {self._scrub(f'{type(exc).__name__}: {reason}')}")

    def _reason(self, exc: BaseException) -> str:
        """What went wrong, in one line, without secrets: the store's own error under a
        StorageError, else ``exc``."""
        root = exc.__cause__ if isinstance(exc, StorageError) and exc.__cause__ else exc
        text = getattr(root, "strerror", None) or str(root) or type(root).__name__
        return self._scrub(f"{type(root).__name__}: {text}".strip().splitlines()[0])[:300]

    def _waiting(self, doing: str, operation: Callable[[], T]) -> T:
        """``operation()``, made again while the store is unavailable and the patience
        allows (only with a ``patience``, on a remote store); past it StorageError
        ``store_unavailable``. Refusals (a missing bucket, no permission, a blob missing
        or altered) pass at once."""
        if self._patience is None:
            return operation()

        def unavailable(exc: Exception) -> str | None:
            if isinstance(exc, HostKernelError) and exc.code != "storage_error":
                return None  # blob_missing, blob_altered, store_unavailable already…
            return self._reason(exc) if blob_unavailable(exc) else None

        def failed(message: str) -> Exception:
            return StorageError(f"cannot {doing}: {message}", code="store_unavailable")

        return self._patience.run(operation, unavailable, failed)

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """Any error of the file system (network, permission, no bucket) while ``doing``
        (a phrase that names the store) becomes StorageError ``storage_error``."""
        try:
            yield
        except HostKernelError:
            raise
        except Exception as exc:  # botocore, aiohttp, OSError…: whatever the backend raises
            raise self._failure(exc, doing) from exc

    # -- writing

    def put_file(self, path: str | Path) -> BlobRef:
        """Copy the file at ``path`` in. It is opened by :func:`open_regular`: a symlink is
        refused with ``symlink_refused``, a FIFO, device or folder with ``not_regular_file``."""
        return self._waiting(f"store a blob in the blob store at {self.url}",
                             lambda: self._put_file_once(path))

    def _put_file_once(self, path: str | Path) -> BlobRef:
        try:
            src = open_regular(path)
        except HostKernelError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror}") from exc
        with src:
            return self._put_stream_once(src)

    def put_bytes(self, data: bytes) -> BlobRef:
        digest = hashlib.sha256(data).hexdigest()
        with self._errors(f"look up {self._label(digest)}"):
            if self._stored(digest, len(data)):
                return BlobRef(digest, len(data))
        return self._waiting(f"store a blob in the blob store at {self.url}",
                             lambda: self._put_stream_once(io.BytesIO(data)))

    def put_stream(self, src: BinaryIO) -> BlobRef:
        """Copy ``src`` to a temp key, hashing it on the way, and move it under its name.

        Memory stays at one chunk plus one upload part. Nothing is left under
        ``tmp/`` when the put returns or raises (a process killed mid-put may
        leave one temp key, never a partial blob; one the store was too far away
        to remove goes after the next put that succeeds). An error reading ``src``
        passes as it is (an OSError as StorageError, as FileBlobStore does). While
        the store is unavailable the put is made again from where ``src`` stood,
        when ``src`` can seek; else once.
        """
        try:
            start = src.tell() if self._patience is not None and src.seekable() else None
        except (OSError, ValueError):
            start = None
        if start is None:
            return self._put_stream_once(src)

        def again() -> BlobRef:
            src.seek(start)
            return self._put_stream_once(src)

        return self._waiting(f"store a blob in the blob store at {self.url}", again)

    def _put_stream_once(self, src: BinaryIO) -> BlobRef:
        hasher = hashlib.sha256()
        size = 0
        doing = f"store a blob in the blob store at {self.url}"
        with self._errors(doing):
            tmp, out = self._create_temp()
        try:
            try:
                while chunk := self._read_source(src):
                    hasher.update(chunk)
                    with self._errors(doing):
                        out.write(chunk)
                    size += len(chunk)
            except BaseException:
                self._close_quietly(out)
                raise
            digest = hasher.hexdigest()
            with self._errors(doing):
                if self.local:
                    out.flush()
                    os.fsync(out.fileno())
                out.close()  # a remote upload completes here
                self._place(tmp, digest, size)
        except BaseException:
            self._discard(tmp)
            raise
        for stale in sorted(self._stale):
            self._stale.discard(stale)
            self._discard(stale)
        return BlobRef(digest, size)

    @staticmethod
    def _read_source(src: BinaryIO) -> bytes:
        try:
            return src.read(CHUNK)
        except OSError as exc:
            raise StorageError(f"cannot read what was to be stored: "
                               f"{exc.strerror or exc}") from exc

    def _create_temp(self) -> tuple[str, BinaryIO]:
        if self.local:
            fd, tmp = tempfile.mkstemp(dir=self._join("tmp"),
                                       prefix=FileBlobStore.temp_prefix("blob"))
            return tmp, os.fdopen(fd, "wb")
        tmp = self._join("tmp", FileBlobStore.temp_prefix("blob") + secrets.token_hex(8))
        return tmp, self.fs.open(tmp, "wb", block_size=UPLOAD_BLOCK)

    def _place(self, tmp: str, digest: str, size: int) -> None:
        final = self.key(digest)
        if self._stored(digest, size):
            self._discard(tmp)
            return
        if not self.local:
            self.fs.mv(tmp, final)
            return
        # Anything else at the name (altered bytes, a FIFO, a symlink) is replaced by the
        # bytes just written, which do hash to it.
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.chmod(tmp, 0o444)
        os.replace(tmp, final)
        _fsync_dir(Path(final).parent)

    def _stored(self, digest: str, size: int) -> bool:
        """Whether a put of these bytes can be skipped: the blob under the name hashes to
        it. Remotely an object of another size is replaced at once; one of the same size is
        downloaded and hashed (bytes planted under the name of the real ones are replaced,
        not kept: a store's size or ETag is no sha256)."""
        if self.local:
            return self.hash_of(digest) == digest
        return self._remote_size(digest) == size and self.hash_of(digest) == digest

    def _discard(self, tmp: str) -> None:
        try:
            if self.local:
                os.unlink(tmp)
            else:
                self.fs.rm_file(tmp)
        except FileNotFoundError:
            pass
        except Exception:  # noqa: BLE001 - best effort: the put's own error is the one to report
            if not self.local:
                self._stale.add(tmp)  # removed after the next put that succeeds

    @staticmethod
    def _close_quietly(out: BinaryIO) -> None:
        try:
            out.close()
        except Exception:  # the temp is discarded; the first error is reported
            pass

    # -- reading

    def _label(self, sha256: str) -> str:
        return f"blob {sha256[:12]}… in {self.url}"

    def _open_raw(self, sha256: str) -> BinaryIO:
        """The stored bytes, unverified. StorageError ``blob_missing``, ``not_regular_file``,
        ``symlink_refused`` (local only) or ``storage_error``; ValueError for a bad name."""
        key = self.key(sha256)
        label = self._label(sha256)
        if self.local:
            try:
                return open_regular(key, label=label)
            except HostKernelError as exc:
                raise StorageError(f"{exc.message}; the store was altered",
                                   code=exc.code) from None
            except FileNotFoundError:
                raise StorageError(f"{label} is missing", code="blob_missing") from None
            except OSError as exc:
                raise StorageError(f"cannot read {label}: {exc.strerror or exc}") from None

        def opened() -> BinaryIO:
            with self._errors(f"read {label}"):
                try:
                    self.fs.invalidate_cache(key)
                    return self.fs.open(key, "rb", block_size=CHUNK)  # type: ignore[no-any-return]
                except (FileNotFoundError, IsADirectoryError):
                    raise StorageError(f"{label} is missing", code="blob_missing") from None

        return self._waiting(f"read {label}", opened)

    def open(self, sha256: str) -> io.BufferedReader:
        """The blob as a file, read as it streams and verified at its end.

        The read that reaches the end raises StorageError ``blob_altered`` when
        the bytes given do not hash to ``sha256``: a caller that reads to the
        end (``read()``, a copy loop) sees every alteration; one that stops
        earlier has been given unverified bytes. Opening raises the codes of
        :meth:`read` other than ``blob_altered``.
        """
        raw = self._open_raw(sha256)
        return io.BufferedReader(_VerifyingReader(raw, sha256, self._label(sha256),
                                                  self._failure), CHUNK)

    def read(self, sha256: str) -> bytes:
        """The blob's bytes, returned only if they hash to ``sha256``.

        Raises StorageError ``blob_missing``, ``blob_altered``, ``storage_error``
        (the store cannot be reached or read), or locally ``not_regular_file`` /
        ``symlink_refused``; ValueError for a name that is not a sha256 digest.
        """
        label = self._label(sha256)

        def whole() -> bytes:
            with self._open_raw(sha256) as f, self._errors(f"read {label}"):
                return f.read()

        data = whole() if self.local else self._waiting(f"read {label}", whole)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise StorageError(f"{label} no longer hashes to its name; the store was altered",
                               code="blob_altered")
        return data

    def exists(self, sha256: str) -> bool:
        """Whether a file is stored under the name (locally: a regular file, not a symlink).

        ValueError for a name that is not a sha256 digest; StorageError when
        the store cannot be asked.
        """
        key = self.key(sha256)
        if self.local:
            try:
                return stat.S_ISREG(os.lstat(key).st_mode)
            except OSError:
                return False
        return self._remote_size(sha256) is not None

    def _remote_size(self, sha256: str) -> int | None:
        key = self.key(sha256)
        doing = f"look up {self._label(sha256)}"

        def size() -> int | None:
            with self._errors(doing):
                self.fs.invalidate_cache(key)
                try:
                    info = self.fs.info(key)
                except FileNotFoundError:
                    return None
            return int(info["size"]) if info.get("type") == "file" else None

        return self._waiting(doing, size)

    def hash_of(self, sha256: str) -> str | None:
        """Re-hash the stored bytes, streaming; None when there are none to hash.

        None when the name is not a sha256 digest, the blob is missing, or
        (locally) what is there is not a regular file. Unlike FileBlobStore, a
        store that cannot be reached raises StorageError rather than answer None:
        "cannot tell" is not "not there".
        """
        try:
            self.key(sha256)
        except ValueError:
            return None

        def hashed() -> str | None:
            try:
                f = self._open_raw(sha256)
            except StorageError as exc:
                if exc.code in ("blob_missing", "not_regular_file", "symlink_refused"):
                    return None
                raise
            hasher = hashlib.sha256()
            with f, self._errors(f"read {self._label(sha256)}"):
                while chunk := f.read(CHUNK):
                    hasher.update(chunk)
            return hasher.hexdigest()

        return hashed() if self.local else self._waiting(f"read {self._label(sha256)}", hashed)

    def __iter__(self) -> Iterator[str]:
        """Every name under ``blobs/sha256/xx/``, sorted (audit flags what is not a blob)."""
        base = self._join("blobs", "sha256")
        doing = f"list the blob store at {self.url}"

        def listed() -> list[str]:
            with self._errors(doing):
                self.fs.invalidate_cache(base)
                return list(self.fs.find(base))

        paths = self._waiting(doing, listed)
        names = []
        for path in paths:
            parts = str(path)[len(base):].strip("/").split("/")
            if len(parts) == 2:
                names.append((parts[0], parts[1]))
        for _, name in sorted(names):
            yield name


class _VerifyingReader(io.RawIOBase):
    """A blob's bytes as they are read, hashed; the read that finds the end checks the hash."""

    def __init__(self, raw: BinaryIO, sha256: str, label: str,
                 failure: Callable[[BaseException, str], StorageError]) -> None:
        super().__init__()
        self._raw = raw
        self._sha256 = sha256
        self._label = label
        self._failure = failure
        self._hasher = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def _read(self, n: int) -> bytes:
        try:
            data = self._raw.read(n)
        except HostKernelError:
            raise
        except Exception as exc:
            raise self._failure(exc, f"read {self._label}") from exc
        if data:
            self._hasher.update(data)
        elif self._hasher.hexdigest() != self._sha256:
            raise StorageError(f"{self._label} no longer hashes to its name; the store was "
                               f"altered", code="blob_altered")
        return data

    def readinto(self, buffer: Any) -> int:
        data = self._read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        chunks = []
        while chunk := self._read(CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class MirroredBlobStore(FileBlobStore):
    """The local record's blob store, written through to a remote one.

    Every put ends in :meth:`_commit` (so do the Host's captured outputs); it
    commits locally as FileBlobStore does, then uploads the blob when the
    remote lacks it. An upload that fails makes the put fail with StorageError
    (the blob stays in the local store; the remote shows nothing of it, and
    the next put of the same bytes uploads it again). A put skips its copy only
    when the blob is intact locally and present on the remote.

    Reads are local first: ``open``, ``read``, ``exists`` and ``hash_of`` ask
    the remote only when no file is at the blob's local name (an altered or
    replaced local blob is reported as it is, not papered over), and what comes
    from the remote is verified. A blob read from the remote is not copied back.
    Iteration lists the local blobs.
    """

    def __init__(self, root: str | Path, remote: str | FsspecBlobStore, *,
                 storage_options: Mapping[str, Any] | None = None,
                 durable: bool = True, patience: float | None = None) -> None:
        """``remote``: a URL (``storage_options`` and ``patience`` go with it) or a store
        made already."""
        if isinstance(remote, FsspecBlobStore) and (storage_options or patience is not None):
            raise ValueError("storage options and patience go with a remote given as a URL")
        self.remote = (remote if isinstance(remote, FsspecBlobStore)
                       else FsspecBlobStore(remote, storage_options=storage_options,
                                            patience=patience))
        super().__init__(root, durable=durable)
        #: The remote's URL as it may be printed (no user, password or query).
        self.remote_url = self.remote.url

    def _commit(self, tmp: str, digest: str, size: int) -> BlobRef:
        ref = super()._commit(tmp, digest, size)
        self._mirror(digest)
        return ref

    def _mirror(self, digest: str) -> None:
        try:
            with self.remote._errors(f"look up {self.remote._label(digest)}"):
                if self.remote._stored(digest, os.path.getsize(self.path(digest))):
                    return
            sent = self.remote.put_file(self.path(digest))
        except StorageError as exc:
            raise StorageError(f"blob {digest[:12]}… is in the record but could not be copied "
                               f"to {self.remote_url}: {exc.message}", code=exc.code) from exc
        if sent.sha256 != digest:
            raise StorageError(f"blob {digest[:12]}… changed in the record before it reached "
                               f"{self.remote_url}; the store was altered", code="blob_altered")

    def _intact(self, digest: str) -> bool:
        # Both copies, or the put goes on (and _commit uploads what the remote lacks).
        return (self._held_locally(digest) and FileBlobStore.hash_of(self, digest) == digest
                and self.remote.exists(digest))

    def stored(self, sha256: str) -> bool:
        return self._held_locally(sha256) and super().exists(sha256) and \
            self.remote._stored(sha256, os.path.getsize(self.path(sha256)))

    def _held_locally(self, sha256: str) -> bool:
        return os.path.lexists(self.path(sha256))

    def open(self, sha256: str) -> io.BufferedReader:
        """The local blob's file (not verified), or the remote's (verified at its end)."""
        try:
            return super().open(sha256)
        except StorageError as exc:
            if exc.code != "blob_missing":
                raise
        return self.remote.open(sha256)

    def exists(self, sha256: str) -> bool:
        if self._held_locally(sha256):
            return super().exists(sha256)
        return self.remote.exists(sha256)

    def hash_of(self, sha256: str) -> str | None:
        try:
            local = self._held_locally(sha256)
        except ValueError:
            return None
        return super().hash_of(sha256) if local else self.remote.hash_of(sha256)


def open_blob_store(url_or_path: str | Path, *,
                    storage_options: Mapping[str, Any] | None = None) -> BlobStore:
    """The blob store at ``url_or_path``.

    A URL with a scheme (``s3://``, ``gs://``, ``file://``, ``memory://``, a
    chained ``simplecache::s3://``) gives a :class:`FsspecBlobStore` with
    ``storage_options``; a plain path gives a :class:`FileBlobStore` over that
    folder (``storage_options`` must then be empty).
    """
    if isinstance(url_or_path, str) and _SCHEME.match(url_or_path):
        return FsspecBlobStore(url_or_path, storage_options=storage_options)
    if storage_options:
        raise ValueError(f"storage options apply to a URL, not to the path {url_or_path}")
    return FileBlobStore(url_or_path)
