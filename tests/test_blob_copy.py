"""The blob store's copy of a file: made by the kernel, and hashed from the copy it keeps.

What FileBlobStore.put_stream and put_file promise about how the bytes come in
(host_kernel/store/_copy.py): a regular file is copied descriptor to descriptor
(``copy_file_range``, else ``sendfile``, else a buffer) from its position to
its end; any other stream through buffers; the digest recorded is always that
of the bytes kept, even while another process writes the source; errors leave
nothing in ``tmp/``. Through a real Host where a cell can see it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from host_kernel import Host
from host_kernel._errors import StorageError
from host_kernel.store._copy import STEP, WAYS, copy_hashed, file_source
from host_kernel.store.blobs import EMPTY_SHA256, FileBlobStore

from _helpers import run_ok, wait_for

MIB = 1024 * 1024


@pytest.fixture
def store(tmp_path: Path) -> FileBlobStore:
    return FileBlobStore(tmp_path / "record")


def _random_file(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


def _assert_kept(store: FileBlobStore, sha256: str, size: int) -> bytes:
    """The blob under ``sha256`` is there, ``size`` bytes long, and hashes to its name."""
    blob = store.path(sha256).read_bytes()
    assert len(blob) == size
    assert hashlib.sha256(blob).hexdigest() == sha256
    return blob


def _nothing_in_tmp(store: FileBlobStore) -> bool:
    return list(store.tmp.iterdir()) == []


# -- the fast path: a regular file, copied by the kernel


def test_a_regular_file_is_copied_by_copy_file_range_and_hashes_to_its_name(
        store: FileBlobStore, tmp_path: Path) -> None:
    data = _random_file(tmp_path / "big.bin", 3 * STEP + 12_345)  # several copy steps
    ref = store.put_file(tmp_path / "big.bin")
    assert ref.sha256 == hashlib.sha256(data).hexdigest() and ref.size == len(data)
    assert _assert_kept(store, ref.sha256, ref.size) == data
    assert store.copied == {"copy_file_range": len(data)}
    assert _nothing_in_tmp(store)


def test_the_copy_starts_at_the_sources_position_and_leaves_it_at_the_end(
        store: FileBlobStore, tmp_path: Path) -> None:
    data = _random_file(tmp_path / "f.bin", 2 * MIB)
    with open(tmp_path / "f.bin", "rb") as f:
        assert f.read(10) == data[:10]  # the buffered reader has read ahead of 10
        ref = store.put_stream(f)
        assert f.tell() == len(data) and f.read() == b""
    assert ref.size == len(data) - 10
    assert _assert_kept(store, ref.sha256, ref.size) == data[10:]
    assert store.copied == {"copy_file_range": len(data) - 10}


def test_unbuffered_and_read_write_files_take_the_fast_path(store: FileBlobStore,
                                                            tmp_path: Path) -> None:
    data = _random_file(tmp_path / "f.bin", MIB)
    with open(tmp_path / "f.bin", "rb", buffering=0) as raw:
        raw.seek(5)
        assert store.put_stream(raw).sha256 == hashlib.sha256(data[5:]).hexdigest()
    with open(tmp_path / "f.bin", "r+b") as both:
        both.seek(0, os.SEEK_END)
        both.write(b"tail")  # still in the writer's buffer: flushed before the copy
        both.seek(0)
        ref = store.put_stream(both)
    assert _assert_kept(store, ref.sha256, ref.size) == data + b"tail"
    assert store.copied == {"copy_file_range": len(data) - 5 + len(data) + 4}


def test_the_empty_file_is_stored_as_the_empty_blob(store: FileBlobStore,
                                                    tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    ref = store.put_file(tmp_path / "empty")
    assert (ref.sha256, ref.size) == (EMPTY_SHA256, 0)
    assert _assert_kept(store, EMPTY_SHA256, 0) == b""
    assert store.put_stream(io.BytesIO(b"")).sha256 == EMPTY_SHA256
    assert list(store) == [EMPTY_SHA256] and _nothing_in_tmp(store)


def test_identical_files_are_stored_once_and_an_altered_blob_is_repaired(
        store: FileBlobStore, tmp_path: Path) -> None:
    data = _random_file(tmp_path / "a.bin", MIB + 1)
    (tmp_path / "b.bin").write_bytes(data)
    first, second = store.put_file(tmp_path / "a.bin"), store.put_file(tmp_path / "b.bin")
    assert first == second and list(store) == [first.sha256] and _nothing_in_tmp(store)
    blob = store.path(first.sha256)
    blob.chmod(0o644)
    blob.write_bytes(b"altered")
    assert store.put_file(tmp_path / "a.bin") == first
    assert _assert_kept(store, first.sha256, first.size) == data
    assert (blob.stat().st_mode & 0o222) == 0


def test_a_store_that_is_not_durable_copies_the_same_way(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "record", durable=False)
    data = _random_file(tmp_path / "f.bin", 2 * MIB)
    ref = store.put_file(tmp_path / "f.bin")
    assert _assert_kept(store, ref.sha256, ref.size) == data
    assert store.copied == {"copy_file_range": len(data)}


@pytest.mark.parametrize("way", WAYS)
def test_each_way_alone_copies_from_the_offset_and_hashes_the_copy(tmp_path: Path,
                                                                    way: str) -> None:
    data = _random_file(tmp_path / "src", 2 * STEP + 999)
    with open(tmp_path / "src", "rb") as src, open(tmp_path / "dst", "w+b") as dst:
        copied = copy_hashed(src.fileno(), 7, dst.fileno(), ways=(way,))
    assert copied.ways == {way: len(data) - 7} and copied.size == len(data) - 7
    assert (tmp_path / "dst").read_bytes() == data[7:]
    assert copied.sha256 == hashlib.sha256(data[7:]).hexdigest()


def test_then_runs_after_the_copy_is_complete(tmp_path: Path) -> None:
    data = _random_file(tmp_path / "src", STEP + 1)
    seen: list[int] = []
    with open(tmp_path / "src", "rb") as src, open(tmp_path / "dst", "w+b") as dst:
        copied = copy_hashed(src.fileno(), 0, dst.fileno(),
                             then=lambda: seen.append(os.fstat(dst.fileno()).st_size))
    assert seen == [len(data)] and copied.size == len(data)


def test_unknown_ways_are_refused(tmp_path: Path) -> None:
    with open(tmp_path / "dst", "w+b") as dst:
        for ways in ((), ("splice",)):
            with pytest.raises(ValueError, match="ways to copy"):
                copy_hashed(dst.fileno(), 0, dst.fileno(), ways=ways)


def test_a_file_on_another_file_system_is_copied_by_the_kernel(store: FileBlobStore) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm here to hold a file on another file system")
    if os.stat(shm).st_dev == os.stat(store.root).st_dev:
        pytest.skip("/dev/shm is on the store's file system here")
    src = shm / f"hk-blob-copy-{os.getpid()}"
    try:
        data = _random_file(src, STEP + 3)
        ref = store.put_file(src)
    finally:
        src.unlink(missing_ok=True)
    assert _assert_kept(store, ref.sha256, ref.size) == data
    # copy_file_range refuses between file systems (EXDEV) on most kernels; sendfile takes over
    assert set(store.copied) <= {"copy_file_range", "sendfile"}
    assert sum(store.copied.values()) == len(data)


@pytest.mark.parametrize("path", ["/proc/self/cmdline", "/proc/version"])
def test_a_file_whose_size_the_kernel_does_not_report_is_copied_to_its_end(
        store: FileBlobStore, path: str) -> None:
    assert os.stat(path).st_size == 0  # procfs: a regular file that says it is empty
    with open(path, "rb") as f:
        expected = f.read()
    ref = store.put_file(path)
    assert ref.size == len(expected) > 0
    assert _assert_kept(store, ref.sha256, ref.size) == expected
    assert "stream" not in store.copied  # a regular file: through its descriptor
    if path == "/proc/self/cmdline":  # neither copy_file_range nor sendfile takes it
        assert store.copied == {"read": len(expected)}


# -- the slow path: streams with no descriptor of a regular file


def test_a_bytes_io_is_copied_through_buffers_from_its_position(store: FileBlobStore) -> None:
    data = os.urandom(5 * MIB + 3)
    src = io.BytesIO(data)
    src.seek(3)
    ref = store.put_stream(src)
    assert _assert_kept(store, ref.sha256, ref.size) == data[3:]
    assert store.copied == {"stream": len(data) - 3}


def test_a_pipe_is_copied_through_buffers(store: FileBlobStore) -> None:
    data = os.urandom(3 * MIB + 5)
    r, w = os.pipe()

    def feed() -> None:
        with os.fdopen(w, "wb") as out:
            out.write(data)

    feeder = threading.Thread(target=feed)
    feeder.start()
    with os.fdopen(r, "rb") as src:
        ref = store.put_stream(src)
    feeder.join()
    assert _assert_kept(store, ref.sha256, ref.size) == data
    assert store.copied == {"stream": len(data)}


def test_a_file_object_that_transforms_what_it_reads_is_stored_as_it_reads(
        store: FileBlobStore, tmp_path: Path) -> None:
    # gzip.GzipFile.fileno() is the compressed file's descriptor: copying from it would
    # keep the compressed bytes, not what the file object reads.
    data = os.urandom(1024) * 2048  # 2 MiB that compress
    with gzip.open(tmp_path / "d.gz", "wb") as gz:
        gz.write(data)
    with gzip.open(tmp_path / "d.gz", "rb") as gz:
        assert isinstance(gz, gzip.GzipFile) and os.fstat(gz.fileno()).st_size < len(data)
        ref = store.put_stream(gz)  # type: ignore[arg-type]
    assert _assert_kept(store, ref.sha256, ref.size) == data
    assert store.copied == {"stream": len(data)}


def test_only_readable_plain_files_are_copied_from_their_descriptor(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    with open(tmp_path / "f", "rb") as f:
        f.read(1)
        assert file_source(f) == (f.fileno(), 1)
    with open(tmp_path / "f", "wb") as f:
        assert file_source(f) is None  # not readable
    closed = open(tmp_path / "f", "rb")  # noqa: SIM115 - closed on purpose
    closed.close()
    assert file_source(closed) is None
    assert file_source(io.BytesIO(b"abc")) is None
    r, w = os.pipe()
    with os.fdopen(r, "rb") as pipe, os.fdopen(w, "wb"):
        assert file_source(pipe) is None


# -- errors leave nothing behind


def test_a_source_that_fails_to_read_fails_the_put_and_leaves_nothing(
        store: FileBlobStore) -> None:
    # /proc/self/mem is a regular file that neither copy_file_range nor sendfile takes,
    # and reading its first page (never mapped) is EIO: every way is tried, the last fails.
    with pytest.raises(StorageError) as caught:
        store.put_file("/proc/self/mem")
    assert caught.value.code == "storage_error" and "Input/output error" in caught.value.message
    assert _nothing_in_tmp(store) and list(store) == []


def test_a_store_that_cannot_take_the_whole_file_fails_the_put_and_leaves_nothing(
        tmp_path: Path) -> None:
    # A real write error in the middle of the kernel's copy: a file size limit (EFBIG, the
    # way a full disk fails), in a child process so the limit binds nothing else.
    _random_file(tmp_path / "big.bin", 4 * MIB)
    child = ("import resource, signal, sys\n"
             "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
             "from host_kernel._errors import StorageError\n"
             "from host_kernel.store.blobs import FileBlobStore\n"
             "store = FileBlobStore(sys.argv[1])\n"
             "try:\n    store.put_file(sys.argv[2])\n"
             "except StorageError as exc:\n    print(exc)\n"
             "else:\n    print('stored')\n")
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path / "record"),
                           str(tmp_path / "big.bin")], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "[storage_error] the record's disk is full (File too large)" in done.stdout, done
    store = FileBlobStore(tmp_path / "record")
    assert _nothing_in_tmp(store) and list(store) == []


# -- another process writing the source while it is put


REWRITER = """
import os, sys
path, ready = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_WRONLY)
size = os.fstat(fd).st_size
block = 256 * 1024
patterns = [bytes([b]) * block for b in (0xAA, 0x55)]
i = 0
while True:
    for off in range(0, size, block):
        os.pwrite(fd, patterns[i % 2][:min(block, size - off)], off)
    i += 1
    if i == 2:
        open(ready, "w").close()
