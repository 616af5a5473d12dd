"""A blob the store has hashed is not read again while its file's stamp holds.

``FileBlobStore._intact`` decides whether a put may skip writing bytes that are stored
already. It re-reads the stored blob only when the file's stamp (device, inode, size,
modification and change time) moved since it last hashed it, or when that hash was so
close to the file's change time that a change in the same clock tick would not show.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from host_kernel.host._workspace import Workspace
from host_kernel.store import blobs
from host_kernel.store.blobs import FileBlobStore


@pytest.fixture()
def store(tmp_path: Path) -> FileBlobStore:
    return FileBlobStore(tmp_path / "record", durable=False)


def opens(store: FileBlobStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = FileBlobStore.open

    def counting(self: FileBlobStore, sha256: str) -> object:
        seen.append(sha256)
        return real(self, sha256)

    monkeypatch.setattr(FileBlobStore, "open", counting)
    return seen


def test_a_blob_hashed_once_is_not_read_again_while_its_stamp_holds(
        store: FileBlobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobs, "RACY_NS", 0)  # the file's change time counts as old at once
    ref = store.put_bytes(b"[]")
    seen = opens(store, monkeypatch)
    assert store.put_bytes(b"[]") == ref
    assert seen == [ref.sha256]  # hashed once, remembered
    assert store.put_bytes(b"[]") == ref
    assert seen == [ref.sha256]
    assert store.hash_of(ref.sha256) == ref.sha256  # an audit's read is never skipped
    assert seen == [ref.sha256] * 2


def test_a_blob_hashed_within_the_clock_tick_of_its_change_is_read_again(
        store: FileBlobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = store.put_bytes(b"fresh")  # changed just now: within RACY_NS of any hash
    seen = opens(store, monkeypatch)
    store.put_bytes(b"fresh")
    store.put_bytes(b"fresh")
    assert seen == [ref.sha256] * 2


@pytest.mark.parametrize("how", ["rewritten", "same size and time", "replaced"])
def test_a_remembered_blob_altered_on_disk_is_hashed_again_and_repaired(
        store: FileBlobStore, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setattr(blobs, "RACY_NS", 0)
    data = b"the bytes as stored"
    ref = store.put_bytes(data)
    assert store.put_bytes(data) == ref  # hashed, remembered
    path = store.path(ref.sha256)
    st = os.stat(path)
    os.chmod(path, 0o644)
    if how == "replaced":
        other = path.with_name("other")
        other.write_bytes(b"X" * len(data))
        os.replace(other, path)
    else:
        path.write_bytes(b"X" * len(data) if how != "rewritten" else b"tampered")
    if how != "rewritten":
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and times as before
    assert store.hash_of(ref.sha256) != ref.sha256
    assert store.put_bytes(data) == ref
    assert store.read(ref.sha256) == data


def test_a_missing_or_replaced_by_a_folder_blob_is_not_taken_for_stored(
        store: FileBlobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobs, "RACY_NS", 0)
    ref = store.put_bytes(b"gone")
    store.put_bytes(b"gone")
    path = store.path(ref.sha256)
    os.chmod(path, 0o644)
    path.unlink()
    assert not store._intact(ref.sha256)
    path.mkdir()
    assert not store._intact(ref.sha256)
    path.rmdir()
    assert store.put_bytes(b"gone") == ref
    assert store.read(ref.sha256) == b"gone"


# -- a command's working folder, resolved with one open --------------------------------


def test_a_commands_folder_is_resolved_as_realpath_resolves_it(tmp_path: Path) -> None:
    root, record = tmp_path / "ws", tmp_path / "record"
    (root / "a" / "b").mkdir(parents=True)
    record.mkdir()
    (root / "link").symlink_to(root / "a")
    (root / "out").symlink_to(tmp_path)
    (root / "f.txt").write_text("x")
    ws = Workspace(root, record)
    assert ws.cwd_for(str(root)) == root.resolve()
    assert ws.cwd_for(str(root / "link" / "b")) == (root / "a" / "b").resolve()
    assert ws.cwd_for(str(root / "a" / ".." / "a")) == (root / "a").resolve()
    for outside, code in [(str(root / "out"), "path_refused"), ("/", "path_refused"),
                          (str(root) + "-sibling", "path_refused"),
                          (str(root / "f.txt"), "file_problem"),
                          (str(root / "missing"), "file_problem")]:
        if outside.endswith("-sibling"):
            Path(outside).mkdir()
        with pytest.raises(Exception) as caught:
            ws.cwd_for(outside)
        assert getattr(caught.value, "code", None) == code, outside


def test_a_commands_folder_in_a_record_inside_the_workspace_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / ".record" / "sub").mkdir(parents=True)
    (root / ".recorded").mkdir()
    ws = Workspace(root, root / ".record")
    for inside in (root / ".record", root / ".record" / "sub"):
        with pytest.raises(Exception) as caught:
            ws.cwd_for(str(inside))
        assert getattr(caught.value, "code", None) == "path_refused"
    assert ws.cwd_for(str(root / ".recorded")) == (root / ".recorded").resolve()
