"""What the PostgreSQL ledger needs around psycopg, apart from the ledger itself:
telling and redacting connection URLs, errors with their secrets taken out, the
ledger's tables (:data:`SCHEMA`), and SQLite-style SQL and rows over a psycopg
connection.

It never imports psycopg, so the CLI and the Host can recognise a ``postgresql://``
URL and redact it without the driver installed. The ledger is
:mod:`host_kernel.store.pg`'s.
"""

from __future__ import annotations

import functools
import hashlib
import urllib.parse
from collections.abc import Sequence
from typing import Any, ClassVar

from .._errors import RecordError

__all__ = ["Row", "is_postgres_url", "redact_url"]


# --------------------------------------------------------------------------- URLs


def is_postgres_url(value: object) -> bool:
    """Whether ``value`` is a ``postgresql://`` (or ``postgres://``) URL."""
    return isinstance(value, str) and value.split("://", 1)[0].lower() in ("postgresql",
                                                                          "postgres")


#: Query parameters of a connection URL that carry a secret.
_SECRET_PARAMS = frozenset({"password", "sslpassword", "passfile", "sslkey"})


def _password_span(url: str) -> tuple[int, int] | None:
    """Where the password of ``url``'s user part is (start, end), or None. The user part
    ends at the last ``@`` before the first ``/``: libpq takes a password holding ``#`` or
    ``?`` (where urlsplit would end it and see none). A password holding ``/`` (which libpq
    does not take) is found too: it is still what the person typed as their password."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    authority = rest.split("/", 1)[0]
    if "@" in authority:
        user = authority.rsplit("@", 1)[0]
    else:
        user = rest.split("@", 1)[0] if "@" in rest else ""
        if "?" in user or "=" in user:
            return None  # an "@" in a query, not a user part
    if ":" not in user:
        return None
    start = len(scheme) + len(sep) + user.index(":") + 1
    return start, len(scheme) + len(sep) + len(user)


def redact_url(url: str) -> str:
    """``url`` without its password (in the user part or the query), for messages and
    records; anything else is left as it was written. A URL too malformed to take apart
    (an unclosed ``[``) keeps only its scheme: nothing after it is shown."""
    try:
        urllib.parse.urlsplit(url).password  # noqa: B018 - a bad one is caught here
    except ValueError:
        return url.split("://", 1)[0] + "://…"
    out = url
    span = _password_span(out)
    if span is not None:
        out = out[:span[0]] + "***" + out[span[1]:]
    base, mark, query = out.partition("?")
    if mark and "://" in base:
        out = base + mark + "&".join(
            f"{item.split('=', 1)[0]}=***" if item.split("=", 1)[0].lower() in _SECRET_PARAMS
            else item for item in query.split("&"))
    return out


def _url_secrets(url: str) -> list[str]:
    """The secrets written in ``url`` (its password, and the values of the query's secret
    parameters), as written and percent-decoded, longest first; found without
    :func:`urllib.parse.urlsplit`, which refuses some URLs libpq still quotes back."""
    found: list[str] = []
    span = _password_span(url)
    if span is not None:
        found.append(url[span[0]:span[1]])
    rest = url.split("://", 1)[-1] if span is None else url[span[1]:]
    if "?" in rest:
        for item in rest.split("?", 1)[1].split("&"):
            name, _, value = item.partition("=")
            if name.lower() in _SECRET_PARAMS:
                found.append(value)
    found += [urllib.parse.unquote(v) for v in found]
    return sorted({v for v in found if v}, key=len, reverse=True)


def _pg_message(exc: Exception, url: str) -> str:
    """The first line of ``exc``'s text, without any secret of ``url``."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # libpq quotes back the parts of a URL it cannot parse, a password among them.
    message = message.replace(url, redact_url(url))
    for secret in _url_secrets(url):
        message = message.replace(secret, "***")
    return message


def _pg_reason(exc: Exception, url: str) -> str:
    """Why the server is away, in a few words (libpq's last "…failed: " cut off), for the
    lines that say the Host waits."""
    message = _pg_message(exc, url)
    reason = message.rsplit("failed: ", 1)[-1].strip()
    for severity in ("FATAL:", "ERROR:"):
        reason = reason.removeprefix(severity).strip()
    return reason or message


def _pg_error(exc: Exception, doing: str, url: str) -> RecordError:
    return RecordError(f"cannot {doing} (PostgreSQL ledger at {redact_url(url)}): "
                       f"{_pg_message(exc, url)}")


# --------------------------------------------------------------------------- SQL and rows

#: The ledger's tables, made by its first writer in the schema :data:`~host_kernel.store.pg.
#: PG_SCHEMA` (docs/record.md, "The PostgreSQL ledger", has what each column holds).
SCHEMA = """
CREATE SEQUENCE IF NOT EXISTS events_seq;
CREATE TABLE IF NOT EXISTS ledger_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq     BIGINT PRIMARY KEY,
    session TEXT NOT NULL,
    n       BIGINT NOT NULL,
    ts      DOUBLE PRECISION NOT NULL,
    kind    TEXT NOT NULL,
    body    TEXT NOT NULL,
    prev    TEXT NOT NULL,
    hash    TEXT NOT NULL,
    mac     TEXT,
    UNIQUE (session, n)
);
CREATE INDEX IF NOT EXISTS events_by_kind ON events (kind, seq);
CREATE TABLE IF NOT EXISTS heads (
    session TEXT PRIMARY KEY, n BIGINT NOT NULL, hash TEXT NOT NULL, seq BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY, started DOUBLE PRECISION, ended DOUBLE PRECISION, workdir TEXT,
    mode TEXT, armed BIGINT, request TEXT, signals TEXT, host_version TEXT, front TEXT
);
CREATE TABLE IF NOT EXISTS generations (
    session TEXT, generation BIGINT, started DOUBLE PRECISION, reason TEXT, seq BIGINT,
    PRIMARY KEY (session, generation)
);
CREATE TABLE IF NOT EXISTS cells (
    cell_id TEXT PRIMARY KEY, session TEXT, generation BIGINT, seq_started BIGINT,
    seq_finished BIGINT, code TEXT, started DOUBLE PRECISION, ended DOUBLE PRECISION,
    status TEXT, execution_count BIGINT, outputs TEXT, frontend_cell_id TEXT, access TEXT
);
CREATE INDEX IF NOT EXISTS cells_by_session ON cells (session, seq_started);
CREATE TABLE IF NOT EXISTS refusals (
    seq BIGINT PRIMARY KEY, session TEXT, generation BIGINT, cell_id TEXT,
    call TEXT, code TEXT, reason TEXT
);
CREATE INDEX IF NOT EXISTS refusals_by_session ON refusals (session);
CREATE TABLE IF NOT EXISTS writes (
    seq BIGINT PRIMARY KEY, session TEXT, cell_id TEXT, path TEXT, sha256 TEXT,
    size BIGINT, op TEXT, ts DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS writes_by_path ON writes (session, path);
CREATE TABLE IF NOT EXISTS receipts (
    receipt_id TEXT PRIMARY KEY, seq BIGINT, session TEXT, cell_id TEXT,
    generation BIGINT, command TEXT, exit_status BIGINT, ended DOUBLE PRECISION, body TEXT
);
CREATE INDEX IF NOT EXISTS receipts_by_cell ON receipts (cell_id);
CREATE INDEX IF NOT EXISTS receipts_by_session ON receipts (session);
CREATE TABLE IF NOT EXISTS artifacts (
    artifact_id TEXT PRIMARY KEY, seq BIGINT, session TEXT, cell_id TEXT,
    generation BIGINT, filename TEXT, sha256 TEXT, size BIGINT, media_type TEXT,
    source_path TEXT, ts DOUBLE PRECISION, lineage TEXT
);
CREATE INDEX IF NOT EXISTS artifacts_by_session ON artifacts (session);
CREATE TABLE IF NOT EXISTS loads (
    seq BIGINT PRIMARY KEY, session TEXT, cell_id TEXT, artifact_id TEXT, path TEXT
);
CREATE INDEX IF NOT EXISTS loads_by_session ON loads (session);
CREATE TABLE IF NOT EXISTS submissions (
    submission_id TEXT PRIMARY KEY, seq BIGINT, session TEXT, cell_id TEXT,
    accepted BIGINT, body TEXT
);
CREATE INDEX IF NOT EXISTS submissions_by_session ON submissions (session);
"""
#: Names :data:`SCHEMA` as ``ledger_meta``'s ``schema``: a writer whose schema is the one
#: there does not run the script again (any change to it runs it once more).
SCHEMA_DIGEST = hashlib.sha256(SCHEMA.encode()).hexdigest()[:16]



@functools.lru_cache(maxsize=512)
def _pg_sql(sql: str, drawn: tuple[int, ...] = ()) -> str:
    """SQLite's ``?`` placeholders as psycopg's ``%s`` (and a literal ``%`` doubled),
    outside quoted strings; the SQL the ledger's callers write is otherwise the same. The
    placeholders at ``drawn`` (0-based) read the ``seq`` drawn by the one-statement
    append's head instead (store/pgappend.py)."""
    out: list[str] = []
    quote: str | None = None
    place = 0
    for ch in sql:
        if quote is not None:
            out.append("%%" if ch == "%" else ch)
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("(SELECT seq FROM h)" if place in drawn else "%s")
            place += 1
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    return "".join(out)


def _no_nul(value: Any) -> Any:
    return value.replace("\x00", "\ufffd") if isinstance(value, str) and "\x00" in value \
        else value


class Row(tuple[Any, ...]):
    """A result row read by index or by column name, like :class:`sqlite3.Row`."""

    _index: ClassVar[dict[str, int]] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_factory(cursor: Any) -> Any:
    names = [c.name for c in cursor.description or ()]
    cls = type("Row", (Row,), {"_index": {n: i for i, n in enumerate(names)}})
    return lambda values: cls(values)


class _Projector:
    """What :func:`project` needs of a connection, over a psycopg one."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._conn.execute(_pg_sql(sql), [_no_nul(p) for p in params])
