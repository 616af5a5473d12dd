"""host.bash at the floor: what the faster call path remembers, writes and sends, and
that none of it lets a receipt name a stale file or lets the kernel decide anything.

- PATH lookups and executables' hashes are remembered (host/_bash.py,
  ExecutableCache) and checked at every use: a new file earlier on PATH, a file
  replaced (in place with its times put back, or by a rename), one made
  non-executable, or a symlink led elsewhere, is named with its new sha256 by the
  next receipt.
- Several events go into the ledger in one transaction (``append_many``): all, or none,
  and the record audits clean either way.
- A reply is written in one piece, a request sent in one; the lean client reads
  chunked lines however the Host cuts them, and an answer the kernel stopped reading is
  never read as the next call's.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import run_ok

from host_kernel import Host
from host_kernel._errors import HostCallError, RecordError
from host_kernel.audit import audit
from host_kernel.host import _bash
from host_kernel.host._bash import RACY_NS, ExecutableCache
from host_kernel.host._server import CallServer
from host_kernel.kernel.client import HostClient
from host_kernel.store.ledger import SQLiteLedger, check_chain

TOOLS = ("earlier", "replaced", "renamed", "unexec", "symlink", "forged")


def _tool(path: Path, text: str) -> str:
    """An executable script at ``path`` printing ``text``; returns its bytes' sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = f"#!/bin/sh\necho {text}\n".encode()
    path.write_bytes(data)
    path.chmod(0o755)
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def tools_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """One Host whose workspace holds each test's tools, made old enough to be remembered:
    nothing whose change time is within RACY_NS of a look is kept, so the tools are made
    first and the clock let run past that once for the module."""
    ws = tmp_path_factory.mktemp("fast") / "ws"
    ws.mkdir()
    for name in TOOLS:
        _tool(ws / name / "b" / "tool", f"{name}-b")
    _tool(ws / "unexec" / "a" / "tool", "unexec-a")
    real = ws / "symlink" / "real"
    _tool(real / "one", "one")
    _tool(real / "two", "two")
    (ws / "symlink" / "hop").mkdir()
    os.symlink("../real/one", ws / "symlink" / "hop" / "tool")
    (ws / "symlink" / "b" / "tool").unlink()
    os.symlink("../hop/tool", ws / "symlink" / "b" / "tool")
    time.sleep(RACY_NS / 1e9 + 0.3)
    with Host(ws) as h:
        yield h
    report = audit(h.record_dir)
    assert report.clean, [str(f) for f in report.findings]


def _bash_on(host: Host, name: str, command: str = "tool") -> dict[str, Any]:
    """Run ``command`` with ``name``/a and ``name``/b first on PATH; return its receipt as
    the record holds it."""
    obs = host.execute(
        "import os\n"
        "base = os.environ.get('BASE_PATH') or os.environ['PATH']\n"
        "os.environ['BASE_PATH'] = base\n"
        f"os.environ['PATH'] = os.path.abspath({name!r} + '/a') + ':' + "
        f"os.path.abspath({name!r} + '/b') + ':' + base\n"
        f"r = host.bash({command!r})\n"
        "os.environ['PATH'] = base\n"
        "print(r.exit_status)")
    assert obs.status == "ok", obs.text
    rows = host.ledger.query("SELECT body FROM receipts WHERE cell_id = ?",  # type: ignore[union-attr]
                             (obs.cell_id,))
    assert len(rows) == 1
    body: dict[str, Any] = json.loads(rows[0]["body"])
    assert body["exit_status"] == 0, body
    return body


def _remembered(host: Host, name: str) -> tuple[bool, bool]:
    """Whether the Host holds a PATH lookup of ``tool`` on ``name``'s folders, and a hash of
    the file it found (white-box: the path through the cache is the one taken)."""
    cache: ExecutableCache = host.calls.ctx.executables
    found = [k for k in cache._found if k[0] == "tool" and f"/{name}/" in k[1]]
    hashed = [p for p in cache._hashes if f"/{name}/" in p]
    return bool(found), bool(hashed)


