"""The ledger contract, one suite run against both backends: SQLite (the embedded default)
and PostgreSQL (a real server the suite starts with initdb and pg_ctl, tests/_pg.py).

Every case drives real Hosts over real kernels, or the ledger's own ``append``, then
changes the database behind the ledger's back with the database's own client (sqlite3,
psycopg) the way an attacker with write access to it would, and checks that the
writer, the readers and ``audit`` all notice. What a backend does differently (one
chain per file, one per session) is the backend's business; what is promised is the
same.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _helpers import wait_for
from _pg import direct_sql

from host_kernel import Host
from host_kernel.audit import AuditReport, audit, audit_ledger
from host_kernel.store.ledger import (
    GENESIS,
    ForeignEventError,
    RecordRefused,
    SQLiteLedger,
    check_chain,
    check_macs,
    event_hash,
    rebuild,
)
from host_kernel.store.pg import PG_SCHEMA, PostgresLedger, ledger_key
from host_kernel.store.verified import open_verified, open_verified_ledger, projection_drift


@dataclass
class Backend:
    """One ledger backend under test, with the raw access an attacker would have."""

    name: str
    workdir: Path
    record: Path
    url: str | None

    def host(self, **kwargs: Any) -> Host:
        return Host(self.workdir, record_dir=self.record, ledger=self.url, **kwargs)

    def writer(self) -> SQLiteLedger | PostgresLedger:
        if self.url is None:
            self.record.mkdir(parents=True, exist_ok=True)
            return SQLiteLedger(self.record / "ledger.sqlite")
        return PostgresLedger(self.url)

    def reader(self) -> SQLiteLedger | PostgresLedger:
        if self.url is None:
            return SQLiteLedger.open_readonly(self.record / "ledger.sqlite")
        return PostgresLedger.open_readonly(self.url)

    def key(self) -> bytes:
        if self.url is None:
            return (self.record / "record.key").read_bytes()
        return ledger_key(self.url, create=False)

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run SQL on the database directly, past the ledger (``?`` placeholders)."""
        if self.url is None:
            conn = sqlite3.connect(self.record / "ledger.sqlite")
            try:
                rows = conn.execute(statement, params).fetchall()
                conn.commit()
                return rows
            finally:
                conn.close()
        return direct_sql(self.url, statement, params)

    def verified(self, session: str) -> SQLiteLedger:
        if self.url is None:
            return open_verified(self.record)
        return open_verified_ledger(self.url, session)

    def audit(self) -> AuditReport:
        if self.url is None:
            return audit(self.record)
        return audit_ledger(self.url)

    def forge_after(self, session: str, kind: str = "note", mac: str | None = None) -> int:
        """Append an event to ``session``'s chain with a valid hash and no valid MAC, as
        a writer of the database without the record key would; its ``seq``."""
        ts = time.time()
        body = json.dumps({"forged": True})
        if self.url is None:
            seq, prev = self.sql("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")[0]
            seq += 1
            digest = event_hash(prev, seq, session, ts, kind, body)
            self.sql("INSERT INTO events (seq, session, ts, kind, body, prev, hash, mac) "
                     "VALUES (?,?,?,?,?,?,?,?)", (seq, session, ts, kind, body, prev, digest, mac))
            return int(seq)
        n, prev = self.sql("SELECT n, hash FROM heads WHERE session = ?", (session,))[0]
        seq = self.sql("SELECT nextval('events_seq')")[0][0]
        digest = event_hash(prev, n + 1, session, ts, kind, body)
        self.sql("INSERT INTO events (seq, session, n, ts, kind, body, prev, hash, mac) VALUES "
                 "(?,?,?,?,?,?,?,?,?)", (seq, session, n + 1, ts, kind, body, prev, digest, mac))
        self.sql("UPDATE heads SET n = ?, hash = ?, seq = ? WHERE session = ?",
                 (n + 1, digest, seq, session))
        return int(seq)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    workdir = tmp_path / "ws"
    workdir.mkdir()
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    yield Backend(request.param, workdir, tmp_path / "record", url)


