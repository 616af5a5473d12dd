"""Feeding one cell to the flow tracker in pieces, so that reads reach only what they fed.

Owns the split of a cell into the pieces whose reads and writes can be told
apart (``host_kernel.lineage.flow`` takes a cell as its unit), from the
cell's code and the paths it read and wrote, which arrive without saying
which statement made them. Pure: no I/O (a ``%run`` script's text comes from
the caller's ``source_of``).

The rules:

* **Pieces.** Each top-level statement is a piece, cut at its own source
  segment (several statements on one line are several pieces; a decorated
  definition keeps its decorators). A top-level ``for``/``while`` is cut
  further: its header is a piece (binding the loop target), and each
  statement of its body is a piece fed as *conditional* (it may run zero or
  many times: what it binds keeps its old taint and gains the new), which
  also uses the names the header reads (the loop's control), and the body is
  fed several times so that values carried from one iteration to the next
  are followed. Nested loops are cut the same way. A ``for`` over a short
  display of constants (``for name in ['a', 'b']:``), or over a name bound
  to one (``names = ['a', 'b']``, in this cell or an earlier one, and not
  touched by the body), is unrolled instead: each iteration's pieces see the
  target's own value, so ``f'out/{name}.txt'`` names one file per iteration
  and ``d[name] = ...`` stores at one key, and they rebind as usual (they are
  conditional only if the body can ``break``, ``continue``, ``return`` or
  ``raise``).
* **Containers by key** (``host_kernel.lineage.keys``; the tracker keeps a
  taint per key, see ``flow``). ``d = {'a': x, 'b': y}``, ``l = [x, y]``
  and a dict or list comprehension with one generator over such literals
  (``{n: pd.read_csv(f'{n}.csv') for n in names}``; a list comprehension
  without a condition) are fed as a piece binding a fresh container (what
  the generator and its conditions read) and one store per key with the
  variable's value written in (``d['a'] = pd.read_csv(f"{'a'}.csv")``),
  conditional when the comprehension has a condition; a display of literals
  alone, or one that reads the name it binds, is fed as it is. A name
  known to hold a literal (bound to it at the top level of this cell or an
  earlier one, or an unrolled loop's target) is written into the subscript
  keys of a piece (``d[name]`` becomes ``d['oslo']``), outside nested
  scopes and unless the piece rebinds it.
* **Which piece read a path.** Each piece names path *patterns*: the
  arguments and receivers of its calls, evaluated statically with the
  bindings made earlier in the cell (``host_kernel.lineage.paths``:
  literals, f-strings, ``os.path.join``, ``Path(d) / 'x.csv'``, a variable
  holding a path, ``glob`` patterns, the target of a ``for`` over a glob).
  What names hold is carried from cell to cell (``paths.PathState``, kept
  by the tracker): forgotten when a cell rebinds a name otherwise, deletes
  or changes it (a literal stays), or when a function the session defined
  may rebind it (``global``).
  A pattern with a part that cannot be known (``f'data/{run}.csv'`` with
  ``run`` unknown) names one file: in a piece that runs once it
  leaves out the files another piece names exactly, unless it would then
  match nothing (a glob keeps them all).
  A read belongs to the pieces whose patterns match it, to the import
  statements whose module the file holds (``knowledge.module_files_match``),
  and to the statements of a ``%run`` script when it is the script itself.
  A read that matches a pattern inside a function body belongs to the
  definition and every piece after it (the function may be called there). A
  read no piece names belongs to every piece. A piece that binds, changes
  and writes nothing carries nothing on: a read it names by giving the path
  to a call that reads it (``open``, ``pd.read_csv``, names starting with
  ``read``/``load``: ``knowledge.reads_named_path``) or to a call whose
  result is used (``print(describe(p))``), exactly or as the one file the
  pattern matches, stays with it (``print(open(p).read())``,
  ``logging.info(...)`` beside the real computation); a read such a piece
  only names (``os.symlink(os.path.abspath('a.csv'), ln)``,
  ``print(os.path.getsize(p))``: ``knowledge.PATH_ONLY_CALLS``) and no
  other piece names belongs to every piece, since its bytes went somewhere
  the patterns cannot see.
* **Which piece wrote a path.** The pieces whose patterns match it, then
  every later piece that uses a name bound or mutated by one of them
  (``fh = open('o', 'w')`` then ``fh.write(data)``; after a store at a key,
  ``h['o'] = open('o', 'w')``, the container). A file written by
  several pieces gets the union of their inputs (``continues``). A written
  path no piece names is given to every piece, which amounts to the whole
  cell's reads for that file.
* **Magics.** IPython syntax is turned into Python first
  (``defuse.ipython_to_python``); a non-Python cell magic is fed whole.
  ``%run script.py`` (with options such as ``-i``) at the top level is
  replaced by the script's statements when ``source_of`` returns its text
  (IPython binds the script's top-level names in the user namespace); their
  pieces then behave as if the cell had them. Without ``source_of``, or when
  the script is unknown or does not parse, ``%run`` binds unknown names: the
  pseudo-name ``knowledge.UNKNOWN_NAMES`` gets the piece's taint and any
  name never seen bound gets it when used (see ``flow``). ``%run -m``
  counts as unknown. ``%time``/``%%time``/``%%capture`` bodies are
  analysed as Python.
* A cell that does not parse, or that makes a single piece, is fed whole.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace

from .defuse import RUN_MODULE, CellNames, cell_names, ipython_to_python
from .flow import FlowTracker, Source
from .keys import split_build, with_constant_keys
from .knowledge import (
    PATH_ONLY_CALLS,
    PURE_MODULES,
    UNKNOWN,
    UNKNOWN_NAMES,
    module_files_match,
    reads_named_path,
)
from .paths import Constant, PathEnv, PathState

__all__ = ["Prepared", "observe", "prepare"]

#: host calls whose path argument names a file without reading or writing its bytes here.
_NOT_IO = frozenset({"save_artifact", "lineage", "artifacts"})
#: a loop's body is fed at most this many times
_MAX_PASSES = 3
#: more pieces than this: loops are not cut
_MAX_PIECES = 400
#: a loop over at most this many constants is cut iteration by iteration
_MAX_UNROLLED = 8
#: pieces times reads beyond which the cell is fed whole (matching would be slow)
_MAX_WORK = 2_000_000
_RUN_CALL = "__host_kernel_run_script__"

SourceOf = Callable[[str], "str | None"]


@dataclass
class _Piece:
    code: str
    patterns: set[str] = field(default_factory=set)
    #: patterns named inside function bodies: the function may be called later
    deferred: set[str] = field(default_factory=set)
    modules: set[str] = field(default_factory=set)
    script: str | None = None
    conditional: bool = False
    #: patterns given to calls that read them (``open(p)``) or whose result is used
    reading: set[str] = field(default_factory=set)


@dataclass
class Prepared:
    """What :func:`observe` learns from a cell's code alone (:func:`prepare`), used once if
    the tracker's names are still those it saw and no ``%run`` script was read."""
    code: str
    start: PathState
    aliases: dict[str, str]
    pieces: list[_Piece] | None
    whole: str
    carried: PathState
    names: CellNames | None  # the whole cell's, when it is fed whole
    read_scripts: bool


