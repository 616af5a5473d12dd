"""A Host rides out its stores going away: a PostgreSQL server stopped under it for 15 s,
a commit whose reply is lost, an object store that throttles; and it does not wait for what
waiting cannot fix (a wrong password), nor longer than its ``store_patience``.

Everything is real: the suite's PostgreSQL server (tests/_pg.py) stopped and started
again, a TCP forwarder on loopback that cuts a connection after the server committed
(tests/_proxy.py), moto's S3 behind an HTTP proxy that answers 503 SlowDown. The first
tests hold :mod:`host_kernel.store.retry`'s classifiers and backoff to their contract with
a fake clock.
"""

from __future__ import annotations

import errno
import re
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import wait_for
from _pg import PgServer
from _proxy import CommitDropper, SlowDownProxy
from _s3 import BUCKET

from host_kernel import BadArguments, Host, RecordError, StorageError
from host_kernel._errors import StoreUnavailable
from host_kernel.audit import audit_ledger
from host_kernel.host._options import HostOptions
from host_kernel.store.ledger import check_chain
from host_kernel.store.pg import PostgresLedger
from host_kernel.store.retry import Backoff, Patience, blob_unavailable, pg_unavailable

# --------------------------------------------------------------------------- retry.py

#: A refusal after waiting out a patience of 2 s: how long it did wait is the clock's (more
#: than 2 s on a loaded machine), the patience it names is the Host's.
WAITED_OUT = re.compile(r"did not answer for \d+ s over \d+ attempts \(store_patience 2 s\)")


def test_postgres_failures_are_told_apart_unavailable_or_refused() -> None:
    for state in ("57P01", "57P02", "57P03", "08006", "08001", "53300"):
        assert pg_unavailable(state, "", connection_lost=False), state
    for state in ("28P01", "42P01", "23505", "55P03", "57P04", "25P03"):
        assert not pg_unavailable(state, "", connection_lost=True), state
    refused = 'connection to server at "127.0.0.1", port 5 failed: Connection refused'
    assert pg_unavailable(None, refused, connection_lost=False)
    assert pg_unavailable(None, "FATAL:  the database system is starting up",
                          connection_lost=False)
    assert pg_unavailable(None, "consuming input failed: server closed the connection "
                          "unexpectedly", connection_lost=True)
    assert pg_unavailable(None, "something new", connection_lost=True)
    assert not pg_unavailable(None, "something new", connection_lost=False)
    for message in ('FATAL:  password authentication failed for user "hk"',
                    'FATAL:  database "x" does not exist', "FATAL:  no pg_hba.conf entry"):
        assert not pg_unavailable(None, message, connection_lost=True), message


class _ClientError(Exception):
    """Shaped as botocore's: the answer in ``response``."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"An error occurred ({code})")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class EndpointConnectionError(Exception):
    """Named as botocore's, which the classifier knows by name."""


