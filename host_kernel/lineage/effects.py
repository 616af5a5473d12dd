"""Side effects of the calls in one cell: figures drawn into, objects mutated, names linked.

This module owns what a cell's calls do to objects other than the names they
bind, read from the syntax tree with the library facts in
``host_kernel.lineage.knowledge``. ``host_kernel.lineage.defuse`` merges the
answer into a cell's :class:`~host_kernel.lineage.defuse.CellNames`; the flow
tracker applies it. Function and class bodies are not looked into (they run
when called, and their effects are not seen).

The rules, each an over-approximation where it is unsure:

* **Links.** Names that come to refer to one object, or to parts of one
  object, are linked, so that drawing into (mutating) one taints the others:
  the targets of a figure-making call and the figure it makes current
  (``fig, ax = plt.subplots()``), a part and its whole (``ax =
  fig.add_subplot()``, ``ax2 = ax.twinx()``, ``fig = ax.figure``), what a
  drawing call returns and what it drew into (``im = ax.imshow(a)``), and
  aliases (``ax = axes[0]``, ``b = a``, ``for ax in axes:``).
* **Drawing** (see ``knowledge``): a call that draws into an object mutates
  it (``ax.bar(x)``, ``axes[0].plot(x)``, ``sns.lineplot(data=df, ax=ax)``);
  one that draws on pyplot's implicit figure mutates the pseudo-name
  :data:`~host_kernel.lineage.knowledge.CURRENT_FIGURE` (``plt.plot(x)``,
  ``df.plot()``, ``sns.histplot(df)``). ``plt.figure()``/``plt.subplots()``
  rebind it, ``plt.close()``/``plt.clf()`` clear it (``deleted`` unless
  something draws after), ``plt.savefig(...)`` reads it.
* **Mutation through arguments**: every name (or the root name of
  ``a.b``/``a[k]``) passed to a call that is not known pure may be mutated by
  it (``fill(rows, data)`` mutates ``rows`` and ``data``). Calls of methods
  (``df.merge(other)``) are not counted: a method changes its receiver, which
  ``defuse`` already handles. Known-pure callables (``len``, ``print``,
  ``json.dumps``, ``np.mean`` ...) are listed in ``knowledge``.
* ``from m import *`` binds names that cannot be listed: it mutates the
  pseudo-name :data:`~host_kernel.lineage.knowledge.UNKNOWN_NAMES`, which the
  flow tracker consults for names it has never seen bound.
* **Functions with state** (:func:`function_state`, read from a ``def`` when
  it is defined, applied by the flow tracker when a later piece uses the
  function): a call of a function decorated with a cache decorator
  (``functools.lru_cache``, ``functools.cache``, see ``knowledge``) changes
  the function itself, since it keeps what the call read; a call of a
  function whose body changes a module-level name (``_memo[key] = value``,
  ``seen.add(x)``, ``results.append(df)``, a ``global`` assignment) changes
  that name. A function whose body builds a closure that changes a name of
  the enclosing call (``memo = {}`` then ``def get(k): memo[k] = ...``)
  makes values with state: what a piece binds from it is changed by its own
  later calls.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import knowledge as kb
from .knowledge import CURRENT_FIGURE, UNKNOWN_NAMES
from .paths import bound_names

__all__ = ["CallEffects", "FunctionState", "call_effects", "function_state"]


@dataclass(frozen=True, slots=True)
class CallEffects:
    """What a cell's calls do beyond binding names (see the module docstring)."""

    mutated: frozenset[str] = frozenset()
    #: groups of names that refer to one object (or parts of one) after the cell
    links: tuple[frozenset[str], ...] = ()
    #: names the cell rebinds by a call's effect (the current figure)
    defined: frozenset[str] = frozenset()
    deleted: frozenset[str] = frozenset()
    #: names read by a call's effect before the cell rebinds them (``plt.savefig``)
    used: frozenset[str] = frozenset()


def call_effects(tree: ast.Module, modules: Mapping[str, str]) -> CallEffects:
    """The effects of a parsed cell; ``modules`` maps imported names to dotted modules."""
    visitor = _Effects(modules)
    for stmt in tree.body:
        visitor.visit(stmt)
    return visitor.result()


@dataclass(frozen=True, slots=True)
class FunctionState:
    """What calling a function defined by the cell changes (see the module docstring)."""

    #: module-level names a call may change (the function itself when it is cached)
    changes: frozenset[str] = frozenset()
    #: the function returns closures that keep state between their calls
    makes_state: bool = False


