"""The seccomp tracer on its own: a real filter, a real child process, the real supervisor.

No kernel and no Host: a forked child installs the filter, hands its listener
over, and execs a small Python program; this process serves the listener with
:class:`~host_kernel.sandbox.trace.Supervisor` until the child exits.
"""

from __future__ import annotations

import errno
import os
import select
from pathlib import Path
from typing import Any

import pytest
from _tracing_helpers import filtered_python

from host_kernel.sandbox import trace

pytestmark = pytest.mark.skipif(trace.unavailable() is not None,
                                reason=f"OS-level tracing cannot run here: {trace.unavailable()}")


def _traced_run(code: str, cwd: Path, roots: list[str], *, limit: int = 200_000,
                serve: bool = True, source: int = 0,
                before: list[tuple[Any, ...]] | None = None,
                ) -> tuple[list[tuple[Any, ...]], int, str]:
    """Run ``python -c code`` in ``cwd`` under the filter; (accesses, dropped, stdout).
    With ``before``, the before-states recorded (for a ``source`` other than 0) are
    appended to it."""
    pid, listener, out_r = filtered_python(code, cwd)
    supervisor = trace.Supervisor(roots, limit=limit)
    supervisor.add(listener, source)
    if not serve:
        supervisor.close()  # nobody answers: every watched call must fail, not run unseen
    poller = select.poll()
    poller.register(out_r, select.POLLIN)
    if serve:
        poller.register(listener, select.POLLIN)
    out = b""
    while True:
        for fd, mask in poller.poll(10_000):
            if fd == out_r:
                data = os.read(out_r, 65536)
                if not data:
                    os.close(out_r)
                    os.waitpid(pid, 0)
                    accesses, dropped = supervisor.take()
                    if before is not None:
                        before.extend(supervisor.take_before())
                    supervisor.close()
                    return accesses, dropped, out.decode()
                out += data
            elif not (mask & select.POLLIN and supervisor.serve(fd)):
                poller.unregister(fd)
                supervisor.remove(fd)


def _kinds(accesses: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [a[2:] for a in accesses]


def test_reads_writes_renames_links_and_removes_are_seen_with_resolved_paths(
        tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "a.csv").write_text("x\n")
    code = ("import os\n"
            "open('data/a.csv').read()\n"
            "open('out.tmp', 'w').write('y')\n"
            "os.replace('out.tmp', 'out.txt')\n"
            "os.link('out.txt', 'copy.txt')\n"
            "os.unlink('copy.txt')\n"
            "os.chdir('data')\n"
            "fd = os.open('a.csv', os.O_RDONLY); os.close(fd)\n"
            "d = os.open('.', os.O_RDONLY | os.O_DIRECTORY)\n"
            "fd = os.open('a.csv', os.O_RDWR, dir_fd=d); os.close(fd)\n"
            "open('/etc/hostname').read()\n")
    accesses, dropped, _ = _traced_run(code, ws, [str(ws)])
    root = str(ws)
    seen = _kinds(accesses)
    assert (trace.READ, f"{root}/data/a.csv") in seen
    assert (trace.WRITE, f"{root}/out.tmp") in seen
    assert (trace.RENAME, f"{root}/out.tmp", f"{root}/out.txt") in seen
    assert (trace.LINK, f"{root}/out.txt", f"{root}/copy.txt") in seen
    assert (trace.REMOVE, f"{root}/copy.txt") in seen
    assert (trace.READ_WRITE, f"{root}/data/a.csv") in seen  # through the dir_fd
    assert not any("/etc/hostname" in a[3] for a in accesses)  # outside the roots
    assert dropped == 0
    firsts = accesses[:len(set(map(tuple, seen)))]  # later sightings come after the firsts
    assert [a[0] for a in firsts] == sorted(a[0] for a in firsts)  # stamped in call order


def test_a_command_records_each_paths_state_before_its_first_change_only(
        tmp_path: Path) -> None:
    import hashlib

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "kept.txt").write_text("before\n")
    (ws / "moved.txt").write_text("moved\n")
    (ws / "target").write_text("t\n")
    os.symlink("target", ws / "link")
    with open(ws / "large.bin", "wb") as f:
        f.truncate(trace.HASH_LIMIT + 1)
    code = ("import os\n"
            "open('kept.txt', 'w').write('after\\n')\n"   # truncated: hashed before
            "open('kept.txt', 'w').write('again\\n')\n"   # not its first: no new state
            "open('new.txt', 'w').close()\n"
            "os.rename('moved.txt', 'kept.txt')\n"
            "open('link', 'a').close()\n"                 # followed: the target's state
            "open('large.bin', 'r+b').close()\n"
            "open('read.txt', 'w').close(); open('read.txt').read()\n")
    before: list[tuple[Any, ...]] = []
    _traced_run(code, ws, [str(ws)], source=7, before=before)
    states = {b[2][len(str(ws)) + 1:]: b for b in before}
    assert all(b[1] == 7 for b in before)
    assert [b[0] for b in before] == sorted(b[0] for b in before)
    assert set(states) == {"kept.txt", "new.txt", "moved.txt", "target", "large.bin",
                           "read.txt"}
    kept = states["kept.txt"]
    assert kept[3] == trace.FILE and kept[4] == len("before\n")
    assert kept[8] == hashlib.sha256(b"before\n").hexdigest()
    assert states["new.txt"][3] == trace.MISSING and states["new.txt"][8] is None
    assert states["moved.txt"][8] == hashlib.sha256(b"moved\n").hexdigest()
    assert states["target"][8] == hashlib.sha256(b"t\n").hexdigest()
    large = states["large.bin"]
    assert large[3] == trace.FILE and large[4] == trace.HASH_LIMIT + 1 and large[8] is None
    # The kernel's own tree (source 0) gets none.
    kernel: list[tuple[Any, ...]] = []
    _traced_run("open('target', 'w').close()", ws, [str(ws)], before=kernel)
    assert kernel == []


def test_a_file_read_many_times_is_held_twice_at_most_and_a_flood_is_counted(
        tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    code = ("for i in range(500):\n    open('a.txt').read()\n"
            "for i in range(50):\n    open(f'n{i}', 'w').close()\n")
    accesses, dropped, _ = _traced_run(code, tmp_path, [str(tmp_path)], limit=20)
    reads = [a for a in accesses if a[3].endswith("/a.txt")]
    assert len(reads) == 2 and reads[0][0] < reads[1][0]  # the first and the latest
    assert len(accesses) == 20 + 1  # the bound, plus a.txt's latest sighting
    assert dropped == 50 + 1 - 20


def test_a_child_of_the_traced_process_is_traced_too(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("x")
    code = ("import subprocess, sys\n"
            "subprocess.run([sys.executable, '-I', '-S', '-c', \"open('b.txt').read()\"],"
            " check=True)\n")
    accesses, _, _ = _traced_run(code, tmp_path, [str(tmp_path)])
    assert (trace.READ, f"{tmp_path}/b.txt") in _kinds(accesses)


def test_io_uring_is_refused_and_nothing_runs_unseen_without_a_supervisor(
        tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("x")
    code = ("import ctypes, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.syscall(425, 1, None), ctypes.get_errno())\n")
    _, _, out = _traced_run(code, tmp_path, [str(tmp_path)])
    assert out.split() == ["-1", str(errno.ENOSYS)]  # 425 is io_uring_setup on both machines
    # With the listener closed, the interpreter cannot even open its own files: it dies
    # at start instead of running with its opens unseen.
    _, _, out = _traced_run("print('ran')", tmp_path, [str(tmp_path)], serve=False)
    assert "ran" not in out
