"""How an agent session ended, and what prices its spend: the loop's typed result records.

Owns :class:`Outcome`, :class:`AgentResult` (what :func:`~.loop.run_agent`
returns), :class:`Prices` (a cost estimate where the provider reports none)
and the two exceptions that stop a session early (over its budget, cut from
outside). It does not run anything: the turn cycle is :mod:`.loop`'s.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from .._models import Verdict
from .projection import Snapshot

__all__ = ["AgentResult", "BudgetExceeded", "Cancelled", "Outcome", "Prices"]


class Outcome(enum.Enum):
    ACCEPTED = "accepted"        # a submission was accepted by the Host's verifier
    STEP_LIMIT = "step_limit"    # max_steps requests were made without an accepted one
    INTERRUPTED = "interrupted"  # the user pressed Ctrl-C (KeyboardInterrupt)
    ERROR = "error"              # the provider or the Host failed in a way the loop cannot fix
    BUDGET = "budget_exceeded"   # the priced spend passed budget_usd
    CANCELLED = "cancelled"      # the session was cut from outside (a sub-task's timeout)


class BudgetExceeded(Exception):
    """The priced spend passed ``budget_usd``: the session ends ``budget_exceeded``."""


class Cancelled(Exception):
    """The session was cut from outside: it ends ``cancelled``."""


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per million tokens, for a cost estimate where the provider reports none."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_mtok
                + completion_tokens * self.output_per_mtok) / 1_000_000


@dataclass(frozen=True, slots=True)
class AgentResult:
    """How a session ended. ``verdict`` is the last one the Host gave (accepted or not)."""

    outcome: Outcome
    verdict: Verdict | None
    steps: int
    session_id: str
    record_dir: Path
    events_path: Path
    snapshot: Snapshot
    reason: str | None = None
    final_message: str | None = None
    resumed: bool = False

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPTED
