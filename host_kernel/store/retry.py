"""Riding out a store that is away for a while: which failures are worth waiting for, and
the wait.

A store is **unavailable** when it cannot be reached or cannot answer now and may soon: a
connection refused, reset or timed out, a server starting up or shutting down
(PostgreSQL's SQLSTATE class 08 and 57P01, 57P02, 57P03), too many clients, an object
store's 5xx or throttling (``SlowDown``, 429). It **refuses** when it answered no: a wrong
password, a missing database or table, an integrity error, a full disk. Waiting changes
nothing about a refusal, so only unavailability is waited for:

- :func:`pg_unavailable` tells them apart for PostgreSQL (the SQLSTATE when the server
  sent one, else libpq's message, else whether the connection was lost under a statement);
- :func:`blob_unavailable` for an object store (the HTTP status and error code botocore
  keeps on its errors, the names of botocore's and aiohttp's connection errors, the
  operating system's errno), walking the chain of causes a wrapped error carries;
- :class:`Patience` runs an operation again while it fails unavailable, with exponential
  backoff and jitter (:class:`Backoff`), printing one line per wait ("waiting for the
  ledger… (attempt 3, 4.2 s so far; …)"), until it succeeds or its bound is spent; then it
  raises the store's own error (:class:`~host_kernel._errors.StoreUnavailable` for the
  ledger, ``StorageError`` with code ``store_unavailable`` for a blob store).

This module imports no driver (the classifiers read attributes and class names), and takes
its clock, sleep, randomness and output as arguments, so it is tested without waiting. It
does not make an operation safe to repeat: an append recognised as done after a lost reply
is the ledger's job (:mod:`host_kernel.store.pg`).
"""

from __future__ import annotations

import errno
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["DEFAULT_PATIENCE", "Backoff", "Patience", "blob_unavailable", "pg_unavailable",
           "say_on_stderr"]

T = TypeVar("T")

#: How long a Host waits for a store that is unavailable before it gives up (seconds):
#: longer than a database restart or a failover, short enough that a batch moves on.
DEFAULT_PATIENCE = 180.0

# --------------------------------------------------------------------------- PostgreSQL

#: SQLSTATEs that say the server cannot serve now (besides class 08, connection exception):
#: shutting down (admin, crash), starting up, idle-session timeout, too many connections.
_PG_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "57P05", "53300"})

#: libpq's words for a refusal: checked first, so that "connection to server … failed:
#: FATAL: password authentication failed" is never taken for an outage.
_PG_REFUSED_WORDS = ("password authentication failed", "authentication failed",
                     "no password supplied", "pg_hba.conf", "does not exist",
                     "permission denied", "certificate", "ssl is not enabled",
                     "server does not support ssl", "invalid")

#: libpq's words for a server that is away (the message of a failed connect carries no
#: SQLSTATE).
_PG_UNAVAILABLE_WORDS = ("connection refused", "could not connect", "timeout expired",
                         "timed out", "server closed the connection", "connection reset",
                         "could not receive data", "could not send data", "broken pipe",
                         "no connection to the server", "terminating connection",
                         "the database system is starting up",
                         "the database system is shutting down",
                         "the database system is in recovery mode",
                         "the database system is not yet accepting connections",
                         "the database system is not accepting connections",
                         "too many clients", "remaining connection slots are reserved",
                         "network is unreachable", "no route to host",
                         "temporary failure in name resolution", "connection is lost",
                         "consuming input failed", "eof detected", "the connection is closed")


def pg_unavailable(sqlstate: str | None, message: str, *, connection_lost: bool) -> bool:
    """Whether a PostgreSQL failure is the server being away (worth waiting for) rather
    than a refusal. ``sqlstate``: what the server sent, if anything; ``message``: the
    error's text; ``connection_lost``: whether the client's connection is gone after it."""
    if sqlstate:
        return sqlstate.startswith("08") or sqlstate in _PG_UNAVAILABLE_STATES
    text = message.lower()
    if any(word in text for word in _PG_REFUSED_WORDS):
        return False
    return connection_lost or any(word in text for word in _PG_UNAVAILABLE_WORDS)


# --------------------------------------------------------------------------- object stores

#: Error codes of S3 (and S3-compatible stores, GCS's XML API) that mean "not now".
_BLOB_UNAVAILABLE_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestLimitExceeded", "TooManyRequestsException", "ServiceUnavailable",
    "InternalError", "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete",
    "500", "502", "503", "504"})

#: Names of the error classes of botocore, aiohttp and fsspec that mean the store could not
#: be reached or stopped answering (matched by name: none of them is imported here).
_BLOB_UNAVAILABLE_CLASSES = frozenset({
    "EndpointConnectionError", "ConnectionClosedError", "ConnectTimeoutError",
    "ReadTimeoutError", "HTTPClientError", "ResponseStreamingError", "IncompleteRead",
    "ClientConnectionError", "ClientConnectorError", "ServerDisconnectedError",
    "ClientOSError", "ServerTimeoutError", "ClientPayloadError", "FSTimeoutError"})

