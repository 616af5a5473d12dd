"""The Host's side of dataflow provenance: turning what it saw into artifact lineage.

Owns the session's :class:`~host_kernel.lineage.flow.FlowTracker` and feeds it,
in order: each finished cell (the files the kernel's audit hook saw it read
and write, plus the Host's own reads and writes for it and the artifacts it
loaded), and each ``host.bash`` receipt (the files the command changed, linked
to the receipt and to the workspace files its command line names). At
``save_artifact`` it answers which inputs flowed into the file, hashing each
input file as it is then (``hashed_at`` says when: at the end of the reading
cell, or at save time for reads in the saving cell itself). A read of a file
that still holds the bytes of an artifact loaded there becomes that artifact.

It does not decide trust: reads reported by the kernel are lineage evidence
only (docs/lineage.md), never acceptance evidence.
"""

from __future__ import annotations

import ast
import os
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..lineage.flow import OBSERVED, RECEIPT, FlowTracker, Source, file_key
from ._workspace import HashCache, Workspace, cached_sha256, file_sha256

__all__ = ["CellIO", "SessionLineage"]

#: Most files named on one command line that are linked as its inputs.
MAX_COMMAND_INPUTS = 50


@dataclass
class CellIO:
    """What the Host itself did for one running cell (the kernel cannot see these)."""

    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    loads: list[tuple[str, str, str]] = field(default_factory=list)  # artifact, path, sha


