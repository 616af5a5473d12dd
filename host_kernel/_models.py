"""The values that cross a boundary, as the package hands them out: each with its cards.

Observations, receipts, artifacts, verdicts and the rest are defined in
:mod:`host_kernel._values`, with no display code; their HTML and Markdown cards
in :mod:`host_kernel._display`, which registers them for the value types when
imported. This module imports both, so a value imported from here shows itself
in a notebook through IPython's display protocol. It owns nothing else.
"""

from __future__ import annotations

from . import _display  # noqa: F401 - registers the values' cards (host_kernel._displayed)
from ._displayed import Displayed as Displayed
from ._values import (
    Artifact,
    Check,
    FileChange,
    FileRecord,
    Observation,
    Receipt,
    Verdict,
)
from ._values import Status as Status

__all__ = [
    "Artifact",
    "Check",
    "FileChange",
    "FileRecord",
    "Observation",
    "Receipt",
    "Verdict",
]
