"""Delegation for the Python API: a :class:`Delegator` whose sub-tasks are agent sessions.

Owns one wiring: :class:`Delegator` is a :class:`~.subtasks.SubtaskRunner`
that runs each child with :func:`~.loop.run_agent`, so a Host made by hand
(``Host(ws, delegator=Delegator(llm, DelegationConfig()))``) delegates to
whole agent sessions. How children are started, bounded, cut and handed back
is :mod:`.subtasks`'; :func:`~.loop.run_agent` builds its own runner (with
itself as the child runner) and so never imports this module.
"""

from __future__ import annotations

from typing import Any

from .loop import run_agent
from .subtasks import DelegationConfig, SubtaskRunner, default_concurrency

__all__ = ["DelegationConfig", "Delegator", "default_concurrency"]


class Delegator(SubtaskRunner):
    """Starts, bounds, cuts and hands back the sub-tasks of one agent session, each a
    :func:`~.loop.run_agent` session."""

    def __init__(self, llm: Any, config: DelegationConfig, *, prices: Any = None,
                 system_layers: Any = None, skills: Any = None) -> None:
        """``system_layers`` and ``skills``: the parent's, which its children share (the
        SYSTEM.md files and the skills catalog of the parent's workspace and user)."""
        super().__init__(llm, config, run_child=run_agent, prices=prices,
                         system_layers=system_layers, skills=skills)
