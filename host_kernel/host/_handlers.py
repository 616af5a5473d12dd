"""The host calls that do the session's work: files, commands, artifacts, lineage, submit.

Owns one small handler per call, each given the call's :class:`CallContext`
(never the Host), the cell it is attributed to, its arguments as the kernel
sent them (checked here: a wrong type is a BadArguments with a sentence, never
a traceback from inside the Host), and the cell's output stream; and
:data:`HANDLERS`, the table the dispatcher serves from. A ``write_file`` whose
bytes came as a raw body (host/_server.py, :class:`RawBody`) is streamed from
the connection to disk, hashed as it goes, never held whole. It does not check
who may call (host/_calls.py).
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import subprocess
import threading
from pathlib import PurePosixPath
from typing import Any

from .._errors import BadArguments, FileProblem, StorageError
from .._ids import mint_uuid
from ..lineage.taint import OBSERVED, TRACED
from ..sandbox.client import SandboxError
from . import _subtasks
from ._bash import CommandContext, run_command
from ._calls import CallContext, Handler
from ._cells import RunningCell
from ._generations import KERNEL_SET_ENV
from ._lineage import confirm_with_llm
from ._server import Emit, RawBody

__all__ = ["HANDLERS"]


# -- who am I


def ping(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    return {"pong": True, "cell_id": cell.cell_id, "generation": cell.generation}


def whoami(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    confinement = ctx.generations.confinement
    return {"cell_id": cell.cell_id, "generation": cell.generation,
            "session": ctx.record.session_id, "workspace": str(ctx.workdir),
            "mode": {"name": ctx.session.mode.name, "armed": ctx.session.mode.armed,
                     "signals": list(ctx.session.mode.signals)},
            "confinement": None if confinement is None else {
                "status": confinement.status, "abi": confinement.abi,
                "network": confinement.network, "pid_namespace": confinement.pid_namespace}}


def cell_access(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    # What the kernel's audit hook saw this cell open. The kernel reports it, so
    # it is lineage evidence, never acceptance evidence (docs/trust.md).
    ctx.cells.pending_access[cell.cell_id] = args.get("access")
    return {"ok": True}


# -- verification


def submit_output(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    # Each handler below imports what only it needs when it is called: the table is built
    # at the Host's start, the verifier and the lineage graph and slice are not needed then.
    from ..verify import Submission

    return ctx.submit(Submission.from_dict(args), submitting_cell=cell.cell_id,
                       emit=emit).to_dict()


# -- files


def _content(args: dict[str, Any], key: str) -> bytes:
    if key + "_b64" in args:
        raw = args[key + "_b64"]
        if not isinstance(raw, str):
            raise BadArguments(f"{key} must be str or bytes")
        try:
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise BadArguments(f"{key}_b64 is not valid base64") from None
    value = args.get(key)
    if not isinstance(value, str):
        raise BadArguments(f"{key} must be str (UTF-8 text) or bytes, not "
                           f"{type(value).__name__}")
    return value.encode("utf-8", "surrogateescape")


def _record_write(ctx: CallContext, cell: RunningCell, written: Any, op: str) -> dict[str, Any]:
    cell.io.writes.append(written.path)
    ctx.record.append("file_written", {"cell_id": cell.cell_id, "path": written.path,
                                  "sha256": written.sha256, "size": written.size, "op": op})
    return {"path": written.path, "sha256": written.sha256, "size": written.size}


def write_file(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    body = args.get("content")
    if isinstance(body, RawBody):  # the file's bytes still on the wire: stream them to disk
        written = ctx.workspace.write_stream(args.get("path"), body.chunks())
    else:
        written = ctx.workspace.write_bytes(args.get("path"), _content(args, "content"))
    return _record_write(ctx, cell, written, "write")


def edit_file(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    old, new = args.get("old"), args.get("new")
    if not isinstance(old, str) or not isinstance(new, str):
        raise BadArguments("edit_file(path, old, new): old and new must both be str")
    if not old:
        raise BadArguments("edit_file: old must be non-empty text that appears exactly once")
    path = args.get("path")
    rel, data = ctx.workspace.read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileProblem(f"{rel} is not UTF-8 text; edit_file works on text files") from None
    count = text.count(old)
    if count != 1:
        where = "does not appear" if count == 0 else f"appears {count} times"
        raise FileProblem(f"edit_file: the text to replace {where} in {rel}; it must appear "
                          f"exactly once (nothing was changed)")
    written = ctx.workspace.write_bytes(path, text.replace(old, new, 1).encode("utf-8"))
    return _record_write(ctx, cell, written, "edit")


def read_file(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    rel, data = ctx.workspace.read_bytes(args.get("path"))
    cell.io.reads.append(rel)
    if args.get("binary"):
        return {"path": rel, "content_b64": base64.b64encode(data).decode("ascii")}
    try:
        return {"path": rel, "content": data.decode("utf-8")}
    except UnicodeDecodeError:
        raise FileProblem(f"{rel} is not UTF-8 text; use host.read_file(path, binary=True)"
                          ) from None


# -- commands


def bash(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    command, timeout, env = args.get("command"), args.get("timeout"), args.get("env")
    if not isinstance(command, str) or not command.strip():
        raise BadArguments("bash(command): command must be a non-empty str")
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise BadArguments("bash: timeout must be a positive number of seconds or None")
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise BadArguments("bash: env must map str to str")
    cwd = ctx.workspace.cwd_for(args.get("cwd"))
    recorded = threading.Event()

    def started(proc: subprocess.Popen[bytes]) -> None:
        ctx.cells.command_started(cell.cell_id, proc, recorded)

    kernel = ctx.generations.kernel
    spawner = None if kernel is None else kernel.sandbox
    command_ctx = CommandContext(cell.cell_id, cell.generation, ctx.workspace, ctx.record.blobs,
                                 ctx.generations.env_of(cell.generation, cell.token),
                                 ctx.redactor, KERNEL_SET_ENV, ctx.hash_cache, started, spawner,
                                 ctx.generations.trace, ctx.executables,
                                 None if spawner is None or ctx.generations.policy is None
                                 else ctx.generations.policy.may_read)
    try:
        body = ctx.redactor.deep(run_command(command, cwd, dict(env), timeout, command_ctx,
                                             emit))
        ctx.record.append("receipt_recorded", body)
        # Before lineage hashes the command's reads: the copy leaves their hashes cached.
        ctx.cells.keeper.command_finished(cell.cell_id, body)
        try:
            ctx.lineage.receipt(cell.cell_id, body)
        except Exception:  # noqa: BLE001 - lineage never blocks a receipt
            pass
    finally:
        recorded.set()
    return body


# -- artifacts


def save_artifact(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    path, filename = args.get("path"), args.get("filename")
    if filename is not None and (not isinstance(filename, str) or not filename.strip()
                                 or "/" in filename or "\x00" in filename):
        raise BadArguments("save_artifact: filename must be a plain file name (no '/')")
    # Opened once, beneath the root without following symlinks, checked to be a
    # regular file; the bytes stored and hashed are those of that open file.
    rel, src = ctx.workspace.open_file(path)
    with src:
        ref = ctx.record.blobs.put_stream(src)
    name = filename or PurePosixPath(rel).name
    media = mimetypes.guess_type(name)[0] or "application/octet-stream"
    artifact_id = mint_uuid()
    body = {"artifact_id": artifact_id, "filename": name, "sha256": ref.sha256,
            "size": ref.size, "media_type": media, "cell_id": cell.cell_id,
            "generation": cell.generation, "source_path": rel,
            "lineage": _lineage_for(ctx, cell, rel, _access_so_far(ctx, cell, args))}
    ctx.record.append("artifact_saved", body)
    ctx.lineage.artifact_saved(artifact_id, ref.sha256, ref.size)
    from .._models import Artifact

    return Artifact.from_dict(body).to_dict()


def _access_so_far(ctx: CallContext, cell: RunningCell, args: dict[str, Any]) -> tuple[Any, str]:
    """The running cell's accesses up to now, and how they were found: traced by the
    Host when it can, otherwise as the kernel's audit hook reports them."""
    trace = ctx.generations.trace
    if trace is not None:
        try:
            seen = trace.for_cell(cell.start_ns, None, consume=False,
                                  since_ctime_ns=cell.start_ctime_ns)
            return seen.access(), TRACED
        except SandboxError:
            pass
    return args.get("access"), OBSERVED


