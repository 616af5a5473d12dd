"""Def/use names of one notebook cell, read from its syntax tree.

This module owns one question: given a cell's source, which module-level
names does it bind, read, delete and mutate in place? It answers from the
AST alone (``ast`` and nothing else), so it never runs the code and never
sees values. It does not own what those names mean for lineage: the flow
tracker (``host_kernel.lineage.flow``) turns these sets into edges between
cells, and the capture hook (``host_kernel.kernel.capture``) says which
files were really opened.

The answer is a documented approximation, chosen to over-approximate uses
(a spurious edge costs little: the dataflow prompt may narrow candidates)
rather than miss them:

* ``used`` holds names *read before the cell has bound them for certain*,
  walking statements in order: a read counts unless every path to it went
  through a binding earlier in the cell. Loop, ``try`` and ``match`` bodies
  see what their header bound; what they bind is not certain after them
  (the body may not run), while ``with`` bodies, ``finally`` blocks and names
  bound on both sides of an ``if``/``else`` are. Loop-carried reads
  (``total = total + x`` in a loop) count as uses. ``global`` assignments
  inside functions never count as certain.
* Free names of functions, lambdas and classes defined in the cell count as
  uses where the definition stands (as if they were called there). For names
  bound by ``def``/``class`` they are also listed in ``functions``, split into
  what is read at definition and what is read when called, so that a call in
  a later cell can be resolved against the values current at that time.
  Lambdas assigned to names are ordinary values (no call-time split).
* Builtin names are kept out of ``used`` and listed in ``builtins_used``
  instead: they only matter when an earlier cell shadowed them.
* ``mutated``: a method called on a name as a whole statement
  (``rows.append(x)``, ``model.fit(X)``, ``await q.put(x)``), any call with
  ``inplace=True``, and assignment or deletion through an attribute or
  subscript (``x[0] = v``, ``x.a = v``, ``del x[k]``). Mutations inside
  function bodies are not seen. Passing an object to a call not known pure
  (``fill(rows, data)``, ``random.shuffle(x)``) counts as mutating it, and
  drawing methods (``ax.plot(x)``) mutate their receiver wherever they stand
  (see ``effects`` below).
* ``deleted``: only unconditional, top-level ``del name`` statements; a
  later binding in the same cell takes the name back out. ``defined`` and
  ``deleted`` never overlap.
* ``from m import *`` binds names that cannot be known; they are not listed,
  and the pseudo-name ``knowledge.UNKNOWN_NAMES`` is marked mutated instead.
* Containers at known keys (``host_kernel.lineage.keys``): ``key_uses``
  maps a used name to the keys the cell reads it at when every load is at a
  known key (``d['oslo']``, ``{k: v for k, v in d.items() if k in ('a',
  'b')}``); ``key_store`` is ``(name, key, replaces)`` when the cell is one
  store ``d['k'] = v`` or ``del d['k']`` (replaces), or one change of the
  value there (``d['k'].append(v)``); ``dicts`` lists the names bound to a
  fresh dict. A name loaded only as the receiver of a subscript store
  (``d[x] = v``) or of a changing method (``rows.append(r)``) is mutated,
  not used.
* Functions with state (``effects.function_state``): ``FunctionNames.changes``
  lists what a call of the function changes (itself when it is cached, the
  module names its body changes), ``makes_state`` whether it builds closures
  that keep state.
* Calls' side effects (``host_kernel.lineage.effects``): drawing into a
  figure or the pyplot current figure (pseudo-name
  ``knowledge.CURRENT_FIGURE``, which may be defined, used, mutated or
  deleted like a name), mutation through the arguments of calls not known
  pure, and ``links``: groups of names referring to one object. ``imports``
  lists each imported name with the dotted module (or module attribute) it
  was bound to and the full dotted path imported, for the flow tracker's
  workspace-module rule. ``cell_names(code, modules=...)`` takes the names
  earlier cells imported, so that ``plt.plot`` is known as pyplot's.

IPython syntax is handled before parsing, only when the plain source does
not parse: line magics become ``pass`` (``%time``/``%timeit``/``%prun``
keep the statement they time; ``%run`` becomes a star import of the script's
unknown names, see ``UNKNOWN_NAMES``), shell escapes (``!ls``) and help (``x?``)
become ``pass``, ``x = %magic`` / ``x = !cmd`` bind ``x``, and a cell magic
(``%%bash``, ``%%writefile`` ...) makes the whole cell non-Python: empty sets,
``parse_error`` False. ``%%time``, ``%%timeit``, ``%%prun`` and ``%%capture``
bodies are analysed as Python (``%%capture out`` binds ``out``). Anything that
still does not parse gives empty sets and ``parse_error`` True.
"""

