"""The Host's hash cache remembers a file's hash only once the file has settled.

A cached hash is keyed on the file's size, modification time, change time and inode
(host/_workspace.py). Cell code can put a modification time back (``os.utime``) but
not a change time, except by changing the file again within the clock tick that
stamped the last one. So a hash is remembered only when the stat that keyed it was
taken at least :data:`~host_kernel.host._workspace.SETTLED_NS` after the file's change
time (docs/lineage.md, "Only settled files are remembered"); a file hashed sooner
is hashed again at its next look.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import run_ok
from _tracing_helpers import file_inputs

from host_kernel import Host
from host_kernel.host import _changes, _keep, _workspace
from host_kernel.host._keep import InputKeeper
from host_kernel.host._workspace import (
    SETTLED_NS,
    FileStat,
    HashCache,
    OpenStamps,
    Workspace,
    cached_hash,
    cached_sha256,
    settled,
    stat_key,
)
from host_kernel.store.blobs import FileBlobStore


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wait_until_settled(*paths: Path) -> None:
    """Sleep until every file's change time is SETTLED_NS (and a little) behind us."""
    newest = max(p.stat().st_ctime_ns for p in paths)
    left = newest + SETTLED_NS + 5_000_000 - time.time_ns()
    if left > 0:
        time.sleep(left / 1e9)


# ---------------------------------------------------------------------- the rule itself


def test_a_file_is_settled_once_its_change_time_is_settled_ns_behind_the_look() -> None:
    ctime = 1_700_000_000_000_000_000
    assert not settled(ctime, ctime)
    assert not settled(ctime, ctime + SETTLED_NS - 1)
    assert settled(ctime, ctime + SETTLED_NS)
    assert settled(ctime, ctime + 10 * SETTLED_NS)
    assert not settled(ctime, ctime - 1)  # a change time ahead of the clock


def test_an_unsettled_file_is_hashed_but_not_cached_until_it_settles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache: HashCache = {}
    path = tmp_path / "fresh.txt"
    path.write_bytes(b"just written\n")
    with monkeypatch.context() as m:
        m.setattr(_workspace, "SETTLED_NS", 3600 * 10**9)  # fresh, however slow the machine
        assert cached_sha256(tmp_path, "fresh.txt", cache) == sha(b"just written\n")
        assert cached_hash(tmp_path, "fresh.txt", cache) == (stat_key(path.stat()),
                                                             sha(b"just written\n"))
    assert "fresh.txt" not in cache  # the same tick could still hold other bytes
    wait_until_settled(path)
    assert cached_sha256(tmp_path, "fresh.txt", cache) == sha(b"just written\n")
    key, digest, taken = cache["fresh.txt"]
    assert (key, digest) == (stat_key(path.stat()), sha(b"just written\n"))
    assert taken - key[2] >= SETTLED_NS


