"""Faults between a Host and its stores, on loopback, that a test turns on when it wants.

:class:`CommitDropper` forwards TCP to a PostgreSQL server and reads the server's side of
the protocol message by message; armed (:meth:`CommitDropper.drop_next_commit`), it cuts
the connection instead of passing on the server's reply to the next ``COMMIT``: the
transaction is committed, and the client never hears it (a lost reply). Clients must not
ask for TLS or GSSAPI (:meth:`CommitDropper.url` adds ``sslmode=disable`` and
``gssencmode=disable``): the forwarder reads plain protocol messages from the first byte.

:class:`SlowDownProxy` is an HTTP server in front of an S3 API (moto's server): it passes
each request on, or, for the next ``N`` requests it is told to refuse
(:meth:`SlowDownProxy.refuse`, of one method or any), answers ``503 SlowDown`` itself,
as S3 does when it throttles.
"""

from __future__ import annotations

import http.client
import http.server
import socket
import struct
import threading
import time
import urllib.parse
from typing import Any, Self


class CommitDropper:
    """A TCP forwarder from 127.0.0.1:``port`` to ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._armed = threading.Event()
        self._then_refuse = 0.0
        self._refuse_until = 0.0
        self._closing = False
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        #: How many connections were cut after their server committed.
        self.dropped = 0
        #: Set when a connection was cut.
        self.cut = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="commit-dropper",
                                        daemon=True)
        self._thread.start()

    def url(self, database_url: str) -> str:
        """``database_url`` (a URL of the upstream server) through this forwarder."""
        parts = urllib.parse.urlsplit(database_url)
        netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{self.port}"
        query = "sslmode=disable&gssencmode=disable"
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))

    def drop_next_commit(self, *, then_refuse: float = 0.0) -> None:
        """Cut the next connection whose server replies to a COMMIT, before the reply; then
        close every new connection at once for ``then_refuse`` seconds (the server seems
        gone: the client cannot learn what became of its commit)."""
        self.cut.clear()
        self._then_refuse = then_refuse
        self._armed.set()

    def close(self) -> None:
        self._closing = True
        self._thread.join(5)
        self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                _close(sock)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- forwarding

    def _accept(self) -> None:
        self._listener.settimeout(0.1)  # close() is seen within this, not only at a connect
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            if time.monotonic() < self._refuse_until:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                _close(client)  # the server is down: the client sees a refused start
                continue
            with self._lock:
                self._sockets |= {client, server}
            threading.Thread(target=self._pump_up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(server, client), daemon=True).start()

    def _pump_up(self, client: socket.socket, server: socket.socket) -> None:
        """Client to server, as it comes."""
        try:
            while data := client.recv(65536):
                server.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(client, server)

    def _pump_down(self, server: socket.socket, client: socket.socket) -> None:
        """Server to client, one whole message at a time, watching for COMMIT's reply."""
        buffer = b""
        try:
            while data := server.recv(65536):
                buffer += data
                out = bytearray()
                while len(buffer) >= 5:
                    kind = buffer[:1]
                    (length,) = struct.unpack("!I", buffer[1:5])
                    if len(buffer) < 1 + length:
                        break
                    message, buffer = buffer[:1 + length], buffer[1 + length:]
                    if kind == b"C" and message[5:].startswith(b"COMMIT\x00") and \
                            self._armed.is_set():
                        self._armed.clear()
                        if out:
                            client.sendall(bytes(out))
                        self.dropped += 1
                        self._refuse_until = time.monotonic() + self._then_refuse
                        self._drop(client, server)
                        self.cut.set()
                        return
                    out += message
                if out:
                    client.sendall(bytes(out))
        except OSError:
            pass
        finally:
            self._drop(client, server)

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._sockets.discard(sock)
                _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


# --------------------------------------------------------------------------- HTTP

_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
              b"<Message>Please reduce your request rate.</Message></Error>")
#: Headers that belong to one hop, never passed on.
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailers", "transfer-encoding", "upgrade", "content-length"}


class SlowDownProxy:
    """An HTTP server on 127.0.0.1 in front of ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._lock = threading.Lock()
        self._refusing = 0
        self._method: str | None = None
        #: Requests answered 503 so far, and requests passed on.
        self.refused = 0
        self.passed = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _any(self) -> None:
                body = self._body()
                if proxy._take_refusal(self.command):
                    self.send_response(503, "Slow Down")
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(_SLOW_DOWN)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(_SLOW_DOWN)
                    return
                conn = http.client.HTTPConnection(*proxy._upstream, timeout=30)
                try:
                    conn.putrequest(self.command, self.path, skip_host=True,
                                    skip_accept_encoding=True)
                    for name, value in self.headers.items():
                        if name.lower() not in _HOP:
                            conn.putheader(name, value)
                    conn.putheader("Content-Length", str(len(body)))
                    conn.endheaders(body)
                    reply = conn.getresponse()
                    data = reply.read()
                    self.send_response(reply.status, reply.reason)
                    for name, value in reply.getheaders():
                        if name.lower() not in _HOP:
                            self.send_header(name, value)
                    length = reply.getheader("Content-Length") if self.command == "HEAD" \
                        else None
                    self.send_header("Content-Length", length or str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()
                with proxy._lock:
                    proxy.passed += 1

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="slowdown",
                                        daemon=True)
        self._thread.start()

    def refuse(self, requests: int, method: str | None = None) -> None:
        """Answer the next ``requests`` requests (of ``method`` only, when given)
        ``503 SlowDown``."""
        with self._lock:
            self._refusing, self._method = requests, method

    def _take_refusal(self, method: str) -> bool:
        with self._lock:
            if self._refusing <= 0 or self._method not in (None, method):
                return False
            self._refusing -= 1
            self.refused += 1
            return True

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
