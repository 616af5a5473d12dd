"""Feeding one cell to the flow tracker, statement by statement where the code says which.

Owns the split of a cell into the pieces whose reads and writes can be told
apart (host_kernel/lineage/flow.py takes a cell as its unit), from the cell's
code and the paths it read and wrote. Pure: no I/O.
"""

from __future__ import annotations

import ast
import os

from .flow import FlowTracker, Source

__all__ = ["observe"]


def observe(tracker: FlowTracker, cell_id: str, code: str, sources: list[tuple[str, Source]],
            writes: list[str], renames: list[tuple[str, str]], removes: list[str]) -> None:
    """Feed one cell to the tracker, statement by statement where the code says which.

    The tracker's unit is a cell: every name a cell binds gets every read of the
    cell. When each file the cell wrote is named by a string literal in its
    top-level statements, the cell is fed as one pseudo-cell per statement, each
    with the reads whose path a literal in it names (reads named nowhere go to
    every statement), so a decoy opened beside the real input in the same cell
    stays out. Otherwise (dynamic paths, magics, one statement) the cell is fed
    whole, the documented over-approximation.
    """
    split = _statements(code, [p for p, _ in sources], writes)
    if split is None:
        tracker.observe_cell(cell_id, code, [s for _, s in sources], writes,
                             renames=renames, removes=removes)
        return
    parts, write_owner = split
    last = len(parts) - 1
    for i, (segment, reads_here) in enumerate(parts):
        tracker.observe_cell(
            cell_id, segment, [s for (p, s) in sources if p in reads_here],
            [w for w in writes if write_owner[w] == i],
            renames=renames if i == last else (), removes=removes if i == last else ())


#: host calls whose path argument names a file without reading or writing its bytes here.
_NOT_IO = frozenset({"save_artifact", "lineage", "artifacts"})


def _call_literals(node: ast.AST) -> set[str]:
    """String literals given (directly or inside an expression) as arguments of a call.

    ``open('a.csv')``, ``pd.read_csv('a.csv')``, ``Path('data') / 'a.csv'`` name files;
    ``p = 'a.csv'`` on its own does not say where the file is used, so it does not count.
    """
    found: set[str] = set()
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(
            call.func, "id", None)
        if name in _NOT_IO:
            continue
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            for c in ast.walk(arg):
                if isinstance(c, ast.Constant) and isinstance(c.value, str) \
                        and 0 < len(c.value) < 4096 and "\x00" not in c.value:
                    found.add(os.path.normpath(c.value))
    if isinstance(node, (ast.With, ast.AsyncWith)):
        for item in node.items:
            found |= _call_literals(item.context_expr)
    return found


def _statements(code: str, read_paths: list[str], writes: list[str]
                ) -> tuple[list[tuple[str, set[str]]], dict[str, int]] | None:
    """Top-level statements with the reads each may have made, and each write's statement."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) < 2 or not (read_paths or writes):
        return None
    lines = code.splitlines(keepends=True)
    segments: list[str] = []
    literals: list[set[str]] = []
    for node in tree.body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        segments.append("".join(lines[start - 1:node.end_lineno]))
        literals.append(_call_literals(node))

    named = [i for i, lits in enumerate(literals) if lits]

    def owners(path: str) -> list[int]:
        exact = [i for i in named if path in literals[i]]
        if exact:
            return exact
        base = path.rpartition("/")[2]
        return [i for i in named if base in literals[i]]

    write_owner: dict[str, int] = {}
    for w in writes:
        found = owners(w)
        if not found:
            return None  # a file written through a path we cannot see: feed the cell whole
        write_owner[w] = found[-1]
    reads_of: list[set[str]] = [set() for _ in segments]
    everywhere: set[str] = set()
    for p in read_paths:
        found = owners(p)
        if not found:
            everywhere.add(p)
        for i in found:
            reads_of[i].add(p)
    if read_paths and len(everywhere) == len(read_paths) and not writes:
        return None  # no statement names a read: splitting would change nothing
    parts = [(segment, everywhere | reads_of[i]) for i, segment in enumerate(segments)]
    return parts, write_owner
