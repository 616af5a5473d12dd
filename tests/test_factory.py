"""The per-user kernel factory: standbys kept across processes, handed to one session each.

Each test serves a real factory process (``python -m host_kernel.factory``) in a
folder of its own, with real confined standby kernels, and drives it through real
Hosts or the Host's own client. What is shown: a session starts warm from it; no
standby goes to two sessions; one refused or let go is never handed out again; a
kernel cannot reach its socket; it exits when idle and when the last session ends;
and a factory that is dead, stopped or missing never blocks a session.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import run_ok, wait_for

from host_kernel import Host
from host_kernel._procs import pid_alive
from host_kernel.factory._client import FactoryPool
from host_kernel.factory._place import DIR_ENV, FACTORY_ENV, Place
from host_kernel.host._kernel import pinned
from host_kernel.sandbox.landlock import abi_version

pytestmark = pytest.mark.skipif(
    abi_version() < 1, reason="LOUD SKIP: Landlock is not available on this kernel; the "
                              "factory serves confined sessions only, so nothing to show here")


def _imported_beneath_temp() -> list[str]:
    """Folders this process imports from beneath the temp root (pytest puts the tests'
    folders on the path; in CI the checkout lies under /tmp), less the interpreter's.

    A session's rules let its kernel read what its Host imports from; a factory serving
    only ``roots`` would not grant those (the temp root is hidden), and the Host would
    rightly start cold (``uncovered``). A factory with the default roots (home, temp)
    grants them; these tests give narrow roots, so they add these."""
    temp = ("/tmp/", tempfile.gettempdir().rstrip("/") + "/")
    return [p for p in dict.fromkeys(sys.path) if p and os.path.isdir(p)
            and p.startswith(temp) and not p.startswith(sys.prefix)]


class Served:
    """A factory process this test started, and its folder."""

    def __init__(self, folder: Path, roots: list[Path], size: int = 1,
                 idle: float = 120.0) -> None:
        roots = [*roots, *map(Path, _imported_beneath_temp())]
        self.place = Place(folder)
        self.proc = subprocess.Popen(
            [*pinned("host_kernel.factory._server"), "--foreground", "--folder", str(folder),
             "--size", str(size), "--idle", str(idle),
             *(arg for r in roots for arg in ("--root", str(r)))],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def hello(self) -> dict[str, object]:
        factory, why = FactoryPool.reach(start=False, place=self.place)
        assert factory is not None, why
        try:
            return factory.hello
        finally:
            factory.close()

    def ready(self, waiting: int = 1) -> dict[str, object]:
        """Wait until ``waiting`` standbys wait, ready; the hello then."""
        wait_for(lambda: self.place.socket.exists(), 30, "the factory's socket")
        deadline = time.monotonic() + 90
        while True:
            hello = self.hello()
            if int(hello["waiting"]) >= waiting and all(  # type: ignore[call-overload]
                    (Path(f) / "standby-ready").exists() for f in self.folders()):
                return hello
            assert time.monotonic() < deadline, f"no standby ready: {hello}"
            time.sleep(0.05)

    def folders(self) -> list[str]:
        return [str(f) for f in self.hello()["folders"]]  # type: ignore[attr-defined]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "sessions"
    (root / "ws").mkdir(parents=True)
    return root


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    f = tmp_path / "factory"
    f.mkdir(mode=0o700)
    monkeypatch.setenv(DIR_ENV, str(f))
    monkeypatch.delenv(FACTORY_ENV, raising=False)
    return f


@pytest.fixture
def served(folder: Path, roots: Path) -> Iterator[Served]:
    factory = Served(folder, [roots])
    try:
        factory.ready()
        yield factory
    finally:
        factory.stop()


def _warm(host: Host) -> dict[str, object]:
    assert host.ledger is not None
    [row] = host.ledger.query("SELECT body FROM events WHERE kind = 'generation_started' "
                              "AND session = ? ORDER BY seq LIMIT 1", (host.session_id,))
    return dict(json.loads(row["body"])["warm"])


def _take(place: Place, workspace: Path) -> tuple[FactoryPool, object, str | None]:
    factory, why = FactoryPool.reach(start=False, place=place)
    assert factory is not None, why
    standby, why = factory.serve(workspace=str(workspace), confined=True, traced=True,
                                 hidden=frozenset(), limits=None, wait=60)
    return factory, standby, why


def _spawned_factory(place: Place) -> int | None:
    """The pid of a factory a Host started in ``place``, once it answers."""
    try:
        wait_for(lambda: place.socket.exists(), 30, "the spawned factory's socket")
        factory, _ = FactoryPool.reach(start=False, place=place)
    except AssertionError:
        return None
    if factory is None:
        return None
    factory.close()
    return factory.pid


def _end(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    wait_for(lambda: not pid_alive(pid), 30, "the spawned factory to exit")


# ---------------------------------------------------------------------- warm from it


def test_a_session_starts_warm_from_the_factory_and_runs_as_a_cold_one(
        served: Served, roots: Path) -> None:
    with Host(roots / "ws") as host:
        warm = _warm(host)
        assert warm["factory"] is True and warm["used"] is True, warm
        assert warm["pool"] == served.hello()["id"]
        assert run_ok(host, "print(6 * 7)").strip() == "42"
        # The kernel is the factory's child's, yet this Host interrupts and restarts it.
        started = time.monotonic()
        result = host.execute("import time; time.sleep(60)", timeout=1.0)
        assert time.monotonic() - started < 30
        assert result.status == "timeout" and "interrupted" in result.text, result.text
        assert run_ok(host, "print('after')").strip() == "after"
        first = host.kernel_pid
        host.restart()
        assert host.kernel_pid != first
        assert first is not None
        wait_for(lambda: not pid_alive(first), 30, "the adopted kernel to end at restart")
        assert run_ok(host, "print(host.generation)").strip() == "2"


def test_no_standby_is_handed_to_two_sessions(folder: Path, roots: Path) -> None:
    factory = Served(folder, [roots], size=2)
    taken: list[tuple[FactoryPool, object, str | None]] = []
    try:
        factory.ready(waiting=2)
        threads = [threading.Thread(target=lambda: taken.append(_take(factory.place,
                                                                      roots / "ws")))
                   for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        got = [s for _, s, _ in taken if s is not None]
        assert len(taken) == 4 and len(got) >= 2
        pids = [s.manager.provisioner.process.pid for s in got]  # type: ignore[attr-defined]
        folders = [s.folder for s in got]  # type: ignore[attr-defined]
        assert len(set(pids)) == len(pids) and len(set(folders)) == len(folders)
        assert factory.hello()["stats"]["handed_out"] == len(got)  # type: ignore[index]
    finally:
        for lease, standby, _ in taken:
            if standby is not None:
                standby.close()  # type: ignore[attr-defined]
            lease.close()
        factory.stop()


def test_a_standby_let_go_or_refused_is_never_handed_out_again(
        served: Served, roots: Path, tmp_path: Path) -> None:
    lease, standby, why = _take(served.place, roots / "ws")
    assert standby is not None, why
    first = standby.manager.provisioner.process.pid  # type: ignore[attr-defined]
    # The taker lets it go without using it: it goes with the taker's descriptors.
    standby.stop()  # type: ignore[attr-defined]
    lease.close()
    wait_for(lambda: not pid_alive(first), 30, "the let-go standby to end")
    # A session the factory cannot serve takes nothing.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    lease, nothing, why = _take(served.place, outside)
    lease.close()
    assert nothing is None and "outside the factory's folders" in str(why)
    assert served.hello()["stats"]["handed_out"] == 1  # type: ignore[index]
    served.ready()
    with Host(roots / "ws") as host:
        assert _warm(host)["used"] is True
        assert host.kernel_pid != first
    assert served.hello()["stats"]["handed_out"] == 2  # type: ignore[index]


def test_a_session_the_factory_cannot_serve_starts_cold_and_says_why(
        served: Served, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with Host(outside) as host:
        warm = _warm(host)
        assert warm["used"] is False and "outside the factory's folders" in str(warm["reason"])
        assert run_ok(host, "print(1)").strip() == "1"
    assert served.hello()["stats"]["handed_out"] == 0  # type: ignore[index]


# ---------------------------------------------------------------------- its socket


CONNECT = """
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    s.connect({path!r})
    s.send(b'{{"op": "take", "workspace": "/", "confined": true, "traced": true}}')
    print("reply", s.recv(65536))
