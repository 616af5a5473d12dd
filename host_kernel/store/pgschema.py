"""The PostgreSQL ledger's schema on a connection: checked, made when missing, keyed.

Owns what a :class:`~host_kernel.store.pg.PostgresLedger` does once when it opens:
refusing a ledger whose tables are not plain tables of its schema
(:func:`plain_tables`), running :data:`~host_kernel.store.pgwire.SCHEMA` when the
ledger lacks this version's (:func:`create_schema`), and finding or making the
record key and checking it against the ledger's ``key_check``. It does not own the
connection, its retries, nor anything written after (:mod:`.pg`).
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable
from typing import Any

from .base import RecordRefused
from .keys import KEY_ENV, _key_check, _make_key, key_path, read_key
from .pgwire import SCHEMA, SCHEMA_DIGEST, redact_url
from .projection import PROJECTION_TABLES

__all__ = ["create_schema", "plain_tables"]

#: The PostgreSQL schema (namespace) that holds the ledger's tables, in any database.
PG_SCHEMA = "host_kernel"

#: The advisory lock that serialises creating the schema (any constant of our own).
_SCHEMA_LOCK = 0x686B5F736368656D  # "hk_schem"


def plain_tables(conn: Any) -> set[str]:
    """The ledger's tables that exist (none: an empty database). Refuses, with
    ``record_unreadable``, a ledger whose events, heads or projection tables are not
    ordinary tables of its schema (a view could show each query what it wants)."""
    names = ["events", "heads", "ledger_meta", *(t for t, _ in PROJECTION_TABLES)]
    rows = conn.execute(
        "SELECT c.relname, c.relkind FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace "
        "n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = ANY(%s)",
        (PG_SCHEMA, names)).fetchall()
    odd = sorted(r[0] for r in rows if r[1] != "r")
    if odd:
        raise RecordRefused(f"the ledger's {', '.join(odd)} {'is' if len(odd) == 1 else 'are'}"
                            f" not a plain table (a view or another relation stands in its "
                            f"place); the ledger will not be read", code="record_unreadable")
    return {r[0] for r in rows}


def _schema_current(conn: Any, tables: Callable[[], bool]) -> bool:
    """Whether the ledger's tables are there, plain, and made by this version's
    :data:`SCHEMA` (its digest in ``ledger_meta``): then a writer's start need not run
    the script again (a lock every Host start would wait on, and a dozen statements for
    the server), which was most of what opening a ledger cost."""
    if not tables():
        return False
    row = conn.execute("SELECT value FROM ledger_meta WHERE name = 'schema'").fetchone()
    return row is not None and row[0] == SCHEMA_DIGEST


def create_schema(conn: Any, key: bytes | None, url: str, tables: Callable[[], bool],
                  ledger_id: Callable[[], str]) -> bytes:
    """Make the ledger's schema unless this version's is there (``tables`` checks the
    tables, as :func:`plain_tables`, and says whether events exist), then return its
    record key: ``key``, or the key file named after ``ledger_id()`` (made for a ledger
    with no events yet), checked against the ledger's ``key_check``."""
    if not _schema_current(conn, tables):
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {PG_SCHEMA}")
            conn.execute(SCHEMA)
            conn.execute("INSERT INTO ledger_meta VALUES ('ledger_id', %s) "
                         "ON CONFLICT (name) DO NOTHING", (uuid.uuid4().hex,))
            conn.execute("INSERT INTO ledger_meta VALUES ('schema', %s) ON CONFLICT "
                         "(name) DO UPDATE SET value = EXCLUDED.value", (SCHEMA_DIGEST,))
        tables()
    if key is None:
        path = key_path(ledger_id())
        if not path.exists():
            if conn.execute("SELECT 1 FROM events LIMIT 1").fetchone() is not None:
                # a fresh key would not vouch for them
                raise RecordRefused(
                    f"the ledger at {redact_url(url)} holds events, but its record key "
                    f"{path} is not here; set {KEY_ENV} to the key file its writers use",
                    code="record_key_missing")
            _make_key(path)
        key = read_key(path)
    check = _key_check(key)
    with conn.transaction():
        conn.execute("INSERT INTO ledger_meta VALUES ('key_check', %s) "
                     "ON CONFLICT (name) DO NOTHING", (check,))
        row = conn.execute("SELECT value FROM ledger_meta WHERE name = 'key_check'").fetchone()
    if row is None or not hmac.compare_digest(str(row[0]), check):
        raise RecordRefused(
            f"the record key given is not the key of the ledger at {redact_url(url)} "
            f"(its events were written with another one); point {KEY_ENV} at the "
            f"ledger's key file", code="record_key_invalid")
    return key