def _session_with_everything(b: Backend) -> str:
    """A real session: a file written, a command with a receipt, an artifact, a submission."""
    with b.host(mode="analysis_run") as h:
        assert h.execute("host.write_file('data.csv', 'x\\n1\\n2\\n')").status == "ok"
        assert h.execute("r = host.bash('wc -l data.csv')\nprint(r.exit_status)").status == "ok"
        obs = h.execute(
            "import csv\nrows = list(csv.reader(open('data.csv')))\n"
            "open('out.txt', 'w').write(str(len(rows)))\n"
            "a = host.save_artifact('out.txt')\n"
            "v = host.submit_output({'rows': len(rows)}, ['counted the rows of data.csv'], "
            "task_status='completed')\n"
            "print(v.accepted)")
        assert obs.status == "ok", obs.text
        assert "True" in obs.text, obs.text
        return h.session_id


def test_a_real_session_rebuilds_to_the_stored_projection_and_audits_clean(
        backend: Backend) -> None:
    session = _session_with_everything(backend)
    with backend.reader() as stored:
        assert check_chain(stored) == []
        assert check_macs(stored, backend.key()) == []
        fresh = rebuild(stored)
        try:
            assert projection_drift(stored, fresh) == []
        finally:
            fresh.close()
        kinds = [e.kind for e in stored.events(session)]
    assert kinds[0] == "session_started" and kinds[-1] == "session_ended"
    assert {"cell_started", "cell_finished", "file_written", "receipt_recorded",
            "artifact_saved", "submission_verdict"} <= set(kinds)
    view = backend.verified(session)
    try:
        (accepted,) = view.query("SELECT accepted FROM submissions WHERE session = ?", (session,))
        assert accepted[0] == 1
        assert view.query("SELECT count(*) FROM artifacts")[0][0] == 1
    finally:
        view.close()
    report = backend.audit()
    assert report.clean, [str(f) for f in report.findings]
    assert report.submissions == 1 and report.artifacts == 1 and report.receipts >= 1


def test_an_edited_event_is_found_by_the_chain_the_readers_and_audit(backend: Backend) -> None:
    with backend.host() as h:
        h.execute("x = 1")
        session = h.session_id
    (seq,) = backend.sql("SELECT seq FROM events WHERE kind = 'cell_started'")[0]
    backend.sql("UPDATE events SET body = replace(body, 'x = 1', 'x = 2') WHERE seq = ?", (seq,))
    with backend.reader() as stored:
        problems = check_chain(stored)
    assert [p.seq for p in problems] == [seq] and "edited" in problems[0].problem
    with pytest.raises(RecordRefused) as refused:
        backend.verified(session)
    assert refused.value.code == "chain_broken"
    report = backend.audit()
    assert not report.clean and "chain_broken" in {f.code for f in report.findings}


def test_a_deleted_event_is_found(backend: Backend) -> None:
    with backend.host() as h:
        h.execute("x = 1")
        h.execute("y = 2")
    (seq,) = backend.sql("SELECT seq FROM events WHERE kind = 'cell_started' ORDER BY seq")[0]
    backend.sql("DELETE FROM events WHERE seq = ?", (seq,))
    with backend.reader() as stored:
        problems = check_chain(stored)
    assert problems and "deleted" in " ".join(p.problem for p in problems)
    assert "chain_broken" in {f.code for f in backend.audit().findings}


def test_a_forged_event_stops_the_next_append_and_audit_names_it(backend: Backend) -> None:
    writer = backend.writer()
    try:
        writer.append("s1", "session_started", {"mode": {}})
        writer.append("s1", "note", {"n": 1})
        seq = backend.forge_after("s1")
        with pytest.raises(ForeignEventError) as refused:
            writer.append("s1", "note", {"n": 2})
        assert refused.value.code == "foreign_event" and seq in refused.value.seqs
        assert backend.sql("SELECT count(*) FROM events WHERE kind = 'note'")[0][0] == 2
    finally:
        writer.close()
    report = backend.audit()
    assert [f.where for f in report.findings if f.code == "event_unauthenticated"] == \
        [f"event {seq}"]


def test_a_forged_mac_with_the_wrong_key_is_refused_by_readers(backend: Backend) -> None:
    with backend.host() as h:
        h.execute("x = 1")
        session = h.session_id
    backend.forge_after(session, mac="0" * 64)
    with pytest.raises(RecordRefused) as refused:
        backend.verified(session)
    assert refused.value.code == "event_unauthenticated"


