"""Which keys of a container one cell reads and writes, read from its syntax tree.

This module owns the per-key part of def-use: for a cell (or one piece of
it, see ``host_kernel.lineage.statements``), which names it reads only at
known keys, which it names only to store into, which single key it stores,
and which names it binds to a fresh dict. It reads the AST alone; the flow
tracker (``host_kernel.lineage.flow``) keeps a taint per key and applies
these facts. A key is written as the ``repr`` of a string or integer literal
(``'oslo'``, ``0``), so ``d['0']`` and ``d[0]`` are two keys.

Read at known keys (every load of the name in the cell is one of these):

* ``d['k']`` and ``d.get('k', ...)``, with a literal key, or with a
  comprehension variable that ranges over literals (``[d[k] for k in ('a',
  'b')]``);
* a comprehension over ``d``, ``d.keys()`` or ``d.items()`` whose
  conditions restrict its key variable: ``k in ('a', 'b')``, ``k == 'a'``
  read those keys; ``k not in (...)``, ``k != 'a'`` read every key but
  those (a :data:`KeyUse` with ``negated``).

Any other load of the name (passing it, ``d[x]`` with ``x`` unknown, a load
inside a function or class body) reads it whole. A name loaded only as the
receiver of a subscript store or deletion (``d[x] = v``, ``del d[x]``) or of a
statement calling a method that changes it (``d.update(e)``, ``rows.append(r)``,
see ``knowledge.MUTATING_METHODS``) is not read at all: putting values into a
container does not read what it holds.

Stored at one key: a piece that is (after its loop's control lines) the one
statement ``d['k'] = value`` or ``del d['k']``, which replaces what is at
``'k'``; or one that changes the value there in place (``d['k'] += v``,
``d['k'].append(v)``, ``d['k']['j'] = v``, ``d['k'].to_csv(p)``: a method
called as a statement changes its receiver, as in ``defuse``), which adds
to it. ``part`` notes a name bound to what is at one key (``keep =
d['oslo']``), so that a store at another key of ``d`` does not reach it.
As elsewhere in def-use, a value stored at two keys, or at a key and under
a name, is not followed as one object.

For ``statements``, which knows the literals names hold at each statement
(``paths.PathEnv``): :func:`with_constant_keys` writes them into subscript
keys (``d[name]`` in an unrolled loop becomes ``d['oslo']``), and
:func:`split_build` rewrites a dict or list display, or a comprehension over
literals, into a fresh container and one store per key.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .knowledge import MUTATING_METHODS
from .paths import Constant, bound_names, literal

__all__ = ["KeyFacts", "KeyUse", "key_facts", "key_of", "split_build", "union",
           "with_constant_keys"]

#: (keys, negated): the keys read, or with ``negated`` every key but these
KeyUse = tuple[frozenset[str], bool]

_FRESH_DICTS = frozenset({"dict", "defaultdict", "OrderedDict", "Counter"})


def key_of(value: Constant) -> str:
    """How a literal key is written in a taint (its ``repr``)."""
    return repr(value)


@dataclass(frozen=True, slots=True)
class KeyFacts:
    """What a cell does to containers at known keys (see the module docstring)."""

    #: names every load of which is at known keys
    uses: dict[str, KeyUse]
    #: names loaded only as the receiver of a subscript store or deletion
    store_only: frozenset[str]
    #: (name, key, replaces) when the cell is one store or change at a known key
    store: tuple[str, str, bool] | None
    #: names bound to a fresh dict (``{}``, a dict display or comprehension, ``dict()``)
    dicts: frozenset[str]
    #: (name, container, key) when the cell is ``name = container['k']``
    part: tuple[str, str, str] | None = None


def union(a: KeyUse, b: KeyUse) -> KeyUse:
    """Both reads together: still at known keys, or every key but some."""
    (keys_a, neg_a), (keys_b, neg_b) = a, b
    if not neg_a and not neg_b:
        return keys_a | keys_b, False
    if neg_a and neg_b:
        return keys_a & keys_b, True
    excluded, included = (keys_a, keys_b) if neg_a else (keys_b, keys_a)
    return excluded - included, True


def key_facts(tree: ast.Module) -> KeyFacts:
    visitor = _Keys()
    visitor.visit(tree)
    uses: dict[str, KeyUse] = {}
    for name, found in visitor.keyed.items():
        if name in visitor.whole:
            continue
        use = found[0]
        for other in found[1:]:
            use = union(use, other)
        uses[name] = use
    store_only = frozenset(visitor.targets - visitor.whole - set(visitor.keyed))
    return KeyFacts(uses, store_only, _store(tree), frozenset(_fresh_dicts(tree)),
                    _part(tree))


def _part(tree: ast.Module) -> tuple[str, str, str] | None:
    stmt = tree.body[0] if len(tree.body) == 1 else None
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Subscript)
            and isinstance(stmt.value.value, ast.Name)):
        return None
    key = literal(stmt.value.slice)
    return None if key is None else (stmt.targets[0].id, stmt.value.value.id, key_of(key))


def _store(tree: ast.Module) -> tuple[str, str, bool] | None:
    body = list(tree.body)
    while len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value,
                                                                         ast.Tuple):
        body.pop(0)  # a loop's control line (``statements``)
    if len(body) != 1:
        return None
    stmt = body[0]
    replaces = True
    target: ast.expr
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        target = stmt.target
    elif isinstance(stmt, ast.Delete) and len(stmt.targets) == 1:
        target = stmt.targets[0]
    elif isinstance(stmt, ast.AugAssign):
        target, replaces = stmt.target, False
    elif isinstance(stmt, ast.Expr):
        call = stmt.value.value if isinstance(stmt.value, ast.Await) else stmt.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            return None
        target, replaces = call.func.value, False  # a method called on a part changes it
    else:
        return None
    while isinstance(target, (ast.Subscript, ast.Attribute)) and not (
            isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)):
        target, replaces = target.value, False  # ``d['k'].x = v``, ``d['k'][j] = v``
    if not (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)):
        return None
    key = literal(target.slice)
    return (target.value.id, key_of(key), replaces) if key is not None else None


def _fresh_dicts(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            continue
        value = stmt.value
        func = value.func if isinstance(value, ast.Call) else None
        called = func.attr if isinstance(func, ast.Attribute) else \
            func.id if isinstance(func, ast.Name) else None
        if isinstance(value, (ast.Dict, ast.DictComp)) or called in _FRESH_DICTS:
            found.add(stmt.targets[0].id)
    return found


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [c for value in test.values for c in _conjuncts(value)]
    return [test]


def _literals(expr: ast.expr) -> frozenset[Constant] | None:
    if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
        found = [literal(e) for e in expr.elts]
        if any(v is None for v in found):
            return None
        return frozenset(v for v in found if v is not None)
    value = literal(expr)
    return None if value is None else frozenset({value})


def _restriction(variable: str, conditions: list[ast.expr]) -> tuple[frozenset[Constant], bool
                                                                        ] | None:
    """What a comprehension's conditions say of the values of ``variable``."""
    allowed: frozenset[Constant] | None = None
    excluded: set[Constant] = set()
    for condition in conditions:
        for test in _conjuncts(condition):
            if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
                continue
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if isinstance(right, ast.Name) and right.id == variable \
                    and isinstance(op, (ast.Eq, ast.NotEq)):
                left, right = right, left
            if not (isinstance(left, ast.Name) and left.id == variable):
                continue
            values = _literals(right)
            if values is None or (isinstance(op, (ast.Eq, ast.NotEq)) and len(values) != 1):
                continue
            if isinstance(op, (ast.In, ast.Eq)):
                allowed = values if allowed is None else allowed & values
            elif isinstance(op, (ast.NotIn, ast.NotEq)):
                excluded |= values
    if allowed is not None:
        return allowed - excluded, False
    if excluded:
        return frozenset(excluded), True
    return None


