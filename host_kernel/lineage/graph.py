"""Lineage graphs read from the record, and receipts as in-toto statements.

Owns turning the lineage recorded with each artifact into an upstream graph
(artifact → the cell that produced it → the inputs it used, recursively through
artifacts), and writing a receipt as an in-toto Statement v1. It reads the
ledger only; it does not decide what the inputs are (the Host does, at save
time). The graph itself, with its text, Mermaid, DOT and PROV exports, is
:class:`~host_kernel.lineage.model.Lineage`, handed out from here with its
notebook cards registered (:mod:`host_kernel._display`).

:func:`build_lineage` and :func:`receipt_statement` read whatever ledger they
are given. Readers of a record on disk use :func:`record_lineage` and
:func:`record_receipt_statement`, which read it through
:func:`~host_kernel.store.verified.open_verified` (checked chain, projection
rebuilt from the events, refusal on drift), never the stored tables.

Identifiers are stable: ``artifact:<uuid>``, ``file:<path>@<sha256>`` (a
content version of a workspace file), ``cell:<cell id>``, ``receipt:<uuid>``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .. import _display  # noqa: F401 - registers Lineage's cards (host_kernel._displayed)
from .._errors import FileProblem
from ..store.ledger import Ledger
from ..store.verified import open_verified
from .model import MAX_NODES, Lineage, LineageEdge, LineageNode

__all__ = ["Lineage", "LineageEdge", "LineageNode", "artifact_statement", "build_lineage",
           "receipt_statement", "record_artifact_statement", "record_lineage",
           "record_receipt_statement"]


# --------------------------------------------------------------------------- building


def build_lineage(
    ledger: Ledger, artifact_id: str, *, session: str | None = None, max_nodes: int = MAX_NODES
) -> Lineage:
    """The upstream graph of ``artifact_id`` from the lineage recorded at save time."""
    sql = "SELECT * FROM artifacts WHERE artifact_id = ?"
    params: tuple[Any, ...] = (artifact_id,)
    if session is not None:
        sql += " AND session = ?"
        params += (session,)
    if not ledger.query(sql, params):
        raise FileProblem(f"no artifact {artifact_id!r} in this record")
    nodes: dict[str, LineageNode] = {}
    edges: list[LineageEdge] = []
    truncated = False
    queue = [artifact_id]
    done: set[str] = set()
    receipts = {
        r["receipt_id"]: json.loads(r["body"])
        for r in ledger.query("SELECT receipt_id, body FROM receipts")
    }
    subtasks, collected = _subtasks(ledger)

    def add(node: LineageNode) -> bool:
        nonlocal truncated
        if node.id in nodes:
            return True
        if len(nodes) >= max_nodes:
            truncated = True
            return False
        nodes[node.id] = node
        return True

    while queue:
        aid = queue.pop(0)
        if aid in done:
            continue
        done.add(aid)
        rows = ledger.query("SELECT * FROM artifacts WHERE artifact_id = ?", (aid,))
        if not rows:
            made_by = collected.get(aid)
            if made_by is not None:  # an artifact a collected sub-task made
                handle, artifact = made_by
                anode = f"artifact:{aid}"
                nodes[anode] = LineageNode(anode, "artifact", artifact.get("filename") or aid, {
                    "artifact_id": aid, "sha256": artifact.get("sha256"),
                    "size": artifact.get("size"), "subtask": handle})
                snode = _subtask_node(handle, subtasks)
                if add(snode):
                    edges.append(LineageEdge(anode, snode.id, "wasDerivedFrom"))
                    queue += _subtask_upstream(snode, subtasks, add, edges)
            continue
        row = rows[0]
        anode = f"artifact:{aid}"
        full = LineageNode(anode, "artifact", row["filename"], {
            "artifact_id": aid, "sha256": row["sha256"], "size": row["size"],
            "source_path": row["source_path"]})
        if anode in nodes:
            nodes[anode] = full  # first met as an input, by id only
        elif not add(full):
            break
        cnode = f"cell:{row['cell_id']}"
        if add(
            LineageNode(
                cnode,
                "cell",
                f"cell {row['cell_id']} (generation {row['generation']})",
                {"cell_id": row["cell_id"], "generation": row["generation"]},
            )
        ):
            edges.append(LineageEdge(anode, cnode, "wasGeneratedBy"))
        lineage = json.loads(row["lineage"]) if row["lineage"] else {}
        truncated = truncated or bool(lineage.get("truncated"))
        derivations = {(d.get("path"), d.get("sha256")): d
                       for d in lineage.get("derivations", ()) if isinstance(d, dict)}
        # (node the inputs belong to, its input records): the artifact, then each
        # session-made file among them, through its own derivation (direct inputs only).
        pending: list[tuple[str, list[Any]]] = [(anode, lineage.get("inputs", []))]
        derived: set[str] = set()
        while pending:
            owner, items = pending.pop(0)
            for item in items:
                if not isinstance(item, dict):
                    continue
                inode = _input_node(item, receipts)
                if inode is not None and inode.kind == "subtask":
                    inode = _subtask_node(item["handle"], subtasks)
                if inode is None or not add(inode):
                    continue
                edges.append(LineageEdge(owner, inode.id, "wasDerivedFrom", item.get("method")))
                via = item.get("via_cell")
                if via and f"cell:{via}" in nodes and inode.kind != "receipt":
                    edges.append(LineageEdge(f"cell:{via}", inode.id, "used"))
                if inode.kind == "artifact":
                    queue.append(item["artifact_id"])
                elif inode.kind == "subtask":
                    queue += _subtask_upstream(inode, subtasks, add, edges)
                elif inode.kind == "file" and inode.id not in derived:
                    found = derivations.get((item.get("path"), item.get("sha256")))
                    if found is None:
                        continue
                    derived.add(inode.id)
                    truncated = truncated or bool(found.get("truncated"))
                    maker = _maker_node(found.get("written_by"), receipts)
                    if maker is not None and add(maker):
                        edges.append(LineageEdge(inode.id, maker.id, "wasGeneratedBy"))
                    pending.append((inode.id, list(found.get("inputs", ()))))
    return Lineage(
        f"artifact:{artifact_id}", tuple(nodes.values()), tuple(_dedupe(edges)), truncated
    )


def _dedupe(edges: Iterable[LineageEdge]) -> list[LineageEdge]:
    seen: dict[tuple[str, str, str], LineageEdge] = {}
    for e in edges:
        seen.setdefault((e.src, e.dst, e.relation), e)
    return list(seen.values())


def _subtasks(ledger: Ledger) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each sub-task by handle (its start, and its last collection merged in), and each
    collected child artifact id → (handle, artifact)."""
    subtasks: dict[str, dict[str, Any]] = {}
    collected: dict[str, Any] = {}
    for row in ledger.query("SELECT kind, body FROM events WHERE kind IN "
                            "('subtask_started', 'subtask_collected') ORDER BY seq"):
        body = json.loads(row["body"])
        handle = body.get("handle")
        if not isinstance(handle, str):
            continue
        subtasks.setdefault(handle, {}).update(body)
        for artifact in body.get("artifacts", ()) if row["kind"] == "subtask_collected" else ():
            collected[artifact["artifact_id"]] = (handle, artifact)
    return subtasks, collected