# -- PATH lookups and hashes: remembered, and never stale --------------------------------------


def test_a_new_executable_earlier_on_path_is_named_by_the_next_receipt(
        tools_host: Host) -> None:
    ws = tools_host.workdir
    first = _bash_on(tools_host, "earlier")
    assert first["executable"] == str(ws / "earlier" / "b" / "tool")
    assert _remembered(tools_host, "earlier") == (True, True)
    assert _bash_on(tools_host, "earlier")["executable"] == first["executable"]
    sha = _tool(ws / "earlier" / "a" / "tool", "earlier-a")
    second = _bash_on(tools_host, "earlier")
    assert second["executable"] == str(ws / "earlier" / "a" / "tool")
    assert second["executable_sha256"] == sha != first["executable_sha256"]
    assert second["stdout_tail"] == "earlier-a\n"


def test_a_file_replaced_in_place_with_its_times_put_back_is_hashed_again(
        tools_host: Host) -> None:
    ws = tools_host.workdir
    tool = ws / "replaced" / "b" / "tool"
    first = _bash_on(tools_host, "replaced")
    assert _remembered(tools_host, "replaced") == (True, True)
    # The kernel rewrites the bytes (same size) and sets the times back: only the change
    # time, which no process can set, moves.
    obs = tools_host.execute(
        "import os\n"
        f"p = {str(tool)!r}\n"
        "st = os.stat(p)\n"
        "data = open(p, 'rb').read().replace(b'replaced-b', b'REPLACED-B')\n"
        "with open(p, 'r+b') as f:\n"
        "    f.write(data)\n"
        "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\n"
        "print(os.stat(p).st_size == st.st_size, os.stat(p).st_mtime_ns == st.st_mtime_ns)")
    assert obs.outputs[0]["text"].split() == ["True", "True"]
    second = _bash_on(tools_host, "replaced")
    assert second["executable"] == first["executable"]
    assert second["executable_sha256"] == hashlib.sha256(tool.read_bytes()).hexdigest()
    assert second["executable_sha256"] != first["executable_sha256"]
    assert second["stdout_tail"] == "REPLACED-B\n"


def test_a_file_replaced_by_a_rename_is_hashed_again(tools_host: Host) -> None:
    ws = tools_host.workdir
    first = _bash_on(tools_host, "renamed")
    assert _remembered(tools_host, "renamed") == (True, True)
    sha = _tool(ws / "renamed" / "new", "renamed-new")
    os.replace(ws / "renamed" / "new", ws / "renamed" / "b" / "tool")
    second = _bash_on(tools_host, "renamed")
    assert second["executable"] == first["executable"]
    assert second["executable_sha256"] == sha != first["executable_sha256"]


def test_a_file_made_non_executable_is_passed_over_as_which_would(tools_host: Host) -> None:
    ws = tools_host.workdir
    first = _bash_on(tools_host, "unexec")
    assert first["executable"] == str(ws / "unexec" / "a" / "tool")
    assert _remembered(tools_host, "unexec") == (True, True)
    (ws / "unexec" / "a" / "tool").chmod(0o644)
    second = _bash_on(tools_host, "unexec")
    assert second["executable"] == str(ws / "unexec" / "b" / "tool")
    assert second["stdout_tail"] == "unexec-b\n"


def test_a_symlink_on_the_way_led_elsewhere_is_followed_anew(tools_host: Host) -> None:
    ws = tools_host.workdir
    real = ws / "symlink" / "real"
    first = _bash_on(tools_host, "symlink")
    assert first["executable"] == str(real / "one")
    assert _remembered(tools_host, "symlink") == (True, True)
    # The link on PATH is untouched; one it leads through, outside PATH, now leads on.
    hop = ws / "symlink" / "hop" / "tool"
    hop.unlink()
    os.symlink("../real/two", hop)
    second = _bash_on(tools_host, "symlink")
    assert second["executable"] == str(real / "two")
    assert second["executable_sha256"] == hashlib.sha256(
        (real / "two").read_bytes()).hexdigest()