def function_state(node: ast.FunctionDef | ast.AsyncFunctionDef, free: set[str],
                   global_stores: set[str]) -> FunctionState:
    """The state a ``def`` keeps: ``free`` are its body's free names, ``global_stores``
    the module names it binds through ``global``."""
    cached = any(_called_name(d) in kb.CACHE_DECORATORS for d in node.decorator_list)
    changes = (_changed_roots(node.body) & free) | global_stores
    if cached:
        changes.add(node.name)
    params = {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                              node.args.vararg, node.args.kwarg) if a is not None}
    own = params.union(*(bound_names(stmt) for stmt in node.body))
    makes_state = False
    for inner in ast.walk(ast.Module(body=node.body, type_ignores=[])):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            body = inner.body if isinstance(inner.body, list) else [inner.body]
            if _changed_roots(body) & own or any(
                    isinstance(n, ast.Nonlocal) for stmt in body for n in ast.walk(stmt)):
                makes_state = True
                break
    return FunctionState(frozenset(changes), makes_state)


def _called_name(expr: ast.expr) -> str | None:
    """``lru_cache`` for ``functools.lru_cache``, ``lru_cache(maxsize=None)``, ``cache``."""
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return expr.id if isinstance(expr, ast.Name) else None


def _changed_roots(body: Sequence[ast.AST]) -> set[str]:
    """Names whose objects statements change: stores through a subscript or attribute,
    mutating methods anywhere, any method called as a statement."""
    found: set[str] = set()
    for stmt in body:
        for node in ast.walk(stmt):
            root: str | None = None
            if isinstance(node, (ast.Subscript, ast.Attribute)) \
                    and not isinstance(node.ctx, ast.Load):
                root = _root(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in kb.MUTATING_METHODS:
                root = _root(node.func.value)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                    and isinstance(node.value.func, ast.Attribute):
                root = _root(node.value.func.value)
            if root is not None:
                found.add(root)
    return found


def _root(expr: ast.expr) -> str | None:
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Starred)):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _target_names(target: ast.expr) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_target_names(e) for e in target.elts))
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return set()


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


