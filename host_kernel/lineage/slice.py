"""Program slices: the smallest ordered set of recorded cells whose effects reach an artifact.

Owns computing a :class:`Slice` from the record (read-only, through any ledger)
and writing it as a runnable script or notebook. It does not run anything
(:mod:`host_kernel.host._rederive` does) and decides nothing about acceptance.

The rules (docs/lineage.md, "Slices"):

* **The producing cell** (the cell whose ``host.save_artifact`` saved it).
* **Definitions it uses.** Walking back over the earlier cells of the same kernel
  generation, a cell is kept when it binds or mutates a name a kept cell uses
  (``import pandas as pd``, ``df = pd.read_csv(...)``, ``df['z'] = …``,
  ``np.random.seed(0)``, a ``def`` whose body's free names are used in turn), and
  what it uses is then needed too. A cell that binds names that cannot be listed
  (``%run script.py``, ``from m import *``) is kept when anything is needed.
  Rebinding does not cut here (a name bound twice keeps both cells): a slice may
  hold a cell it does not need, never lack one it does.
* **Files the session made.** Every session-made file among the artifact's inputs,
  and among theirs (the lineage's ``derivations``), brings the cell that wrote it
  (or that ran the ``host.bash`` command that did), with that cell's own slice in
  its generation. An earlier artifact of the same session among the inputs brings
  its producing cell likewise.
* **Inputs** are the files at the leaves: read by the slice, made by nothing in it.
  Their recorded bytes (sha256) are what a re-derivation is given.

Cells are ordered as they ran; ``generation`` says where the kernel restarted.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .._errors import FileProblem
from ..store.ledger import Ledger
from .defuse import BUILTIN_NAMES, CellNames, cell_names
from .knowledge import KERNEL_NAMES, UNKNOWN_NAMES, is_pure

__all__ = ["Slice", "SliceCell", "SliceInput", "compute_slice"]

#: Most cells a slice walks back over, per generation (a bound on a huge session).
MAX_CELLS = 20_000


@dataclass(frozen=True, slots=True)
class SliceCell:
    cell_id: str
    generation: int
    seq: int
    code: str
    status: str  # the status it ended with in the session (ok, error, …)
    why: str  # "saves the artifact", "defines df, pd", "wrote mid.parquet"


@dataclass(frozen=True, slots=True)
class SliceInput:
    path: str
    sha256: str


@dataclass(frozen=True, slots=True)
class Slice:
    artifact_id: str
    filename: str
    source_path: str | None  # where the producing cell saved it from, in the workspace
    sha256: str
    session: str
    cells: tuple[SliceCell, ...]
    inputs: tuple[SliceInput, ...]
    #: inputs the lineage names only by artifact id or sub-task (not re-derivable here)
    unsupported: tuple[str, ...] = ()
    #: how many cells the session ran before the producing cell (for "5 of 50")
    session_cells: int = 0
    notes: tuple[str, ...] = field(default=())
    #: the session-made files the slice writes on its way (and the artifact's own path)
    makes: tuple[str, ...] = ()
    #: files its cells read in the session that are not the artifact's inputs (their bytes
    #: do not reach it, as the lineage found), which the cells still open to run
    context: tuple[SliceInput, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Slice:
        return cls(**{**data, "cells": tuple(SliceCell(**c) for c in data["cells"]),
                      "inputs": tuple(SliceInput(**i) for i in data["inputs"]),
                      "unsupported": tuple(data.get("unsupported", ())),
                      "notes": tuple(data.get("notes", ())),
                      "makes": tuple(data.get("makes", ())),
                      "context": tuple(SliceInput(**i) for i in data.get("context", ()))})

    def __repr__(self) -> str:
        return (f"Slice(artifact_id={self.artifact_id!r}, cells={len(self.cells)} of "
                f"{self.session_cells}, inputs={len(self.inputs)})")

    def _repr_markdown_(self) -> str:
        return "\n".join(f"    {line}" for line in self.to_script().splitlines())

    # -- writing it out

    def header_lines(self) -> list[str]:
        lines = [f"Slice of artifact {self.filename} ({self.artifact_id}), sha256 {self.sha256}",
                 f"{len(self.cells)} of {self.session_cells} cells of session {self.session}; "
                 f"re-derive with: host-kernel rederive {self.artifact_id} --record RECORD"]
        if self.source_path:
            lines.append(f"It is written at: {self.source_path}")
        lines.append("Inputs it needs (path, sha256):" if self.inputs else "Inputs: none")
        lines += [f"  {i.path}  {i.sha256}" for i in self.inputs]
        if self.context:
            lines.append("Also opened by its cells, but not inputs of the artifact (path, "
                         "sha256):")
            lines += [f"  {i.path}  {i.sha256}" for i in self.context]
        lines += [f"Not re-derivable here: {u}" for u in self.unsupported]
        lines += list(self.notes)
        return lines

    def to_script(self) -> str:
        """The slice as a Python script: IPython syntax (``%run``, ``!cmd``) turned into
        ``get_ipython()`` calls, so it runs under ``ipython`` or in a host-kernel kernel
        (cells that call ``host`` need the latter)."""
        from IPython.core.inputtransformer2 import TransformerManager

        transform = TransformerManager().transform_cell  # type: ignore[no-untyped-call]
        # Paths and commands come from the record: kept inside the docstring (backslashes
        # doubled, no closing quotes) and on one line in comments, so none becomes code.
        header = "\n".join(self.header_lines()).replace("\\", "\\\\").replace('"""', "'''")
        out = ['"""' + header + '\n"""', ""]
        if any("host" in cell.code for cell in self.cells):
            out += ["try:", "    host  # in a host-kernel kernel: the Host's own object",
                    "except NameError:  # a plain script: local stand-ins that record nothing",
                    "    from host_kernel.lineage.standalone import host", ""]
        generation = None
        for cell in self.cells:
            if generation is not None and cell.generation != generation:
                out.append("# --- the kernel restarted here (a new generation) ---")
            generation = cell.generation
            out.append(f"# %% cell {cell.cell_id} (generation {cell.generation}): "
                       f"{_one_line(cell.why)}")
            try:
                code = transform(cell.code)
            except Exception:  # noqa: BLE001 - keep the source as it was
                code = cell.code
            out.append(code.rstrip("\n"))
            out.append("")
        return "\n".join(out)

    def to_notebook(self) -> dict[str, Any]:
        """The slice as an nbformat v4 notebook (a markdown cell with the inputs first)."""
        import nbformat

        nb = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
        nb.cells.append(nbformat.v4.new_markdown_cell(  # type: ignore[no-untyped-call]
            "\n".join(["# " + self.header_lines()[0], "", *(
                f"- {line.strip()}" for line in self.header_lines()[1:])])))
        for cell in self.cells:
            code = nbformat.v4.new_code_cell(cell.code)  # type: ignore[no-untyped-call]
            code.metadata["host_kernel"] = {"cell_id": cell.cell_id,
                                            "generation": cell.generation, "why": cell.why}
            nb.cells.append(code)
        nb.metadata["host_kernel"] = {"slice_of": self.artifact_id, "sha256": self.sha256}
        return dict(nb)