def test_a_line_through_bash_runs_the_bash_its_path_finds_now(tools_host: Host) -> None:
    """The file the confined child execs for a line bash must run is the command's own
    PATH lookup of ``bash``, through the remembered lookups: one put first on PATH runs,
    and once it is gone, the system's does again."""
    ws = tools_host.workdir
    fake = ws / "fakebash" / "a" / "bash"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho fake-bash\nexec /bin/bash \"$@\"\n")
    fake.chmod(0o755)
    line = "echo one; echo two"  # not one plain command: it goes through bash
    for expect_fake in (True, True, False):
        if not expect_fake:
            fake.unlink()
        obs = tools_host.execute(
            "import os\n"
            "base = os.environ.get('BASE_PATH') or os.environ['PATH']\n"
            "os.environ['BASE_PATH'] = base\n"
            "os.environ['PATH'] = os.path.abspath('fakebash/a') + ':' + base\n"
            f"r = host.bash({line!r})\n"
            "os.environ['PATH'] = base\n"
            "print(r.stdout_tail)")
        assert obs.status == "ok", obs.text
        assert ("fake-bash" in obs.text) is expect_fake, obs.text
        assert "one\ntwo" in obs.text, obs.text


def test_a_kernel_cannot_make_a_remembered_hash_name_other_bytes(tools_host: Host) -> None:
    """The kernel swaps the file for other bytes of the same size, puts the old times on
    it, then swaps the original back: the receipt between names the bytes that ran."""
    ws = tools_host.workdir
    tool = ws / "forged" / "b" / "tool"
    first = _bash_on(tools_host, "forged")
    assert _remembered(tools_host, "forged") == (True, True)
    obs = tools_host.execute(
        "import os\n"
        f"p = {str(tool)!r}\n"
        "st = os.stat(p)\n"
        "data = open(p, 'rb').read().replace(b'forged-b', b'FORGED-B')\n"
        "os.rename(p, p + '.orig')\n"
        "with open(p, 'wb') as f:\n"
        "    f.write(data)\n"
        "os.chmod(p, 0o755)\n"
        "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\n")
    assert obs.status == "ok", obs.text
    swapped = _bash_on(tools_host, "forged")
    assert swapped["stdout_tail"] == "FORGED-B\n"
    assert swapped["executable_sha256"] == hashlib.sha256(tool.read_bytes()).hexdigest()
    os.replace(str(tool) + ".orig", tool)
    back = _bash_on(tools_host, "forged")
    assert back["executable_sha256"] == first["executable_sha256"]
    assert back["stdout_tail"] == "forged-b\n"


def test_a_new_generation_forgets_what_the_last_looked_up() -> None:
    cache = ExecutableCache()
    cache.generation(1)
    path = os.defpath
    assert cache.which("sh", path) == cache.which("sh", path)
    cache._found[("sh", path)] = ((), "/nowhere/sh")  # as if remembered long ago
    assert cache.which("sh", path) == "/nowhere/sh"  # no place to check: trusted
    cache.generation(2)
    assert cache.which("sh", path) != "/nowhere/sh"


def test_nothing_just_changed_is_remembered(tmp_path: Path) -> None:
    """A file changed within RACY_NS of the look could change again in the same clock
    tick without its times moving: neither its lookup nor its hash is kept."""
    cache = ExecutableCache()
    cache.generation(1)
    sha = _tool(tmp_path / "tool", "fresh")
    assert cache.which("tool", str(tmp_path)) == str(tmp_path / "tool")
    assert cache.sha256(str(tmp_path / "tool")) == sha
    assert not cache._found and not cache._hashes


# -- events appended together ------------------------------------------------------------------


def _a_receipt(host: Host) -> dict[str, Any]:
    obs = host.execute("r = host.bash('true')")
    assert obs.status == "ok", obs.text
    rows = host.ledger.query("SELECT body FROM receipts WHERE cell_id = ?",  # type: ignore[union-attr]
                             (obs.cell_id,))
    body: dict[str, Any] = json.loads(rows[0]["body"])
    return body


