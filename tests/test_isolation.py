"""Sessions that cannot see each other: a private view and a network namespace per sandbox.

Two real sessions, A and B, on this machine. A's cells attack B the way the issue did
(list every socket, subscribe to B's IOPub, post calls to B's Host socket, read B's
record, files and shared memory, signal B's kernel) and reach for services on the
machine's loopback; each attack must find nothing there. Each has its honest twin: A's
own sockets, folders, shared memory, loopback and outbound network still work. With
the isolation switched off (``HOST_KERNEL_ISOLATION=off``) the first attacks succeed
again, which shows these tests can fail, and the record and first Observation say so.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import run_ok

from host_kernel import Host
from host_kernel._errors import ConfinementError
from host_kernel.host._kernel import close_thread_loop
from host_kernel.sandbox.client import Sandbox, popen_confined
from host_kernel.sandbox.landlock import abi_version
from host_kernel.sandbox.netns import outbound_unavailable, resolv_for
from host_kernel.sandbox.policy import Policy

pytestmark = pytest.mark.skipif(abi_version() < 1, reason="LANDLOCK UNAVAILABLE ON THIS "
                                "MACHINE: no sandbox, so no private world to test")


def _last(host: Host, code: str) -> Any:
    """Run ``code``, whose last line of output is JSON; return it decoded."""
    return json.loads(run_ok(host, code).strip().splitlines()[-1])


def _printed(obs: Any) -> str:
    """The last line a cell printed (a command's output streams into the same output)."""
    lines = "".join(o.get("text", "") for o in obs.outputs).strip().splitlines()
    return lines[-1] if lines else ""


def _isolation(host: Host) -> dict[str, Any]:
    rows = host.ledger.query("SELECT body FROM events WHERE kind = 'generation_started' "
                             "ORDER BY seq")
    confinement: dict[str, Any] = json.loads(rows[-1]["body"])["confinement"]
    return confinement


def _ipc_paths(host: Host) -> list[str]:
    """The kernel's ZeroMQ channels (ipc paths), from the connection file the Host wrote."""
    kernel = host.generations.kernel
    assert kernel is not None
    info = json.loads(Path(kernel.manager.connection_file).read_text())
    assert info["transport"] == "ipc"
    return [f"{info['ip']}-{info[k]}" for k in ("shell_port", "iopub_port", "stdin_port",
                                                 "control_port", "hb_port")]


def _kernel_pids(host: Host) -> list[int]:
    """The Host-side pids of the session's sandbox: its launcher and everything below it."""
    kernel = host.generations.kernel
    assert kernel is not None and kernel.pid is not None
    from _helpers import descendants
    return [kernel.pid, *sorted(descendants(kernel.pid))]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, Host]]:
    """Sessions A (the attacker) and B (the victim), each in its own workspace."""
    a_ws, b_ws = tmp_path_factory.mktemp("a") / "ws", tmp_path_factory.mktemp("b") / "ws"
    a_ws.mkdir()
    b_ws.mkdir()
    with Host(a_ws) as a, Host(b_ws) as b:
        for host in (a, b):
            if host.confinement is None or not host.confinement.active:
                pytest.skip(f"CONFINEMENT NOT ACTIVE: {host.confinement}")
            if not _isolation(host)["view"]["private"]:
                pytest.skip(f"NO PRIVATE VIEW HERE: {_isolation(host)['view']}")
        yield a, b


# ---------------------------------------------------------------------- what A can list


def test_a_kernel_lists_only_its_own_sockets(pair: tuple[Host, Host]) -> None:
    a, b = pair
    listing = _last(a, "import json\nprint(json.dumps(open('/proc/net/unix').read()))")
    for path in [*_ipc_paths(b), str(b.generations.runtime_dir)]:
        assert path not in listing, f"A's kernel lists B's socket {path}"
    assert "host.sock" not in listing  # no Host's call socket is bound in A's namespace
    # The honest twin: the listing is real, and shows A's own kernel's channels.
    assert any(p in listing for p in _ipc_paths(a)), listing