def test_a_stored_projection_that_disagrees_with_the_events_is_drift(backend: Backend) -> None:
    with backend.host() as h:
        h.execute("print('hello')")
        session = h.session_id
    backend.sql("UPDATE cells SET status = 'error'")
    with pytest.raises(RecordRefused) as refused:
        backend.verified(session)
    assert refused.value.code == "projection_drift"
    drift = [f for f in backend.audit().findings if f.code == "projection_drift"]
    assert drift and all(f.where.startswith("cells ") for f in drift)
    assert "status" in drift[0].message


def test_two_writers_interleave_sessions_and_each_chain_stays_whole(backend: Backend) -> None:
    a, b = backend.writer(), backend.writer()
    try:
        for n in range(20):
            (a if n % 2 else b).append(f"s{n % 3}", "note", {"n": n})
    finally:
        a.close()
        b.close()
    with backend.reader() as stored:
        assert check_chain(stored) == []
        got = [e.body["n"] for e in stored.events()]
    assert got == list(range(20))


def test_odd_text_in_a_cell_is_kept_and_the_record_stays_clean(backend: Backend) -> None:
    """A NUL character (PostgreSQL text cannot hold one) and a lone surrogate in the code."""
    with backend.host() as h:
        # Python refuses a NUL in source (status error); the Host still records the cell.
        obs = h.execute("s = 'a\x00b'\nt = '\udcff'\nprint(len(s))")
        assert obs.status == "error" and "null bytes" in obs.text
        assert h.execute("print(1)").status == "ok"
        session = h.session_id
    with backend.reader() as stored:
        code = [e.body["code"] for e in stored.events(session) if e.kind == "cell_started"]
    assert code and "\x00" in code[0] and "\ufffd" in code[0]
    assert backend.audit().clean


def test_a_read_only_reader_cannot_write(backend: Backend) -> None:
    with backend.host() as h:
        h.execute("x = 1")
    with backend.reader() as reader:
        before = reader.query("SELECT count(*) FROM events")[0][0]
        with pytest.raises(RecordRefused) as refused:
            reader.append("s", "note", {})
        assert refused.value.code == "record_readonly"
        with pytest.raises(Exception):
            reader.query("DELETE FROM events")
    assert backend.sql("SELECT count(*) FROM events")[0][0] == before


def test_a_ledger_with_no_events_is_empty_not_clean(backend: Backend) -> None:
    backend.writer().close()  # the schema, and nothing in it
    report = backend.audit()
    assert not report.clean and report.findings[0].code == "ledger_empty"


_KILLED_HOST = textwrap.dedent("""
    import sys
    from pathlib import Path
    from host_kernel import Host

    workdir, record, url = sys.argv[1], sys.argv[2], sys.argv[3] or None
    host = Host(workdir, record_dir=record, ledger=url).start()
    host.execute("x = 1")
    print(host.session_id, flush=True)
    host.execute("import time\\nopen('started', 'w').close()\\ntime.sleep(600)")
""")


def test_a_host_killed_mid_session_leaves_a_record_the_next_host_closes(
        backend: Backend) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_HOST, str(backend.workdir),
                             str(backend.record), backend.url or ""],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        session = proc.stdout.readline().strip()
        wait_for(lambda: (backend.workdir / "started").exists(), 60, "the long cell to start")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the Host and its kernel, as a crash would
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]
    # What the dead Host left is consistent: the chain verifies, the cell is running.
    with backend.reader() as stored:
        assert check_chain(stored) == []
    view = backend.verified(session)
    try:
        assert [r[0] for r in view.query("SELECT status FROM cells WHERE session = ? ORDER BY "
                                         "seq_started", (session,))] == ["ok", "running"]
    finally:
        view.close()
    with backend.host() as h:
        h.execute("y = 2")
        closer = h.session_id
    with backend.reader() as stored:
        ended = [e.body for e in stored.events(session) if e.kind == "session_ended"]
        statuses = [r[0] for r in stored.query("SELECT status FROM cells WHERE session = ? "
                                               "ORDER BY seq_started", (session,))]
    assert ended == [{"reason": "host_died", "recovered_by": closer}]
    assert statuses == ["ok", "host_died"]
    report = backend.audit()
    assert report.clean, [str(f) for f in report.findings]


