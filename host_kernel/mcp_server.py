"""The MCP front: one Host served to an MCP client over stdio.

Owns the tool surface an MCP client sees and the stdio discipline. Every
tool that does work runs as a **cell** through ``Host.execute`` (a command is
``host.bash(...)`` in a cell, a submission is ``host.submit_output(...)`` in a
cell), so the record attributes each one to a Host-minted cell id exactly as
it would for a notebook; the answer is the cell's Observation text. Only
``list_record`` reads the record directly, because reading the record is not
work to attribute.

Stdio discipline: stdout carries protocol messages and nothing else. Before
the kernel starts, the server keeps a private duplicate of fd 1 for the
protocol and points fd 1 at stderr (and fd 0 at the null device), so the
kernel, ``host.bash`` commands and any C library that writes to fd 1 land on
stderr; the protocol reads and writes only the private duplicates.

A tool whose work failed answers with ``isError`` set and the Observation text as
its content, so an MCP client (and the model behind it) can tell failure from
success without parsing prose: a cell that ended other than ``ok`` (an error, a
timeout, a kernel death, an interruption), a ``host.*`` call the Host refused
(it raises in the cell, so the cell ends ``error``), and a submission the Host
refused. Whether a submission was accepted is the Host's own word
(:meth:`Host.verdicts_of` the cell), never what the cell printed. A command
that ran and exited non-zero is not an error of the tool: its receipt, with the
exit status, is the answer.

Built on the ``mcp`` package (the Model Context Protocol's Python SDK):
``MCPServer`` in mcp 2, ``FastMCP`` in mcp 1; both offer the same ``tool``
decorator and ``run("stdio")``. It does not own the Host, the verifier or the
kernel.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import import_module
from pathlib import Path
from types import FrameType
from typing import Any, Final, cast

from ._version import __version__
from .agent.worker import HostThread
from .host._host import Host
from .host._options import HostOptions

__all__ = ["TOOL_NAMES", "build_server", "serve"]

#: The tools the server offers, in the order it registers them.
TOOL_NAMES: Final[tuple[str, ...]] = (
    "execute_cell", "write_file", "read_file", "run_command", "save_artifact",
    "submit_output", "lineage", "list_record", "restart_kernel",
)

INSTRUCTIONS: Final[str] = (
    "A Jupyter kernel driven by a trusted Host that records every cell and verifies "
    "completions against its own record. Each tool runs as a cell with a Host-minted id. "
    "Paths are relative to the workspace. Run tests with run_command so they get a "
    "receipt; finish with submit_output, which the Host verifies (a refusal lists every "
    "failed check). In an armed mode each Observation begins with '[cell id: …]': cite "
    "that id as producing_cell_id in test_evidence.")

LINEAGE_FORMATS: Final[dict[str, str]] = {
    "text": "print(host.lineage({id!r}).to_text())",
    "mermaid": "print(host.lineage({id!r}).to_mermaid())",
    "dot": "print(host.lineage({id!r}).to_dot())",
    "json": "print(__import__('json').dumps(host.lineage({id!r}).to_dict(), indent=2))",
}


def _server_class() -> Any:
    try:
        return import_module("mcp.server.mcpserver").MCPServer
    except ImportError:  # mcp 1.x
        return import_module("mcp.server.fastmcp").FastMCP


def _call(name: str, *args: object, **kwargs: object) -> str:
    """Source text of ``host.<name>(...)`` with literal arguments (``None`` kwargs left out)."""
    parts = [repr(a) for a in args]
    parts += [f"{k}={v!r}" for k, v in kwargs.items() if v is not None]
    return f"host.{name}({', '.join(parts)})"


def _answer(text: str, failed: bool) -> str:
    """A tool's answer: ``text`` as is, or, when the work failed, a result marked
    ``isError`` with ``text`` as its content.

    The tools are declared to return ``str`` (the SDK builds their output schema from
    that, and refuses a union with its result type), and the SDK passes a returned
    ``CallToolResult`` through unchanged; hence the cast.
    """
    if not failed:
        return text
    from mcp.types import CallToolResult

    return cast(str, CallToolResult.model_validate(
        {"content": [{"type": "text", "text": text}], "isError": True}))


def _observed(obs: Any) -> str:
    """The Observation's text, marked as an error unless the cell ended ``ok``."""
    return _answer(str(obs.text), obs.status != "ok")