class SessionLineage:
    def __init__(self, workspace: Workspace, hash_cache: HashCache | None = None) -> None:
        self.workspace = workspace
        self.hash_cache = {} if hash_cache is None else hash_cache
        self.tracker = FlowTracker()
        #: path → (artifact id, sha256) of an artifact materialised there by load_artifact
        self.materialised: dict[str, tuple[str, str]] = {}
        #: (key, sha256) → when it was hashed: "cell_end" or "save"
        self.hashed_at: dict[tuple[str, str | None], str] = {}
        self.receipts: dict[str, dict[str, Any]] = {}

    # -- feeding

    def _sources(self, cell_id: str, reads: Iterable[str], io: CellIO, when: str
                 ) -> list[tuple[str, Source]]:
        """(path it was read at, source) for each direct read of the cell."""
        out: list[tuple[str, Source]] = []
        for artifact_id, path, sha in io.loads:
            out.append((path, Source(f"artifact:{artifact_id}", OBSERVED, cell_id, sha)))
        for rel in dict.fromkeys([*reads, *io.reads]):
            found = cached_sha256(self.workspace.root, rel, self.hash_cache)
            if found is None:
                continue  # opened but gone, or a failed open
            loaded = self.materialised.get(rel)
            if loaded is not None and loaded[1] == found:
                source = Source(f"artifact:{loaded[0]}", OBSERVED, cell_id, found)
            else:
                source = Source(file_key(rel), OBSERVED, cell_id, found)
            self.hashed_at.setdefault(source.identity, when)
            out.append((rel, source))
        return out

    @staticmethod
    def _access(access: Any) -> tuple[list[str], list[str], list[tuple[str, str]], list[str]]:
        if not isinstance(access, dict):
            return [], [], [], []

        def strs(key: str) -> list[str]:
            value = access.get(key)
            return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

        renames = [(a, b) for a, b in (r for r in access.get("renames", [])
                                       if isinstance(r, list) and len(r) == 2)
                   if isinstance(a, str) and isinstance(b, str)]
        return strs("reads"), strs("writes"), renames, strs("removes")

    def new_generation(self) -> None:
        self.tracker.forget_names()

    def cell_finished(self, cell_id: str, code: str, access: Any, io: CellIO) -> None:
        reads, writes, renames, removes = self._access(access)
        writes = list(dict.fromkeys([*writes, *io.writes, *(p for _, p, _ in io.loads)]))
        for artifact_id, path, sha in io.loads:
            self.materialised[path] = (artifact_id, sha)
        sources = self._sources(cell_id, reads, io, "cell_end")
        for rel in writes:
            loaded = self.materialised.get(rel)
            root = self.workspace.root
            if loaded is not None and file_sha256(root / rel, root=root) != loaded[1]:
                del self.materialised[rel]
        loaded_paths = {p for _, p, _ in io.loads}
        observe(self.tracker, cell_id, code, sources,
                [w for w in writes if w not in loaded_paths], renames, removes)

    def receipt(self, cell_id: str, body: dict[str, Any]) -> None:
        """A command ran: the files it created or changed come from it and its named inputs."""
        self.receipts[body["receipt_id"]] = body
        changed = {c["path"] for c in body.get("changes", ())}
        inputs = [s for s in self._command_inputs(cell_id, body, changed)]
        for change in body.get("changes", ()):
            if change["change"] == "deleted":
                self.tracker.forget_file(change["path"])
                self.materialised.pop(change["path"], None)
            else:
                self.tracker.note_receipt_write(change["path"], body["receipt_id"], inputs,
                                                cell_id=cell_id)

    def _command_inputs(self, cell_id: str, body: dict[str, Any],
                        changed: set[str]) -> list[Source]:
        try:
            words = shlex.split(body["command"], comments=True)
        except ValueError:
            words = body["command"].split()
        cwd = Path(body["cwd"])
        out: list[Source] = []
        for word in words[:500]:
            if word.startswith("-") or "=" in word and not word.startswith(("./", "/")):
                continue
            real = (cwd / word).resolve() if not word.startswith("/") else Path(word).resolve()
            if not self.workspace.contains(real) or self.workspace.in_record(real) \
                    or not real.is_file():
                continue
            rel = self.workspace.relative(real)
            if rel in changed:
                continue
            sha = file_sha256(real, root=self.workspace.root)
            loaded = self.materialised.get(rel)
            key = f"artifact:{loaded[0]}" if loaded and loaded[1] == sha else file_key(rel)
            source = Source(key, RECEIPT, cell_id, sha)
            self.hashed_at.setdefault(source.identity, "command_end")
            out.append(source)
            if len(out) >= MAX_COMMAND_INPUTS:
                break
        return out

    # -- asking

    def inputs_at_save(self, cell_id: str, code: str, rel: str, partial_access: Any,
                       io: CellIO) -> dict[str, Any]:
        """The lineage record for a file saved now, from the cell that is running."""
        reads, writes, renames, removes = self._access(partial_access)
        written_now = rel in writes or rel in io.writes
        for artifact_id, path, sha in io.loads:
            self.materialised.setdefault(path, (artifact_id, sha))
        if written_now:
            fork = self.tracker.fork()
            sources = self._sources(cell_id, reads, io, "save")
            observe(fork, cell_id, code, sources, list(dict.fromkeys([*writes, *io.writes])),
                    renames, removes)
            found: Sequence[Source] = fork.inputs_for_file(rel)
            truncated = fork.is_truncated(rel)
        else:
            found = self.tracker.inputs_for_file(rel)
            truncated = self.tracker.is_truncated(rel)
        loaded = self.materialised.get(rel)
        if loaded is not None and not written_now and loaded[1] == file_sha256(
                self.workspace.root / rel, root=self.workspace.root):
            # Saving a materialised artifact again: its input is that artifact.
            found = [Source(f"artifact:{loaded[0]}", OBSERVED, cell_id, loaded[1])]
        return {"inputs": [self._item(s) for s in found], "truncated": truncated}

    def _item(self, s: Source) -> dict[str, Any]:
        kind, _, rest = s.key.partition(":")
        item: dict[str, Any] = {"key": s.key, "method": s.method, "via_cell": s.via_cell}
        if kind == "file":
            item.update(path=rest, sha256=s.sha256,
                        hashed_at=self.hashed_at.get(s.identity, "cell_end"))
        elif kind == "artifact":
            item.update(artifact_id=rest, sha256=s.sha256)
        elif kind == "receipt":
            body = self.receipts.get(rest, {})
            item.update(receipt_id=rest, command=body.get("command"),
                        exit_status=body.get("exit_status"))
        return item


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


def confirm_with_llm(llm: Any, code: str, lineage: dict[str, Any]) -> dict[str, Any]:
    """Ask the dataflow-provenance prompt which candidates flowed in; it may only narrow.

    Kept inputs are marked ``llm-confirmed``; names that are not candidates are
    discarded and recorded; an unusable answer or a failed call leaves the
    candidates as they were and says why.
    """
    from ..prompts import PromptAnswerError, render, restrict_to_candidates

    candidates = [item["key"] for item in lineage["inputs"]]
    try:
        answer = render("dataflow_provenance", code, llm, candidates=candidates)
        kept, discarded = restrict_to_candidates(answer, candidates)
    except PromptAnswerError as exc:
        return lineage | {"llm": {"error": f"unusable answer: {exc}"}}
    except Exception as exc:  # noqa: BLE001 - the LLM is optional; lineage stands without it
        return lineage | {"llm": {"error": f"{type(exc).__name__}: {exc}"}}
    kept_set = set(kept)
    inputs = [dict(item, method="llm-confirmed") for item in lineage["inputs"]
              if item["key"] in kept_set]
    dropped = [item["key"] for item in lineage["inputs"] if item["key"] not in kept_set]
    return lineage | {"inputs": inputs, "llm": {"kept": kept, "dropped": dropped,
                                                  "discarded_non_candidates": discarded}}