from __future__ import annotations

import ast
import builtins
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .effects import FunctionState, call_effects, function_state
from .keys import KeyUse, key_facts
from .knowledge import MUTATING_METHODS

__all__ = ["BUILTIN_NAMES", "RUN_MODULE", "CellNames", "FunctionNames", "cell_names",
           "ipython_to_python"]

#: The module a ``%run`` whose script is not known is read as a star import of.
RUN_MODULE = "__host_kernel_run__"

#: Names that resolve to builtins unless a cell binds them.
BUILTIN_NAMES: frozenset[str] = frozenset(dir(builtins))

_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "prun", "capture"})
_TIMING_LINE_MAGICS = frozenset({"time", "timeit", "prun"})
_TIMEIT_VALUE_OPTIONS = frozenset({"-n", "-r", "-p", "-s"})
_HELP = re.compile(r"[\w.*\[\]]+\?\??")
_MAGIC_ASSIGN = re.compile(r"^(?P<indent>\s*)(?P<target>[^=%!]+?)\s*=\s*[%!]")
_PARSE_FLAGS = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


@dataclass(frozen=True, slots=True)
class FunctionNames:
    """The module-level names a function or class defined by the cell reads.

    ``when_defined`` is read where the definition stands (decorators,
    defaults, annotations, base classes, a class body); ``when_called`` is read
    each time it is called (the free names of a function body or of a class's
    methods), so its values are those current at call time.
    """

    name: str
    when_called: frozenset[str] = frozenset()
    when_defined: frozenset[str] = frozenset()
    #: bound by ``class`` (its body runs at definition) rather than ``def``
    is_class: bool = False
    #: module-level names a call changes (the function itself when it is cached)
    changes: frozenset[str] = frozenset()
    #: it returns closures that keep state between their calls
    makes_state: bool = False


@dataclass(frozen=True, slots=True)
class CellNames:
    """Module-level names one cell binds, reads, deletes and mutates."""

    defined: frozenset[str] = frozenset()
    used: frozenset[str] = frozenset()
    deleted: frozenset[str] = frozenset()
    mutated: frozenset[str] = frozenset()
    parse_error: bool = False
    #: names in ``defined`` bound only by ``import`` statements
    imported: frozenset[str] = frozenset()
    #: names in ``defined`` bound only by ``def``/``class``, sorted by name
    functions: tuple[FunctionNames, ...] = ()
    #: builtin names the cell reads before binding them (see ``used``)
    builtins_used: frozenset[str] = frozenset()
    #: groups of names that refer to one object after the cell (``fig, ax``)
    links: tuple[frozenset[str], ...] = ()
    #: (name, dotted object it is bound to, full dotted path imported), per import
    imports: tuple[tuple[str, str, str], ...] = ()
    #: used names read only at known keys (see ``host_kernel.lineage.keys``)
    key_uses: Mapping[str, KeyUse] = field(default_factory=dict)
    #: (name, key, replaces) when the cell is one store (or change) at a known key
    key_store: tuple[str, str, bool] | None = None
    #: names bound to a fresh dict
    dicts: frozenset[str] = frozenset()
    #: (name, container, key) when the cell is ``name = container['k']``
    part: tuple[str, str, str] | None = None

    def function(self, name: str) -> FunctionNames | None:
        """What function or class ``name`` reads, if the cell bound it by ``def``/``class``."""
        for function in self.functions:
            if function.name == name:
                return function
        return None