"""

#: Appends 64 KiB every 4 ms (16 MB/s at most): several appends land in each put, which
#: copies until it catches up with the file, while the file stays tens of MB, not hundreds
#: (the puts, their fsyncs and the checks below scale with what it has grown to).
APPENDER = """
import os, sys, time
path, ready = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
chunk = os.urandom(64 * 1024)
open(ready, "w").close()
while True:
    os.write(fd, chunk)
    time.sleep(0.004)
"""


@contextmanager
def _writing(script: str, path: Path) -> Iterator[None]:
    """A child process writing ``path`` as ``script`` does, from when it is ready to the end."""
    ready = path.with_name(path.name + ".ready")
    writer = subprocess.Popen([sys.executable, "-c", script, str(path), str(ready)])
    try:
        wait_for(ready.exists, 30, "the writer to start")
        yield
    finally:
        writer.kill()
        writer.wait()


def test_a_file_rewritten_during_the_put_yields_blobs_that_hash_to_their_names(
        store: FileBlobStore, tmp_path: Path) -> None:
    size = 16 * MIB
    src = tmp_path / "moving.bin"
    _random_file(src, size)
    with _writing(REWRITER, src):
        refs = [store.put_file(src) for _ in range(8)]
    for ref in refs:
        assert ref.size == size
        blob = _assert_kept(store, ref.sha256, size)
        assert store.read(ref.sha256) == blob  # the verified read agrees
    assert _nothing_in_tmp(store)


def test_a_file_appended_to_during_the_put_yields_blobs_that_hash_to_their_names(
        store: FileBlobStore, tmp_path: Path) -> None:
    src = tmp_path / "growing.bin"
    start = _random_file(src, 8 * MIB)
    refs = []
    with _writing(APPENDER, src):
        for _ in range(8):
            refs.append(store.put_file(src))
            time.sleep(0.01)
    final = src.read_bytes()
    assert final[:len(start)] == start and len(final) > len(start)
    for ref in refs:
        assert ref.size >= len(start)
        assert _assert_kept(store, ref.sha256, ref.size) == final[:ref.size]
    assert _nothing_in_tmp(store)


# -- through a Host: what a cell sees


def test_save_artifact_of_a_big_file_is_copied_by_the_kernel_and_matches_its_record(
        host: Host, workdir: Path) -> None:
    data = _random_file(workdir / "big.bin", 3 * STEP + 17)
    out = run_ok(host, "a = host.save_artifact('big.bin'); print(a.sha256, a.size)")
    sha, size = out.split()
    assert sha == hashlib.sha256(data).hexdigest() and int(size) == len(data)
    blobs = host.blobs
    assert blobs is not None
    assert _assert_kept(blobs, sha, len(data)) == data
    assert blobs.copied["copy_file_range"] >= len(data)
    assert run_ok(host, "print(host.save_artifact('big.bin').sha256)").strip() == sha
    assert _nothing_in_tmp(blobs)


def test_a_cell_rewriting_a_file_while_saving_it_cannot_make_a_blob_differ_from_its_record(
        host: Host, workdir: Path) -> None:
    size = 16 * MIB
    _random_file(workdir / "moving.bin", size)
    cell = (f"import os, subprocess, sys, time\n"
            f"w = subprocess.Popen([sys.executable, '-c', {REWRITER!r}, 'moving.bin', "
            f"'moving.ready'])\n"
            f"while not os.path.exists('moving.ready'):\n    time.sleep(0.01)\n"
            f"try:\n    saved = [host.save_artifact('moving.bin') for _ in range(6)]\n"
            f"finally:\n    w.kill(); w.wait()\n"
            f"print(len({{a.sha256 for a in saved}}))")
    distinct = int(run_ok(host, cell, timeout=120).strip())
    blobs = host.blobs
    assert blobs is not None
    rows = host.ledger.query("SELECT sha256, size FROM artifacts WHERE filename = 'moving.bin'")
    assert len(rows) == 6 and distinct >= 1
    for row in rows:
        assert row["size"] == size
        _assert_kept(blobs, row["sha256"], size)
        assert blobs.hash_of(row["sha256"]) == row["sha256"]
    assert _nothing_in_tmp(blobs)
