"""How an Observation reads to an agent: the ``text`` rendering of a cell's outputs.

Owns the text only. The record keeps the outputs whole up to the cell's budget
(host/_outputs.py); this module cuts long text (head and tail kept, the number
of characters cut stated), names rich outputs by media type and size instead of
inlining them, strips ANSI codes from tracebacks, and says what the budget cut
(:func:`cut_notice`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["DEFAULT_TEXT_LIMIT", "cut", "cut_notice", "render_outputs", "strip_ansi"]

DEFAULT_TEXT_LIMIT = 12_000

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def cut(text: str, limit: int) -> str:
    """Keep the head and tail of ``text`` within ``limit`` characters, saying how much went."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    removed = len(text) - head - tail
    return (f"{text[:head]}\n[… {removed} characters cut; the record keeps the whole output …]\n"
            f"{text[-tail:]}")


def cut_notice(output_cut: Mapping[str, Any]) -> str:
    """The sentence saying what a cell's output budget left out of the record (the
    ``output_cut`` of its ``cell_finished``): the budget, each kind with its messages and
    bytes, and the sha256 of what was left out."""
    dropped = output_cut.get("dropped")
    kinds = []
    for kind, count in sorted(dropped.items()) if isinstance(dropped, Mapping) else ():
        if isinstance(count, Mapping):
            n = count.get("messages")
            kinds.append(f"{n} {kind} message{'' if n == 1 else 's'} "
                         f"({count.get('bytes')} bytes)")
    return (f"[The record keeps at most {output_cut.get('limit')} bytes of one cell's output; "
            f"not kept: {', '.join(kinds) or 'nothing'}; sha256 of the messages not kept: "
            f"{output_cut.get('sha256')}]")


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(len(v) for v in value)
    return len(str(value))


def _bundle(data: Mapping[str, Any]) -> list[str]:
    parts: list[str] = []
    text = data.get("text/plain")
    if isinstance(text, list):  # records are read back too, and may hold any JSON
        text = "".join(map(str, text))
    elif text is not None and not isinstance(text, str):
        text = str(text)
    if text is not None:
        parts.append(text)
    # One line names every other representation (a rich display carries several).
    others = [f"{mime}: {_size(value)} "
              f"{'base64 ' if mime.startswith('image/') and mime != 'image/svg+xml' else ''}"
              f"characters" for mime, value in data.items() if mime != "text/plain"]
    if others:
        parts.append(f"[{', '.join(others)}, kept in the record]")
    return parts


def render_outputs(outputs: Iterable[Mapping[str, Any]]) -> str:
    """Render nbformat v4 output dicts as plain text, in order."""
    pieces: list[str] = []
    for out in outputs:
        otype = out.get("output_type")
        if otype == "stream":
            pieces.append(strip_ansi(str(out.get("text", ""))))
        elif otype in ("execute_result", "display_data"):
            prefix = f"Out[{out['execution_count']}]: " if out.get("execution_count") else ""
            data = out.get("data")
            body = "\n".join(_bundle(data if isinstance(data, Mapping) else {}))
            pieces.append(prefix + body + "\n")
        elif otype == "error":
            lines = out.get("traceback")
            tb = "\n".join(strip_ansi(str(line)) for line in
                           (lines if isinstance(lines, list) else []))
            pieces.append(f"{out.get('ename')}: {out.get('evalue')}\n{tb}\n")
    return "".join(pieces)


def cell_header(cell_id: str, armed: bool) -> str:
    return f"[cell id: {cell_id}]\n" if armed else ""
