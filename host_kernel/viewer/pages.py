"""The viewer's shared reading: outputs, receipts, artifacts, links, and checked blob bytes.

Owns turning the rebuilt, checked ledger that
:func:`~host_kernel.store.verified.open_verified` hands back into plain values
for the templates where more than one page needs them: each output reduced to
the one representation Jupyter would show, a receipt (its summary under a cell,
and its own page, in words, never reprs), an artifact's page (its fields,
lineage and preview), the link to a cell on the page of its session it is on,
and the small formatting helpers. It also owns reading an artifact's bytes from
the blob store, which it hands out only when they still hash to the recorded
sha256. The sessions list and a session's pages are :mod:`.sessions`'s, a
verdict is :mod:`.verdicts`'s.

It does not verify the record (the caller passes a verified ledger), it does
not render HTML (the templates do, with autoescaping on) and it never writes
anything. Every value from the record is untrusted text: nothing here marks
record content as safe markup, except the lineage SVG, which
:func:`~host_kernel.lineage.svg.lineage_svg` builds with every label escaped.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, cast

from .._errors import FileProblem, HostKernelError
from ..lineage.graph import Lineage, build_lineage, receipt_statement
from ..store.blobs import open_regular
from ..store.ledger import Ledger
from .preview import preview, wants_whole

__all__ = [
    "CELLS_PER_PAGE",
    "BlobSource",
    "BlobUnavailable",
    "NotFound",
    "artifact_blob",
    "artifact_page",
    "artifact_prov",
    "blob_bytes",
    "blob_head",
    "cell_link",
    "check_blob",
    "choose_output",
    "content_disposition",
    "receipt_json",
    "receipt_page",
    "receipt_summary",
    "record_header",
    "strip_ansi",
    "yes_no",
]

#: Richest first, as Jupyter chooses what to show of a display_data / execute_result.
MIME_ORDER = ("text/html", "image/svg+xml", "image/png", "image/jpeg", "image/gif",
              "text/markdown", "text/latex", "application/json", "text/plain")
_IMAGES = ("image/png", "image/jpeg", "image/gif")
#: Put before an HTML output in its frame: the viewer's fonts, as a notebook would give it.
FRAME_HEAD = ('<!doctype html><meta charset="utf-8"><style>body{margin:4px 6px;font:14px/1.45 '
              'system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif}table{border-collapse:'
              'collapse}th,td{padding:2px 8px;border-bottom:1px solid #ddd}</style>')
#: Cells on one page of a session.
CELLS_PER_PAGE = 200
#: Statuses drawn as failures; anything else that is not "ok" is drawn as a warning.
FAILED = frozenset({"error", "timeout", "kernel_died", "host_died"})

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class NotFound(Exception):
    """The record holds no such session, cell, artifact, receipt or submission."""


class BlobUnavailable(Exception):
    """An artifact's bytes cannot be handed out: missing, unreadable, or altered."""


