"""FIFOs, devices, sockets and symlinks where a regular file must be: refused at once, never read.

A FIFO opened for reading waits for a writer forever, so every file the Host or
the verifier hashes and uses is opened once, without blocking, and checked to be
a regular file; these tests put special files in the workspace (from a cell) and
in the blob store (from outside) and check that the refusal comes with its code
within two seconds and that the Host answers the next cell. Each risky call runs
under a watchdog that unblocks the FIFOs and fails, so a regression fails here
instead of hanging the suite.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from _helpers import run_ok
from _pipeline import SUMMARY, TEST_CMD, submit

from host_kernel import FileProblem, Host, PathRefused, StorageError
from host_kernel.host._workspace import (
    SETTLED_NS,
    Workspace,
    cached_sha256,
    file_sha256,
    snapshot,
)
from host_kernel.modes import resolve_task_mode
from host_kernel.store.blobs import FileBlobStore, open_beneath, open_regular
from host_kernel.store.ledger import SQLiteLedger
from host_kernel.verify import LiveFiles, RecordView, Submission, verify

#: What "at once" means here; the watchdog allows more before it calls the test hung.
PROMPT = 2.0
WATCHDOG = 30.0


def _unblock(fifos: list[Path]) -> None:
    """Give any reader stuck on these FIFOs a writer, then end-of-file."""
    for fifo in fifos:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue  # no reader waiting, or not a FIFO any more
        os.close(fd)


@contextmanager
def watchdog(fifos: list[Path]) -> Iterator[None]:
    """Fail, instead of hanging, if the body is still stuck on a FIFO after WATCHDOG s."""
    done = threading.Event()
    fired: list[bool] = []

    def watch() -> None:
        if not done.wait(WATCHDOG):
            fired.append(True)
            while not done.wait(0.2):
                _unblock(fifos)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    assert not fired, "the Host blocked on a FIFO (the watchdog had to unblock it)"


def timed(host: Host, call: str, fifos: list[Path]) -> tuple[float, str]:
    """(seconds the call took inside the cell, 'Type code | message' of what it raised)."""
    code = (f"import time\nt0 = time.perf_counter()\ntry:\n    {call}\n    print('NO ERROR')\n"
            f"except Exception as e:\n    print(type(e).__name__, getattr(e, 'code', '?'), '|', e)\n"
            f"print('SECONDS', time.perf_counter() - t0)")
    with watchdog(fifos):
        obs = host.execute(code, timeout=WATCHDOG + 30)
    assert obs.status == "ok", obs.text
    text = obs.outputs[0]["text"] if obs.outputs else ""
    seconds = float(text.rsplit("SECONDS", 1)[1])
    return seconds, text.rsplit("SECONDS", 1)[0].strip()


def answers(host: Host) -> None:
    assert "42" in run_ok(host, "print(6 * 7)", timeout=30)


def _blob(host: Host, sha: str) -> Path:
    return host.record_dir / "blobs" / "sha256" / sha[:2] / sha


def _fifo_in_place_of(blob: Path) -> None:
    """What an offline tamperer (or a bug) might do: replace a read-only blob by a FIFO."""
    os.chmod(blob.parent, 0o700)
    os.chmod(blob, 0o644)
    blob.unlink()
    os.mkfifo(blob)


# -- through real cells -----------------------------------------------------------------------


def test_a_fifo_declared_as_a_source_is_refused_at_once(armed_host: Host, workdir: Path) -> None:
    run_ok(armed_host, "import os\nos.mkfifo('pipe.py')\nos.mkdir('pkgdir')")
    evidence = [{"command": TEST_CMD, "producing_cell_id": "AAAAAAAAAAAAAAAA"}]
    seconds, text = timed(armed_host, (
        f"host.submit_output({{'n': 1}}, ['x'], source_files=['pipe.py', 'pkgdir'], "
        f"entry_points=['pipe.py'], architecture_summary={SUMMARY!r}, "
        f"test_evidence={evidence!r})"), [workdir / "pipe.py"])
    assert seconds < PROMPT, text
    assert text.startswith("SubmissionRefused"), text
    assert "[source_not_regular_file] source file 'pipe.py' is a FIFO" in text
    assert "[source_not_regular_file] source file 'pkgdir' is a directory" in text
    row = armed_host.ledger.query("SELECT accepted, body FROM submissions ORDER BY seq DESC")[0]
    assert row["accepted"] == 0
    answers(armed_host)


def test_save_artifact_of_a_fifo_is_refused_and_stores_nothing(host: Host, workdir: Path) -> None:
    run_ok(host, "import os\nos.mkfifo('results.csv')")
    seconds, text = timed(host, "host.save_artifact('results.csv')", [workdir / "results.csv"])
    assert seconds < PROMPT, text
    assert text.startswith("FileProblem not_regular_file |"), text
    assert "is a FIFO (named pipe), not a regular file" in text
    assert host.ledger.query("SELECT count(*) FROM artifacts")[0][0] == 0
    assert list(FileBlobStore(host.record_dir)) == []
    code = host.ledger.query("SELECT code FROM refusals ORDER BY seq")[-1]["code"]
    assert code == "not_regular_file"
    answers(host)


@pytest.mark.parametrize("call", ["host.read_file('pipe')", "host.read_file('pipe', binary=True)",
                                  "host.edit_file('pipe', 'a', 'b')"])
def test_reading_a_fifo_is_refused(host: Host, workdir: Path, call: str) -> None:
    run_ok(host, "import os\nos.mkfifo('pipe')")
    seconds, text = timed(host, call, [workdir / "pipe"])
    assert seconds < PROMPT, text
    assert text.startswith("FileProblem not_regular_file | [not_regular_file] 'pipe' is a FIFO"), text
    answers(host)


def test_a_symlink_inside_the_workspace_still_reads(host: Host, workdir: Path) -> None:
    (workdir / "data").mkdir()
    (workdir / "data" / "real.txt").write_text("real bytes")
    os.symlink("data/real.txt", workdir / "alias.txt")
    os.symlink("data", workdir / "folder")
    assert "real bytes real bytes" in run_ok(
        host, "print(host.read_file('alias.txt'), host.read_file('folder/real.txt'))")
    obs = run_ok(host, "a = host.save_artifact('alias.txt')\nprint(a.sha256)")
    assert hashlib.sha256(b"real bytes").hexdigest() in obs


def test_a_fifo_in_place_of_a_blob_is_refused_by_load_and_verification(host: Host) -> None:
    obs = host.execute("host.write_file('d.txt', 'data')\na = host.save_artifact('d.txt')\n"
                       "print(a.artifact_id, a.sha256)")
    aid, sha = obs.outputs[0]["text"].split()
    blob = _blob(host, sha)
    _fifo_in_place_of(blob)
    seconds, text = timed(host, f"host.load_artifact({aid!r}, 'back.txt')", [blob])
    assert seconds < PROMPT, text
    assert text.startswith("FileProblem not_regular_file |") and "no longer match" in text, text
    assert not (host.workdir / "back.txt").exists()
    seconds, text = timed(host, f"host.submit_output({{'artifacts': [{aid!r}]}}, ['saved d'])",
                          [blob])
    assert seconds < PROMPT, text
    assert "[artifact_altered]" in text, text
    answers(host)
    # Saving the same bytes again puts a regular blob back in the FIFO's place.
    run_ok(host, "b = host.save_artifact('d.txt')\nhost.load_artifact(b.artifact_id, 'back.txt')")
    assert stat.S_ISREG(blob.lstat().st_mode) and blob.read_bytes() == b"data"


def test_a_fifo_in_place_of_a_receipts_output_is_never_read(fresh: Host) -> None:
    # The verifier no longer reads a receipt's output (the Host re-runs the tests itself),
    # so a FIFO there holds nothing up: the submission is decided by the reproduction, and
    # audit reports the blob without blocking on it.
    import json

    from host_kernel.audit import audit

    body = json.loads(fresh.ledger.query("SELECT body FROM receipts WHERE cell_id = ?",
                                         (fresh._evidence_cell,))[0]["body"])  # type: ignore[attr-defined]
    blob = _blob(fresh, body["stdout_sha256"])
    _fifo_in_place_of(blob)
    with watchdog([blob]):
        accepted, failed, text = submit(fresh)
        assert accepted, text
        run_ok(fresh, "host.write_file('pkg/core.py', 'def add(a, b):\\n    return a - b\\n')\n"
                      "host.save_artifact('pkg/core.py')")
        accepted, failed, text = submit(fresh)
        assert not accepted and "reproduction_failed" in failed, text
        started = time.monotonic()
        report = audit(fresh.record_dir)
        elapsed = time.monotonic() - started
    assert any(f.where == f"blob {blob.name}" and f.fatal for f in report.findings), \
        [str(f) for f in report.findings]
    assert elapsed < WATCHDOG
    assert stat.S_ISFIFO(blob.lstat().st_mode)
    answers(fresh)


# -- the pieces, directly ---------------------------------------------------------------------


@pytest.fixture
def specials(tmp_path: Path) -> Iterator[Path]:
    """A folder with a FIFO, a socket, a symlink to a file, a directory and a regular file."""
    (tmp_path / "file").write_bytes(b"bytes")
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    os.symlink(tmp_path / "file", tmp_path / "link")
    (tmp_path / "dir").mkdir()
    try:
        with watchdog([tmp_path / "fifo"]):
            yield tmp_path
    finally:
        sock.close()


@pytest.mark.parametrize("name, kind", [("fifo", "a FIFO (named pipe)"), ("sock", "a socket"),
                                        ("dir", "a directory")])
def test_open_regular_refuses_what_is_not_a_regular_file(specials: Path, name: str,
                                                         kind: str) -> None:
    with pytest.raises(FileProblem) as info:
        open_regular(specials / name)
    assert info.value.code == "not_regular_file" and kind in info.value.message


def test_open_regular_refuses_a_device_without_reading_it() -> None:
    with pytest.raises(FileProblem) as info:
        open_regular("/dev/zero", follow_symlinks=True)
    assert info.value.code == "not_regular_file" and "character device" in info.value.message


def test_open_regular_refuses_a_symlink_unless_told_to_follow(specials: Path) -> None:
    with pytest.raises(PathRefused) as info:
        open_regular(specials / "link")
    assert info.value.code == "symlink_refused"
    with open_regular(specials / "link", follow_symlinks=True) as f:
        assert f.read() == b"bytes"
    with open_regular(specials / "file") as f:
        assert f.read() == b"bytes" and os.get_blocking(f.fileno())


def test_open_beneath_follows_no_symlink_on_the_way(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("inside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "f.txt").write_text("secret")
    with open_beneath(root, "sub/f.txt") as f:
        assert f.read() == b"inside"
    # The folder is swapped for a symlink leading out after the path was resolved.
    (root / "sub").rename(root / "old")
    os.symlink(tmp_path / "outside", root / "sub")
    with pytest.raises(PathRefused) as info:
        open_beneath(root, "sub/f.txt")
    assert info.value.code == "symlink_refused"
    with pytest.raises(FileNotFoundError):
        open_beneath(root, "old/missing.txt")


def test_workspace_reads_refuse_special_files_at_once(specials: Path) -> None:
    ws = Workspace(specials, specials / "record")
    assert ws.read_bytes("file") == ("file", b"bytes")
    for name, code in (("fifo", "not_regular_file"), ("sock", "not_regular_file")):
        with pytest.raises(FileProblem) as info:
            ws.read_bytes(name)
        assert info.value.code == code
    # A symlink inside the workspace resolves to its target, which is read.
    assert ws.read_bytes("link") == ("file", b"bytes")


def test_hash_helpers_give_none_for_special_files_without_blocking(specials: Path,
                                                                   tmp_path: Path) -> None:
    digest = hashlib.sha256(b"bytes").hexdigest()
    assert file_sha256(specials / "file") == digest
    assert file_sha256(specials / "fifo") is None
    assert file_sha256(specials / "sock") is None
    assert file_sha256(Path("/dev/zero")) is None
    assert file_sha256(specials / "link") == digest  # an executable on PATH is often a link
    assert file_sha256(specials / "link", follow_symlinks=False) is None
    cache: dict[str, tuple[tuple[int, int, int, int], str]] = {}
    time.sleep(SETTLED_NS / 1e9)  # cached once it has settled (host/_workspace.py settled)
    assert cached_sha256(specials, "file", cache) == digest and "file" in cache
    assert cached_sha256(specials, "fifo", cache) is None
    assert cached_sha256(specials, "/dev/zero", cache) is None  # outside the root
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("secret")
    try:
        os.symlink(outside, specials / "out")
        assert file_sha256(specials / "out", root=specials) is None
        assert cached_sha256(specials, "out", cache) is None
    finally:
        outside.unlink()
    found, _ = snapshot(specials, specials / "record")
    assert set(found) == {"file"}


def test_blob_store_reads_only_intact_regular_blobs(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "rec")
    ref = store.put_bytes(b"payload")
    assert store.read(ref.sha256) == b"payload" and store.exists(ref.sha256)
    blob = store.path(ref.sha256)
    os.chmod(blob, 0o644)
    blob.write_bytes(b"forged")
    with pytest.raises(StorageError) as info:
        store.read(ref.sha256)
    assert info.value.code == "blob_altered"
    assert store.put_bytes(b"payload") == ref and store.read(ref.sha256) == b"payload"
    _fifo_in_place_of(blob)
    with watchdog([blob]):
        assert store.hash_of(ref.sha256) is None and not store.exists(ref.sha256)
        with pytest.raises(StorageError) as info:
            store.read(ref.sha256)
        assert info.value.code == "not_regular_file"
        assert ref.sha256 in list(store)  # audit still sees the name, and flags it
    source = tmp_path / "src.bin"
    source.write_bytes(b"payload")
    assert store.put_file(source) == ref and store.read(ref.sha256) == b"payload"
    blob.unlink()
    os.symlink(source, blob)
    with pytest.raises(StorageError) as info:
        store.read(ref.sha256)
    assert info.value.code == "symlink_refused"
    assert store.hash_of("not a digest") is None
    with pytest.raises(StorageError) as info:
        store.read("0" * 64)
    assert info.value.code == "blob_missing"


def test_put_file_refuses_a_fifo_and_a_symlink(specials: Path, tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "rec")
    with pytest.raises(FileProblem) as info:
        store.put_file(specials / "fifo")
    assert info.value.code == "not_regular_file"
    with pytest.raises(PathRefused) as info:
        store.put_file(specials / "link")
    assert info.value.code == "symlink_refused"
    assert list(store) == [] and list(store.tmp.iterdir()) == []


def test_the_verifier_reports_a_fifo_source_with_its_code(specials: Path, tmp_path: Path) -> None:
    (tmp_path / "rec").mkdir()
    ledger = SQLiteLedger(tmp_path / "rec" / "ledger.sqlite")
    try:
        view = RecordView(ledger, FileBlobStore(tmp_path / "rec"), "no-session")
        sub = Submission({"n": 1}, ["x"], source_files=["fifo", "file", "dir"],
                         entry_points=["file"], architecture_summary=SUMMARY,
                         test_evidence=[{"command": TEST_CMD, "producing_cell_id": "x"}])
        started = time.monotonic()
        verdict, seen = verify(sub, mode=resolve_task_mode(None, "reusable_pipeline"),
                               view=view, files=LiveFiles(specials, tmp_path / "rec"),
                               submission_id="s", submit_seq=1, submitting_cell=None)
        assert time.monotonic() - started < PROMPT
    finally:
        ledger.close()
    failed = [(c.code, c.message) for c in verdict.failed]
    fifo = ("source file 'fifo' is a FIFO (named pipe), not a regular file; only regular "
            "files can be read, hashed or saved; declare the files that hold the code")
    assert ("source_not_regular_file", fifo) in failed
    assert any(code == "source_not_regular_file" and "'dir' is a directory" in message
               for code, message in failed)
    assert seen["fifo"] is None and seen["file"] == hashlib.sha256(b"bytes").hexdigest()
    assert "source_missing" not in {code for code, _ in failed}


def test_live_files_compile_the_bytes_they_hashed(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("x = 1\n")
    files = LiveFiles(tmp_path, tmp_path / "rec")
    sha = files.sha256("m.py")
    (tmp_path / "m.py").write_text("y = 2 + \n")  # changed after hashing
    assert files.source("m.py") == b"x = 1\n" and sha == hashlib.sha256(b"x = 1\n").hexdigest()
    assert files.sha256("missing.py") is None and files.source("missing.py") is None


def test_live_files_give_a_big_source_only_with_the_bytes_first_hashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import host_kernel.verify as verify_module

    monkeypatch.setattr(verify_module, "KEEP_SOURCE_BYTES", 4)
    (tmp_path / "big.py").write_text("x = 1\n")
    files = LiveFiles(tmp_path, tmp_path / "rec")
    files.sha256("big.py")
    assert files.source("big.py") == b"x = 1\n"
    (tmp_path / "big.py").write_text("x = 2\n")
    assert files.source("big.py") is None