def test_another_sessions_runtime_folder_record_and_files_are_absent(
        pair: tuple[Host, Host]) -> None:
    a, b = pair
    run_ok(b, "import os\nopen(os.path.join(os.environ['TMPDIR'], 'b-secret.txt'), 'w')"
              ".write('B')")
    assert b.generations.private_dir is not None and b.generations.runtime_dir is not None
    b_files = [str(b.generations.runtime_dir), str(b.generations.runtime_dir / "host.sock"),
               str(b.generations.private_dir / "tmp" / "b-secret.txt"),
               *_ipc_paths(b), str(b.generations.runtime_dir / "g1" / "kernel.json"),
               str(b.record_dir), str(b.record_dir / "ledger.sqlite")]
    assert all(os.path.exists(p) for p in b_files)  # on the machine they are all there
    seen = _last(a, f"import json, os\nprint(json.dumps([p for p in {b_files!r} "
                    f"if os.path.lexists(p)]))")
    assert seen == [], f"A's kernel sees B's {seen}"
    # The honest twin: A's own record is there, and a cell that reaches for it is told
    # it is confined (not that it does not exist); A's own temp folder works.
    own = a.execute(f"open({str(a.record_dir / 'ledger.sqlite')!r}, 'rb').read(16)")
    assert own.status == "error" and "PermissionError" in own.text, own.text
    run_ok(a, "import tempfile\nwith tempfile.NamedTemporaryFile() as f:\n    f.write(b'x')")


def test_the_machines_tmp_and_dev_shm_are_not_the_kernels(pair: tuple[Host, Host]) -> None:
    a, b = pair
    name = f"hk-iso-{secrets.token_hex(4)}"
    machine_tmp, machine_shm = Path("/tmp") / name, Path("/dev/shm") / name
    machine_tmp.write_text("machine")
    machine_shm.write_text("machine")
    try:
        run_ok(b, f"open('/dev/shm/b-{name}', 'w').write('B')")
        seen = _last(a, f"import json, os\nprint(json.dumps([os.path.lexists(p) for p in "
                        f"({str(machine_tmp)!r}, {str(machine_shm)!r}, '/dev/shm/b-{name}')] "
                        f"+ [os.listdir('/dev/shm')]))")
        assert seen == [False, False, False, []], seen
        listing = a.execute("r = host.bash('ls -a /tmp')\nprint(r.exit_status)")
        assert listing.outputs[-1]["text"].strip() != "0"  # /tmp cannot even be listed
        assert not Path(f"/dev/shm/b-{name}").exists()  # B's shared memory is B's alone
        # The honest twin: shared memory and POSIX semaphores work inside A.
        run_ok(a, "import multiprocessing, multiprocessing.shared_memory as sm\n"
                  "m = sm.SharedMemory(create=True, size=4096)\nm.buf[0] = 7\n"
                  "other = sm.SharedMemory(m.name)\nassert other.buf[0] == 7\n"
                  "other.close(); m.close(); m.unlink()\n"
                  "multiprocessing.Lock().acquire()")
    finally:
        machine_tmp.unlink()
        machine_shm.unlink()


# ---------------------------------------------------------------------- what A can reach


def test_another_sessions_kernel_channels_and_host_socket_cannot_be_reached(
        pair: tuple[Host, Host]) -> None:
    a, b = pair
    targets = [*_ipc_paths(b), str(b.generations.runtime_dir / "host.sock")]
    before = len(b.ledger.query("SELECT seq FROM events WHERE kind = 'call_refused'"))
    outcome = _last(a, f"""
import json, socket
out = []
for path in {targets!r}:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        s.sendall(b'POST / HTTP/1.1\\r\\nContent-Length: 2\\r\\n\\r\\n{{}}')
        out.append('connected')
    except OSError as e:
        out.append(type(e).__name__)
    finally:
        s.close()
print(json.dumps(out))""")
    assert outcome == ["FileNotFoundError"] * len(targets), outcome
    after = len(b.ledger.query("SELECT seq FROM events WHERE kind = 'call_refused'"))
    assert after == before  # nothing of A's reached B's record
    # The honest twin: A's own call socket is reached (host.bash is a call).
    assert run_ok(a, "print(host.bash('echo ok').exit_status)").splitlines()[-1] == "0"


