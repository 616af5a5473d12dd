"""What one cell produced, as the Host collects it from the kernel's sockets.

Owns reading a kernel's replies for one ``execute_request`` (signature checked,
only the parts needed parsed), folding IOPub messages into nbformat v4 outputs
as a notebook frontend would, and the bound on what one cell's stream output
may keep in the record. It does not decide what a cell's end means
(host/_cells.py).
"""

from __future__ import annotations

import hmac
import json
from typing import Any

import nbformat

from .._models import Status

__all__ = ["RECORD_OUTPUT_LIMIT", "CellRun", "Outputs", "execution_count"]

#: Most characters of stream output kept in the record for one cell; past it the
#: record says how much was dropped.
RECORD_OUTPUT_LIMIT = 16 * 1024 * 1024


def execution_count(value: object) -> int | None:
    """A kernel's execution count as the record keeps it: a whole number that fits a
    64-bit column, or None (the kernel says what it likes; every backend stores this)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return None


def bundle_of(data: Any) -> dict[str, Any] | None:
    """A mime bundle as nbformat holds one, or None when ``data`` is not a mapping: each
    value a string (a list of strings joined), JSON kept only under a ``json`` media
    type; entries of any other shape are left out (a kernel can send anything)."""
    if not isinstance(data, dict):
        return None
    bundle: dict[str, Any] = {}
    for mime, value in data.items():
        if not isinstance(mime, str):
            continue
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = "".join(value)
        if isinstance(value, str) or mime.split(";")[0].endswith("json"):
            bundle[mime] = value
    return bundle


class CellRun:
    """What one execute_request produced, while it is being collected; and the reader of
    its replies.

    :meth:`receive` takes one message off a kernel socket and returns it only when it
    answers this request and carries a valid signature (the Session's key; a replayed
    signature counts as invalid). It parses the parent header, then the header and
    content of those it keeps, and nothing of the others; dates stay strings.
    """

    def __init__(self, session: Any, msg_id: str) -> None:
        self.status: Status = "ok"
        self.stuck = False
        #: Ctrl-C reached the Host while the cell ran: recorded, then raised again.
        self.host_interrupted = False
        self.execution_count: int | None = None
        self.outputs: list[dict[str, Any]] = []
        self.dropped_chars = 0
        self.access: Any = None
        self._session = session
        self._msg_id = msg_id
        self._signatures: set[bytes] = set()

    def receive(self, socket: Any, *, content: bool = True) -> dict[str, Any] | None:
        """The next message on ``socket`` (which has one ready) if it is for this request:
        ``{"msg_type", "header", "parent_header", "content"}``; else None."""
        try:
            _, parts = self._session.feed_identities(socket.recv_multipart())
            if len(parts) < 5:
                return None
            parent = json.loads(parts[2])
            if not isinstance(parent, dict) or parent.get("msg_id") != self._msg_id:
                return None
            signature = parts[0]
            if self._session.auth is not None:
                if (signature in self._signatures or not hmac.compare_digest(
                        signature, self._session.sign(parts[1:5]))):
                    return None
                self._signatures.add(signature)
            header = json.loads(parts[1])
            body = json.loads(parts[4].decode("utf-8", "replace")) if content else {}
        except ValueError:  # no delimiter, or not JSON: nothing the kernel sent us
            return None
        if not isinstance(header, dict) or not isinstance(body, dict):
            return None
        return {"msg_type": header.get("msg_type"), "header": header, "parent_header": parent,
                "content": body}


class Outputs:
    """Fold IOPub messages into nbformat v4 outputs, as a notebook frontend would.

    Consecutive stream text of one name is kept as pieces and joined once, when
    :attr:`final` is read, so a cell printing many small chunks costs linear time.
    Outputs already handed out by :attr:`final` are never changed afterwards.
    """

    #: The IOPub message types that make or change outputs.
    KINDS = frozenset({"stream", "display_data", "execute_result", "error", "clear_output",
                       "update_display_data"})

    def __init__(self) -> None:
        self.outputs: list[dict[str, Any]] = []
        #: The display id of each output (None for most), beside ``outputs``.
        self._display_ids: list[str | None] = []
        #: The last output's stream text, in pieces, while more may follow.
        self._pieces: list[str] | None = None
        self.kept_chars = 0
        self.dropped = 0
        self._clear_pending = False

    def _clear(self) -> None:
        self.outputs.clear()
        self._display_ids.clear()
        self._pieces = None

    def _seal(self) -> None:
        if self._pieces is not None:
            self.outputs[-1]["text"] = "".join(self._pieces)
            self._pieces = None

    def add(self, msg: dict[str, Any]) -> None:
        mtype = msg["msg_type"]
        content = msg["content"]
        if mtype == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
            else:
                self._clear()
            return
        if mtype == "update_display_data":
            display_id = (content.get("transient") or {}).get("display_id")
            if display_id is None:
                return
            data = bundle_of(content.get("data"))
            metadata = content.get("metadata")
            if data is None:
                return  # not a mime bundle (the kernel is not trusted): not kept
            self._seal()
            for i, shown in enumerate(self._display_ids):
                if shown == display_id:
                    self.outputs[i] = {**self.outputs[i], "data": data,
                                       "metadata": metadata if isinstance(metadata, dict)
                                       else {}}
            return
        if self._clear_pending:
            self._clear()
            self._clear_pending = False
        if mtype == "stream":
            text = content.get("text", "")
            name = content.get("name")
            if not isinstance(text, str) or not isinstance(name, str):
                return
            room = RECORD_OUTPUT_LIMIT - self.kept_chars
            if len(text) > room:
                self.dropped += len(text) - max(room, 0)
                text = text[:max(room, 0)]
                if not text:
                    return
            self.kept_chars += len(text)
            last = self.outputs[-1] if self.outputs else None
            if last is not None and last["output_type"] == "stream" and last["name"] == name:
                if self._pieces is None:  # sealed (handed out): go on in a copy
                    self.outputs[-1] = {**last}
                    self._pieces = [last["text"]]
                self._pieces.append(text)
                return
            self._seal()
            self.outputs.append({"output_type": "stream", "name": name, "text": text})
            self._display_ids.append(None)
            self._pieces = [text]
            return
        try:
            out = dict(nbformat.v4.output_from_msg(msg))
        except (KeyError, TypeError, ValueError, nbformat.ValidationError):
            return  # not an output nbformat can hold (the kernel is not trusted): not kept
        if "data" in out:
            data = bundle_of(out["data"])
            if data is None:
                return
            out["data"] = data
        self._seal()
        self.outputs.append(out)
        display_id = (content.get("transient") or {}).get("display_id")
        self._display_ids.append(display_id if isinstance(display_id, str) else None)

    @property
    def final(self) -> list[dict[str, Any]]:
        self._seal()
        return list(self.outputs)
