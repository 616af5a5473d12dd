"""The bytes of a session's inputs kept in its record: each cell's ``inputs_kept``, the
blobs behind it, the budget, and what is never copied (docs/record.md, "Inputs kept")."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _tracing_helpers import finished

from host_kernel import Host
from host_kernel._errors import BadArguments
from host_kernel.audit import audit
from host_kernel.host import _workspace
from host_kernel.host._keep import InputKeeper, store_file
from host_kernel.host._options import HostOptions
from host_kernel.host._workspace import SETTLED_NS, HashCache, Workspace, cached_sha256
from host_kernel.store.blobs import FileBlobStore


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def kept_of(host: Host, code: str) -> dict[str, Any] | None:
    """Run a cell that must succeed; its ``inputs_kept`` (None when the record has none)."""
    obs = host.execute(code, timeout=60)
    assert obs.status == "ok", obs.text
    body = finished(host, obs)
    assert "lineage_error" not in body, body
    kept = body.get("inputs_kept")
    return None if kept is None else dict(kept)


def blob_names(host: Host) -> set[str]:
    return set(host.record.blobs)


def assert_audit_clean(host: Host) -> None:
    report = audit(host.record_dir)
    assert report.clean, [str(f) for f in report.findings]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    ws = tmp_path_factory.mktemp("keep") / "ws"
    ws.mkdir()
    with Host(ws) as h:
        yield h


# ---------------------------------------------------------------------- a session that keeps


def test_a_cell_reading_two_files_keeps_both_blobs_named_by_their_sha(shared: Host) -> None:
    small, big = b"alpha,beta\n1,2\n", os.urandom(3 * 2**20 + 17)  # one read whole, one streamed
    (shared.workdir / "two").mkdir()
    (shared.workdir / "two" / "small.csv").write_bytes(small)
    (shared.workdir / "two" / "big.bin").write_bytes(big)
    kept = kept_of(shared, "a = open('two/small.csv').read()\n"
                           "b = open('two/big.bin', 'rb').read()")
    assert kept is not None
    assert [["two/small.csv", sha(small), len(small)], ["two/big.bin", sha(big), len(big)]] \
        == [e for e in kept["kept"] if e[0].startswith("two/")]
    assert kept["by_hash_only"] == []
    assert kept["budget"] == 4 * 2**30
    for data in (small, big):
        path = shared.record.blobs.path(sha(data))
        assert path.name == sha(data)
        assert path.read_bytes() == data
    assert_audit_clean(shared)


def test_the_sha_kept_is_the_sha_lineage_recorded(shared: Host) -> None:
    data = b"x,y\n3,4\n"
    shared.workdir.joinpath("lin.csv").write_bytes(data)
    kept = kept_of(shared, "t = open('lin.csv').read()\nopen('lin_out.txt', 'w').write(t)\n"
                           "_a = host.save_artifact('lin_out.txt')")
    assert kept is not None and ["lin.csv", sha(data), len(data)] in kept["kept"]
    rows = shared.ledger.query("SELECT lineage FROM artifacts WHERE source_path = 'lin_out.txt'")
    inputs = json.loads(rows[-1]["lineage"])["inputs"]
    assert {"lin.csv": sha(data)} == {i["path"]: i["sha256"] for i in inputs if "path" in i}


def test_a_re_read_of_the_same_bytes_is_stored_once_and_counted_once(shared: Host) -> None:
    data = os.urandom(2 * 2**20)
    shared.workdir.joinpath("again.bin").write_bytes(data)
    shared.workdir.joinpath("same.bin").write_bytes(data)  # the same bytes at another path
    first = kept_of(shared, "_x = open('again.bin', 'rb').read()")
    assert first is not None and ["again.bin", sha(data), len(data)] in first["kept"]
    blobs = blob_names(shared)
    second = kept_of(shared, "_x = open('again.bin', 'rb').read()\n"
                             "_y = open('same.bin', 'rb').read()")
    assert second is not None
    assert ["again.bin", sha(data), len(data)] in second["kept"]
    assert ["same.bin", sha(data), len(data)] in second["kept"]
    assert second["used"] == first["used"]  # neither the re-read nor the copy counted again
    assert blob_names(shared) == blobs
    assert_audit_clean(shared)


def test_a_cell_that_reads_nothing_records_no_inputs_kept(shared: Host) -> None:
    assert kept_of(shared, "n = sum(range(10))") is None


def test_a_commands_traced_reads_are_kept_with_its_cell(shared: Host) -> None:
    data = b"read by a command only\n"
    shared.workdir.joinpath("cmd_in.txt").write_bytes(data)
    kept = kept_of(shared, "_r = host.bash('wc -c cmd_in.txt > cmd_out.txt')")
    assert kept is not None, "the command's read was not kept"
    assert ["cmd_in.txt", sha(data), len(data)] in kept["kept"]
    assert not any(e[0] == "cmd_out.txt" for e in kept["kept"] + kept["by_hash_only"])
    assert shared.record.blobs.read(sha(data)) == data
    assert_audit_clean(shared)


def test_a_file_rewritten_after_its_read_is_kept_as_it_ended_not_as_read(shared: Host) -> None:
    before, after = b"version one\n", b"version two, longer\n"
    shared.workdir.joinpath("moving.txt").write_bytes(before)
    kept = kept_of(shared, "_t = open('moving.txt').read()\n"
                           f"open('moving.txt', 'wb').write({after!r})")
    assert kept is not None
    mine = [e for e in kept["kept"] + kept["by_hash_only"] if e[0] == "moving.txt"]
    assert mine == [["moving.txt", sha(after), len(after)]]
    assert shared.record.blobs.read(sha(after)) == after
    assert sha(before) not in blob_names(shared)  # never claimed, never stored
    assert_audit_clean(shared)


def test_a_symlink_leading_out_of_the_workspace_is_not_copied(shared: Host,
                                                            tmp_path: Path) -> None:
    secret = os.urandom(64)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(secret)
    shared.workdir.joinpath("leads_out").symlink_to(outside)
    obs = shared.execute("try:\n    _s = open('leads_out', 'rb').read()\n"
                         "except OSError as e:\n    print('refused', e.errno)")
    assert obs.status == "ok", obs.text
    kept = finished(shared, obs).get("inputs_kept") or {"kept": [], "by_hash_only": []}
    assert not any(e[0] == "leads_out" for e in kept["kept"] + kept["by_hash_only"])
    assert sha(secret) not in blob_names(shared)
    assert_audit_clean(shared)


# ---------------------------------------------------------------------- the budget


def test_past_the_budget_an_input_is_kept_by_hash_only(workdir: Path) -> None:
    small, big = b"s" * 100, os.urandom(5000)
    workdir.joinpath("small.txt").write_bytes(small)
    workdir.joinpath("big.bin").write_bytes(big)
    with Host(workdir, input_budget=1000) as host:
        kept = kept_of(host, "_a = open('small.txt').read()\n_b = open('big.bin', 'rb').read()")
        assert kept is not None
        assert kept["kept"] == [["small.txt", sha(small), 100]]
        assert kept["by_hash_only"] == [["big.bin", sha(big), 5000]]
        assert (kept["budget"], kept["used"]) == (1000, 100)
        assert sha(big) not in blob_names(host)
        assert host.record.blobs.read(sha(small)) == small
        assert_audit_clean(host)


def test_a_budget_of_zero_keeps_nothing(workdir: Path) -> None:
    data = os.urandom(300)
    workdir.joinpath("d.bin").write_bytes(data)
    with Host(workdir, input_budget=0) as host:
        kept = kept_of(host, "_d = open('d.bin', 'rb').read()\n_r = host.bash('wc -c d.bin')")
        assert kept is not None
        assert kept["kept"] == [] and kept["used"] == 0 and kept["budget"] == 0
        assert kept["by_hash_only"] == [["d.bin", sha(data), 300]]
        assert sha(data) not in blob_names(host)
        assert_audit_clean(host)


def test_untraced_sessions_keep_what_the_audit_hook_saw(workdir: Path) -> None:
    data = b"seen by the audit hook\n"
    workdir.joinpath("hooked.txt").write_bytes(data)
    with Host(workdir, trace=False) as host:
        kept = kept_of(host, "_h = open('hooked.txt').read()")
        assert kept is not None and kept["kept"] == [["hooked.txt", sha(data), len(data)]]
        assert host.record.blobs.read(sha(data)) == data
        assert_audit_clean(host)


@pytest.mark.parametrize("budget", [-1, True, 1.5, "4G", None])
def test_input_budget_must_be_a_number_of_bytes(budget: object) -> None:
    with pytest.raises(BadArguments, match="input_budget"):
        HostOptions(input_budget=budget)  # type: ignore[arg-type]
    assert HostOptions(input_budget=0).input_budget == 0


# ---------------------------------------------------------------------- the keeper itself


def _keeper(root: Path, budget: int = 2**30) -> tuple[InputKeeper, FileBlobStore, HashCache]:
    ws = root / "ws"
    ws.mkdir()
    store = FileBlobStore(root / "record")
    cache: HashCache = {}
    return InputKeeper(Workspace(ws, root / "record"), cache, budget, lambda: store), store, cache


def settle(path: Path) -> None:
    """Wait until ``path`` has settled (host/_workspace.py, ``settled``): a hash of it
    taken from now on is cached."""
    left = path.stat().st_ctime_ns + SETTLED_NS + 5_000_000 - time.time_ns()
    if left > 0:
        time.sleep(left / 1e9)


@pytest.mark.parametrize("settled", [True, False], ids=["cached", "too_fresh_to_cache"])
def test_bytes_changed_between_the_copy_and_lineages_hash_are_not_claimed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settled: bool) -> None:
    if not settled:  # fresh for the whole test, however slowly it runs
        monkeypatch.setattr(_workspace, "SETTLED_NS", 3600 * 10**9)
    keeper, store, cache = _keeper(tmp_path)
    ws = keeper.workspace.root
    old, new = b"as copied\n", b"as lineage hashed it\n"
    (ws / "f.txt").write_bytes(old)
    if settled:
        settle(ws / "f.txt")
    copied = keeper.copy(["f.txt"])
    assert ("f.txt" in cache) is settled
    (ws / "f.txt").write_bytes(new)  # after the copy, before lineage's hash
    if settled:
        settle(ws / "f.txt")
    assert cached_sha256(ws, "f.txt", cache) == sha(new)  # what lineage records
    if settled:
        assert cache["f.txt"][1] == sha(new)  # lineage's hash replaced the copy's
    else:
        assert "f.txt" not in cache  # neither hash was kept: the report hashes again
    found = keeper.report(copied).record(keeper.budget, keeper.used)
    assert found["kept"] == [["f.txt", sha(old), len(old)]]
    assert found["by_hash_only"] == [["f.txt", sha(new), len(new)]]
    assert store.read(sha(old)) == old
    assert not store.exists(sha(new))


def test_the_copy_leaves_lineage_a_cached_hash_of_the_bytes_stored(tmp_path: Path) -> None:
    keeper, store, cache = _keeper(tmp_path)
    data = os.urandom(2 * 2**20 + 5)
    (keeper.workspace.root / "g.bin").write_bytes(data)
    settle(keeper.workspace.root / "g.bin")  # a file fresher than that is not cached
    [copied] = keeper.copy(["g.bin"])
    assert copied.sha256 == sha(data) and cache["g.bin"][1] == sha(data)
    assert store.read(sha(data)) == data


def test_the_keeper_follows_no_symlink_out_and_skips_the_record_and_bytecode(tmp_path: Path
                                                                             ) -> None:
    keeper, store, _ = _keeper(tmp_path)
    ws = keeper.workspace.root
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.txt").write_bytes(b"outside the workspace\n")
    (ws / "out_file").symlink_to(tmp_path / "elsewhere" / "x.txt")
    (ws / "out_dir").symlink_to(tmp_path / "elsewhere")
    (ws / "inside.txt").write_bytes(b"inside\n")
    (ws / "in_link").symlink_to(ws / "inside.txt")
    (ws / "__pycache__").mkdir()
    (ws / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"bytecode")
    reads = ["out_file", "out_dir/x.txt", "../elsewhere/x.txt", "/etc/hostname",
             "__pycache__/m.cpython-311.pyc", "in_link", 7]
    copied = keeper.copy(reads)
    assert [(c.path, c.sha256) for c in copied if c.sha256] == [("in_link", sha(b"inside\n"))]
    found = keeper.report(copied).record(keeper.budget, keeper.used)
    assert found["kept"] == [["in_link", sha(b"inside\n"), 7]] and found["by_hash_only"] == []
    assert set(store) == {sha(b"inside\n")}


def test_the_record_folder_is_never_an_input(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".host_kernel").mkdir(parents=True)
    (ws / ".host_kernel" / "ledger.sqlite").write_bytes(b"not an input")
    store = FileBlobStore(tmp_path / "store")
    keeper = InputKeeper(Workspace(ws, ws / ".host_kernel"), {}, 2**20, lambda: store)
    assert keeper.copy([".host_kernel/ledger.sqlite"]) == []
    assert list(store) == []


def test_a_file_that_grows_while_it_is_copied_is_stored_as_it_was_opened(tmp_path: Path
                                                                         ) -> None:
    store = FileBlobStore(tmp_path / "record")
    src = tmp_path / "growing.log"
    src.write_bytes(b"0123456789")
    with open(src, "rb") as f:
        ref = store_file(store, f, 4)  # the size it had when it was opened
    assert (ref.sha256, ref.size) == (sha(b"0123"), 4)
    assert store.read(ref.sha256) == b"0123"


def test_the_copy_goes_through_a_buffer_where_the_kernel_cannot_copy(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "record")
    data = os.urandom(3 * 2**20)
    r, w = os.pipe()  # copy_file_range refuses a pipe: the buffered path copies it
    writer = threading.Thread(target=lambda: (os.write(w, data), os.close(w)))
    writer.start()
    with open(r, "rb") as f:
        ref = store_file(store, f, len(data))
    writer.join()
    assert (ref.sha256, ref.size) == (sha(data), len(data))
    assert store.read(ref.sha256) == data
    assert list(store.tmp.iterdir()) == []