def test_events_appended_together_are_all_in_the_ledger_chained(host: Host) -> None:
    template = _a_receipt(host)
    head = host.ledger.head()  # type: ignore[union-attr]
    assert head is not None
    one, two = (template | {"receipt_id": f"{n}-{template['receipt_id']}"} for n in (1, 2))
    events = host.record.append_many([("receipt_recorded", one), ("receipt_recorded", two)])
    assert [e.seq for e in events] == [head.seq + 1, head.seq + 2]
    assert events[0].prev == head.hash and events[1].prev == events[0].hash
    ids = {r["receipt_id"] for r in host.ledger.query(  # type: ignore[union-attr]
        "SELECT receipt_id FROM receipts")}
    assert {one["receipt_id"], two["receipt_id"]} <= ids
    assert host.record.head == events[1].hash
    run_ok(host, "pass")  # the Host appends on from there
    record = host.record_dir
    host.close()
    report = audit(record)
    assert report.clean, [str(f) for f in report.findings]


def test_events_appended_together_are_none_in_the_ledger_when_one_fails(host: Host) -> None:
    template = _a_receipt(host)
    head = host.ledger.head()  # type: ignore[union-attr]
    fresh = template | {"receipt_id": "fresh-" + template["receipt_id"]}
    # The second repeats a receipt id already recorded: its projection row fails inside the
    # transaction, after the first event's rows were written.
    with pytest.raises(RecordError, match="receipt_recorded"):
        host.record.append_many([("receipt_recorded", fresh), ("receipt_recorded", template)])
    assert host.ledger.head() == head  # type: ignore[union-attr]
    assert not host.ledger.query("SELECT 1 FROM receipts WHERE receipt_id = ?",  # type: ignore[union-attr]
                                 (fresh["receipt_id"],))
    assert not check_chain(host.ledger)  # type: ignore[arg-type]
    run_ok(host, "r = host.bash('true')")  # the Host appends on from its own head
    record = host.record_dir
    host.close()
    report = audit(record)
    assert report.clean, [str(f) for f in report.findings]


