"""What each page of the record viewer shows, read from a verified projection.

Owns turning the rebuilt, checked ledger that
:func:`~host_kernel.store.verified.open_verified` hands back into plain values
for the templates: the sessions at a glance, one session as a timeline of
cells (with each output reduced to the one representation Jupyter would show),
an artifact with its lineage, a receipt, and a verdict. It also owns reading an
artifact's bytes from the blob store, which it hands out only when they still
hash to the recorded sha256.

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
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, cast

from .._errors import FileProblem, HostKernelError
from ..lineage.graph import Lineage, build_lineage, receipt_statement
from ..store.blobs import open_regular
from ..store.ledger import Ledger

__all__ = [
    "BlobUnavailable",
    "NotFound",
    "artifact_blob",
    "artifact_page",
    "artifact_prov",
    "check_blob",
    "choose_output",
    "content_disposition",
    "record_header",
    "receipt_json",
    "receipt_page",
    "session_page",
    "sessions_page",
    "strip_ansi",
    "verdict_page",
]

#: Richest first, as Jupyter chooses what to show of a display_data / execute_result.
MIME_ORDER = ("text/html", "image/svg+xml", "image/png", "image/jpeg", "image/gif",
              "text/markdown", "text/latex", "application/json", "text/plain")
_IMAGES = ("image/png", "image/jpeg", "image/gif")
#: Put before an HTML output in its frame: the viewer's fonts, as a notebook would give it.
FRAME_HEAD = ('<!doctype html><meta charset="utf-8"><style>body{margin:4px 6px;font:14px/1.45 '
              'system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif}table{border-collapse:'
              'collapse}th,td{padding:2px 8px;border-bottom:1px solid #ddd}</style>')
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


# --------------------------------------------------------------------------- sessions


def _confinement(started: dict[str, Any], generations: list[dict[str, Any]]) -> str:
    statuses = [str((g.get("confinement") or {}).get("status")) for g in generations
                if isinstance(g.get("confinement"), dict)]
    session = started.get("confinement") if isinstance(started.get("confinement"), dict) else {}
    assert isinstance(session, dict)
    network = "" if session.get("network", True) else ", no network"
    if statuses and all(s == "landlock" for s in statuses):
        abi = session.get("abi")
        return f"Landlock{f' ABI {abi}' if abi else ''}{network}"
    if statuses and any(s == "landlock" for s in statuses):
        return f"Landlock in {statuses.count('landlock')} of {len(statuses)} generations"
    reason = session.get("reason")
    return f"none ({reason})" if reason else "none"


_COUNTED = ("generations", "cells", "failed_cells", "receipts", "artifacts", "refusals")


def sessions_page(ledger: Ledger) -> list[dict[str, Any]]:
    """Every session, newest first, with its counts and its verdicts at a glance."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for table in ("generations", "receipts", "artifacts", "refusals"):
        for row in ledger.query(f"SELECT session, count(*) AS n FROM {table} GROUP BY session"):
            counts[row["session"]][table] = int(row["n"])
    for row in ledger.query("SELECT session, status, count(*) AS n FROM cells "
                            "GROUP BY session, status"):
        counts[row["session"]]["cells"] += int(row["n"])
        if row["status"] in FAILED:
            counts[row["session"]]["failed_cells"] += int(row["n"])
    verdicts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in ledger.query("SELECT session, submission_id, accepted FROM submissions "
                            "ORDER BY seq"):
        verdicts[row["session"]].append({"id": row["submission_id"],
                                         "accepted": bool(row["accepted"])})
    started = dict(_bodies(ledger, "session_started"))
    gens: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sid, body in _bodies(ledger, "generation_started"):
        gens[sid].append(body)
    out = []
    for row in ledger.query("SELECT * FROM sessions ORDER BY started DESC, session"):
        sid = row["session"]
        out.append({
            "id": sid, "started": when(row["started"]), "ended": when(row["ended"]),
            "open": row["ended"] is None, "mode": row["mode"] or "none",
            "armed": bool(row["armed"]), "front": row["front"], "workdir": row["workdir"],
            "request": row["request"],
            "confinement": _confinement(started.get(sid, {}), gens.get(sid, [])),
            "counts": {k: counts[sid].get(k, 0) for k in _COUNTED},
            "verdicts": verdicts.get(sid, []),
        })
    return out