def _subtask_node(handle: str, subtasks: dict[str, dict[str, Any]]) -> LineageNode:
    body = subtasks.get(handle, {})
    task = str(body.get("task") or "")
    label = f"sub-task {handle}: {task[:60]}" + ("…" if len(task) > 60 else "")
    return LineageNode(f"subtask:{handle}", "subtask", label, {
        "handle": handle, "task": task, "outcome": body.get("outcome"),
        "accepted": body.get("accepted"), "session": body.get("session"),
        "record_dir": body.get("record_dir"), "folder": body.get("folder")})


def _subtask_upstream(node: LineageNode, subtasks: dict[str, dict[str, Any]],
                      add: Callable[[LineageNode], bool], edges: list[LineageEdge]) -> list[str]:
    """Link a sub-task to the inputs its artifacts were built from; answers the artifact
    ids among them, to walk further up."""
    more: list[str] = []
    body = subtasks.get(node.attrs["handle"], {})
    for read in body.get("read_inputs", ()):
        inode = _input_node(read, {})
        if inode is None or not add(inode):
            continue
        edges.append(LineageEdge(node.id, inode.id, "wasDerivedFrom", "subtask"))
        if inode.kind == "artifact":
            more.append(read["artifact_id"])
    return more


def _maker_node(writer: Any, receipts: dict[str, Any]) -> LineageNode | None:
    """The cell or command that wrote a session-made file's content."""
    if not isinstance(writer, dict):
        return None
    if isinstance(writer.get("receipt"), str):
        return _input_node({"receipt_id": writer["receipt"],
                            "command": writer.get("command")}, receipts)
    if isinstance(writer.get("cell"), str):
        return LineageNode(f"cell:{writer['cell']}", "cell", f"cell {writer['cell']}",
                           {"cell_id": writer["cell"]})
    return None