def _one_line(text: str) -> str:
    """``text`` with every line break and control character shown escaped."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


@dataclass
class _Cell:
    cell_id: str
    generation: int
    seq: int
    code: str
    status: str = "running"
    names: CellNames | None = None
    #: (path, sha256) of the workspace files it read, as its ``inputs_kept`` recorded
    read: tuple[tuple[str, str], ...] = ()

    def analysed(self) -> CellNames:
        if self.names is None:
            self.names = cell_names(self.code)
        return self.names


def _needs(names: CellNames) -> set[str]:
    out = set(names.used) | set(names.mutated)
    for function in names.functions:
        out |= set(function.when_called) | set(function.when_defined)
    return {n for n in out if n not in KERNEL_NAMES and n != UNKNOWN_NAMES
            and n not in BUILTIN_NAMES}


def _provides(names: CellNames) -> set[str]:
    return set(names.defined) | set(names.mutated)


def compute_slice(ledger: Ledger, artifact_id: str) -> Slice:
    """The slice of ``artifact_id`` from the record; FileProblem when it has no such
    artifact or the artifact's producing cell is not in the record."""
    rows = ledger.query("SELECT * FROM artifacts WHERE artifact_id = ?", (artifact_id,))
    if not rows:
        raise FileProblem(f"no artifact {artifact_id!r} in this record")
    row = rows[0]
    session = row["session"]
    cells = _session_cells(ledger, session)
    by_id = {c.cell_id: c for c in cells}
    if row["cell_id"] not in by_id:
        raise FileProblem(f"the cell that saved artifact {artifact_id!r} is not in the record")
    artifacts = {r["artifact_id"]: r for r in ledger.query(
        "SELECT artifact_id, cell_id, lineage, source_path FROM artifacts WHERE session = ?",
        (session,))}

    why: dict[str, list[str]] = {row["cell_id"]: ["saves the artifact"]}
    targets: list[str] = [row["cell_id"]]
    leaves: dict[tuple[str, str], None] = {}
    unsupported: list[str] = []
    made: set[tuple[str, str]] = set()
    done_artifacts: set[str] = set()

    def lineage_of(aid: str) -> None:
        if aid in done_artifacts:
            return
        done_artifacts.add(aid)
        found = artifacts.get(aid)
        lineage = json.loads(found["lineage"]) if found and found["lineage"] else {}
        derivations = [d for d in lineage.get("derivations", ()) if isinstance(d, dict)]
        if isinstance(lineage.get("written_by"), dict):  # saved from an earlier cell's file
            derivations.insert(0, {"path": found["source_path"] if found else None,
                                   "written_by": lineage["written_by"], "inputs": []})
        for d in derivations:
            writer = d.get("written_by") or {}
            cell = writer.get("cell")
            if isinstance(cell, str) and cell in by_id:
                # remade by the slice; a file an earlier session made stays an input
                made.add((str(d.get("path")), str(d.get("sha256"))))
                what = f"wrote {d.get('path')}" + (
                    f" (with $ {writer['command']})" if writer.get("command") else "")
                why.setdefault(cell, []).append(what)
                targets.append(cell)
        items = [*lineage.get("inputs", ()), *(
            i for d in derivations for i in d.get("inputs", ()))]
        for item in items:
            if not isinstance(item, dict):
                continue
            if item.get("artifact_id"):
                upstream = artifacts.get(item["artifact_id"])
                if upstream is not None and upstream["cell_id"] in by_id \
                        and upstream["source_path"]:
                    why.setdefault(upstream["cell_id"], []).append(
                        f"saved artifact {item['artifact_id']}")
                    targets.append(upstream["cell_id"])
                    lineage_of(item["artifact_id"])
                else:
                    unsupported.append(f"artifact {item['artifact_id']}")
            elif item.get("handle"):
                unsupported.append(f"sub-task {item['handle']}")
            elif isinstance(item.get("path"), str) and isinstance(item.get("sha256"), str):
                leaves.setdefault((item["path"], item["sha256"]), None)

    lineage_of(artifact_id)
    trimmed: dict[str, tuple[set[str], str]] = {}
    kept = _close_over_definitions(cells, by_id, targets, why, trimmed)
    ordered = sorted(kept, key=lambda cid: by_id[cid].seq)
    inputs = tuple(SliceInput(p, s) for (p, s) in leaves if (p, s) not in made)
    named = {i.path for i in inputs} | {p for p, _ in made}
    context = tuple(SliceInput(p, s) for p, s in dict.fromkeys(
        r for cid in ordered for r in by_id[cid].read) if p not in named)
    producing = by_id[row["cell_id"]]
    return Slice(
        artifact_id=artifact_id, filename=row["filename"], source_path=row["source_path"],
        sha256=row["sha256"], session=session,
        cells=tuple(SliceCell(c.cell_id, c.generation, c.seq,
                              trimmed[c.cell_id][1] if c.cell_id in trimmed else c.code,
                              c.status,
                              "; ".join(dict.fromkeys(why.get(c.cell_id, ["defines names"]))))
                    for c in (by_id[cid] for cid in ordered)),
        inputs=inputs, context=context, unsupported=tuple(dict.fromkeys(unsupported)),
        makes=tuple(dict.fromkeys([*(p for p, _ in made if p != "None"),
                                   *([row["source_path"]] if row["source_path"] else [])])),
        session_cells=sum(1 for c in cells if c.seq <= producing.seq))