def test_append_many_on_the_sqlite_ledger_is_one_transaction(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite")
    try:
        ledger.append("s", "session_started", {"mode": {"name": "analysis_run"}})
        before = ledger.head()
        with pytest.raises(RecordError):
            ledger.append_many("s", [("file_written", {"cell_id": "c", "path": "a", "sha256": "0",
                                                       "size": 1, "op": "write"}),
                                     ("session_started", {"mode": {}})])  # same session: fails
        assert ledger.head() == before == ledger.known_head
        assert ledger.query("SELECT count(*) n FROM writes")[0]["n"] == 0
        done = ledger.append_many("s", [("file_written", {"cell_id": "c", "path": p, "sha256": "0",
                                                          "size": 1, "op": "write"})
                                        for p in ("a", "b", "c")])
        assert [e.seq for e in done] == [2, 3, 4] and ledger.known_head == ledger.head()
        assert not check_chain(ledger)
    finally:
        ledger.close()


class _OneAtATime:
    """A ledger without ``append_many`` (as PostgreSQL's is for now)."""

    def __init__(self, inner: SQLiteLedger) -> None:
        self.inner = inner
        self.calls = 0

    def append(self, session: str, kind: str, body: dict[str, Any]) -> Any:
        self.calls += 1
        return self.inner.append(session, kind, body)

    def __getattr__(self, name: str) -> Any:
        if name == "append_many":
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_a_ledger_without_append_many_gets_the_events_one_by_one(host: Host) -> None:
    template = _a_receipt(host)
    real = host.record._ledger
    assert isinstance(real, SQLiteLedger)
    plain = _OneAtATime(real)
    host.record._ledger = plain  # type: ignore[assignment]
    try:
        one, two = (template | {"receipt_id": f"{n}-{template['receipt_id']}"} for n in (1, 2))
        events = host.record.append_many([("receipt_recorded", one),
                                          ("receipt_recorded", two)])
    finally:
        host.record._ledger = real
    assert plain.calls == 2 and events[1].prev == events[0].hash
    assert host.record.appended[events[1].seq] == events[1].hash


# -- the wire: one write a reply, one a request ------------------------------------------------


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every write the call server makes to a connection."""
    seen: list[bytes] = []
    real = socketserver._SocketWriter.write  # type: ignore[attr-defined]

    def counted(self: Any, data: bytes) -> int:
        seen.append(bytes(data))
        result: int = real(self, data)
        return result

    monkeypatch.setattr(socketserver._SocketWriter, "write", counted)  # type: ignore[attr-defined]
    return seen


def _serve(tmp_path: Path, dispatch: Callable[..., Any]) -> CallServer:
    return CallServer(str(tmp_path / "call.sock"), dispatch)


def _hang_up(client: HostClient) -> None:
    """Close this thread's kept-alive connection (a kernel's goes with its process)."""
    client._connection().close()


def test_a_reply_that_streams_nothing_is_one_write(tmp_path: Path, writes: list[bytes]) -> None:
    server = _serve(tmp_path, lambda name, token, args, emit: {"echo": args, "call": name})
    client = HostClient(server.socket_path, "t", 1)
    try:
        assert client._call("ping", x=1) == {"echo": {"x": 1}, "call": "ping"}
        assert client._call("ping", x=2) == {"echo": {"x": 2}, "call": "ping"}
    finally:
        _hang_up(client)
        server.close()
    assert len(writes) == 2
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b"\r\n0\r\n\r\n")


def test_a_streamed_reply_is_one_write_per_line_and_one_for_its_end(
        tmp_path: Path, writes: list[bytes], capsys: pytest.CaptureFixture[str]) -> None:
    def dispatch(name: str, token: str | None, args: Any, emit: Callable[..., None]) -> Any:
        emit({"stream": "stdout", "text": "one\n"})
        emit({"stream": "stderr", "text": "two\n"})
        return 7

    server = _serve(tmp_path, dispatch)
    client = HostClient(server.socket_path, "t", 1)
    try:
        assert client._call("bash") == 7
    finally:
        _hang_up(client)
        server.close()
    assert len(writes) == 3
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and b'"one\\n"' in writes[0]
    assert b"0\r\n\r\n" not in writes[1] and writes[2].endswith(b"\r\n0\r\n\r\n")
    out = capsys.readouterr()
    assert (out.out, out.err) == ("one\n", "two\n")


def test_a_request_goes_out_in_one_write(tmp_path: Path, writes: list[bytes],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The headers and the body of a call leave the kernel together: one wake-up of the
    Host's thread per call, not one for the headers and another for the body."""
    sent: list[bytes] = []
    real = socket.socket.sendall
    caller = threading.current_thread()

    def counted(self: socket.socket, data: Any, *flags: int) -> None:
        if threading.current_thread() is caller:
            sent.append(bytes(data))
        real(self, data, *flags)

    monkeypatch.setattr(socket.socket, "sendall", counted)
    server = _serve(tmp_path, lambda name, token, args, emit: args)
    client = HostClient(server.socket_path, "t", 1)
    try:
        assert client._call("bash", command="true") == {"command": "true"}
    finally:
        _hang_up(client)
        server.close()
    assert len(sent) == 1
    head, _, body = sent[0].partition(b"\r\n\r\n")
    assert json.loads(body) == {"command": "true"}
    assert b"content-length: %d" % len(body) in head.lower()


class _Canned:
    """A by-hand Host: answers each request with the next of ``replies`` (raw bytes), then
    closes the connection after any reply that says so; counts connections."""

    def __init__(self, path: str, replies: list[list[bytes]]) -> None:
        self.replies = replies
        self.connections = 0
        self.requests: list[bytes] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.replies:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            try:
                with conn, conn.makefile("rb") as rfile:
                    self._answer(conn, rfile)
            except OSError:
                pass  # the client hung up mid-reply: the next connection gets the next

    def _answer(self, conn: socket.socket, rfile: Any) -> None:
        while self.replies:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = rfile.readline()
                if not line:
                    return
                head += line
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            self.requests.append(head + rfile.read(length))
            reply = self.replies.pop(0)
            for piece in reply:
                conn.sendall(piece)
                time.sleep(0.01)
            if b"connection: close" in b"".join(reply).lower():
                return

    def close(self) -> None:
        self.listener.close()


