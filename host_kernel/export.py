"""Export one session of a record as an nbformat 4.5 notebook.

Owns turning a session's cells, as the Host recorded them, into a notebook a
person can open in JupyterLab: one code cell per executed cell, whose ``id`` is
the Host-minted cell id, with its source, its recorded outputs and execution
count; cell metadata under ``host_kernel`` with the generation, status,
receipts, artifacts (with their lineage inputs) and the frontend's own cell id;
notebook metadata under ``host_kernel`` with the session, its mode and every
submission verdict. It reads the record through
:func:`~host_kernel.store.verified.open_verified`: a projection rebuilt from the
checked, hash-chained events, never the projection tables on disk, and it
refuses a record whose chain is broken or whose stored projection disagrees
with its events. It never writes the record.

When the session recorded the notebook file it ran (``session_started``'s
``notebook``: ``host-kernel exec``, a batch's notebook task) and that file still
has the recorded sha256, its markdown and raw cells are put back between the
executed cells where they stood (metadata ``host_kernel.from_notebook``); when
it is gone or changed, a first markdown cell says why they are missing, and so
does the notebook metadata's ``host_kernel.notebook.markdown``.

Outputs are kept as recorded, cleaned only where nbformat's schema would
reject them (keys it does not allow, non-text values under a text media type),
so ``nbformat.validate`` passes on every export. A cell that never finished in
its kernel (status ``interrupted``: the Host's own process was stopped while it
ran; ``host_died``: the Host died and a later one closed the cell) gets one
output the record does not hold: an ``error`` output that says so (see
:data:`UNFINISHED`), so the notebook shows it where the cell's result would be.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import nbformat

from ._errors import RecordError
from .store.ledger import SQLiteLedger, collector_paused
from .store.verified import open_verified, record_folder

__all__ = ["KERNELSPEC", "UNFINISHED", "UnknownSession", "export_notebook", "record_folder"]

#: The kernelspec an exported notebook names: the control kernel (host-kernel install).
KERNELSPEC = {"name": "host_kernel", "display_name": "Python 3 (host_kernel)",
              "language": "python"}

#: Statuses of a cell that never finished in its kernel, and the ``ename`` of the error
#: output the export adds to such a cell (its ``evalue`` is the recorded notice).
UNFINISHED = {"interrupted": "Interrupted", "host_died": "HostDied"}


class UnknownSession(RecordError, LookupError):
    """``session`` names no session of the record, or is a prefix of several ids."""

    code = "session_unknown"


# nbformat ships no type hints.
_new_notebook = cast(Callable[..., Any], nbformat.v4.new_notebook)
_from_dict = cast(Callable[..., Any], nbformat.from_dict)

#: Media types whose value may be any JSON (nbformat's own pattern); others must be text.
_JSON_MIME = re.compile(r"^application/(.*\+)?json$")

#: The keys nbformat 4.5 allows on each output type.
_OUTPUT_KEYS = {
    "stream": ("output_type", "name", "text"),
    "display_data": ("output_type", "data", "metadata"),
    "execute_result": ("output_type", "data", "metadata", "execution_count"),
    "error": ("output_type", "ename", "evalue", "traceback"),
}


def export_notebook(record_dir: str | Path, session: str | None = None) -> Any:
    """The session (default: the latest started in the record) as an nbformat 4.5 notebook.

    ``record_dir`` is a record folder or a workspace
    (:func:`~host_kernel.store.verified.record_folder`); ``session`` a session id
    or a prefix that only one session id starts with.
    Raises :class:`UnknownSession` (a RecordError) when the record holds no such
    session, or several start with the prefix, RecordError when the record cannot
    be read, and RecordRefused (with its ``code``) when it fails
    :func:`~host_kernel.store.verified.open_verified`: a broken chain
    (``chain_broken``), projection tables that disagree with the events
    (``projection_drift``), an empty or truncated ledger.
    """
    with collector_paused():
        trusted = open_verified(record_folder(record_dir))
        try:
            return _notebook(trusted, session)
        finally:
            trusted.close()


def _notebook(ledger: SQLiteLedger, session: str | None) -> Any:
    row = _session_row(ledger, session)
    sid = row["session"]
    silent = _silent_cells(ledger, sid)
    receipts = _by_cell(ledger, "SELECT cell_id, receipt_id, command, exit_status FROM receipts "
                                "WHERE session = ? ORDER BY seq", sid)
    artifacts = _by_cell(ledger, "SELECT cell_id, artifact_id, filename, sha256, lineage "
                                 "FROM artifacts WHERE session = ? ORDER BY seq", sid)
    notices = _notices(ledger, sid)
    nb = _new_notebook()
    ran = []
    for cell in ledger.query("SELECT * FROM cells WHERE session = ? ORDER BY seq_started",
                             (sid,)):
        if cell["cell_id"] in silent:
            continue  # a frontend's silent request (a variable viewer, say) is no notebook cell
        ran.append(_cell(cell, receipts.get(cell["cell_id"], []),
                         artifacts.get(cell["cell_id"], []), notices.get(cell["cell_id"])))
    started = _started(ledger, sid)
    notebook = started.get("notebook") if isinstance(started.get("notebook"), dict) else None
    source = None if notebook is None else _source_notebook(notebook, row["workdir"])
    if isinstance(source, str):  # why the notebook's markdown is not here: said in the export
        named = (notebook or {}).get("path")
        nb.cells.append(_from_dict({"cell_type": "markdown", "id": "host-kernel-note",
                                    "metadata": {"host_kernel": {"note": "markdown_missing"}},
                                    "source": f"_host-kernel export: the markdown cells of "
                                              f"{named} are not shown: {source}._"}))
        nb.cells.extend(ran)
    elif source is not None:
        nb.cells.extend(_interleave(ran, source))
    else:
        nb.cells.extend(ran)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["host_kernel"] = {
        "session": sid,
        "mode": row["mode"],
        "armed": bool(row["armed"]),
        "front": row["front"],
        "host_version": row["host_version"],
        "workdir": row["workdir"],
        "generations": [dict(g) for g in ledger.query(
            "SELECT generation, reason FROM generations WHERE session = ? ORDER BY generation",
            (sid,))],
        "submissions": _submissions(ledger, sid),
    }
    if notebook is not None:
        nb.metadata["host_kernel"]["notebook"] = {
            "path": notebook.get("path"), "sha256": notebook.get("sha256"),
            "markdown": "kept" if source is not None and not isinstance(source, str)
            else source}
    nbformat.validate(nb)
    return nb


def _started(ledger: SQLiteLedger, session: str) -> dict[str, Any]:
    rows = ledger.query("SELECT body FROM events WHERE session = ? AND kind = "
                        "'session_started' ORDER BY seq LIMIT 1", (session,))
    body = json.loads(rows[0]["body"]) if rows else {}
    return body if isinstance(body, dict) else {}


def _source_notebook(notebook: dict[str, Any], workdir: str | None) -> Any:
    """The notebook file ``session_started`` names, read, when it still has the sha256
    recorded; else the reason it cannot be used (a str)."""
    import hashlib

    given = notebook.get("path")
    if not isinstance(given, str) or not given:
        return "the record names no path for it"
    path = Path(given)
    if not path.is_absolute():
        if not workdir:
            return "the record names no workspace to find it in"
        path = Path(workdir) / path
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    digest = hashlib.sha256(data).hexdigest()
    if digest != notebook.get("sha256"):
        return (f"{path} has changed since the session ran it (sha256 {digest[:12]}…, the "
                f"record says {str(notebook.get('sha256'))[:12]}…)")
    import warnings

    from nbformat.warnings import DuplicateCellId, MissingIDFieldWarning

    try:
        with warnings.catch_warnings():
            for category in (MissingIDFieldWarning, DuplicateCellId):
                warnings.simplefilter("ignore", category)
            return cast(Callable[..., Any], nbformat.reads)(data.decode("utf-8"),
                                                              as_version=4)
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds; any is a reason
        return f"{path} cannot be read as a notebook ({type(exc).__name__})"


def _interleave(ran: list[Any], source: Any) -> list[Any]:
    """The executed cells ``ran`` with the markdown and raw cells of the notebook ``source``
    put back where they stood: the notebook's non-empty code cells are matched, in order,
    to the executed cells by their code (as ``host-kernel exec`` ran them). Markdown is
    placed only while the two agree: past the first code cell that did not run, or ran
    other code, the executed cells follow alone."""
    out: list[Any] = []
    taken = {c["id"] for c in ran}
    pending: list[Any] = []
    i = 0
    for cell in source.cells:
        kind = cell.get("cell_type")
        if kind in ("markdown", "raw"):
            pending.append(cell)
            continue
        if kind != "code" or not str(cell.get("source", "")).strip():
            continue
        if i >= len(ran) or ran[i]["source"] != str(cell.source):
            break
        out.extend(_text_cell(c, taken) for c in pending)
        pending = []
        out.append(ran[i])
        i += 1
    else:
        if i == len(ran):  # every code cell ran: the notebook's closing text too
            out.extend(_text_cell(c, taken) for c in pending)
    return out + ran[i:]


def _text_cell(cell: Any, taken: set[str]) -> Any:
    """A markdown or raw cell of the source notebook, with its own id unless a Host-minted
    id (or an earlier cell) has it."""
    from ._ids import is_cell_id, mint_cell_id

    cid = cell.get("id")
    if not is_cell_id(cid) or cid in taken:
        cid = mint_cell_id()
    taken.add(cid)
    meta = dict(cell.get("metadata") or {})
    meta["host_kernel"] = {"from_notebook": True}
    body = {"cell_type": cell["cell_type"], "id": cid, "metadata": meta,
            "source": str(cell.get("source", ""))}
    if cell["cell_type"] == "markdown" and cell.get("attachments"):
        body["attachments"] = cell["attachments"]
    return _from_dict(body)


def _session_row(ledger: SQLiteLedger, session: str | None) -> Any:
    if session is None:
        rows = ledger.query("SELECT s.* FROM sessions s JOIN events e ON e.session = s.session "
                            "AND e.kind = 'session_started' ORDER BY e.seq DESC LIMIT 1")
        if not rows:
            raise RecordError("the record holds no session")
        return rows[0]
    from .browse import UnknownId, session_id

    try:
        sid = session_id(ledger, session)
    except UnknownId as exc:
        if exc.candidates:
            raise UnknownSession(f"--session {exc.message}") from None
        raise UnknownSession(f"the record holds no session {session!r}") from None
    return ledger.query("SELECT * FROM sessions WHERE session = ?", (sid,))[0]


def _silent_cells(ledger: SQLiteLedger, session: str) -> set[str]:
    found: set[str] = set()
    for row in ledger.query("SELECT body FROM events WHERE session = ? AND kind = 'cell_started'",
                            (session,)):
        body = json.loads(row["body"])
        if body.get("silent"):
            found.add(body["cell_id"])
    return found


def _notices(ledger: SQLiteLedger, session: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for row in ledger.query("SELECT body FROM events WHERE session = ? AND kind = "
                            "'cell_finished'", (session,)):
        body = json.loads(row["body"])
        if body.get("notice"):
            found[body["cell_id"]] = body["notice"]
    return found


def _by_cell(ledger: SQLiteLedger, sql: str, session: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for row in ledger.query(sql, (session,)):
        item = {k: v for k, v in dict(row).items() if k != "cell_id"}
        if "lineage" in item:
            lineage = json.loads(item.pop("lineage") or "null") or {}
            item["lineage_inputs"] = [
                {k: v for k, v in inp.items() if k in ("key", "path", "sha256", "artifact_id",
                                                        "method")}
                for inp in lineage.get("inputs", [])]
        found.setdefault(row["cell_id"], []).append(item)
    return found


def _submissions(ledger: SQLiteLedger, session: str) -> list[dict[str, Any]]:
    out = []
    for row in ledger.query("SELECT body FROM submissions WHERE session = ? ORDER BY seq",
                            (session,)):
        body = json.loads(row["body"])
        verdict = body.get("verdict") or {}
        checks = verdict.get("checks") or []
        out.append({
            "submission_id": body.get("submission_id"),
            "cell_id": body.get("cell_id"),
            "accepted": bool(body.get("accepted")),
            "mode": verdict.get("mode"),
            "armed": verdict.get("armed"),
            "failed": [c.get("code") for c in checks if not c.get("ok") and not c.get("advisory")],
            "advice": [c.get("code") for c in checks if not c.get("ok") and c.get("advisory")],
        })
    return out


def _cell(row: Any, receipts: list[dict[str, Any]], artifacts: list[dict[str, Any]],
          notice: str | None) -> Any:
    outputs = [o for o in (_clean_output(x) for x in json.loads(row["outputs"] or "[]")) if o]
    ename = UNFINISHED.get(row["status"])
    if ename is not None:
        evalue = notice or f"the cell's run ended as {row['status']}"
        outputs.append({"output_type": "error", "ename": ename, "evalue": evalue,
                        "traceback": [f"{ename}: {evalue}"]})
    meta: dict[str, Any] = {
        "generation": row["generation"],
        "status": row["status"],
        "receipts": receipts,
        "artifacts": artifacts,
        "frontend_cell_id": row["frontend_cell_id"],
    }
    if notice:
        meta["notice"] = notice
    count = row["execution_count"]
    # A plain cell, not nbformat's new_code_cell: that validates every cell against the
    # schema on its own, and the whole notebook is validated once at the end anyway.
    return _from_dict({"cell_type": "code", "id": row["cell_id"], "source": row["code"],
                       "execution_count": count if isinstance(count, int) else None,
                       "metadata": {"host_kernel": meta}, "outputs": outputs})


def _clean_output(out: Any) -> dict[str, Any] | None:
    """The output as nbformat 4.5 allows it, or None for something that is no output."""
    if not isinstance(out, dict):
        return None
    kind = out.get("output_type")
    keys = _OUTPUT_KEYS.get(cast(str, kind))
    if keys is None:
        return None
    clean = {k: out[k] for k in keys if k in out}
    if kind == "stream":
        clean["name"] = str(clean.get("name") or "stdout")
        clean["text"] = _text(clean.get("text", ""))
    elif kind == "error":
        clean["ename"] = str(clean.get("ename", ""))
        clean["evalue"] = str(clean.get("evalue", ""))
        tb = clean.get("traceback")
        clean["traceback"] = [str(t) for t in tb] if isinstance(tb, list) else []
    else:
        clean["data"] = _mimebundle(clean.get("data"))
        meta = clean.get("metadata")
        clean["metadata"] = meta if isinstance(meta, dict) else {}
        if kind == "execute_result":
            count = clean.get("execution_count")
            clean["execution_count"] = count if isinstance(count, int) else None
    return clean


def _mimebundle(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        return {}
    bundle: dict[str, Any] = {}
    for mime, value in data.items():
        if not isinstance(mime, str) or "/" not in mime:
            continue
        if _JSON_MIME.match(mime):
            bundle[mime] = value
        else:
            bundle[mime] = _text(value)
    return bundle


def _text(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return json.dumps(value)
