"""host.bash in a large workspace: a receipt's changes come from what the tracer saw the
command do (nothing walked or hashed before it runs), stay exact, and cannot be hidden;
without tracing the Host still compares the workspace before and after.

Real Hosts over real (confined, traced) kernels, real cells; the workspace is a
tmp_path folder of many small files.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import bash_receipt, run_ok

from host_kernel import Host
from host_kernel.host import _workspace
from host_kernel.host._changes import after_trace
from host_kernel.host._trace import MOVED_IN, WROTE, TracedAccess
from host_kernel.host._workspace import Workspace
from host_kernel.sandbox.trace import HASH_LIMIT
from host_kernel.verify import RecordView

FILES = 20_000


def _fill(root: Path, n: int = FILES) -> None:
    """``n`` small files in 100 folders, written as fast as Python can."""
    for d in range(100):
        folder = root / "data" / f"d{d:03}"
        folder.mkdir(parents=True)
        for i in range(n // 100):
            with open(folder / f"f{i:04}.txt", "wb") as f:
                f.write(b"%d,%d\n" % (d, i))


def _bash(host: Host, command: str) -> dict[str, Any]:
    """Run ``command`` with host.bash in a cell; its receipt's body (it must succeed)."""
    body = bash_receipt(host, command)
    assert body["exit_status"] == 0 and not body["timed_out"], body["stderr_tail"]
    return body


def _paths(body: dict[str, Any]) -> dict[str, str]:
    return {c["path"]: c["change"] for c in body["changes"]}


def _manifest(host: Host, body: dict[str, Any]) -> dict[str, str]:
    assert host.blobs is not None
    return dict(json.loads(host.blobs.read(body["workspace_manifest_sha256"])))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, Path]]:
    ws = tmp_path_factory.mktemp("big") / "ws"
    ws.mkdir()
    _fill(ws)
    with Host(ws) as host:
        assert host.tracing == {"status": "seccomp"}, host.tracing
        yield host, ws


# ------------------------------------------------------------------ exact, without a walk


def test_a_command_that_writes_nothing_records_no_change_and_an_empty_manifest(
        big: tuple[Host, Path]) -> None:
    host, _ = big
    body = _bash(host, "true")
    assert body["changes"] == [] and not body["changes_truncated"]
    assert body["changes_found_by"] == "traced"
    assert body["workspace_manifest_scope"] == "changes"
    assert body["workspace_manifest_files"] == 0 and _manifest(host, body) == {}


def test_a_command_changing_one_file_of_twenty_thousand_records_exactly_that_change(
        big: tuple[Host, Path]) -> None:
    host, ws = big
    body = _bash(host, "echo more >> data/d042/f0007.txt")
    assert body["changes_found_by"] == "traced"
    assert body["changes"] == [{
        "path": "data/d042/f0007.txt", "change": "modified",
        "sha256": _sha(b"42,7\nmore\n"), "size": len(b"42,7\nmore\n")}]
    assert not body["changes_truncated"]
    # Its bytes are now known to the Host: the next command's manifest holds them.
    again = _bash(host, "touch data/d042/f0007.txt")
    assert _paths(again) == {"data/d042/f0007.txt": "modified"}
    assert _manifest(host, again) == {"data/d042/f0007.txt": _sha(b"42,7\nmore\n")}
    assert (ws / "data/d042/f0007.txt").read_bytes() == b"42,7\nmore\n"


def test_created_and_deleted_files_are_labelled_as_such(big: tuple[Host, Path]) -> None:
    host, ws = big
    body = _bash(host, "echo new > data/d001/new.txt && rm data/d001/f0001.txt && "
                       "echo x > data/d001/f0002.txt")
    assert _paths(body) == {"data/d001/new.txt": "created", "data/d001/f0001.txt": "deleted",
                            "data/d001/f0002.txt": "modified"}
    assert body["changes_found_by"] == "traced"


def test_a_file_written_to_a_temporary_name_and_renamed_into_place_needs_no_walk(
        big: tuple[Host, Path]) -> None:
    host, _ = big
    # The Host never hashed this file: the supervisor hashed it when sed's rename onto it
    # was about to run, so it is known to have been there, with its bytes.
    body = _bash(host, "sed -i 's/^3,/three,/' data/d003/f0005.txt")
    assert _paths(body) == {"data/d003/f0005.txt": "modified"}
    assert body["changes"][0]["sha256"] == _sha(b"three,5\n")
    assert _manifest(host, body) == {"data/d003/f0005.txt": _sha(b"3,5\n")}
    assert body["changes_found_by"] == "traced" and body["changes_unproven"] == []