def cell_names(code: str, *, modules: Mapping[str, str] | None = None) -> CellNames:
    """Analyse one cell's source; never raises for bad or non-Python input.

    ``modules`` maps names imported by earlier cells to the dotted module (or
    module attribute) they are bound to, e.g. ``{"plt": "matplotlib.pyplot"}``.
    """
    tree = _parse(code)
    if tree is None:
        source = ipython_to_python(code)
        if source is None:
            return CellNames()
        tree = _parse(source)
        if tree is None:
            return CellNames(parse_error=True)
    try:
        return _analyse(tree, modules or {})
    except RecursionError:
        return CellNames(parse_error=True)


# -- IPython syntax -------------------------------------------------------------


def _parse(source: str) -> ast.Module | None:
    with warnings.catch_warnings():
        # invalid escapes and the like warn at parse time; they are not ours
        warnings.simplefilter("ignore")
        try:
            tree = compile(source, "<cell>", "exec", _PARSE_FLAGS, dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
    return tree if isinstance(tree, ast.Module) else None


def ipython_to_python(code: str) -> str | None:
    """The cell with IPython syntax replaced, or ``None`` for a non-Python cell magic.

    Plain Python comes back unchanged.
    """
    if _parse(code) is not None:
        return code
    lines = code.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].lstrip().startswith("%%"):
        words = lines[first].lstrip()[2:].split()
        magic = words[0] if words else ""
        if magic not in _PYTHON_CELL_MAGICS:
            return None
        body = lines[first + 1 :]
        if magic == "capture":
            targets = [w for w in words[1:] if not w.startswith("-")]
            if targets and targets[-1].isidentifier():
                body.append(f"{targets[-1]} = None")
        lines = body
    return "\n".join(_python_line(line) for line in lines)


def _python_line(line: str) -> str:
    stripped = line.lstrip()
    indent = line[: len(line) - len(stripped)]
    if not stripped:
        return line
    if stripped.startswith("%"):
        words = stripped[1:].split(None, 1)
        if words and words[0] == "run":
            return f"{indent}from {RUN_MODULE} import *"
        if words and words[0] in _TIMING_LINE_MAGICS and len(words) > 1:
            statement = _drop_options(words[1])
            if statement:
                return indent + statement
        return indent + "pass"
    if stripped.startswith(("!", "?")) or _HELP.fullmatch(stripped):
        return indent + "pass"
    match = _MAGIC_ASSIGN.match(line)
    if match is not None:
        return f"{match['indent']}{match['target']} = None"
    return line


def _drop_options(rest: str) -> str:
    """Strip ``%timeit``-style options (``-n 10 -r3 -q``) before the statement."""
    words = rest.split(" ")
    while words and (not words[0] or words[0].startswith("-")):
        option = words.pop(0)
        if option in _TIMEIT_VALUE_OPTIONS and words:
            words.pop(0)
    return " ".join(words).strip()


# -- analysis -------------------------------------------------------------------


def _imports(stmts: Iterable[ast.stmt]) -> list[tuple[str, str, str]]:
    """(name, bound dotted, full dotted) for module-level imports, outside function bodies."""
    found: list[tuple[str, str, str]] = []
    stack: list[ast.AST] = list(stmts)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                first = alias.name.partition(".")[0]
                found.append((alias.asname or first, alias.name if alias.asname else first,
                              alias.name))
        elif isinstance(node, ast.ImportFrom) and node.module != RUN_MODULE:
            module = node.module or ""
            for alias in node.names:
                dotted = f"{module}.{alias.name}".lstrip(".")
                if alias.name == "*":
                    found.append(("*", module, module))
                else:
                    found.append((alias.asname or alias.name, dotted, dotted))
        stack.extend(ast.iter_child_nodes(node))
    return found


