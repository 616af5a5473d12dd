"""How tasks ended: :class:`TaskSummary` per task, :class:`BatchResult` per batch.

Owns these plain, frozen values (and :class:`VerdictBrief`, :class:`ArtifactBrief` within
a summary), their outcomes and their JSON form (:meth:`TaskSummary.to_dict` and
:meth:`~TaskSummary.from_dict`: what an attempt's status file holds and ``--json``
prints). They cross from the workers to the driver; they do not decide an outcome
(:mod:`._worker` does) or run anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["OUTCOMES", "ArtifactBrief", "BatchResult", "TaskSummary", "VerdictBrief"]

#: How a task ended: ``accepted`` (its submissions, or its agent's completion, accepted);
#: ``ran`` (a notebook whose code cells all ran ok and that submitted nothing: no verdict,
#: so nothing accepted); ``failed``; ``error``.
OUTCOMES = ("accepted", "ran", "failed", "error")


@dataclass(frozen=True, slots=True)
class VerdictBrief:
    """One verdict the Host gave in the session: ``refusals`` are the codes of the
    blocking checks that failed (empty when accepted)."""

    submission_id: str
    accepted: bool
    refusals: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ArtifactBrief:
    """One artifact the session saved; its bytes are in the record's blob store."""

    artifact_id: str
    filename: str
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """How one task ended, in its last attempt.

    Its ``outcome``, ``verdicts``, ``artifacts`` and ``head`` are the ledger's word: read
    back, through the verified reader, from the session's checked events once the
    attempt ended, whatever the worker's Python state held (:mod:`._ledger`).

    ``record`` is where its session's record is: a record folder, or the PostgreSQL
    ledger's URL (without its password) holding ``session_id``; ``head`` the hash of the
    session's last event as the ledger holds it. ``abandoned`` names the
    sessions of earlier attempts whose worker died under them. ``detail`` is one line for
    a person (the cell that failed, the agent's ending, the refusal codes); ``cause`` one
    line saying why a task was not accepted, from its record where it has one (the
    refusal code and its message: ``storage_error: the record's disk is full (…)``, a
    verdict's first failed check, ``host_died``), None when accepted; ``error`` the
    error's text when the outcome is ``error``. ``skipped``: the task was not run again,
    its session (``session_id``, of an earlier batch or attempt) was accepted already.
    """

    name: str
    kind: str
    outcome: str
    attempt: int = 1
    session_id: str | None = None
    verdicts: tuple[VerdictBrief, ...] = ()
    artifacts: tuple[ArtifactBrief, ...] = ()
    record: str | None = None
    workspace: str | None = None
    worker: str | None = None
    confinement: str | None = None
    seconds: float = 0.0
    detail: str = ""
    error: str | None = None
    abandoned: tuple[str, ...] = ()
    #: The hash of the last event the session's Host wrote (its chain's head): keep it
    #: where the ledger's writers cannot change it, to hold the record to it later.
    head: str | None = None
    cause: str | None = None
    skipped: bool = False

    @property
    def accepted(self) -> bool:
        return self.outcome == "accepted"

    @property
    def ok(self) -> bool:
        """Whether the task ended as it should: ``accepted``, or ``ran`` (no submission)."""
        return self.outcome in ("accepted", "ran")

    @property
    def verdict(self) -> VerdictBrief | None:
        """The deciding verdict: the first refused one, else the last; None without any."""
        refused = [v for v in self.verdicts if not v.accepted]
        return refused[0] if refused else (self.verdicts[-1] if self.verdicts else None)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types; :meth:`from_dict` reads it back."""
        return {"name": self.name, "kind": self.kind, "outcome": self.outcome,
                "attempt": self.attempt, "session_id": self.session_id,
                "verdicts": [{"submission_id": v.submission_id, "accepted": v.accepted,
                              "refusals": list(v.refusals)} for v in self.verdicts],
                "artifacts": [{"artifact_id": a.artifact_id, "filename": a.filename,
                               "sha256": a.sha256, "size": a.size} for a in self.artifacts],
                "record": self.record, "workspace": self.workspace, "worker": self.worker,
                "confinement": self.confinement, "seconds": round(self.seconds, 3),
                "detail": self.detail, "cause": self.cause, "error": self.error,
                "abandoned": list(self.abandoned), "head": self.head, "skipped": self.skipped}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskSummary:
        return cls(
            name=str(data["name"]), kind=str(data["kind"]), outcome=str(data["outcome"]),
            attempt=int(data.get("attempt", 1)), session_id=data.get("session_id"),
            verdicts=tuple(VerdictBrief(str(v["submission_id"]), bool(v["accepted"]),
                                        tuple(v.get("refusals") or ()))
                           for v in data.get("verdicts") or ()),
            artifacts=tuple(ArtifactBrief(str(a["artifact_id"]), str(a["filename"]),
                                          str(a["sha256"]), int(a["size"]))
                            for a in data.get("artifacts") or ()),
            record=data.get("record"), workspace=data.get("workspace"),
            worker=data.get("worker"), confinement=data.get("confinement"),
            seconds=float(data.get("seconds") or 0.0), detail=str(data.get("detail") or ""),
            error=data.get("error"), abandoned=tuple(data.get("abandoned") or ()),
            head=data.get("head"), cause=data.get("cause"),
            skipped=bool(data.get("skipped", False)))


@dataclass(frozen=True, slots=True)
class BatchResult:
    """Every task's summary, in the order the tasks were given."""

    summaries: tuple[TaskSummary, ...]
    seconds: float
    workers: int
    workspaces: str
    ledger: str | None = None

    @property
    def accepted(self) -> bool:
        """Whether every task was accepted (a notebook that only ran was not)."""
        return all(s.accepted for s in self.summaries)

    @property
    def ok(self) -> bool:
        """Whether every task was accepted or, submitting nothing, ran (the exit code 0)."""
        return all(s.ok for s in self.summaries)

    @property
    def failed(self) -> tuple[TaskSummary, ...]:
        """The tasks that failed (outcome ``failed`` or ``error``)."""
        return tuple(s for s in self.summaries if not s.ok)

    @property
    def reruns(self) -> int:
        """Attempts started again because a worker died under them (in this batch)."""
        return sum(len(s.abandoned) for s in self.summaries if not s.skipped)

    @property
    def skipped(self) -> tuple[TaskSummary, ...]:
        """The tasks not run again: accepted already, in an earlier batch or attempt."""
        return tuple(s for s in self.summaries if s.skipped)

    @property
    def sessions_per_minute(self) -> float:
        return 60.0 * len(self.summaries) / self.seconds if self.seconds > 0 else 0.0

    def counts(self) -> dict[str, int]:
        return {o: sum(s.outcome == o for s in self.summaries) for o in OUTCOMES}

    def to_dict(self) -> dict[str, Any]:
        """The batch's totals (not the summaries), in plain JSON types."""
        return {"tasks": len(self.summaries), **self.counts(), "reruns": self.reruns,
                "skipped": len(self.skipped),
                "seconds": round(self.seconds, 3), "workers": self.workers,
                "sessions_per_minute": round(self.sessions_per_minute, 2),
                "workspaces": self.workspaces, "ledger": self.ledger}
