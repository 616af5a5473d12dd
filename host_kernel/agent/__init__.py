"""The reference notebook agent over a Host: prompt layers, the loop, its event stream.

* :mod:`.layers`: the typed inventory of prompt layers and the assembly of a request;
* :mod:`.loop`: :func:`run_agent`, one session from task to verdict (the
  parts of its turn: :mod:`.session`, :mod:`.cells`, :mod:`.tools`,
  :mod:`.forks`, :mod:`.resume`; what it returns: :mod:`.result`);
* :mod:`.subtasks`: the sub-tasks ``host.delegate`` starts, each a child
  session in a thread, bounded (:mod:`.delegation` wires them to
  :func:`run_agent` for a Host made by hand);
* :mod:`.events`: the typed events and their NDJSON log;
* :mod:`.projection`: the frozen snapshot those events fold into, live or replayed;
* :mod:`.commands`: ``host-kernel run``, ``trace`` and ``mcp``.

Names are re-exported lazily, so ``host-kernel`` subcommands that do not use
the agent do not pay for importing it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers and readers
    from .events import EventLog, progress_line
    from .layers import LAYERS, Layer, LayerClass, system_prefix
    from .loop import AgentResult, Outcome, Prices, run_agent
    from .projection import Projection, Snapshot, fold, replay

_WHERE = {
    "EventLog": ".events",
    "progress_line": ".events",
    "Projection": ".projection",
    "Snapshot": ".projection",
    "fold": ".projection",
    "replay": ".projection",
    "LAYERS": ".layers",
    "Layer": ".layers",
    "LayerClass": ".layers",
    "system_prefix": ".layers",
    "AgentResult": ".loop",
    "Outcome": ".loop",
    "Prices": ".loop",
    "run_agent": ".loop",
}

__all__ = [
    "LAYERS",
    "AgentResult",
    "EventLog",
    "Layer",
    "LayerClass",
    "Outcome",
    "Prices",
    "Projection",
    "Snapshot",
    "fold",
    "progress_line",
    "replay",
    "run_agent",
    "system_prefix",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'host_kernel.agent' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
