"""Carrying reads forward across cells: which inputs flowed into a written file.

This module owns the bookkeeping the Host does after each cell, in order:
for every variable name, the set of :class:`Source` values (files read,
artifacts loaded, receipts) that flowed into its current value; and for
every workspace file written in the session, the candidate inputs of its
current content. It is pure: no I/O, no clock, no hashing, no ledger. It does
not decide what a cell read (the capture hook and the Host's own calls say
so), what the names mean (``host_kernel.lineage.defuse`` does), or which
candidates really flowed (the optional dataflow prompt may narrow them, never
add). It over-approximates on purpose.

The model, and its documented approximations:

* **Cell-level taint.** When a cell runs, everything it read directly plus
  the taint of every name it used is the cell's *incoming* set. Each name the
  cell binds gets that whole set as its taint, whatever statement bound it
  (an over-approximation within a cell); precision comes from rebinding: a
  name bound again in a later cell has its taint *replaced*, which cuts stale
  edges. ``del name`` clears it. A name mutated in place (``rows.append(x)``)
  keeps its old taint and gains the incoming set.
* **Imports** bind modules, not data: their names get no taint, and method
  calls on them (``json.dump(obj, fh)``) are not mutations. Except
  **workspace modules**: code in the workspace is an input of what it
  computes. When a cell that imports ``X`` (``import X``, ``from X import
  f``, ``import pkg.X as m``) directly read a file holding ``X`` or one of
  its parent packages (``X.py``, ``pkg/X.py``, ``pkg/__init__.py``, see
  ``knowledge.module_files_match``), the imported name gets that read as its
  taint, and the tracker remembers it for the module, so a later import that
  Python serves from its cache gets it too.
* **Linked names** (``defuse``'s ``links``: ``fig, ax = plt.subplots()``,
  ``ax = fig.add_subplot()``, ``ax = axes[0]``) refer to one object: the
  tracker keeps them in one group until a name is rebound or deleted. When a
  cell mutates a member (``ax.plot(x)``), every member gets the union of the
  group's taints; a member bound by the cell gets the taint of the members it
  joined. pyplot's current figure is the pseudo-name
  ``knowledge.CURRENT_FIGURE``: drawing on it mutates it, ``plt.savefig``
  uses it, ``plt.figure()`` rebinds it and ``plt.close()`` deletes it.
* **Unknown names.** ``from m import *`` and a ``%run`` whose script is not
  known bind names that cannot be listed; their taint accumulates in the
  pseudo-name ``knowledge.UNKNOWN_NAMES``, and a name used later that the
  tracker has never seen bound gets that taint (except names the kernel
  binds itself, ``knowledge.KERNEL_NAMES``, and names starting with ``_``).
* **Pieces of one cell.** ``host_kernel.lineage.statements`` may feed a cell
  as several pieces. ``continues=True`` says a piece belongs to the same run
  as the previous call: a file written by several pieces of one run gets the
  union of their inputs. ``conditional=True`` says the piece may not run, or
  may run many times (a loop body): the names it binds keep their old taint
  and gain the new, like a mutation.
* **Containers at known keys.** A name's taint is a *base* (what flows into
  every part of its value) and, per known key, the taint of the value at
  that key (keys are literals, ``defuse``'s ``key_uses``/``key_store``). A
  piece ``d['k'] = v`` replaces the taint at ``'k'`` (a conditional piece
  adds to it) and leaves the base; ``statements`` feeds ``d = {'a': x, 'b':
  y}``, a dict or list comprehension over literals and an unrolled loop
  filling ``d[name]`` as such stores. A read ``d['k']`` gets the base and the
  taint at ``'k'``, or the whole taint when ``'k'`` is not a known key; a
  read that excludes keys (``k != 'a'``) gets every other known key; any
  other use, and a key that cannot be known, read it whole. A change of the
  value that is not a store at a key adds to the base of a dict (bound to
  ``{}``, a display, a comprehension or ``dict()``), and folds the keys into
  the base of anything else (a list's indices may shift). A store at a key of
  a linked name gives the other members what was stored (they may be
  aliases), except a member bound to what is at another key (``keep =
  d['a']``, ``defuse``'s ``part``), which a store at ``'b'`` does not reach.
  The rules themselves are in ``host_kernel.lineage.taint``.
* **Functions and classes** (bound by ``def``/``class``) get, at definition,
  the taint of what their definition reads (decorators, defaults, base
  classes, class bodies; for a class also the cell's direct reads, since a
  class body runs then). The free names their bodies read are resolved each
  time a later cell uses the function, against the taint those names have at
  that time (late binding, followed transitively, cycles cut). So a helper
  defined before its data is loaded still carries the data, and rebinding
  the data between definition and call is honoured. A lambda assigned to a
  name is an ordinary value: its free names are resolved at definition.
* **Functions with state.** A piece that uses a function whose calls change
  something (``defuse``'s ``FunctionNames.changes``: one cached by
  ``functools.lru_cache``/``functools.cache`` changes itself, one whose body
  fills a module-level dict or binds a ``global`` changes that name) changes
  those names: they gain the piece's incoming set, so a later call served
  from the cache, which reads nothing, still carries what the filling call
  read (and every later call of a cached function carries what every
  earlier one read). A name bound by a piece that uses a function building
  closures with state (``makes_state``: ``get = memoised()``) is changed by
  its own uses.
* **Files.** A file written by a cell gets, as inputs, the cell's direct reads
  (kept as they were reported) and the taint of the names the cell used
  (marked ``def-use``, with ``via_cell`` the cell that read them). Inputs are
  a snapshot: later cells do not change them until the file is written again.
  A file written by a cell whose code does not parse only gets the direct
  reads.
* **Rewriting in place.** A file that is an input of its own new content
  (read then rewritten, directly or through a variable) is not listed as its
  own input, since those bytes no longer exist; the inputs of its previous
  content are carried over instead. A file that was never written in the
  session and is rewritten in place thus loses the link to its original
  bytes.
* Files are not expanded transitively: a written file read by a later cell
  is one input of that cell's outputs, whose own inputs are asked for
  separately.
* A decoy file opened by an earlier cell reaches a written file only through
  a name the writing cell uses (or through a function it calls); a path that
  appears only in a string never appears, since only real reads are sources.
* **Paths between cells.** :attr:`FlowTracker.path_state` holds what names
  held as paths and literals when the last cell ended; ``statements`` reads
  and replaces it. A new generation forgets it with the names.
* Bounds: each name's taint and each file's inputs keep at most
  ``max_sources`` sources (1,000 by default), first found first kept; the
  ones cut are reported by :meth:`FlowTracker.is_truncated`.

Sources are identified by ``(key, sha256)``: the same file read twice with
the same bytes is one input, and with different bytes two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from .defuse import BUILTIN_NAMES, CellNames, cell_names
from .keys import KeyUse
from .knowledge import KERNEL_NAMES, UNKNOWN_NAMES, module_files_match
from .paths import PathState
from .taint import DEF_USE, METHODS, OBSERVED, RECEIPT, TRACED, Source, Taint, file_key
from .taint import Collector as _Collector

__all__ = ["DEF_USE", "METHODS", "OBSERVED", "RECEIPT", "TRACED", "FlowTracker", "Source",
           "file_key"]

_DEFAULT_MAX_SOURCES = 1_000


@dataclass(frozen=True, slots=True)
class _Resolved:
    sources: tuple[Source, ...]
    truncated: bool
    #: names the resolved values' uses change (functions with state)
    changes: frozenset[str] = frozenset()
    #: one of them builds closures with state
    makes_state: bool = False


@dataclass(frozen=True, slots=True)
class _FileInputs:
    sources: tuple[Source, ...]
    truncated: bool


def _first_distinct(sources: Sequence[Source], limit: int) -> Sequence[Source]:
    """``sources`` up to the ``limit``-th distinct one: what a bounded collector keeps from
    them, and one more when it would cut some (so it says it did), without looking at the
    rest (a cell that read ten thousand files is not walked through again and again)."""
    if len(sources) <= limit:
        return sources
    seen: set[tuple[str, str | None]] = set()
    for end, source in enumerate(sources):
        seen.add((source.key, source.sha256))
        if len(seen) >= limit:
            return sources[:end + 1]
    return sources


class FlowTracker:
    """Per-session def-use bookkeeping; call :meth:`observe_cell` after each cell."""

    def __init__(self, *, max_sources: int = _DEFAULT_MAX_SOURCES) -> None:
        if max_sources < 1:
            raise ValueError(f"max_sources must be at least 1, got {max_sources}")
        self._max = max_sources
        self._names: dict[str, Taint] = {}
        self._modules: set[str] = set()
        self._files: dict[str, _FileInputs] = {}
        # receipt writes noted since the last observed cell, merged into it
        self._pending: dict[str, tuple[Source, ...]] = {}
        self._cell_order: dict[str, int] = {}
        # imported name -> dotted module it is bound to (for ``cell_names``)
        self._aliases: dict[str, str] = {}
        # dotted workspace module -> the reads of its source
        self._module_sources: dict[str, tuple[Source, ...]] = {}
        # linked name -> the names that refer to the same object
        self._groups: dict[str, frozenset[str]] = {}
        # linked name -> (container, key) when it was bound to what is at that key
        self._part_of: dict[str, tuple[str, str]] = {}
        # which run of a cell last wrote each file (see ``continues``)
        self._run = 0
        self._written_in: dict[str, int] = {}
        #: what names held as paths and literals when the last cell ended (``statements``)
        self.path_state = PathState()

    # -- the Host's calls -------------------------------------------------------

    def observe_cell(
        self,
        cell_id: str,
        code: str,
        sources_read: Sequence[Source],
        files_written: Sequence[str],
        *,
        renames: Sequence[tuple[str, str]] = (),
        removes: Sequence[str] = (),
        continues: bool = False,
        conditional: bool = False,
        names: CellNames | None = None,
    ) -> None:
        """Record one executed cell (or one piece of it).

        ``sources_read``: what the cell read directly (files seen by capture,
        artifacts loaded by id, receipts). ``files_written``: workspace-relative
        paths it wrote. ``renames`` moves a file's inputs to its new name (the
        new name should also be in ``files_written``, as capture reports it);
        ``removes`` forgets files that are gone, unless also written.
        ``continues``: this call is a later piece of the run the previous call
        recorded; ``conditional``: the piece may run zero or many times (see
        the module docstring). ``names``: ``cell_names(code, modules=self.aliases())``,
        when the caller has it already.
        """
        self._cell_order.setdefault(cell_id, len(self._cell_order))
        if not continues:
            self._run += 1
        if names is None:
            names = cell_names(code, modules=self._aliases)
        direct = _Collector(self._max)
        direct.extend(_first_distinct(sources_read, self._max + 1))
        used = set(names.used)
        # a builtin name matters only if an earlier cell shadowed it
        used.update(n for n in names.builtins_used if n in self._names)
        resolved = self._resolve_all(used, names.key_uses)
        flowing, flowing_truncated = resolved.sources, resolved.truncated

        written = dict.fromkeys(files_written)
        self._write_files(cell_id, written, direct, flowing, flowing_truncated)
        for relpath, inputs in self._pending.items():
            if relpath not in written:
                continue
            current = self._files[relpath]
            merged = _Collector(self._max)
            merged.extend(current.sources)
            merged.extend(inputs)
            self._files[relpath] = _FileInputs(
                merged.result(), current.truncated or merged.truncated
            )
        self._pending.clear()
        self._apply_renames(renames)
        for relpath in removes:
            if relpath not in written:
                self._files.pop(relpath, None)

        self._update_names(names, direct, resolved, conditional)

    def aliases(self) -> dict[str, str]:
        """A copy of: imported name -> the dotted module it is bound to."""
        return dict(self._aliases)

    def module_names(self) -> frozenset[str]:
        """Names bound to modules now (a call on one changes no data)."""
        return frozenset(self._modules)

    def note_receipt_write(
        self,
        relpath: str,
        receipt_id: str,
        inputs: Sequence[Source],
        *,
        cell_id: str = "",
    ) -> None:
        """A ``host.bash`` command created or changed ``relpath``.

        The file's inputs become ``inputs`` (for instance the script the
        command ran) plus ``Source("receipt:<id>", "receipt", cell_id)``. Call
        it while the cell that ran the command is still running (before its
        ``observe_cell``): if that cell also writes the file itself, the two
        sets are merged when it is observed. A ``cell_id`` that was already
        observed is taken as final, with no merge.
        """
        collector = _Collector(self._max)
        collector.extend(inputs)
        collector.add(Source(key=f"receipt:{receipt_id}", method=RECEIPT, via_cell=cell_id))
        sources = self._without_self(relpath, collector.result())
        truncated = collector.truncated or self._inherits_truncation(relpath, collector.result())
        self._files[relpath] = _FileInputs(sources, truncated)
        if not (cell_id and cell_id in self._cell_order):
            # the command ran inside a cell not observed yet: merge with it
            self._pending[relpath] = sources

    def forget_file(self, relpath: str) -> None:
        """The file is gone (removed outside any observed cell)."""
        self._files.pop(relpath, None)
        self._pending.pop(relpath, None)

    def forget_names(self) -> None:
        """A new kernel generation: every in-memory value is gone; files keep their inputs."""
        self._names.clear()
        self._modules.clear()
        self._pending.clear()
        self._aliases.clear()
        self._groups.clear()
        self._part_of.clear()
        self.path_state = PathState()

    def fork(self) -> FlowTracker:
        """An independent copy, for asking "what if this cell ended now" (cheap:
        taints and inputs are immutable values, only the containers are copied)."""
        twin = FlowTracker(max_sources=self._max)
        twin._names = dict(self._names)
        twin._modules = set(self._modules)
        twin._files = dict(self._files)
        twin._pending = dict(self._pending)
        twin._cell_order = dict(self._cell_order)
        twin._aliases = dict(self._aliases)
        twin._module_sources = dict(self._module_sources)
        twin._groups = dict(self._groups)
        twin._part_of = dict(self._part_of)
        twin._run = self._run
        twin._written_in = dict(self._written_in)
        twin.path_state = self.path_state
        return twin

    def __deepcopy__(self, memo: dict[int, object]) -> FlowTracker:
        return self.fork()

    # -- questions --------------------------------------------------------------

    def inputs_for_file(self, relpath: str) -> tuple[Source, ...]:
        """Candidate inputs of the file's current content; ``()`` if never written."""
        inputs = self._files.get(relpath)
        return inputs.sources if inputs is not None else ()

    def is_truncated(self, relpath: str) -> bool:
        """Whether some inputs of the file were cut by the bound."""
        inputs = self._files.get(relpath)
        return inputs.truncated if inputs is not None else False

    def written_files(self) -> tuple[str, ...]:
        """Files written in the session whose inputs are known, in first-write order."""
        return tuple(self._files)

    def names_taint(self, name: str) -> tuple[Source, ...]:
        """What flowed into ``name``'s current value, as originally read (for debugging).

        For a function this includes what its body's free names carry now.
        """
        sources, _ = self._resolve([name])
        return sources

    # -- internals --------------------------------------------------------------

    def _resolve(self, names: Iterable[str]) -> tuple[tuple[Source, ...], bool]:
        """The union of the names' taints, following functions' free names now."""
        resolved = self._resolve_all(names)
        return resolved.sources, resolved.truncated

    def _resolve_all(self, names: Iterable[str],
                     key_uses: Mapping[str, KeyUse] | None = None) -> _Resolved:
        """As :meth:`_resolve`, reading the names in ``key_uses`` at those keys only, and
        saying what the uses change."""
        collector = _Collector(self._max)
        truncated = makes_state = False
        changes: set[str] = set()
        seen: set[str] = set()  # resolved whole
        # (name, the keys it is read at: only the names asked for are read at keys)
        stack = [(n, (key_uses or {}).get(n)) for n in sorted(set(names), reverse=True)]
        while stack:
            name, use = stack.pop()
            if name in seen:
                continue
            if use is None:
                seen.add(name)
            taint = self._names.get(name)
            if taint is None and name.isidentifier() and not name.startswith("_") \
                    and name not in KERNEL_NAMES:
                # never seen bound: perhaps by a star import or an unknown %run
                taint = self._names.get(UNKNOWN_NAMES)
            if taint is None:
                continue
            collector.extend(taint.view(use))
            truncated = truncated or taint.truncated
            changes |= taint.changes
            makes_state = makes_state or taint.makes_state
            stack.extend((n, None) for n in sorted(taint.late - seen, reverse=True))
        ordered = sorted(
            collector.result(),
            key=lambda s: (self._cell_order.get(s.via_cell, -1), s.key, s.sha256 or ""),
        )
        return _Resolved(tuple(ordered), truncated or collector.truncated,
                         frozenset(changes), makes_state)

    def _write_files(
        self,
        cell_id: str,
        written: Iterable[str],
        direct: _Collector,
        flowing: tuple[Source, ...],
        flowing_truncated: bool,
    ) -> None:
        collector = _Collector(self._max)
        collector.extend(direct.result())
        # A read of this same cell that reached the write through a name keeps how it was
        # found (traced, observed); only reads of earlier cells arrive by def-use.
        collector.extend(s if s.via_cell == cell_id else replace(s, method=DEF_USE)
                         for s in flowing)
        candidates = collector.result()
        truncated = direct.truncated or flowing_truncated or collector.truncated
        # every file the cell wrote shares one tuple, unless it is among its
        # own candidates (rewritten in place)
        shared = _FileInputs(candidates, truncated)
        keys = {s.key for s in candidates}
        for relpath in written:
            earlier = self._files.get(relpath) if self._written_in.get(relpath) == self._run \
                else None
            if file_key(relpath) not in keys:
                inputs = shared
            else:
                sources = self._without_self(relpath, candidates)
                inputs = _FileInputs(
                    sources, truncated or self._inherits_truncation(relpath, candidates)
                )
            if earlier is not None:
                # written by an earlier piece of the same run: both pieces' inputs
                merged = _Collector(self._max)
                merged.extend(earlier.sources)
                merged.extend(inputs.sources)
                inputs = _FileInputs(merged.result(),
                                     earlier.truncated or inputs.truncated or merged.truncated)
            self._files[relpath] = inputs
            self._written_in[relpath] = self._run

    def _without_self(self, relpath: str, candidates: tuple[Source, ...]) -> tuple[Source, ...]:
        """Drop the file itself; carry over its previous inputs if it was one."""
        key = file_key(relpath)
        own = [s for s in candidates if s.key != key]
        if len(own) == len(candidates):
            return candidates
        collector = _Collector(self._max)
        collector.extend(own)
        previous = self._files.get(relpath)
        if previous is not None:
            collector.extend(previous.sources)
        return collector.result()

    def _inherits_truncation(self, relpath: str, candidates: tuple[Source, ...]) -> bool:
        previous = self._files.get(relpath)
        key = file_key(relpath)
        return previous is not None and previous.truncated and any(s.key == key for s in candidates)

    def _apply_renames(self, renames: Sequence[tuple[str, str]]) -> None:
        for src, dst in renames:
            moved = self._files.pop(src, None)
            if moved is None:
                continue
            current = self._files.get(dst)
            collector = _Collector(self._max)
            if current is not None:
                collector.extend(current.sources)
            collector.extend(moved.sources)
            truncated = moved.truncated or collector.truncated
            if current is not None:
                truncated = truncated or current.truncated
            self._files[dst] = _FileInputs(collector.result(), truncated)

    def _update_names(
        self,
        names: CellNames,
        direct: _Collector,
        resolved: _Resolved,
        conditional: bool = False,
    ) -> None:
        incoming = _Collector(self._max)
        incoming.extend(direct.result())
        incoming.extend(resolved.sources)
        value = Taint(
            sources=incoming.result(),
            truncated=direct.truncated or resolved.truncated or incoming.truncated,
        )
        functions = {f.name: f for f in names.functions}
        modules = self._module_taints(names, direct.result())
        updates: dict[str, Taint] = {}
        # what the piece changes, and what the functions it uses change when called
        mutated = set(names.mutated) | (resolved.changes - names.defined)
        at_key: set[str] = set()

        for name in mutated - names.defined:
            if name in self._modules or (name in BUILTIN_NAMES and name not in self._names):
                continue
            old = self._names.get(name, Taint())
            store = names.key_store
            # one store at a known key replaces (or adds to) that key's value only
            stored = old.stored(store[1], value, self._max,
                                replaces=store[2] and not conditional) \
                if store is not None and store[0] == name else None
            if stored is not None and name in self._groups:
                # its aliases and parts get what was put in, not its other keys
                at_key.add(name)
            updates[name] = stored or self._merged(old, value, change=True)

        for name in names.defined:
            if name in names.imported:
                updates[name] = modules.get(name, Taint())
                continue
            function = functions.get(name)
            if function is None:
                updates[name] = replace(value, is_dict=name in names.dicts,
                                        changes=frozenset({name}) if resolved.makes_state
                                        else frozenset())
                continue
            # the definition runs now: what it reads is resolved now; the body
            # runs when called: its free names are resolved then
            defined_sources, defined_truncated = self._resolve(function.when_defined)
            at_definition = _Collector(self._max)
            if function.is_class:
                at_definition.extend(direct.result())
            at_definition.extend(defined_sources)
            updates[name] = Taint(
                sources=at_definition.result(),
                truncated=defined_truncated or at_definition.truncated,
                late=function.when_called - {name},
                changes=function.changes,
                makes_state=function.makes_state,
            )
        if conditional:
            # the piece may not run: what the names held before may still be there
            for name in names.defined:
                before = self._names.get(name)
                if before is not None:
                    updates[name] = self._merged(before, updates[name])

        for name in names.deleted:
            self._names.pop(name, None)
            self._modules.discard(name)
            self._aliases.pop(name, None)
        for name, taint in updates.items():
            self._names[name] = taint
            if name in names.imported:
                self._modules.add(name)
            elif name in names.defined:
                self._modules.discard(name)
                self._aliases.pop(name, None)
        for name, bound, _ in names.imports:
            if name in names.imported:
                self._aliases[name] = bound
        self._link(names, conditional, mutated - at_key)
        for name in at_key:
            key = names.key_store[1] if names.key_store else ""
            for member in self._groups.get(name, frozenset()) - {name}:
                whole, at = self._part_of.get(member, ("", key))
                if member in self._names and (whole != name or at == key):
                    self._names[member] = self._merged(self._names[member], value, change=True)

    def _merged(self, old: Taint, new: Taint, *, change: bool = False) -> Taint:
        return old.merged(new, self._max, change=change)

    def _module_taints(self, names: CellNames,
                       direct: tuple[Source, ...]) -> dict[str, Taint]:
        """Taint of each imported name: the reads of workspace files holding its module."""
        files = [(s.key.removeprefix("file:"), s) for s in direct if s.key.startswith("file:")]
        taints: dict[str, Taint] = {}
        for name, _, full in names.imports:
            parts = full.split(".")
            collector = _Collector(self._max)
            for end in range(1, len(parts) + 1):
                dotted = ".".join(parts[:end])
                found = tuple(s for path, s in files if module_files_match(dotted, path))
                if found:
                    self._module_sources[dotted] = found
                collector.extend(self._module_sources.get(dotted, ()))
            if collector.result():
                previous = taints.get(name, Taint())
                taints[name] = self._merged(previous, Taint(collector.result(),
                                                             collector.truncated))
        return taints

    def _leave_group(self, name: str) -> None:
        group = self._groups.pop(name, None)
        if group is None:
            return
        rest = group - {name}
        for member in rest:
            if len(rest) > 1:
                self._groups[member] = rest
            else:
                self._groups.pop(member, None)

    def _link(self, names: CellNames, conditional: bool, mutated: set[str]) -> None:
        """Keep linked names in groups and share taint within a touched group."""
        rebound = set(names.deleted) if conditional else set(names.defined) | names.deleted
        for name in rebound:
            self._leave_group(name)
        self._part_of = {part: of for part, of in self._part_of.items()
                         if not {part, of[0]} & rebound}
        if names.part is not None and not conditional:
            self._part_of[names.part[0]] = names.part[1:]
        for link in names.links:
            members = set(link) - names.deleted
            for member in list(members):
                if member not in rebound:
                    members |= self._groups.get(member, frozenset())
            if len(members) < 2:
                continue
            group = frozenset(members)
            for member in group:
                self._groups[member] = group
        touched = {self._groups[n] for n in mutated | names.defined if n in self._groups}
        for group in touched:
            present = [m for m in sorted(group) if m in self._names]
            changed = any(m in mutated for m in group)
            joined = [m for m in present if changed or m not in names.defined]
            shared = _Collector(self._max)
            for member in joined:
                # a member bound by the cell joins what it read of the others
                use = None if changed else names.key_uses.get(member)
                shared.extend(self._names[member].view(use))
            taint = Taint(shared.result(), shared.truncated)
            for member in present:
                if changed or member in names.defined:
                    self._names[member] = self._merged(self._names[member], taint, change=True)