def prepare(tracker: FlowTracker, code: str, source_of: SourceOf | None = None) -> Prepared:
    """The code-only part of :func:`observe`, which changes nothing in ``tracker``."""
    start, aliases = tracker.path_state, tracker.aliases()
    pieces, whole, env = _pieces(code, source_of, start)
    names = cell_names(whole, modules=aliases) if pieces is None or len(pieces) < 2 else None
    # ``whole`` is another string only when a %run line was replaced (its script was asked for)
    return Prepared(code, start, aliases, pieces, whole, _carried(whole, env, start), names,
                    whole is not code)


def observe(tracker: FlowTracker, cell_id: str, code: str, sources: list[tuple[str, Source]],
            writes: list[str], renames: list[tuple[str, str]], removes: list[str], *,
            source_of: SourceOf | None = None, prepared: Prepared | None = None) -> None:
    """Feed one cell to the tracker, in pieces where the code says which read went where.

    ``sources``: (path as read, source) for each direct read of the cell;
    ``writes``: the workspace paths it wrote; ``renames``/``removes`` as for
    :meth:`FlowTracker.observe_cell`. ``source_of(path)`` returns the text of
    a workspace file named by ``%run`` (the path as written in the magic,
    relative to the kernel's working directory) or ``None``; without it
    ``%run`` binds unknown names (see the module docstring). ``prepared``: this
    cell's :func:`prepare`, used when it still holds.
    """
    if (prepared is None or prepared.read_scripts or prepared.code != code
            or prepared.start != tracker.path_state
            or prepared.aliases != tracker.aliases()):
        prepared = prepare(tracker, code, source_of)
    pieces, whole, tracker.path_state = prepared.pieces, prepared.whole, prepared.carried
    if pieces is None or len(pieces) < 2 or len(pieces) * len(sources) > _MAX_WORK:
        tracker.observe_cell(cell_id, whole, [s for _, s in sources], writes,
                             renames=renames, removes=removes, names=prepared.names)
        return
    read_paths = list(dict.fromkeys(p for p, _ in sources))
    writes_of = _writes_of(pieces, writes)
    reads_of = _reads_of(pieces, read_paths, _sinks(pieces, writes_of, tracker.module_names()))
    last = len(pieces) - 1
    every = [s for _, s in sources]
    for i, piece in enumerate(pieces):
        # Each piece's reads are some of read_paths: as many means all of them.
        mine = (every if len(reads_of[i]) == len(read_paths)
                else [s for (p, s) in sources if p in reads_of[i]])
        tracker.observe_cell(
            cell_id, piece.code, mine,
            [w for w in writes if i in writes_of[w]],
            renames=renames if i == last else (), removes=removes if i == last else (),
            continues=i > 0, conditional=piece.conditional)