def _lineage_for(ctx: CallContext, cell: RunningCell, rel: str, access: tuple[Any, str]
                 ) -> dict[str, Any]:
    try:
        lineage = ctx.lineage.inputs_at_save(cell.cell_id, cell.code, rel, access[0],
                                              cell.io, method=access[1])
    except Exception as exc:  # noqa: BLE001 - an artifact is saved even if lineage fails
        return {"inputs": [], "truncated": False, "error": f"{type(exc).__name__}: {exc}"}
    if ctx.options.llm is not None and lineage["inputs"]:
        lineage = confirm_with_llm(ctx.options.llm, cell.code, lineage)
    return lineage


def lineage_call(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    artifact_id = args.get("artifact_id")
    if not isinstance(artifact_id, str):
        raise BadArguments("lineage(artifact_id): artifact_id must be a str (the UUID)")
    from ..lineage.graph import build_lineage

    return build_lineage(ctx.record.ledger, artifact_id, session=ctx.record.session_id).to_dict()


def _artifact_row(ctx: CallContext, artifact_id: object) -> Any:
    if not isinstance(artifact_id, str):
        raise BadArguments("artifact_id must be a str (the artifact's UUID)")
    rows = ctx.record.own_rows("SELECT * FROM artifacts WHERE artifact_id = ? AND session = ?",
                         (artifact_id, ctx.record.session_id))
    if not rows:
        raise FileProblem(f"no artifact {artifact_id!r} in this session; host.artifacts() "
                          f"lists them")
    return rows[0]


def load_artifact(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    artifact_id = args.get("artifact_id")
    try:
        row = _artifact_row(ctx, artifact_id)
    except FileProblem:  # not this session's own: one a collected sub-task made?
        row = _subtasks.collected_artifact(ctx, str(artifact_id))
        if row is None:
            raise
    target = args.get("path") or row["filename"]
    try:
        data = ctx.record.blobs.read(row["sha256"])  # read once, and only if it hashes right
    except StorageError as exc:
        raise FileProblem(f"artifact {row['artifact_id']}'s stored bytes no longer match "
                          f"its sha256; the store was altered ({exc.message})",
                          code=exc.code) from None
    written = ctx.workspace.write_bytes(target, data)
    cell.io.loads.append((row["artifact_id"], written.path, row["sha256"]))
    ctx.record.append("artifact_loaded", {"cell_id": cell.cell_id,
                                     "artifact_id": row["artifact_id"], "path": written.path})
    ctx.record.append("file_written", {"cell_id": cell.cell_id, "path": written.path,
                                  "sha256": written.sha256, "size": written.size,
                                  "op": "load_artifact"})
    return {"path": written.path, "sha256": written.sha256, "size": written.size}


def artifacts(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    rows = ctx.record.own_rows("SELECT * FROM artifacts WHERE session = ? ORDER BY seq",
                         (ctx.record.session_id,))
    from .._models import Artifact

    return [Artifact(r["artifact_id"], r["filename"], r["sha256"], r["size"],
                     r["media_type"], r["cell_id"], r["generation"],
                     r["source_path"]).to_dict() for r in rows]


def slice_call(ctx: CallContext, cell: RunningCell, args: dict[str, Any], emit: Emit) -> Any:
    artifact_id = args.get("artifact_id")
    if not isinstance(artifact_id, str):
        raise BadArguments("slice(artifact_id): artifact_id must be a str (the UUID)")
    if not ctx.record.own_rows("SELECT 1 FROM artifacts WHERE artifact_id = ? AND session = ?",
                               (artifact_id, ctx.record.session_id)):
        raise BadArguments(f"slice: no artifact {artifact_id!r} in this session")
    from ..lineage.slice import compute_slice

    trusted = ctx.record.trusted_projection()  # the events this Host wrote, checked
    try:
        return compute_slice(trusted, artifact_id).to_dict()
    finally:
        trusted.close()


#: Every host call the kernel may make, by name.
HANDLERS: dict[str, Handler] = {
    "ping": ping,
    "whoami": whoami,
    "write_file": write_file,
    "edit_file": edit_file,
    "read_file": read_file,
    "bash": bash,
    "save_artifact": save_artifact,
    "load_artifact": load_artifact,
    "artifacts": artifacts,
    "cell_access": cell_access,
    "submit_output": submit_output,
    "lineage": lineage_call,
    "slice": slice_call,
    "skills": lambda ctx, cell, args, emit: _subtasks.skills_call(ctx, args),
    "delegate": lambda ctx, cell, args, emit: _subtasks.start(ctx, cell, args),
    "collect": lambda ctx, cell, args, emit: _subtasks.collect(ctx, cell, args),
}
