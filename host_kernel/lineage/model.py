"""The lineage graph as a value: its nodes and edges, and its text, Mermaid, DOT and PROV exports.

Owns :class:`Lineage` (with :class:`LineageNode` and :class:`LineageEdge`),
serialised one way (``to_dict`` / ``from_dict``) and written as a text tree,
Mermaid, Graphviz DOT or W3C PROV-JSON. It does not read the record
(:mod:`host_kernel.lineage.graph` builds the graph from a ledger and hands it
out) and it does not draw it (:mod:`host_kernel.lineage.svg` does, and
:mod:`host_kernel._display` registers the cards a notebook shows).

Identifiers are stable: ``artifact:<uuid>``, ``file:<path>@<sha256>`` (a
content version of a workspace file), ``cell:<cell id>``, ``receipt:<uuid>``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .._displayed import Displayed, draw

__all__ = ["MAX_NODES", "Lineage", "LineageEdge", "LineageNode"]

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
    :mod:`host_kernel.lineage.svg`; the cards are registered by
    :mod:`host_kernel._display`); its plain text is :meth:`to_text`.
    """

    root: str
    nodes: tuple[LineageNode, ...]
    edges: tuple[LineageEdge, ...]
    truncated: bool = False

    def node(self, node_id: str) -> LineageNode:
        return next(n for n in self.nodes if n.id == node_id)

    def inputs(self, node_id: str | None = None) -> list[LineageNode]:
        """Direct inputs of a node (default: the root artifact): what the cell that made it
        read, a session-made file among them being one input."""
        nid = node_id or self.root
        direct = [e.dst for e in self.edges if e.src == nid and e.relation == "wasDerivedFrom"]
        return [self.node(d) for d in dict.fromkeys(direct)]

    def upstream(self, node_id: str | None = None) -> list[LineageNode]:
        """Every node a node (default: the root artifact) was derived from, transitively
        (PROV's ``wasDerivedFrom`` chain through session-made files, artifacts and
        sub-tasks), nearest first, each once."""
        nid = node_id or self.root
        out: dict[str, None] = {}
        frontier = [nid]
        while frontier:
            current = frontier.pop(0)
            for edge in self.edges:
                if edge.src == current and edge.relation == "wasDerivedFrom" \
                        and edge.dst not in out and edge.dst != nid:
                    out[edge.dst] = None
                    frontier.append(edge.dst)
        return [self.node(d) for d in out]

    def depth(self, depth: int | None) -> Lineage:
        """The graph cut ``depth`` derivation steps up from the root (None: all of it);
        1 keeps the direct inputs and the cell that made the root."""
        if depth is None:
            return self
        keep = {self.root: 0}
        frontier = [self.root]
        while frontier:
            current = frontier.pop(0)
            for edge in self.edges:
                if edge.src != current or edge.dst in keep:
                    continue
                step = keep[current] + (1 if edge.relation == "wasDerivedFrom" else 0)
                if edge.relation == "used" or step > depth:
                    continue
                keep[edge.dst] = step
                frontier.append(edge.dst)
        edges = tuple(e for e in self.edges if e.src in keep and e.dst in keep)
        return Lineage(self.root, tuple(n for n in self.nodes if n.id in keep), edges,
                       self.truncated)

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

    def to_text(self, escape: Callable[[str], str] | None = None) -> str:
        """The graph as an indented tree, one node a line. ``escape`` is applied to every
        value the record supplied (names, paths, commands, labels), so that each stays
        on its line; the CLI passes :func:`host_kernel.browse.printable`, which also
        escapes control characters for the terminal."""
        esc = escape or _keep
        lines: list[str] = []
        seen: set[str] = set()

        def walk(nid: str, depth: int) -> None:
            node = self.node(nid)
            mark = " (see above)" if nid in seen else ""
            lines.append("  " * depth + _describe(node, esc) + mark)
            if nid in seen:
                return
            seen.add(nid)
            for edge in self.edges:
                if edge.src == nid and edge.relation in ("wasDerivedFrom", "wasGeneratedBy"):
                    how = f" [{esc(edge.method)}]" if edge.method else ""
                    if edge.relation == "wasGeneratedBy":
                        lines.append("  " * (depth + 1)
                                     + f"made by {esc(self.node(edge.dst).label)}")
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

    def _repr_svg_(self) -> str:
        return draw(self, "image/svg+xml")

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


def _keep(text: str) -> str:
    return text


def _describe(node: LineageNode, esc: Callable[[str], str] = _keep) -> str:
    """One node's line; every value from the record passes through ``esc``."""
    a = {key: esc(str(value)) for key, value in node.attrs.items()}
    label = esc(node.label)
    if node.kind == "artifact":
        return (
            f"artifact {label} ({a.get('artifact_id')}, sha256 {str(a.get('sha256'))[:12]}…)"
        )
    if node.kind == "file":
        return (f"file {a.get('path')} (sha256 {str(a.get('sha256'))[:12]}…, "
                f"hashed {a.get('hashed_at')})")
    if node.kind == "receipt":
        command = node.attrs.get("command")
        return (f"command {esc(repr(command))} (exit {a.get('exit_status')}, "
                f"receipt {a.get('receipt_id')})")
    if node.kind == "subtask":
        return f"{label} (outcome {a.get('outcome')}, session {a.get('session')})"
    return label