def _carried(whole: str, env: PathEnv | None, before: PathState) -> PathState:
    """What names hold as paths and literals after the cell, for the next cell: what the
    cell bound that way; what it rebound otherwise, changed or deleted is forgotten."""
    names = cell_names(whole)
    if names.parse_error or UNKNOWN_NAMES in names.mutated:
        return PathState()  # names rebound that cannot be listed
    # what the functions it defines change when called later
    volatile = before.volatile.union(*(f.changes for f in names.functions))
    if env is None:
        return replace(before, volatile=volatile).without(
            names.defined | names.deleted | names.mutated)
    state = env.state(volatile).without((names.defined - env.assigned) | names.deleted)
    # a change reaches no literal (str, int), only a list of paths
    lists = state.without(names.mutated)
    return PathState(lists.values, state.constants, lists.elements, volatile)


# -- attribution ------------------------------------------------------------------


class _Matcher:
    """Which of a cell's paths each pattern written in the cell matches.

    ``*`` (and ``knowledge.UNKNOWN``) stand for any run of characters; a
    pattern may be relative to a folder below the workspace root, so
    ``a.csv`` matches ``data/a.csv``. Plain patterns are looked up by the
    file name they end with (a table built at the first such lookup, so a cell
    of ten thousand reads and no plain pattern builds none), the others matched
    with one compiled regex each.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(dict.fromkeys(paths))
        self._cache: dict[str, frozenset[str]] = {}
        self._by_name: dict[str, list[str]] | None = None

    def _named(self, query: str) -> frozenset[str]:
        """The paths equal to ``query`` or ending with ``/`` and it (whole names only)."""
        if self._by_name is None:
            self._by_name = {}
            for path in self.paths:
                self._by_name.setdefault(path[path.rfind("/") + 1:], []).append(path)
        below = "/" + query
        return frozenset(p for p in self._by_name.get(query[query.rfind("/") + 1:], ())
                         if p == query or p.endswith(below))

    def __call__(self, pattern: str) -> frozenset[str]:
        found = self._cache.get(pattern)
        if found is None:
            found = self._match(pattern)
            self._cache[pattern] = found
        return found

    def _match(self, pattern: str) -> frozenset[str]:
        query = pattern.replace(UNKNOWN, "*").removeprefix("./")
        if not any(c in query for c in "*?["):
            return self._named(query)
        if not query.strip("*"):
            return frozenset(self.paths)  # a run of anything: every path (a loop's target)
        whole = re.compile(fnmatch.translate(query))
        below = re.compile(fnmatch.translate("*/" + query))
        # Whichever way it matches, a path holds the pattern's text before its first
        # wildcard and ends with the text after its last: a cheap test first.
        head = query[:min(query.find(c) % (len(query) + 1) for c in "*?[")]
        tail = query[max(query.rfind(c) for c in "*?]") + 1:]
        return frozenset(p for p in self.paths if head in p and p.endswith(tail)
                         and (whole.match(p) or below.match(p)))

    def any_of(self, patterns: Iterable[str]) -> set[str]:
        found: set[str] = set()
        for pattern in patterns:
            found |= self(pattern)
        return found


def _plain(pattern: str) -> bool:
    return not any(c in pattern for c in "*?[" + UNKNOWN)


def _single(pattern: str) -> bool:
    """A pattern for one file whose name is partly unknown (not a glob)."""
    return UNKNOWN in pattern and not any(c in pattern for c in "*?[")


def _deferred(pieces: Sequence[_Piece], match: _Matcher) -> dict[str, int]:
    """Path -> the first piece defining a function whose body names it."""
    first: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        for path in match.any_of(piece.deferred):
            first.setdefault(path, i)
    return first


def _sinks(pieces: Sequence[_Piece], writes_of: dict[str, set[int]],
           imported: AbstractSet[str] = frozenset()) -> set[int]:
    """Pieces that can carry nothing on: they bind, change and write nothing
    (``print(open(p).read())``, ``os.symlink(os.path.abspath('a.csv'), ln)``);
    ``imported``: names earlier cells bound to modules."""
    writing = set().union(*writes_of.values()) if writes_of else set()
    analysed = [cell_names(piece.code) for piece in pieces]
    # A call on a module (``os.symlink(...)``) is not a change of anything that holds data.
    modules = set(PURE_MODULES).union(imported, *({i[0] for i in names.imports}
                                                  for names in analysed))
    return {i for i, names in enumerate(analysed)
            if i not in writing and not names.defined and names.mutated <= modules}


def _reads_of(pieces: Sequence[_Piece], read_paths: list[str],
              sinks: AbstractSet[int] = frozenset()) -> list[set[str]]:
    match = _Matcher(read_paths)
    exact: dict[str, set[int]] = {}
    for i, piece in enumerate(pieces):
        for path in match.any_of(q for q in piece.patterns if _plain(q)):
            exact.setdefault(path, set()).add(i)
    modules = {m for piece in pieces for m in piece.modules}
    module_files = {m: {p for p in match.paths if module_files_match(m, p)} for m in modules}
    reads_of: list[set[str]] = [set() for _ in pieces]
    for i, piece in enumerate(pieces):
        for pattern in piece.patterns:
            matched: set[str] = set(match(pattern))
            if matched and _single(pattern) and not piece.conditional:
                # one file, run once: not one another statement names exactly, if it can
                unclaimed = {p for p in matched if not exact.get(p, set()) - {i}}
                matched = unclaimed or matched
            reads_of[i] |= matched
        if piece.script:
            reads_of[i] |= match(piece.script)
        for module in piece.modules:
            reads_of[i] |= module_files[module]
    for path, start in _deferred(pieces, match).items():
        for i in range(start, len(pieces)):
            reads_of[i].add(path)
    # A read no piece names, or named only by pieces that carry nothing on without reading
    # it, belongs to every piece: its bytes went somewhere the patterns cannot see. One a
    # piece that carries nothing on reads itself (``print(open(p).read())``) stays there.
    owned = set().union(*(reads for i, reads in enumerate(reads_of) if i not in sinks))
    for i in sinks:
        for pattern in pieces[i].reading:
            claimed = match(pattern)
            if _plain(pattern) or len(claimed) == 1:
                owned |= claimed
    for path in match.paths:
        if path not in owned:
            for reads in reads_of:
                reads.add(path)
    return reads_of


def _writes_of(pieces: Sequence[_Piece], writes: list[str]) -> dict[str, set[int]]:
    match = _Matcher(writes)
    named: dict[str, set[int]] = {}
    for i, piece in enumerate(pieces):
        for path in match.any_of(piece.patterns):
            named.setdefault(path, set()).add(i)
    for path, start in _deferred(pieces, match).items():
        named.setdefault(path, set()).update(range(start, len(pieces)))
    analysed: dict[int, CellNames] = {}
    out: dict[str, set[int]] = {}
    for path in writes:
        owners = set(named.get(path, ()))
        if not owners:
            out[path] = set(range(len(pieces)))
            continue
        carried: set[str] = set()
        for i in range(min(owners), len(pieces)):
            names = analysed.get(id(pieces[i]))
            if names is None:
                names = analysed[id(pieces[i])] = cell_names(pieces[i].code)
            if i in owners or names.used & carried or names.mutated & carried:
                owners.add(i)
                carried |= names.defined
                if names.key_store is not None and names.key_store[2]:
                    carried.add(names.key_store[0])  # ``d['a'] = open('a.txt', 'w')``
        out[path] = owners
    return out


# -- cutting the cell -------------------------------------------------------------


def _pieces(code: str, source_of: SourceOf | None, start: PathState
            ) -> tuple[list[_Piece] | None, str, PathEnv | None]:
    """The pieces of a cell, or ``None`` with the code to feed whole; and what names hold
    after it (``start``: what they held before)."""
    try:
        tree, python = ast.parse(code), code  # plain Python: a "%run" line is in a string
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        converted = ipython_to_python(_mark_runs(code))
        if converted is None:
            return None, code, None
        try:
            tree, python = ast.parse(converted), converted
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None, code, None
    units: list[tuple[ast.stmt, str, str | None]] = []
    inlined = False
    for node in tree.body:
        script = _run_target(node)
        if script is None:
            units.append((node, python, None))
            continue
        body = _script_body(script, source_of)
        if body is None:
            units.append((ast.ImportFrom(module=RUN_MODULE, names=[ast.alias(name="*")],
                                         level=0), "", None))
            inlined = True
            continue
        text, statements = body
        units.extend((stmt, text, script) for stmt in statements)
        inlined = True
    whole = ast.unparse(ast.Module(body=[u for u, _, _ in units], type_ignores=[])) \
        if inlined else code
    for passes in (_MAX_PASSES, 1, 0):
        cutter = _Cutter(passes, start)
        try:
            for node, text, script in units:
                cutter.top(node, text, script)
        except RecursionError:
            return None, whole, None
        if len(cutter.pieces) <= _MAX_PIECES:
            return cutter.pieces, whole, cutter.env
    return None, whole, cutter.env


def _mark_runs(code: str) -> str:
    """Top-level ``%run`` lines of a cell that is not plain Python become calls that
    :func:`_run_target` recognises."""
    lines = code.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("%run ") or line == "%run":
            lines[i] = f"{_RUN_CALL}({line[5:].strip()!r})"
    return "\n".join(lines)


def _run_target(node: ast.stmt) -> str | None:
    """The script of a marked ``%run`` line ("" when it cannot be a workspace file)."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == _RUN_CALL):
        return None
    arg = node.value.args[0] if node.value.args else None
    text = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else ""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    for word in words:
        if word == "-m":
            return ""
        if not word.startswith("-"):
            return word
    return ""


