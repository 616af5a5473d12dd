"""A lineage graph drawn as one self-contained SVG document.

Owns laying out a :class:`~host_kernel.lineage.model.Lineage` in layers and
writing it as SVG text: no fonts, stylesheets or scripts from elsewhere, so the
same string works inline in a notebook's HTML output, as ``image/svg+xml`` and
in the record viewer. It does not read the record (the graph is given) and it
does not decide what the graph holds.

The layout is a longest-path layering from the artifact back to its sources:
the artifact is layer 0 at the right, each input one layer further left than
the furthest node that points at it, so data flows left to right while the
arrows, like the Mermaid and DOT exports, point from a node to what it came
from. Inside a layer nodes keep a stable order (the mean position of the nodes
pointing at them, then the graph's own order). An edge that spans several layers
gets a waypoint in each layer it crosses, which takes a row there like a node,
so the edge is drawn through free space and never across a box.

Labels come from the record, which an agent wrote, so every piece of text is
XML-escaped and characters XML cannot hold are replaced. The markup is a
contract with the viewer: each node is ``<g class="node" data-id=… data-kind=…>``
and each edge ``<g class="edge" data-from=… data-to=…>``.
"""

from __future__ import annotations

import html
import re
from collections import deque

from .model import Lineage, LineageEdge, LineageNode

__all__ = ["MAX_SVG_NODES", "lineage_svg", "short_name"]

MAX_SVG_NODES = 200
"""Nodes drawn at most; the rest are counted in a "+N more" note."""

_NODE_W, _NODE_H = 184, 42
_GAP_X, _GAP_Y = 56, 14
_PAD = 12
_TITLE_H = 24
_NOTE_H = 20
_LABEL_CHARS = 26

# One colour per kind; boxes use it for the border and, faint, for the fill, so
# the drawing reads on light and dark backgrounds alike. Text is currentColor.
_COLOURS = {
    "artifact": "#4c78a8",
    "file": "#54a24b",
    "cell": "#f58518",
    "receipt": "#b279a2",
    "subtask": "#e45756",
}
_OTHER_COLOUR = "#888888"