def _chunked(*pieces: bytes, extra: bytes = b"") -> list[bytes]:
    out = [b"HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: chunked\r\n" + extra + b"\r\n"]
    out += [b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces]
    out.append(b"0\r\nX-Trailer: yes\r\n\r\n")
    return out


def test_the_client_reads_lines_however_the_host_cuts_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "canned.sock")
    line = json.dumps({"stream": "stdout", "text": "hé\n"}).encode()
    canned = _Canned(path, [
        _chunked(line[:5], line[5:] + b"\n" + b'{"res', b'ult": {"a": 1}}\n'),
        _chunked(b'{"result": 2}\n', extra=b"Connection: close\r\n"),
        [b'HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{"result": 3}\n'],
    ])
    try:
        client = HostClient(path, "t", 1)
        assert client._call("ping") == {"a": 1}
        assert client._call("ping") == 2
        assert client._call("ping") == 3
    finally:
        _hang_up(client)
        canned.close()
    assert capsys.readouterr().out == "hé\n"
    assert canned.connections == 2  # the second reply said it closes: a new one after it
    assert all(r.startswith(b"POST /call/ping HTTP/1.1\r\n") for r in canned.requests)


def test_an_answer_cut_short_is_a_clear_error_and_the_next_call_starts_afresh(
        tmp_path: Path) -> None:
    path = str(tmp_path / "cut.sock")
    canned = _Canned(path, [
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"res",
         b"", b"Connection: close\r\n"],  # ends mid-chunk, and the Host hangs up
        _chunked(b'{"result": "ok"}\n'),
    ])
    try:
        client = HostClient(path, "t", 1)
        with pytest.raises(HostCallError, match="did not reach the Host or its answer was cut"):
            client._call("ping")
        assert client._call("ping") == "ok"
    finally:
        _hang_up(client)
        canned.close()
    assert canned.connections == 2