def _script_body(path: str, source_of: SourceOf | None) -> tuple[str, list[ast.stmt]] | None:
    if not path or source_of is None:
        return None
    text = source_of(path)
    if text is None:
        return None
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return text, tree.body


class _Cutter:
    """Walks the statements in order, with the path bindings made so far."""

    def __init__(self, passes: int, start: PathState | None = None) -> None:
        self.passes = passes
        self.env = PathEnv(start)
        self.pieces: list[_Piece] = []
        # the call whose result the statement being visited discards
        self._discarded: ast.AST | None = None

    def top(self, node: ast.stmt, text: str, script: str | None) -> None:
        if self.passes and isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            self.pieces.extend(self._loop(node, text, script, "", False))
            return
        split = split_build(node, self.env.elements_of) if self.passes else None
        if split is not None:
            # a container built from literals' values: a fresh one, then a store per key
            bound, stores, conditional = split
            self.pieces.append(self._piece(bound, ast.unparse(bound), script, certain=True))
            for store in stores:
                piece = self._piece(store, ast.unparse(store), script)
                piece.conditional = conditional
                self.pieces.append(piece)
            return
        self.pieces.append(self._piece(node, _segment(text, node, top=True), script,
                                       certain=True))

    def _loop(self, node: ast.For | ast.AsyncFor | ast.While, text: str,
              script: str | None, control: str, conditional: bool) -> list[_Piece]:
        header: ast.stmt
        if isinstance(node, ast.While):
            header = ast.While(test=node.test, body=[ast.Pass()], orelse=[])
            reads: ast.AST = node.test
        else:
            header = type(node)(target=node.target, iter=node.iter, body=[ast.Pass()],
                                orelse=[], type_comment=None)
            reads = node.iter
        ast.copy_location(header, node)
        ast.fix_missing_locations(header)
        values = self._constant_elements(node)
        head = self._piece(header, control + ast.unparse(header), script)
        head.conditional = conditional
        if values is not None and not conditional and not isinstance(node, ast.While):
            return [head, *self._unrolled(node, values, text, script, control)]
        loaded = sorted({n.id for n in ast.walk(reads)
                         if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)})
        inner = control + (f"({', '.join(loaded)},)\n" if loaded else "")
        body: list[_Piece] = []
        for stmt in node.body:
            if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                body.extend(self._loop(stmt, text, script, inner, True))
            else:
                piece = self._piece(stmt, _segment(text, stmt, top=False), script, prefix=inner)
                piece.conditional = True
                body.append(piece)
        after: list[_Piece] = []
        for stmt in node.orelse:
            piece = self._piece(stmt, _segment(text, stmt, top=False), script, prefix=control)
            piece.conditional = True
            after.append(piece)
        return [head, *body * max(1, min(self.passes, len(body))), *after]

    def _constant_elements(self, node: ast.For | ast.AsyncFor | ast.While
                           ) -> tuple[Constant, ...] | None:
        """The literals a ``for`` goes over: a short display of them, or a name bound to
        one (that the body does not touch)."""
        if isinstance(node, ast.While) or not isinstance(node.target, ast.Name):
            return None
        iterable = node.iter
        if isinstance(iterable, ast.Name) and any(
                isinstance(n, ast.Name) and n.id == iterable.id
                for stmt in node.body for n in ast.walk(stmt)):
            return None
        return self.env.elements_of(iterable)

    def _unrolled(self, node: ast.For | ast.AsyncFor, values: Sequence[Constant], text: str,
                  script: str | None, control: str) -> list[_Piece]:
        """A loop over a short list of constants, one iteration after the other, each
        with the target's own value (so ``f'out/{name}.txt'`` names one file each, and
        ``d[name] = ...`` stores at one key)."""
        # a body that may stop early does not certainly rebind what it binds
        stops = any(isinstance(n, (ast.Break, ast.Continue, ast.Return, ast.Raise))
                    for stmt in node.body for n in ast.walk(stmt))
        pieces: list[_Piece] = []
        target = node.target
        for value in values:
            self.env.bind(target, frozenset({str(value)}))
            if isinstance(target, ast.Name):
                self.env.constants[target.id] = value
            for stmt in node.body:
                if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                    pieces.extend(self._loop(stmt, text, script, control, True))
                    continue
                piece = self._piece(stmt, _segment(text, stmt, top=False), script,
                                    prefix=control, certain=not stops)
                piece.conditional = stops
                pieces.append(piece)
        if stops and isinstance(target, ast.Name):
            self.env.constants.pop(target.id, None)
        for stmt in node.orelse:
            piece = self._piece(stmt, _segment(text, stmt, top=False), script, prefix=control)
            piece.conditional = True
            pieces.append(piece)
        return pieces

    def _piece(self, node: ast.stmt, code: str, script: str | None, *, prefix: str = "",
               certain: bool = False) -> _Piece:
        """``certain``: the statement runs whenever the cell does."""
        keyed = with_constant_keys(node, self.env.constants)
        if keyed is not node:
            node, code = keyed, ast.unparse(keyed)
        piece = _Piece(code=prefix + code, script=script)
        self._visit(node, piece, certain)
        return piece

    def _visit(self, node: ast.stmt, piece: _Piece, certain: bool = False) -> None:
        """Collect a statement's patterns in execution order, binding as it goes."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._collect(node, piece, deferred=False)
            self.env.assign(node, certain=certain)
            return
        value = node.value if isinstance(node, ast.Expr) else None
        self._discarded = value.value if isinstance(value, ast.Await) else value
        bodies: list[ast.stmt] = []
        for _, value in ast.iter_fields(node):
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, ast.stmt):
                    bodies.append(item)
                elif isinstance(item, ast.match_case):
                    self._collect(item.pattern, piece, deferred=False)
                    bodies.extend(item.body)
                elif isinstance(item, ast.ExceptHandler):
                    if item.type is not None:
                        self._collect(item.type, piece, deferred=False)
                    bodies.extend(item.body)
                elif isinstance(item, ast.AST):
                    self._collect(item, piece, deferred=False)
        self._discarded = None
        self.env.assign(node, certain=certain)
        for stmt in bodies:
            self._visit(stmt, piece)

    def _collect(self, node: ast.AST, piece: _Piece, deferred: bool) -> None:
        """Note the path patterns and modules a statement names (``deferred``: inside a
        function body, where they all go to ``piece.deferred``)."""
        stack: list[ast.AST] = [node]
        while stack:
            child = stack.pop()
            if not deferred and isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                # decorators and defaults run here; the body when the function is called
                stack.extend([*getattr(child, "decorator_list", []), *child.args.defaults,
                              *(d for d in child.args.kw_defaults if d is not None)])
                inner = _Piece(code="")
                body = child.body if isinstance(child.body, list) else [child.body]
                for stmt in body:
                    self._collect(stmt, inner, deferred=True)
                piece.deferred |= inner.deferred
                continue
            stack.extend(ast.iter_child_nodes(child))
            if isinstance(child, ast.Import):
                piece.modules.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module:
                piece.modules.add(child.module)
                piece.modules.update(f"{child.module}.{a.name}" for a in child.names)
            if isinstance(child, ast.Call):
                if deferred:
                    self._call_patterns(child, piece.deferred)
                else:
                    self._call_patterns(child, piece.patterns, piece.reading)

    def _call_patterns(self, call: ast.Call, into: set[str],
                       reading: set[str] | None = None) -> None:
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in _NOT_IO:
            return
        targets: list[ast.expr] = [*call.args, *(k.value for k in call.keywords)]
        if isinstance(func, ast.Attribute):
            targets.append(func.value)
        for target in targets:
            for expr in ast.walk(target):
                if isinstance(expr, ast.expr):
                    found = self.env.value(expr)
                    if found:
                        into.update(found)
        if reading is None or not isinstance(name, str) or self.env.value(call) is not None:
            return  # a call that makes a path (``os.path.join``) reads nothing
        # what a call given a path reads: the file, when the call is known to read it, or
        # when its result is used and it is not known to only name the path
        if reads_named_path(name) or (call is not self._discarded
                                      and name not in PATH_ONLY_CALLS):
            for target in targets:
                reading.update(self.env.value(target) or ())


@functools.lru_cache(maxsize=8)
def _lines(text: str) -> list[bytes]:
    return text.encode("utf-8", "surrogatepass").splitlines(keepends=True)


def _segment(text: str, node: ast.stmt, *, top: bool) -> str:
    """A statement's own source: its segment, decorators included; else it unparsed."""
    found: str | None = None
    end = node.end_lineno
    if text and end is not None and node.end_col_offset is not None:
        lines = _lines(text)
        if top and hasattr(node, "body"):
            # a compound statement starts its line; decorators come first
            start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            raw = b"".join(lines[start - 1:end])
        elif not hasattr(node, "body"):
            if node.lineno == end:
                raw = lines[end - 1][node.col_offset:node.end_col_offset]
            else:
                raw = b"".join([lines[node.lineno - 1][node.col_offset:],
                                *lines[node.lineno:end - 1],
                                lines[end - 1][:node.end_col_offset]])
        else:
            raw = b""
        found = raw.decode("utf-8", "replace") if raw else None
    if found is not None:
        try:
            ast.parse(found)
            return found
        except (SyntaxError, ValueError):
            pass
    return ast.unparse(node)