def _analyse(tree: ast.Module, modules: Mapping[str, str]) -> CellNames:
    defined: dict[str, None] = {}
    deleted: set[str] = set()
    mutated: set[str] = set()
    kinds: dict[str, set[str]] = {}
    called: dict[str, set[str]] = {}
    at_definition: dict[str, set[str]] = {}
    classes: set[str] = set()
    states: dict[str, FunctionState] = {}

    for stmt in tree.body:
        scope = _Scope("module")
        scope.visit(stmt)
        mutated |= scope.mutated
        if isinstance(stmt, ast.Delete):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    deleted.add(target.id)
                    defined.pop(target.id, None)
        for name in scope.global_stores:
            kinds.setdefault(name, set()).add("other")
        for name, kind_set in scope.kinds.items():
            kinds.setdefault(name, set()).update(kind_set)
        for name, (when_called, when_defined) in scope.def_free.items():
            called.setdefault(name, set()).update(when_called)
            at_definition.setdefault(name, set()).update(when_defined)
        classes |= scope.classes
        states.update(scope.def_state)
        for name in scope.stores | scope.global_stores:
            defined[name] = None
            deleted.discard(name)

    exposure = _Exposure()
    exposure.block(tree.body, set())
    exposed = exposure.exposed
    effects = call_effects(tree, modules)
    mutated |= effects.mutated
    exposed |= effects.used
    for name in effects.defined:
        defined[name] = None
    deleted |= effects.deleted
    names = frozenset(defined)
    keys = key_facts(tree)
    used = frozenset(exposed - BUILTIN_NAMES - keys.store_only)
    return CellNames(
        defined=names,
        used=used,
        key_uses={n: k for n, k in keys.uses.items() if n in used},
        key_store=keys.store,
        dicts=keys.dicts & names,
        part=keys.part,
        deleted=frozenset(deleted),
        mutated=frozenset(mutated),
        links=effects.links,
        imports=tuple(_imports(tree.body)),
        imported=frozenset(n for n in names if kinds.get(n) == {"import"}),
        functions=tuple(
            FunctionNames(
                name=n,
                when_called=frozenset(called.get(n, ())),
                when_defined=frozenset(at_definition.get(n, ())),
                is_class=n in classes,
                changes=states.get(n, FunctionState()).changes,
                makes_state=states.get(n, FunctionState()).makes_state,
            )
            for n in sorted(names)
            if kinds.get(n) == {"def"}
        ),
        builtins_used=frozenset(exposed & BUILTIN_NAMES),
    )


class _Exposure:
    """Names read before the cell has certainly bound them, in statement order.

    ``block`` walks statements in order with the set of names bound for
    certain so far, and returns that set after the block. A branch or loop
    body sees what its header bound, but what it binds is certain afterwards
    only when every path binds it (``if`` with ``else``) or the body always
    runs (``with``, ``finally``).
    """

    def __init__(self) -> None:
        self.exposed: set[str] = set()

    def _header(self, nodes: Iterable[ast.AST | None], certain: set[str]) -> set[str]:
        scope = _Scope("module")
        for node in nodes:
            if node is not None:
                scope.visit(node)
        self.exposed |= (scope.loads | scope.child_free) - certain
        return scope.stores

    def block(self, stmts: Iterable[ast.stmt], certain: set[str]) -> set[str]:
        certain = set(certain)
        for stmt in stmts:
            if isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    certain |= self._header([item.context_expr, item.optional_vars], certain)
                certain = self.block(stmt.body, certain)
            elif isinstance(stmt, (ast.For, ast.AsyncFor)):
                bound = self._header([stmt.iter, stmt.target], certain)
                self.block(stmt.body, certain | bound)
                self.block(stmt.orelse, certain)
            elif isinstance(stmt, ast.While):
                bound = self._header([stmt.test], certain)
                self.block(stmt.body, certain | bound)
                self.block(stmt.orelse, certain | bound)
            elif isinstance(stmt, ast.If):
                certain |= self._header([stmt.test], certain)
                certain = self.block(stmt.body, certain) & self.block(stmt.orelse, certain)
            elif isinstance(stmt, (ast.Try, ast.TryStar)):
                after_body = self.block(stmt.body, certain)
                for handler in stmt.handlers:
                    self._header([handler.type], certain)
                    caught = {handler.name} if handler.name else set()
                    self.block(handler.body, certain | caught)
                self.block(stmt.orelse, after_body)
                certain = self.block(stmt.finalbody, certain)
            elif isinstance(stmt, ast.Match):
                self._header([stmt.subject], certain)
                for case in stmt.cases:
                    bound = self._header([case.pattern], certain)
                    bound |= self._header([case.guard], certain | bound)
                    self.block(case.body, certain | bound)
            else:
                certain |= self._header([stmt], certain)
        return certain