# ------------------------------------------------------------------ hiding a change


def _hide(host: Host, ws: Path, command: str, target: str) -> dict[str, Any]:
    before = (ws / target).read_bytes()
    body = _bash(host, command)
    after = (ws / target).read_bytes()
    assert after != before, f"the command did not change {target}"
    listed = {c["path"]: c for c in body["changes"]}
    assert target in listed, body
    assert listed[target]["sha256"] == _sha(after)
    assert target not in body.get("traced", {}).get("changes_by_others", [])
    return body


@pytest.mark.parametrize(("command", "target"), [
    # rename dances
    ("cp data/d010/f0000.txt t && echo x >> t && mv t data/d010/f0000.txt",
     "data/d010/f0000.txt"),
    ("mkdir -p stage && cp data/d011/f0000.txt stage/f && echo x >> stage/f && "
     "mv data/d011 old11 && mkdir data/d011 && mv stage/f data/d011/f0000.txt",
     "data/d011/f0000.txt"),
    # a hard link inside the workspace, written through and removed
    ("ln data/d012/f0000.txt h && echo x >> h && rm h", "data/d012/f0000.txt"),
    # a symlink, and a symlinked folder, written through and removed
    ("ln -s data/d013/f0000.txt l && echo x >> l && rm l", "data/d013/f0000.txt"),
    ("ln -s data/d014 dl && echo x >> dl/f0000.txt && rm dl", "data/d014/f0000.txt"),
    ("ln -s data .git && echo x >> .git/d015/f0000.txt && rm .git",
     "data/d015/f0000.txt"),
    # a symlink written through, renamed away, and a regular file put in its place (and
    # the same with a symlinked folder): the rename no longer explains the written name
    ("ln -s data/d021/f0000.txt l && echo x >> l && mv l l2 && echo y > t && mv t l2",
     "data/d021/f0000.txt"),
    ("ln -s data/d022 dl && echo x >> dl/f0000.txt && mv dl dl2 && mkdir dl && "
     "echo y > dl/f0000.txt", "data/d022/f0000.txt"),
    # through /proc/self/fd, and from a child process
    ("exec 3<data/d016/f0000.txt && echo x > /proc/self/fd/3", "data/d016/f0000.txt"),
    ("sh -c 'python3 -c \"open(\\\"data/d017/f0000.txt\\\", \\\"a\\\").write(\\\"x\\\")\"'",
     "data/d017/f0000.txt"),
    # truncated or rewritten in place, same size, modification time put back
    ("python3 -c \"import os; p='data/d018/f0000.txt'; st=os.stat(p); "
     "open(p,'r+b').write(b'Z'*st.st_size); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\"",
     "data/d018/f0000.txt"),
    ("python3 -c \"import os; p='data/d019/f0000.txt'; st=os.stat(p); "
     "open(p,'wb').write(b'Y'*st.st_size); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\"",
     "data/d019/f0000.txt"),
])
def test_a_change_the_command_tries_to_hide_is_still_in_its_receipt(
        big: tuple[Host, Path], command: str, target: str) -> None:
    host, ws = big
    _hide(host, ws, command, target)


def test_a_folder_filled_elsewhere_and_renamed_into_place_lists_its_files(
        big: tuple[Host, Path]) -> None:
    host, ws = big
    body = _bash(host, "mkdir t && echo evil > t/f && echo two > t/g && mv t made")
    assert _paths(body) == {"made/f": "created", "made/g": "created"}
    assert (ws / "made/f").read_text() == "evil\n"


def test_a_file_another_command_changed_just_before_is_not_this_ones(
        big: tuple[Host, Path]) -> None:
    """The first command rewrites a file with its modification time put back; the
    second, started a tick and a half of the file systems' clock later (well within the
    20 ms an earlier version allowed for that clock), is walked (a file it wrote is
    gone): only the second's own file is its change."""
    host, _ = big
    rewrite = ("python3 -c \"import os; p='data/d023/f0000.txt'; st=os.stat(p); "
               "open(p,'wb').write(b'Y'*st.st_size); "
               "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\"")
    walked = "echo x > tmp23 && echo y > kept23 && rm tmp23"
    text = run_ok(host, f"import time\na = host.bash({rewrite!r})\n"
                        "time.sleep(1.5 * time.clock_getres(5))  # CLOCK_REALTIME_COARSE\n"
                        f"b = host.bash({walked!r})\n"
                        "assert a.ok and b.ok, (a.stderr_tail, b.stderr_tail)\n"
                        "print('receipts', a.receipt_id, b.receipt_id)")
    ids = next(line.split()[1:] for line in text.splitlines() if line.startswith("receipts "))
    first, second = (json.loads(host.ledger.query(
        "SELECT body FROM receipts WHERE receipt_id = ?", (i,))[0]["body"]) for i in ids)
    assert _paths(first) == {"data/d023/f0000.txt": "modified"}
    assert second["changes_found_by"] == "traced_walk", second
    assert _paths(second) == {"kept23": "created"}


