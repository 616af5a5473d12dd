"""What the PostgreSQL ledger's faster paths must still promise (issue 32).

An append at the head its writer knows is one prepared statement in one transaction, sent
with its BEGIN and COMMIT in one round trip; anything else (another writer moved the head, a
table altered, a lost reply) takes the two-step append that reads the head first. The
audit reads each session's events once and rebuilds the projection from the very rows it
checked. These tests hold the promises those shortcuts could break: an append is
committed, durably, when it returns, and all of it or nothing; a head moved behind a
writer's back is still noticed; a lock held against a session still fails an append in
time, once; a session's ``seq`` order still follows its chain when writers race; and the
audit still judges each session on its own, whatever the tables hold.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from _pg import direct_sql

from host_kernel import RecordError
from host_kernel.audit import audit_ledger
from host_kernel.store.base import ForeignEventError
from host_kernel.store.ledger import check_chain
from host_kernel.store.pg import PG_SCHEMA, PostgresLedger

CELL = {"cell_id": "c1", "generation": 1, "code": "x = 1"}


def _count(url: str, sql: str) -> int:
    return int(direct_sql(url, sql)[0][0])


def test_an_append_is_committed_durably_when_it_returns(pg_url: str) -> None:
    with PostgresLedger(pg_url) as writer:
        # the commit waits for its WAL on disk (the server's default; never turned off)
        assert writer.query("SHOW synchronous_commit")[0][0] == "on"
        writer.append("s1", "session_started", {"mode": {}})
        event = writer.append("s1", "cell_started", CELL)
        # another connection sees the event, its head and its projection at once
        assert direct_sql(pg_url, "SELECT seq, hash FROM events WHERE session = 's1' "
                                  "ORDER BY n DESC LIMIT 1") == [(event.seq, event.hash)]
        assert direct_sql(pg_url, "SELECT n, hash, seq FROM heads WHERE session = 's1'") == \
            [(2, event.hash, event.seq)]
        assert direct_sql(pg_url, "SELECT seq_started, status FROM cells") == \
            [(event.seq, "running")]


def test_an_append_the_projection_refuses_leaves_nothing_behind(pg_url: str) -> None:
    with PostgresLedger(pg_url) as writer:
        writer.append("s1", "session_started", {"mode": {}})
        writer.append("s1", "cell_started", CELL)
        head = direct_sql(pg_url, "SELECT n, hash, seq FROM heads WHERE session = 's1'")
        with pytest.raises(RecordError):  # the same cell started twice: its row is there
            writer.append("s1", "cell_started", CELL)
        assert _count(pg_url, "SELECT count(*) FROM events") == 2
        assert direct_sql(pg_url, "SELECT n, hash, seq FROM heads WHERE session = 's1'") == \
            head
        writer.append("s1", "cell_finished", {"cell_id": "c1", "status": "ok", "outputs": []})
        assert not writer.adopted
    report = audit_ledger(pg_url)
    assert report.clean, [str(f) for f in report.findings]
    assert report.events == 3


def test_a_head_moved_behind_a_writer_is_noticed(pg_url: str) -> None:
    with PostgresLedger(pg_url) as a, PostgresLedger(pg_url) as b:
        a.append("s1", "session_started", {"mode": {}})
        b.append("s1", "note", {"by": "b"})  # a key holder a does not know of
        third = a.append("s1", "note", {"by": "a"})  # taken on: a does not hold s1
        assert third.prev == b.known_head.hash  # type: ignore[union-attr]
        a.claim("s2")
        a.append("s2", "session_started", {"mode": {}})
        b.append("s2", "note", {"by": "b"})
        with pytest.raises(ForeignEventError):  # a holds s2: nobody else writes it
            a.append("s2", "note", {"by": "a"})
    assert _count(pg_url, "SELECT count(*) FROM events WHERE session = 's2'") == 2
    with PostgresLedger.open_readonly(pg_url) as reader:
        assert check_chain(reader) == []


def test_a_lock_held_on_a_known_head_fails_the_append_in_time_once(pg_url: str) -> None:
    import psycopg

    with PostgresLedger(pg_url, lock_timeout=1) as writer:
        writer.append("s1", "session_started", {"mode": {}})
        with psycopg.connect(pg_url) as squatter:
            squatter.execute(f"SELECT * FROM {PG_SCHEMA}.heads WHERE session = 's1' "
                             f"FOR UPDATE")
            started = time.monotonic()
            with pytest.raises(RecordError, match="lock"):
                writer.append("s1", "note", {"n": 1})
            assert time.monotonic() - started < 1.9  # waited lock_timeout once, not twice
        writer.append("s1", "note", {"n": 2})
        assert not writer.adopted
    report = audit_ledger(pg_url)
    assert report.clean, [str(f) for f in report.findings]
    assert report.events == 2


def test_a_prepared_append_gone_from_the_session_is_prepared_again(pg_url: str) -> None:
    with PostgresLedger(pg_url) as writer:
        for n in range(3):
            writer.append("s1", "note", {"n": n})
        # what a pooler's DISCARD ALL would do to the connection's session
        with contextlib.suppress(RecordError):
            writer.query("DEALLOCATE ALL")
        for n in range(3, 6):
            writer.append("s1", "note", {"n": n})
        assert not writer.adopted
    report = audit_ledger(pg_url)
    assert report.clean, [str(f) for f in report.findings]
    assert report.events == 6


def test_a_table_altered_under_a_writer_stops_its_appends(pg_url: str) -> None:
    with PostgresLedger(pg_url) as writer:
        writer.append("s1", "session_started", {"mode": {}})
        writer.append("s1", "note", {"n": 1})
        direct_sql(pg_url, "ALTER TABLE heads ALTER COLUMN n TYPE text")
        with pytest.raises(ForeignEventError):  # the two-step append reads what is there
            writer.append("s1", "note", {"n": 2})
    assert _count(pg_url, "SELECT count(*) FROM events") == 2


def test_writers_racing_on_one_session_keep_its_seq_order_and_chain(pg_url: str) -> None:
    writers = [PostgresLedger(pg_url) for _ in range(4)]
    writers[0].append("shared", "session_started", {"mode": {}})
    start = threading.Barrier(len(writers))
    errors: list[BaseException] = []

    def write(i: int) -> None:
        start.wait()
        try:
            for n in range(25):
                writers[i].append("shared", "note", {"w": i, "n": n})
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in writers:
        w.close()
    assert not errors, errors
    rows = direct_sql(pg_url, "SELECT n, seq FROM events WHERE session = 'shared' ORDER BY n")
    assert [n for n, _ in rows] == list(range(1, 102))
    assert [seq for _, seq in rows] == sorted(seq for _, seq in rows)
    report = audit_ledger(pg_url)
    assert report.clean, [str(f) for f in report.findings]


def test_the_audit_judges_each_session_from_one_read(pg_url: str) -> None:
    with PostgresLedger(pg_url) as writer:
        for s in ("a", "b", "c", "d"):
            writer.append(s, "session_started", {"mode": {}})
            writer.append(s, "cell_started", {**CELL, "cell_id": f"{s}-1"})
            writer.append(s, "session_ended", {})
    direct_sql(pg_url, "UPDATE events SET body = '{\"mode\":{\"x\":1}}' "
                       "WHERE session = 'b' AND n = 1")
    direct_sql(pg_url, "UPDATE heads SET n = 2 WHERE session = 'c'")
    direct_sql(pg_url, "UPDATE cells SET status = 'ok' WHERE session = 'd'")
    report = audit_ledger(pg_url)
    status = {s.session: s.status for s in report.sessions or ()}
    assert status == {"a": "sound", "b": "damaged", "c": "damaged", "d": "damaged"}
    codes = {s.session: s.problem.code for s in report.sessions or () if s.problem}
    assert codes == {"b": "chain_broken", "c": "chain_broken", "d": "projection_drift"}
    one = audit_ledger(pg_url, sessions=["b"])
    assert [s.status for s in one.sessions or ()] == ["damaged"]


def test_heads_naming_no_session_still_get_an_answer(pg_url: str) -> None:
    with PostgresLedger(pg_url) as writer:
        writer.append("s1", "session_started", {"mode": {}})
    direct_sql(pg_url, "ALTER TABLE heads ALTER COLUMN session TYPE bytea "
                       "USING session::bytea")
    report = audit_ledger(pg_url)
    assert not report.clean
    assert {f.code for f in report.findings if f.fatal} <= {
        "chain_broken", "event_unauthenticated", "record_unreadable"}