# --------------------------------------------------------------------------- small helpers


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour and cursor escapes (IPython colours its tracebacks)."""
    return _ANSI.sub("", text)


def when(ts: float | None) -> str:
    """A timestamp as local time, to the second; an empty string for none."""
    if ts is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def seconds(value: float | None) -> str:
    if value is None:
        return ""
    if value < 60:
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    minutes, rest = divmod(value, 60)
    return f"{int(minutes)} min {rest:.0f} s"


def size(n: int | None) -> str:
    if n is None:
        return ""
    if n < 1024:
        return "1 byte" if n == 1 else f"{n} bytes"
    value = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:.1f} {unit}"


def _json(text: str | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def _joined(value: Any) -> str:
    """nbformat allows text as a string or a list of strings."""
    if isinstance(value, list):
        return "".join(str(v) for v in value)
    return "" if value is None else str(value)


def _bodies(ledger: Ledger, kind: str, session: str | None = None) -> list[tuple[str, dict[str,
                                                                                         Any]]]:
    """The (session, body) of every checked event of ``kind``, in order."""
    sql = "SELECT session, body FROM events WHERE kind = ?"
    params: tuple[Any, ...] = (kind,)
    if session is not None:
        sql += " AND session = ?"
        params += (session,)
    found = []
    for row in ledger.query(sql + " ORDER BY seq", params):
        body = _json(row["body"], {})
        found.append((row["session"], body if isinstance(body, dict) else {}))
    return found


def record_header(ledger: Ledger, record_dir: object) -> dict[str, Any]:
    """What the header of every page says about the record: where it is, and its chain head."""
    head = ledger.head()
    return {"path": str(record_dir), "head": head.hash if head else None,
            "head_short": head.hash[:12] if head else None, "events": head.seq if head else 0}


# --------------------------------------------------------------------------- outputs


def choose_output(output: dict[str, Any]) -> dict[str, Any]:
    """One nbformat output reduced to what the viewer draws, as a dict with ``kind``:

    ``stream`` (name, text), ``error`` (ename, evalue, traceback without ANSI
    escapes), ``html`` (the markup, for a sandboxed frame, and a height guess in
    lines), ``image`` (a ``data:`` URL of PNG, JPEG, GIF or SVG; SVG is shown
    as an image so it cannot script), ``text`` (markdown, LaTeX, JSON or plain
    text, preformatted) or ``empty``.
    """
    kind = output.get("output_type")
    if kind == "stream":
        return {"kind": "stream", "name": str(output.get("name", "stdout")),
                "text": strip_ansi(_joined(output.get("text")))}
    if kind == "error":
        trace = output.get("traceback")
        lines = trace if isinstance(trace, list) else [_joined(trace)]
        return {"kind": "error", "ename": str(output.get("ename", "")),
                "evalue": strip_ansi(str(output.get("evalue", ""))),
                "traceback": strip_ansi("\n".join(str(line) for line in lines))}
    data = output.get("data")
    if not isinstance(data, dict):
        return {"kind": "empty"}
    count = output.get("execution_count") if kind == "execute_result" else None
    for mime in MIME_ORDER:
        if mime not in data:
            continue
        value = data[mime]
        shown = _one_output(mime, value)
        if shown is not None:
            shown["mime"] = mime
            shown["execution_count"] = count
            return shown
    return {"kind": "empty", "mime": ", ".join(sorted(str(k) for k in data))}


def _one_output(mime: str, value: Any) -> dict[str, Any] | None:
    if mime == "text/html":
        markup = _joined(value)
        return {"kind": "html", "html": FRAME_HEAD + markup, "lines": _html_lines(markup)}
    if mime == "image/svg+xml":
        svg = _joined(value).encode("utf-8")
        return {"kind": "image", "src": "data:image/svg+xml;base64,"
                + base64.b64encode(svg).decode("ascii")}
    if mime in _IMAGES:
        raw = re.sub(r"\s+", "", _joined(value))
        try:
            base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            return None  # not base64: fall through to a poorer representation
        return {"kind": "image", "src": f"data:{mime};base64,{raw}"}
    if mime == "application/json":
        return {"kind": "text", "text": json.dumps(value, indent=2, ensure_ascii=False)}
    return {"kind": "text", "text": strip_ansi(_joined(value))}


_BLOCKS = re.compile(r"<(?:tr|br|p|li|div|h[1-6]|pre|table|hr|dt|dd)\b", re.IGNORECASE)


def _html_lines(markup: str) -> int:
    """A guess at how many lines of text an HTML output takes, to size its frame (the frame
    runs no script, so it cannot report its own height)."""
    return max(1, min(40, len(_BLOCKS.findall(markup)) + markup.count("\n") // 4 + 1))


# --------------------------------------------------------------------------- receipts


def _outcome(r: dict[str, Any]) -> str:
    if r.get("timed_out"):
        return "timed out"
    if r.get("signal") is not None:
        return f"killed by signal {r['signal']}"
    return f"exit {r.get('exit_status')}"


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value if isinstance(v, str)] if isinstance(value, list) else []


def receipt_summary(r: dict[str, Any], receipt_id: str) -> dict[str, Any]:
    """A receipt as the pages show it: command and outcome, tails, the files it read (as the
    Host's tracer saw) and the files it changed."""
    changes: list[Any] = r["changes"] if isinstance(r.get("changes"), list) else []
    traced = r.get("traced") if isinstance(r.get("traced"), dict) else None
    return {
        "id": receipt_id, "command": str(r.get("command", "")), "outcome": _outcome(r),
        "ok": r.get("exit_status") == 0 and not r.get("timed_out"),
        "duration": seconds(r.get("duration") if isinstance(r.get("duration"), (int, float))
                            else None),
        "stdout_tail": strip_ansi(str(r.get("stdout_tail") or "")),
        "stderr_tail": strip_ansi(str(r.get("stderr_tail") or "")),
        "stdout_size": r.get("stdout_size"), "stderr_size": r.get("stderr_size"),
        "changes": [{"path": c.get("path"), "change": c.get("change"), "size": size(c.get("size")),
                     "sha256": c.get("sha256")} for c in changes if isinstance(c, dict)],
        "changes_truncated": bool(r.get("changes_truncated")),
        "traced": traced is not None,
        "reads": _strings(traced.get("reads")) if traced is not None else [],
        "reads_dropped": bool(traced.get("dropped")) if traced is not None else False,
    }


def yes_no(value: Any) -> str:
    """A recorded value as a reviewer reads it, never a Python repr: ``yes``/``no`` for a
    flag, ``none`` for nothing or an empty list, a list as its items."""
    if value is True:
        return "yes"
    if value is False:
        return "no"
    if value is None or value == [] or value == {}:
        return "none"
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return ", ".join(str(v) for v in value)
    if isinstance(value, (str, int, float)):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


#: The receipt page's facts after the command: (label, field, shown as code).
RECEIPT_FACTS = (
    ("working folder", "cwd", True), ("executable", "executable", True),
    ("executable sha256", "executable_sha256", True),
    ("executable in the workspace", "executable_in_workspace", False),
    ("PATH differs from launch", "path_differs", False),
    ("environment variables changed", "env_changed", True),
    ("modules shadowed", "shadowed_modules", True),
    ("stdout sha256", "stdout_sha256", True), ("stderr sha256", "stderr_sha256", True),
    ("changes found by", "changes_found_by", False),
    ("workspace manifest sha256", "workspace_manifest_sha256", True),
)


def receipt_json(ledger: Ledger, receipt_id: str) -> dict[str, Any]:
    """The receipt as an in-toto Statement v1, as ``host-kernel receipt`` writes it."""
    try:
        return receipt_statement(ledger, receipt_id)
    except FileProblem as exc:
        raise NotFound(exc.message) from None


def receipt_page(ledger: Ledger, receipt_id: str) -> dict[str, Any]:
    """A receipt: its command and outcome first, then the files it read and changed, then
    where it ran and its digests, each value as words (no reprs)."""
    rows = ledger.query("SELECT * FROM receipts WHERE receipt_id = ?", (receipt_id,))
    if not rows:
        raise NotFound(f"no receipt {receipt_id!r} in this record")
    body = _json(rows[0]["body"], {})
    fields = [(label, yes_no(body[k]), code) for label, k, code in RECEIPT_FACTS if k in body]
    session, cell = rows[0]["session"], rows[0]["cell_id"]
    return {"receipt": receipt_summary(body, receipt_id), "session": session,
            "cell": cell, "cell_link": cell_link(ledger, session, cell),
            "generation": rows[0]["generation"], "started": when(body.get("started")),
            "ended": when(body.get("ended")), "fields": fields}


def cell_link(ledger: Ledger, session: str, cell_id: str) -> str:
    """The path of ``cell_id`` on its session's page: the page of two hundred cells it is on,
    and its anchor."""
    rows = ledger.query("SELECT count(*) FROM cells WHERE session = ? AND seq_started < "
                        "(SELECT seq_started FROM cells WHERE cell_id = ? AND session = ?)",
                        (session, cell_id, session))
    before = int(rows[0][0]) if rows and rows[0][0] is not None else 0
    page = before // CELLS_PER_PAGE + 1
    return f"/session/{session}" + (f"?page={page}" if page > 1 else "") + f"#cell-{cell_id}"


# --------------------------------------------------------------------------- artifacts


def _lineage(ledger: Ledger, artifact_id: str) -> Lineage:
    try:
        return build_lineage(ledger, artifact_id)
    except FileProblem as exc:
        raise NotFound(exc.message) from None


def artifact_prov(ledger: Ledger, artifact_id: str) -> dict[str, Any]:
    """The artifact's lineage as W3C PROV-JSON, as ``host-kernel lineage --format prov-json``."""
    return _lineage(ledger, artifact_id).to_prov()


#: Bytes read from a blob at a time, and kept in memory before a download spills to disk.
BLOB_CHUNK = 1 << 20
BLOB_IN_MEMORY = 16 << 20


#: Where a viewer reads blobs: a record folder, or a store's reader (what
#: :func:`host_kernel.audit.ledger_blob_sources` gives for a PostgreSQL ledger).
BlobSource = Path | Any


def _open_blob(source: BlobSource, sha256: str) -> BinaryIO:
    """The stored bytes named ``sha256``, opened for reading (FileNotFoundError: none).

    In a record folder, opened without creating anything (the store's own constructor
    makes its folders), never following a symlink nor blocking on a FIFO."""
    if isinstance(source, Path):
        return open_regular(source / "blobs" / "sha256" / sha256[:2] / sha256)
    try:
        return cast(BinaryIO, source.open(sha256))
    except HostKernelError as exc:
        if getattr(exc, "code", None) == "blob_missing":
            raise FileNotFoundError(sha256) from None
        raise


def _read_blob(source: BlobSource, sha256: str, sink: Callable[[bytes], object] | None) -> None:
    """Read the blob named ``sha256`` in chunks, handing each to ``sink``, and raise
    BlobUnavailable unless the bytes hash to ``sha256``. Memory stays at one chunk."""
    if not _SHA256.fullmatch(sha256):
        raise BlobUnavailable("the recorded sha256 is not a sha256 digest")
    digest = hashlib.sha256()
    try:
        with _open_blob(source, sha256) as f:
            while chunk := f.read(BLOB_CHUNK):
                digest.update(chunk)
                if sink is not None:
                    sink(chunk)
    except FileNotFoundError:
        raise BlobUnavailable("its bytes are not in the record's blob store") from None
    except (OSError, HostKernelError) as exc:  # a store's verified read: blob_altered too
        raise BlobUnavailable(f"its bytes cannot be read ({exc})") from None
    actual = digest.hexdigest()
    if actual != sha256:
        raise BlobUnavailable(f"the stored bytes hash to {actual[:12]}…, not to the recorded "
                              f"sha256: the blob store was altered; they are not served")


def check_blob(source: BlobSource, sha256: str) -> None:
    """Raise BlobUnavailable unless the artifact's stored bytes hash to ``sha256``."""
    _read_blob(source, sha256, None)


def blob_head(source: BlobSource, sha256: str, limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of the blob and whether that is all of it, only if the whole
    blob hashes to ``sha256`` (every byte is read). Raises BlobUnavailable."""
    kept: list[bytes] = []
    held = 0

    def sink(chunk: bytes) -> None:
        nonlocal held
        if held < limit:
            kept.append(chunk[: limit - held])
        held += len(chunk)

    _read_blob(source, sha256, sink)
    return b"".join(kept), held <= limit


def blob_bytes(source: BlobSource, sha256: str, limit: int) -> bytes | None:
    """The blob's bytes, only if they hash to ``sha256``; None when it is larger than
    ``limit`` bytes. Raises BlobUnavailable."""
    head, whole = blob_head(source, sha256, limit)
    return head if whole else None


def artifact_blob(source: BlobSource, sha256: str) -> BinaryIO:
    """The artifact's bytes from the record's blob store, only if they hash to ``sha256``:
    a file positioned at its start, in memory up to :data:`BLOB_IN_MEMORY` and spilled to a
    temporary file past it (the caller closes it). What is served is this copy, taken in
    the same pass that hashed it, so a blob swapped after the check is never served.
    Raises BlobUnavailable saying why not."""
    copy = tempfile.SpooledTemporaryFile(max_size=BLOB_IN_MEMORY)  # noqa: SIM115 (returned)
    try:
        _read_blob(source, sha256, copy.write)
    except BaseException:
        copy.close()
        raise
    copy.seek(0)
    return cast(BinaryIO, copy)


def artifact_page(ledger: Ledger, blobs: BlobSource, artifact_id: str) -> dict[str, Any]:
    """An artifact: its fields, a preview of its bytes, its lineage graph, the receipts
    involved, and whether its bytes can be downloaded."""
    rows = ledger.query("SELECT * FROM artifacts WHERE artifact_id = ?", (artifact_id,))
    if not rows:
        raise NotFound(f"no artifact {artifact_id!r} in this record")
    a = rows[0]
    graph = _lineage(ledger, artifact_id)
    receipts = {str(n.attrs.get("receipt_id")): n.label for n in graph.nodes
                if n.kind == "receipt" and n.attrs.get("receipt_id")}
    for r in ledger.query("SELECT receipt_id, command FROM receipts WHERE cell_id = ? "
                          "ORDER BY seq", (a["cell_id"],)):
        receipts.setdefault(r["receipt_id"], f"$ {r['command']}")
    blob_problem: str | None = None
    head: bytes | None = None
    whole = False
    try:  # one pass: the whole blob hashed, its head kept for the preview
        head, whole = blob_head(blobs, a["sha256"], wants_whole(a["filename"], a["media_type"]))
    except BlobUnavailable as exc:
        blob_problem = str(exc)
    loads = [{"cell": r["cell_id"], "path": r["path"], "session": r["session"],
              "link": cell_link(ledger, r["session"], r["cell_id"]) if r["cell_id"] else None}
             for r in ledger.query("SELECT * FROM loads WHERE artifact_id = ? ORDER BY seq",
                                   (artifact_id,))]
    return {
        "id": artifact_id, "filename": a["filename"], "sha256": a["sha256"],
        "size": size(a["size"]), "bytes": a["size"], "media_type": a["media_type"],
        "cell": a["cell_id"], "session": a["session"], "generation": a["generation"],
        "cell_link": cell_link(ledger, a["session"], a["cell_id"]) if a["cell_id"] else None,
        "source_path": a["source_path"], "saved": when(a["ts"]),
        "graph": graph, "truncated": graph.truncated,
        "receipts": sorted(receipts.items(), key=lambda kv: kv[1]),
        "blob_problem": blob_problem, "loads": loads,
        "preview": preview(artifact_id, a["filename"], a["media_type"], head, whole),
    }


def safe_filename(name: str) -> str:
    """A download name with no path, quote or control characters (letters of any script)."""
    base = os.path.basename(name.replace("\\", "/")) or "artifact"
    cleaned = "".join(c if c.isalnum() or c in "._-+ " else "_" for c in base).strip(". ")
    return cleaned[:120] or "artifact"


def content_disposition(name: str) -> str:
    """An ``attachment`` header value for ``name``: an ASCII ``filename`` for every client
    and, when the name has other letters, its UTF-8 form as ``filename*`` (RFC 6266 and
    5987); header values must be Latin-1, so a name in another script cannot go as is."""
    safe = safe_filename(name)
    ascii_name = safe.encode("ascii", "replace").decode("ascii").replace("?", "_")
    value = f'attachment; filename="{ascii_name}"'
    if ascii_name != safe:
        value += f"; filename*=UTF-8''{urllib.parse.quote(safe, safe='')}"
    return value