_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def lineage_svg(graph: Lineage, *, title: str | None = None) -> str:
    """The lineage graph as a standalone ``<svg xmlns="http://www.w3.org/2000/svg" …>`` string.

    At most :data:`MAX_SVG_NODES` nodes are drawn (those nearest the artifact);
    a note says how many were left out, and another when the graph was already
    cut when it was read from the record. Never loops on a cyclic graph.
    """
    nodes, more = _kept_nodes(graph)
    kept = {n.id for n in nodes}
    edges = [e for e in graph.edges if e.src in kept and e.dst in kept and e.src != e.dst]
    layers = _layers(graph.root, nodes, edges)
    # Waypoints: one per layer an edge crosses, placed and ordered like nodes.
    ways: dict[int, list[str]] = {}
    links: list[tuple[str, str]] = []
    for i, e in enumerate(edges):
        hops = [e.src]
        for layer in range(layers[e.src] + 1, layers[e.dst]):
            way = f"\x00way {i} {layer}"  # no node id holds NUL
            layers[way] = layer
            hops.append(way)
        hops.append(e.dst)
        ways[i] = hops[1:-1]
        links += zip(hops, hops[1:], strict=False)
    ids = [n.id for n in nodes] + [w for hops in ways.values() for w in hops]
    columns = _order(ids, links, layers)

    ncols = max(len(columns), 1)
    nrows = max((len(c) for c in columns), default=1)
    top = _PAD + (_TITLE_H if title else 0)
    notes = _notes(more, graph.truncated)
    width = 2 * _PAD + ncols * _NODE_W + (ncols - 1) * _GAP_X
    body_h = nrows * _NODE_H + (nrows - 1) * _GAP_Y
    height = top + body_h + _PAD + len(notes) * _NOTE_H

    pos: dict[str, tuple[int, int]] = {}
    for layer, column in enumerate(columns):
        x = _PAD + (ncols - 1 - layer) * (_NODE_W + _GAP_X)
        offset = (body_h - (len(column) * _NODE_H + (len(column) - 1) * _GAP_Y)) // 2
        for row, nid in enumerate(column):
            pos[nid] = (x, top + offset + row * (_NODE_H + _GAP_Y))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" '
        'font-family="ui-sans-serif, system-ui, sans-serif" font-size="12">',
        f"<title>{_x(title or 'lineage of ' + graph.root)}</title>",
        "<defs>",
        '<marker id="hk-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#888888"/></marker>',
        "</defs>",
    ]
    if title:
        out.append(
            f'<text x="{_PAD}" y="{_PAD + 14}" font-weight="bold" fill="currentColor">'
            f"{_x(_short(title, 80))}</text>"
        )
    out.extend(_edge(e, pos, ways[i]) for i, e in enumerate(edges))
    out.extend(_node(n, pos[n.id], n.id == graph.root) for n in nodes)
    for i, note in enumerate(notes):
        y = top + body_h + _PAD + i * _NOTE_H + 12
        out.append(
            f'<text class="note" x="{_PAD}" y="{y}" fill="currentColor" '
            f'font-style="italic">{_x(note)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- layout


def _kept_nodes(graph: Lineage) -> tuple[list[LineageNode], int]:
    """The nodes to draw, nearest the root first (breadth first), and how many were left."""
    if len(graph.nodes) <= MAX_SVG_NODES:
        return list(graph.nodes), 0
    by_id = {n.id: n for n in graph.nodes}
    out_edges: dict[str, list[str]] = {}
    for e in graph.edges:
        out_edges.setdefault(e.src, []).append(e.dst)
    order: list[str] = []
    seen: set[str] = set()
    queue = deque([graph.root] if graph.root in by_id else [])
    while queue and len(order) < MAX_SVG_NODES:
        nid = queue.popleft()
        if nid in seen:
            continue
        seen.add(nid)
        order.append(nid)
        queue.extend(d for d in out_edges.get(nid, []) if d in by_id and d not in seen)
    for n in graph.nodes:  # nodes not reachable from the root, if any, after the rest
        if len(order) >= MAX_SVG_NODES:
            break
        if n.id not in seen:
            seen.add(n.id)
            order.append(n.id)
    return [by_id[i] for i in order], len(graph.nodes) - len(order)


def _layers(root: str, nodes: list[LineageNode], edges: list[LineageEdge]) -> dict[str, int]:
    """Longest-path layer of each node from the nodes nothing points at (the root first).

    Kahn's order over the graph; nodes on a cycle never reach in-degree zero, and
    are placed after it, one layer past the furthest node already placed that
    points at them, so each node is visited a bounded number of times.
    """
    ids = [n.id for n in nodes]
    indeg = dict.fromkeys(ids, 0)
    succ: dict[str, list[str]] = {i: [] for i in ids}
    pred: dict[str, list[str]] = {i: [] for i in ids}
    for e in edges:
        succ[e.src].append(e.dst)
        pred[e.dst].append(e.src)
        indeg[e.dst] += 1
    layer = dict.fromkeys(ids, 0)
    queue = deque(i for i in ids if indeg[i] == 0)
    placed: set[str] = set()
    while queue:
        nid = queue.popleft()
        placed.add(nid)
        for d in succ[nid]:
            layer[d] = max(layer[d], layer[nid] + 1)
            indeg[d] -= 1
            if indeg[d] == 0:
                queue.append(d)
    for nid in ids:  # on a cycle (never expected): after what is placed already
        if nid not in placed:
            layer[nid] = max((layer[p] + 1 for p in pred[nid] if p in placed), default=0)
            placed.add(nid)
    if root in layer and layer[root] != 0:
        layer[root] = 0
    return layer


def _order(
    ids: list[str], links: list[tuple[str, str]], layers: dict[str, int]
) -> list[list[str]]:
    """Node and waypoint ids grouped by layer; in each, by the mean row of what points at
    them, then their order in ``ids``."""
    depth = max(layers.values(), default=0)
    columns: list[list[str]] = [[] for _ in range(depth + 1)]
    for nid in ids:
        columns[layers[nid]].append(nid)
    index = {nid: i for i, nid in enumerate(ids)}
    pred: dict[str, list[str]] = {}
    for src, dst in links:
        pred.setdefault(dst, []).append(src)
    row: dict[str, int] = {}
    for column in columns:

        def key(nid: str) -> tuple[float, int]:
            rows = [row[p] for p in pred.get(nid, []) if p in row]
            return (sum(rows) / len(rows) if rows else float(index[nid]), index[nid])

        column.sort(key=key)
        row.update((nid, r) for r, nid in enumerate(column))
    return [c for c in columns if c]


# --------------------------------------------------------------------------- drawing


def _node(node: LineageNode, at: tuple[int, int], is_root: bool) -> str:
    x, y = at
    colour = _COLOURS.get(node.kind, _OTHER_COLOUR)
    stroke = 2.5 if is_root else 1.2
    full = f"{node.kind}: {node.label}\n{node.id}"
    return (
        f'<g class="node" data-id="{_x(node.id)}" data-kind="{_x(node.kind)}">'
        f"<title>{_x(full)}</title>"
        f'<rect x="{x}" y="{y}" width="{_NODE_W}" height="{_NODE_H}" rx="6" '
        f'fill="{colour}" fill-opacity="0.16" stroke="{colour}" stroke-width="{stroke}"/>'
        f'<text x="{x + 8}" y="{y + 15}" font-size="10" fill="{colour}">'
        f"{_x(_short(node.kind, 20))}</text>"
        f'<text x="{x + 8}" y="{y + 32}" fill="currentColor">{_x(short_name(node))}</text>'
        "</g>"
    )


def _edge(edge: LineageEdge, pos: dict[str, tuple[int, int]], ways: list[str]) -> str:
    mid = _NODE_H // 2
    # From the left side of the node that came from something, through the row kept for
    # it in each layer it crosses, to the right side of what it came from.
    sx, sy = pos[edge.src]
    x, y = sx, sy + mid
    d = f"M{x},{y}"
    for way in ways:
        wx, wy = pos[way]
        bend = max((x - wx - _NODE_W) // 2, 24)
        d += f" C{x - bend},{y} {wx + _NODE_W + bend},{wy + mid} {wx + _NODE_W},{wy + mid}"
        x, y = wx, wy + mid
        d += f" L{x},{y}"
    dx, dy = pos[edge.dst]
    x2, y2 = dx + _NODE_W, dy + mid
    bend = max((x - x2) // 2, 24)
    d += f" C{x - bend},{y} {x2 + bend},{y2} {x2},{y2}"
    dash = ' stroke-dasharray="4 3"' if edge.relation != "wasDerivedFrom" else ""
    label = edge.relation + (f" ({edge.method})" if edge.method else "")
    return (
        f'<g class="edge" data-from="{_x(edge.src)}" data-to="{_x(edge.dst)}" '
        f'data-relation="{_x(edge.relation)}">'
        f"<title>{_x(label)}</title>"
        f'<path d="{d}" fill="none" '
        f'stroke="#888888" stroke-width="1.3"{dash} marker-end="url(#hk-arrow)"/>'
        "</g>"
    )


def _notes(more: int, truncated: bool) -> list[str]:
    notes = []
    if more:
        notes.append(f"+{more} more node{'s' if more != 1 else ''} not drawn")
    if truncated:
        notes.append("the record's lineage was cut at its node bound")
    return notes


def short_name(node: LineageNode) -> str:
    """A box-sized name for a node: a file's last path parts, a cell's short id, …"""
    a = node.attrs
    if node.kind == "cell" and a.get("cell_id"):
        cell = str(a["cell_id"])
        gen = a.get("generation")
        short = cell if len(cell) <= 16 else cell[:8] + "…"  # the Host mints 16 characters
        return _short(f"cell {short}" + (f" · gen {gen}" if gen is not None else ""))
    if node.kind == "file":
        path = str(a.get("path") or node.label)
        return path if len(path) <= _LABEL_CHARS else "…" + path[-(_LABEL_CHARS - 1):]
    return _short(node.label)


def _short(text: str, limit: int = _LABEL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _x(text: str) -> str:
    """Text made safe for XML character data and attribute values."""
    return html.escape(_XML_BAD.sub("\ufffd", text), quote=True)
