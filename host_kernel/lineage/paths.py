"""Static values of path expressions in a cell, as patterns a read or written path can match.

This module owns one question: what file paths could an expression in a cell
name, without running it? The answer is a set of patterns in which ``*``
stands for a part that cannot be known (a variable from another cell, a loop
counter) or for a glob. ``host_kernel.lineage.statements`` uses it to tie the
paths a cell read and wrote (reported without statement information) to the
statements that named them. It never touches the file system.

What is evaluated, walking the cell's statements in order (:class:`PathEnv`):

* string constants; names bound earlier in the cell to an evaluated value
  (``p = f"out/{name}.csv"``), rebinding replacing the value;
* f-strings, ``+``, ``%`` and ``str.format`` (an unknown part becomes ``*``),
  ``os.path.join``, ``Path(...)``, ``/`` on paths, ``str()``,
  ``os.fspath``, ``.with_suffix``, ``.with_name``, ``.replace``,
  ``.parent``, ``.name``, ``.stem``, slices (cut at the last ``*``);
* collections by their elements: ``glob.glob(pattern)``, ``Path(d).glob(p)``,
  ``.rglob``, ``os.listdir(d)``, ``sorted``/``list``, list and tuple displays,
  subscripts, comprehensions; a ``for`` target is bound to the elements of
  what it iterates (``enumerate`` and ``zip`` are looked through).

A part that cannot be known is written ``knowledge.UNKNOWN`` (one value,
unknown); ``*`` stays for what really stands for many files (a glob, a
folder's listing). A value with no known character at all is unknown
(``None``): it would match every path.

Besides patterns, the environment keeps exact **constants**: a name bound,
by a statement that certainly runs (not inside a branch or loop body), to a
string or integer literal (``city = 'oslo'``, the target of an unrolled
loop) and **elements**: a name bound that way to a short list or tuple of
such literals (``names = ['oslo', 'bergen']``). ``statements`` unrolls loops
and comprehensions over them and writes them into subscript keys, where
``host_kernel.lineage.keys`` reads them. :class:`PathState` carries what a
cell left known to the next cell (held by the flow tracker between cells).
"""

from __future__ import annotations

import ast
import itertools
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .knowledge import UNKNOWN

__all__ = ["MAX_ELEMENTS", "Constant", "PathEnv", "PathState", "bound_names", "literal"]

_MAX_VALUES = 64
#: a list or tuple of at most this many literals is kept as exact elements
MAX_ELEMENTS = 8

#: an exact literal a name may hold (``bool`` excluded: ``True == 1`` as a key)
Constant = str | int
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\d+|\*)?(?:\.(?:\d+|\*))?[a-zA-Z%]")
_BRACES = re.compile(r"\{[^{}]*\}")
_JOINERS = frozenset({"join", "Path", "PurePath", "PosixPath", "joinpath"})
_IDENTITY = frozenset({"str", "fspath", "abspath", "normpath", "realpath", "expanduser",
                       "resolve", "absolute", "as_posix", "sorted", "list", "tuple", "set",
                       "iglob", "glob", "reversed", "Path", "PurePath", "strip", "lower"})

Values = frozenset[str]
_UNKNOWN = frozenset({UNKNOWN})
_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
             ast.TryStar, ast.Match)


def _known(values: set[str]) -> Values | None:
    values = {v for v in values if v.strip("*/." + UNKNOWN)}
    if not values or len(values) > _MAX_VALUES:
        return None
    return frozenset(values)


def _squash(value: str) -> str:
    return re.sub(r"[*\x01]*\*[*\x01]*", "*", re.sub("\x01+", UNKNOWN, value))


def _cut(value: str) -> str:
    """What is left of a value sliced by unknown bounds: up to its last unknown part."""
    last = max(value.rfind("*"), value.rfind(UNKNOWN))
    return (value[:last] if last >= 0 else value) + UNKNOWN