def test_a_folder_renamed_lists_its_files_gone_and_new(big: tuple[Host, Path]) -> None:
    host, ws = big
    (ws / "five").mkdir()
    for i in range(5):
        (ws / "five" / f"{i}.txt").write_text(str(i))
    body = _bash(host, "mv five data/five")
    assert _paths(body) == {**{f"five/{i}.txt": "deleted" for i in range(5)},
                            **{f"data/five/{i}.txt": "created" for i in range(5)}}
    many = _bash(host, "mv data/d020 data/moved20")
    assert len(many["changes"]) == 200 and many["changes_truncated"]


# ------------------------------------------------------------------ without tracing


@pytest.mark.parametrize("switch", ["env", "argument"])
def test_without_tracing_the_workspace_is_compared_before_and_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, switch: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _fill(ws, 2_000)
    if switch == "env":
        monkeypatch.setenv("HOST_KERNEL_FAKE_NO_TRACE", "1")
    with Host(ws, trace=switch != "argument") as host:
        assert host.tracing["status"] != "seccomp"
        assert _bash(host, "true")["changes"] == []
        # (the command waits out SETTLED_NS after its write, so the hash the Host takes at
        # its end is one it may remember: host/_workspace.py ``settled``)
        body = _bash(host, "echo x >> data/d005/f0003.txt && rm data/d006/f0000.txt && "
                           "sleep 0.1")
        assert body["changes_found_by"] == "snapshot"
        assert _paths(body) == {"data/d005/f0003.txt": "modified",
                                "data/d006/f0000.txt": "deleted"}
        assert "traced" not in body
        # The bytes a file had are in the manifest once the Host has hashed them.
        again = _bash(host, "touch data/d005/f0003.txt")
        assert _manifest(host, again) == {"data/d005/f0003.txt": _sha(b"5,3\nx\n")}
        # A change no stat shows (same size and times) is still caught through ctime.
        hidden = _bash(host, "python3 -c \"import os; p='data/d007/f0000.txt'; "
                             "st=os.stat(p); open(p,'r+b').write(b'Q'*st.st_size); "
                             "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\"")
        assert _paths(hidden) == {"data/d007/f0000.txt": "modified"}
        # Untraced, a file the Host never hashed and whose size did not change may hold
        # the bytes it had: listed as unproven, so it backs no claim (a touch is not work).
        assert hidden["changes_unproven"] == ["data/d007/f0000.txt"]
        assert again["changes_unproven"] == []
        touched = _bash(host, "touch data/d008/f0000.txt")
        assert touched["changes_unproven"] == ["data/d008/f0000.txt"]
        # A file written in the moment before the Host hashed it is hashed, not remembered:
        # a rewrite in the same clock tick could keep its key. What it held before the
        # next command is then unproven, not named. (Every file counts as that fresh here,
        # however slow the machine is.)
        monkeypatch.setattr(_workspace, "SETTLED_NS", 3600 * 10**9)
        _bash(host, "echo y >> data/d009/f0000.txt")
        fresh = _bash(host, "touch data/d009/f0000.txt")
        assert _manifest(host, fresh) == {}
        assert fresh["changes_unproven"] == ["data/d009/f0000.txt"]


# ------------------------------------------------------------------ when the trace is short