def session_page(ledger: Ledger, session_id: str) -> dict[str, Any]:
    """One session as a timeline: generation starts and cells in order, each cell with its
    outputs, receipts, artifacts, writes, refusals and submissions."""
    rows = ledger.query("SELECT * FROM sessions WHERE session = ?", (session_id,))
    if not rows:
        raise NotFound(f"no session {session_id!r} in this record")
    summary = next((s for s in sessions_page(ledger) if s["id"] == session_id), None)
    finished = {b.get("cell_id"): b for _, b in _bodies(ledger, "cell_finished", session_id)}
    by_cell: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in ledger.query("SELECT * FROM receipts WHERE session = ? ORDER BY seq", (session_id,)):
        by_cell[r["cell_id"]]["receipts"].append(_receipt_summary(_json(r["body"], {}),
                                                                  r["receipt_id"]))
    for r in ledger.query("SELECT * FROM artifacts WHERE session = ? ORDER BY seq",
                          (session_id,)):
        by_cell[r["cell_id"]]["artifacts"].append(
            {"id": r["artifact_id"], "filename": r["filename"], "size": size(r["size"]),
             "media_type": r["media_type"], "sha256": r["sha256"]})
    for r in ledger.query("SELECT * FROM writes WHERE session = ? ORDER BY seq", (session_id,)):
        by_cell[r["cell_id"]]["writes"].append({"path": r["path"], "op": r["op"],
                                                "size": size(r["size"])})
    for r in ledger.query("SELECT * FROM loads WHERE session = ? ORDER BY seq", (session_id,)):
        by_cell[r["cell_id"]]["loads"].append({"artifact": r["artifact_id"], "path": r["path"]})
    unattached: list[dict[str, Any]] = []
    for r in ledger.query("SELECT * FROM refusals WHERE session = ? ORDER BY seq", (session_id,)):
        refusal = {"call": r["call"], "code": r["code"], "reason": r["reason"],
                   "generation": r["generation"]}
        (by_cell[r["cell_id"]]["refusals"] if r["cell_id"] else unattached).append(refusal)
    for r in ledger.query("SELECT submission_id, cell_id, accepted FROM submissions "
                          "WHERE session = ? ORDER BY seq", (session_id,)):
        item = {"id": r["submission_id"], "accepted": bool(r["accepted"])}
        (by_cell[r["cell_id"]]["submissions"] if r["cell_id"] else unattached).append(
            dict(item, call="submit"))
    generations = {int(g["generation"]): g for g in ledger.query(
        "SELECT * FROM generations WHERE session = ? ORDER BY generation", (session_id,))}
    timeline: list[dict[str, Any]] = []
    shown_generation: int | None = None
    for c in ledger.query("SELECT * FROM cells WHERE session = ? ORDER BY seq_started",
                          (session_id,)):
        gen = c["generation"]
        if gen != shown_generation and gen in generations:
            g = generations[gen]
            timeline.append({"type": "generation", "generation": gen, "reason": g["reason"],
                             "started": when(g["started"])})
        shown_generation = gen
        body = finished.get(c["cell_id"], {})
        outputs = _json(c["outputs"], [])
        duration = body.get("duration")
        if not isinstance(duration, (int, float)) and c["ended"] is not None:
            duration = c["ended"] - c["started"]
        attached = by_cell.get(c["cell_id"], {})
        timeline.append({
            "type": "cell", "id": c["cell_id"], "frontend_id": c["frontend_cell_id"],
            "code": c["code"] or "", "status": c["status"], "generation": gen,
            "execution_count": c["execution_count"], "started": when(c["started"]),
            "duration": seconds(duration if isinstance(duration, (int, float)) else None),
            "notice": body.get("notice"),
            "outputs": [choose_output(o) for o in outputs if isinstance(o, dict)],
            **{k: attached.get(k, []) for k in ("receipts", "artifacts", "writes", "loads",
                                                 "refusals", "submissions")},
        })
    return {"session": summary, "timeline": timeline, "unattached": unattached,
            "workdir": rows[0]["workdir"], "request": rows[0]["request"]}


