"""The Host's end of the kernel→Host channel: HTTP/1.1 over a Unix-domain socket, bounded.

Owns the wire and what the wire lets a kernel make the Host hold. Each request
is ``POST /call/<name>`` with a bearer token and a JSON object of arguments
(``write_file`` may instead send the file's bytes raw, ``application/octet-stream``,
its other arguments as JSON in the ``Host-Kernel-Args`` header); the reply is
newline-delimited JSON sent with chunked encoding, so a call can stream lines
(``{"stream": "stdout", "text": …}``) before its last line, which is
``{"result": …}`` or ``{"error": …}``. Each streamed line is one write; the last
line and the reply's end are one write (with the status line and headers when
nothing was streamed), so a call that streams nothing wakes the kernel once for its
whole answer. Which calls exist, who may make them and what they do is the Host's
business (``dispatch``); this module never decides acceptance.

The bounds, each checked before anything is held (docs/security.md states them):

- a JSON body: ``Content-Length`` required and at most :data:`CALL_BODY_LIMIT`,
  checked before a byte of it is read; at most :data:`JSON_VALUE_LIMIT` values,
  counted before it is parsed; JSON bodies over :data:`SMALL_BODY` bytes share
  :data:`BODIES_IN_FLIGHT` bytes at once (a call waits up to :data:`BODY_WAIT`);
- a raw ``write_file`` body: at most :data:`MAX_BODY`, never held: the handler
  reads it from the connection in pieces (:class:`RawBody`) once the dispatcher
  has let the call through, and a refused call's body is never read;
- no chunked request bodies; a body must arrive whole within :data:`BODY_DEADLINE`;
- at most :data:`MAX_CONNECTIONS` connections (one thread each); the next is
  answered with a refusal and closed by the accepting thread, no thread made;
- a new connection that sends no request within :data:`FIRST_REQUEST_TIMEOUT`,
  or a kept-alive one idle for :data:`IDLE_TIMEOUT`, is closed;
- refusals are recorded once per cause (:class:`RefusalLog`): the first in
  full, the rest counted, and a count recorded when the log is flushed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from .._errors import BadArguments, CallRefused, HostCallError, HostKernelError

__all__ = ["BODIES_IN_FLIGHT", "CALL_BODY_LIMIT", "IDLE_TIMEOUT", "JSON_VALUE_LIMIT",
           "MAX_BODY", "MAX_CONNECTIONS", "CallServer", "Dispatch", "Emit", "RawBody",
           "RefusalLog"]

_MIB = 1024 * 1024

#: Largest JSON request body of any call (a call's arguments; write_file's file goes raw).
CALL_BODY_LIMIT = 8 * _MIB
#: Most JSON values (objects, arrays and the items in them) one call's arguments may hold.
JSON_VALUE_LIMIT = 200_000
#: Largest file a raw write_file body may carry; streamed to disk, never held whole.
MAX_BODY = 256 * _MIB
#: JSON bodies up to this size are read without waiting for room in the budget below.
SMALL_BODY = 64 * 1024
#: Bytes of larger JSON bodies read and parsed at once, over every connection.
BODIES_IN_FLIGHT = 32 * _MIB
#: Seconds a large JSON body waits for room in that budget before it is refused.
BODY_WAIT = 10.0
#: Seconds within which a request's whole body must arrive once its headers have.
BODY_DEADLINE = 60.0
#: Connections open at once; each has one thread while it is open.
MAX_CONNECTIONS = 32
#: Seconds a new connection may take to send its first request line.
FIRST_REQUEST_TIMEOUT = 10.0
#: Seconds a kept-alive connection may stay silent between requests (the kernel's
#: client drops connections idle for a third of this before it reuses one).
IDLE_TIMEOUT = 60.0
#: The Content-Type of a raw write_file body, and the header carrying its arguments.
RAW_TYPE = "application/octet-stream"
ARGS_HEADER = "Host-Kernel-Args"
#: Calls that may send a raw body, and the argument the body is handed to them as.
RAW_CALLS = {"write_file": "content"}
_CHUNK = _MIB

#: Longest request line or header line, and most header lines, a request may have (the
#: standard library's own bounds for an HTTP head).
HEAD_LINE_LIMIT = 65536
HEAD_LINES_LIMIT = 100

Emit = Callable[[dict[str, Any]], None]
Dispatch = Callable[[str, str | None, Any, Emit], Any]
#: Records one refusal: ``(kind, body)`` as SessionRecord.append takes them.
Append = Callable[[str, dict[str, Any]], Any]


class RefusalLog:
    """Refusals recorded once per cause: the first in full, the rest counted.

    A cause is a refusal code and the cell the call was attributed to (None between
    cells, and for calls that carry no valid token, whose text is the caller's own).
    :meth:`flush` records, for every cause refused again since it was recorded, one
    ``call_refused`` event with ``repeats`` (how many more) and nothing of the
    callers' text; causes tied to a cell are then forgotten (the cell is over). So a
    kernel, or anything else that reaches the socket, makes the record grow by at
    most two events per cause per cell, however many calls it sends.
    """

    def __init__(self, append: Append | None = None) -> None:
        self.append = append
        self._lock = threading.Lock()
        #: cause -> [generation, calls refused since it was last recorded]
        self._seen: dict[tuple[str, str | None], list[Any]] = {}

    def refused(self, generation: int | None, cell_id: str | None, call: str, code: str,
                reason: str) -> bool:
        """Note one refusal; record it when its cause is new. True when recorded."""
        cause = (code, cell_id)
        with self._lock:
            seen = self._seen.get(cause)
            if seen is not None:
                seen[1] += 1
                return False
            self._seen[cause] = [generation, 0]
        self._append({"generation": generation, "cell_id": cell_id, "call": call[:200],
                      "code": code, "reason": reason})
        return True

    def pending(self) -> dict[str, int]:
        """Refusals counted but not yet recorded, by code."""
        with self._lock:
            out: dict[str, int] = {}
            for (code, _), (_, count) in self._seen.items():
                if count:
                    out[code] = out.get(code, 0) + count
            return out

    def flush(self) -> None:
        """Record the count of every cause refused again since it was recorded."""
        with self._lock:
            due = [(cause, seen[0], seen[1]) for cause, seen in self._seen.items() if seen[1]]
            for cause, seen in self._seen.items():
                seen[1] = 0
            for cause in [c for c in self._seen if c[1] is not None]:
                del self._seen[cause]
        for (code, cell_id), generation, count in due:
            self._append({
                "generation": generation, "cell_id": cell_id, "call": None, "code": code,
                "repeats": count,
                "reason": f"{count} more call(s) were refused for this cause ({code}) after "
                          f"the first was recorded; they were counted, not recorded one by one"})

    def _append(self, body: dict[str, Any]) -> None:
        if self.append is None:
            return
        try:
            self.append("call_refused", body)
        except HostKernelError:
            pass  # the caller still gets the refusal; audit will show a missing ledger


class _Budget:
    """Bytes that large JSON bodies may take at once, over every connection."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._cond = threading.Condition()

    def take(self, size: int, wait: float) -> bool:
        size = min(size, self.total)
        deadline = time.monotonic() + wait
        with self._cond:
            while self.free < size:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self.free -= size
            return True

    def give(self, size: int) -> None:
        with self._cond:
            self.free += min(size, self.total)
            self._cond.notify_all()


class RawBody:
    """The bytes of a raw request body, read from the connection as a handler asks.

    Only the server makes one (a kernel cannot send one as JSON), so a handler that
    finds one among its arguments knows the bytes come from this call's body. Reading
    stops at ``size`` bytes; a body that ends early, stalls past the idle timeout or
    arrives slower than :data:`BODY_DEADLINE` allows raises BadArguments.
    """

    def __init__(self, handler: _Handler, size: int, deadline: float) -> None:
        self.size = size
        self._handler = handler
        self._deadline = deadline

    @property
    def left(self) -> int:
        return self._handler.body_left

    def chunks(self, size: int = _CHUNK) -> Iterator[bytes]:
        while self._handler.body_left > 0:
            yield self._handler.read_body(min(size, self._handler.body_left), self._deadline)


#: The chunk that ends a chunked reply.
_LAST_CHUNK = b"0\r\n\r\n"


class _Headers(dict[str, str]):
    """A request's headers by lower-cased name: the first of a repeated name, as
    ``email.message.Message.get`` gives it."""

    def add(self, name: str, value: str) -> None:
        self.setdefault(name.lower(), value)

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())