#: The operating system's words for a peer that is away. EBUSY is s3fs's translation of
#: ``SlowDown`` and 503; this list is used for remote stores only, never a local folder.
_BLOB_UNAVAILABLE_ERRNOS = frozenset({
    errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EAGAIN, errno.EBUSY})


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from or during, nearest first (at most 12)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < 12 and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _http_verdict(exc: BaseException) -> bool | None:
    """What an HTTP answer kept on ``exc`` says (botocore's ``response``, an HTTP error's
    ``code`` or ``status``): True for 5xx, 429 and throttling codes, False for any other
    status, None when the error carries none."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error")
        code = error.get("Code") if isinstance(error, dict) else None
        meta = response.get("ResponseMetadata")
        status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
        if isinstance(code, str) and code in _BLOB_UNAVAILABLE_CODES:
            return True
        if isinstance(status, int):
            return status >= 500 or status == 429
        return None if code is None else False
    for name in ("status", "code"):
        status = getattr(exc, name, None)
        if isinstance(status, int) and not isinstance(status, bool) and 100 <= status < 600:
            return status >= 500 or status == 429
    return None


def blob_unavailable(exc: BaseException) -> bool:
    """Whether a failure of a remote blob store is the store being away (worth waiting
    for): the first of ``exc`` and its causes that says anything decides."""
    for e in _causes(exc):
        http = _http_verdict(e)
        if http is not None:
            return http
        names = {cls.__name__ for cls in type(e).__mro__}
        if names & _BLOB_UNAVAILABLE_CLASSES or isinstance(e, (TimeoutError, ConnectionError)):
            return True
        if isinstance(e, OSError) and e.errno in _BLOB_UNAVAILABLE_ERRNOS:
            return True
    return False


# --------------------------------------------------------------------------- waiting


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long each wait is: the first retry at once (a dropped connection is most often
    taken up again at once), then ``first`` seconds doubling (``factor``) up to ``most``,
    each with jitter (between half the wait and the whole of it), so that the many Hosts a
    restart cut off do not all come back in the same instant."""

    first: float = 0.25
    factor: float = 2.0
    most: float = 5.0

    def delay(self, wait: int, rand: Callable[[], float] = random.random) -> float:
        """The ``wait``-th wait (1, 2, 3…); ``rand`` gives numbers in [0, 1)."""
        if wait <= 1:
            return 0.0
        full = min(self.most, self.first * self.factor ** (wait - 2))
        return full / 2 + rand() * full / 2


def say_on_stderr(line: str) -> None:
    """Progress as the Host prints it: one line on stderr (whatever it is at the time)."""
    print(f"host-kernel: {line}", file=sys.stderr, flush=True)


class Patience:
    """How one store is waited for: ``seconds`` at most per operation (0: not at all).

    ``store`` names it in what is printed ("the ledger", "the blob store"). Once an
    operation has spent the whole bound, the next ones are tried once each, without
    waiting, until one succeeds: a Host that gave up on its store does not wait the
    bound again for each thing it still tries to record (its cell's end, its session's
    end); a success gives the store its full patience back.
    """

    def __init__(self, seconds: float, store: str, *, backoff: Backoff = Backoff(),
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 rand: Callable[[], float] = random.random,
                 say: Callable[[str], None] = say_on_stderr) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError("patience is a number of seconds of at least 0")
        self.seconds = float(seconds)
        self.store = store
        self.backoff = backoff
        self._clock, self._sleep, self._rand, self._say = clock, sleep, rand, say
        #: Set when an operation spent the whole bound; cleared by the next success.
        self.spent = False

    def run(self, attempt: Callable[[], T], unavailable: Callable[[Exception], str | None],
            failed: Callable[[str], Exception]) -> T:
        """``attempt()``, again while it fails unavailable and the bound allows.

        ``unavailable(exc)`` gives a short reason (no secret in it) when ``exc`` means the
        store is away, None when it is a refusal: a refusal is raised as it is, at once.
        Past the bound, ``failed(message)`` is raised, from the last error; the message
        names the store, the last reason, how long was waited and over how many attempts.
        """
        start = self._clock()
        tries = 0
        while True:
            tries += 1
            try:
                result = attempt()
            except Exception as exc:
                reason = unavailable(exc)
                if reason is None:
                    raise
                waited = self._clock() - start
                left = self.seconds - waited
                if self.spent or left <= 0:
                    message = self._message(reason, waited, tries)
                    self.spent = self.seconds > 0
                    raise failed(message) from exc
                self._say(f"waiting for {self.store}… (attempt {tries + 1}, {waited:.1f} s so "
                          f"far; {reason})")
                self._sleep(min(self.backoff.delay(tries, self._rand), left))
                continue
            if tries > 1:
                self._say(f"{self.store} answered again after {self._clock() - start:.1f} s "
                          f"({tries} attempts)")
            self.spent = False
            return result

    def _message(self, reason: str, waited: float, tries: int) -> str:
        if self.seconds <= 0:
            return f"{self.store} is unavailable ({reason}), and is not waited for (patience 0)"
        if self.spent:
            return (f"{self.store} is still unavailable ({reason}); it did not answer within "
                    f"{self.seconds:g} s before, so this was tried once")
        return (f"{self.store} did not answer for {waited:.0f} s over {tries} attempts "
                f"(store_patience {self.seconds:g} s); last: {reason}")
