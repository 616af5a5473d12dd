"""What one cell produced, as the Host collects it from the kernel's sockets.

Owns reading a kernel's replies for one ``execute_request`` (signature checked,
only the parts needed parsed), folding IOPub messages into nbformat v4 outputs
as a notebook frontend would, and the one budget every kind of output of a cell
counts against (:data:`RECORD_OUTPUT_LIMIT`): what fits is kept, the rest is
counted by kind and hashed, and a message that cannot fit is not even parsed.
It does not decide what a cell's end means (host/_cells.py).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._models import Status

__all__ = ["RECORD_OUTPUT_LIMIT", "CellRun", "Outputs", "execution_count", "output_from_msg"]

#: Bytes of one cell's outputs, of every kind, kept in the record (measured as the
#: kernel's JSON of each message, plus :data:`OUTPUT_OVERHEAD` per output). Past it,
#: outputs are counted and hashed, not kept, and the record says what was cut.
RECORD_OUTPUT_LIMIT = 16 * 1024 * 1024
#: What one output adds to its message's size in the record (its ``output_type``).
OUTPUT_OVERHEAD = 64
#: Bytes past the budget for the short stand-ins of errors that did not fit: a cell's
#: status and the error's name are kept even when its traceback is not.
STAND_IN_ALLOWANCE = 64 * 1024
#: Signatures remembered per request to refuse a replayed message (the newest kept).
SIGNATURES_KEPT = 65_536


def execution_count(value: object) -> int | None:
    """A kernel's execution count as the record keeps it: a whole number that fits a
    64-bit column, or None (the kernel says what it likes; every backend stores this)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return None


#: nbformat v4's mime bundle: a key matching this may hold any JSON; every other key a
#: string or a list of strings (searched, as jsonschema applies ``patternProperties``).
_JSON_MIME = re.compile(r"^application/(.*\+)?json$")


def _multiline(value: object) -> bool:
    return isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(v, str) for v in value))


def _mimebundle(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and (_JSON_MIME.search(k) is not None or _multiline(v))
        for k, v in value.items())


