"""Commands asked for one right after another each start confined and traced, under their
own pid, with the exit the Host observes.

The sandbox's init forks the next command's process ahead of time; a request that
arrives while that process is still confining itself gets another fork on request
(host_kernel/sandbox/init.py). These tests start commands back to back, where both
happen, and check what must not change: confinement, tracing by the command's own
pid, the exit status, a group kill, and the receipt's executable.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import run_ok

from host_kernel import Host
from host_kernel.sandbox.client import Sandbox, popen_confined
from host_kernel.sandbox.landlock import abi_version
from host_kernel.sandbox.policy import Policy

pytestmark = pytest.mark.skipif(abi_version() < 1, reason="LANDLOCK UNAVAILABLE ON THIS MACHINE")

ROUNDS = 12


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[Sandbox, Path]]:
    """A traced sandbox, started as the Host starts one, with ``sleep`` as its kernel."""
    ws, private = tmp_path / "ws", tmp_path / "private"
    ws.mkdir()
    private.mkdir()
    box = Sandbox(Policy.for_session(ws, private, [tmp_path / "record"]), abi_version(),
                  trace_roots=[str(ws)])
    launcher = subprocess.Popen(box.argv(["sleep", "600"]), pass_fds=box.pass_fds,
                                start_new_session=True)
    try:
        box.started()
        if not box.traced:
            pytest.skip(f"tracing unavailable here: {box.hello}")
        yield box, ws
    finally:
        box.close()
        try:
            launcher.wait(timeout=10)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()


def _run(box: Sandbox, ws: Path, script: str) -> tuple[int, int, bytes]:
    proc = popen_confined(box, ["sh", "-c", script], cwd=str(ws), env={"PATH": os.defpath})
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        out = proc.stdout.read()
        proc.stderr.read()
    return proc.wait(timeout=10), proc.pid, out


def test_back_to_back_commands_are_each_confined_and_traced_under_their_own_pid(
        traced: tuple[Sandbox, Path]) -> None:
    box, ws = traced
    (ws / "in.txt").write_text("x")
    pids = []
    for i in range(ROUNDS):
        code, pid, out = _run(box, ws, f"cat in.txt; echo $$; touch out-{i}; "
                                       f"touch /tmp/hk-floor-{i} 2>/dev/null; exit {i % 5}")
        assert code == i % 5
        assert out.startswith(b"x") and int(out[1:].split()[0]) == pid
        assert 1 < pid < 1000  # a pid of the sandbox's own namespace
        assert (ws / f"out-{i}").exists() and not Path(f"/tmp/hk-floor-{i}").exists()
        pids.append(pid)
        accesses, _, error, _ = box.collect_trace()
        assert error is None
        mine = {(a[2], a[3]) for a in accesses if a[1] == pid}
        assert ("r", str(ws / "in.txt")) in mine and any(
            path == str(ws / f"out-{i}") for _, path in mine)
    assert len(set(pids)) == ROUNDS


def test_a_command_killed_as_soon_as_it_starts_dies_with_its_group(
        traced: tuple[Sandbox, Path]) -> None:
    box, ws = traced
    for _ in range(4):
        assert _run(box, ws, "true")[0] == 0
        proc = popen_confined(box, ["sh", "-c", "sleep 30 & sleep 30"], cwd=str(ws),
                              env={"PATH": os.defpath})
        proc.kill_group(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None
            assert stream.read() == b""  # the background sleep died too
            stream.close()


def test_receipts_of_back_to_back_calls_carry_the_observed_exit_and_executable(
        host: Host) -> None:
    sh = os.path.realpath(shutil.which("sh") or "/bin/sh")
    sha = hashlib.sha256(Path(sh).read_bytes()).hexdigest()
    text = run_ok(host, "for i in range(8):\n"
                        "    r = host.bash(f'sh -c \"exit {i}\"')\n"
                        "    print(r.exit_status, end=' ')")
    assert text.split() == [str(i) for i in range(8)]
    rows = host.ledger.query("SELECT body FROM receipts")
    bodies = [json.loads(r["body"]) for r in rows]
    assert sorted(b["exit_status"] for b in bodies) == list(range(8))
    assert {(b["executable"], b["executable_sha256"]) for b in bodies} == {(sh, sha)}
    if host.confinement is not None and host.confinement.active:
        assert all(b.get("traced") is not None for b in bodies)
