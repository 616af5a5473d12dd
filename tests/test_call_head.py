"""The call server's request head, read by its own parser (host/_server.py
``_Handler.parse_request``): a real CallServer on a real Unix socket, raw requests sent
by hand, the bounds and answers the standard library's parser gave kept."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host_kernel.host._server import HEAD_LINE_LIMIT, HEAD_LINES_LIMIT, CallServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[CallServer, list[tuple[str, Any, Any]]]]:
    seen: list[tuple[str, Any, Any]] = []

    def dispatch(name: str, token: str | None, args: Any, emit: Any) -> Any:
        seen.append((name, token, args))
        return {"call": name, "token": token}

    srv = CallServer(str(tmp_path / "call.sock"), dispatch)
    try:
        yield srv, seen
    finally:
        srv.close()


def _connect(srv: CallServer) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(srv.socket_path)
    return s


def _request(name: str = "ping", version: str = "HTTP/1.1", head: tuple[str, ...] = (),
             body: bytes = b"{}") -> bytes:
    lines = [f"POST /call/{name} {version}", "Authorization: Bearer tok",
             f"Content-Length: {len(body)}", *head]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _reply(s: socket.socket) -> bytes:
    """One reply: to the end of its chunked body, or to the connection's close."""
    data = b""
    while not data.endswith(b"0\r\n\r\n"):
        more = s.recv(65536)
        if not more:
            break
        data += more
    return data


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except OSError:
        return True


def _result(reply: bytes) -> Any:
    return json.loads(next(line for line in reply.splitlines() if line.startswith(b"{")))


def test_a_call_is_read_and_the_connection_kept_for_the_next(server: Any) -> None:
    srv, seen = server
    with _connect(srv) as s:
        s.sendall(_request("ping", body=b'{"x": 1}'))
        first = _reply(s)
        s.sendall(_request("cell_id", head=("content-type: application/json",)))
        second = _reply(s)
    assert first.startswith(b"HTTP/1.1 200 OK\r\n"), first
    assert _result(first) == {"result": {"call": "ping", "token": "tok"}}
    assert _result(second) == {"result": {"call": "cell_id", "token": "tok"}}
    assert seen == [("ping", "tok", {"x": 1}), ("cell_id", "tok", {})]


def test_header_names_are_matched_whatever_their_case_and_the_first_of_a_pair_counts(
        server: Any) -> None:
    srv, seen = server
    raw = (b"POST /call/ping HTTP/1.1\r\nauthorization: Bearer first\r\n"
           b"AUTHORIZATION: Bearer second\r\ncontent-LENGTH: 2\r\n\r\n{}")
    with _connect(srv) as s:
        s.sendall(raw)
        reply = _reply(s)
    assert _result(reply) == {"result": {"call": "ping", "token": "first"}}
    assert seen == [("ping", "first", {})]


@pytest.mark.parametrize("head, version", [
    ((), "HTTP/1.0"),
    (("Connection: close",), "HTTP/1.1"),
    (("connection: CLOSE",), "HTTP/1.1"),
])
def test_a_connection_asked_to_close_is_closed_after_its_reply(server: Any, head: Any,
                                                               version: str) -> None:
    srv, seen = server
    with _connect(srv) as s:
        s.sendall(_request(version=version, head=head))
        reply = _reply(s)
        assert _result(reply) == {"result": {"call": "ping", "token": "tok"}}
        assert _closed(s)
    assert len(seen) == 1


def test_a_chunked_body_is_still_refused_whatever_the_case_of_its_header(server: Any) -> None:
    srv, seen = server
    with _connect(srv) as s:
        s.sendall(b"POST /call/ping HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n")
        reply = _reply(s)
    assert _result(reply)["error"]["code"] == "body_malformed", reply
    assert seen == []


@pytest.mark.parametrize("raw, status", [
    (b"POST /call/ping\r\n\r\n", b"400"),                            # two words
    (b"POST /call/ping HTTP/2.0\r\n\r\n", b"400"),                   # not HTTP/1.x
    (b"POST /call/a b HTTP/1.1\r\n\r\n", b"400"),                    # four words
    (b"POST /call/ping HTTP/1.1\r\nNoColonHere\r\n\r\n", b"400"),     # a header with no ':'
    (b"POST /call/ping HTTP/1.1\r\nA: 1\r\n folded\r\n\r\n", b"400"),  # a folded line
    (b"POST /call/ping HTTP/1.1\r\nBad Name: 1\r\n\r\n", b"400"),     # not a token
    (b"POST /call/ping HTTP/1.1\r\nName : 1\r\n\r\n", b"400"),         # space before ':' 
    (b"POST /call/ping HTTP/1.1\r\n: empty\r\n\r\n", b"400"),         # no name
])
def test_a_malformed_head_is_answered_with_an_error_and_closed(server: Any, raw: bytes,
                                                                status: bytes) -> None:
    srv, seen = server
    with _connect(srv) as s:
        s.sendall(raw)
        reply = _reply(s)
        assert reply.split(b" ", 2)[1] == status, reply
        if status != b"200":
            assert _closed(s)
    assert len(seen) == (1 if status == b"200" else 0)


def test_too_many_header_lines_are_refused_unread(server: Any) -> None:
    srv, seen = server
    head = tuple(f"X-{i}: {i}" for i in range(HEAD_LINES_LIMIT + 1))
    with _connect(srv) as s:
        s.sendall(_request(head=head))
        reply = _reply(s)
        assert reply.startswith(b"HTTP/1.1 431"), reply[:80]
        assert _closed(s)
    assert seen == []
    # As many as the limit (with the two the request always has) are fine.
    with _connect(srv) as s:
        s.sendall(_request(head=head[:HEAD_LINES_LIMIT - 2]))
        assert _result(_reply(s)) == {"result": {"call": "ping", "token": "tok"}}


def test_a_header_line_past_the_limit_is_refused(server: Any) -> None:
    srv, seen = server
    with _connect(srv) as s:
        s.sendall(_request(head=("X-Long: " + "a" * HEAD_LINE_LIMIT,)))
        reply = _reply(s)
        assert reply.startswith(b"HTTP/1.1 431"), reply[:80]
        assert _closed(s)
    assert seen == []