def test_a_live_session_is_not_closed_by_another_host(backend: Backend) -> None:
    with backend.host() as first:
        first.execute("x = 1")
        with backend.host() as second:
            second.execute("y = 1")
        assert first.execute("print(x)").status == "ok"
        with backend.reader() as stored:
            ended = [e for e in stored.events(first.session_id) if e.kind == "session_ended"]
        assert ended == []


def test_pg_a_writer_runs_the_schema_script_only_when_the_ledger_lacks_this_versions(
        pg_url: str) -> None:
    """Opening a ledger whose schema digest is this version's skips the script (an index
    dropped behind its back stays dropped); a ledger made by another version (another
    digest) has the script run again, which puts the index back."""
    def index_there() -> bool:
        return bool(direct_sql(pg_url, "SELECT 1 FROM pg_indexes WHERE schemaname = ? AND "
                               "indexname = 'events_by_kind'", (PG_SCHEMA,)))

    with PostgresLedger(pg_url):
        pass
    assert index_there()
    direct_sql(pg_url, "DROP INDEX events_by_kind")
    with PostgresLedger(pg_url) as again:
        again.append("s1", "session_started", {"workdir": "/w"})
    assert not index_there()
    direct_sql(pg_url, "UPDATE ledger_meta SET value = 'an-older-schema' WHERE name = 'schema'")
    with PostgresLedger(pg_url) as upgraded:
        upgraded.append("s2", "session_started", {"workdir": "/w"})
    assert index_there()
    assert direct_sql(pg_url, "SELECT value FROM ledger_meta WHERE name = 'schema'") != \
        [("an-older-schema",)]


def test_pg_a_writer_with_another_key_is_refused_before_it_writes(pg_url: str) -> None:
    with PostgresLedger(pg_url) as first:
        first.append("s", "note", {})
    with pytest.raises(RecordRefused) as refused:
        PostgresLedger(pg_url, key=os.urandom(32))
    assert refused.value.code == "record_key_invalid"
    with PostgresLedger.open_readonly(pg_url) as reader:
        assert reader.query("SELECT count(*) FROM events")[0][0] == 1


def test_pg_a_removed_session_tail_is_found_from_its_head(pg_url: str) -> None:
    with PostgresLedger(pg_url) as ledger:
        for n in range(3):
            ledger.append("s", "note", {"n": n})
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {PG_SCHEMA}.events WHERE n = 3")
    with PostgresLedger.open_readonly(pg_url) as reader:
        problems = check_chain(reader)
    assert problems and "should end at its event 3" in problems[0].problem


def test_pg_the_kernel_sees_no_libpq_credentials(pg_url: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "s3cret-pg")
    monkeypatch.setenv("PGUSER", "hk")
    ws = tmp_path / "ws"
    ws.mkdir()
    with Host(ws, ledger=pg_url) as h:
        obs = h.execute("import os\nprint(sorted(k for k in os.environ if k.startswith('PG')))")
        assert obs.text.strip() == "[]"
        started = [e.body for e in h.ledger.events(h.session_id)  # type: ignore[union-attr]
                   if e.kind == "session_started"][0]
    assert started["ledger"].startswith("postgresql://") and "s3cret" not in json.dumps(started)


def test_bad_ledger_arguments_are_refused_clearly(tmp_path: Path) -> None:
    from host_kernel import BadArguments, RecordError

    with pytest.raises(BadArguments, match="postgresql://"):
        Host(tmp_path, ledger="mysql://nope")
    with pytest.raises(BadArguments, match="ledger_key"):
        Host(tmp_path, ledger_key=b"x" * 32)
    with pytest.raises(RecordError, match="connect"):
        Host(tmp_path, ledger="postgresql://nobody@127.0.0.1:1/none", store_patience=0).start()
    assert not list(Path(tmp_path).glob("hk-*"))


def test_the_rebuilt_pg_projection_compares_equal_to_sqlite_rows(
        pg_url: str, tmp_path: Path) -> None:
    """The same events through either backend give the same projection rows."""
    lite = SQLiteLedger(tmp_path / "ledger.sqlite")
    pg = PostgresLedger(pg_url)
    try:
        for ledger in (lite, pg):
            ledger.append("s", "session_started", {"workdir": "/w", "mode": {"name": "x"}})
            ledger.append("s", "cell_started", {"cell_id": "c", "generation": 1, "code": "1"})
            ledger.append("s", "cell_finished", {"cell_id": "c", "status": "ok",
                                                 "outputs": [{"t": "x"}], "execution_count": 1})
        rows = {name: [r[:1] + r[2:] for r in
                       ledger.query("SELECT cell_id, seq_started, code, status, outputs "
                                    "FROM cells")] for name, ledger in (("l", lite), ("p", pg))}
        assert rows["l"] == rows["p"] and rows["l"]
        assert GENESIS == pg.query("SELECT prev FROM events WHERE n = 1")[0][0]
    finally:
        lite.close()
        pg.close()