class _Keys(ast.NodeVisitor):
    """Loads of module-level names, each at known keys, as a store receiver, or whole."""

    def __init__(self) -> None:
        self.keyed: dict[str, list[KeyUse]] = {}
        self.whole: set[str] = set()
        self.targets: set[str] = set()
        # comprehension scopes: local name -> the keys it ranges over (None: unknown)
        self.scopes: list[dict[str, KeyUse | None]] = []

    def _local(self, name: str) -> bool:
        return any(name in scope for scope in self.scopes)

    def _keys(self, expr: ast.expr) -> KeyUse | None:
        value = literal(expr)
        if value is not None:
            return frozenset({key_of(value)}), False
        if isinstance(expr, ast.Name):
            for scope in reversed(self.scopes):
                if expr.id in scope:
                    return scope[expr.id]
        return None

    def _receiver(self, expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name) and not self._local(expr.id):
            return expr.id
        return None

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and not self._local(node.id):
            self.whole.add(node.id)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        name = self._receiver(node.value)
        if name is not None:
            if not isinstance(node.ctx, ast.Load):
                self.targets.add(name)
                self.visit(node.slice)
                return
            keys = self._keys(node.slice)
            if keys is not None:
                self.keyed.setdefault(name, []).append(keys)
                self.visit(node.slice)
                return
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:
            name = self._receiver(func.value)
            keys = self._keys(node.args[0]) if name is not None else None
            if name is not None and keys is not None:
                self.keyed.setdefault(name, []).append(keys)
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    self.visit(arg)
                return
        self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                and call.func.attr in MUTATING_METHODS:
            name = self._receiver(call.func.value)
            if name is not None:
                self.targets.add(name)
                for arg in [*call.args, *(k.value for k in call.keywords)]:
                    self.visit(arg)
                return
        self.generic_visit(node)

    def _whole(self, node: ast.AST) -> None:
        """A body that runs later (or in a scope of its own): every name it loads is read
        whole."""
        self.whole.update(n.id for n in ast.walk(node)
                          if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _whole

    def visit_ListComp(self, node: ast.ListComp) -> None:
        self._comprehension(node.generators, [node.elt])

    def visit_SetComp(self, node: ast.SetComp) -> None:
        self._comprehension(node.generators, [node.elt])

    def visit_GeneratorExp(self, node: ast.GeneratorExp) -> None:
        self._comprehension(node.generators, [node.elt])

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._comprehension(node.generators, [node.key, node.value])

    def _comprehension(self, generators: list[ast.comprehension], elts: list[ast.expr]) -> None:
        scope: dict[str, KeyUse | None] = {}
        self.scopes.append(scope)
        try:
            for generator in generators:
                self._generator(generator, scope)
            for elt in elts:
                self.visit(elt)
        finally:
            self.scopes.pop()

    def _generator(self, generator: ast.comprehension,
                   scope: dict[str, KeyUse | None]) -> None:
        target, iterable = generator.target, generator.iter
        variable: str | None = None
        over: str | None = None  # a container whose keys the variable ranges over
        if isinstance(target, ast.Name):
            variable = target.id
        elif isinstance(target, ast.Tuple) and len(target.elts) == 2 \
                and isinstance(target.elts[0], ast.Name):
            variable = target.elts[0].id
        if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) \
                and not iterable.args and not iterable.keywords:
            method = iterable.func.attr
            if (method == "items" and isinstance(target, ast.Tuple)) or (
                    method == "keys" and isinstance(target, ast.Name)):
                over = self._receiver(iterable.func.value)
        elif isinstance(target, ast.Name):
            over = self._receiver(iterable)
        restricted = _restriction(variable, generator.ifs) if variable is not None else None
        if over is not None and restricted is not None:
            values, negated = restricted
            self.keyed.setdefault(over, []).append(
                (frozenset(key_of(v) for v in values), negated))
        else:
            over = None
            self.visit(iterable)  # evaluated in the enclosing scope only for the first one
        for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
            scope[name] = None
        if variable is not None:
            # the keys the key variable takes, when the iterable or conditions say
            ranges = _literals(iterable) if isinstance(target, ast.Name) else None
            if restricted is not None and not restricted[1]:
                ranges = restricted[0] if ranges is None else ranges & restricted[0]
            elif restricted is not None and ranges is not None:
                ranges = ranges - restricted[0]
            if ranges is not None:
                scope[variable] = frozenset(key_of(v) for v in ranges), False
            elif over is not None and restricted is not None:
                # every key of ``over`` but some: ``d[k]`` reads the same keys
                scope[variable] = frozenset(key_of(v) for v in restricted[0]), True
        for condition in generator.ifs:
            self.visit(condition)