def _stdout_of(obs: Any) -> str:
    return "".join(o.get("text", "") for o in obs.outputs
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


def build_server(host: Host, worker: HostThread, *,
                 lifespan: Callable[[Any], Any] | None = None) -> Any:
    """An MCP server object whose tools drive ``host`` (already started) via ``worker``."""
    kwargs: dict[str, Any] = {"instructions": INSTRUCTIONS}
    if lifespan is not None:
        kwargs["lifespan"] = lifespan
    server = _server_class()("host-kernel", **kwargs)

    def run_cell(code: str, timeout: float | None = None) -> Any:
        return worker.call(lambda: host.execute(code, timeout=timeout))

    def accepted(cell_id: str) -> bool:
        """Whether the Host accepted a submission made in ``cell_id``, by its own word."""
        verdicts = worker.call(lambda: host.verdicts_of(cell_id))
        return bool(verdicts) and all(v.accepted for v in verdicts)

    def execute_cell(code: str, timeout: float | None = None) -> str:
        """Run Python code as one notebook cell; returns the Observation text (output,
        errors, notices such as a kernel restart), marked as an error when the cell did
        not end ok. Variables persist between cells while the kernel lives."""
        return _observed(run_cell(code, timeout))

    def write_file(path: str, content: str) -> str:
        """Write a text file in the workspace (the Host writes it atomically and records
        it), via host.write_file in a cell; an error when the Host refused it."""
        return _observed(run_cell(_call("write_file", path, content)))

    def read_file(path: str) -> str:
        """Read a text file of the workspace, via host.read_file in a cell; returns its
        whole content, or the cell's error marked as an error."""
        obs = run_cell(f"print({_call('read_file', path)}, end='')")
        return _stdout_of(obs) if obs.status == "ok" else _observed(obs)

    def run_command(command: str, timeout: float | None = None) -> str:
        """Run a shell command with host.bash in a cell: the Host runs `bash -c command`,
        keeps a receipt (exit status, output hashes) and streams the output; returns the
        Observation text, ending with the receipt. A command that exits non-zero is an
        answer, not an error; a call the Host refused (or a cell that failed) is."""
        return _observed(run_cell(_call("bash", command, timeout=timeout)))

    def save_artifact(path: str, filename: str | None = None) -> str:
        """Copy a workspace file into the artifact store (content-addressed, with lineage)
        via host.save_artifact in a cell; the Observation names the artifact id."""
        return _observed(
            run_cell(_call("save_artifact", path, filename=filename)))

    def submit_output(output: dict[str, Any], completion_bullets: list[str],
                      task_status: str | None = None,
                      output_schema: dict[str, Any] | None = None,
                      source_files: list[Any] | None = None,
                      entry_points: list[str] | None = None,
                      architecture_summary: str | None = None,
                      test_evidence: list[dict[str, Any]] | None = None,
                      intended_changes: list[dict[str, Any]] | None = None,
                      regenerates: list[dict[str, Any]] | None = None,
                      rederive: bool | None = None) -> str:
        """Submit the completion with host.submit_output in a cell; the Host verifies it
        against its record. Accepted: the verdict. Refused: every failed check, each with a
        stable code and what to fix. In an armed mode give source_files, entry_points,
        architecture_summary and test_evidence ([{command, producing_cell_id}]);
        intended_changes ([{test, reason}], codebase_change), regenerates ([{command,
        artifacts}], reusable_pipeline) and rederive (True: accepted only when each claimed
        artifact is re-derived from its slice) as the modes allow."""
        fields = {"output": output, "completion_bullets": completion_bullets,
                  "task_status": task_status, "output_schema": output_schema,
                  "source_files": source_files, "entry_points": entry_points,
                  "architecture_summary": architecture_summary, "test_evidence": test_evidence,
                  "intended_changes": intended_changes, "regenerates": regenerates,
                  "rederive": rederive}
        payload = json.dumps({k: v for k, v in fields.items() if v is not None})
        code = f"print(host.submit_output(**__import__('json').loads({payload!r})).explain())"
        obs = run_cell(code)
        # Accepted only if the Host says so; what the cell printed decides nothing.
        return _answer(str(obs.text),
                       obs.status != "ok" or not accepted(obs.cell_id))

    def lineage(artifact_id: str, format: str = "text") -> str:
        """An artifact's lineage (what flowed into it), via host.lineage in a cell.
        format: text, mermaid, dot or json."""
        template = LINEAGE_FORMATS.get(format)
        if template is None:
            return _answer(
                f"unknown format {format!r}; use one of {', '.join(LINEAGE_FORMATS)}", True)
        return _observed(run_cell(template.format(id=artifact_id)))

    def list_record(limit: int = 50) -> str:
        """This session's record so far, as JSON: the latest cells (id, generation, status,
        first code line), receipts, artifacts and submission verdicts."""
        return json.dumps(worker.call(lambda: record_summary(host, limit)), indent=2)

    def restart_kernel() -> str:
        """Restart the kernel: a new generation; everything in memory is gone, files,
        artifacts and the record stay."""
        generation = worker.call(lambda: host.restart("requested over MCP"))
        return (f"The kernel was restarted: generation {generation}. Variables and imports "
                f"from earlier generations are gone.")

    for tool in (execute_cell, write_file, read_file, run_command, save_artifact,
                 submit_output, lineage, list_record, restart_kernel):
        server.add_tool(tool)
    return server


def record_summary(host: Host, limit: int = 50) -> dict[str, Any]:
    """The latest ``limit`` cells, receipts, artifacts and submissions of the session."""
    ledger, session = host.ledger, host.session_id
    if ledger is None:
        return {"session": session, "error": "the Host has no record open"}
    limit = max(1, min(int(limit), 1000))

    def rows(sql: str, order: str = "seq") -> list[dict[str, Any]]:
        found = ledger.query(f"{sql} ORDER BY {order} DESC LIMIT ?", (session, limit))
        return [dict(r) for r in reversed(found)]

    cells = rows("SELECT cell_id, generation, status, code FROM cells WHERE session = ?",
                 "seq_started")
    for cell in cells:
        code = (cell.pop("code") or "").strip().splitlines()
        cell["code"] = (code[0][:120] + (" …" if len(code) > 1 else "")) if code else ""
    return {
        "session": session,
        "mode": {"name": host.mode.name, "armed": host.mode.armed},
        "generation": host.generation,
        "cells": cells,
        "receipts": rows("SELECT receipt_id, cell_id, command, exit_status FROM receipts "
                         "WHERE session = ?"),
        "artifacts": rows("SELECT artifact_id, filename, sha256, size, cell_id FROM artifacts "
                          "WHERE session = ?"),
        "submissions": [dict(r, accepted=bool(r["accepted"])) for r in rows(
            "SELECT submission_id, cell_id, accepted FROM submissions WHERE session = ?")],
    }


# ----------------------------------------------------------------------------- stdio


def _claim_stdio() -> tuple[io.TextIOWrapper, io.TextIOWrapper]:
    """Private duplicates of fds 0 and 1 for the protocol; fds 0 and 1 no longer reach it."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    os.set_inheritable(proto_in, False)
    os.set_inheritable(proto_out, False)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    wire_in = io.TextIOWrapper(os.fdopen(proto_in, "rb"), encoding="utf-8", errors="replace")
    wire_out = io.TextIOWrapper(os.fdopen(proto_out, "wb"), encoding="utf-8",
                                line_buffering=True)
    return wire_in, wire_out


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwind through `finally`, which closes the Host and its kernel


def serve(workdir: str | os.PathLike[str], *, mode: str | None = None,
          record_dir: str | os.PathLike[str] | None = None, ledger: str | None = None,
          blobs: str | None = None) -> int:
    """Serve a Host over MCP on stdio until the client closes stdin; returns an exit code.
    ``ledger`` and ``blobs``: the record's PostgreSQL ledger and blob store, as for
    :class:`~host_kernel.Host`."""
    wire_in, wire_out = _claim_stdio()
    stderr = sys.stderr
    # The SDK's stdio transport takes sys.stdin/sys.stdout's buffers when it starts; the
    # lifespan then points sys.stdout back at stderr so a stray print never reaches the wire.
    sys.stdin, sys.stdout = wire_in, wire_out

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[dict[str, Any]]:
        sys.stdout = stderr
        yield {}

    signal.signal(signal.SIGTERM, _terminate)
    worker = HostThread("mcp-host")
    # spare: the next generation's kernel waits started, so restart_kernel is a swap.
    host = Host(Path(workdir), mode=mode, record_dir=record_dir,
                options=HostOptions(front="mcp", spare=True, ledger=ledger, blobs=blobs))
    try:
        worker.call(host.start)
        stderr.write(f"host-kernel mcp {__version__}: serving {host.workdir} (mode "
                     f"{host.mode.name}{', armed' if host.mode.armed else ''}); record "
                     f"{host.record_dir}\n")
        stderr.flush()
        build_server(host, worker, lifespan=lifespan).run("stdio")
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: the cell a tool is running (on the Host thread) is interrupted
        # as a notebook's button would, so it ends and is recorded before the Host closes.
        worker.interrupt_kernel(host.kernel_pid)
    finally:
        try:
            worker.submit(host.close).result(timeout=30)
        except BaseException:  # noqa: BLE001 - a stuck Host thread: close from here
            host.close()
        worker.stop(timeout=5)
    return 0
