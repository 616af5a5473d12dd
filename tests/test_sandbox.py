"""The sandbox's init process on its own: hello, commands offered ahead or forked on request,
signals, exits, and everything gone when the Host's end closes.

A real init process is started here the way jupyter_client starts it (its own
session, the control socket passed by descriptor), with ``sleep`` in place of
the kernel.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_kernel.sandbox.client import Sandbox, popen_confined
from host_kernel.sandbox.landlock import abi_version
from host_kernel.sandbox.policy import Policy

pytestmark = pytest.mark.skipif(abi_version() < 1, reason="LANDLOCK UNAVAILABLE ON THIS MACHINE")


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[tuple[Sandbox, Path, subprocess.Popen[bytes]]]:
    ws, private = tmp_path / "ws", tmp_path / "private"
    ws.mkdir()
    private.mkdir()
    box = Sandbox(Policy.for_session(ws, private, [tmp_path / "record"]), abi_version())
    launcher = subprocess.Popen(box.argv(["sleep", "600"]), pass_fds=box.pass_fds,
                                start_new_session=True)
    try:
        hello = box.started()
        assert hello["hello"] is True
        yield box, ws, launcher
    finally:
        box.close()
        try:
            launcher.wait(timeout=10)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()


def _run(box: Sandbox, ws: Path, *argv: str) -> tuple[int, bytes, bytes]:
    proc = popen_confined(box, list(argv), cwd=str(ws), env={"PATH": os.defpath})
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        out, err = proc.stdout.read(), proc.stderr.read()
    return proc.wait(timeout=10), out, err


def test_commands_run_confined_whether_offered_or_forked_on_request(sandbox) -> None:  # type: ignore[no-untyped-def]
    box, ws, _ = sandbox
    time.sleep(0.2)  # let init's offer arrive: this one takes the waiting process
    code, out, _ = _run(box, ws, "sh", "-c", "echo $$; touch in-ws; touch /tmp/hk-sandbox-x")
    assert code != 0 and (ws / "in-ws").exists() and not Path("/tmp/hk-sandbox-x").exists()
    assert 1 < int(out.split()[0]) < 1000  # a pid of the sandbox's own namespace
    # two at once: the second finds nothing waiting, and init forks it on request
    first = popen_confined(box, ["sleep", "0.3"], cwd=str(ws), env={"PATH": os.defpath})
    code, out, _ = _run(box, ws, "sh", "-c", "echo second")
    assert (code, out) == (0, b"second\n")
    assert first.wait(timeout=10) == 0
    for stream in (first.stdout, first.stderr):
        assert stream is not None
        stream.close()


def test_a_commands_group_is_killed_and_its_exit_reported(sandbox) -> None:  # type: ignore[no-untyped-def]
    box, ws, _ = sandbox
    proc = popen_confined(box, ["sh", "-c", "sleep 30 & sleep 30"], cwd=str(ws),
                          env={"PATH": os.defpath})
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.3)
    assert proc.poll() is None
    proc.kill_group(signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert proc.stdout is not None and proc.stdout.read() == b""  # the background sleep died too
    for stream in (proc.stdout, proc.stderr):
        assert stream is not None
        stream.close()


def test_a_missing_program_is_exit_127_with_a_reason(sandbox) -> None:  # type: ignore[no-untyped-def]
    box, ws, _ = sandbox
    code, _, err = _run(box, ws, "no-such-program-hk")
    assert code == 127 and b"cannot start" in err


def test_closing_the_hosts_end_takes_the_whole_sandbox_down(sandbox) -> None:  # type: ignore[no-untyped-def]
    box, ws, launcher = sandbox
    proc = popen_confined(box, ["sleep", "60"], cwd=str(ws), env={"PATH": os.defpath})
    box.close()
    assert launcher.wait(timeout=10) != 0
    assert proc.wait(timeout=10) == -signal.SIGKILL  # EOF on its status: init is gone
    for stream in (proc.stdout, proc.stderr):
        assert stream is not None
        assert stream.read() == b""
        stream.close()


def test_init_does_not_wait_for_an_offered_process_to_confine_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While the next command's process confines itself (Landlock, the tracing filter),
    init goes on serving; it hands the offer to the Host once it holds the listener."""
    import marshal
    import select
    import socket

    from host_kernel.sandbox import init
    from host_kernel.sandbox.init import recv_with_fds

    class Supervisor:  # what init's spawner asks of trace.Supervisor here
        def add(self, listener: int, source: int) -> None:
            raise AssertionError("this child sends no listener")

        def bump(self) -> None:
            pass

    def slow_child(orders: socket.socket, rulesets: list[int], handoff: socket.socket) -> None:
        time.sleep(2.0)  # a slow confinement; then no filter, said as init hears it said
        handoff.send(marshal.dumps({"error": "seccomp filter refused: slow test child"}))
        os._exit(0)

    monkeypatch.setattr(init, "_await_orders", slow_child)
    host_end, ctl = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    spawner = init._Spawner(ctl, -1, supervisor=Supervisor())
    started = time.monotonic()
    spawner.offer()
    try:
        assert time.monotonic() - started < 1.5  # back to its loop, the child still busy
        assert spawner._pending is not None and spawner.offered == spawner._pending[0]
        host_end.setblocking(False)
        with pytest.raises(BlockingIOError):
            host_end.recv(4096)  # nothing offered to the Host yet
        assert select.select([spawner._pending[1]], [], [], 10)[0]
        spawner._offer_listened()
        host_end.setblocking(True)
        data, fds = recv_with_fds(host_end, 4096, 2)
        assert marshal.loads(data) == {"ready": spawner.offered} and len(fds) == 2
        assert spawner.trace_error == "seccomp filter refused: slow test child"
        for fd in fds:
            os.close(fd)
    finally:
        os.waitpid(spawner.offered or -1, 0)
        for sock in (host_end, ctl, *spawner.children.values()):
            sock.close()
