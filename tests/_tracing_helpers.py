"""Reading what a traced session recorded: artifact inputs, receipts and events."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from _helpers import run_ok

from host_kernel import Host, Observation


def last_line(host: Host, code: str) -> str:
    """Run a cell that must succeed and prints one value last; return that value."""
    return run_ok(host, code).strip().splitlines()[-1]


def _newest_inputs(host: Host, filename: str) -> list[dict[str, Any]]:
    rows = host.ledger.query(
        "SELECT lineage FROM artifacts WHERE filename = ? ORDER BY seq DESC LIMIT 1",
        (filename,))
    assert rows, f"no artifact named {filename!r} was saved"
    lineage = json.loads(rows[0]["lineage"])
    assert "error" not in lineage, lineage
    return list(lineage["inputs"])


def inputs_of(host: Host, filename: str) -> dict[str, str]:
    """``{key: method}`` of the newest artifact saved under ``filename``."""
    return {item["key"]: item["method"] for item in _newest_inputs(host, filename)}


def file_inputs(host: Host, filename: str) -> list[dict[str, Any]]:
    """The file inputs (``path``, ``sha256``, …) of the newest artifact named ``filename``."""
    return [i for i in _newest_inputs(host, filename) if i["key"].startswith("file:")]


def artifact_id_of(host: Host, filename: str) -> str:
    rows = host.ledger.query(
        "SELECT artifact_id FROM artifacts WHERE filename = ? ORDER BY seq DESC LIMIT 1",
        (filename,))
    assert rows, f"no artifact named {filename!r} was saved"
    return str(rows[0]["artifact_id"])


def receipt_body(host: Host, receipt_id: str) -> dict[str, Any]:
    rows = host.ledger.query("SELECT body FROM receipts WHERE receipt_id = ?", (receipt_id,))
    assert rows, f"no receipt {receipt_id}"
    return dict(json.loads(rows[0]["body"]))


def events(host: Host, kind: str) -> list[dict[str, Any]]:
    """The bodies of every event of ``kind``, oldest first."""
    rows = host.ledger.query("SELECT body FROM events WHERE kind = ? ORDER BY seq", (kind,))
    return [json.loads(r["body"]) for r in rows]


def finished(host: Host, obs: Observation) -> dict[str, Any]:
    """The cell_finished event body of the cell behind ``obs``."""
    found = [b for b in events(host, "cell_finished") if b["cell_id"] == obs.cell_id]
    assert len(found) == 1, found
    return found[0]


def filtered_python(code: str, cwd: Path) -> tuple[int, int, int]:
    """Fork a child that installs the tracing filter, hands its listener over and execs
    ``python -I -S -c code`` in ``cwd`` (nothing watched in between); ``(pid, listener,
    stdout's read end)``."""
    from host_kernel.sandbox import trace

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.chdir(cwd)
            listener = trace.install_filter()
            socket.send_fds(theirs, [b"x"], [listener])
            os.close(listener)
            os.dup2(out_w, 1)
            os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", code])
        finally:
            os._exit(127)
    os.close(out_w)
    theirs.close()
    _, fds, _, _ = socket.recv_fds(ours, 10, 1)
    ours.close()
    return pid, fds[0], out_r