# -- rewriting statements so that their keys are literals (for ``statements``) ---------

#: a dict or list display with more entries than this is not split into stores
MAX_ENTRIES = 32


def split_build(stmt: ast.stmt, elements_of: Callable[[ast.expr], tuple[Constant, ...] | None]
                ) -> tuple[ast.stmt, list[ast.stmt], bool] | None:
    """``d = {'a': x, 'b': y}``, ``d = [x, y]`` or a dict or list comprehension with one
    generator over literals (``{n: f(n) for n in ['a', 'b']}``; ``elements_of`` gives
    the literals of a name or display) as the binding of a fresh container and one
    store per key (``d['a'] = f('a')``); with whether the stores are conditional (the
    comprehension has conditions). ``None`` when the statement is not such a build."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)):
        return None
    name, value = stmt.targets[0].id, stmt.value
    if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(value)):
        return None  # the old value is read while the new one is built
    entries: list[tuple[Constant, ast.expr]] = []
    conditional = False
    base: ast.expr
    if isinstance(value, ast.Dict) and 0 < len(value.keys) <= MAX_ENTRIES:
        rest = [v for k, v in zip(value.keys, value.values, strict=True) if k is None]
        for key, item in zip(value.keys, value.values, strict=True):
            found = literal(key) if key is not None else None
            if key is not None and found is None:
                return None
            if found is not None:
                entries.append((found, item))
        base = ast.Dict(keys=[None] * len(rest), values=rest)
    elif isinstance(value, ast.List) and 0 < len(value.elts) <= MAX_ENTRIES \
            and not any(isinstance(e, ast.Starred) for e in value.elts):
        entries = list(enumerate(value.elts))
        base = ast.List(elts=[ast.Constant(None) for _ in value.elts], ctx=ast.Load())
    elif isinstance(value, (ast.DictComp, ast.ListComp)) and len(value.generators) == 1:
        generator = value.generators[0]
        target = generator.target
        values = elements_of(generator.iter)
        if values is None or not isinstance(target, ast.Name) or generator.is_async \
                or (isinstance(value, ast.ListComp) and generator.ifs):
            return None
        variable = target.id
        inner = [value.key, value.value] if isinstance(value, ast.DictComp) else [value.elt]
        if variable in set().union(*(_rebound(e) for e in inner)):
            return None
        for index, constant in enumerate(values):
            if isinstance(value, ast.DictComp):
                known = constant if isinstance(value.key, ast.Name) \
                    and value.key.id == variable else literal(value.key)
                if known is None:
                    return None
                entries.append((known, _substituted(value.value, variable, constant)))
            else:
                entries.append((index, _substituted(value.elt, variable, constant)))
        conditional = bool(generator.ifs)
        if isinstance(value, ast.DictComp):
            base = ast.DictComp(key=ast.Name(variable, ast.Load()), value=ast.Constant(None),
                                generators=[generator])
        else:
            base = ast.ListComp(elt=ast.Constant(None), generators=[generator])
    else:
        return None
    if all(isinstance(item, ast.Constant) for _, item in entries):
        return None  # nothing flows into a display of literals
    bound = ast.Assign(targets=[ast.Name(name, ast.Store())], value=base)
    stores: list[ast.stmt] = [
        ast.Assign(targets=[ast.Subscript(ast.Name(name, ast.Load()), ast.Constant(key),
                                          ast.Store())], value=item)
        for key, item in entries]
    for node in (bound, *stores):
        ast.copy_location(node, stmt)
        ast.fix_missing_locations(node)
    return bound, stores, conditional


def _rebound(expr: ast.expr) -> set[str]:
    """Names bound inside an expression (walrus targets, lambda and comprehension names)."""
    found: set[str] = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            found.add(node.id)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
    return found


class _Substitute(ast.NodeTransformer):
    def __init__(self, names: Mapping[str, Constant], everywhere: bool) -> None:
        self.names = names
        self.everywhere = everywhere

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if self.everywhere and isinstance(node.ctx, ast.Load) and node.id in self.names:
            return ast.copy_location(ast.Constant(self.names[node.id]), node)
        return node

    def _key(self, expr: ast.expr) -> ast.expr:
        if isinstance(expr, ast.Name) and expr.id in self.names:
            return ast.copy_location(ast.Constant(self.names[expr.id]), expr)
        return expr

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name):
            node.slice = self._key(node.slice)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
            node.args[0] = self._key(node.args[0])
        return node

    def _scope(self, node: ast.AST) -> ast.AST:
        return node  # a nested scope may rebind the names, or run later

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _scope
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _scope


def _substituted(expr: ast.expr, name: str, value: Constant) -> ast.expr:
    out = _Substitute({name: value}, everywhere=True).visit(copy.deepcopy(expr))
    return out if isinstance(out, ast.expr) else expr


def with_constant_keys(stmt: ast.stmt, constants: Mapping[str, Constant]) -> ast.stmt:
    """The statement with the names of known literals written into its subscript keys
    (``d[name]``, ``d.get(name)``), outside nested scopes; itself when there are none,
    or when it rebinds one of them."""
    named = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id in constants}
    if not named or named & bound_names(stmt):
        return stmt
    out = _Substitute({n: constants[n] for n in named}, everywhere=False).visit(
        copy.deepcopy(stmt))
    return out if isinstance(out, ast.stmt) else stmt
