"""The wire, as the relay sees it: one Jupyter message as frames, and the heartbeat echo.

Owns splitting a multipart ZeroMQ message into routing identities, signature,
the four JSON parts and the buffers, without re-serialising anything, so a
relayed message keeps its bytes; and answering heartbeats on a thread of their
own. Signing and deciding what a message means are the relay's.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import zmq

__all__ = ["DELIM", "Frames", "Heartbeat"]

DELIM = b"<IDS|MSG>"


@dataclass(slots=True)
class Frames:
    """One wire message: routing identities, signature, the four JSON parts, buffers."""

    idents: list[bytes]
    signature: bytes
    parts: list[bytes]  # header, parent_header, metadata, content
    buffers: list[bytes]

    @classmethod
    def split(cls, frames: list[bytes]) -> Frames | None:
        """The message in ``frames``, or None when it is not one (no delimiter, parts missing)."""
        try:
            i = frames.index(DELIM)
        except ValueError:
            return None
        rest = frames[i + 1:]
        if len(rest) < 5:
            return None
        return cls(frames[:i], rest[0], rest[1:5], rest[5:])

    def part(self, index: int) -> dict[str, Any]:
        """One JSON part, parsed (an empty dict when it is not an object)."""
        value = json.loads(self.parts[index])
        return value if isinstance(value, dict) else {}


class Heartbeat(threading.Thread):
    """Echoes heartbeat pings on its own thread, so a busy relay still looks alive."""

    def __init__(self, socket: zmq.Socket[bytes]) -> None:
        super().__init__(name="host-kernel-heartbeat", daemon=True)
        self.socket = socket
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                if self.socket.poll(200):
                    self.socket.send_multipart(self.socket.recv_multipart())
        finally:
            self.socket.close(linger=0)
