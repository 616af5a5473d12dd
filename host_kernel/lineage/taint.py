"""What flowed into a value: sources, their bounded union, and a taint kept per key.

This module owns the values the flow tracker (``host_kernel.lineage.flow``)
computes with: :class:`Source` (one candidate input and how it was found),
:class:`Collector` (an ordered union of sources that keeps at most a bound,
first found first kept) and :class:`Taint` (what flowed into one name). It is
pure data and small operations; which taint a name gets is the tracker's rule.

A taint is a *base*, what flowed into every part of the value, and, per
known key (the ``repr`` of a literal, see ``host_kernel.lineage.keys``), what
flowed into the value at that key. :meth:`Taint.view` is what a read gets:
the base and the keys it reads, or everything when it reads a key not known
(the value there came from somewhere the keys do not say). A change of the
value that is not a store at a key (:meth:`Taint.merged` with ``change``)
adds to the base of a dict and folds the keys into the base of anything
else, whose indices may have moved; :meth:`Taint.stored` replaces one key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the key analysis is the tracker's; the Host's start reads only the names here
    from .keys import KeyUse

__all__ = ["DEF_USE", "METHODS", "OBSERVED", "RECEIPT", "TRACED", "Collector", "Identity",
           "Source", "Taint", "file_key"]

#: Read by the cell itself, as the Host's OS-level tracer saw (host_kernel/sandbox/trace.py).
TRACED = "traced"
#: Read by the cell itself, as the kernel's audit hook reported (untraced sessions).
OBSERVED = "observed"
DEF_USE = "def-use"
RECEIPT = "receipt"
#: how an input was found
METHODS = frozenset({TRACED, OBSERVED, DEF_USE, RECEIPT})

#: what makes two sources one: the key and the bytes
Identity = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class Source:
    """One candidate input: a file, an artifact or a receipt, and how it was found."""

    key: str  # "file:<relpath>", "artifact:<uuid>" or "receipt:<id>"
    method: str  # "traced" | "observed" | "def-use" | "receipt"
    via_cell: str  # the cell where it was read or produced
    sha256: str | None = None  # hash at read time, when known

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"unknown source method {self.method!r}; expected one of {sorted(METHODS)}"
            )
        if not self.key:
            raise ValueError("a source needs a key")

    @property
    def identity(self) -> Identity:
        return (self.key, self.sha256)

    def to_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "method": self.method,
            "via_cell": self.via_cell,
            "sha256": self.sha256,
        }


def file_key(relpath: str) -> str:
    """The source key of a workspace file."""
    return f"file:{relpath}"


class Collector:
    """An ordered, bounded union of sources, first found first kept."""

    __slots__ = ("_limit", "_sources", "truncated")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._sources: dict[Identity, Source] = {}
        self.truncated = False

    def add(self, source: Source) -> None:
        identity = source.identity
        if identity in self._sources:
            return
        if len(self._sources) >= self._limit:
            self.truncated = True
            return
        self._sources[identity] = source

    def extend(self, sources: Iterable[Source]) -> None:
        for source in sources:
            self.add(source)

    def result(self) -> tuple[Source, ...]:
        return tuple(self._sources.values())


@dataclass(frozen=True, slots=True)
class Taint:
    """What flowed into one name's current value (see the module docstring)."""

    # the base: what flowed into every part of the value
    sources: tuple[Source, ...] = ()
    truncated: bool = False
    # free names a function body reads, resolved when the function is used
    late: frozenset[str] = frozenset()
    # known key -> what flowed into the value at that key (beside the base)
    keys: Mapping[str, tuple[Source, ...]] = field(default_factory=dict)
    # bound to a fresh dict: a change that is not a store at a key leaves the keys
    is_dict: bool = False
    # names a use (a call) of this value changes
    changes: frozenset[str] = frozenset()
    # a function returning closures with state
    makes_state: bool = False

    def whole(self) -> tuple[Source, ...]:
        if not self.keys:
            return self.sources
        return tuple(dict.fromkeys([*self.sources, *(s for part in self.keys.values()
                                                      for s in part)]))

    def view(self, use: KeyUse | None) -> tuple[Source, ...]:
        """What a read at the keys ``use`` gets (``None``: the whole value)."""
        if use is None or not self.keys:
            return self.whole()
        keys, negated = use
        if negated:
            parts = [part for key, part in self.keys.items() if key not in keys]
        elif keys <= set(self.keys):
            parts = [self.keys[key] for key in sorted(keys)]
        else:
            return self.whole()
        return tuple(dict.fromkeys([*self.sources, *(s for part in parts for s in part)]))

    def merged(self, new: Taint, limit: int, *, change: bool = False) -> Taint:
        """This or ``new`` (a piece that may not have run), or with ``change``, this value
        changed by what ``new`` carries; at most ``limit`` sources each."""
        merged = Collector(limit)
        merged.extend(self.sources)
        merged.extend(new.sources)
        keys: dict[str, tuple[Source, ...]] = {}
        if change and not self.is_dict:
            merged.extend(self.whole())  # a list's indices may have moved: keys fold in
        elif change:
            keys = dict(self.keys)
        else:
            for key in dict.fromkeys([*self.keys, *new.keys]):
                part = Collector(limit)
                part.extend(self.keys.get(key, ()))
                part.extend(new.keys.get(key, ()))
                keys[key] = part.result()
        return Taint(
            sources=merged.result(),
            truncated=self.truncated or new.truncated or merged.truncated,
            late=self.late | new.late,
            keys=keys,
            is_dict=self.is_dict and (change or new.is_dict),
            changes=self.changes | new.changes,
            makes_state=self.makes_state or new.makes_state,
        )

    def stored(self, key: str, value: Taint, limit: int, *, replaces: bool) -> Taint | None:
        """This container after ``value`` is stored at ``key`` (``replaces``: what was
        there is gone), or added to what is there; ``None`` when the key may name
        another element (a negative index into anything but a dict)."""
        if not self.is_dict and key.startswith("-"):
            return None
        part = Collector(limit)
        if not replaces:
            part.extend(self.keys.get(key, ()))
        part.extend(value.sources)
        return replace(self, keys={**self.keys, key: part.result()},
                       truncated=self.truncated or value.truncated or part.truncated)