except OSError as exc:
    print("refused", type(exc).__name__)
"""


def test_a_kernel_cannot_reach_the_factorys_socket(served: Served, roots: Path) -> None:
    path = str(served.place.socket)
    with Host(roots / "ws") as host:
        out = run_ok(host, CONNECT.format(path=path))
        assert out.split() == ["refused", "FileNotFoundError"], out
    # Even shown to the kernel (its folder made readable), the factory refuses the
    # sandbox's process: it is in another mount namespace.
    served.ready()
    with Host(roots / "ws", read_paths=[str(served.place.folder)]) as host:
        out = run_ok(host, CONNECT.format(path=path))
        assert out.startswith("reply") and "another mnt namespace" in out, out
        assert '"ok": true' not in out
    assert served.hello()["stats"]["handed_out"] == 2  # type: ignore[index]


def test_a_folder_others_may_enter_is_not_used(folder: Path, roots: Path) -> None:
    folder.chmod(0o755)
    factory, why = FactoryPool.reach(start=True, place=Place(folder))
    assert factory is None and "may be entered by other users" in str(why)
    assert not list(folder.iterdir())


# ---------------------------------------------------------------------- its life


def test_the_factory_exits_when_idle_and_when_the_last_session_ends(
        folder: Path, roots: Path) -> None:
    factory = Served(folder, [roots], idle=3.0)
    try:
        factory.ready()
        with Host(roots / "ws") as host:
            assert _warm(host)["used"] is True
            waiting = factory.ready()["folders"]
            time.sleep(4.0)  # past its idle time, with a session attached: it stays
            assert factory.proc.poll() is None
            assert run_ok(host, "print('still')").strip() == "still"
        factory.proc.wait(timeout=30)  # the last session ended: it goes
        assert not factory.place.socket.exists()
        assert waiting and not any(Path(f).exists() for f in waiting), \
            "its standbys' folders are gone with it"
    finally:
        factory.stop()
    # With no session at all it goes too.
    alone = Served(folder, [roots], idle=0.5)
    try:
        alone.proc.wait(timeout=60)
    finally:
        alone.stop()


def test_a_missing_factory_is_started_for_the_next_session(folder: Path, roots: Path) -> None:
    place = Place(folder)
    pid = None
    try:
        with Host(roots / "ws") as host:
            warm = _warm(host)
            assert warm["used"] is False and "starting now" in str(warm["reason"])
            pid = _spawned_factory(place)
        assert pid is not None
        wait_for(lambda: _waiting(place) >= 1, 90, "a standby in the spawned factory")
        with Host(roots / "ws") as host:
            assert _warm(host)["used"] is True
    finally:
        _end(pid)


def _waiting(place: Place) -> int:
    factory, _ = FactoryPool.reach(start=False, place=place)
    if factory is None:
        return 0
    factory.close()
    return int(factory.hello["waiting"])


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_dead_or_hung_factory_never_blocks_a_session(
        how: str, served: Served, roots: Path) -> None:
    place = served.place
    spawned = None
    if how == "killed":
        served.proc.kill()
        served.proc.wait()
    else:
        served.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with Host(roots / "ws") as host:
            took = time.monotonic() - started
            warm = _warm(host)
            assert warm["used"] is False
            reason = str(warm["reason"])
            if how == "killed":
                assert "starting now" in reason
                spawned = _spawned_factory(place)
            else:
                assert "did not answer" in reason or "did not hand" in reason, reason
            assert run_ok(host, "print('cold')").strip() == "cold"
        assert took < 60
    finally:
        _end(spawned if spawned != served.proc.pid else None)


def test_the_factory_is_off_when_asked(served: Served, roots: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with Host(roots / "ws", factory=False) as host:
        assert _generations_warm(host) is None
    monkeypatch.setenv(FACTORY_ENV, "off")
    with Host(roots / "ws") as host:
        assert _generations_warm(host) is None
    monkeypatch.delenv(FACTORY_ENV)
    assert served.hello()["stats"]["handed_out"] == 0  # type: ignore[index]


def _generations_warm(host: Host) -> object:
    assert host.ledger is not None
    [row] = host.ledger.query("SELECT body FROM events WHERE kind = 'generation_started' "
                              "AND session = ? ORDER BY seq LIMIT 1", (host.session_id,))
    return json.loads(row["body"]).get("warm")


# ---------------------------------------------------------------------- the kernelspec


def test_the_kernelspec_and_its_restart_start_warm_from_the_factory(
        served: Served, roots: Path, tmp_path: Path) -> None:
    from test_control_kernel import RelayKernel, kernelspecs

    with kernelspecs(tmp_path):
        kernel = RelayKernel.start(roots / "ws")
        try:
            assert kernel.stdout("print(host.generation)").strip() == "1"
            [first] = kernel.events("generation_started")
            assert first["warm"]["factory"] is True and first["warm"]["used"] is True, first
            served.ready()
            kernel.km.restart_kernel(now=False)
            kernel.kc.wait_for_ready(timeout=60)
            assert kernel.stdout("print(host.generation)").strip() == "2"
            second = kernel.events("generation_started")[-1]
            assert second["warm"]["factory"] is True and second["warm"]["used"] is True, second
            assert second["warm"]["standby_started"] != first["warm"]["standby_started"]
        finally:
            kernel.stop()
    assert served.hello()["stats"]["handed_out"] == 2  # type: ignore[index]


NO_NEW_PRIVS = """
import ctypes, json, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS, as Landlock requires
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
s.send(b'{"op": "hello"}')
print(s.recv(65536).decode())
"""


def test_a_process_with_no_new_privs_is_refused(served: Served) -> None:
    # What tells a confined kernel from a Host where both share the factory's namespaces.
    out = subprocess.run([sys.executable, "-c", NO_NEW_PRIVS, str(served.place.socket)],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert reply["ok"] is False and "no_new_privs" in reply["reason"]
    assert served.hello()["stats"]["handed_out"] == 0  # type: ignore[index]


FEWER_RIGHTS = """
import ctypes, json, os, socket, sys
what = sys.argv[2]
if what == "group":
    os.setgroups([4242])  # gives up every supplementary group the factory has, takes one
