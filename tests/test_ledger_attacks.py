"""Attacks on a PostgreSQL ledger and bad input to the commands that read it.

A database writer without the record key alters the ledger's tables themselves (a
column's type, a dropped NOT NULL), moves a session out of a ``--since`` audit by its
time, or a reviewer points the readers at the wrong key file or a malformed URL: every
reader and ``audit --ledger`` must refuse or report it, with one clear line and no
traceback, and never show a password.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pg import direct_sql

from host_kernel import RecordError
from host_kernel.audit import audit_ledger
from host_kernel.cli import main
from host_kernel.store.ledger import RecordRefused
from host_kernel.store.pg import PG_SCHEMA, PostgresLedger, redact_url
from host_kernel.store.verified import open_verified_ledger


@pytest.fixture
def ledger(pg_url: str) -> Iterator[str]:
    """A ledger with two sessions of three events each; its URL."""
    with PostgresLedger(pg_url) as writer:
        for session in ("s1", "s2"):
            for n in range(3):
                writer.append(session, "note", {"n": n})
    yield pg_url


ALTERATIONS = [
    "ALTER TABLE events ALTER COLUMN n TYPE text",
    "ALTER TABLE events ALTER COLUMN seq TYPE text",
    "ALTER TABLE events ALTER COLUMN ts TYPE text",
    "ALTER TABLE events ALTER COLUMN kind TYPE bytea USING kind::bytea",
    "ALTER TABLE events ALTER COLUMN prev DROP NOT NULL; UPDATE events SET prev = NULL "
    "WHERE n = 2",
    "ALTER TABLE events ALTER COLUMN hash DROP NOT NULL; UPDATE events SET hash = NULL "
    "WHERE n = 2",
    "ALTER TABLE events ALTER COLUMN body DROP NOT NULL; UPDATE events SET body = NULL "
    "WHERE n = 2",
    "ALTER TABLE heads ALTER COLUMN n TYPE text",
    "ALTER TABLE heads ALTER COLUMN hash DROP NOT NULL; UPDATE heads SET hash = NULL",
]


@pytest.mark.parametrize("alteration", ALTERATIONS)
def test_an_altered_ledger_table_is_refused_never_a_traceback(ledger: str,
                                                               alteration: str) -> None:
    direct_sql(ledger, alteration)
    for report in (audit_ledger(ledger), audit_ledger(ledger, sessions=["s1"]),
                   audit_ledger(ledger, since=0.0)):
        assert not report.clean
        assert {f.code for f in report.findings if f.fatal} <= {
            "chain_broken", "event_unauthenticated", "record_unreadable"}
    for session in (None, "s1"):
        with pytest.raises(RecordRefused) as refused:
            open_verified_ledger(ledger, session).close()
        assert refused.value.code == "chain_broken"
    with PostgresLedger(ledger) as writer, pytest.raises(RecordError):  # nothing appended
        writer.append("s1", "note", {"n": 9})


def test_a_session_whose_start_was_moved_back_is_still_audited_since(ledger: str) -> None:
    """Editing a session, then its first event's time to 1970, would take it out of
    ``audit --since`` (its start is read from that event): an edited first event cannot
    be trusted for its time, so the session is audited."""
    since = direct_sql(ledger, "SELECT ts FROM events WHERE session = 's2' AND n = 1")[0][0]
    assert [f.code for f in audit_ledger(ledger, since=since).findings] == []
    assert audit_ledger(ledger, since=since).events == 3  # s2 alone
    direct_sql(ledger, "UPDATE events SET body = '{\"n\":42}' WHERE session = 's2' AND n = 3")
    direct_sql(ledger, "UPDATE events SET ts = 0 WHERE session = 's2' AND n = 1")
    report = audit_ledger(ledger, since=since)
    assert not report.clean and "chain_broken" in {f.code for f in report.findings}


def test_a_session_whose_first_event_was_removed_is_still_audited_since(ledger: str) -> None:
    since = direct_sql(ledger, "SELECT ts FROM events WHERE session = 's2' AND n = 1")[0][0]
    direct_sql(ledger, "DELETE FROM events WHERE session = 's2' AND n = 1")
    assert not audit_ledger(ledger, since=since).clean
    report = audit_ledger(ledger, sessions=["s2"])  # and it can still be named
    assert not report.clean and report.findings[0].code == "chain_broken"


def test_a_session_whose_events_were_all_removed_is_still_audited_by_name(
        ledger: str) -> None:
    direct_sql(ledger, "DELETE FROM events WHERE session = 's2'")
    report = audit_ledger(ledger, sessions=["s2"])
    assert not report.clean and report.findings[0].code != "record_missing"


def test_a_wrong_key_is_one_clear_refusal_not_a_failure_per_event(
        ledger: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(os.urandom(32))
    monkeypatch.setenv("HOST_KERNEL_LEDGER_KEY", str(wrong))
    report = audit_ledger(ledger)
    assert [f.code for f in report.findings] == ["record_key_invalid"]
    with pytest.raises(RecordRefused) as refused:
        open_verified_ledger(ledger).close()
    assert refused.value.code == "record_key_invalid"
    assert main(["audit", "--ledger", ledger]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("host-kernel audit: error: [record_key_invalid]")


@pytest.mark.parametrize("url", [
    "postgresql://hk:s3cr%zzet@127.0.0.1:1/x",
    "postgresql://hk:s3cret@[127.0.0.1:1/x",
    "postgresql://hk@127.0.0.1:1/x?password=s3cr%00et",
    "postgresql://hk:s3cr#et@127.0.0.1:1/x",  # libpq takes these passwords as written
    "postgresql://hk:s3cr?et@127.0.0.1:1/x",
    "postgresql://hk:s3cr/et@127.0.0.1:1/x",
])
@pytest.mark.parametrize("command", [["ls"], ["show", "abc"], ["receipt", "abc"],
                                     ["lineage", "abc"], ["export", "-o", "o.ipynb"],
                                     ["audit"]])
def test_a_malformed_url_is_one_error_line_without_its_password(
        url: str, command: list[str], capsys: pytest.CaptureFixture[str],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--ledger", url]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"host-kernel {command[0]}: error: [")
    assert "s3cr" not in captured.err + captured.out
    assert "Traceback" not in captured.err


def test_redact_url_never_raises() -> None:
    assert redact_url("postgresql://u:pw@[bad") == "postgresql://…"
    assert "pw" not in redact_url("postgresql://u:pw@h/d?password=pw")


@pytest.mark.parametrize("password", ["s3#cr", "s3?cr", "s3/cr", "s3@cr", "s3:cr"])
def test_redact_url_hides_a_password_urlsplit_would_not_see(password: str) -> None:
    # libpq ends the user part at its "@", not at a "#" or "?" as urlsplit does.
    for url in (f"postgresql://u:{password}@h:5/d", f"postgresql://u@h/d?password={password}"):
        assert "s3" not in redact_url(url) and "cr" not in redact_url(url), url
    assert redact_url("postgresql://h:5/d?application_name=a@b") == \
        "postgresql://h:5/d?application_name=a@b"


def test_cli_reports_the_key_and_selection_findings(ledger: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    heads = tmp_path / "heads.jsonl"
    head = direct_sql(ledger, "SELECT hash FROM heads WHERE session = 's1'")[0][0]
    heads.write_text(json.dumps({"session_id": "s1", "head": head}) + "\n")
    assert main(["audit", "--ledger", ledger, "--session", "s1", "--expect-heads",
                 str(heads)]) == 0
    direct_sql(ledger, "ALTER TABLE events ALTER COLUMN n TYPE text")
    capsys.readouterr()
    assert main(["audit", "--ledger", ledger, "--session", "s1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "[chain_broken]" in err


def test_a_lock_held_by_someone_else_fails_the_append_in_time_and_loses_nothing(
        ledger: str) -> None:
    import psycopg

    with PostgresLedger(ledger, lock_timeout=1) as writer:
        with psycopg.connect(ledger) as squatter:  # a transaction left open on s1's head
            squatter.execute(f"SELECT * FROM {PG_SCHEMA}.heads WHERE session = 's1' "
                             f"FOR UPDATE")
            started = time.monotonic()
            with pytest.raises(RecordError, match="lock"):
                writer.append("s1", "note", {"n": 3})
            assert time.monotonic() - started < 30
            writer.append("s2", "note", {"n": 3})  # another session's chain is not held
        writer.append("s1", "note", {"n": 3})  # the lock is gone: the chain goes on
    report = audit_ledger(ledger, without_key=True)
    assert report.clean, [str(f) for f in report.findings]
    assert report.events == 8