def test_pg_every_reader_reads_a_ledger_verified(pg_url: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from host_kernel.cli import main

    b = Backend("postgresql", tmp_path / "ws", tmp_path / "record", pg_url)
    b.workdir.mkdir()
    session = _session_with_everything(b)
    with PostgresLedger.open_readonly(pg_url) as ledger:
        artifact = ledger.query("SELECT artifact_id FROM artifacts")[0][0]
        receipt = ledger.query("SELECT receipt_id FROM receipts")[0][0]
    capsys.readouterr()
    assert main(["ls", "--ledger", pg_url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["session"] for r in rows] == [session]
    assert main(["show", session[:8], "--ledger", pg_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "session"
    assert main(["lineage", artifact, "--ledger", pg_url, "--format", "json"]) == 0
    assert artifact in capsys.readouterr().out
    assert main(["receipt", receipt, "--ledger", pg_url]) == 0
    assert json.loads(capsys.readouterr().out)["_type"].startswith("https://in-toto.io")
    out = tmp_path / "s.ipynb"
    assert main(["export", "--ledger", pg_url, "--session", session, "-o", str(out)]) == 0
    import nbformat

    nbformat.validate(nbformat.read(out, as_version=4))
    # A reader refuses a ledger that fails its checks, as for a record folder.
    b.sql("UPDATE cells SET code = 'print(42)'")
    assert main(["ls", "--ledger", pg_url]) == 1
    assert "projection_drift" in capsys.readouterr().err


def test_pg_a_table_planted_on_the_search_path_is_never_read(pg_url: str, tmp_path: Path) -> None:
    """Someone with CREATE on the database makes an empty ``public.events`` (or a schema
    named after the user, first on the default search path): the ledger still reads its
    own schema's tables, and audit still sees every event."""
    b = Backend("postgresql", tmp_path / "ws", tmp_path / "record", pg_url)
    b.workdir.mkdir()
    with b.host() as h:
        h.execute("x = 1")
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute('CREATE SCHEMA IF NOT EXISTS "hk"')
        for schema in ("public", '"hk"'):
            conn.execute(f"CREATE TABLE {schema}.events (LIKE {PG_SCHEMA}.events)")
    report = audit_ledger(pg_url)
    assert report.clean and report.events > 0
    with PostgresLedger.open_readonly(pg_url) as reader:
        assert reader.query("SELECT count(*) FROM events")[0][0] == report.events


# --------------------------------------------------------------------------- attacks on a
# PostgreSQL ledger by someone who can write the database but holds no record key, or by
# the kernel itself.



@pytest.fixture
def pg_backend(pg_url: str, tmp_path: Path) -> Backend:
    b = Backend("postgresql", tmp_path / "ws", tmp_path / "record", pg_url)
    b.workdir.mkdir()
    return b


def test_pg_a_view_in_place_of_the_events_table_is_refused(pg_backend: Backend) -> None:
    """A view can show the checks one thing and the replay another: readers refuse to read
    a ledger whose tables are not plain tables."""
    with pg_backend.host() as h:
        h.execute("x = 1")
        session = h.session_id
    direct_sql(pg_backend.url or "", "ALTER TABLE events RENAME TO events_real")
    direct_sql(pg_backend.url or "", "CREATE VIEW events AS SELECT * FROM events_real")
    with pytest.raises(RecordRefused) as refused:
        pg_backend.verified(session)
    assert refused.value.code == "record_unreadable" and "not a plain table" in str(refused.value)
    report = pg_backend.audit()
    assert not report.clean and report.findings[0].code == "record_unreadable"


def test_pg_the_replay_checks_the_rows_it_replays(pg_url: str) -> None:
    from host_kernel.store.pg import replay_problems

    with PostgresLedger(pg_url) as ledger:
        for n in range(3):
            ledger.append("s", "note", {"n": n})
        rows = ledger.query("SELECT seq, session, ts, kind, body, prev, hash, mac, n FROM "
                            "events ORDER BY seq")
        key = ledger.key()
    replay_problems(rows, key)  # as written: nothing to say
    forged = [tuple(r) for r in rows]
    forged[1] = forged[1][:4] + ('{"n":9}',) + forged[1][5:]
    cls = type(rows[0])
    with pytest.raises(RecordRefused) as refused:
        replay_problems([cls(r) for r in forged], key)
    assert refused.value.code == "chain_broken"
    with pytest.raises(RecordRefused) as refused:
        replay_problems(rows, os.urandom(32))
    assert refused.value.code == "event_unauthenticated"


def test_pg_swapped_seqs_within_a_session_are_found(pg_url: str) -> None:
    with PostgresLedger(pg_url) as ledger:
        for n in range(3):
            ledger.append("s", "note", {"n": n})
    first, last = (r[0] for r in direct_sql(pg_url, "SELECT seq FROM events ORDER BY seq")[::2])
    direct_sql(pg_url, "UPDATE events SET seq = -1 WHERE seq = ?", (first,))
    direct_sql(pg_url, "UPDATE events SET seq = ? WHERE seq = ?", (first, last))
    direct_sql(pg_url, "UPDATE events SET seq = ? WHERE seq = -1", (last,))
    with PostgresLedger.open_readonly(pg_url) as reader:
        assert any("reordered" in p.problem for p in check_chain(reader))
    assert not audit_ledger(pg_url).clean


def test_pg_without_the_key_readers_refuse_and_audit_fails(
        pg_backend: Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pg_backend.host() as h:
        h.execute("x = 1")
        session = h.session_id
    monkeypatch.setenv("HOST_KERNEL_LEDGER_KEY", str(tmp_path / "no-such.key"))
    with pytest.raises(RecordRefused) as refused:
        pg_backend.verified(session)
    assert refused.value.code == "record_key_missing"
    report = audit_ledger(pg_backend.url or "")
    assert not report.clean and report.findings[0].code == "record_key_missing"
    chains_only = audit_ledger(pg_backend.url or "", without_key=True)
    assert chains_only.clean and "macs_unchecked" in {f.code for f in chains_only.findings}


def test_pg_a_host_closes_abandoned_sessions_from_their_checked_events(
        pg_backend: Backend) -> None:
    """A database writer reopens an ended session and marks a finished cell running in
    the stored tables: the next Host reads the session's events, sees it ended, and
    appends nothing to it."""
    with pg_backend.host() as h:
        h.execute("x = 1")
        session = h.session_id
    url = pg_backend.url or ""
    direct_sql(url, "UPDATE sessions SET ended = NULL WHERE session = ?", (session,))
    direct_sql(url, "UPDATE cells SET status = 'running' WHERE session = ?", (session,))
    before = direct_sql(url, "SELECT count(*) FROM events WHERE session = ?", (session,))[0][0]
    with pg_backend.host() as h:
        h.execute("y = 1")
    [(after,)] = direct_sql(url, "SELECT count(*) FROM events WHERE session = ?", (session,))
    assert after == before


def test_pg_load_artifact_reads_the_checked_events_not_the_stored_row(
        pg_backend: Backend) -> None:
    with pg_backend.host() as h:
        obs = h.execute("open('a.txt', 'w').write('real bytes')\n"
                        "open('b.txt', 'w').write('attacker chosen bytes')\n"
                        "a = host.save_artifact('a.txt'); b = host.save_artifact('b.txt')\n"
                        "print(a.artifact_id)")
        artifact = obs.text.strip()
        url = pg_backend.url or ""
        direct_sql(url, "UPDATE artifacts SET sha256 = (SELECT sha256 FROM artifacts WHERE "
                 "filename = 'b.txt') WHERE artifact_id = ?", (artifact,))
        obs = h.execute(f"p = host.load_artifact({artifact!r}, path='got.txt')\n"
                        f"print(open('got.txt').read())")
        assert obs.status == "ok", obs.text
        assert obs.text.strip() == "real bytes"


def test_pg_a_dropped_connection_is_taken_up_again(pg_backend: Backend) -> None:
    url = pg_backend.url or ""
    with pg_backend.host() as h:
        h.execute("x = 1")
        direct_sql(url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                 "application_name = 'host_kernel' AND pid <> pg_backend_pid()")
        assert h.execute("print(x + 1)").text.strip() == "2"
    assert audit_ledger(url).clean


def test_pg_a_session_closed_while_its_connection_was_down_is_not_continued(
        pg_backend: Backend) -> None:
    from host_kernel import HostKernelError

    url = pg_backend.url or ""
    first = pg_backend.host().start()
    try:
        first.execute("x = 1")
        direct_sql(url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                 "application_name = 'host_kernel' AND pid <> pg_backend_pid()")
        with pg_backend.host() as second:  # finds the session unheld: closes it
            second.execute("y = 1")
        with pytest.raises(HostKernelError):
            first.execute("x = 2")
    finally:
        first.close()
    with PostgresLedger.open_readonly(url) as reader:
        kinds = [e.kind for e in reader.events(first.session_id)]
    assert kinds[-1] == "session_ended" and kinds.count("session_ended") == 1
    assert audit_ledger(url).clean


def test_pg_a_server_that_rounds_doubles_does_not_break_the_chain(pg_backend: Backend) -> None:
    url = pg_backend.url or ""
    database = url.rsplit("/", 1)[1]
    direct_sql(url, f'ALTER DATABASE "{database}" SET extra_float_digits = 0')
    with pg_backend.host() as h:
        h.execute("x = 1")
        session = h.session_id
    pg_backend.verified(session).close()
    assert audit_ledger(url).clean


def test_pg_expect_heads_finds_a_removed_session_tail(
        pg_backend: Backend, tmp_path: Path) -> None:
    from host_kernel.cli import main

    with pg_backend.host() as h:
        h.execute("x = 1")
    session, head = h.session_id, h.head  # after close: its session_ended is the head
    assert head is not None
    url = pg_backend.url or ""
    kept = tmp_path / "heads.jsonl"
    kept.write_text(json.dumps({"session_id": session, "head": head}) + "\n")
    assert main(["audit", "--ledger", url, "--expect-heads", str(kept)]) == 0
    # A database writer drops the session's last event and moves its head back.
    n, = direct_sql(url, "SELECT max(n) FROM events WHERE session = ?", (session,))[0]
    direct_sql(url, "DELETE FROM events WHERE session = ? AND n = ?", (session, n))
    direct_sql(url, "UPDATE heads SET n = e.n, hash = e.hash, seq = e.seq FROM events e WHERE "
             "heads.session = e.session AND e.n = ? AND heads.session = ?", (n - 1, session))
    direct_sql(url, "UPDATE sessions SET ended = NULL WHERE session = ?", (session,))
    assert audit_ledger(url).clean  # nothing inside the database shows it
    report = audit_ledger(url, expect_heads={session: head})
    assert [f.code for f in report.findings if f.fatal] == ["head_mismatch"]
    assert main(["audit", "--ledger", url, "--expect-heads", str(kept)]) == 1


def test_a_kernel_made_execution_count_is_recorded_only_when_it_is_one(
        backend: Backend) -> None:
    with backend.host() as h:
        h.execute("get_ipython().execution_count = 2**70")
        assert h.execute("x = 1").status == "ok"
        session = h.session_id
    with backend.reader() as stored:
        counts = [e.body.get("execution_count") for e in stored.events(session)
                  if e.kind == "cell_finished"]
    assert None in counts
    assert backend.audit().clean


def test_no_kernel_reads_a_ledger_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever its own record is, a session's kernel cannot read any PostgreSQL ledger's
    key (a folder outside /tmp, which every kernel is kept from anyway)."""
    import shutil
    import tempfile

    config = Path(tempfile.mkdtemp(dir=Path.home(), prefix=".hk-test-config-"))
    try:
        monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
        folder = config / "host_kernel" / "ledger-keys"
        folder.mkdir(parents=True)
        (folder / "other.key").write_bytes(os.urandom(32))
        ws = tmp_path / "ws"
        ws.mkdir()
        with Host(ws) as h:
            if not h.confinement or not h.confinement.active:
                pytest.skip(f"NO CONFINEMENT HERE: {h.confinement}")
            obs = h.execute(f"open({str(folder / 'other.key')!r}, 'rb').read()")
        assert obs.status == "error" and "Permission" in obs.text
    finally:
        shutil.rmtree(config, ignore_errors=True)