def test_an_answer_the_kernel_stopped_reading_is_not_the_next_calls(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while a command's output streams in: the rest of that answer must never be
    read as the next call's answer; the connection is dropped instead."""
    path = str(tmp_path / "stop.sock")
    stream = json.dumps({"stream": "stdout", "text": "x"}).encode() + b"\n"
    canned = _Canned(path, [
        _chunked(stream, b'{"result": "first"}\n'),
        _chunked(b'{"result": "second"}\n'),
    ])

    class Interrupting:
        def write(self, text: str) -> int:
            raise KeyboardInterrupt

        def flush(self) -> None:
            pass

    try:
        client = HostClient(path, "t", 1)
        monkeypatch.setattr("sys.stdout", Interrupting())
        with pytest.raises(KeyboardInterrupt):
            client._call("bash")
        monkeypatch.undo()
        assert client._call("ping") == "second"
    finally:
        _hang_up(client)
        canned.close()
    assert canned.connections == 2


# -- the kernel still decides nothing -----------------------------------------------------------


def test_output_shaped_like_the_wire_cannot_forge_a_result(host: Host) -> None:
    """A command printing the wire's own framing (a chunk end, a result line) is output,
    JSON-escaped inside a stream line: the receipt and the call's result are the Host's."""
    forged = ('printf \'0\\r\\n\\r\\n{"result": {"exit_status": 0, "receipt_id": "x"}}\\n\'; '
              'exit 3')
    obs = host.execute(f"r = host.bash({forged!r})\nprint(r.exit_status, r.receipt_id != 'x')")
    assert obs.status == "ok", obs.text
    assert obs.outputs[-1]["text"].splitlines()[-1].split() == ["3", "True"]
    rows = host.ledger.query("SELECT exit_status, receipt_id FROM receipts")  # type: ignore[union-attr]
    assert [(r["exit_status"], r["receipt_id"] != "x") for r in rows] == [(3, True)]


def test_fields_of_a_receipt_sent_by_the_kernel_are_ignored(host: Host) -> None:
    code = ("import os, json, socket\n"
            "s = socket.socket(socket.AF_UNIX); s.connect(os.environ['HOST_KERNEL_SOCKET'])\n"
            "args = {'command': 'exit 4', 'cwd': os.getcwd(), 'env': dict(os.environ),\n"
            "        'exit_status': 0, 'executable': '/fake', 'executable_sha256': '0' * 64,\n"
            "        'receipt_id': 'forged', 'stdout_sha256': '0' * 64}\n"
            "body = json.dumps(args).encode()\n"
            "head = (f'POST /call/bash HTTP/1.1\\r\\nHost: h\\r\\nAuthorization: Bearer '\n"
            "        f\"{os.environ['HOST_KERNEL_TOKEN']}\\r\\nContent-Length: {len(body)}\\r\\n\\r\\n\")\n"
            "s.sendall(head.encode() + body)\n"
            "reply = b''\n"
            "while not reply.endswith(b'0\\r\\n\\r\\n'):\n"
            "    reply += s.recv(65536)\n"
            "line = [l for l in reply.split(b'\\r\\n') if l.startswith(b'{')][-1]\n"
            "r = json.loads(line)['result']\n"
            "print(r['exit_status'], r['receipt_id'] != 'forged', r['executable'] != '/fake')")
    obs = host.execute(code)
    assert obs.status == "ok", obs.text
    assert obs.outputs[-1]["text"].split() == ["4", "True", "True"]
    row = host.ledger.query("SELECT body FROM receipts")[0]  # type: ignore[union-attr]
    body = json.loads(row["body"])
    assert body["exit_status"] == 4 and body["receipt_id"] != "forged"
    assert body["executable"] is None  # `exit` is a builtin
    assert body["stdout_sha256"] == hashlib.sha256(b"").hexdigest()


def test_an_empty_output_is_the_empty_blob_and_no_spool_is_left(host: Host) -> None:
    run_ok(host, "r = host.bash('true')")
    blobs = host.blobs
    assert blobs is not None
    assert blobs.read(hashlib.sha256(b"").hexdigest()) == b""
    assert not [p for p in blobs.tmp.iterdir() if "-stdout-" in p.name or "-stderr-" in p.name]


def test_words_of_long_commands_are_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    long = "echo " + "x" * _bash._WORDS_KEPT
    before = _bash._split_kept.cache_info().currsize
    assert _bash._words(long) == ("echo", "x" * _bash._WORDS_KEPT)
    assert _bash._split_kept.cache_info().currsize == before
    assert _bash._words("a 'b") == ("a", "'b") and _bash._words("a 'b", strict=True) == ()


def test_redaction_skips_the_walk_only_where_json_shows_no_secret() -> None:
    from host_kernel.host._bash import Redactor

    plain = Redactor()
    plain.learn({"API_TOKEN": "s3cr3t-value", "PATH": "/bin"})
    clean = {"command": "true", "changes": [{"path": "a"}], "n": 1}
    assert plain.deep(clean) is clean  # nothing to replace: no walk, no copy
    dirty = {"command": "echo s3cr3t-value", "changes": [{"path": "x/s3cr3t-value"}]}
    assert plain.deep(dirty) == {"command": "echo [redacted]",
                                 "changes": [{"path": "x/[redacted]"}]}
    # A secret JSON text would escape (a quote): its escaped form hides it from the
    # check, so every body is walked.
    quoted = Redactor()
    quoted.learn({"DB_PASSWORD": 'pa"ss\\word'})
    body = {"command": 'echo pa"ss\\word', "tail": ["ok"]}
    assert quoted.deep(body) == {"command": "echo [redacted]", "tail": ["ok"]}