def _raised_from(outer: Exception, inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception as exc:
            raise outer from exc
    except Exception as caught:  # noqa: BLE001 - the error, with its cause, is the value
        return caught


def test_object_store_failures_are_told_apart_through_their_causes() -> None:
    assert blob_unavailable(_ClientError(503, "SlowDown"))
    assert blob_unavailable(_ClientError(500, "InternalError"))
    assert blob_unavailable(_ClientError(400, "SlowDown"))  # the code says throttling
    assert blob_unavailable(_ClientError(429, "TooManyRequests"))
    assert not blob_unavailable(_ClientError(403, "AccessDenied"))
    assert not blob_unavailable(_ClientError(404, "NoSuchBucket"))
    assert blob_unavailable(EndpointConnectionError("Could not connect"))
    assert blob_unavailable(ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    assert blob_unavailable(TimeoutError())
    # s3fs turns 503 into OSError(EBUSY) raised from botocore's error; the Host's
    # StorageError is raised from that in turn.
    busy = _raised_from(OSError(errno.EBUSY, "Please reduce your request rate."),
                        _ClientError(503, "SlowDown"))
    assert blob_unavailable(_raised_from(StorageError("cannot store"), busy))
    missing = _raised_from(FileNotFoundError(errno.ENOENT, "gone"), _ClientError(404, "NoSuchKey"))
    assert not blob_unavailable(_raised_from(StorageError("cannot store"), missing))
    assert not blob_unavailable(PermissionError(errno.EACCES, "denied"))
    assert not blob_unavailable(OSError(errno.ENOSPC, "No space left on device"))
    assert not blob_unavailable(ValueError("bad name"))


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class _Away(Exception):
    pass


def _patience(seconds: float, clock: _Clock, said: list[str], rand: float = 0.5) -> Patience:
    return Patience(seconds, "the ledger", clock=clock, sleep=clock.sleep, rand=lambda: rand,
                    say=said.append)


def _is_away(exc: Exception) -> str | None:
    return "gone" if isinstance(exc, _Away) else None


def _always_away() -> None:
    raise _Away


def test_backoff_retries_at_once_then_doubles_with_jitter_up_to_its_cap() -> None:
    backoff = Backoff(first=0.25, factor=2.0, most=5.0)
    assert backoff.delay(1, lambda: 0.9) == 0.0
    assert [backoff.delay(n, lambda: 0.0) for n in range(2, 9)] == \
        [0.125, 0.25, 0.5, 1.0, 2.0, 2.5, 2.5]
    assert [round(backoff.delay(n, lambda: 0.999999), 3) for n in range(2, 9)] == \
        [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_patience_waits_up_to_its_bound_saying_so_once_per_wait() -> None:
    clock, said = _Clock(), list[str]()
    patience = _patience(10, clock, said)
    with pytest.raises(StoreUnavailable) as caught:
        patience.run(_always_away, _is_away, StoreUnavailable)
    assert sum(clock.slept) == pytest.approx(10.0)  # the last wait ends at the bound
    assert clock.slept[:4] == [0.0, 0.1875, 0.375, 0.75] and max(clock.slept) <= 5.0
    waits = [line for line in said if line.startswith("waiting for the ledger…")]
    assert len(waits) == len(clock.slept)
    assert waits[1].startswith("waiting for the ledger… (attempt 3, 0.0 s so far; gone)")
    assert "did not answer for 10 s over" in caught.value.message
    assert caught.value.code == "store_unavailable"
    # The bound was spent: the next operation is tried once, without waiting...
    clock.slept.clear()
    with pytest.raises(StoreUnavailable, match="still unavailable"):
        patience.run(_always_away, _is_away, StoreUnavailable)
    assert clock.slept == []
    # ...and a success gives the full patience back.
    assert patience.run(lambda: 7, _is_away, StoreUnavailable) == 7
    assert not patience.spent


def test_patience_returns_what_succeeds_and_passes_refusals_at_once() -> None:
    clock, said = _Clock(), list[str]()
    patience = _patience(60, clock, said)
    tries: Iterator[Exception | int] = iter([_Away(), _Away(), 42])

    def flaky() -> int:
        value = next(tries)
        if isinstance(value, Exception):
            raise value
        return value

    assert patience.run(flaky, _is_away, StoreUnavailable) == 42
    assert said[-1].startswith("the ledger answered again after") and "(3 attempts)" in said[-1]

    def refused() -> None:
        raise PermissionError("no")

    clock.slept.clear()
    with pytest.raises(PermissionError):
        patience.run(refused, _is_away, StoreUnavailable)
    assert clock.slept == []
    with pytest.raises(StoreUnavailable, match=r"not waited for \(patience 0\)"):
        _patience(0, clock, said).run(_always_away, _is_away, StoreUnavailable)
    assert clock.slept == []


def test_store_patience_is_checked_where_options_are_built() -> None:
    assert HostOptions().store_patience == 180.0
    assert HostOptions(store_patience=0).store_patience == 0
    bad: Any
    for bad in (-1, "60", True, float("nan"), float("inf"), None):
        with pytest.raises(BadArguments, match="store_patience"):
            HostOptions(store_patience=bad)


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def server(pg_server: PgServer, pg_url: str) -> Iterator[PgServer]:
    """The suite's server, started again at the end whatever the test did to it (before
    ``pg_url`` drops its database)."""
    yield pg_server
    if not pg_server.started:
        pg_server.resume()


def _quiet(line: str) -> None:
    pass


def _events(url: str, session: str) -> list[Any]:
    with PostgresLedger.open_readonly(url) as reader:
        return list(reader.events(session))


def _no_event_twice(url: str, session: str) -> list[Any]:
    """The session's events: each cell started and finished once, each hash once, the
    chain whole."""
    events = _events(url, session)
    assert len({e.hash for e in events}) == len(events)
    per_cell = Counter((e.kind, e.body["cell_id"]) for e in events
                       if e.kind in ("cell_started", "cell_finished"))
    assert per_cell and set(per_cell.values()) == {1}, per_cell
    started = {c for k, c in per_cell if k == "cell_started"}
    assert started == {c for k, c in per_cell if k == "cell_finished"}
    with PostgresLedger.open_readonly(url) as reader:
        assert check_chain(reader, session) == []
    return events


def test_a_fifteen_second_restart_pauses_the_session_and_loses_nothing(
        server: PgServer, pg_url: str, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Host(workdir, ledger=pg_url) as h:  # the default patience: 180 s
        assert h.execute("n = 0").status == "ok"
        outage = server.outage(15)
        took: list[float] = []
        while outage.is_alive() or len(took) < 8:
            t0 = time.monotonic()
            obs = h.execute("n += 1\nprint(n)")
            took.append(time.monotonic() - t0)
            assert obs.status == "ok", obs.text
            assert obs.text.strip() == str(len(took))
            time.sleep(0.2)
        outage.join()
        assert outage.error is None  # type: ignore[attr-defined]
        session = h.session_id
    assert max(took) > 8, took  # a cell waited for the server, and then went on
    events = _no_event_twice(pg_url, session)
    assert [e.kind for e in events].count("session_ended") == 1
    assert audit_ledger(pg_url).clean
    err = capsys.readouterr().err
    assert "waiting for the ledger…" in err and "the ledger answered again after" in err
    assert not (h.record_dir / "foreign-events.log").exists()


def test_a_lost_commit_reply_is_recognised_as_done_not_appended_twice(
        server: PgServer, pg_url: str, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with CommitDropper(("127.0.0.1", server.port)) as dropper, \
            Host(workdir, ledger=dropper.url(pg_url), store_patience=30) as h:
        assert h.execute("x = 1").status == "ok"
        dropper.drop_next_commit()
        obs = h.execute("x += 1\nprint(x)")
        assert dropper.dropped == 1  # cell_started was committed, its reply lost
        assert obs.status == "ok" and obs.text.strip() == "2", obs.text
        assert h.execute("print(x * 10)").text.strip() == "20"
        session = h.session_id
    _no_event_twice(pg_url, session)
    assert audit_ledger(pg_url).clean
    assert "waiting for the ledger…" in capsys.readouterr().err


def test_a_commit_found_after_its_append_gave_up_is_adopted_not_repeated(
        server: PgServer, pg_url: str) -> None:
    with CommitDropper(("127.0.0.1", server.port)) as dropper, \
            PostgresLedger(dropper.url(pg_url), patience=1, say=_quiet) as writer:
        writer.claim("s-adopt")
        # The very first event of a session, committed, its reply lost: found by its hash.
        dropper.drop_next_commit()
        first = writer.append("s-adopt", "session_started", {"workdir": "/w"})
        assert dropper.dropped == 1 and not writer.adopted
        # Committed, then the server seems gone past the bound: the append gives up...
        dropper.drop_next_commit(then_refuse=2.0)
        with pytest.raises(StoreUnavailable):
            writer.append("s-adopt", "cell_started", {"cell_id": "c-lost", "generation": 1,
                                                      "code": "x = 1"})
        time.sleep(2.0)
        # ...and the next append finds it committed, takes it as its own, and goes on.
        third = writer.append("s-adopt", "cell_started", {"cell_id": "c-next", "generation": 1,
                                                          "code": "x = 2"})
        assert [e.kind for e in writer.adopted] == ["cell_started"]
        assert third.prev == writer.adopted[0].hash and writer.adopted[0].prev == first.hash
    events = _events(pg_url, "s-adopt")
    assert [e.body.get("cell_id") for e in events] == [None, "c-lost", "c-next"]
    with PostgresLedger.open_readonly(pg_url) as reader:
        assert check_chain(reader, "s-adopt") == []


def test_a_wrong_password_is_refused_at_once_and_never_shown(
        server: PgServer, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    role = "pw_" + uuid.uuid4().hex[:8]
    url = server.password_role(role, "the-right-one")
    wrong = url.replace(f"{role}@", f"{role}:wr0ng-s3cret@")
    t0 = time.monotonic()
    with pytest.raises(RecordError) as caught:
        Host(workdir, ledger=wrong, store_patience=60).start()
    assert time.monotonic() - t0 < 5  # not waited for: waiting would not change it
    assert not isinstance(caught.value, StoreUnavailable)
    assert caught.value.code == "record_error"
    assert "password authentication failed" in caught.value.message
    shown = "".join(traceback.format_exception(caught.value)) + capsys.readouterr().err
    assert "wr0ng-s3cret" not in shown and f"{role}:***@" in caught.value.message
    assert "waiting for" not in shown


def test_past_its_patience_an_append_fails_with_store_unavailable(
        server: PgServer, pg_url: str, workdir: Path, tmp_path: Path) -> None:
    with Host(workdir, ledger=pg_url, store_patience=2) as h:
        assert h.execute("x = 1").status == "ok"
        server.halt()
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            h.execute("x = 2")
        waited = time.monotonic() - t0
        assert 1.9 < waited < 6, waited
        assert getattr(caught.value, "code", None) == "store_unavailable"
        assert "cannot append cell_started to the ledger" in caught.value.message
        assert WAITED_OUT.search(caught.value.message), caught.value.message
        # A Host that cannot start for the outage says so with the same code (a batch
        # requeues its task), in about its patience.
        other = tmp_path / "other"
        other.mkdir()
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable):
            Host(other, ledger=pg_url, store_patience=1).start()
        assert time.monotonic() - t0 < 4
        server.resume()
        # The session goes on once the server is back: nothing of the failed cell is in.
        obs = h.execute("print(x)")
        assert obs.status == "ok" and obs.text.strip() == "1"
        session = h.session_id
    codes = [e.body.get("code") for e in _no_event_twice(pg_url, session)
             if e.kind == "cell_started"]
    assert codes == ["x = 1", "print(x)"]
    assert audit_ledger(pg_url).clean


def test_just_after_a_restart_a_session_whose_host_may_reconnect_is_not_taken(
        server: PgServer, pg_url: str) -> None:
    with PostgresLedger(pg_url, patience=30, say=_quiet) as a:
        a.claim("s-a")
        a.append("s-a", "session_started", {"workdir": "/a"})
        server.halt()
        server.resume()  # every connection, and every session lock, is gone
        with PostgresLedger(pg_url, say=_quiet) as b:
            # s-a's last event is older than the server: its Host may be on its way back.
            assert not b.try_claim("s-a")
            a.append("s-a", "cell_started", {"cell_id": "c-a", "generation": 1, "code": ""})
            assert not b.try_claim("s-a")  # taken back by its own writer
            with PostgresLedger(pg_url, say=_quiet) as c:
                c.claim("s-c")
                c.append("s-c", "session_started", {"workdir": "/c"})
            # s-c wrote after the restart and its writer is gone (once the server has
            # ended its connection's backend): it is abandoned.
            wait_for(lambda: b.try_claim("s-c"), 10, "s-c's lock to be free")
    assert [e.kind for e in _events(pg_url, "s-a")] == ["session_started", "cell_started"]


def _lingering_lock(writer: PostgresLedger, url: str, session: str) -> Any:
    """The writer's connection drops while the server still holds ``session``'s lock for
    it: the writer's own lock goes to a second connection, which stands in for the server's
    end of the lost one, and the writer's connection is closed. Returns that connection."""
    import psycopg

    from host_kernel.store.pg import _lock_id

    lingering = psycopg.connect(url, autocommit=True)
    writer._conn.execute("SELECT pg_advisory_unlock(%s)", (_lock_id(session),))
    lingering.execute("SELECT pg_advisory_lock(%s)", (_lock_id(session),))
    writer._conn.close()
    return lingering


def test_a_lost_connections_lock_that_goes_as_it_is_looked_at_is_taken_back(
        server: PgServer, pg_url: str) -> None:
    """Taking a session back after the connection dropped: its lock is still held when
    the writer tries it, and nobody holds it when the writer then asks who does (the
    server's end of the lost connection ended in between, as a loaded server's does). The
    writer tries again and goes on. It used to decide another Host held the session and
    refuse it for good: a batch task failed with foreign_event in a loaded CI-like run."""
    with PostgresLedger(pg_url, patience=30, say=_quiet) as writer:
        writer.claim("s-race")
        writer.append("s-race", "session_started", {"workdir": "/w"})
        lingering = _lingering_lock(writer, pg_url, "s-race")
        real = writer._lock_holder
        looked: list[int | None] = []

        def holder_once_it_went(session: str) -> int | None:
            if not looked:
                lingering.close()  # its backend ends between the two looks
                wait_for(lambda: real(session) is None, 10, "the lock to be let go")
            looked.append(real(session))
            return looked[-1]

        writer._lock_holder = holder_once_it_went  # type: ignore[method-assign]
        writer.append("s-race", "cell_started", {"cell_id": "c-1", "generation": 1,
                                                 "code": ""})
        assert looked == [None]
        writer.append("s-race", "cell_finished", {"cell_id": "c-1", "status": "ok",
                                                  "outputs": []})
    assert [e.kind for e in _events(pg_url, "s-race")] == ["session_started", "cell_started",
                                                           "cell_finished"]


def test_a_session_another_connection_holds_is_not_taken_back(server: PgServer,
                                                               pg_url: str) -> None:
    """The same drop, but the lock stays with a live connection that is not one of the
    writer's own: another Host holds the session, and the writer appends nothing more."""
    with PostgresLedger(pg_url, patience=5, say=_quiet) as writer:
        writer.claim("s-held")
        writer.append("s-held", "session_started", {"workdir": "/w"})
        other = _lingering_lock(writer, pg_url, "s-held")
        try:
            for _ in range(2):
                with pytest.raises(RecordError, match="another Host|taken up by another"):
                    writer.append("s-held", "cell_started", {"cell_id": "c-1",
                                                             "generation": 1, "code": ""})
        finally:
            other.close()
    assert [e.kind for e in _events(pg_url, "s-held")] == ["session_started"]


# --------------------------------------------------------------------------- S3


@pytest.fixture
def slow_s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowDownProxy]:
    """moto's S3 behind a proxy that can answer 503 SlowDown, as the Host's endpoint; one
    attempt per request in botocore (s3fs still tries a SlowDown five times itself), so
    that the Host's own waiting is what rides the throttling out."""
    import s3fs  # type: ignore[import-untyped]

    with SlowDownProxy(s3_endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        s3fs.S3FileSystem.clear_instance_cache()
        yield proxy
        s3fs.S3FileSystem.clear_instance_cache()


def test_an_artifact_saved_while_s3_throttles_waits_and_is_stored_once(
        slow_s3: SlowDownProxy, s3_endpoint: str, workdir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import s3fs

    prefix = f"{BUCKET}/{uuid.uuid4().hex[:8]}"
    with Host(workdir, blobs=f"s3://{prefix}", store_patience=30) as h:
        slow_s3.refuse(8, method="PUT")  # more than s3fs's five tries of one request
        obs = h.execute("open('r.txt', 'w').write('result 42')\n"
                        "a = host.save_artifact('r.txt')\nprint(a.sha256)")
        assert obs.status == "ok", obs.text
        assert slow_s3.refused == 8
        sha = obs.text.strip()
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True,
                           use_listings_cache=False)
    keys = fs.find(prefix)
    assert [k for k in keys if k.endswith(sha)] == [f"{prefix}/blobs/sha256/{sha[:2]}/{sha}"]
    assert not [k for k in keys if "/tmp/" in k], keys  # no temp left behind
    assert fs.cat(f"{prefix}/blobs/sha256/{sha[:2]}/{sha}") == b"result 42"
    err = capsys.readouterr().err
    assert "waiting for the blob store…" in err and "the blob store answered again" in err


def test_an_s3_store_that_stays_away_fails_the_save_with_store_unavailable(
        slow_s3: SlowDownProxy, workdir: Path) -> None:
    with Host(workdir, blobs=f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}", store_patience=2) as h:
        slow_s3.refuse(10_000)
        t0 = time.monotonic()
        obs = h.execute("open('r.txt', 'w').write('x')\ntry:\n    host.save_artifact('r.txt')\n"
                        "except Exception as e:\n    print(type(e).__name__, e.code)")
        slow_s3.refuse(0)
        assert obs.status == "ok", obs.text
        assert obs.text.strip() == "StorageError store_unavailable"
        assert time.monotonic() - t0 < 15
        refused = {(r["code"], WAITED_OUT.search(r["reason"]) is not None)
                   for r in h.record.ledger.query("SELECT code, reason FROM refusals")}
        assert ("store_unavailable", True) in refused, refused