LISTEN = """
import json, time, zmq
sub = zmq.Context.instance().socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b'')
sub.connect('ipc://{iopub}')
heard, end = [], time.monotonic() + 3
while time.monotonic() < end:
    if sub.poll(100):
        heard.append(b''.join(sub.recv_multipart()).decode(errors='replace'))
sub.close()
print(json.dumps(heard))"""


def test_another_sessions_iopub_cannot_be_subscribed_to(pair: tuple[Host, Host]) -> None:
    a, b = pair
    iopub = _ipc_paths(b)[1]
    marker = f"B-secret-{secrets.token_hex(4)}"
    got: dict[str, Any] = {}

    def listen() -> None:
        try:
            got["obs"] = a.execute(LISTEN.format(iopub=iopub), timeout=60)
        finally:
            close_thread_loop()  # jupyter_client made this thread an event loop

    thread = threading.Thread(target=listen)
    thread.start()
    seen_by_b = []
    while thread.is_alive():
        seen_by_b.append(b.execute(f"print({marker!r})").text)
        time.sleep(0.2)  # B's cells go on while A listens (pacing, not synchronisation)
    thread.join()
    obs = got["obs"]
    assert obs.status == "ok", obs.text
    heard = json.loads(obs.outputs[-1]["text"].strip().splitlines()[-1])
    assert not any(marker in h for h in heard), "A's kernel read B's cell output"
    assert heard == []
    assert any(marker in text for text in seen_by_b)  # B's own Host heard every one


def test_another_sessions_kernel_cannot_be_signalled(pair: tuple[Host, Host]) -> None:
    a, b = pair
    pids = _kernel_pids(b)
    outcome = _last(a, f"""
import json, os, signal
out = []
for pid in {pids!r}:
    try:
        os.kill(pid, signal.SIGKILL)
        out.append('killed')
    except OSError as e:
        out.append(type(e).__name__)
print(json.dumps(out))""")
    assert "killed" not in outcome, outcome
    assert run_ok(b, "print('B lives')").strip() == "B lives"


@pytest.fixture
def loopback_server() -> Iterator[tuple[int, list[object]]]:
    """A TCP server on the machine's 127.0.0.1; yields its port and what it accepted."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.1)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except OSError:
                continue
            accepted.append(peer)
            conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join()
        server.close()


CONNECT = """
import json, socket
out = []
for target in {hosts!r}:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((target, {port}))
        out.append('connected')
    except OSError as e:
        out.append(type(e).__name__)
    finally:
        s.close()
print(json.dumps(out))"""


def test_the_machines_loopback_is_not_reachable(pair: tuple[Host, Host],
                                                loopback_server: tuple[int, list[object]]) -> None:
    a, _ = pair
    port, accepted = loopback_server
    # 10.0.2.2 is slirp4netns's address for the machine: refused too (--disable-host-loopback).
    hosts = ["127.0.0.1", "localhost"] + (["10.0.2.2"] if outbound_unavailable() is None else [])
    outcome = _last(a, CONNECT.format(hosts=hosts, port=port))
    assert "connected" not in outcome, outcome
    assert accepted == []
    bash = a.execute(f"r = host.bash('exec 3<>/dev/tcp/127.0.0.1/{port}')\n"
                     f"print(r.exit_status)")
    assert _printed(bash) != "0" and accepted == [], bash.outputs
    # The honest twin: the kernel's own loopback works, inside its own namespace.
    assert _last(a, """
import json, socket, threading
srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)
threading.Thread(target=lambda: srv.accept()[0].sendall(b'own'), daemon=True).start()
c = socket.create_connection(srv.getsockname(), timeout=5)
print(json.dumps(c.recv(3).decode()))""") == "own"


#: A UDP datagram to the machine's 127.0.0.1, written as a raw Ethernet frame on the tap
#: device slirp4netns serves (its --disable-host-loopback only stops its gateway alias,
#: 10.0.2.2): possible for a kernel that is root in its network namespace with CAP_NET_RAW.
RAW_FRAME = r"""
import json, socket, struct
def csum(b):
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff)
    return ~(s + (s >> 16)) & 0xffff
try:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind(('tap0', 0))
    data = b'raw-escape'
    udp = struct.pack('!HHHH', 40000, {port}, 8 + len(data), 0) + data
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                     socket.inet_aton('10.0.2.100'), socket.inet_aton('127.0.0.1'))
    ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
    s.send(bytes.fromhex('52550a000202') + s.getsockname()[4] + b'\x08\x00' + ip + udp)
    out = 'sent'
except OSError as e:
    out = type(e).__name__
print(json.dumps(out))"""


@pytest.mark.skipif(outbound_unavailable() is not None,
                    reason=f"LOUD: NO USER-MODE NETWORKING HERE: {outbound_unavailable()}")
def test_a_raw_frame_to_the_machines_loopback_cannot_be_sent(pair: tuple[Host, Host]) -> None:
    a, _ = pair
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    try:
        outcome = _last(a, RAW_FRAME.format(port=server.getsockname()[1]))
        assert outcome == "PermissionError", outcome  # no CAP_NET_RAW, root or not
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.recvfrom(64)  # and nothing arrived
    finally:
        server.close()
    assert _isolation(a)["capabilities"] == "files only"
    # The honest twin: ordinary datagrams work, on the kernel's own loopback.
    assert _last(a, "import json, socket\nr = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                    "\nr.bind(('127.0.0.1', 0))\nw = socket.socket(socket.AF_INET, "
                    "socket.SOCK_DGRAM)\nw.sendto(b'own', r.getsockname())\n"
                    "print(json.dumps(r.recv(3).decode()))") == "own"


def test_the_record_says_each_kernel_has_its_own_world(pair: tuple[Host, Host]) -> None:
    a, _ = pair
    confinement = _isolation(a)
    assert confinement["view"]["private"] is True
    assert "/tmp" in confinement["view"]["masked"] and "/dev/shm" in confinement["view"]["masked"]
    network = confinement["network"]
    assert network["namespace"] is True and network["machine_loopback"] is False
    assert network["outbound"] == ("slirp4netns" if outbound_unavailable() is None else "none")
    assert a.confinement is not None and a.confinement.network_namespace is True
    assert a.confinement.private_view is True and a.confinement.missing() is None


# ---------------------------------------------------------------------- outbound traffic


@pytest.fixture(scope="module")
def outside_server() -> Iterator[tuple[str, int]]:
    """An HTTP server outside the machine's loopback: in a network namespace of its own,
    reached over a veth pair (needs root, as CI runs; skips loudly otherwise)."""
    ip = shutil.which("ip")
    if ip is None or os.geteuid() != 0:
        pytest.skip("LOUD: making a network namespace with a veth pair needs root and "
                    "iproute2; only the loopback half of the network isolation is tested here")
    tag = secrets.token_hex(3)
    ns, here, there = f"hkt-{tag}", f"hka{tag}", f"hkb{tag}"
    third = 1 + secrets.randbelow(250)
    host_addr, server_addr = f"198.18.{third}.1", f"198.18.{third}.2"
    made: list[list[str]] = []

    def sh(*argv: str) -> None:
        subprocess.run([ip, *argv], check=True, capture_output=True, timeout=30)

    try:
        sh("netns", "add", ns)
        made.append(["netns", "del", ns])
        sh("link", "add", here, "type", "veth", "peer", "name", there)
        made.append(["link", "del", here])
        # A loaded machine may show the new pair a moment after `link add` returns (it
        # said "Cannot find device" to the next command, and the test skipped).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
                subprocess.run([ip, "link", "show", dev], capture_output=True,
                               timeout=30).returncode != 0 for dev in (here, there)):
            time.sleep(0.05)
        sh("link", "set", there, "netns", ns)
        sh("addr", "add", f"{host_addr}/30", "dev", here)
        sh("link", "set", here, "up")
        for argv in (["addr", "add", f"{server_addr}/30", "dev", there],
                     ["link", "set", there, "up"], ["link", "set", "lo", "up"]):
            sh("netns", "exec", ns, ip, *argv)
    except subprocess.CalledProcessError as exc:
        for argv in reversed(made):
            subprocess.run([ip, *argv], capture_output=True, timeout=30)
        pytest.skip(f"LOUD: no test network namespace here ({exc.stderr.decode().strip()}); "
                    f"only the loopback half of the network isolation is tested")
    code = ("import http.server, sys\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers(); self.wfile.write(b'outside')\n"
            "    def log_message(self, *a): pass\n"
            f"s = http.server.HTTPServer(({server_addr!r}, 0), H)\n"
            "print(s.server_address[1], flush=True)\ns.serve_forever()\n")
    server = subprocess.Popen([ip, "netns", "exec", ns, sys.executable, "-c", code],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        yield server_addr, port
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
        for argv in reversed(made):
            subprocess.run([ip, *argv], capture_output=True, timeout=30)


FETCH = """
import json, urllib.request
try:
    out = urllib.request.urlopen('http://{addr}:{port}/', timeout=5).read().decode()