def _input_node(item: dict[str, Any], receipts: dict[str, Any]) -> LineageNode | None:
    if item.get("handle"):
        return LineageNode(f"subtask:{item['handle']}", "subtask", f"sub-task {item['handle']}",
                           {"handle": item["handle"]})
    if item.get("artifact_id"):
        return LineageNode(
            f"artifact:{item['artifact_id']}",
            "artifact",
            item.get("filename") or item["artifact_id"],
            {"artifact_id": item["artifact_id"]},
        )
    if item.get("receipt_id"):
        body = receipts.get(item["receipt_id"], {})
        return LineageNode(
            f"receipt:{item['receipt_id']}",
            "receipt",
            f"$ {body.get('command', item.get('command', '?'))}",
            {
                "receipt_id": item["receipt_id"],
                "command": body.get("command", item.get("command")),
                "exit_status": body.get("exit_status", item.get("exit_status")),
            },
        )
    if item.get("path"):
        sha = item.get("sha256") or "unknown"
        return LineageNode(
            f"file:{item['path']}@{sha}",
            "file",
            item["path"],
            {"path": item["path"], "sha256": sha, "hashed_at": item.get("hashed_at")},
        )
    return None


def artifact_statement(ledger: Ledger, artifact_id: str) -> dict[str, Any]:
    """An artifact as an in-toto Statement v1 (link predicate): the artifact is the
    subject, its **direct** inputs the materials (files and artifacts by sha256, commands
    and sub-tasks by URI), and each session-made input's own derivation a byproduct, so a
    verifier can walk the chain without the record."""
    rows = ledger.query("SELECT * FROM artifacts WHERE artifact_id = ?", (artifact_id,))
    if not rows:
        raise FileProblem(f"no artifact {artifact_id!r} in this record")
    row = rows[0]
    lineage = json.loads(row["lineage"]) if row["lineage"] else {}

    def material(item: dict[str, Any]) -> dict[str, Any]:
        if item.get("artifact_id"):
            return {"uri": f"urn:host-kernel:artifact:{item['artifact_id']}",
                    "digest": {"sha256": item.get("sha256")}}
        if item.get("receipt_id"):
            return {"uri": f"urn:host-kernel:receipt:{item['receipt_id']}",
                    "annotations": {"command": item.get("command"),
                                    "exit_status": item.get("exit_status")}}
        if item.get("handle"):
            return {"uri": f"urn:host-kernel:subtask:{item['handle']}"}
        return {"name": item.get("path"), "digest": {"sha256": item.get("sha256")},
                "annotations": {"method": item.get("method")}}

    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": row["filename"], "digest": {"sha256": row["sha256"]}}],
        "predicateType": "https://in-toto.io/attestation/link/v0.3",
        "predicate": {
            "name": f"host-kernel artifact {artifact_id}",
            "command": [f"cell {row['cell_id']}"],
            "materials": [material(i) for i in lineage.get("inputs", ()) if isinstance(i, dict)],
            "byproducts": {
                "cell-id": row["cell_id"], "generation": row["generation"],
                "session": row["session"], "source-path": row["source_path"],
                "written-by": lineage.get("written_by"),
                "derivations": [
                    {"name": d.get("path"), "digest": {"sha256": d.get("sha256")},
                     "written-by": d.get("written_by"),
                     "materials": [material(i) for i in d.get("inputs", ())
                                   if isinstance(i, dict)]}
                    for d in lineage.get("derivations", ()) if isinstance(d, dict)],
                "truncated": bool(lineage.get("truncated")),
            },
        },
    }


def record_artifact_statement(record_dir: str | Path, artifact_id: str) -> dict[str, Any]:
    """:func:`artifact_statement` from the record folder's verified events."""
    with open_verified(record_dir) as trusted:
        return artifact_statement(trusted, artifact_id)


