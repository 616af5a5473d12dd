"""The submission model: what a submitter declared, and the bounds it is held to.

Owns :class:`Submission` (as received from ``submit_output`` or
``finalize_response``), the size and count bounds, the task statuses, and the
normalising of a workspace-relative path a submission names. It checks
nothing itself: the checks live in the verifier's other modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

STATUSES = ("completed", "partial", "blocked", "failed")
MAX_OUTPUT_BYTES = 1024 * 1024
MAX_OUTPUT_DEPTH = 32
MAX_ENTRIES = 10_000


@dataclass(frozen=True, slots=True)
class Submission:
    """What a submitter declared. Values are as received: types are checked here."""

    output: Any
    completion_bullets: Any
    task_status: Any = None
    output_schema: Any = None
    source_files: Any = None
    entry_points: Any = None
    architecture_summary: Any = None
    test_evidence: Any = None
    #: ``codebase_change``: baseline tests whose behaviour the change means to alter, each
    #: ``{"test": node id or file, "reason": why}`` (shown first to a reviewer).
    intended_changes: Any = None
    #: ``reusable_pipeline``: commands the Host re-runs on the declared files, each
    #: ``{"command": …, "artifacts": [artifact id, …]}``; each must write its artifacts'
    #: exact bytes (shape: :func:`host_kernel.modes.parse_regenerates`).
    regenerates: Any = None
    #: ``True``: accepted only when the Host re-derives every artifact ``output`` claims
    #: from its slice, in a fresh confined kernel (``not_rederived`` otherwise).
    rederive: Any = None
    #: Set by the Host when the output could not be serialised in the kernel.
    output_error: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Submission:
        """From the wire: unknown keys are ignored, missing ones are None (and fail checks)."""
        names = cls.__dataclass_fields__
        fields = {k: v for k, v in data.items() if k in names}
        fields.setdefault("output", None)
        fields.setdefault("completion_bullets", None)
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _norm(claim: str) -> str | None:
    if not claim or "\x00" in claim:
        return None
    pure = PurePosixPath(claim)
    if pure.is_absolute() or ".." in pure.parts:
        return None
    return pure.as_posix()