@pytest.mark.parametrize(("dropped", "error"), [(3, None), (0, "pid 7 went untraced")])
def test_dropped_or_untraced_accesses_fall_back_to_a_walk_that_keeps_every_change(
        tmp_path: Path, dropped: int, error: str | None) -> None:
    ws = Workspace(tmp_path, tmp_path / ".record")
    start = __import__("time").time_ns() - 1_000_000_000
    (tmp_path / "old.txt").write_text("old")
    os.utime(tmp_path / "old.txt", ns=(start - 10**9, start - 10**9))
    (tmp_path / "seen.txt").write_text("seen")
    (tmp_path / "unseen.txt").write_text("unseen")
    seen = TracedAccess(changed={"seen.txt": {WROTE}}, dropped=dropped, error=error,
                        others=["unseen.txt"])
    found = after_trace(ws, seen, {}, start)
    assert found.method == "traced_walk" and found.reason
    # old.txt's change time is now too (utime sets it): it is listed as well.
    assert {c["path"] for c in found.changes} == {"old.txt", "seen.txt", "unseen.txt"}
    assert found.by_others == []


def test_a_trace_naming_only_a_symlink_walks_and_attributes_others_writes_to_them(
        tmp_path: Path) -> None:
    ws = Workspace(tmp_path, tmp_path / ".record")
    start = __import__("time").time_ns() - 1_000_000_000
    (tmp_path / "target.txt").write_text("t")
    (tmp_path / "cell.txt").write_text("c")
    seen = TracedAccess(changed={"gone-link": {WROTE}, "moved": {MOVED_IN}},
                        others=["cell.txt"])
    found = after_trace(ws, seen, {}, start)
    assert found.method == "traced_walk"
    assert {c["path"] for c in found.changes} == {"target.txt"}
    assert found.by_others == ["cell.txt"]


# ------------------------------------------------------------------ before-states


def _backs(host: Host, ws: Path, rel: str) -> bool:
    """Whether a claim of ``rel`` would be backed: the verifier's own reading of the record
    (the session's last production of the path) equals the file's bytes now."""
    assert host.blobs is not None
    view = RecordView(host.ledger, host.blobs, host.session_id)
    return view.written.get(rel) == _sha((ws / rel).read_bytes())


def _change(body: dict[str, Any], rel: str) -> dict[str, Any]:
    return next(c for c in body["changes"] if c["path"] == rel)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, Path]]:
    """A traced session over a small workspace; each test makes its own files in it from
    outside the Host (the Host never hashed them)."""
    ws = tmp_path_factory.mktemp("plain") / "ws"
    ws.mkdir()
    with Host(ws) as host:
        assert host.tracing == {"status": "seccomp"}, host.tracing
        yield host, ws


@pytest.mark.parametrize("command", [
    "touch same.txt",
    "sed -i 's/absent/other/' same.txt",                      # a rename onto it, same bytes
    "cp same.txt t && mv t same.txt",                          # identical bytes moved onto it
    "python3 -c \"p='same.txt'; d=open(p,'rb').read(); open(p,'wb').write(d)\"",  # O_TRUNC
    "truncate -s 0 same.txt && printf 'made outside\\n' > same.txt",
])
def test_a_file_rewritten_with_the_bytes_it_had_backs_no_claim(
        plain: tuple[Host, Path], command: str) -> None:
    host, ws = plain
    (ws / "same.txt").write_text("made outside\n")
    body = _bash(host, command)
    assert body["changes_found_by"] == "traced"
    # modified, with the bytes it had before the command in the manifest: not its work.
    assert _change(body, "same.txt")["change"] == "modified", body
    assert _manifest(host, body)["same.txt"] == _sha(b"made outside\n")
    assert not _backs(host, ws, "same.txt")


def test_a_real_change_by_rename_is_modified_with_the_bytes_it_had_before(
        plain: tuple[Host, Path]) -> None:
    host, ws = plain
    (ws / "real.txt").write_text("old\n")
    body = _bash(host, "printf 'new\\n' > t && mv t real.txt")
    assert _paths(body) == {"real.txt": "modified"}
    assert _change(body, "real.txt")["sha256"] == _sha(b"new\n")
    assert _manifest(host, body) == {"real.txt": _sha(b"old\n")}
    assert body["changes_unproven"] == [] and _backs(host, ws, "real.txt")


def test_a_new_file_is_created_and_backs_a_claim(plain: tuple[Host, Path]) -> None:
    host, ws = plain
    body = _bash(host, "mkdir -p fresh && echo hi > fresh/new.txt")
    assert _paths(body) == {"fresh/new.txt": "created"}
    assert _manifest(host, body) == {} and _backs(host, ws, "fresh/new.txt")