def output_from_msg(msg: dict[str, Any]) -> dict[str, Any] | None:
    """The nbformat v4 output an IOPub message makes, or None when nbformat would refuse
    it (a kernel can send anything). The same outputs, keys in the same order, as
    ``nbformat.v4.output_from_msg`` with its schema check, held to it by
    tests/test_outputs_schema.py, without importing nbformat and its validator (about
    0.2 s at a session's first rich output)."""
    try:
        mtype, content = msg["header"]["msg_type"], msg["content"]
        if mtype in ("execute_result", "display_data"):
            data = content["data"]
            # nbformat takes a null bundle as an empty one
            out = {"output_type": mtype, "metadata": content["metadata"],
                   "data": {} if data is None else data}
            ok = isinstance(out["metadata"], dict) and _mimebundle(out["data"])
            if mtype == "execute_result":
                count = out["execution_count"] = content["execution_count"]
                ok = ok and (count is None or (isinstance(count, int)
                                               and not isinstance(count, bool) and count >= 0))
        elif mtype == "stream":
            out = {"output_type": mtype, "name": content["name"], "text": content["text"]}
            ok = isinstance(out["name"], str) and _multiline(out["text"])
        elif mtype == "error":
            out = {"output_type": mtype, "ename": content["ename"], "evalue": content["evalue"],
                   "traceback": content["traceback"]}
            ok = (isinstance(out["ename"], str) and isinstance(out["evalue"], str)
                  and isinstance(out["traceback"], list)
                  and all(isinstance(t, str) for t in out["traceback"]))
        else:
            return None
    except (KeyError, TypeError):
        return None
    return out if ok else None


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
        #: The execute_reply came and the ``idle`` did not within IDLE_GRACE (_cells.py).
        self.idle_missing = False
        #: The execute_reply's ``status``, once the Host has read it.
        self.reply_status: str | None = None
        #: The idle came and the execute_reply did not within REPLY_GRACE (_cells.py).
        self.reply_missing = False
        #: Ctrl-C reached the Host while the cell ran: recorded, then raised again.
        self.host_interrupted = False
        self.execution_count: int | None = None
        self.outputs: list[dict[str, Any]] = []
        self.dropped_chars = 0
        #: What the output budget left out (Outputs.cut), or None.
        self.output_cut: dict[str, Any] | None = None
        self.access: Any = None
        self._session = session
        self._msg_id = msg_id
        self._signatures: set[bytes] = set()
        self._signature_order: collections.deque[bytes] = collections.deque()

    def receive(self, socket: Any, *, content: bool = True,
                outputs: Outputs | None = None) -> dict[str, Any] | None:
        """The next message on ``socket`` (which has one ready) if it is for this request:
        ``{"msg_type", "header", "parent_header", "content", "raw"}`` (``raw``: the
        content frame as the kernel sent it); else None. With ``outputs``, an output
        message that cannot fit its budget (:meth:`Outputs.wants`) is not parsed: its
        ``content`` is None."""
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
                self._remember(signature)
            header = json.loads(parts[1])
            if not isinstance(header, dict):
                return None
            mtype = header.get("msg_type")
            raw = parts[4]
            if outputs is not None and mtype in Outputs.KINDS and \
                    not outputs.wants(mtype, len(raw)):
                return {"msg_type": mtype, "header": header, "parent_header": parent,
                        "content": None, "raw": raw}
            body = json.loads(raw.decode("utf-8", "replace")) if content else {}
        except (ValueError, RecursionError):  # no delimiter, or not JSON: nothing for us
            return None
        if not isinstance(body, dict):
            return None
        return {"msg_type": mtype, "header": header, "parent_header": parent,
                "content": body, "raw": raw}

    def _remember(self, signature: bytes) -> None:
        self._signatures.add(signature)
        self._signature_order.append(signature)
        if len(self._signature_order) > SIGNATURES_KEPT:
            self._signatures.discard(self._signature_order.popleft())