class _Effects(ast.NodeVisitor):
    def __init__(self, modules: Mapping[str, str]) -> None:
        self.modules = dict(modules)
        self.mutated: set[str] = set()
        self.links: list[set[str]] = []
        self.events: list[str] = []  # "new" | "clear" | "draw" | "save", in order

    def result(self) -> CallEffects:
        defined: set[str] = set()
        deleted: set[str] = set()
        used: set[str] = set()
        resets = [i for i, e in enumerate(self.events) if e in ("new", "clear")]
        first_reset = resets[0] if resets else len(self.events)
        if "save" in self.events[:first_reset]:
            used.add(CURRENT_FIGURE)
        if resets:
            last = resets[-1]
            if self.events[last] == "new" or "draw" in self.events[last:]:
                defined.add(CURRENT_FIGURE)
            else:
                deleted.add(CURRENT_FIGURE)
        elif "draw" in self.events:
            self.mutated.add(CURRENT_FIGURE)
        links = tuple(frozenset(group) for group in self.links if len(group) > 1)
        return CallEffects(frozenset(self.mutated), links, frozenset(defined),
                           frozenset(deleted), frozenset(used))

    # -- scopes that do not run here ----------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        return

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        return

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        return

    def visit_Lambda(self, node: ast.Lambda) -> None:
        return

    # -- imports ----------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.modules[alias.asname] = alias.name
            else:
                first = alias.name.partition(".")[0]
                self.modules[first] = first

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            if alias.name == "*":
                self.mutated.add(UNKNOWN_NAMES)
            else:
                self.modules[alias.asname or alias.name] = f"{module}.{alias.name}".lstrip(".")

    # -- bindings that link -----------------------------------------------------

    def visit_Assign(self, node: ast.Assign) -> None:
        targets: set[str] = set()
        for target in node.targets:
            targets |= _target_names(target)
        self._bound(targets, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._bound(_target_names(node.target), node.value)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._bound({node.target.id}, node.value)
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self._for(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self._for(node)

    def _for(self, node: ast.For | ast.AsyncFor) -> None:
        iterable = node.iter
        if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) \
                and iterable.func.id in ("enumerate", "zip", "reversed", "sorted", "list") \
                and iterable.args:
            roots = {_root(a) for a in iterable.args} - {None}
        else:
            roots = {_root(iterable)} - {None}
        targets = _target_names(node.target)
        roots -= set(self.modules)
        if roots and targets:
            self.links.append(targets | {r for r in roots if r is not None})
        self.generic_visit(node)

    def _bound(self, targets: set[str], value: ast.expr) -> None:
        if not targets:
            return
        if isinstance(value, (ast.Name, ast.Subscript, ast.Attribute)):
            root = _root(value)
            if root is not None and root not in self.modules:
                self.links.append(targets | {root})
            return
        if isinstance(value, ast.Await):
            value = value.value
        if isinstance(value, ast.Call):
            joined = self._figure_call(value)
            if joined:
                self.links.append(targets | joined)

    # -- calls ------------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        if not self._figure_call(node):
            self._arguments(node)
        self.generic_visit(node)

    def _library_call(self, func: ast.expr) -> tuple[str, str] | None:
        """(library, function) for ``plt.plot`` / ``sns.histplot`` / ``plot`` (imported)."""
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            library = kb.library_of(func.value.id, self.modules)
            if library is not None:
                return library, func.attr
        if isinstance(func, ast.Name) and func.id in self.modules:
            library, _, name = self.modules[func.id].rpartition(".")
            return library, name
        return None

    def _figure_call(self, call: ast.Call) -> set[str]:
        """Note what a figure call does; return what its result is a part of (empty if
        it is not a figure call). Classification happens once per call node."""
        seen = getattr(call, "_hk_effect", None)
        if seen is not None:
            return set(seen)
        joined = self._classify(call)
        call._hk_effect = frozenset(joined)  # type: ignore[attr-defined]
        return joined

    def _classify(self, call: ast.Call) -> set[str]:
        found = self._library_call(call.func)
        if found is not None:
            library, name = found
            if library in kb.PYPLOT_MODULES:
                return self._pyplot(name)
            if library in kb.SEABORN_MODULES:
                return self._seaborn(call, name)
        func = call.func
        if not isinstance(func, ast.Attribute):
            return set()
        receiver = _root(func.value)
        target = _keyword(call, "ax")
        axes = _root(target) if target is not None else None
        pandas_plot = func.attr in kb.PANDAS_PLOT_METHODS or (
            isinstance(func.value, ast.Attribute) and func.value.attr == "plot")
        if pandas_plot and receiver not in self.modules:
            if receiver is not None:
                self.mutated.add(receiver)
            if axes is not None:
                self.mutated.add(axes)
                return {axes}
            self.events.append("draw")
            return {CURRENT_FIGURE} | ({receiver} if func.attr in kb.DRAW_METHODS
                                       and receiver is not None else set())
        if receiver is None or receiver in self.modules:
            return set()
        if func.attr in kb.DRAW_METHODS:
            self.mutated.add(receiver)
            return {receiver}
        if func.attr in kb.PART_METHODS:
            return {receiver}
        return set()

    def _pyplot(self, name: str) -> set[str]:
        if name in kb.PYPLOT_NEW:
            self.events.append("new")
        elif name in kb.PYPLOT_CLEAR:
            self.events.append("clear")
            return set()
        elif name in kb.PYPLOT_SAVE:
            self.events.append("save")
            return set()
        elif name in kb.PYPLOT_NEUTRAL:
            return set()
        elif name not in kb.PYPLOT_PART:
            self.events.append("draw")
        return {CURRENT_FIGURE}

    def _seaborn(self, call: ast.Call, name: str) -> set[str]:
        if name in kb.SEABORN_NEUTRAL or name.startswith(("set", "load_")):
            return set()
        target = _keyword(call, "ax")
        axes = _root(target) if target is not None else None
        if axes is not None:
            self.mutated.add(axes)
            return {axes}
        self.events.append("new" if name in kb.SEABORN_FIGURE_LEVEL else "draw")
        return {CURRENT_FIGURE}

    def _arguments(self, call: ast.Call) -> None:
        """Mutation through arguments: a call not known pure may change what it is given."""
        func = call.func
        if isinstance(func, ast.Name):
            dotted = self.modules.get(func.id, func.id)
        elif isinstance(func, ast.Attribute):
            parts: list[str] = []
            expr: ast.expr = func
            while isinstance(expr, ast.Attribute):
                parts.append(expr.attr)
                expr = expr.value
            if not isinstance(expr, ast.Name):
                return
            library = kb.library_of(expr.id, self.modules)
            if library is None:
                return  # a method: it changes its receiver (defuse's rule), not its arguments
            dotted = ".".join([library, *reversed(parts)])
        else:
            return
        if kb.is_pure(dotted):
            return
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            root = _root(arg)
            if root is not None and root not in self.modules:
                self.mutated.add(root)