def _line(value: dict[str, Any]) -> bytes:
    """One newline-delimited JSON line of a reply."""
    return (json.dumps(value, ensure_ascii=False) + "\n").encode("utf-8")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _UnixServer
    raw_requestline: bytes

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # the record, not a log line, is where calls are kept

    def address_string(self) -> str:
        return "unix"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(FIRST_REQUEST_TIMEOUT)
        self.body_left = 0

    def parse_request(self) -> bool:
        """The request line and headers (``BaseHTTPRequestHandler.parse_request``'s
        duties) without the email package, which took about a tenth of a millisecond of
        every call: a request line of three words with an HTTP/1.0 or 1.1 version, at most
        :data:`HEAD_LINES_LIMIT` header lines of at most :data:`HEAD_LINE_LIMIT` bytes, each
        ``Name: value`` with a token for a name (no folded lines). Anything else is
        answered with an error status and the connection closed."""
        self.command = None  # type: ignore[assignment]  # as the standard library starts
        self.request_version = version = self.default_request_version
        self.close_connection = True
        line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        self.requestline = line
        words = line.split(" ")
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self.request_version = "HTTP/1.0"  # an answer with a status line, then close
            self.send_error(400, "Bad request line")
            return False
        self.command, self.path, self.request_version = words
        version = words[2]
        headers = _Headers()
        for _ in range(HEAD_LINES_LIMIT + 1):
            raw = self.rfile.readline(HEAD_LINE_LIMIT + 1)
            if len(raw) > HEAD_LINE_LIMIT:
                self.send_error(431, "Line too long")
                return False
            if raw in (b"\r\n", b"\n", b""):
                break
            name, colon, value = str(raw, "iso-8859-1").partition(":")
            if not colon or not _TOKEN.fullmatch(name):
                self.send_error(400, "Bad header line")
                return False
            headers.add(name, value.strip())
        else:
            self.send_error(431, "Too many headers")
            return False
        self.headers = headers  # type: ignore[assignment]  # what the handler reads of it
        connection = headers.get("Connection", "").lower()
        self.close_connection = connection == "close" or (
            version == "HTTP/1.0" and connection != "keep-alive")
        return True

    def handle_one_request(self) -> None:
        super().handle_one_request()
        # After the first request, a kept-alive connection may wait longer for the next.
        self.connection.settimeout(IDLE_TIMEOUT)

    def read_body(self, size: int, deadline: float) -> bytes:
        """Up to ``size`` bytes of the body (at least one), within ``deadline``."""
        left = deadline - time.monotonic()
        if left <= 0:
            self.close_connection = True
            raise BadArguments(f"the request body did not arrive within {BODY_DEADLINE:g} s; "
                               f"send it whole at once", code="body_malformed")
        try:
            self.connection.settimeout(min(IDLE_TIMEOUT, left))
            data = self.rfile.read1(min(size, self.body_left))
        except OSError:
            data = b""
        finally:
            self.connection.settimeout(IDLE_TIMEOUT)  # replies are written with this one
        if not data:
            self.close_connection = True
            self.body_left = 0
            raise BadArguments("the request body ended or stalled before its Content-Length "
                               "was reached", code="body_malformed")
        self.body_left -= len(data)
        return data

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        self.body_left = 0
        self._started = False
        self._lock = threading.Lock()
        refused: HostKernelError | None = None
        name, token, args = "", None, None
        reserved = 0
        try:
            name, token, args, reserved = self._parse()
        except HostCallError as exc:
            refused = exc
            self.server.refusals.refused(None, None, name or self.path, exc.code, exc.message)
        try:
            try:
                if refused is not None:
                    raise refused
                result = self.server.dispatch(name, token, args, self._emit)
            finally:
                if reserved:
                    self.server.budget.give(reserved)
            last = _line({"result": result})
        except HostKernelError as exc:
            last = _line({"error": exc.to_dict()})
        except Exception as exc:  # a Host bug must not kill the channel; say what broke
            last = _line({"error": {"type": "HostKernelError", "code": "host_internal_error",
                                    "message": f"the Host failed to carry out the call: "
                                               f"{type(exc).__name__}: {exc}"}})
        # The last line and the end of the reply in one write (with the status line and
        # headers when nothing was streamed before): the kernel, waiting on the other end,
        # wakes once for the whole answer instead of once per piece.
        with self._lock:
            self.wfile.write(self._head() + _chunk(last) + _LAST_CHUNK)
        if self.body_left:
            self.close_connection = True  # a body left unread: this connection is done

    def _head(self) -> bytes:
        """The reply's status line and headers the first time (under the lock), then b""."""
        if self._started:
            return b""
        self._started = True
        if self.body_left:
            # A body not read (yet): if it is never read, the connection must close, and
            # the client must not send its next call on it.
            self.close_connection = True
        return (b"HTTP/1.1 200 OK\r\nServer: %s\r\nDate: %s\r\n"
                b"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n%s\r\n"
                % (self.version_string().encode("latin-1"),
                   self.date_time_string().encode("latin-1"),
                   b"Connection: close\r\n" if self.close_connection else b""))

    def _emit(self, line: dict[str, Any]) -> None:
        """One streamed line of the reply (output of a running command), sent at once."""
        data = _chunk(_line(line))
        with self._lock:
            self.wfile.write(self._head() + data)

    def _parse(self) -> tuple[str, str | None, Any, int]:
        """The call's name, token and arguments, and the bytes it holds of the budget."""
        if not self.path.startswith("/call/"):
            self.close_connection = True
            raise BadArguments(f"unknown endpoint {self.path[:200]!r}", code="bad_request")
        name = self.path[len("/call/"):]
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        if "Transfer-Encoding" in self.headers:
            self.close_connection = True
            raise BadArguments("a request body must be sent with a Content-Length, not "
                               "chunked", code="body_malformed")
        declared = self.headers.get("Content-Length")
        try:
            length = int(declared) if declared is not None else 0
        except ValueError:
            length = -1
        if length < 0 or (declared is not None and not declared.strip().isdigit()):
            self.close_connection = True
            raise BadArguments("Content-Length is not a number", code="body_malformed")
        self.body_left = length
        deadline = time.monotonic() + BODY_DEADLINE
        if self.headers.get("Content-Type", "").split(";")[0].strip() == RAW_TYPE:
            return name, token, self._raw_args(name, length, deadline), 0
        if length > CALL_BODY_LIMIT:
            raise BadArguments(f"request body of {length} bytes is over the "
                               f"{CALL_BODY_LIMIT}-byte limit of a call's arguments; write "
                               f"large data with write_file or bash", code="body_too_large")
        reserved = 0
        if length > SMALL_BODY:
            if not self.server.budget.take(length, BODY_WAIT):
                raise CallRefused(f"the Host holds {BODIES_IN_FLIGHT} bytes of other calls' "
                                  f"arguments already; call again when they are done",
                                  code="host_busy")
            reserved = min(length, BODIES_IN_FLIGHT)
        try:
            raw = self._read_all(length, deadline) if length else b"{}"
            values = json_values(raw, JSON_VALUE_LIMIT)
            if values > JSON_VALUE_LIMIT:
                raise BadArguments(f"the call's arguments hold more than {JSON_VALUE_LIMIT} "
                                   f"JSON values; send large data as a file (write_file)",
                                   code="body_too_large")
            try:
                args = json.loads(raw)
            except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                raise BadArguments(f"request body is not JSON: {exc}"[:300]) from None
        except BaseException:
            if reserved:
                self.server.budget.give(reserved)
            raise
        return name, token, args, reserved

    def _read_all(self, length: int, deadline: float) -> bytes:
        parts: list[bytes] = []
        while self.body_left > 0:
            parts.append(self.read_body(_CHUNK, deadline))
        return b"".join(parts) if len(parts) != 1 else parts[0]

    def _raw_args(self, name: str, length: int, deadline: float) -> dict[str, Any]:
        """A raw body's call: its arguments from the header, the body left unread."""
        key = RAW_CALLS.get(name)
        if key is None:
            self.close_connection = True
            raise BadArguments(f"only {', '.join(sorted(RAW_CALLS))} may send a raw body",
                               code="body_malformed")
        if length > MAX_BODY:
            raise BadArguments(f"request body of {length} bytes is over the {MAX_BODY}-byte "
                               f"limit; write large data with bash or in chunks",
                               code="body_too_large")
        try:
            args = json.loads(self.headers.get(ARGS_HEADER) or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            self.close_connection = True
            raise BadArguments(f"the {ARGS_HEADER} header must hold a JSON object",
                               code="body_malformed")
        args.pop(key + "_b64", None)
        args[key] = RawBody(self, length, deadline)
        return args


#: A header's name: an HTTP token (RFC 9110), nothing before its colon.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: A JSON string (to its end, closed or not) or one of the marks that open a value.
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)|[,\[{]', re.S)


def json_values(raw: bytes, limit: int) -> int:
    """How many values a JSON text holds (arrays, objects and their items, counted
    from the commas and brackets outside strings), counting no further than ``limit``
    + 1. The marks in the whole text are counted first (fast; strings included); only
    when those are too many are the strings told apart."""
    rough = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
    if rough <= limit:
        return rough
    count = 1
    for match in _TOKENS.finditer(raw):
        if raw[match.start()] != 0x22:  # not a string
            count += 1
            if count > limit:
                break
    return count


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False
    request_queue_size = 128
    dispatch: Dispatch
    refusals: RefusalLog
    budget: _Budget

    def __init__(self, path: str) -> None:
        super().__init__(path, _Handler)
        self.open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        #: Connections taken (each given a thread), and those answered with a refusal and
        #: closed because the cap was reached; only the accepting thread counts them.
        self.accepted = 0
        self.turned_away = 0

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._open_lock:
            if len(self.open) < MAX_CONNECTIONS:
                self.open.add(request)
                self.accepted += 1
                return True
        self._turn_away(request)
        return False

    def _turn_away(self, request: socket.socket) -> None:
        """Answer a connection over the limit with a refusal, from this (the accepting)
        thread, without reading it: a few hundred bytes into an empty socket buffer."""
        self.turned_away += 1
        message = (f"the Host already has {MAX_CONNECTIONS} connections open from this "
                   f"kernel; close idle ones (each thread keeps one) and call again")
        self.refusals.refused(None, None, "", "too_many_connections", message)
        line = json.dumps({"error": {"type": "CallRefused", "code": "too_many_connections",
                                     "message": message}}).encode() + b"\n"
        reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                 b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                 b"%x\r\n%s\r\n0\r\n\r\n" % (len(line), line))
        try:
            request.setblocking(False)
            request.send(reply)
        except OSError:
            pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection the kernel dropped (its process interrupted by Ctrl-C, killed, or
        restarted while a call ran) ends its thread quietly: socketserver's default prints
        a traceback on the Host's stderr, the user's terminal. Anything else is still
        printed, as a fault of the Host's own."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        with self._open_lock:
            self.open.discard(request)

    def end_connections(self) -> None:
        """Shut every open connection down, so threads waiting on one end now."""
        with self._open_lock:
            open_now = list(self.open)
        for request in open_now:
            try:
                request.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def server_close(self, wait: float = 5.0) -> None:
        """Close the listening socket and wait (at most ``wait`` seconds in all) for the
        connections' threads, so no call is still writing to the record once the Host
        closes it; ThreadingMixIn's own close would wait for ever."""
        socketserver.UnixStreamServer.server_close(self)
        deadline = time.monotonic() + wait
        for thread in list(vars(self).get("_threads") or ()):  # made with the first thread
            thread.join(max(0.0, deadline - time.monotonic()))


class CallServer:
    """Serve ``dispatch`` on a Unix socket (mode 0600) from a background thread.

    ``refusals`` records the refusals made here, on the wire (a body too large or
    malformed, too many connections), once per cause; without one they are refused
    but not recorded.
    """

    def __init__(self, socket_path: str, dispatch: Dispatch, *,
                 refusals: RefusalLog | None = None) -> None:
        self.socket_path = socket_path
        # No umask change: it is the whole process's, so another thread's mkdir in that
        # window would get the wrong mode. The socket's folder is 0700 already.
        self._server = _UnixServer(socket_path)
        os.chmod(socket_path, 0o600)
        self._server.dispatch = dispatch
        self._server.refusals = refusals if refusals is not None else RefusalLog()
        self._server.budget = _Budget(BODIES_IN_FLIGHT)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="host-kernel-calls", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        """Connections open now (each with its thread)."""
        return len(self._server.open)

    @property
    def accepted(self) -> int:
        """Connections taken so far, each with its thread."""
        return self._server.accepted

    @property
    def turned_away(self) -> int:
        """Connections refused so far because :data:`MAX_CONNECTIONS` were open."""
        return self._server.turned_away

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
        self._server.end_connections()
        self._server.server_close()
        self._thread.join(timeout=5)
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
