"""The blob store contract: every backend stores, refuses and verifies alike.

One suite, run against FileBlobStore on a folder, FsspecBlobStore on ``file://``,
``memory://`` and ``s3://`` (moto's server mode, a real HTTP server on loopback,
standing in for an object store), and MirroredBlobStore over a ``file://`` and
an ``s3://`` remote.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _s3 import BUCKET, HAVE_MOTO, NO_MOTO

from host_kernel._errors import FileProblem, PathRefused, StorageError
from host_kernel.store.blobs import EMPTY_SHA256, BlobRef, FileBlobStore
from host_kernel.store.fsblobs import (
    FsspecBlobStore,
    MirroredBlobStore,
    display_url,
    open_blob_store,
)

fsspec = pytest.importorskip("fsspec")

needs_moto = pytest.mark.skipif(not HAVE_MOTO, reason=NO_MOTO)

SECRET = "wJalrXUtnFEMI-K7MDENG-do-not-print"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- an S3 on loopback

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def s3_fs(endpoint: str) -> Any:
    """The bucket as seen from outside the store under test: its own client, no caches."""
    import s3fs

    return s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True,
                             use_listings_cache=False)


# --------------------------------------------------------------------------- the backends

@dataclass
class Copy:
    """One copy of the blobs (a folder or a prefix), reached behind the store's back."""

    fs: Any
    root: str
    local: bool

    def key(self, sha256: str) -> str:
        return f"{self.root}/blobs/sha256/{sha256[:2]}/{sha256}"

    def keys(self, under: str) -> list[str]:
        return sorted(self.fs.find(f"{self.root}/{under}"))

    def write(self, sha256: str, data: bytes) -> None:
        """Put ``data`` under the blob's name as the store would not: altering or planting."""
        key = self.key(sha256)
        if self.local:
            os.makedirs(os.path.dirname(key), exist_ok=True)
            if os.path.exists(key):
                os.chmod(key, 0o644)
            Path(key).write_bytes(data)
        else:
            self.fs.pipe_file(key, data)

    def delete(self, sha256: str) -> None:
        self.fs.rm_file(self.key(sha256))


@dataclass
class Backend:
    name: str
    store: Any
    primary: Copy  # where reads look first
    remote: Copy | None = None  # a mirrored store's remote
    cleanup: list[Callable[[], None]] = field(default_factory=list)


def _local(path: Path) -> Copy:
    return Copy(fsspec.filesystem("file"), str(path), local=True)


def _s3(endpoint: str) -> tuple[str, dict[str, Any], Copy]:
    prefix = f"{BUCKET}/{uuid.uuid4().hex}"
    return f"s3://{prefix}", {"endpoint_url": endpoint}, Copy(s3_fs(endpoint), prefix, False)


def _make(name: str, request: pytest.FixtureRequest, tmp: Path) -> Backend:
    if name == "file":
        return Backend(name, FileBlobStore(tmp / "store"), _local(tmp / "store"))
    if name == "fsspec-file":
        return Backend(name, FsspecBlobStore(f"file://{tmp / 'store'}"), _local(tmp / "store"))
    if name == "fsspec-memory":
        root = f"/blobs-{uuid.uuid4().hex}"
        memory = Copy(fsspec.filesystem("memory"), root, local=False)
        backend = Backend(name, FsspecBlobStore(f"memory://{root}"), memory)

        def forget() -> None:  # the memory file system is one per process
            if memory.fs.exists(root):
                memory.fs.rm(root, recursive=True)

        backend.cleanup.append(forget)
        return backend
    if name == "fsspec-s3":
        url, options, copy = _s3(request.getfixturevalue("s3_endpoint"))
        return Backend(name, FsspecBlobStore(url, storage_options=options), copy)
    if name == "mirrored-file":
        remote = FsspecBlobStore(f"file://{tmp / 'remote'}")
        return Backend(name, MirroredBlobStore(tmp / "record", remote), _local(tmp / "record"),
                       _local(tmp / "remote"))
    if name == "mirrored-s3":
        url, options, copy = _s3(request.getfixturevalue("s3_endpoint"))
        store = MirroredBlobStore(tmp / "record", url, storage_options=options)
        return Backend(name, store, _local(tmp / "record"), copy)
    raise AssertionError(name)


BACKENDS = [
    "file",
    "fsspec-file",
    "fsspec-memory",
    pytest.param("fsspec-s3", marks=needs_moto),
    "mirrored-file",
    pytest.param("mirrored-s3", marks=needs_moto),
]
FSSPEC_BACKENDS = [
    "fsspec-file",
    "fsspec-memory",
    pytest.param("fsspec-s3", marks=needs_moto),
]
MIRRORED_BACKENDS = ["mirrored-file", pytest.param("mirrored-s3", marks=needs_moto)]


