"""A preview of an artifact's own bytes on its page, from the verified blob.

Owns deciding how an artifact is previewed and reducing its bytes to what a
template draws: PNG, JPEG, GIF and SVG as an image served by the viewer's
verified image route (an SVG only ever as an ``<img>``, where it cannot
script), the head of a CSV or TSV as a table (the ``csv`` module), the head of
a Parquet file as a table when ``pyarrow`` can be imported, JSON pretty-printed
and text as preformatted text, each within a size cap. The bytes are the ones
:func:`~host_kernel.viewer.pages.blob_head` read after checking the whole
blob's sha256; nothing here is marked safe markup.

It does not read the record or the blob store itself, and it serves nothing.
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import io
import json
import os
from typing import Any

__all__ = ["IMAGE_TYPES", "PREVIEW_BYTES", "TABLE_ROWS", "preview", "wants_whole"]

#: Media types previewed as an image (the image route serves these and no other).
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/svg+xml"})
#: Bytes of text, JSON or CSV read for a preview.
PREVIEW_BYTES = 256 * 1024
#: Characters of text shown, rows and columns of a table, characters of a table cell.
TEXT_CHARS = 64 * 1024
TABLE_ROWS = 20
TABLE_COLUMNS = 40
CELL_CHARS = 200
#: A Parquet file is read whole to preview it; past this size it is not previewed.
PARQUET_BYTES = 64 << 20

_BY_SUFFIX = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
              ".gif": "image/gif", ".svg": "image/svg+xml", ".csv": "text/csv",
              ".tsv": "text/tab-separated-values", ".json": "application/json",
              ".parquet": "application/vnd.apache.parquet"}


def media_type(filename: str, recorded: str | None) -> str:
    """The artifact's media type: the recorded one, or the one its name's suffix says."""
    suffix = os.path.splitext(filename)[1].lower()
    if recorded and recorded != "application/octet-stream":
        return recorded
    return _BY_SUFFIX.get(suffix, recorded or "application/octet-stream")


def _kind(mime: str, filename: str) -> str:
    suffix = os.path.splitext(filename)[1].lower()
    if mime in IMAGE_TYPES:
        return "image"
    if mime in ("text/csv", "text/tab-separated-values") or suffix in (".csv", ".tsv"):
        return "csv"
    if "parquet" in mime or suffix == ".parquet":
        return "parquet"
    if mime == "application/json" or mime.endswith("+json") or suffix == ".json":
        return "json"
    return "text"


def wants_whole(filename: str, mime: str | None) -> int:
    """How many bytes of the artifact its preview reads."""
    return PARQUET_BYTES if _kind(media_type(filename, mime), filename) == "parquet" \
        else PREVIEW_BYTES


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


def _table(rows: list[list[Any]], header: list[Any] | None, total: int | None,
           more: bool) -> dict[str, Any]:
    width = max([len(header or [])] + [len(r) for r in rows] or [0])
    cut = width > TABLE_COLUMNS
    width = min(width, TABLE_COLUMNS)

    def pad(row: list[Any]) -> list[str]:
        kept = row[:width]
        return [_cell(v) for v in kept] + [""] * (width - len(kept))

    return {"kind": "table", "header": pad(header) if header is not None else None,
            "rows": [pad(r) for r in rows], "total": total, "more": more,
            "columns_cut": cut}


def _csv(data: bytes, whole: bool, filename: str) -> dict[str, Any]:
    text = data.decode("utf-8", errors="replace")
    if not whole:  # the last line may be cut in the middle
        text = text[: text.rfind("\n") + 1] or text
    dialect: Any = csv.excel_tab if filename.lower().endswith(".tsv") else csv.excel
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|")
    except csv.Error:
        pass
    try:
        reader = csv.reader(io.StringIO(text, newline=""), dialect)
        rows = []
        for row in reader:
            rows.append(row)
            if len(rows) > TABLE_ROWS:
                break
    except csv.Error as exc:
        return {"kind": "text", "text": text[:TEXT_CHARS], "note": f"not read as CSV: {exc}",
                "more": True}
    if not rows:
        return {"kind": "empty"}
    header, body = rows[0], rows[1:TABLE_ROWS + 1]
    return _table(body, header, None, len(rows) > TABLE_ROWS or not whole)


def _parquet(data: bytes) -> dict[str, Any]:
    if importlib.util.find_spec("pyarrow") is None:
        return {"kind": "none", "note": "a Parquet file: its head is shown when pyarrow is "
                                        "installed"}
    pa = importlib.import_module("pyarrow")  # optional: imported only when installed
    pq = importlib.import_module("pyarrow.parquet")

    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        total = parquet.metadata.num_rows
        batch = next(parquet.iter_batches(batch_size=TABLE_ROWS), None)
    except (pa.ArrowException, OSError, ValueError) as exc:
        return {"kind": "none", "note": f"not read as Parquet: {exc}"}
    header = list(parquet.schema_arrow.names)
    rows = [] if batch is None else [[r.get(name) for name in header]
                                     for r in batch.to_pylist()]
    return _table(rows, header, total, total > len(rows))


def preview(artifact_id: str, filename: str, recorded_type: str | None, data: bytes | None,
            whole: bool) -> dict[str, Any]:
    """How the artifact page previews the artifact: ``kind`` ``image`` (``src``), ``table``
    (``header``, ``rows``, ``more``), ``text`` (``text``, ``more``), ``none`` (``note``) or
    ``empty``. ``data`` is its first bytes (None: they could not be served), ``whole``
    whether that is all of them."""
    mime = media_type(filename, recorded_type)
    kind = _kind(mime, filename)
    if data is None:
        return {"kind": "none", "note": "no preview: the artifact's bytes are not served"}
    if kind == "image":
        return {"kind": "image", "src": f"/artifact/{artifact_id}/image", "mime": mime}
    if not data:
        return {"kind": "empty"}
    if kind == "parquet":
        if not whole:
            return {"kind": "none", "note": f"a Parquet file over {PARQUET_BYTES >> 20} MiB: "
                                            f"not previewed"}
        return _parquet(data)
    if kind == "csv":
        return _csv(data, whole, filename)
    if b"\x00" in data[:8192]:
        return {"kind": "none", "note": f"binary data ({mime}): download it to look inside"}
    text = data.decode("utf-8", errors="replace")
    if kind == "json" and whole:
        try:
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError):
            pass  # shown as it is
    return {"kind": "text", "text": text[:TEXT_CHARS],
            "more": not whole or len(text) > TEXT_CHARS, "mime": mime}