def _join(parts: list[Values]) -> Values:
    out: set[str] = set()
    for combo in itertools.islice(itertools.product(*parts), _MAX_VALUES + 1):
        pieces = [p for p in combo if p]
        joined = ""
        for piece in pieces:
            joined = piece if piece.startswith("/") or not joined else \
                joined.rstrip("/") + "/" + piece
        out.add(_squash(joined))
    return frozenset(out)


def _concat(parts: list[Values]) -> Values:
    return frozenset(_squash("".join(c)) for c in
                     itertools.islice(itertools.product(*parts), _MAX_VALUES + 1))


def literal(expr: ast.expr) -> Constant | None:
    """The value of a string or integer literal (not a bool), else ``None``."""
    negative = isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub)
    if isinstance(expr, ast.UnaryOp) and negative:
        expr = expr.operand
    if not isinstance(expr, ast.Constant):
        return None
    value = expr.value
    if isinstance(value, str) and not negative:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return -value if negative else value
    return None


def bound_names(stmt: ast.stmt) -> set[str]:
    """Names a statement binds or deletes in its own scope (not inside nested scopes)."""
    found: set[str] = set()
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
            if node is not stmt:
                continue
            stack.extend(node.decorator_list)
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)):
            # only walrus targets leak out of a comprehension
            found |= {n.target.id for n in ast.walk(node) if isinstance(n, ast.NamedExpr)}
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            found.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {(a.asname or a.name).partition(".")[0] for a in node.names}
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            found.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            found.add(node.rest)
        elif isinstance(node, ast.NamedExpr):
            found.add(node.target.id)
        stack.extend(ast.iter_child_nodes(node))
    return found


@dataclass(frozen=True, slots=True)
class PathState:
    """What names held when a cell ended: patterns, exact constants and elements."""

    values: Mapping[str, Values] = field(default_factory=dict)
    constants: Mapping[str, Constant] = field(default_factory=dict)
    elements: Mapping[str, tuple[Constant, ...]] = field(default_factory=dict)
    #: names a function's calls may rebind or change (``global``): never carried
    volatile: frozenset[str] = frozenset()

    def without(self, names: Iterable[str]) -> PathState:
        gone = set(names) | self.volatile
        if not gone & (set(self.values) | set(self.constants) | set(self.elements)):
            return self
        return PathState({k: v for k, v in self.values.items() if k not in gone},
                         {k: v for k, v in self.constants.items() if k not in gone},
                         {k: v for k, v in self.elements.items() if k not in gone},
                         self.volatile)