def _backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    backend = _make(request.param, request, tmp_path)
    yield backend
    for undo in backend.cleanup:
        undo()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from _backend(request, tmp_path)


@pytest.fixture(params=FSSPEC_BACKENDS)
def fsspec_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from _backend(request, tmp_path)


@pytest.fixture(params=MIRRORED_BACKENDS)
def mirrored(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from _backend(request, tmp_path)


def _stream_digest(f: io.BufferedReader) -> tuple[str, int]:
    hasher, size = hashlib.sha256(), 0
    with f:
        while chunk := f.read(1024 * 1024):
            hasher.update(chunk)
            size += len(chunk)
    return hasher.hexdigest(), size


# --------------------------------------------------------------------------- the contract

def test_put_bytes_stream_and_file_round_trip_with_their_sha256(backend: Backend,
                                                                tmp_path: Path) -> None:
    store = backend.store
    source = tmp_path / "source.bin"
    source.write_bytes(b"from a file\n" * 1000)
    cases = [(store.put_bytes, b"from bytes"),
             (lambda d: store.put_stream(io.BytesIO(d)), b"from a stream" * 10_000),
             (lambda d: store.put_file(source), source.read_bytes())]
    for put, data in cases:
        ref = put(data)
        assert ref == BlobRef(sha(data), len(data))
        assert store.read(ref.sha256) == data
        with store.open(ref.sha256) as f:
            assert f.read() == data
        assert store.exists(ref.sha256)
        assert store.hash_of(ref.sha256) == ref.sha256


def test_the_same_bytes_are_stored_once(backend: Backend, tmp_path: Path) -> None:
    data = b"once" * 1000
    source = tmp_path / "same.bin"
    source.write_bytes(data)
    refs = {backend.store.put_bytes(data), backend.store.put_bytes(data),
            backend.store.put_stream(io.BytesIO(data)), backend.store.put_file(source)}
    assert refs == {BlobRef(sha(data), len(data))}
    assert [Path(k).name for k in backend.primary.keys("blobs")] == [sha(data)]
    assert list(backend.store) == [sha(data)]


def test_the_empty_blob_round_trips(backend: Backend) -> None:
    assert backend.store.put_bytes(b"") == BlobRef(EMPTY_SHA256, 0)
    assert backend.store.put_stream(io.BytesIO(b"")) == BlobRef(EMPTY_SHA256, 0)
    assert backend.store.read(EMPTY_SHA256) == b""
    assert backend.store.hash_of(EMPTY_SHA256) == EMPTY_SHA256
    assert backend.store.exists(EMPTY_SHA256)


def test_a_20_mib_blob_streams_in_and_out(backend: Backend, tmp_path: Path) -> None:
    block = os.urandom(1024 * 1024)
    source = tmp_path / "big.bin"
    with open(source, "wb") as f:
        for i in range(20):
            f.write(bytes([i]) + block[1:])
    expected = hashlib.sha256(source.read_bytes()).hexdigest()
    ref = backend.store.put_file(source)
    assert ref == BlobRef(expected, 20 * 1024 * 1024)
    assert _stream_digest(backend.store.open(expected)) == (expected, ref.size)
    assert backend.store.hash_of(expected) == expected


def test_a_missing_blob_is_reported_missing(backend: Backend) -> None:
    missing = sha(b"never stored")
    assert not backend.store.exists(missing)
    assert backend.store.hash_of(missing) is None
    for call in (backend.store.read, backend.store.open):
        with pytest.raises(StorageError) as caught:
            call(missing)
        assert caught.value.code == "blob_missing"


def test_a_blob_altered_on_the_store_is_refused_on_read(backend: Backend) -> None:
    data = b"the bytes as stored" * 100
    ref = backend.store.put_bytes(data)
    for altered in (b"X" + data[1:], data[:10], data + b"more"):
        backend.primary.write(ref.sha256, altered)
        with pytest.raises(StorageError) as caught:
            backend.store.read(ref.sha256)
        assert caught.value.code == "blob_altered"
        assert backend.store.hash_of(ref.sha256) == sha(altered)
        assert backend.store.exists(ref.sha256)


def test_a_put_of_the_same_bytes_repairs_an_altered_blob(backend: Backend) -> None:
    data = b"to be repaired"
    ref = backend.store.put_bytes(data)
    backend.primary.write(ref.sha256, b"tampered bytes of other length")
    assert backend.store.put_bytes(data) == ref
    assert backend.store.read(ref.sha256) == data


def test_malformed_names_are_refused(backend: Backend) -> None:
    good = backend.store.put_bytes(b"x").sha256
    for name in ("", "abc", good.upper(), "g" * 64, "../" + good[3:], good + "0",
                 good[:2] + "/" + good[3:]):
        for call in (backend.store.read, backend.store.open, backend.store.exists):
            with pytest.raises(ValueError, match="not a sha256 digest"):
                call(name)
        assert backend.store.hash_of(name) is None


def test_put_file_refuses_a_symlink_and_a_fifo(backend: Backend, tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_bytes(b"behind a link")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(PathRefused) as refused:
        backend.store.put_file(link)
    assert refused.value.code == "symlink_refused"
    with pytest.raises(FileProblem) as problem:
        backend.store.put_file(fifo)  # refused without blocking on the missing writer
    assert problem.value.code == "not_regular_file"
    assert list(backend.store) == []
    assert backend.primary.keys("tmp") == []


def test_concurrent_puts_of_the_same_content_end_in_one_intact_blob(backend: Backend) -> None:
    data = os.urandom(512 * 1024)
    start = threading.Barrier(8)
    results: list[BlobRef | BaseException] = []

    def put() -> None:
        start.wait()
        try:
            results.append(backend.store.put_stream(io.BytesIO(data)))
        except BaseException as exc:  # reported below, with the others
            results.append(exc)

    threads = [threading.Thread(target=put) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [BlobRef(sha(data), len(data))] * 8
    assert [Path(k).name for k in backend.primary.keys("blobs")] == [sha(data)]
    assert backend.store.read(sha(data)) == data
    assert backend.primary.keys("tmp") == []


def test_no_temp_keys_are_left_after_puts_that_succeed_or_fail(backend: Backend) -> None:
    class Failing(io.RawIOBase):
        def __init__(self) -> None:
            self.sent = 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            if self.sent:
                raise RuntimeError("the source broke")
            self.sent = len(buffer)
            buffer[:] = b"p" * len(buffer)
            return len(buffer)

    backend.store.put_bytes(b"one")
    backend.store.put_bytes(b"one")
    backend.store.put_stream(io.BytesIO(b"two"))
    with pytest.raises(RuntimeError, match="the source broke"):
        backend.store.put_stream(io.BufferedReader(Failing()))
    assert backend.primary.keys("tmp") == []
    assert sorted(backend.store) == sorted([sha(b"one"), sha(b"two")])


def test_a_blob_written_behind_the_stores_back_is_seen(backend: Backend) -> None:
    """No listing cache makes ``exists`` stale: the store was listed, then a writer that is
    not this store added a blob."""
    assert list(backend.store) == []
    data = b"written by another process"
    backend.primary.write(sha(data), data)
    assert backend.store.exists(sha(data))
    assert backend.store.read(sha(data)) == data
    assert list(backend.store) == [sha(data)]


def test_iteration_lists_every_blob_name_in_order(backend: Backend) -> None:
    names = sorted(backend.store.put_bytes(bytes([i]) * i).sha256 for i in range(5))
    assert list(backend.store) == names


# --------------------------------------------------------------------------- fsspec stores

def test_open_on_an_fsspec_store_verifies_at_the_end(fsspec_backend: Backend) -> None:
    data = b"read in pieces" * 50_000
    ref = fsspec_backend.store.put_bytes(data)
    assert _stream_digest(fsspec_backend.store.open(ref.sha256)) == (ref.sha256, len(data))
    fsspec_backend.primary.write(ref.sha256, data[:-1] + b"!")
    with fsspec_backend.store.open(ref.sha256) as f:
        f.read(1000)  # unverified until the end
        with pytest.raises(StorageError) as caught:
            f.read()
    assert caught.value.code == "blob_altered"


def test_a_listing_cached_by_the_shared_file_system_does_not_hide_a_new_blob(
        fsspec_backend: Backend) -> None:
    """fsspec shares one file system instance among users with the same options, and its
    listing cache (s3fs fills it on ``ls``) would say a blob added since is not there."""
    first = b"0"
    second = next(d for i in range(1, 10_000) if sha(d := str(i).encode())[:2] == sha(first)[:2])
    fsspec_backend.store.put_bytes(first)
    folder = os.path.dirname(fsspec_backend.primary.key(sha(first)))
    assert len(fsspec_backend.store.fs.ls(folder)) == 1  # now cached, where there is a cache
    fsspec_backend.primary.write(sha(second), second)  # another writer adds a blob
    assert fsspec_backend.store.exists(sha(second))
    assert fsspec_backend.store.read(sha(second)) == second
    assert len(list(fsspec_backend.store)) == 2
    assert fsspec_backend.store.put_bytes(second) == BlobRef(sha(second), len(second))


def test_local_fsspec_blobs_are_read_only_and_in_the_file_stores_layout(tmp_path: Path) -> None:
    ref = FsspecBlobStore(f"file://{tmp_path}").put_bytes(b"shared layout")
    blob = tmp_path / "blobs" / "sha256" / ref.sha256[:2] / ref.sha256
    assert stat.S_IMODE(blob.stat().st_mode) == 0o444
    assert FileBlobStore(tmp_path).read(ref.sha256) == b"shared layout"
    assert FsspecBlobStore(str(tmp_path)).read(ref.sha256) == b"shared layout"


def test_a_url_that_names_no_folder_or_has_glob_characters_is_refused() -> None:
    with pytest.raises(ValueError, match="no folder or bucket"):
        FsspecBlobStore("memory://")
    with pytest.raises(ValueError, match=r"cannot contain"):
        FsspecBlobStore("memory://blobs[1]")
    with pytest.raises(ValueError, match="cannot use"):
        FsspecBlobStore("nosuchprotocol://x/y")


@needs_moto
def test_a_missing_bucket_fails_as_storage_error_without_secrets(s3_endpoint: str) -> None:
    store = FsspecBlobStore(
        "s3://no-such-bucket/prefix",
        storage_options={"endpoint_url": s3_endpoint, "key": "AKIDEXAMPLE", "secret": SECRET})
    with pytest.raises(StorageError) as caught:
        store.put_bytes(b"nowhere to go")
    assert caught.value.code == "storage_error"
    assert "s3://no-such-bucket/prefix" in caught.value.message
    assert SECRET not in str(caught.value) and "AKIDEXAMPLE" not in str(caught.value)
    assert not s3_fs(s3_endpoint).exists("no-such-bucket")


@needs_moto
def test_credentials_in_the_url_never_reach_a_message(s3_endpoint: str) -> None:
    store = FsspecBlobStore(f"s3://AKIDEXAMPLE:{SECRET}@{BUCKET}/x",
                            storage_options={"endpoint_url": s3_endpoint})
    assert store.url == f"s3://{BUCKET}/x"
    with pytest.raises(StorageError) as caught:
        store.put_bytes(b"refused")
    assert SECRET not in str(caught.value) and "AKIDEXAMPLE" not in str(caught.value)


@needs_moto
def test_an_unreachable_store_fails_as_storage_error(s3_endpoint: str) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    store = FsspecBlobStore(f"s3://{BUCKET}/down", storage_options={
        "endpoint_url": dead, "secret": SECRET, "key": "AKIDEXAMPLE",
        "config_kwargs": {"retries": {"max_attempts": 1}}})
    for call in (lambda: store.put_bytes(b"lost"), lambda: store.exists(sha(b"lost")),
                 lambda: store.read(sha(b"lost")), lambda: list(store)):
        with pytest.raises(StorageError) as caught:
            call()
        assert caught.value.code == "storage_error"
        assert f"s3://{BUCKET}/down" in caught.value.message
        assert SECRET not in str(caught.value)
        assert not isinstance(caught.value.__cause__, StorageError)


@needs_moto
def test_the_endpoint_can_come_from_fsspecs_environment_variables(s3_endpoint: str) -> None:
    """FSSPEC_S3_ENDPOINT_URL, read when fsspec is first imported (in a fresh process), and
    ``import host_kernel`` imports no fsspec at all."""
    script = (
        "import sys, host_kernel, host_kernel.store.fsblobs as m\n"
        "assert 'fsspec' not in sys.modules, 'fsspec imported eagerly'\n"
        f"store = m.FsspecBlobStore('s3://{BUCKET}/from-env')\n"
        "print(store.put_bytes(b'via the environment').sha256)\n")
    env = {**os.environ, "FSSPEC_S3_ENDPOINT_URL": s3_endpoint}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    digest = sha(b"via the environment")
    assert out.stdout.strip() == digest
    blob = f"{BUCKET}/from-env/blobs/sha256/{digest[:2]}/{digest}"
    assert s3_fs(s3_endpoint).cat_file(blob) == b"via the environment"


# --------------------------------------------------------------------------- mirrored

def test_every_put_path_reaches_the_remote(mirrored: Backend, tmp_path: Path) -> None:
    store: MirroredBlobStore = mirrored.store
    assert mirrored.remote is not None
    source = tmp_path / "put.bin"
    source.write_bytes(b"put_file")
    refs = [store.put_bytes(b"put_bytes"), store.put_stream(io.BytesIO(b"put_stream")),
            store.put_file(source)]
    # The Host's own path: an output captured into a temp file of the store, then committed.
    fd, tmp = tempfile.mkstemp(dir=store.tmp, prefix=store.temp_prefix("stdout"))
    with os.fdopen(fd, "wb") as f:
        f.write(b"captured output")
    refs.append(store._commit(tmp, sha(b"captured output"), len(b"captured output")))
    for ref in refs:
        assert store.remote.exists(ref.sha256)
        assert store.remote.read(ref.sha256) == store.read(ref.sha256)
    assert sorted(Path(k).name for k in mirrored.remote.keys("blobs")) == \
        sorted(r.sha256 for r in refs)
    assert mirrored.remote.keys("tmp") == []


def test_a_blob_missing_locally_is_read_from_the_remote_verified(mirrored: Backend) -> None:
    assert mirrored.remote is not None
    data = b"kept on the remote" * 100
    ref = mirrored.store.put_bytes(data)
    mirrored.primary.delete(ref.sha256)
    assert mirrored.store.read(ref.sha256) == data
    with mirrored.store.open(ref.sha256) as f:
        assert f.read() == data
    assert mirrored.store.exists(ref.sha256)
    assert mirrored.store.hash_of(ref.sha256) == ref.sha256
    mirrored.remote.write(ref.sha256, b"altered on the remote")
    with pytest.raises(StorageError) as caught:
        mirrored.store.read(ref.sha256)
    assert caught.value.code == "blob_altered"
    assert mirrored.store.hash_of(ref.sha256) == sha(b"altered on the remote")


def test_a_put_uploads_what_the_remote_lost(mirrored: Backend) -> None:
    assert mirrored.remote is not None
    ref = mirrored.store.put_bytes(b"lost remotely")
    mirrored.remote.delete(ref.sha256)
    assert mirrored.store.put_bytes(b"lost remotely") == ref
    assert mirrored.store.remote.read(ref.sha256) == b"lost remotely"


@needs_moto
def test_a_failed_upload_fails_the_put_and_the_next_put_uploads(s3_endpoint: str,
                                                                tmp_path: Path) -> None:
    bucket = f"later-{uuid.uuid4().hex[:12]}"
    store = MirroredBlobStore(tmp_path / "record", f"s3://{bucket}/p", storage_options={
        "endpoint_url": s3_endpoint, "secret": SECRET, "key": "AKIDEXAMPLE"})
    assert store.remote_url == f"s3://{bucket}/p"
    with pytest.raises(StorageError) as caught:
        store.put_bytes(b"written through")
    assert f"s3://{bucket}/p" in caught.value.message and SECRET not in str(caught.value)
    assert FileBlobStore(tmp_path / "record").read(sha(b"written through")) == \
        b"written through"
    s3_fs(s3_endpoint).mkdir(bucket)
    assert store.put_bytes(b"written through") == BlobRef(sha(b"written through"), 15)
    assert s3_fs(s3_endpoint).find(bucket) == [
        f"{bucket}/p/blobs/sha256/{sha(b'written through')[:2]}/{sha(b'written through')}"]


# --------------------------------------------------------------------------- choosing a store

def test_open_blob_store_picks_by_scheme(tmp_path: Path) -> None:
    assert type(open_blob_store(tmp_path / "a")) is FileBlobStore
    assert type(open_blob_store(str(tmp_path / "b"))) is FileBlobStore
    assert type(open_blob_store(f"file://{tmp_path / 'c'}")) is FsspecBlobStore
    assert type(open_blob_store(f"memory://{uuid.uuid4().hex}")) is FsspecBlobStore
    with pytest.raises(ValueError, match="storage options"):
        open_blob_store(tmp_path / "d", storage_options={"anon": True})


def test_display_url_drops_user_password_and_query() -> None:
    assert display_url("s3://AKID:secret@bucket/prefix") == "s3://bucket/prefix"
    assert display_url("gs://bucket/p?token=abc") == "gs://bucket/p"
    assert display_url("simplecache::s3://u:p@bucket/x") == "simplecache::s3://bucket/x"
    assert display_url("/srv/blobs") == "/srv/blobs"
