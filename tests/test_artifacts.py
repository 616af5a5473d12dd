"""host.save_artifact / load_artifact / artifacts and the content-addressed store."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from host_kernel import Host
from host_kernel.store.blobs import FileBlobStore

from _helpers import refusal, run_ok


def test_save_artifact_copies_into_the_store_with_its_fields(host: Host, workdir: Path) -> None:
    (workdir / "fig.png").write_bytes(b"\x89PNG fake")
    obs = host.execute("a = host.save_artifact('fig.png')\nprint(a.artifact_id, a.sha256, a.size, "
                       "a.media_type, a.cell_id, a.generation, a.filename)")
    aid, sha, size, media, cell, gen, name = obs.outputs[0]["text"].split()
    assert len(aid) == 36 and aid.count("-") == 4
    assert sha == hashlib.sha256(b"\x89PNG fake").hexdigest() and int(size) == 9
    assert (media, cell, gen, name) == ("image/png", obs.cell_id, "1", "fig.png")
    blob = host.record_dir / "blobs" / "sha256" / sha[:2] / sha
    assert blob.read_bytes() == b"\x89PNG fake"
    assert not os.access(blob, os.W_OK) or os.geteuid() == 0  # read-only bits set
    assert (blob.stat().st_mode & 0o222) == 0
    row = host.ledger.query("SELECT * FROM artifacts")[0]
    assert (row["artifact_id"], row["cell_id"], row["sha256"]) == (aid, obs.cell_id, sha)


def test_identical_bytes_are_stored_once(host: Host, workdir: Path) -> None:
    (workdir / "a.txt").write_text("same")
    (workdir / "b.txt").write_text("same")
    run_ok(host, "x = host.save_artifact('a.txt'); y = host.save_artifact('b.txt', filename='c.txt')\n"
                 "assert x.artifact_id != y.artifact_id and x.sha256 == y.sha256")
    store = FileBlobStore(host.record_dir)
    assert len(list(store)) == 1
    assert [r["filename"] for r in host.ledger.query("SELECT filename FROM artifacts ORDER BY seq")] == ["a.txt", "c.txt"]


def test_load_artifact_materialises_bytes_and_records_the_read(host: Host, workdir: Path) -> None:
    (workdir / "model.bin").write_bytes(b"weights")
    obs = host.execute("a = host.save_artifact('model.bin')\n"
                       "p = host.load_artifact(a.artifact_id, 'restored/model.bin')\nprint(p)")
    assert obs.outputs[0]["text"].strip() == "restored/model.bin"
    assert (workdir / "restored/model.bin").read_bytes() == b"weights"
    loads = host.ledger.query("SELECT artifact_id, path, cell_id FROM loads")
    assert [tuple(r) for r in loads][0][1:] == ("restored/model.bin", obs.cell_id)


def test_artifacts_lists_this_sessions_artifacts_only(workdir: Path) -> None:
    (workdir / "f.txt").write_text("1")
    with Host(workdir) as first:
        run_ok(first, "host.save_artifact('f.txt')")
    with Host(workdir) as second:
        assert "[]" in run_ok(second, "print(host.artifacts())")
        run_ok(second, "host.save_artifact('f.txt', filename='g.txt')")
        assert "g.txt" in run_ok(second, "print([a.filename for a in host.artifacts()])")
        assert "f.txt" not in run_ok(second, "print([a.filename for a in host.artifacts()])")


@pytest.mark.parametrize("call, expect", [
    ("host.save_artifact('missing.csv')", "does not exist"),
    ("host.save_artifact('.')", "directory"),
    ("host.save_artifact('../x')", "path_refused"),
    ("host.save_artifact('f.txt', filename='a/b')", "plain file name"),
    ("host.load_artifact('not-an-id')", "no artifact"),
    ("host.load_artifact(42)", "must be a str"),
])
def test_bad_artifact_calls_store_nothing(host: Host, workdir: Path, call: str, expect: str) -> None:
    (workdir / "f.txt").write_text("1")
    assert expect in refusal(host, call)
    assert host.ledger.query("SELECT count(*) FROM artifacts")[0][0] == 0
    assert list(FileBlobStore(host.record_dir)) == []


def test_load_refuses_an_altered_blob(host: Host, workdir: Path) -> None:
    (workdir / "d.txt").write_text("data")
    obs = host.execute("a = host.save_artifact('d.txt'); print(a.sha256)")
    sha = obs.outputs[0]["text"].strip()
    blob = host.record_dir / "blobs" / "sha256" / sha[:2] / sha
    os.chmod(blob, 0o644)
    blob.write_text("tampered")
    assert "no longer match" in refusal(host, "host.load_artifact(a.artifact_id, 'back.txt')")
    assert not (workdir / "back.txt").exists()


def test_blob_store_hashes_while_copying_and_cleans_partial_puts(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "rec")
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    ref = store.put_file(src)
    assert ref.sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    assert store.hash_of(ref.sha256) == ref.sha256
    (store.tmp / "put-leftover").write_bytes(b"partial")
    assert store.sweep() == 1
    assert list(store.tmp.iterdir()) == []
    assert store.put_bytes(b"abc").sha256 == hashlib.sha256(b"abc").hexdigest()