def receipt_statement(ledger: Ledger, receipt_id: str) -> dict[str, Any]:
    """A receipt as an in-toto Statement v1 with a link predicate."""
    rows = ledger.query("SELECT body, session FROM receipts WHERE receipt_id = ?",
                        (receipt_id,))
    if not rows:
        raise FileProblem(f"no receipt {receipt_id!r} in this record")
    r = json.loads(rows[0]["body"])
    subjects = [
        {"name": c["path"], "digest": {"sha256": c["sha256"]}}
        for c in r.get("changes", [])
        if c.get("sha256")
    ]
    materials = []
    if r.get("executable") and r.get("executable_sha256"):
        materials.append({"name": r["executable"], "digest": {"sha256": r["executable_sha256"]}})
    materials += _read_materials(ledger, r, rows[0]["session"])
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": subjects,
        "predicateType": "https://in-toto.io/attestation/link/v0.3",
        "predicate": {
            "name": f"host-kernel receipt {receipt_id}",
            "command": ["bash", "-c", r["command"]],
            "materials": materials,
            "byproducts": {
                "return-value": r.get("exit_status"),
                "signal": r.get("signal"),
                "timed-out": r.get("timed_out"),
                "stdout": {"sha256": r.get("stdout_sha256"), "size": r.get("stdout_size")},
                "stderr": {"sha256": r.get("stderr_sha256"), "size": r.get("stderr_size")},
                "cell-id": r.get("cell_id"),
                "generation": r.get("generation"),
                "cwd": r.get("cwd"),
                "started": r.get("started"),
                "ended": r.get("ended"),
            },
            "environment": {
                "path-differs": r.get("path_differs"),
                "env-changed": r.get("env_changed"),
            },
        },
    }


def _read_materials(ledger: Ledger, receipt: dict[str, Any], session: str) -> list[Any]:
    """The workspace files the receipt's command read, as the Host's tracer saw them
    (``traced.reads``, less the files it changed): each named by its workspace path, with
    a ``file://`` URI under the session's workspace and, when its cell's ``inputs_kept``
    holds one, the sha256 the Host read (several when the cell read it at several)."""
    traced = receipt.get("traced")
    if not isinstance(traced, dict):
        return []  # untraced: no observed reads to list
    changed = {c.get("path") for c in receipt.get("changes") or () if isinstance(c, dict)}
    reads = [p for p in dict.fromkeys(traced.get("reads") or ())
             if isinstance(p, str) and p not in changed]
    if not reads:
        return []
    digests: dict[str, list[str]] = {}
    for row in ledger.query("SELECT body FROM events WHERE session = ? AND kind = "
                            "'cell_finished'", (session,)):
        body = json.loads(row["body"])
        if body.get("cell_id") != receipt.get("cell_id"):
            continue
        kept = body.get("inputs_kept") or {}
        for entry in [*(kept.get("kept") or ()), *(kept.get("by_hash_only") or ())]:
            if isinstance(entry, list) and len(entry) >= 2 and isinstance(entry[1], str):
                digests.setdefault(str(entry[0]), []).append(entry[1])
    workdir = ledger.query("SELECT workdir FROM sessions WHERE session = ?", (session,))
    root = str(workdir[0]["workdir"]).rstrip("/") if workdir and workdir[0]["workdir"] else ""
    out: list[Any] = []
    for path in reads:
        uri = {"uri": f"file://{root}/{path}"} if root else {}
        shas = list(dict.fromkeys(digests.get(path, ())))
        if not shas:
            out.append({"name": path, **uri})
        out += [{"name": path, **uri, "digest": {"sha256": sha}} for sha in shas]
    return out


# --------------------------------------------------------------------------- verified readers


def record_lineage(record_dir: str | Path, artifact_id: str, *, session: str | None = None,
                   max_nodes: int = MAX_NODES) -> Lineage:
    """The upstream graph of ``artifact_id`` in the record folder, from its verified events.

    Raises RecordRefused (see :func:`~host_kernel.store.verified.open_verified`)
    when the record fails its checks, FileProblem when it holds no such artifact.
    """
    with open_verified(record_dir) as trusted:
        return build_lineage(trusted, artifact_id, session=session, max_nodes=max_nodes)


def record_receipt_statement(record_dir: str | Path, receipt_id: str) -> dict[str, Any]:
    """The receipt ``receipt_id`` of the record folder as an in-toto Statement v1, from its
    verified events. Raises as :func:`record_lineage` does."""
    with open_verified(record_dir) as trusted:
        return receipt_statement(trusted, receipt_id)
