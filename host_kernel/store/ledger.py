"""The ledger's names where callers have always imported them; it owns no code.

The ledger is an append-only, hash-chained, authenticated event log with
projections, kept in parts that each own one thing:

- :mod:`host_kernel.store.base`: the :class:`Ledger` protocol, the records
  (:class:`Event`, :class:`Head`, :class:`ChainProblem`) and the refusals
  (:class:`RecordRefused`, :class:`ForeignEventError`);
- :mod:`host_kernel.store.chain`: serialising, hashing and authenticating events,
  reading them back, and every check of a chain (:func:`check_chain`,
  :func:`check_macs`);
- :mod:`host_kernel.store.projection`: folding events into the projection tables
  (:func:`projection_rows`);
- :mod:`host_kernel.store.keys`: the record key (:func:`load_record_key`);
- :mod:`host_kernel.store.sqlite`: the SQLite default (:class:`SQLiteLedger`) and
  the replay (:func:`rebuild`, :func:`collector_paused`);
- :mod:`host_kernel.store.pg`: the PostgreSQL ledger.

This module only re-exports; no module of the store imports it.
"""

from __future__ import annotations

from .base import ChainProblem, Event, ForeignEventError, Head, Ledger, RecordRefused
from .chain import (
    GENESIS,
    canonical_json,
    check_chain,
    check_macs,
    event_hash,
    event_mac,
    read_events,
)
from .keys import KEY_NAME, load_record_key
from .projection import projection_rows
from .sqlite import SQLiteLedger, collector_paused, rebuild

__all__ = [
    "GENESIS",
    "KEY_NAME",
    "ChainProblem",
    "Event",
    "ForeignEventError",
    "Head",
    "Ledger",
    "RecordRefused",
    "SQLiteLedger",
    "canonical_json",
    "check_chain",
    "check_macs",
    "collector_paused",
    "event_hash",
    "event_mac",
    "load_record_key",
    "projection_rows",
    "read_events",
    "rebuild",
]
