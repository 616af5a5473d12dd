"""The Host's per-read bookkeeping after a cell that reads files it read before: the input
keeper's shortcut for a read whose bytes are kept already (a stamp, or the Host's own stat,
equal to the key of a cached hash) names the same bytes as a full look would, and a file
changed since is looked at again (host/_keep.py ``copy_reads``, host/_lineage.py)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _tracing_helpers import file_inputs, finished

from host_kernel import Host
from host_kernel.audit import audit
from host_kernel.host._keep import Copied, InputKeeper
from host_kernel.host._workspace import SETTLED_NS, HashCache, Workspace, stat_key
from host_kernel.store.blobs import FileBlobStore

COUNT = 40


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def settle(path: Path) -> None:
    """Wait until ``path`` has settled: a hash of it taken from now on is cached."""
    left = path.stat().st_ctime_ns + SETTLED_NS + 5_000_000 - time.time_ns()
    if left > 0:
        time.sleep(left / 1e9)


def kept_of(host: Host, code: str) -> dict[str, Any]:
    obs = host.execute(code, timeout=60)
    assert obs.status == "ok", obs.text
    body = finished(host, obs)
    assert "lineage_error" not in body, body
    return dict(body.get("inputs_kept") or {})


@pytest.fixture(params=[True, False], ids=["traced", "untraced"])
def reader(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Host]:
    ws = tmp_path / "ws"
    (ws / "files").mkdir(parents=True)
    for i in range(COUNT):
        (ws / "files" / f"f{i:03d}.txt").write_text(f"file {i}\n")
    settle(ws / "files" / f"f{COUNT - 1:03d}.txt")
    with Host(ws, trace=request.param) as host:
        if request.param and host.tracing.get("status") != "seccomp":
            pytest.skip(f"not traced here: {host.tracing}")
        obs = host.execute("import os\npaths = sorted(os.path.join('files', p) "
                           "for p in os.listdir('files'))")
        assert obs.status == "ok", obs.text
        yield host


READ_ALL = "for p in paths: open(p).read()"


def test_a_cell_reading_the_same_files_again_lists_the_same_kept_bytes(reader: Host) -> None:
    first = kept_of(reader, READ_ALL)
    again = kept_of(reader, READ_ALL)
    expected = [[f"files/f{i:03d}.txt", sha(f"file {i}\n".encode()), len(f"file {i}\n")]
                for i in range(COUNT)]
    assert first["kept"] == expected
    assert again["kept"] == expected  # found kept already: listed, not stored again
    assert again["by_hash_only"] == [] and again["used"] == first["used"]
    report = audit(reader.record_dir)
    assert report.clean, [str(f) for f in report.findings]


def test_a_file_rewritten_with_its_size_and_times_put_back_is_hashed_again(
        reader: Host) -> None:
    kept_of(reader, READ_ALL)
    kept_of(reader, READ_ALL)  # every file's hash cached and its bytes kept
    target = reader.workdir / "files" / "f007.txt"
    before = target.stat()
    target.write_text("FILE 7\n")  # the same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # and mtime put back
    settle(target)
    new = sha(b"FILE 7\n")
    kept = kept_of(reader, READ_ALL + "\n"
                   "x = open('files/f007.txt').read()\n"
                   "open('out.txt', 'w').write(x)\n"
                   "host.save_artifact('out.txt')")
    assert ["files/f007.txt", new, 7] in kept["kept"]
    assert not any(e[0] == "files/f007.txt" and e[1] != new for e in kept["kept"])
    assert reader.record.blobs.read(new) == b"FILE 7\n"
    inputs = {i["path"]: i["sha256"] for i in file_inputs(reader, "out.txt")}
    assert inputs.get("files/f007.txt") == new


# ---------------------------------------------------------------------- the keeper alone


def _keeper(root: Path) -> tuple[InputKeeper, HashCache]:
    ws = root / "ws"
    ws.mkdir()
    store = FileBlobStore(root / "record")
    cache: HashCache = {}
    return InputKeeper(Workspace(ws, root / "record"), cache, 2**30, lambda: store), cache


def test_a_stamp_equal_to_the_cached_key_is_known_and_any_other_is_looked_at(
        tmp_path: Path) -> None:
    keeper, cache = _keeper(tmp_path)
    ws = keeper.workspace
    for name in ("a.txt", "b.txt"):
        (ws.root / name).write_text(name)
    settle(ws.root / "b.txt")
    keeper.copy(["a.txt", "b.txt"])
    assert set(cache) == {"a.txt", "b.txt"}
    reads = ["a.txt", "b.txt"]
    a_key = stat_key(os.stat(ws.root / "a.txt"))
    other = (a_key[0], a_key[1], a_key[2] + 1, a_key[3])  # not the key hashed under
    ws.stamps.put(reads, {"a.txt": a_key, "b.txt": other})
    done = keeper.copy_reads(reads)
    assert done.items[0] == ("a.txt", cache["a.txt"])  # nothing looked at
    assert type(done.items[1]) is Copied  # its stamp is not the cached key: opened again
    assert done.keys == {}  # stamps, not the Host's own stats
    found = keeper.report(done).record(keeper.budget, keeper.used)
    assert found["kept"] == [["a.txt", sha(b"a.txt"), 5], ["b.txt", sha(b"b.txt"), 5]]


def test_without_stamps_one_stat_decides_and_its_key_is_handed_on(tmp_path: Path) -> None:
    keeper, cache = _keeper(tmp_path)
    root = keeper.workspace.root
    (root / "a.txt").write_text("one")
    (root / "b.txt").write_text("two")
    settle(root / "b.txt")
    keeper.copy(["a.txt", "b.txt"])
    (root / "b.txt").write_text("TWO")  # changed: its key is not the cached one
    done = keeper.copy_reads(["a.txt", "b.txt"])
    assert done.keys == {"a.txt": cache["a.txt"][0]}
    assert type(done.items[1]) is Copied and done.items[1].sha256 == sha(b"TWO")
    assert [c.path for c in done.copied()] == ["a.txt", "b.txt"]


def test_a_known_read_whose_cache_entry_was_replaced_is_reported_as_lineage_hashed_it(
        tmp_path: Path) -> None:
    keeper, cache = _keeper(tmp_path)
    root = keeper.workspace.root
    (root / "a.txt").write_text("old")
    settle(root / "a.txt")
    keeper.copy(["a.txt"])
    done = keeper.copy_reads(["a.txt"])
    assert done.items == [("a.txt", cache["a.txt"])]
    (root / "a.txt").write_text("new bytes")  # after the pass, before lineage's hash
    settle(root / "a.txt")
    del cache["a.txt"]  # as lineage's look would replace it
    found = keeper.report(done).record(keeper.budget, keeper.used)
    assert found["kept"] == []
    assert found["by_hash_only"] == [["a.txt", sha(b"new bytes"), 9]]
