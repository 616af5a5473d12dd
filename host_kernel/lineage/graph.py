"""Lineage graphs read from the record, and their exports.

Owns turning the lineage recorded with each artifact into an upstream graph
(artifact → the cell that produced it → the inputs it used, recursively through
artifacts), and writing that graph as a text tree, Mermaid, Graphviz DOT or
W3C PROV-JSON; and writing a receipt as an in-toto Statement v1. It reads the
ledger only; it does not decide what the inputs are (the Host does, at save
time).

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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._errors import FileProblem
from .._models import Displayed
from ..store.ledger import Ledger
from ..store.verified import open_verified

__all__ = ["Lineage", "LineageEdge", "LineageNode", "build_lineage", "receipt_statement",
           "record_lineage", "record_receipt_statement"]

MAX_NODES = 500


@dataclass(frozen=True, slots=True)
class LineageNode:
    id: str
    kind: str  # artifact | file | cell | receipt | subtask (a collected sub-task's result)
    label: str
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LineageEdge:
    src: str
    dst: str
    relation: str  # used | wasGeneratedBy | wasDerivedFrom
    method: str | None = None


@dataclass(frozen=True, slots=True)
class Lineage(Displayed):
    """The upstream graph of one artifact; ``truncated`` when the bound was reached.

    In a notebook it shows as a card with the graph drawn inline (SVG, see
    :mod:`host_kernel.lineage.svg`); its plain text is :meth:`to_text`.
    """

    root: str
    nodes: tuple[LineageNode, ...]
    edges: tuple[LineageEdge, ...]
    truncated: bool = False

    def node(self, node_id: str) -> LineageNode:
        return next(n for n in self.nodes if n.id == node_id)

    def inputs(self, node_id: str | None = None) -> list[LineageNode]:
        """Direct inputs of a node (default: the root artifact), through its generating cell."""
        nid = node_id or self.root
        direct = [e.dst for e in self.edges if e.src == nid and e.relation == "wasDerivedFrom"]
        return [self.node(d) for d in direct]

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "truncated": self.truncated,
            "nodes": [asdict(n) for n in self.nodes],
            "edges": [asdict(e) for e in self.edges],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Lineage:
        return cls(
            data["root"],
            tuple(LineageNode(**n) for n in data["nodes"]),
            tuple(LineageEdge(**e) for e in data["edges"]),
            bool(data.get("truncated")),
        )

    # -- exports

    def to_text(self) -> str:
        lines: list[str] = []
        seen: set[str] = set()

        def walk(nid: str, depth: int) -> None:
            node = self.node(nid)
            mark = " (see above)" if nid in seen else ""
            lines.append("  " * depth + _describe(node) + mark)
            if nid in seen:
                return
            seen.add(nid)
            for edge in self.edges:
                if edge.src == nid and edge.relation in ("wasDerivedFrom", "wasGeneratedBy"):
                    how = f" [{edge.method}]" if edge.method else ""
                    if edge.relation == "wasGeneratedBy":
                        lines.append("  " * (depth + 1) + f"made by {self.node(edge.dst).label}")
                        continue
                    lines.append("  " * (depth + 1) + f"← from{how}:")
                    walk(edge.dst, depth + 2)

        walk(self.root, 0)
        if self.truncated:
            lines.append(f"[graph cut at {MAX_NODES} nodes]")
        return "\n".join(lines) + "\n"

    # -- displays

    def __repr__(self) -> str:
        return (f"Lineage(root={self.root!r}, nodes={len(self.nodes)}, edges={len(self.edges)}"
                + (", truncated=True)" if self.truncated else ")"))

    def _plain_text(self) -> str:
        return self.to_text().rstrip("\n")

    def _repr_html_(self) -> str:
        from .._display import lineage_html

        return lineage_html(self)

    def _repr_markdown_(self) -> str:
        from .._display import lineage_markdown

        return lineage_markdown(self)

    def _repr_svg_(self) -> str:
        from .svg import lineage_svg

        return lineage_svg(self)

    def _renderers(self) -> dict[str, Callable[[], Any]]:
        return {**Displayed._renderers(self), "image/svg+xml": self._repr_svg_}

    def to_mermaid(self) -> str:
        ids = {n.id: f"n{i}" for i, n in enumerate(self.nodes)}
        shape = {
            "artifact": ('[["', '"]]'),
            "file": ('["', '"]'),
            "cell": ('(["', '"])'),
            "receipt": ('{{"', '"}}'),
            "subtask": ('[/"', '"/]'),
        }
        out = ["flowchart RL"]
        for n in self.nodes:
            left, right = shape.get(n.kind, ('["', '"]'))
            out.append(f"    {ids[n.id]}{left}{_esc(n.label)}{right}")
        for e in self.edges:
            label = e.relation + (f" ({e.method})" if e.method else "")
            out.append(f"    {ids[e.src]} -->|{label}| {ids[e.dst]}")
        return "\n".join(out) + "\n"

    def to_dot(self) -> str:
        shape = {"artifact": "box3d", "file": "note", "cell": "ellipse", "receipt": "hexagon",
                 "subtask": "component"}
        out = ["digraph lineage {", "  rankdir=RL;"]
        for n in self.nodes:
            out.append(
                f"  {json.dumps(n.id)} [label={json.dumps(n.label)}, "
                f"shape={shape.get(n.kind, 'box')}];"
            )
        for e in self.edges:
            label = e.relation + (f" ({e.method})" if e.method else "")
            out.append(f"  {json.dumps(e.src)} -> {json.dumps(e.dst)} [label={json.dumps(label)}];")
        out.append("}")
        return "\n".join(out) + "\n"

    def to_prov(self) -> dict[str, Any]:
        """W3C PROV-JSON: content versions and artifacts as entities, cells and commands as
        activities."""
        doc: dict[str, Any] = {"prefix": {"hk": "urn:host-kernel:"}}
        entity: dict[str, Any] = {}
        activity: dict[str, Any] = {}
        for n in self.nodes:
            attrs: dict[str, Any] = {"prov:label": n.label, "hk:kind": n.kind}
            attrs.update(
                {f"hk:{k}": v for k, v in n.attrs.items() if isinstance(v, (str, int, float, bool))}
            )
            (activity if n.kind in ("cell", "receipt") else entity)[_qn(n.id)] = attrs
        doc["entity"] = entity
        doc["activity"] = activity
        relations: dict[str, dict[str, Any]] = {
            "used": {},
            "wasGeneratedBy": {},
            "wasDerivedFrom": {},
        }
        for i, e in enumerate(self.edges):
            rid = f"_:r{i}"
            if e.relation == "wasGeneratedBy":
                relations["wasGeneratedBy"][rid] = {
                    "prov:entity": _qn(e.src),
                    "prov:activity": _qn(e.dst),
                }
            elif e.relation == "used":
                relations["used"][rid] = {"prov:activity": _qn(e.src), "prov:entity": _qn(e.dst)}
            else:
                rel = {"prov:generatedEntity": _qn(e.src), "prov:usedEntity": _qn(e.dst)}
                if e.method:
                    rel["hk:method"] = e.method
                relations["wasDerivedFrom"][rid] = rel
        doc.update({k: v for k, v in relations.items() if v})
        return doc


def _qn(node_id: str) -> str:
    kind, _, rest = node_id.partition(":")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in rest)
    return f"hk:{kind}_{safe}"


def _esc(text: str) -> str:
    return " ".join(text.replace('"', "'").split())


def _describe(node: LineageNode) -> str:
    a = node.attrs
    if node.kind == "artifact":
        return (
            f"artifact {node.label} ({a.get('artifact_id')}, sha256 {str(a.get('sha256'))[:12]}…)"
        )
    if node.kind == "file":
        return f"file {a.get('path')} (sha256 {str(a.get('sha256'))[:12]}…, hashed {a.get('hashed_at')})"
    if node.kind == "receipt":
        return f"command {a.get('command')!r} (exit {a.get('exit_status')}, receipt {a.get('receipt_id')})"
    if node.kind == "subtask":
        return f"{node.label} (outcome {a.get('outcome')}, session {a.get('session')})"
    return node.label


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
        for item in lineage.get("inputs", []):
            inode = _input_node(item, receipts)
            if inode is not None and inode.kind == "subtask":
                inode = _subtask_node(item["handle"], subtasks)
            if inode is None or not add(inode):
                continue
            edges.append(LineageEdge(anode, inode.id, "wasDerivedFrom", item.get("method")))
            via = item.get("via_cell")
            if via and f"cell:{via}" in nodes and inode.kind != "receipt":
                edges.append(LineageEdge(f"cell:{via}", inode.id, "used"))
            if inode.kind == "artifact":
                queue.append(item["artifact_id"])
            elif inode.kind == "subtask":
                queue += _subtask_upstream(inode, subtasks, add, edges)
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


def receipt_statement(ledger: Ledger, receipt_id: str) -> dict[str, Any]:
    """A receipt as an in-toto Statement v1 with a link predicate."""
    rows = ledger.query("SELECT body FROM receipts WHERE receipt_id = ?", (receipt_id,))
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