# --------------------------------------------------------------------------- receipts


def _outcome(r: dict[str, Any]) -> str:
    if r.get("timed_out"):
        return "timed out"
    if r.get("signal") is not None:
        return f"killed by signal {r['signal']}"
    return f"exit {r.get('exit_status')}"


def _receipt_summary(r: dict[str, Any], receipt_id: str) -> dict[str, Any]:
    changes = r.get("changes") if isinstance(r.get("changes"), list) else []
    assert isinstance(changes, list)
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
    }


def receipt_json(ledger: Ledger, receipt_id: str) -> dict[str, Any]:
    """The receipt as an in-toto Statement v1, as ``host-kernel receipt`` writes it."""
    try:
        return receipt_statement(ledger, receipt_id)
    except FileProblem as exc:
        raise NotFound(exc.message) from None


def receipt_page(ledger: Ledger, receipt_id: str) -> dict[str, Any]:
    rows = ledger.query("SELECT * FROM receipts WHERE receipt_id = ?", (receipt_id,))
    if not rows:
        raise NotFound(f"no receipt {receipt_id!r} in this record")
    body = _json(rows[0]["body"], {})
    fields = [(k, body[k]) for k in ("cwd", "executable", "executable_sha256",
                                     "executable_in_workspace", "path_differs", "env_changed",
                                     "stdout_sha256", "stderr_sha256", "changes_found_by",
                                     "workspace_manifest_sha256", "shadowed_modules")
              if k in body]
    return {"receipt": _receipt_summary(body, receipt_id), "session": rows[0]["session"],
            "cell": rows[0]["cell_id"], "generation": rows[0]["generation"],
            "started": when(body.get("started")), "fields": fields}


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


def artifact_blob(source: BlobSource, sha256: str) -> BinaryIO:
    """The artifact's bytes from the record's blob store, only if they hash to ``sha256``:
    a file positioned at its start, in memory up to :data:`BLOB_IN_MEMORY` and spilled to a
    temporary file past it (the caller closes it). What is served is this copy, taken in
    the same pass that hashed it, so a blob swapped after the check is never served.
    Raises BlobUnavailable saying why not."""
    copy = tempfile.SpooledTemporaryFile(max_size=BLOB_IN_MEMORY)
    try:
        _read_blob(source, sha256, copy.write)
    except BaseException:
        copy.close()
        raise
    copy.seek(0)
    return cast(BinaryIO, copy)


def artifact_page(ledger: Ledger, blobs: BlobSource, artifact_id: str) -> dict[str, Any]:
    """An artifact: its fields, its lineage graph, the receipts involved, and whether its
    bytes can be downloaded."""
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
    try:
        check_blob(blobs, a["sha256"])
    except BlobUnavailable as exc:
        blob_problem = str(exc)
    loads = [{"cell": r["cell_id"], "path": r["path"], "session": r["session"]}
             for r in ledger.query("SELECT * FROM loads WHERE artifact_id = ? ORDER BY seq",
                                   (artifact_id,))]
    nodes = [{"id": n.id, "kind": n.kind, "label": n.label,
              "link": _node_link(n.kind, n.attrs)} for n in graph.nodes]
    return {
        "id": artifact_id, "filename": a["filename"], "sha256": a["sha256"],
        "size": size(a["size"]), "bytes": a["size"], "media_type": a["media_type"],
        "cell": a["cell_id"], "session": a["session"], "generation": a["generation"],
        "source_path": a["source_path"], "saved": when(a["ts"]),
        "graph": graph, "nodes": nodes, "truncated": graph.truncated,
        "receipts": sorted(receipts.items(), key=lambda kv: kv[1]),
        "blob_problem": blob_problem, "loads": loads,
    }