except OSError as e:
    out = type(e).__name__
print(json.dumps(out))"""


@pytest.mark.skipif(outbound_unavailable() is not None,
                    reason=f"LOUD: NO USER-MODE NETWORKING HERE: {outbound_unavailable()}")
def test_network_true_reaches_an_address_outside_loopback(
        pair: tuple[Host, Host], outside_server: tuple[str, int]) -> None:
    a, _ = pair
    addr, port = outside_server
    assert _last(a, FETCH.format(addr=addr, port=port)) == "outside"
    receipt = a.execute(f"r = host.bash('python -c \"import urllib.request as u; "
                        f"print(u.urlopen(\\'http://{addr}:{port}/\\', timeout=5).read())\"')\n"
                        f"print(r.exit_status)")
    assert _printed(receipt) == "0", receipt.outputs


def test_network_false_reaches_neither_the_outside_nor_the_machines_loopback(
        tmp_path: Path, outside_server: tuple[str, int],
        loopback_server: tuple[int, list[object]]) -> None:
    addr, port = outside_server
    local_port, accepted = loopback_server
    with Host(tmp_path, network=False) as host:
        network = _isolation(host)["network"]
        assert network["namespace"] is True and network["outbound"] == "none"
        assert _last(host, FETCH.format(addr=addr, port=port)) != "outside"
        assert "connected" not in _last(host, CONNECT.format(hosts=["127.0.0.1"],
                                                             port=local_port))
        assert accepted == []


# ---------------------------------------------------------------------- warm starts


def test_a_pooled_session_has_a_private_world_too(tmp_path: Path,
                                                 pair: tuple[Host, Host]) -> None:
    from host_kernel import HostPool

    _, b = pair
    (tmp_path / "ws").mkdir()
    with HostPool(size=1, roots=[tmp_path]) as pool:
        assert pool.wait_ready(90), pool.broken
        with Host(tmp_path / "ws", pool=pool) as warm:
            rows = warm.ledger.query("SELECT body FROM events WHERE kind = "
                                     "'generation_started'")
            assert json.loads(rows[0]["body"])["warm"]["used"] is True
            seen = _last(warm, f"import json, os\nprint(json.dumps([p for p in "
                               f"{[str(b.generations.runtime_dir), *_ipc_paths(b)]!r} "
                               f"if os.path.lexists(p)]))")
            assert seen == []
            # The honest twin: the session's own call socket and workspace are there.
            assert run_ok(warm, "open('w.txt', 'w').write('x\\n')\n"
                                "print(host.bash('cat w.txt').exit_status)"
                          ).splitlines()[-1] == "0"
            assert _isolation(warm)["view"]["private"] is True


# ---------------------------------------------------------------------- reproductions


def test_a_reproductions_sandbox_has_its_own_world(tmp_path: Path,
                                                   pair: tuple[Host, Host]) -> None:
    """A reproduction runs in a Sandbox like a kernel's (host_kernel/reproduce/runner.py):
    the same private view and network namespace, with the reproduction's own policy."""
    from host_kernel.reproduce.environment import interpreter_identity
    from host_kernel.reproduce.world import reproduction_policy

    _, b = pair
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    policy = reproduction_policy(run_dir, interpreter_identity(), [], [str(b.workdir)],
                                 network=False)
    box = Sandbox(policy, abi_version())
    b_paths = [str(b.generations.runtime_dir), *_ipc_paths(b)]
    probe = ("import json, os\nprint(json.dumps([os.listdir('/dev/shm'), "
             f"[p for p in {b_paths!r} if os.path.lexists(p)]]))")
    launcher = subprocess.Popen(box.argv([sys.executable, "-I", "-c", probe]),
                                pass_fds=box.pass_fds, start_new_session=True,
                                stdout=subprocess.PIPE, cwd=run_dir)
    try:
        box.started()
        assert launcher.stdout is not None
        shm, seen = json.loads(launcher.stdout.read())
        assert launcher.wait(timeout=30) == 0
    finally:
        box.close()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if launcher.stdout is not None:
            launcher.stdout.close()
        box.release()
    assert shm == [] and seen == [], (shm, seen)
    assert box.isolation()["network"] == {"namespace": True, "outbound": "none",
                                          "machine_loopback": False, "reason": None}