elif what == "capability":
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(24, 13, 0, 0, 0) == 0  # PR_CAPBSET_DROP CAP_NET_RAW
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
s.send(b'{"op": "hello"}')
print(s.recv(65536).decode())
"""


@pytest.mark.parametrize(("what", "line"), [("group", "Groups"), ("capability", "CapBnd")])
def test_a_process_with_other_rights_than_the_factorys_is_refused(
        served: Served, what: str, line: str) -> None:
    """A standby (or a zygote's fork) runs with the factory's rights: a process that gave up
    a group or a capability would get it back through one, so it is refused."""
    if os.geteuid() != 0:
        pytest.skip("LOUD SKIP: changing groups or the bounding set needs root here")
    out = subprocess.run([sys.executable, "-c", FEWER_RIGHTS, str(served.place.socket), what],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert reply["ok"] is False and line in reply["reason"], reply
    assert served.hello()["stats"]["handed_out"] == 0  # type: ignore[index]
    # The honest twin: the same client with the factory's rights is answered.
    same = subprocess.run([sys.executable, "-c", FEWER_RIGHTS, str(served.place.socket),
                           "nothing"], check=False, capture_output=True, text=True, timeout=60)
    assert json.loads(same.stdout)["ok"] is True, same.stdout + same.stderr


def test_a_garbled_or_repeated_request_is_answered_and_the_factory_goes_on(
        served: Served, roots: Path) -> None:
    import socket as sockets

    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET) as conn:
        conn.settimeout(30)
        conn.connect(str(served.place.socket))
        for garbage in (b"[1, 2]", b'"take"', b'{"op": "steal"}'):
            conn.send(garbage)
            reply = json.loads(conn.recv(65536))
            assert reply["ok"] is False and "unknown or repeated request" in reply["reason"]
        conn.send(b"not json")
        assert conn.recv(65536) == b""  # it hangs up on what is not JSON at all
    # One kernel per connection (a connection is one session's lease).
    lease, standby, why = _take(served.place, roots / "ws")
    try:
        assert standby is not None, why
        lease._sock.send(json.dumps({"op": "take", "workspace": str(roots / "ws")}).encode())
        reply = json.loads(lease._sock.recv(65536))
        assert reply["ok"] is False and "repeated" in reply["reason"]
    finally:
        if standby is not None:
            standby.close()  # type: ignore[attr-defined]
        lease.close()
    assert served.hello()["stats"]["handed_out"] == 1  # type: ignore[index]


def test_a_servers_socket_appears_only_once_it_listens() -> None:
    """The factory's and the zygote's socket is bound under a short name of its own and
    renamed into place listening: a client that finds the path is answered, never
    refused (which it would take for a dead server, and start another). A dead server's
    socket is replaced; a failed start leaves nothing."""
    short = Path(tempfile.mkdtemp(prefix="hk"))  # tmp_path may leave no room below
    try:
        _listen_at_replaces_and_appears_listening(short)
    finally:
        shutil.rmtree(short)


def _listen_at_replaces_and_appears_listening(tmp_path: Path) -> None:
    import socket as _socket

    from host_kernel._procs import listen_at

    # As long as a socket's path may be (107 bytes): the staging name must still fit.
    path = tmp_path / ("f" * (107 - len(str(tmp_path)) - 6) + ".sock")
    assert len(str(path)) == 107
    stale = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    stale.bind(str(path))
    stale.close()  # a dead server's socket file: connecting to it is refused
    with pytest.raises(ConnectionRefusedError):
        with _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET) as probe:
            probe.connect(str(path))
    listening = _socket.socket.listen

    def watched(self: _socket.socket, *args: int) -> None:
        # The moment a client must not see: bound at the path, not yet listening.
        assert self.getsockname() != str(path)
        listening(self, *args)

    _socket.socket.listen = watched  # type: ignore[method-assign]
    try:
        listener = listen_at(str(path), _socket.SOCK_SEQPACKET, 4)
    finally:
        _socket.socket.listen = listening  # type: ignore[method-assign]
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET) as client:
            client.connect(str(path))
            conn, _ = listener.accept()
            conn.close()
        assert sorted(os.listdir(tmp_path)) == [path.name]
    finally:
        listener.close()
    with pytest.raises(OSError):
        listen_at(str(tmp_path / "missing" / "x.sock"), _socket.SOCK_STREAM, 1)
    assert sorted(os.listdir(tmp_path)) == [path.name]