def test_the_input_keeper_caches_only_settled_copies(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    store = FileBlobStore(tmp_path / "record")
    cache: HashCache = {}
    keeper = InputKeeper(Workspace(ws, tmp_path / "record"), cache, 2**30, lambda: store)
    names = ("a.txt", "b.txt", "c.txt")
    for name in names:
        (ws / name).write_bytes(f"{name}\n".encode())

    def copy() -> list[_keep.Copied]:
        # One file is copied alone (_copy_one), more are staged in a batch (_stage).
        return keeper.copy(["a.txt"]) + keeper.copy(["b.txt", "c.txt"])

    with monkeypatch.context() as m:
        m.setattr(_workspace, "SETTLED_NS", 3600 * 10**9)  # fresh, however slow the machine
        copied = copy()
    assert {c.path: c.sha256 for c in copied} == {n: sha(f"{n}\n".encode()) for n in names}
    assert cache == {} and all(c.entry is None for c in copied)  # kept, not remembered
    wait_until_settled(*(ws / n for n in names))
    store_holds = set(store)
    copied = copy()
    assert {rel: entry[1] for rel, entry in cache.items()} == {
        n: sha(f"{n}\n".encode()) for n in names}
    assert all(c.entry is cache[c.path] for c in copied)
    assert set(store) == store_holds  # the same bytes, not stored twice
    found = keeper.report(copied)
    assert sorted(found.kept) == [(n, sha(f"{n}\n".encode())) for n in names]
    assert not found.by_hash_only


# ---------------------------------------------------------------------- through a real kernel

#: The emulated file system's clock tick: as coarse as the Host expects one to be.
TICK = SETTLED_NS


def _coarse(key: FileStat) -> FileStat:
    size, mtime, ctime, ino = key
    return (size, mtime - mtime % TICK, ctime - ctime % TICK, ino)


@pytest.fixture
def coarse_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Host sees modification and change times as a file system stamping them from a
    clock that ticks every :data:`TICK` would show them.

    The kernel here (Linux 6.13 on, ext4 and tmpfs) stamps a file changed after its
    times were read with a fine-grained time, so two changes around the Host's stat never
    share a change time; older kernels, and other file systems, stamp from a coarse
    clock (a jiffy, or coarser), and there they do."""
    real = _workspace.stat_key

    def coarse_key(st: os.stat_result) -> FileStat:
        return _coarse(real(st))

    real_put = OpenStamps.put

    def put(self: OpenStamps, reads: list[str], stamps: dict[str, FileStat]) -> None:
        real_put(self, reads, {rel: _coarse(key) for rel, key in stamps.items()})

    for module in (_workspace, _keep, _changes):
        monkeypatch.setattr(module, "stat_key", coarse_key)
    monkeypatch.setattr(OpenStamps, "put", put)


@pytest.fixture
def host(workdir: Path, coarse_clock: None) -> Iterator[Host]:
    with Host(workdir) as h:
        yield h




#: Within one tick: write A, have the Host hash it (a save hashes the saving cell's reads),
#: write other bytes of the same size and put the modification time back. Prints whether
#: both writes fell in one tick, i.e. whether the Host's key could not tell them apart.
_SAME_TICK = """\
import os, time
while time.time_ns() % {tick} > 2_000_000:
    pass  # the start of a tick
open({a!r}, 'wb').write({old!r})
first = os.stat({a!r})
open({out!r}, 'wb').write(open({a!r}, 'rb').read()[::-1])
_s = host.save_artifact({out!r})
open({a!r}, 'wb').write({new!r})
os.utime({a!r}, ns=(first.st_atime_ns, first.st_mtime_ns))
second = os.stat({a!r})
print('same tick:', first.st_ctime_ns // {tick} == second.st_ctime_ns // {tick})
"""


def test_bytes_rewritten_in_the_tick_of_their_hash_are_named_as_they_are(host: Host) -> None:
    """The hole this closes: the Host hashed A and cached the hash under A's key; the cell
    rewrote A in the same clock tick, same size, modification time put back, so A's key
    did not move; a later artifact made from A named the hash of bytes A no longer held
    (and the input keeper, holding those old bytes already, did not look at A again).
    Now a file is cached only once settled, and the later artifact names A's bytes."""
    same_tick = 0
    for attempt in range(10):  # a busy machine may miss the tick; it must still be right
        a, seed = f"a{attempt}.bin", f"seed{attempt}.bin"
        out, later = f"first{attempt}.txt", f"later{attempt}.txt"
        old, new = os.urandom(16).hex().encode(), os.urandom(16).hex().encode()
        # The old bytes are kept already (read from another file), so the keeper's copy
        # at the cell's end finds A's cached hash among the bytes it holds.
        (host.workdir / seed).write_bytes(old)
        run_ok(host, f"_seed = open({seed!r}, 'rb').read()")
        text = run_ok(host, _SAME_TICK.format(tick=TICK, a=a, out=out, old=old, new=new))
        same_tick += "same tick: True" in text
        # The save hashed the bytes the cell had read.
        assert {(i["path"], i["sha256"]) for i in file_inputs(host, out)} == {(a, sha(old))}
        run_ok(host, f"open({later!r}, 'wb').write(open({a!r}, 'rb').read()[::-1])\n"
                     f"_s = host.save_artifact({later!r})")
        on_disk = (host.workdir / a).read_bytes()
        assert on_disk == new
        named = {(i["path"], i["sha256"]) for i in file_inputs(host, later)}
        assert named == {(a, sha(on_disk))}, (
            f"the artifact names {named}: {a} held {sha(old)} before the rewrite, "
            f"{sha(on_disk)} since")
        if same_tick:
            break
    if not same_tick:
        pytest.skip("no rewrite fell in the tick of the hash: nothing was put to the test")


def test_a_file_too_fresh_to_cache_is_not_called_changed_after_read(
        workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every file too fresh to cache, as one written a moment before its cell's end is.
    monkeypatch.setattr(_workspace, "SETTLED_NS", 3600 * 10**9)
    (workdir / "fresh.txt").write_bytes(b"unchanged since it was read\n")
    with Host(workdir) as host:
        run_ok(host, "seen = open('fresh.txt').read()")
        run_ok(host, "open('made.txt', 'w').write(seen)\n_a = host.save_artifact('made.txt')")
        [item] = file_inputs(host, "made.txt")
    assert item["sha256"] == sha(b"unchanged since it was read\n")
    assert "changed_after_read" not in item
