"""The relay zygote: kernelspec starts and restarts served by a relay forked ready-imported.

Real processes throughout: a kernel factory, a zygote, the installed kernelspec launched
through jupyter_client as a frontend launches it, confined kernels behind real relays.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import wait_for
from test_control_kernel import RelayKernel, alive, kernelspecs
from test_factory import Served

from host_kernel._launch import socket_path
from host_kernel.factory._place import DIR_ENV, FACTORY_ENV, Place
from host_kernel.host._kernel import pinned
from host_kernel.sandbox.landlock import abi_version

pytestmark = pytest.mark.skipif(
    abi_version() < 1, reason="LOUD SKIP: Landlock is not available on this kernel; the "
                              "factory serves confined sessions only, so nothing to show here")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return out


class Zygote:
    """A zygote this test started in the foreground, in the factory's folder."""

    def __init__(self, folder: Path, idle: float = 60.0) -> None:
        argv = pinned("host_kernel.control._zygote")
        argv.insert(1, "-P")  # as the launcher starts it
        self.place = Place(folder)
        self.socket = socket_path(self.place)
        self.proc = subprocess.Popen([*argv, "--foreground", "--folder", str(folder),
                                      "--idle", str(idle)], cwd="/",
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for(self.socket.exists, 60, "the zygote's socket")

    def relays(self) -> list[int]:
        return [p for p in _children(self.proc.pid) if alive(p)]

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err or ""


@pytest.fixture
def folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    f = Path(tempfile.mkdtemp(prefix="hkz-", dir="/tmp"))  # short: socket paths are short
    monkeypatch.setenv(DIR_ENV, str(f))
    monkeypatch.delenv(FACTORY_ENV, raising=False)
    try:
        yield f
    finally:
        for p in f.iterdir():
            p.unlink()
        f.rmdir()


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "sessions"
    for name in ("ws", "other"):
        (root / name).mkdir(parents=True)
    return root


@pytest.fixture
def world(folder: Path, roots: Path, tmp_path: Path) -> Iterator[tuple[Served, Zygote]]:
    factory = Served(folder, [roots], size=2)
    zygote = None
    try:
        factory.ready()
        zygote = Zygote(folder)
        with kernelspecs(tmp_path):
            yield factory, zygote
    finally:
        if zygote is not None:
            zygote.stop()
        factory.stop()


def _launcher(kernel: RelayKernel) -> int:
    return int(kernel.km.provisioner.process.pid)


def test_a_kernelspec_start_and_restart_are_forked_by_the_zygote(
        world: tuple[Served, Zygote], roots: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    factory, zygote = world
    monkeypatch.setenv("HKZ_LAUNCH_MARK", "from the launch")
    kernel = RelayKernel.start(roots / "ws")
    try:
        [relay] = zygote.relays()
        launcher = _launcher(kernel)
        assert relay != launcher and _children(launcher) == []  # the relay is the zygote's
        assert os.readlink(f"/proc/{relay}/cwd") == str(roots / "ws")
        # The forked relay is the launch's: its environment, a confined warm kernel.
        assert kernel.stdout("import os; print(os.environ['HKZ_LAUNCH_MARK'])").strip() == (
            "from the launch")
        with open(f"/proc/{relay}/environ", "rb") as f:
            assert b"HKZ_LAUNCH_MARK=from the launch" not in f.read()  # set after the fork
        assert kernel.stdout("print(host.generation)").strip() == "1"
        [first] = kernel.events("generation_started")
        assert first["warm"]["factory"] is True, first
        # Restart: a new launcher, a new fork, the same session continued.
        factory.ready()
        kernel.km.restart_kernel(now=False)
        kernel.kc.wait_for_ready(timeout=60)
        assert kernel.stdout("print(host.generation)").strip() == "2"
        wait_for(lambda: not alive(relay), 30, "the first relay to end")
        [second] = zygote.relays()
        assert second != relay and _launcher(kernel) != launcher
        with sqlite3.connect(kernel.record / "ledger.sqlite") as db:
            sessions = db.execute("SELECT DISTINCT session FROM events").fetchall()
        assert len(sessions) == 1, sessions  # continued, not a new session
    finally:
        kernel.stop()
    wait_for(lambda: zygote.relays() == [], 30, "the relay to end with its kernel")
    assert kernel.km.provisioner is None or not kernel.km.is_alive()


def test_a_killed_launcher_takes_its_relay_with_it(world: tuple[Served, Zygote],
                                                    roots: Path) -> None:
    _, zygote = world
    kernel = RelayKernel.start(roots / "ws")
    try:
        [relay] = zygote.relays()
        os.kill(_launcher(kernel), signal.SIGKILL)
        wait_for(lambda: not alive(relay), 30, "the relay to end with its launcher")
    finally:
        kernel.stop()
    assert zygote.relays() == []


def test_a_launch_that_started_otherwise_runs_its_own_relay(
        world: tuple[Served, Zygote], roots: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, zygote = world
    # PYTHONHASHSEED is read once, at the interpreter's start: a fork of the zygote would
    # not have it, so the launch is not served and its own process runs the relay.
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    kernel = RelayKernel.start(roots / "ws")
    try:
        assert zygote.relays() == []
        assert kernel.stdout("print(host.generation)").strip() == "1"
        assert _children(_launcher(kernel)), "the launcher runs the relay (and its kernel)"
    finally:
        kernel.stop()


def test_a_kernel_cannot_reach_the_zygote(world: tuple[Served, Zygote], roots: Path) -> None:
    _, zygote = world
    kernel = RelayKernel.start(roots / "ws")
    try:
        out = kernel.stdout(
            "import socket\ns = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    s.connect({str(zygote.socket)!r}); print('reached')\n"
            "except OSError as e:\n    print(type(e).__name__)")
        assert out.strip() == "FileNotFoundError", out
    finally:
        kernel.stop()


def test_garbled_and_refused_requests_leave_the_zygote_serving(
        world: tuple[Served, Zygote], roots: Path) -> None:
    _, zygote = world
    for payload in (b"not json\n", b"[1, 2]\n", json.dumps({"argv": "x"}).encode() + b"\n", b""):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(zygote.socket))
            if payload:
                socket.send_fds(s, [payload], [0, 1, 2])
            s.shutdown(socket.SHUT_WR)
            answer = s.recv(4096)
            assert b"pid" not in answer, answer
    assert zygote.relays() == []
    kernel = RelayKernel.start(roots / "ws")
    try:
        assert len(zygote.relays()) == 1
        assert kernel.stdout("print(1 + 1)").strip() == "2"
    finally:
        kernel.stop()


def test_the_zygote_exits_when_idle(folder: Path) -> None:
    zygote = Zygote(folder, idle=1.0)
    try:
        deadline = time.monotonic() + 30
        while zygote.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert zygote.proc.poll() == 0
        assert not zygote.socket.exists()
    finally:
        zygote.stop()


FRONTEND = """
import json, os, subprocess, sys
from jupyter_client import KernelManager
km = KernelManager(kernel_name="host_kernel")
km.start_kernel(cwd=sys.argv[1], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=60)
print(json.dumps({"launcher": km.provisioner.process.pid}), flush=True)
sys.stdin.read()
os._exit(0)  # the frontend dies without shutting its kernel down
"""


def test_a_relay_stops_when_its_frontend_is_gone(world: tuple[Served, Zygote],
                                                 roots: Path) -> None:
    _, zygote = world
    frontend = subprocess.Popen([sys.executable, "-c", FRONTEND, str(roots / "ws")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert frontend.stdout is not None and frontend.stdin is not None
    try:
        launcher = json.loads(frontend.stdout.readline())["launcher"]
        relays = zygote.relays()
        assert len(relays) == 1, relays
    finally:
        frontend.stdin.close()
        frontend.wait(timeout=60)
        frontend.stdout.close()
    try:
        # As a launched relay watches its frontend (JPY_PARENT_PID), the launcher does for
        # its forked relay: the relay is asked to stop, and both end.
        wait_for(lambda: not alive(relays[0]) and not alive(launcher), 30,
                 "the relay and its launcher to end with their frontend")
    finally:
        for pid in (launcher, *relays):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------- host-kernel exec


def _notebook(path: Path, *sources: str) -> Path:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    path.write_text(nbformat.writes(new_notebook(cells=[new_code_cell(s) for s in sources])))
    return path


def test_exec_is_forked_by_the_zygote_and_ends_as_it_would(
        world: tuple[Served, Zygote], roots: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``host-kernel exec`` (the console script, as a user types it): output, exit status
    and the record as a process of its own would leave them, run in a fork of the zygote."""
    _, zygote = world
    script = Path(sys.executable).with_name("host-kernel")
    if not script.exists():
        pytest.skip(f"LOUD SKIP: no console script beside {sys.executable} (not pip-installed)")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = roots / "ws"
    good = _notebook(ws / "good.ipynb", "import os\nprint('ran in', os.getcwd())")
    bad = _notebook(ws / "bad.ipynb", "raise ValueError('as planned')")
    ok = subprocess.run([str(script), "exec", str(good)], cwd=ws, capture_output=True,
                        text=True, timeout=180, stdin=subprocess.DEVNULL, check=False)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert f"ran in {ws}" in ok.stdout and "not forked" not in ok.stderr, ok
    failed = subprocess.run([str(script), "exec", str(bad)], cwd=ws, capture_output=True,
                            text=True, timeout=180, stdin=subprocess.DEVNULL, check=False)
    assert failed.returncode == 1, failed
    assert "ValueError" in failed.stdout + failed.stderr
    log = zygote.stop()
    assert log.count("for cli") == 2, log


def test_exec_with_a_group_given_up_is_not_forked(
        world: tuple[Served, Zygote], roots: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork runs with the zygote's rights: a launch that gave up its groups (as
    ``setpriv --clear-groups`` does) would get them back in it, so it runs itself."""
    _, zygote = world
    script = Path(sys.executable).with_name("host-kernel")
    if not script.exists():
        pytest.skip(f"LOUD SKIP: no console script beside {sys.executable} (not pip-installed)")
    if os.geteuid() != 0:
        pytest.skip("LOUD SKIP: giving up groups needs root here")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = roots / "ws"
    nb = _notebook(ws / "groups.ipynb", "import os\nprint('groups', os.getgroups())")
    out = subprocess.run([str(script), "exec", str(nb)], cwd=ws, capture_output=True,
                         text=True, timeout=180, stdin=subprocess.DEVNULL, check=False,
                         preexec_fn=lambda: os.setgroups([4242]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "not forked" in out.stderr and "Groups" in out.stderr, out.stderr
    log = zygote.stop()
    assert "for cli" not in log and "Groups" in log, log


GIVES_UP = """
import json, os, socket, sys
from host_kernel._launch import read_line, startup
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
request = {"entry": "control", "argv": ["-f", "/nonexistent/kernel.json"], "argv0": "x",
           "cwd": os.getcwd(), "env": dict(os.environ), "umask": 0o22, "path": sys.path,
           "executable": sys.executable, "startup": startup()}
socket.send_fds(sock, [json.dumps(request).encode() + b"\\n"], [0, 1, 2])
data, fds = read_line(sock)
print(json.loads(data)["pid"], flush=True)
sock.close()  # gives up before saying go
"""


def test_a_launch_that_gives_up_before_go_leaves_no_fork_running(
        world: tuple[Served, Zygote], tmp_path: Path) -> None:
    """The fork waits for the launching process's go: one that gave up (and runs its own
    relay) never has a second one beside it."""
    _, zygote = world
    done = subprocess.run([sys.executable, "-P", "-c", GIVES_UP, str(zygote.socket)],
                          capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    child = int(done.stdout.split()[0])
    wait_for(lambda: not alive(child), 30, "the fork to be killed")
    assert zygote.relays() == []
    assert f"killed {child} for control" in zygote.stop()
