"""The shapes every ledger backend shares: the :class:`Ledger` protocol, its records
(:class:`Event`, :class:`Head`, :class:`ChainProblem`) and its refusals.

The protocol is the seam for a backend: the SQLite default
(:mod:`host_kernel.store.sqlite`) and PostgreSQL (:mod:`host_kernel.store.pg`) each
implement it, and callers use only its methods. This module holds no behaviour:
hashing and checking a chain is :mod:`host_kernel.store.chain`'s, folding events into
tables :mod:`host_kernel.store.projection`'s.

Errors, all :class:`~host_kernel.RecordError`::

    RecordError                 cannot read the ledger (SQLite's own error)
    ├── RecordRefused           the record will not be used as it is; ``code`` says why:
    │                           record_missing, ledger_empty, ledger_truncated, chain_broken,
    │                           projection_drift, event_unauthenticated, record_key_missing,
    │                           record_key_invalid, record_unreadable, record_readonly
    └── ForeignEventError       foreign_event: append refused, events after the known head
                                were not written by a holder of the record key
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from .._errors import RecordError

__all__ = ["ChainProblem", "Event", "ForeignEventError", "Head", "Ledger", "RecordRefused"]


class RecordRefused(RecordError):
    """A record that a reader, or a writer opening it, will not use as it is.

    ``code`` says why (record_missing, ledger_empty, ledger_truncated,
    chain_broken, projection_drift, event_unauthenticated, record_key_missing,
    record_key_invalid, record_unreadable, record_readonly); docs/record.md
    lists them all with what to do.
    """

    code = "record_refused"


class ForeignEventError(RecordError):
    """An append was refused: the ledger holds events after this writer's known head that
    break the chain or were not written by a holder of the record key. Nothing was appended.

    ``seqs`` names those events; ``problems`` says what is wrong with each.
    """

    code = "foreign_event"

    def __init__(self, message: str, *, problems: Sequence[ChainProblem] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)
        self.seqs = tuple(sorted({p.seq for p in self.problems}))


@dataclass(frozen=True, slots=True)
class Event:
    """One row of the chain."""

    seq: int
    session: str
    ts: float
    kind: str
    body: dict[str, Any]
    prev: str
    hash: str


class Head(NamedTuple):
    """The last event of a ledger: its sequence number and hash (the chain's head)."""

    seq: int
    hash: str


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """Where and how the chain breaks."""

    seq: int
    problem: str

    def __str__(self) -> str:
        return f"event {self.seq}: {self.problem}"


class Ledger(Protocol):
    """What the Host needs from a ledger backend."""

    path: Path | None

    def append(self, session: str, kind: str, body: dict[str, Any]) -> Event: ...

    def events(self, session: str | None = None) -> Iterator[Event]: ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def head(self) -> Head | None: ...

    def has_table(self, name: str) -> bool: ...

    def close(self) -> None: ...