class Outputs:
    """Fold IOPub messages into nbformat v4 outputs, as a notebook frontend would, within
    one budget for the cell.

    Every kind counts against ``limit`` bytes (:data:`RECORD_OUTPUT_LIMIT`): stream
    text is kept up to it (the head of a message that crosses it), a rich output or an
    update whole or not at all, an error that does not fit by a short stand-in naming
    it. What is not kept is counted per kind (messages and bytes) and hashed: sha256
    over the content frames, as the kernel sent them, of every output message not kept
    whole, in arrival order (:attr:`cut`). Outputs cleared by ``clear_output`` give
    their room back; the budget bounds what is held, and so what the record keeps.

    Consecutive stream text of one name is kept as pieces and joined once, when
    :attr:`final` is read, so a cell printing many small chunks costs linear time.
    Outputs already handed out by :attr:`final` are never changed afterwards.
    """

    #: The IOPub message types that make or change outputs.
    KINDS = frozenset({"stream", "display_data", "execute_result", "error", "clear_output",
                       "update_display_data"})
    #: Kinds kept whole or not at all.
    WHOLE = frozenset({"display_data", "execute_result", "update_display_data"})

    def __init__(self, limit: int | None = None) -> None:
        self.limit = RECORD_OUTPUT_LIMIT if limit is None else limit
        self.outputs: list[dict[str, Any]] = []
        #: The display id of each output (None for most), and its cost, beside ``outputs``.
        self._display_ids: list[str | None] = []
        self._costs: list[int] = []
        #: The last output's stream text, in pieces, while more may follow.
        self._pieces: list[str] | None = None
        #: Bytes of the budget the outputs held now take.
        self.kept = 0
        #: Characters of stream text read and not kept.
        self.dropped = 0
        #: What was not kept, by kind: [messages, bytes].
        self._cut: dict[str, list[int]] = {}
        self._digest: Any = None
        self._stand_ins = 0
        #: An error was sent, kept or not: the cell failed.
        self.saw_error = False
        self._clear_pending = False

    @property
    def room(self) -> int:
        return self.limit - self.kept

    def wants(self, mtype: str, size: int) -> bool:
        """Whether a message of ``mtype`` whose content frame is ``size`` bytes is worth
        parsing: a whole-or-nothing kind only if it fits; stream text and errors while
        no larger than the budget itself (so stream characters are counted and an
        error's name kept); ``clear_output`` when small. A ``clear_output(wait=True)``
        still pending gives the next output the whole budget (it clears what is held)."""
        if mtype in self.WHOLE:
            clears = self._clear_pending and mtype != "update_display_data"
            return size + OUTPUT_OVERHEAD <= (self.limit if clears else self.room)
        if mtype == "clear_output":
            return size <= 4096
        return size <= self.limit

    @property
    def cut(self) -> dict[str, Any] | None:
        """What was not kept, for the record: the budget, the bytes kept, per kind the
        messages and bytes dropped, and the sha256 of the content frames dropped."""
        if not self._cut:
            return None
        return {"limit": self.limit, "kept_bytes": self.kept,
                "dropped": {kind: {"messages": n, "bytes": size}
                            for kind, (n, size) in sorted(self._cut.items())},
                "sha256": self._digest.hexdigest()}

    def _count_cut(self, mtype: str, msg: dict[str, Any], size: int) -> None:
        """Count a message not kept whole (``size``: its bytes not kept) and hash it."""
        entry = self._cut.setdefault(mtype, [0, 0])
        entry[0] += 1
        entry[1] += size
        if self._digest is None:
            self._digest = hashlib.sha256()
        raw = msg.get("raw")
        if not isinstance(raw, bytes):
            raw = json.dumps(msg.get("content"), ensure_ascii=False, sort_keys=True,
                             default=str).encode("utf-8", "surrogatepass")
        self._digest.update(raw)

    def _clear(self) -> None:
        self.outputs.clear()
        self._display_ids.clear()
        self._costs.clear()
        self._pieces = None
        self.kept = 0

    def _seal(self) -> None:
        if self._pieces is not None:
            self.outputs[-1]["text"] = "".join(self._pieces)
            self._pieces = None

    def add(self, msg: dict[str, Any]) -> None:
        mtype = msg["msg_type"]
        content = msg["content"]
        raw = msg.get("raw")
        size = len(raw) if isinstance(raw, bytes) else None
        if content is None:  # not parsed: it could not fit (CellRun.receive)
            if mtype == "error":
                self.saw_error = True
            if mtype != "clear_output":
                if self._clear_pending and mtype != "update_display_data":
                    self._clear()  # it came after the clear, as a frontend would show
                    self._clear_pending = False
                self._count_cut(mtype, msg, size or 0)
            return
        if mtype == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
            else:
                self._clear()
            return
        if mtype == "update_display_data":
            self._update(msg, content, size)
            return
        if self._clear_pending:
            self._clear()
            self._clear_pending = False
        if mtype == "stream":
            self._stream(msg, content, size)
            return
        if mtype == "error":
            self.saw_error = True
        out = output_from_msg(msg)
        if out is None:
            return  # not an output nbformat can hold (the kernel is not trusted): not kept
        if "data" in out:
            data = bundle_of(out["data"])
            if data is None:
                return
            out["data"] = data
        cost = (size if size is not None else _json_size(content)) + OUTPUT_OVERHEAD
        if cost > self.room:
            self._count_cut(mtype, msg, cost - OUTPUT_OVERHEAD)
            if mtype != "error":
                return
            stand_in = self._stand_in(out, cost - OUTPUT_OVERHEAD)
            if stand_in is None:
                return
            out, cost = stand_in, 0  # outside the budget: it gives no room back when cleared
        else:
            self.kept += cost
        self._seal()
        self.outputs.append(out)
        self._costs.append(cost)
        display_id = (content.get("transient") or {}).get("display_id")
        self._display_ids.append(display_id if isinstance(display_id, str) else None)

    def _stand_in(self, out: dict[str, Any], size: int) -> dict[str, Any] | None:
        """A short error in place of one that did not fit, within its own allowance."""
        ename = out.get("ename")
        stand_in = {"output_type": "error",
                    "ename": ename[:200] if isinstance(ename, str) else "Error",
                    "evalue": f"[this error's {size} bytes were not kept: the cell's output "
                              f"was over the record's {self.limit}-byte budget]",
                    "traceback": []}
        cost = _json_size(stand_in)
        if self._stand_ins + cost > STAND_IN_ALLOWANCE:
            return None
        self._stand_ins += cost
        return stand_in

    def _update(self, msg: dict[str, Any], content: dict[str, Any], size: int | None) -> None:
        display_id = (content.get("transient") or {}).get("display_id")
        if display_id is None:
            return
        data = bundle_of(content.get("data"))
        metadata = content.get("metadata")
        if data is None:
            return  # not a mime bundle (the kernel is not trusted): not kept
        shown = [i for i, d in enumerate(self._display_ids) if d == display_id]
        if not shown:
            return
        cost = (size if size is not None else _json_size(content)) + OUTPUT_OVERHEAD
        grows = sum(cost - self._costs[i] for i in shown)
        if grows > self.room:
            self._count_cut("update_display_data", msg, cost - OUTPUT_OVERHEAD)
            return
        self._seal()
        for i in shown:
            self.outputs[i] = {**self.outputs[i], "data": data,
                               "metadata": metadata if isinstance(metadata, dict) else {}}
            self.kept += cost - self._costs[i]
            self._costs[i] = cost

    def _stream(self, msg: dict[str, Any], content: dict[str, Any], size: int | None) -> None:
        text = content.get("text", "")
        name = content.get("name")
        if not isinstance(text, str) or not isinstance(name, str):
            return
        last = self.outputs[-1] if self.outputs else None
        joins = last is not None and last["output_type"] == "stream" and last["name"] == name
        new = 0 if joins else OUTPUT_OVERHEAD  # a new output takes its own overhead
        cost = size if size is not None else _text_size(text) + 32
        if cost + new > self.room:
            whole = len(text)
            text, kept_cost = _head(text, self.room - new)
            self.dropped += whole - len(text)
            self._count_cut("stream", msg, max(cost - kept_cost, 0))
            if not text:
                return
            cost = kept_cost
        self.kept += cost + new
        if joins and last is not None:
            if self._pieces is None:  # sealed (handed out): go on in a copy
                self.outputs[-1] = {**last}
                self._pieces = [last["text"]]
            self._pieces.append(text)
            self._costs[-1] += cost
            return
        self._seal()
        self.outputs.append({"output_type": "stream", "name": name, "text": text})
        self._display_ids.append(None)
        self._costs.append(cost + new)
        self._pieces = [text]

    @property
    def final(self) -> list[dict[str, Any]]:
        self._seal()
        return list(self.outputs)


def _text_size(text: str) -> int:
    """Bytes ``text`` takes as a JSON string (escapes and UTF-8 counted)."""
    escaped = _encode_string(text)
    return len(escaped) if escaped.isascii() else len(escaped.encode("utf-8", "surrogatepass"))


def _json_size(value: Any) -> int:
    try:
        return len(json.dumps(value, ensure_ascii=False, default=str).encode(
            "utf-8", "surrogatepass"))
    except (ValueError, RecursionError):
        return 0


def _head(text: str, room: int) -> tuple[str, int]:
    """The longest head of ``text`` found quickly whose JSON takes at most ``room``
    bytes, and what it takes."""
    if room <= 0:
        return "", 0
    total = _text_size(text)
    n = min(len(text), room * len(text) // max(total, 1))
    while n > 0:
        size = _text_size(text[:n])
        if size <= room:
            return text[:n], size
        n = n * room // size - 1
    return "", 0


_encode_string: Any = json.encoder.encode_basestring
