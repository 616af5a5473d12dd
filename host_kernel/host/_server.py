"""The Host's end of the kernel→Host channel: HTTP/1.1 over a Unix-domain socket.

Owns the wire only. Each request is ``POST /call/<name>`` with a bearer token
and a JSON object of arguments; the reply is newline-delimited JSON sent with
chunked encoding, so a call can stream lines (``{"stream": "stdout", "text":
…}``) before its last line, which is ``{"result": …}`` or ``{"error": …}``.
Which calls exist, who may make them and what they do is the Host's business
(``dispatch``); this module never decides acceptance.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from .._errors import BadArguments, HostKernelError

__all__ = ["CallServer", "Emit", "Dispatch"]

#: Largest request body accepted (a write_file of this much content is refused).
MAX_BODY = 256 * 1024 * 1024

Emit = Callable[[dict[str, Any]], None]
Dispatch = Callable[[str, str | None, Any, Emit], Any]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _UnixServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # the record, not a log line, is where calls are kept

    def address_string(self) -> str:
        return "unix"

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        refused: HostKernelError | None = None
        try:
            name, token, args = self._parse()
        except HostKernelError as exc:
            refused = exc
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        if self.close_connection:
            # A body refused unread: the client must not send its next call on this one.
            self.send_header("Connection", "close")
        self.end_headers()
        lock = threading.Lock()

        def emit(line: dict[str, Any]) -> None:
            data = (json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8")
            with lock:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        try:
            if refused is not None:
                raise refused
            result = self.server.dispatch(name, token, args, emit)
            emit({"result": result})
        except HostKernelError as exc:
            emit({"error": exc.to_dict()})
        except Exception as exc:  # a Host bug must not kill the channel; say what broke
            emit({"error": {"type": "HostKernelError", "code": "host_internal_error",
                            "message": f"the Host failed to carry out the call: "
                                       f"{type(exc).__name__}: {exc}"}})
        with lock:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def _parse(self) -> tuple[str, str | None, Any]:
        if not self.path.startswith("/call/"):
            raise BadArguments(f"unknown endpoint {self.path!r}")
        name = self.path[len("/call/"):]
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise BadArguments("Content-Length is not a number") from None
        if length < 0 or length > MAX_BODY:
            # Drain nothing: the connection closes after this reply.
            self.close_connection = True
            raise BadArguments(f"request body of {length} bytes is over the {MAX_BODY}-byte "
                               f"limit; write large data with bash or in chunks")
        raw = self.rfile.read(length) if length else b"{}"
        try:
            args = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadArguments(f"request body is not JSON: {exc}") from None
        return name, token, args


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False
    dispatch: Dispatch


class CallServer:
    """Serve ``dispatch`` on a Unix socket (mode 0600) from a background thread."""

    def __init__(self, socket_path: str, dispatch: Dispatch) -> None:
        self.socket_path = socket_path
        old_umask = os.umask(0o177)
        try:
            self._server = _UnixServer(socket_path, _Handler)
        finally:
            os.umask(old_umask)
        os.chmod(socket_path, 0o600)
        self._server.dispatch = dispatch
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="host-kernel-calls", daemon=True)
        self._thread.start()

    def close(self) -> None:
        # serve_forever notices a shutdown only between polls (0.2 s): wake it with
        # empty connections (each ends at once) until it has stopped.
        stopper = threading.Thread(target=self._server.shutdown, daemon=True)
        stopper.start()
        while stopper.is_alive():
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
                    wake.settimeout(1.0)
                    wake.connect(self.socket_path)
            except OSError:
                pass
            stopper.join(0.005)
        self._server.server_close()
        self._thread.join(timeout=5)
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
