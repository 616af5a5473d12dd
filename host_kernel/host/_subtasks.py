"""The Host's side of delegation and skills: what ``host.delegate``, ``host.collect`` and
``host.skills`` do, and what the record keeps of them.

Owns preparing a sub-task's folder (a sub-folder of the workspace, with the
named inputs copied in or found there, each hashed), the ``subtask_started``
and ``subtask_collected`` events, importing a collected child's artifacts
into this record's blob store (so they can be loaded here and audited), and
mapping the files the child read back onto this workspace's files, which
lineage then names upstream of the sub-task.

Running the child (its own Host, kernel, record and agent loop) is the
delegator's (:class:`host_kernel.agent.delegation.Delegator`); the child's
verdict is its own Host's, read from its verified record, never from the
child's kernel or this one.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from .._errors import BadArguments, CallRefused, FileProblem, RecordError, StorageError
from ..modes import UnknownModeError, normalise_mode_name

if TYPE_CHECKING:  # pragma: no cover
    from ._host import Host, _RunningCell

__all__ = ["collect", "collected_artifact", "skills_call", "start"]

#: The folder under the workspace where default sub-task folders are made.
SUBTASKS_DIR = ".subtasks"
#: Most inputs one sub-task may be given, and most bytes copied for it.
MAX_INPUTS = 200
MAX_COPY_BYTES = 512 * 1024 * 1024
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _mint_handle(host: Host) -> str:
    """A handle no sub-task of this record has (lineage and audit look handles up across
    the record's sessions)."""
    taken = {row["body"] for row in host.ledger.query(  # type: ignore[union-attr]
        "SELECT json_extract(body, '$.handle') AS body FROM events WHERE "
        "kind = 'subtask_started'")}
    while True:
        handle = "st-" + secrets.token_hex(4)
        if handle not in taken:
            return handle


def _number_or_none(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or value <= 0:
        raise BadArguments(f"{what} must be a positive number of seconds or None")
    return float(value)


def start(host: Host, cell: _RunningCell, args: dict[str, Any]) -> dict[str, Any]:
    """``host.delegate``: prepare the child's folder, record the start, launch it."""
    delegator = host.delegator
    if delegator is None:
        raise CallRefused("delegation needs an agent session: host.delegate works in cells "
                          "that `host-kernel run` (run_agent) runs", code="delegation_unavailable")
    task, inputs, mode, folder = (args.get("task"), args.get("inputs"), args.get("mode"),
                                  args.get("folder"))
    if not isinstance(task, str) or not task.strip():
        raise BadArguments("delegate: task must be a non-empty str")
    if len(task) > 50_000:
        raise BadArguments("delegate: task is longer than 50,000 characters")
    if inputs is None:
        inputs = []
    if not isinstance(inputs, list) or not all(isinstance(i, str) and i for i in inputs):
        raise BadArguments("delegate: inputs must be a list of workspace paths or artifact ids")
    if len(inputs) > MAX_INPUTS:
        raise BadArguments(f"delegate: at most {MAX_INPUTS} inputs")
    if mode is not None:
        try:
            mode = normalise_mode_name(mode)
        except (UnknownModeError, TypeError) as exc:
            raise BadArguments(f"delegate: {exc}") from None
    timeout = _number_or_none(args.get("timeout"), "delegate: timeout")
    refusal = delegator.refusal()
    if refusal is not None:
        raise CallRefused(refusal, code="delegation_refused")
    assert host.ledger is not None and host.blobs is not None
    handle = _mint_handle(host)
    if folder is None:
        rel_folder = f"{SUBTASKS_DIR}/{handle}"
    else:
        rel_folder = _own_folder(host, folder)
    copied: list[dict[str, Any]] = []
    written: list[tuple[str, str, int]] = []
    total = 0
    for item in dict.fromkeys(inputs):
        if _UUID.match(item) and _artifact(host, item) is not None:
            row = _artifact(host, item)
            assert row is not None
            try:
                data = host.blobs.read(row["sha256"])
            except StorageError as exc:
                raise FileProblem(f"delegate: artifact {item}'s stored bytes no longer match "
                                  f"its sha256 ({exc.message})", code=exc.code) from None
            child_rel = row["filename"]
            source: dict[str, Any] = {"artifact_id": item}
        else:
            rel, data = host.workspace.read_bytes(item)
            if folder is not None:
                inside = PurePosixPath(rel)
                if not inside.is_relative_to(rel_folder):
                    raise BadArguments(f"delegate: input {item} is not inside the folder "
                                       f"{rel_folder} the sub-task is given")
                copied.append({"from": rel, "path": str(inside.relative_to(rel_folder)),
                               "sha256": _sha(data), "copied": False})
                continue
            child_rel = rel
            source = {"from": rel}
        total += len(data)
        if total > MAX_COPY_BYTES:
            raise BadArguments(f"delegate: the inputs to copy pass {MAX_COPY_BYTES >> 20} MiB; "
                               f"give the sub-task a folder that already holds them")
        target = f"{rel_folder}/{child_rel}"
        done = host.workspace.write_bytes(target, data)
        written.append((done.path, done.sha256, done.size))
        copied.append({**source, "path": child_rel, "sha256": done.sha256, "copied": True})
    if folder is None and not written:
        host.workspace.resolve(rel_folder).mkdir(parents=True, exist_ok=True)
    for path, sha, size in written:
        cell.io.writes.append(path)
        host._append("file_written", {"cell_id": cell.cell_id, "path": path, "sha256": sha,
                                      "size": size, "op": "delegate"})
    record_dir = host.record_dir / "subtasks" / handle
    body = {"handle": handle, "cell_id": cell.cell_id, "task": task, "mode": mode,
            "folder": rel_folder, "inputs": copied, "record_dir": str(record_dir),
            "depth": delegator.config.depth + 1, "timeout": timeout}
    host._append("subtask_started", body)
    # The child reads and writes its folder only: the rest of this workspace is hidden
    # from its kernel, so what it reads is what its own record (and lineage) can see.
    state = delegator.launch(handle, task, workdir=host.workdir / rel_folder,
                             record_dir=record_dir, mode=mode, timeout=timeout,
                             hide=host.workdir)
    return {"handle": handle, "folder": rel_folder, "inputs": copied, "state": state}


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _own_folder(host: Host, folder: Any) -> str:
    if not isinstance(folder, str) or not folder.strip():
        raise BadArguments("delegate: folder must be a workspace-relative folder name")
    real = host.workspace.resolve(folder, what="folder")
    if real == host.workdir or not real.is_dir():
        raise BadArguments(f"delegate: folder {folder} must be an existing sub-folder of the "
                           f"workspace (not the workspace itself)")
    if host.workspace.in_record(real):
        raise BadArguments("delegate: folder may not be inside the record")
    return host.workspace.relative(real)


def _artifact(host: Host, artifact_id: str) -> Any:
    assert host.ledger is not None
    rows = host.ledger.query("SELECT * FROM artifacts WHERE artifact_id = ? AND session = ?",
                             (artifact_id, host.session_id))
    return rows[0] if rows else None


def _started(host: Host, handle: str) -> dict[str, Any]:
    assert host.ledger is not None
    rows = host.ledger.query("SELECT body FROM events WHERE session = ? AND kind = "
                             "'subtask_started' AND json_extract(body, '$.handle') = ?",
                             (host.session_id, handle))
    if not rows:
        raise BadArguments(f"collect: no sub-task {handle!r} in this session")
    return dict(json.loads(rows[0]["body"]))


def collect(host: Host, cell: _RunningCell, args: dict[str, Any]) -> dict[str, Any]:
    """``host.collect``: wait for the child, read its verified record, record the result."""
    delegator = host.delegator
    handle = args.get("handle")
    if not isinstance(handle, str):
        raise BadArguments("collect: give the Subtask (or its handle) that delegate returned")
    timeout = args.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(
            timeout, (int, float)) or not math.isfinite(timeout) or timeout < 0):
        raise BadArguments("collect: timeout must be a number of seconds (0 or more) or None")
    started = _started(host, handle)
    if delegator is None or not delegator.knows(handle):
        raise CallRefused(f"collect: sub-task {handle} was started by an earlier Host process; "
                          f"its record is {started['record_dir']}", code="subtask_gone")
    finished = delegator.wait(handle, timeout, alive=lambda: host._running is cell)
    if finished is None:
        raise CallRefused("collect: the cell stopped while it waited", code="cell_ended")
    result = _result_of(host, started, finished)
    body = {"cell_id": cell.cell_id, **result}
    host._append("subtask_collected", body)
    cell.io.collects.append(handle)
    return {k: v for k, v in result.items() if k not in ("read_inputs", "record_dir", "spend")}


def _result_of(host: Host, started: dict[str, Any], finished: Any) -> dict[str, Any]:
    """The child's result from its verified record: verdict, output, artifacts, reads."""
    from ..store.verified import open_verified

    handle = started["handle"]
    result: dict[str, Any] = {
        "handle": handle, "outcome": finished.outcome, "accepted": False, "output": None,
        "artifacts": [], "error": finished.error, "session": finished.session,
        "record_dir": started["record_dir"], "read_inputs": [], "spend": finished.spend}
    session = finished.session
    if session is None:
        return result
    try:
        ledger = open_verified(Path(started["record_dir"]))
    except (RecordError, OSError) as exc:
        result["error"] = f"the sub-task's record cannot be read: {exc}"
        return result
    try:
        verdicts = ledger.query("SELECT body FROM events WHERE session = ? AND kind = "
                                "'submission_verdict' ORDER BY seq", (session,))
        for row in verdicts:
            body = json.loads(row["body"])
            if body.get("accepted"):
                result["accepted"] = True
                result["output"] = (body.get("submission") or {}).get("output")
                result["submission_id"] = body.get("submission_id")
        artifacts = ledger.query("SELECT artifact_id, filename, sha256, size, media_type, "
                                 "lineage FROM artifacts WHERE session = ? ORDER BY seq",
                                 (session,))
        child_blobs = _child_blobs(Path(started["record_dir"]))
        reads: dict[tuple[str, str], str | None] = {}
        for row in artifacts:
            _import_blob(host, child_blobs, row["sha256"])
            result["artifacts"].append({
                "artifact_id": row["artifact_id"], "filename": row["filename"],
                "sha256": row["sha256"], "size": row["size"], "media_type": row["media_type"]})
            lineage = json.loads(row["lineage"]) if row["lineage"] else {}
            for item in lineage.get("inputs", ()):
                if item.get("path") and item.get("sha256"):
                    reads.setdefault((item["path"], item["sha256"]), item.get("hashed_at"))
        result["read_inputs"] = _map_reads(started, reads)
    except (RecordError, StorageError) as exc:
        result["error"] = f"the sub-task's record could not be read whole: {exc}"
    finally:
        ledger.close()
    return result


def _child_blobs(record_dir: Path) -> Any:
    from ..store.blobs import FileBlobStore

    return FileBlobStore(record_dir)


def _import_blob(host: Host, child_blobs: Any, sha256: str) -> None:
    """Copy a child artifact's bytes into this record, checked against their sha256."""
    assert host.blobs is not None
    if host.blobs.exists(sha256):
        return
    with child_blobs.open(sha256) as src:
        ref = host.blobs.put_stream(src)
    if ref.sha256 != sha256:
        raise StorageError(f"the sub-task's blob {sha256[:12]}… hashes to {ref.sha256[:12]}…",
                           code="blob_mismatch")


def _map_reads(started: dict[str, Any], reads: dict[tuple[str, str], str | None]
               ) -> list[dict[str, Any]]:
    """The files the child's artifacts were built from, as files of this workspace: a
    delegated input read with the bytes it was given is the original it came from; any
    other file (made by the child, or changed after it was given) is named where it lies,
    with the bytes the child read."""
    by_path = {i["path"]: i for i in started.get("inputs", ())}
    out = []
    for (path, sha), hashed_at in reads.items():
        given = by_path.get(path)
        if given is not None and given.get("sha256") == sha:
            if given.get("artifact_id"):
                out.append({"artifact_id": given["artifact_id"], "sha256": sha})
            else:
                out.append({"path": given["from"], "sha256": sha, "delegated": True,
                            "hashed_at": "delegate"})
        else:
            out.append({"path": f"{started['folder']}/{path}", "sha256": sha,
                        "delegated": False, "hashed_at": f"subtask {hashed_at or 'save'}"})
    return out


def collected_artifact(host: Host, artifact_id: str) -> dict[str, Any] | None:
    """A child artifact collected in this session (its bytes are in this record), or None."""
    assert host.ledger is not None
    for row in host.ledger.query("SELECT body FROM events WHERE session = ? AND kind = "
                                 "'subtask_collected' ORDER BY seq DESC", (host.session_id,)):
        body = json.loads(row["body"])
        for artifact in body.get("artifacts", ()):
            if artifact.get("artifact_id") == artifact_id:
                return {**artifact, "handle": body["handle"]}
    return None


def skills_call(host: Host, args: dict[str, Any]) -> Any:
    """``host.skills.list/search/get``: the Host reads the catalog it holds (the agent's,
    loaded at session start), so a cell sees the same skills as the agent's tools."""
    from ..skills import Catalog, SkillError

    catalog = host.skills
    if catalog is None:
        catalog = host.skills = Catalog.default(host.workdir)
    op = args.get("op")
    try:
        if op == "list":
            offset = args.get("offset", 0)
            return catalog.list(args.get("collection"), offset).to_dict()
        if op == "search":
            query = args.get("query")
            if not isinstance(query, (str, list)):
                raise BadArguments("skills.search: query must be a str or a list of str")
            return [hit.to_dict() for hit in catalog.search(query)]
        if op == "get":
            name = args.get("name")
            if not isinstance(name, str):
                raise BadArguments("skills.get: name must be a str")
            return catalog.get(name).to_dict(body=True)
    except SkillError as exc:
        raise BadArguments(f"skills.{op}: {exc}") from None
    raise BadArguments("skills: op must be list, search or get")