def test_a_file_over_the_hashing_bound_backs_a_claim_only_when_its_size_changed(
        plain: tuple[Host, Path]) -> None:
    host, ws = plain
    with open(ws / "large.bin", "wb") as f:
        f.truncate(HASH_LIMIT + 1)  # sparse: cheap to make, read as zeros
    touched = _bash(host, "touch large.bin")
    assert _paths(touched) == {"large.bin": "modified"}
    assert touched["changes_unproven"] == ["large.bin"] and _manifest(host, touched) == {}
    assert not _backs(host, ws, "large.bin")
    grown = _bash(host, "echo more >> large.bin")
    assert _paths(grown) == {"large.bin": "modified"} and grown["changes_unproven"] == []
    assert _backs(host, ws, "large.bin")


@pytest.mark.parametrize(("setup", "command", "target"), [
    # a folder moved away and back around a first call naming the file (chmod, which is
    # not traced, sets its change time)
    ("d/p", "mv d X && mkdir d && touch d/p && rm d/p && rmdir d && chmod 600 X/p && "
            "mv X d", "d/p"),
    # the same, raced: one thread moves the folder back and forth while another opens
    ("e/p", "python3 -c \"import os, threading\n"
            "def move():\n"
            "    for _ in range(300):\n"
            "        os.rename('e', 'E'); os.rename('E', 'e')\n"
            "t = threading.Thread(target=move); t.start()\n"
            "for _ in range(300):\n"
            "    try: os.close(os.open('e/p', os.O_WRONLY | os.O_CREAT))\n"
            "    except OSError: pass\n"
            "t.join(); os.chmod('e/p', 0o600)\"", "e/p"),
    # a symlink planted in the workspace and written through, and a hard link
    ("s.txt", "ln -s s.txt l && touch l && rm l", "s.txt"),
    ("h.txt", "ln h.txt h2 && touch h2 && rm h2", "h.txt"),
    # through a descriptor and /proc/self/fd, one of them O_PATH
    ("o.txt", "exec 3<o.txt && touch /proc/self/fd/3", "o.txt"),
    ("o2.txt", "python3 -c \"import os; fd = os.open('o2.txt', os.O_PATH); "
               "open(f'/proc/self/fd/{fd}', 'a').close()\"", "o2.txt"),
    # '..' after a symlinked folder leads from its target
    ("dd/sub/keep", "ln -s dd/sub up && touch up/../../dot.txt && rm up", "dot.txt"),
])
def test_a_file_the_command_only_touched_backs_no_claim_whatever_the_route(
        plain: tuple[Host, Path], setup: str, command: str, target: str) -> None:
    host, ws = plain
    (ws / setup).parent.mkdir(parents=True, exist_ok=True)
    (ws / setup).write_text("outside\n")
    if target == "dot.txt":
        (ws / target).write_text("outside\n")
    body = _bash(host, command)
    assert (ws / target).read_text() == "outside\n"
    assert not _backs(host, ws, target), body


def test_a_file_with_a_second_name_made_elsewhere_backs_no_claim_when_touched(
        plain: tuple[Host, Path]) -> None:
    host, ws = plain
    (ws / "twin.txt").write_text("outside\n")
    os.link(ws / "twin.txt", ws / "twin2.txt")
    body = _bash(host, "touch twin2.txt")
    # Two names: its bytes could change through the other while being read, so they are
    # not hashed; same size, so it is unproven.
    assert body["changes_unproven"] == ["twin2.txt"], body
    assert not _backs(host, ws, "twin2.txt") and not _backs(host, ws, "twin.txt")


def test_a_file_the_cell_changes_while_the_command_touches_it_backs_no_claim(
        plain: tuple[Host, Path]) -> None:
    host, ws = plain
    (ws / "shared.txt").write_text("outside\n")
    text = run_ok(host, "import threading, time\n"
                        "def write():\n"
                        "    time.sleep(0.3)\n"
                        "    open('shared.txt', 'w').write('by the cell\\n')\n"
                        "t = threading.Thread(target=write); t.start()\n"
                        "r = host.bash('touch shared.txt && sleep 0.8 && touch shared.txt')\n"
                        "t.join()\nprint('receipt', r.receipt_id)")
    receipt_id = text.split("receipt ")[1].split()[0]
    rows = host.ledger.query("SELECT body FROM receipts WHERE receipt_id = ?", (receipt_id,))
    body = json.loads(rows[0]["body"])
    assert (ws / "shared.txt").read_text() == "by the cell\n"
    assert "shared.txt" in body["changes_unproven"], body
    assert not _backs(host, ws, "shared.txt")