def _node_link(kind: str, attrs: dict[str, Any]) -> str | None:
    if kind == "artifact" and attrs.get("artifact_id"):
        return f"/artifact/{attrs['artifact_id']}"
    if kind == "receipt" and attrs.get("receipt_id"):
        return f"/receipt/{attrs['receipt_id']}"
    return None


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


# --------------------------------------------------------------------------- verdicts


def verdict_page(ledger: Ledger, submission_id: str) -> dict[str, Any]:
    """A submission's verdict: failed checks first (blocking, then advisory), then the rest,
    the reproduction of its test evidence, and what was submitted."""
    rows = ledger.query("SELECT * FROM submissions WHERE submission_id = ?", (submission_id,))
    if not rows:
        raise NotFound(f"no submission {submission_id!r} in this record")
    body = _json(rows[0]["body"], {})
    verdict = body.get("verdict") if isinstance(body.get("verdict"), dict) else {}
    assert isinstance(verdict, dict)
    checks = [c for c in verdict.get("checks", []) if isinstance(c, dict)]
    checks.sort(key=lambda c: (bool(c.get("ok")), bool(c.get("advisory"))))
    submission = body.get("submission") if isinstance(body.get("submission"), dict) else {}
    assert isinstance(submission, dict)
    sections = []
    for r in verdict.get("reproduction", []):
        if not isinstance(r, dict):
            continue
        invocation = r.get("invocation") if isinstance(r.get("invocation"), dict) else {}
        assert isinstance(invocation, dict)
        counts = r.get("counts") if isinstance(r.get("counts"), dict) else {}
        assert isinstance(counts, dict)
        shown = {"runner", "command", "outcome", "counts", "duration", "output_tail",
                 "invocation", "failing", "failures"}
        sections.append({
            "command": r.get("command"), "runner": invocation.get("runner"),
            "outcome": r.get("outcome"), "passed": r.get("outcome") == "passed",
            "counts": [(k, v) for k, v in counts.items() if v],
            "duration": seconds(r.get("duration") if isinstance(r.get("duration"),
                                                                (int, float)) else None),
            "failing": r.get("failing") or [], "failures": r.get("failures") or [],
            "output_tail": strip_ansi(str(r.get("output_tail") or "")),
            "details": [(k, v if isinstance(v, (str, int, float, bool)) or v is None
                         else json.dumps(v, ensure_ascii=False)[:2000])
                        for k, v in sorted(r.items()) if k not in shown],
        })
    return {
        "id": submission_id, "accepted": bool(rows[0]["accepted"]),
        "mode": verdict.get("mode"), "armed": bool(verdict.get("armed")),
        "session": rows[0]["session"], "cell": rows[0]["cell_id"],
        "checks": [{"code": str(c.get("code")), "ok": bool(c.get("ok")),
                    "advisory": bool(c.get("advisory")), "message": str(c.get("message", ""))}
                   for c in checks],
        "failed": sum(1 for c in checks if not c.get("ok") and not c.get("advisory")),
        "reproduction": sections,
        "bullets": [str(b) for b in submission.get("completion_bullets") or []],
        "task_status": submission.get("task_status"),
        "output": json.dumps(submission.get("output"), indent=2, ensure_ascii=False),
        "declared": [(k, json.dumps(submission[k], indent=2, ensure_ascii=False))
                     for k in ("source_files", "entry_points", "architecture_summary",
                               "test_evidence", "output_schema", "output_error")
                     if submission.get(k) is not None],
    }