def _session_cells(ledger: Ledger, session: str) -> list[_Cell]:
    cells: dict[str, _Cell] = {}
    for r in ledger.query("SELECT seq, kind, body FROM events WHERE session = ? AND kind IN "
                          "('cell_started', 'cell_finished') ORDER BY seq", (session,)):
        body = json.loads(r["body"])
        cid = body.get("cell_id")
        if not isinstance(cid, str):
            continue
        if r["kind"] == "cell_started":
            code = body.get("code")
            cells[cid] = _Cell(cid, int(body.get("generation") or 0), int(r["seq"]),
                               code if isinstance(code, str) else "")
        elif cid in cells:
            cells[cid].status = str(body.get("status"))
            kept = body.get("inputs_kept")
            if isinstance(kept, dict):
                cells[cid].read = tuple(
                    (str(e[0]), str(e[1])) for key in ("kept", "by_hash_only")
                    for e in kept.get(key, ()) if isinstance(e, list) and len(e) >= 2)
    return list(cells.values())


def _dotted(node: ast.expr) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        parts.append(_dotted(node.func) + "()")
    return ".".join(reversed(parts))


def _side_effect(stmt: ast.stmt) -> bool:
    """A statement kept for what it does rather than what it binds: a call on its own
    (``threading.Thread(target=f).start()``, ``os.chdir(d)``) that is not known to be
    pure (``print``, ``len``)."""
    if not isinstance(stmt, ast.Expr):
        return False
    value = stmt.value.value if isinstance(stmt.value, ast.Await) else stmt.value
    return isinstance(value, ast.Call) and not is_pure(_dotted(value.func))