# ---------------------------------------------------------------------- switched off


def test_with_the_isolation_off_the_attacks_work_and_the_session_is_told(
        tmp_path: Path, pair: tuple[Host, Host], monkeypatch: pytest.MonkeyPatch) -> None:
    """What these tests guard against, shown: the kernel then lists and connects to
    another session's sockets. The record and the first Observation say the world is
    shared; a Host that requires confinement refuses to start."""
    _, b = pair
    monkeypatch.setenv("HOST_KERNEL_ISOLATION", "off")
    with Host(tmp_path) as open_host:
        first = open_host.execute(f"import os\nprint(os.path.exists("
                                  f"{str(b.generations.runtime_dir / 'host.sock')!r}))")
        assert _printed(first) == "True"
        assert first.notice is not None and "no network namespace" in first.notice
        assert "no private /tmp" in first.notice
        assert any(p in open_host.execute("print(open('/proc/net/unix').read())").text
                   for p in _ipc_paths(b))
        confinement = _isolation(open_host)
        assert confinement["view"]["private"] is False
        assert confinement["network"]["machine_loopback"] is True
        assert "HOST_KERNEL_ISOLATION" in confinement["network"]["reason"]
    (tmp_path / "strict").mkdir()
    with pytest.raises(ConfinementError, match="private world"):
        Host(tmp_path / "strict", require_confinement=True).start()


def test_the_resolver_is_replaced_only_when_the_machines_is_on_its_loopback() -> None:
    stub = "# resolved\nnameserver 127.0.0.53\noptions edns0\nsearch example.org\n"
    assert resolv_for(stub) == ("nameserver 10.0.2.3\n# resolved\noptions edns0\n"
                                "search example.org\n")
    assert resolv_for("nameserver 10.255.255.53\n") is None
    assert resolv_for("nameserver ::1\n") is not None


def test_a_sandbox_given_a_resolver_shows_it_as_etc_resolv_conf(tmp_path: Path) -> None:
    """The resolver a sandbox with slirp4netns needs when the machine's is on its own
    loopback (systemd-resolved): bound over /etc/resolv.conf inside, the machine's untouched."""
    if outbound_unavailable() is not None:
        pytest.skip(f"LOUD: NO USER-MODE NETWORKING HERE: {outbound_unavailable()}")
    ws, private = tmp_path / "ws", tmp_path / "private"
    ws.mkdir()
    private.mkdir()
    before = Path("/etc/resolv.conf").read_text()
    box = Sandbox(Policy.for_session(ws, private, []), abi_version(),
                  resolv="nameserver 10.0.2.3\n")
    launcher = subprocess.Popen(box.argv(["sleep", "600"]), pass_fds=box.pass_fds,
                                start_new_session=True)
    try:
        box.started()
        proc = popen_confined(box, ["cat", "/etc/resolv.conf"], cwd=str(ws),
                              env={"PATH": os.defpath})
        assert proc.stdout is not None and proc.stderr is not None
        with proc.stdout, proc.stderr:
            inside = proc.stdout.read().decode()
        assert proc.wait(timeout=10) == 0
    finally:
        box.close()
        launcher.wait(timeout=10)
        box.release()
    assert inside == "nameserver 10.0.2.3\n"
    assert Path("/etc/resolv.conf").read_text() == before