class _Scope(ast.NodeVisitor):
    """Names one scope reads and binds; nested scopes are analysed on their own.

    ``kind`` is ``module`` (one top-level statement of the cell), ``function``,
    ``class`` or ``comprehension``. Loads of names bound in the same scope are
    kept in ``loads``; the caller subtracts what is local.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.loads: set[str] = set()
        self.stores: set[str] = set()
        self.declared_global: set[str] = set()
        self.declared_nonlocal: set[str] = set()
        # free names of nested scopes (they resolve outside those scopes)
        self.child_free: set[str] = set()
        # module names bound by nested scopes through ``global``
        self.global_stores: set[str] = set()
        # comprehension only: walrus targets, bound in the enclosing scope
        self.walrus: set[str] = set()
        # module only
        self.mutated: set[str] = set()
        self.kinds: dict[str, set[str]] = {}
        # module only: def/class name -> (read when called, read when defined)
        self.def_free: dict[str, tuple[set[str], set[str]]] = {}
        self.def_state: dict[str, FunctionState] = {}
        self.classes: set[str] = set()

    # -- binding ------------------------------------------------------------

    def _bind(self, name: str, kind: str = "other") -> None:
        self.stores.add(name)
        if self.kind == "module":
            self.kinds.setdefault(name, set()).add(kind)

    def _nested(self, free: set[str], global_stores: set[str]) -> None:
        self.child_free |= free
        self.global_stores |= global_stores

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.loads.add(node.id)
        elif isinstance(node.ctx, ast.Store) or self.kind != "module":
            # a module-level ``del name`` is handled by the statement loop
            self._bind(node.id)

    def visit_Global(self, node: ast.Global) -> None:
        self.declared_global.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.declared_nonlocal.update(node.names)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._bind(alias.asname or alias.name.partition(".")[0], "import")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self._bind(alias.asname or alias.name, "import")

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._bind(node.name)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self._bind(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self._bind(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self._bind(node.rest)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self.loads.add(node.target.id)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None and self.kind == "module":
            # ``x: int`` binds nothing at module level
            self.visit(node.annotation)
            if not isinstance(node.target, ast.Name):
                self.visit(node.target)
            return
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        if self.kind == "comprehension":
            self.walrus.add(node.target.id)
        else:
            self._bind(node.target.id)

    # -- mutation (module level only) ------------------------------------------

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._note_store_through(node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self._note_store_through(node)
        self.generic_visit(node)

    def _note_store_through(self, node: ast.Attribute | ast.Subscript) -> None:
        if self.kind == "module" and not isinstance(node.ctx, ast.Load):
            self._note_mutated(node.value)

    def visit_Expr(self, node: ast.Expr) -> None:
        value = node.value.value if isinstance(node.value, ast.Await) else node.value
        if (
            self.kind == "module"
            and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
        ):
            self._note_mutated(value.func.value)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if self.kind == "module" and isinstance(node.func, ast.Attribute):
            for keyword in node.keywords:
                if keyword.arg == "inplace" and _is_true(keyword.value):
                    self._note_mutated(node.func.value)
        self.generic_visit(node)

    def _note_mutated(self, expr: ast.expr) -> None:
        while True:
            if isinstance(expr, (ast.Attribute, ast.Subscript)):
                expr = expr.value
            elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                    and expr.func.attr in MUTATING_METHODS:
                expr = expr.func.value  # ``d.setdefault(k, []).append(v)`` changes d
            else:
                break
        if isinstance(expr, ast.Name):
            self.mutated.add(expr.id)

    # -- nested scopes ----------------------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer = [*node.decorator_list, *_argument_outer_nodes(node.args)]
        if node.returns is not None:
            outer.append(node.returns)
        outer_names = self._visit_outer(outer)
        free, global_stores = _function_free(node.args, node.body)
        self._nested(free, global_stores)
        self._bind(node.name, "def")
        if self.kind == "module":
            self._note_definition(node.name, free, outer_names)
            self.def_state[node.name] = function_state(node, free, global_stores)

    def _note_definition(self, name: str, when_called: set[str], when_defined: set[str]) -> None:
        called, defined = self.def_free.setdefault(name, (set(), set()))
        called |= when_called
        defined |= when_defined

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_outer(_argument_outer_nodes(node.args))
        free, global_stores = _function_free(node.args, [node.body])
        self._nested(free, global_stores)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        outer_names = self._visit_outer(
            [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]
        )
        body = _Scope("class")
        for stmt in node.body:
            body.visit(stmt)
        # methods skip the class scope, so their free names are not filtered
        body_reads = body.loads - body.stores
        free = body_reads | body.child_free
        global_stores = body.global_stores | (body.stores & body.declared_global)
        self._nested(free, global_stores)
        self._bind(node.name, "def")
        if self.kind == "module":
            # nested scopes of a class body may run at definition (a
            # comprehension) or when called (a method): count them as both
            self._note_definition(node.name, body.child_free, outer_names | free)
            self.classes.add(node.name)

    def visit_ListComp(self, node: ast.ListComp) -> None:
        self._comprehension(node.generators, [node.elt])

    def visit_SetComp(self, node: ast.SetComp) -> None:
        self._comprehension(node.generators, [node.elt])

    def visit_GeneratorExp(self, node: ast.GeneratorExp) -> None:
        self._comprehension(node.generators, [node.elt])

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._comprehension(node.generators, [node.key, node.value])

    def _comprehension(self, generators: list[ast.comprehension], elts: list[ast.expr]) -> None:
        # the first iterable is evaluated in the enclosing scope
        self.visit(generators[0].iter)
        inner = _Scope("comprehension")
        for index, generator in enumerate(generators):
            inner.visit(generator.target)
            if index:
                inner.visit(generator.iter)
            for condition in generator.ifs:
                inner.visit(condition)
        for elt in elts:
            inner.visit(elt)
        self._nested((inner.loads | inner.child_free) - inner.stores, inner.global_stores)
        for name in inner.walrus:
            if self.kind == "comprehension":
                self.walrus.add(name)
            else:
                self._bind(name)

    def _visit_outer(self, nodes: Iterable[ast.AST]) -> set[str]:
        """Visit nodes evaluated where a definition stands; return the names they read."""
        probe = _Scope("function")
        for node in nodes:
            self.visit(node)
            probe.visit(node)
        return probe.loads | probe.child_free


def _function_free(args: ast.arguments, body: Iterable[ast.AST]) -> tuple[set[str], set[str]]:
    """Free names of a function body, and module names it binds via ``global``."""
    scope = _Scope("function")
    for stmt in body:
        scope.visit(stmt)
    params = {
        arg.arg
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
        if arg is not None
    }
    local = (scope.stores | params) - scope.declared_global - scope.declared_nonlocal
    free = (scope.loads | scope.child_free) - local
    global_stores = scope.global_stores | (scope.stores & scope.declared_global)
    return free, global_stores


def _argument_outer_nodes(args: ast.arguments) -> list[ast.AST]:
    """Defaults and annotations: evaluated where the function is defined."""
    nodes: list[ast.AST] = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if arg is not None and arg.annotation is not None:
            nodes.append(arg.annotation)
    return nodes


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True