def _statements_for(code: str, wanted: set[str]) -> tuple[str, set[str]]:
    """The top-level statements of ``code`` that bind or change a ``wanted`` name, and
    those before them whose bindings they use, in order; with the names they need from
    earlier cells. The whole cell when it is not plain Python (magics) or has one
    statement."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code, _needs(cell_names(code))
    if len(tree.body) < 2:
        return code, _needs(cell_names(code))
    local = set(wanted)
    keep: list[ast.stmt] = []
    for stmt in reversed(tree.body):
        segment = ast.get_source_segment(code, stmt, padded=False) or ""
        names = cell_names(segment)
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) and not names.defined & local:
            continue
        if not (_provides(names) & local) and not _side_effect(stmt):
            continue
        keep.append(stmt)
        local |= _needs(names)
    keep.reverse()
    text = "\n".join(ast.get_source_segment(code, s) or "" for s in keep)
    return text, _needs(cell_names(text))


def _close_over_definitions(cells: list[_Cell], by_id: dict[str, _Cell],
                            targets: Iterable[str], why: dict[str, list[str]],
                            trimmed: dict[str, tuple[set[str], str]]) -> set[str]:
    """Every target and, per generation, the earlier cells whose bindings they use (only
    the statements that make them, recorded in ``trimmed``: cell id → (names, code))."""
    kept: set[str] = set()
    queue = list(dict.fromkeys(targets))
    by_generation: dict[int, list[_Cell]] = {}
    for c in cells:
        by_generation.setdefault(c.generation, []).append(c)
    while queue:
        start = by_id[queue.pop(0)]
        if start.cell_id in kept and start.cell_id not in trimmed:
            continue
        kept.add(start.cell_id)
        trimmed.pop(start.cell_id, None)  # a target runs whole
        needed = _needs(start.analysed())
        provided: set[str] = set(start.analysed().defined)
        unknown: list[_Cell] = []
        earlier = [c for c in by_generation[start.generation] if c.seq < start.seq]
        for cell in reversed(earlier[-MAX_CELLS:]):
            names = cell.analysed()
            hit = _provides(names) & needed
            if UNKNOWN_NAMES in names.mutated or UNKNOWN_NAMES in names.defined:
                unknown.append(cell)
            if not hit:
                continue
            if cell.cell_id in kept and cell.cell_id not in trimmed:
                provided |= hit | set(names.defined)
                needed |= _needs(names)
                continue
            # kept for its definitions only: just the statements that make them
            wanted = hit | set(trimmed.get(cell.cell_id, (set(), ""))[0])
            code, used = _statements_for(cell.code, wanted)
            trimmed[cell.cell_id] = (wanted, code)
            if cell.cell_id not in kept:
                why.setdefault(cell.cell_id, []).append("defines " + ", ".join(sorted(hit)[:6]))
                kept.add(cell.cell_id)
            provided |= hit | set(cell_names(code).defined)
            needed |= used
        # A name no cell is known to bind may come from one that binds names it cannot
        # list (%run, a star import): keep those whole, and what they use.
        if needed - provided - BUILTIN_NAMES:
            for cell in unknown:
                if cell.cell_id not in kept or cell.cell_id in trimmed:
                    why.setdefault(cell.cell_id, []).append("may define " + ", ".join(
                        sorted(needed - provided - BUILTIN_NAMES)[:6]))
                    queue.append(cell.cell_id)  # whole, its own definitions walked from it
    return kept