class PathEnv:
    """The path values of names bound so far in a cell, and evaluation against them."""

    def __init__(self, start: PathState | None = None) -> None:
        self.values: dict[str, Values] = dict(start.values) if start else {}
        self.constants: dict[str, Constant] = dict(start.constants) if start else {}
        self.elements: dict[str, tuple[Constant, ...]] = dict(start.elements) if start else {}
        #: names bound by this cell's statements so far
        self.assigned: set[str] = set()

    def state(self, volatile: frozenset[str] = frozenset()) -> PathState:
        return PathState(dict(self.values), dict(self.constants), dict(self.elements),
                         volatile).without(())

    # -- binding ----------------------------------------------------------------

    def constant(self, expr: ast.expr) -> Constant | None:
        """The exact literal an expression is, or a name holds (see the module docstring)."""
        if isinstance(expr, ast.Name):
            return self.constants.get(expr.id)
        return literal(expr)

    def elements_of(self, expr: ast.expr) -> tuple[Constant, ...] | None:
        """The exact elements of a short display of literals, or of a name holding one."""
        if isinstance(expr, ast.Name):
            return self.elements.get(expr.id)
        if not isinstance(expr, (ast.List, ast.Tuple)) or not 0 < len(expr.elts) <= MAX_ELEMENTS:
            return None
        found = [literal(e) for e in expr.elts]
        if any(v is None for v in found):
            return None
        return tuple(v for v in found if v is not None)

    def assign(self, stmt: ast.stmt, *, certain: bool = False) -> None:
        """Update the bindings for one simple statement (compound ones: their header).

        ``certain``: the statement runs whenever the cell does (exact constants and
        elements are kept only then)."""
        compound = isinstance(stmt, _COMPOUND)
        # targets that ``bind`` rebinds below, after the value is evaluated
        simple: set[str] = set()
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            simple = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        for name in (bound_names(stmt) if not isinstance(
                stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else {stmt.name}
                ) - simple:
            if not compound:  # a body rebinds as it is visited
                self.values.pop(name, None)
            self.constants.pop(name, None)
            self.elements.pop(name, None)
            self.assigned.add(name)
        if isinstance(stmt, ast.Assign):
            value = self.value(stmt.value)
            for target in stmt.targets:
                self.bind(target, value)
                if certain and isinstance(target, ast.Name):
                    self._exact(target.id, stmt.value)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            self.bind(stmt.target, self.value(stmt.value))
            if certain and isinstance(stmt.target, ast.Name):
                self._exact(stmt.target.id, stmt.value)
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            old = self.values.get(stmt.target.id)
            new = self.value(stmt.value)
            joined = None
            if isinstance(stmt.op, ast.Add) and (old or new):
                joined = _known(set(_concat([old or _UNKNOWN, new or _UNKNOWN])))
            elif isinstance(stmt.op, ast.Div) and (old or new):
                joined = _known(set(_join([old or _UNKNOWN, new or _UNKNOWN])))
            self.bind(stmt.target, joined)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            self.bind_loop(stmt.target, stmt.iter)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, None)

    def _exact(self, name: str, expr: ast.expr) -> None:
        constant = self.constant(expr)
        if constant is not None:
            self.constants[name] = constant
        elements = self.elements_of(expr)
        if elements is not None:
            self.elements[name] = elements

    def bind_loop(self, target: ast.expr, iterable: ast.expr) -> None:
        """A ``for`` target gets the elements of what it iterates."""
        if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) \
                and isinstance(target, ast.Tuple):
            if iterable.func.id == "enumerate" and iterable.args and len(target.elts) == 2:
                self.bind(target.elts[0], None)
                self.bind(target.elts[1], self.value(iterable.args[0]))
                return
            if iterable.func.id == "zip" and len(iterable.args) == len(target.elts):
                for elt, arg in zip(target.elts, iterable.args, strict=True):
                    self.bind(elt, self.value(arg))
                return
        self.bind(target, self.value(iterable))

    def bind(self, target: ast.expr, value: Values | None) -> None:
        if isinstance(target, ast.Name):
            self.assigned.add(target.id)
            self.constants.pop(target.id, None)
            self.elements.pop(target.id, None)
            if value is None:
                self.values.pop(target.id, None)
            else:
                self.values[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.bind(elt, None)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, None)

    # -- evaluation -------------------------------------------------------------

    def value(self, expr: ast.expr) -> Values | None:
        """The patterns an expression may evaluate to, or ``None`` if nothing is known."""
        try:
            found = self._value(expr)
        except RecursionError:
            return None
        return _known(set(found)) if found is not None else None

    def _part(self, expr: ast.expr) -> Values:
        found = self._value(expr)
        return found if found else _UNKNOWN

    def _value(self, expr: ast.expr) -> Values | None:
        if isinstance(expr, ast.Constant):
            return frozenset({expr.value}) if isinstance(expr.value, str) else None
        if isinstance(expr, ast.Name):
            return self.values.get(expr.id)
        if isinstance(expr, ast.JoinedStr):
            parts = [frozenset({v.value}) if isinstance(v, ast.Constant)
                     and isinstance(v.value, str) else
                     self._part(v.value) if isinstance(v, ast.FormattedValue) else
                     _UNKNOWN for v in expr.values]
            return _concat(parts)
        if isinstance(expr, ast.BinOp):
            return self._binop(expr)
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            return self._union(expr.elts)
        if isinstance(expr, ast.IfExp):
            return self._union([expr.body, expr.orelse])
        if isinstance(expr, ast.Subscript):
            return self._subscript(expr)
        if isinstance(expr, ast.Attribute):
            return self._attribute(expr)
        if isinstance(expr, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            return self._comprehension(expr)
        if isinstance(expr, ast.Call):
            return self._call(expr)
        if isinstance(expr, ast.Await):
            return self._value(expr.value)
        return None

    def _union(self, exprs: list[ast.expr]) -> Values | None:
        found: set[str] = set()
        for expr in exprs:
            found |= self._value(expr) or set()
        return frozenset(found) or None

    def _binop(self, expr: ast.BinOp) -> Values | None:
        left, right = self._value(expr.left), self._value(expr.right)
        if left is None and right is None:
            return None
        star = _UNKNOWN
        if isinstance(expr.op, ast.Add):
            return _concat([left or star, right or star])
        if isinstance(expr.op, ast.Div):
            return _join([left or star, right or star])
        if isinstance(expr.op, ast.Mod) and left is not None:
            return frozenset(_squash(_PERCENT.sub(UNKNOWN, v)) for v in left)
        return None

    def _subscript(self, expr: ast.Subscript) -> Values | None:
        base = self._value(expr.value)
        if base is None:
            return None
        if not isinstance(expr.slice, ast.Slice):
            return base  # an element of a collection of paths
        return frozenset(_cut(v) for v in base)

    def _attribute(self, expr: ast.Attribute) -> Values | None:
        base = self._value(expr.value)
        if base is None:
            return None
        if expr.attr == "parent":
            return frozenset(os.path.dirname(v) or "." for v in base)
        if expr.attr == "name":
            return frozenset(os.path.basename(v) for v in base)
        if expr.attr == "stem":
            return frozenset(os.path.splitext(os.path.basename(v))[0] for v in base)
        if expr.attr == "suffix":
            return frozenset(os.path.splitext(v)[1] for v in base)
        return None

    def _comprehension(self, expr: ast.ListComp | ast.GeneratorExp | ast.SetComp
                       ) -> Values | None:
        saved = (dict(self.values), dict(self.constants), dict(self.elements),
                 set(self.assigned))
        try:
            for generator in expr.generators:
                self.bind_loop(generator.target, generator.iter)
            return self._value(expr.elt)
        finally:
            self.values, self.constants, self.elements, self.assigned = saved

    def _call(self, call: ast.Call) -> Values | None:
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else \
            func.id if isinstance(func, ast.Name) else None
        if name is None:
            return None
        args = list(call.args)
        receiver = self._value(func.value) if isinstance(func, ast.Attribute) else None
        star = frozenset({"*"})
        if name in ("glob", "rglob") and receiver is not None and args:
            pattern = self._part(args[0])
            middle = [frozenset({"*"})] if name == "rglob" else []
            return _join([receiver, *middle, pattern]) if name == "glob" else \
                frozenset(_squash(v.rstrip("/") + "/*" + p) for v in receiver for p in pattern)
        if name in ("listdir", "scandir", "iterdir"):
            base = receiver if name == "iterdir" else (self._value(args[0]) if args else None)
            return _join([base, star]) if base is not None else None
        if name in ("with_suffix", "with_name") and receiver is not None and args:
            new = self._part(args[0])
            if name == "with_suffix":
                return frozenset(os.path.splitext(v)[0] + s for v in receiver for s in new)
            return _join([frozenset(os.path.dirname(v) for v in receiver), new])
        if name == "replace" and receiver is not None and len(args) == 2:
            old, replacement = self._value(args[0]), self._value(args[1])
            if old is None or replacement is None:
                return frozenset(_cut(v) for v in receiver)
            return frozenset(v.replace(o, n) for v in receiver for o in old for n in replacement)
        if name == "format" and receiver is not None:
            return frozenset(_squash(_BRACES.sub(UNKNOWN, v)) for v in receiver)
        if name in _JOINERS and args:
            parts = [self._part(a) for a in args]
            if receiver is not None and name == "joinpath":
                parts.insert(0, receiver)
            if not any(self._value(a) for a in args):
                return None
            return _join(parts)
        if name in _IDENTITY:
            if args:
                return self._value(args[0])
            return receiver
        return None
