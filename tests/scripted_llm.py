"""A real, scripted OpenAI-compatible HTTP server for tests.

It listens on 127.0.0.1 (port 0, so the OS picks a free one) in a background
thread and answers every POST with the next scripted reply, recording what it
received. A scripted reply is one of:

* a ``dict``: sent as a 200 JSON body;
* a ``tuple`` ``(status, body)`` or ``(status, body, headers)``: ``body`` a
  dict (sent as JSON), a str or bytes;
* a ``list`` of chunks: sent as a 200 server-sent-event stream, one
  ``data:`` event per chunk (a dict as JSON, a str as it is), then
  ``data: [DONE]``;
* an :class:`SSEStream`, for a stream with a status, headers, or no ``[DONE]``;
* a callable taking the :class:`RecordedRequest` and returning one of the above,
  for replies that depend on what was asked.

With ``routes`` (a mapping of a marker string to its own script), a request goes to
the script of the first marker found in its first user message (where an agent's
task is), and only requests without a marker there take the main script: several
agent sessions talking to one server at once (a parent and its sub-tasks) each get
their own replies, in their own order.

When the script runs out the server answers 418 with a body saying so, which
an LLM client treats as a non-retryable error, so a test that makes one call
too many fails loudly. Use it as a context manager::

    with ScriptedLLMServer([chat_reply("hi")]) as server:
        config = LLMConfig(base_url=server.base_url, model="m")
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

__all__ = [
    "RecordedRequest",
    "SSEStream",
    "ScriptedLLMServer",
    "chat_reply",
    "content_chunks",
]

Body = dict[str, Any] | str | bytes


@dataclass(frozen=True)
class SSEStream:
    """A streamed reply. ``done=False`` leaves out the closing ``[DONE]`` event."""

    chunks: Sequence[dict[str, Any] | str]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    done: bool = True


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it. Header names are lower-case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Reply = (
    dict[str, Any]
    | tuple[int, Body]
    | tuple[int, Body, dict[str, str]]
    | list[Any]
    | SSEStream
    | Callable[[RecordedRequest], Any]
)


def chat_reply(
    content: str | None = "",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str = "stop",
    usage: dict[str, int] | None = None,
    model: str = "scripted-model",
) -> dict[str, Any]:
    """A non-streamed chat-completion body, the shape OpenAI-compatible servers send."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def content_chunks(*pieces: str, finish_reason: str = "stop") -> list[dict[str, Any]]:
    """Stream chunks that deliver ``pieces`` as content, then a finish reason."""
    chunks: list[dict[str, Any]] = [
        {"model": "scripted-model", "choices": [{"index": 0, "delta": {"content": piece}}]}
        for piece in pieces
    ]
    chunks.append(
        {
            "model": "scripted-model",
            "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}],
        }
    )
    return chunks


def _first_user_message(request: RecordedRequest) -> str:
    try:
        messages = request.json().get("messages") or []
    except (ValueError, AttributeError):
        return ""
    return next((str(m.get("content")) for m in messages
                 if isinstance(m, dict) and m.get("role") == "user"), "")


def _encode(body: Body) -> tuple[bytes, str]:
    if isinstance(body, dict):
        return json.dumps(body).encode(), "application/json"
    if isinstance(body, str):
        return body.encode(), "text/plain; charset=utf-8"
    return body, "application/octet-stream"


class ScriptedLLMServer:
    """See the module docstring."""

    def __init__(self, replies: Iterable[Reply] = (), *,
                 routes: dict[str, Iterable[Reply]] | None = None) -> None:
        self._replies: deque[Reply] = deque(replies)
        self._routes: dict[str, deque[Reply]] = {k: deque(v) for k, v in (routes or {}).items()}
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def remaining(self) -> int:
        """Scripted replies not yet served."""
        with self._lock:
            return len(self._replies)

    def push(self, *replies: Reply, route: str | None = None) -> None:
        """Append replies to the script (or to the script of ``route``)."""
        with self._lock:
            (self._replies if route is None else self._routes[route]).extend(replies)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _next(self, request: RecordedRequest) -> Any:
        with self._lock:
            self.requests.append(request)
            first = _first_user_message(request)
            queue = next((q for marker, q in self._routes.items() if marker in first),
                         self._replies)
            reply: Any = queue.popleft() if queue else None
        if reply is None:
            return (418, {"error": {"message": "the scripted server has no reply left"}})
        if callable(reply):
            reply = reply(request)
        return reply

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection; streams end at close

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                recorded = RecordedRequest(
                    method="POST",
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=self.rfile.read(length),
                )
                self._reply(server._next(recorded))

            def _reply(self, reply: Any) -> None:
                if isinstance(reply, list):
                    reply = SSEStream(reply)
                if isinstance(reply, SSEStream):
                    self._stream(reply)
                elif isinstance(reply, dict):
                    self._send(200, reply, {})
                elif isinstance(reply, tuple) and len(reply) in (2, 3):
                    headers = reply[2] if len(reply) == 3 else {}
                    self._send(reply[0], reply[1], headers)
                else:
                    self._send(500, f"unusable scripted reply: {reply!r}", {})

            def _send(self, status: int, body: Body, headers: dict[str, str]) -> None:
                data, media_type = _encode(body)
                self.send_response(status)
                self.send_header("Content-Type", media_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, stream: SSEStream) -> None:
                self.send_response(stream.status)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                for name, value in stream.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                events = [c if isinstance(c, str) else json.dumps(c) for c in stream.chunks]
                if stream.done:
                    events.append("[DONE]")
                for event in events:
                    self.wfile.write(f"data: {event}\n\n".encode())
                    self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        return Handler
