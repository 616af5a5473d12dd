"""IPython's display protocol for the Host's values, and the table of cards behind it.

Owns :class:`Displayed` (the ``_repr_*_`` methods a value shows itself with),
:func:`mimebundle` (IPython's ``_repr_mimebundle_``) and the table a value's
cards are looked up in, by its type and a media type (:func:`register`,
:func:`draw`). It names no value and no card: :mod:`host_kernel._display`
registers the cards for the value types when it is imported, and the modules
the values are handed out from (:mod:`host_kernel._models`,
:mod:`host_kernel.lineage.graph`) import it, so the values depend on this
protocol only, never on their displays.

A value whose card is not registered raises :class:`NotImplementedError` from
that ``_repr_*_`` method, which IPython reads as "no such representation".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

__all__ = ["Displayed", "draw", "mimebundle", "register"]

V = TypeVar("V")

#: Each value type's cards by media type (``text/html``, ``text/markdown``, …).
_CARDS: dict[type, dict[str, Callable[[Any], str]]] = {}


def register(cls: type[V], cards: Mapping[str, Callable[[V], str]]) -> None:
    """Draw values of ``cls`` (and its subclasses) with ``cards``, one per media type."""
    _CARDS.setdefault(cls, {}).update(cards)


def draw(value: object, mime: str) -> str:
    """``value``'s ``mime`` card, from the nearest type in its MRO that has one."""
    for cls in type(value).__mro__:
        card = _CARDS.get(cls, {}).get(mime)
        if card is not None:
            return card(value)
    raise NotImplementedError(f"no {mime} card is registered for {type(value).__name__}")


def mimebundle(
    renderers: Mapping[str, Callable[[], Any]],
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> dict[str, Any]:
    """IPython's ``_repr_mimebundle_``: each media type asked for, rendered only if asked.

    ``text/plain`` is always there unless excluded by name: frontends without
    rich output, and the Host's Observation text, read it.
    """
    wanted = set(include) if include else None
    unwanted = set(exclude) if exclude else set()
    return {
        mime: render()
        for mime, render in renderers.items()
        if mime not in unwanted and (wanted is None or mime in wanted or mime == "text/plain")
    }


class Displayed:
    """IPython's display protocol for a value: ``text/plain``, ``text/html``, ``text/markdown``.

    ``text/plain`` is :meth:`_plain_text` (the ``repr`` unless a class says
    otherwise); the Host builds an Observation's text from it, so it stays
    compact. Each rich form is rendered only when a frontend asks for it, by the
    card registered for the value's type.
    """

    __slots__ = ()

    def _plain_text(self) -> str:
        return repr(self)

    def _repr_html_(self) -> str:
        return draw(self, "text/html")

    def _repr_markdown_(self) -> str:
        return draw(self, "text/markdown")

    def _renderers(self) -> dict[str, Callable[[], Any]]:
        return {"text/plain": self._plain_text, "text/html": self._repr_html_,
                "text/markdown": self._repr_markdown_}

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return mimebundle(self._renderers(), include, exclude)
