"""The Host's side of delegation and skills: what ``host.delegate``, ``host.collect`` and
``host.skills`` do, and what the record keeps of them.

Owns preparing a sub-task's folder (in this record, out of every kernel's
reach, with the named inputs copied in and hashed), the ``subtask_started``
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
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import (
    BadArguments,
    CallRefused,
    FileProblem,
    PathRefused,
    RecordError,
    StorageError,
)
from ..modes import UnknownModeError, normalise_mode_name

if TYPE_CHECKING:  # pragma: no cover
    from ._calls import CallContext
    from ._cells import RunningCell

__all__ = ["collect", "collected_artifact", "skills_call", "start"]

#: Most inputs one sub-task may be given, and most bytes and files copied for it.
MAX_INPUTS = 200
MAX_COPY_BYTES = 512 * 1024 * 1024
MAX_COPY_FILES = 10_000
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _mint_handle(host: CallContext) -> str:
    """A handle no sub-task of this record has (lineage and audit look handles up across
    the record's sessions)."""
    taken = {json.loads(row["body"]).get("handle") for row in host.ledger.query(
        "SELECT body FROM events WHERE kind = 'subtask_started'")}
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


def start(host: CallContext, cell: RunningCell, args: dict[str, Any]) -> dict[str, Any]:
    """``host.delegate``: copy the inputs into the child's folder, record the start, launch.

    The child's folder is ``<record>/subtasks/<handle>/workspace``: inside this record,
    which this session's kernel can neither read nor write, so no cell can swap it for
    a link elsewhere, change the inputs under the child, or read what the child makes.
    The inputs are copied in by the Host (streamed, hashed as copied), each named by
    its workspace path (a file or a folder) or by an artifact id of this session (or
    one a collected sub-task made).
    """
    delegator = host.delegator
    if delegator is None:
        raise CallRefused("delegation needs an agent session: host.delegate works in cells "
                          "that `host-kernel run` (run_agent) runs", code="delegation_unavailable")
    task, inputs, mode = args.get("task"), args.get("inputs"), args.get("mode")
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
    if args.get("folder") is not None:
        raise BadArguments("delegate: folder= is not supported: a sub-task works on copies of "
                           "its inputs, in a folder no cell can reach; name a folder in inputs "
                           "to give it the whole folder")
    plan = [_source(host, item) for item in dict.fromkeys(inputs)]  # checked before copying
    refusal = delegator.reserve()
    if refusal is not None:
        raise CallRefused(refusal, code="delegation_refused")
    handle = _mint_handle(host)
    base = host.record_dir / "subtasks" / handle
    workdir = base / "workspace"
    workdir.mkdir(parents=True)
    try:
        copied = _copy_inputs(host, plan, workdir)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        delegator.release()  # nothing was started: the place is given back
        raise
    record_dir = base / "record"
    body = {"handle": handle, "cell_id": cell.cell_id, "task": task, "mode": mode,
            "folder": str(workdir), "inputs": copied, "record_dir": str(record_dir),
            "depth": delegator.config.depth + 1, "timeout": timeout}
    host.append("subtask_started", body)
    # The child can read and write its own folder only: this workspace and this record
    # (but for its folder) are hidden from its kernel, so what it reads is what its own
    # record, and so this session's lineage, can see.
    state = delegator.launch(handle, task, workdir=workdir, record_dir=record_dir, mode=mode,
                             timeout=timeout,
                             hide=(*host.hide_paths, host.workdir, host.record_dir),
                             parent={"session": host.session_id, "cell_id": cell.cell_id,
                                     "handle": handle, "record_dir": str(host.record_dir)})
    return {"handle": handle, "folder": str(workdir), "inputs": copied, "state": state}


def _source(host: CallContext, item: str) -> tuple[str, Any]:
    """What one input names: ("artifact", row), ("file", rel) or ("folder", rel)."""
    if _UUID.match(item):
        row = _artifact(host, item) or collected_artifact(host, item)
        if row is not None:
            return "artifact", row
    real = host.workspace.resolve(item, what="delegate: input")
    if host.workspace.in_record(real):
        raise PathRefused(f"delegate: input {item!r} is inside the record")
    if real == host.workdir:
        raise BadArguments("delegate: the whole workspace cannot be an input; name its files "
                           "or sub-folders")
    if real.is_dir():
        return "folder", host.workspace.relative(real)
    if not real.exists():
        raise FileProblem(f"delegate: input {item!r} is neither a workspace file nor an "
                          f"artifact id of this session")
    return "file", host.workspace.relative(real)


def _copy_inputs(host: CallContext, plan: list[tuple[str, Any]], workdir: Path
                 ) -> list[dict[str, Any]]:
    """Copy each planned input into ``workdir``, streamed and hashed; their records."""
    budget = [MAX_COPY_BYTES, MAX_COPY_FILES]
    copied: list[dict[str, Any]] = []
    for kind, what in plan:
        if kind == "artifact":
            with host.blobs.open(what["sha256"]) as src:
                sha, size = _copy(src, workdir / what["filename"], budget)
            if sha != what["sha256"]:
                raise FileProblem(f"delegate: artifact {what['artifact_id']}'s stored bytes no "
                                  f"longer match its sha256", code="blob_mismatch")
            copied.append({"artifact_id": what["artifact_id"], "path": what["filename"],
                           "sha256": sha, "size": size})
            continue
        files = [what] if kind == "file" else _files_under(host, what)
        for rel in files:
            rel, src = host.workspace.open_file(rel, what="delegate: input")
            with src:
                sha, size = _copy(src, workdir / rel, budget)
            copied.append({"from": rel, "path": rel, "sha256": sha, "size": size})
    return copied


def _files_under(host: CallContext, rel: str) -> list[str]:
    """The regular files of a workspace folder, recursively; symlinks are not followed."""
    out: list[str] = []
    for folder, dirs, files in os.walk(host.workdir / rel, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(folder, d)))
        for name in sorted(files):
            path = os.path.join(folder, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            out.append(Path(path).relative_to(host.workdir).as_posix())
            if len(out) > MAX_COPY_FILES:
                raise BadArguments(f"delegate: the folder {rel} holds more than "
                                   f"{MAX_COPY_FILES} files")
    return out


def _copy(src: Any, target: Path, budget: list[int]) -> tuple[str, int]:
    """Stream ``src`` into ``target`` (made here, never overwritten), hashing as it goes;
    ``budget`` is [bytes, files] left for the whole delegation."""
    import hashlib

    budget[1] -= 1
    if budget[1] < 0:
        raise BadArguments(f"delegate: more than {MAX_COPY_FILES} files to copy")
    digest = hashlib.sha256()
    size = 0
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        out = open(target, "xb")  # noqa: SIM115 - closed below
    except (FileExistsError, NotADirectoryError):
        raise BadArguments(f"delegate: two inputs would be copied to the same path "
                           f"({target.name!r} or a folder above it)") from None
    with out:
        while chunk := src.read(1 << 20):
            size += len(chunk)
            if size > budget[0]:
                raise BadArguments(f"delegate: the inputs pass {MAX_COPY_BYTES >> 20} MiB; a "
                                   f"sub-task is given copies, so give it less")
            digest.update(chunk)
            out.write(chunk)
    budget[0] -= size
    return digest.hexdigest(), size


def _artifact(host: CallContext, artifact_id: str) -> Any:
    rows = host.own_rows("SELECT * FROM artifacts WHERE artifact_id = ? AND session = ?",
                         (artifact_id, host.session_id))
    return rows[0] if rows else None


def _started(host: CallContext, handle: str) -> dict[str, Any]:
    for row in host.own_rows("SELECT body FROM events WHERE session = ? AND kind = "
                             "'subtask_started' ORDER BY seq", (host.session_id,)):
        body = json.loads(row["body"])
        if body.get("handle") == handle:
            return dict(body)
    raise BadArguments(f"collect: no sub-task {handle!r} in this session")


def collect(host: CallContext, cell: RunningCell, args: dict[str, Any]) -> dict[str, Any]:
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
    finished = delegator.wait(handle, timeout, alive=lambda: host.running is cell)
    if finished is None:
        raise CallRefused("collect: the cell stopped while it waited", code="cell_ended")
    result = _result_of(host, started, finished)
    body = {"cell_id": cell.cell_id, **result}
    host.append("subtask_collected", body)
    cell.io.collects.append(handle)
    return {k: v for k, v in result.items() if k not in ("read_inputs", "record_dir", "spend")}


def _result_of(host: CallContext, started: dict[str, Any], finished: Any) -> dict[str, Any]:
    """The child's result from its verified record: verdict, output, artifacts, reads."""
    from ..store.verified import open_verified

    handle = started["handle"]
    result: dict[str, Any] = {
        "handle": handle, "outcome": finished.outcome, "accepted": False, "output": None,
        "artifacts": [], "error": finished.error, "session": finished.session,
        "record_dir": started["record_dir"], "read_inputs": [], "spend": finished.spend}
    session = finished.session
    if not finished.done.is_set():
        result["error"] = (f"{finished.error or 'the sub-task was cut'}; it is still closing, "
                           f"so its record ({started['record_dir']}) was not read")
        return result
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
            # Direct inputs, and the inputs of the child-made files among them (their
            # derivations): what the child's artifacts were made from, all the way up.
            upstream = [*lineage.get("inputs", ()), *(
                i for d in lineage.get("derivations", ()) for i in d.get("inputs", ()))]
            for item in upstream:
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


def _import_blob(host: CallContext, child_blobs: Any, sha256: str) -> None:
    """Copy a child artifact's bytes into this record, checked against their sha256."""
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
        else:  # a file the child made, or a given file it changed before reading it
            out.append({"path": f"<sub-task {started['handle']}>/{path}", "sha256": sha,
                        "delegated": False, "hashed_at": f"subtask {hashed_at or 'save'}"})
    return out


def collected_artifact(host: CallContext, artifact_id: str) -> dict[str, Any] | None:
    """A child artifact collected in this session (its bytes are in this record), or None."""
    for row in host.own_rows("SELECT body FROM events WHERE session = ? AND kind = "
                             "'subtask_collected' ORDER BY seq DESC", (host.session_id,)):
        body = json.loads(row["body"])
        for artifact in body.get("artifacts", ()):
            if artifact.get("artifact_id") == artifact_id:
                return {**artifact, "handle": body["handle"]}
    return None


def skills_call(host: CallContext, args: dict[str, Any]) -> Any:
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
