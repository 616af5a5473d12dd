"""``audit --ledger`` keeps going: each session of a PostgreSQL ledger is checked on its own.

Fifty sessions in one real PostgreSQL ledger (the suite's server): forty-nine written
through the ledger's own API with the record key (each with a cell, an artifact and its
blob in a folder of its own), and one real Host session with an artifact and an
accepted verdict. One event of session 17 is edited and one of session 33 deleted,
directly in the database: the audit names those two sessions, each with its first
problem (the event's place in the session and in the ledger, what was expected),
finds the other 48 sound and verifies their artifacts and blobs, and exits 1. A
problem of the ledger as a whole (a wrong key, a dropped table) stops it with one
finding. Progress written to a pipe is whole lines.
"""

from __future__ import annotations

import io
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _pg import direct_sql

from host_kernel import Host
from host_kernel.audit import ProgressLines, audit_ledger, print_progress
from host_kernel.store.blobs import FileBlobStore
from host_kernel.store.pg import PostgresLedger

SESSIONS = 50
EDITED, CUT = 17, 33  # 1-based places of the damaged sessions


@dataclass(frozen=True)
class Fifty:
    """The template ledger: its database's name, its sessions in order, the blob folders."""

    template: str
    sessions: list[str]
    folders: dict[str, Path]


def _synthetic(writer: PostgresLedger, session: str, folder: Path, i: int) -> None:
    """A session as a Host writes one: started, one cell, an artifact whose blob is in the
    session's record folder, ended."""
    blob = FileBlobStore(folder).put_bytes(f"result {i}\n".encode())
    writer.append(session, "session_started", {"workdir": "/nonexistent", "mode":
                                               {"name": "exploration"}, "record_dir": str(folder)})
    writer.append(session, "generation_started", {"generation": 1, "reason": "start"})
    cell = f"{session}-cell"
    writer.append(session, "cell_started", {"cell_id": cell, "generation": 1, "code": "x = 1"})
    writer.append(session, "cell_finished", {"cell_id": cell, "status": "ok",
                                             "execution_count": 1, "outputs": []})
    writer.append(session, "artifact_saved", {
        "artifact_id": str(uuid.uuid4()), "cell_id": cell, "generation": 1,
        "filename": f"result{i}.txt", "sha256": blob.sha256, "size": blob.size})
    writer.append(session, "session_ended", {})


@pytest.fixture(scope="module")
def fifty(pg_server: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fifty]:
    url = pg_server.create_database()  # type: ignore[attr-defined]
    root = tmp_path_factory.mktemp("fifty")
    sessions: list[str] = []
    folders: dict[str, Path] = {}
    with PostgresLedger(url) as writer:
        for i in range(1, SESSIONS):
            session = f"s{i:02d}-{uuid.uuid4().hex[:8]}"
            folders[session] = root / session
            _synthetic(writer, session, folders[session], i)
            sessions.append(session)
    ws = root / "ws"
    ws.mkdir()
    with Host(ws, ledger=url) as h:
        obs = h.execute("host.write_file('out.txt', 'real result')\n"
                        "host.save_artifact('out.txt')\n"
                        "v = host.submit_output({'summary': 'done'}, ['wrote out.txt'])\n"
                        "print(v.accepted)")
        assert obs.status == "ok" and obs.text.strip() == "True", obs.text
        sessions.append(h.session_id)
    try:
        yield Fifty(url.rsplit("/", 1)[1], sessions, folders)
    finally:
        pg_server.drop_database(url)  # type: ignore[attr-defined]


@pytest.fixture
def ledger(fifty: Fifty, pg_server: object) -> Iterator[str]:
    """A copy of the fifty sessions' ledger for one test (its own database, same key)."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:  # type: ignore[attr-defined]
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{fifty.template}"')
    url = pg_server.url(name)  # type: ignore[attr-defined]
    try:
        yield url
    finally:
        pg_server.drop_database(url)  # type: ignore[attr-defined]


def _damage(url: str, fifty: Fifty) -> dict[str, tuple[int, int]]:
    """Session 17's cell_started edited, session 33's cell_finished deleted: per session,
    the event's place in the session's chain and its seq in the ledger."""
    edited, cut = fifty.sessions[EDITED - 1], fifty.sessions[CUT - 1]
    [(seq17,)] = direct_sql(url, "SELECT seq FROM events WHERE session = ? AND n = 3", (edited,))
    direct_sql(url, "UPDATE events SET body = replace(body, 'x = 1', 'x = 2') WHERE seq = ?",
               (seq17,))
    [(seq33,)] = direct_sql(url, "SELECT seq FROM events WHERE session = ? AND n = 5", (cut,))
    direct_sql(url, "DELETE FROM events WHERE session = ? AND n = 4", (cut,))
    return {edited: (3, seq17), cut: (5, seq33)}


def test_a_clean_ledger_of_fifty_sessions_is_fifty_sound_sessions(ledger: str,
                                                                  fifty: Fifty) -> None:
    report = audit_ledger(ledger)
    assert report.clean, [str(f) for f in report.findings]
    assert [s.session for s in report.sessions or ()] == fifty.sessions
    assert report.counts() == {"sound": 50, "damaged": 0, "not_checked": 0}
    assert all(s.verified()["artifacts"] == 1 and s.verified()["blobs"] == 1
               for s in report.sessions or ())
    assert report.sessions and report.sessions[-1].verdicts == 1  # the real Host's
    assert "50 sessions sound, 0 damaged, 0 not checked" in report.summary()


def test_an_edited_and_a_deleted_event_damage_two_sessions_and_the_other_48_are_sound(
        ledger: str, fifty: Fifty) -> None:
    damaged = _damage(ledger, fifty)
    report = audit_ledger(ledger)
    assert not report.clean
    by_id = {s.session: s for s in report.sessions or ()}
    assert [s.session for s in report.sessions or ()] == fifty.sessions  # none dropped
    assert [s for s, a in by_id.items() if a.status != "sound"] == list(damaged)
    assert report.counts() == {"sound": 48, "damaged": 2, "not_checked": 0}
    assert "48 sessions sound, 2 damaged, 0 not checked" in report.summary()

    edited, cut = (by_id[s].problem for s in damaged)
    assert edited is not None and cut is not None
    assert (edited.code, edited.session_seq, edited.seq) == ("chain_broken", *damaged[
        fifty.sessions[EDITED - 1]])
    assert "edited" in edited.message and edited.expected and "hash" in edited.expected
    assert (cut.code, cut.session_seq, cut.seq) == ("chain_broken", *damaged[
        fifty.sessions[CUT - 1]])
    assert "deleted" in cut.message and cut.expected and "its event 4" in cut.expected
    # What held up to the break is said too: events 1 and 2 of session 17, 1 to 3 of 33.
    assert [by_id[s].events_verified for s in damaged] == [2, 3]
    # Only the first problem of each session leads; the ledger's own findings are none.
    assert all(f.session in damaged for f in report.findings if f.fatal)


def test_a_damaged_session_does_not_stop_later_sessions_being_verified(
        ledger: str, fifty: Fifty) -> None:
    _damage(ledger, fifty)
    later = fifty.sessions[EDITED:]  # every session after the first damaged one
    gone = fifty.folders[later[10]]  # and one later session's blob removed meanwhile
    saved = gone.parent / (gone.name + ".saved")
    shutil.copytree(gone, saved)
    shutil.rmtree(gone / "blobs")
    try:
        report = audit_ledger(ledger)
    finally:
        shutil.rmtree(gone, ignore_errors=True)
        saved.rename(gone)
    by_id = {s.session: s for s in report.sessions or ()}
    sound_later = [s for s in later if by_id[s].status == "sound"]
    assert len(sound_later) == len(later) - 2  # session 33 and the one without its blob
    assert sum(by_id[s].artifacts for s in sound_later) == len(sound_later)
    assert sum(by_id[s].blobs for s in sound_later) == len(sound_later)
    assert by_id[later[-1]].verdicts == 1  # the real session, last, re-verified
    missing = by_id[later[10]].problem
    assert missing is not None and missing.code == "blob_missing"
    assert missing.session_seq == 5  # its artifact_saved, the session's fifth event
    assert report.artifacts == 48 and report.submissions == 1


def test_the_cli_names_the_damaged_sessions_exits_1_and_gives_json_per_session(
        ledger: str, fifty: Fifty) -> None:
    damaged = _damage(ledger, fifty)
    run = [sys.executable, "-m", "host_kernel", "audit", "--ledger", ledger]
    done = subprocess.run(run, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    flagged = [line for line in lines if line.startswith("damaged")]
    assert len(flagged) == 2
    for line, (session, (n, seq)) in zip(flagged, damaged.items(), strict=True):
        assert session in line and f"event {n} (seq {seq}): [chain_broken]" in line
        assert "expected" in line
    assert sum(line.startswith("sound ") for line in lines) == 48
    assert "48 sessions sound, 2 damaged, 0 not checked" in lines[-1]
    # stderr, a pipe here: progress as whole lines, then the one error line.
    assert "\r" not in done.stderr
    err = done.stderr.splitlines()
    assert err[-1].startswith("host-kernel audit: error: [chain_broken] session "
                              f"{fifty.sessions[EDITED - 1]} event 3")
    assert "2 sessions damaged" in err[-1]
    progress = [line for line in err[:-1] if line.startswith("audit: sessions ")]
    assert progress and progress[-1] == f"audit: sessions {SESSIONS}/{SESSIONS}"
    assert len(progress) <= 12 and len(progress) == len(err) - 1

    done = subprocess.run([*run, "--json"], check=False, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1
    body = json.loads(done.stdout)
    assert (body["sound"], body["damaged"], body["not_checked"]) == (48, 2, 0)
    sessions = {s["id"]: s for s in body["sessions"]}
    assert list(sessions) == fifty.sessions
    for session, (n, seq) in damaged.items():
        one = sessions[session]
        assert one["status"] == "damaged"
        assert {k: one["problem"][k] for k in ("code", "seq", "session_seq")} == {
            "code": "chain_broken", "seq": seq, "session_seq": n}
        assert one["problem"]["expected"] and one["problem"]["message"]
    sound = sessions[fifty.sessions[0]]
    assert sound["status"] == "sound" and sound["problem"] is None
    assert sound["verified"] == {"events": 6, "artifacts": 1, "blobs": 1, "receipts": 0,
                                 "verdicts": 0}
    assert sessions[fifty.sessions[-1]]["verified"]["verdicts"] == 1


def test_one_session_named_is_audited_alone(ledger: str, fifty: Fifty) -> None:
    _damage(ledger, fifty)
    report = audit_ledger(ledger, sessions=[fifty.sessions[CUT - 1][:6]])
    assert [(s.session, s.status) for s in report.sessions or ()] == [
        (fifty.sessions[CUT - 1], "damaged")]
    report = audit_ledger(ledger, sessions=[fifty.sessions[0]])
    assert report.clean and report.counts()["sound"] == 1


def test_a_wrong_key_stops_the_audit_with_one_finding(
        ledger: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(os.urandom(32))
    monkeypatch.setenv("HOST_KERNEL_LEDGER_KEY", str(wrong))
    report = audit_ledger(ledger)
    assert [f.code for f in report.findings] == ["record_key_invalid"]
    assert report.counts() == {"sound": 0, "damaged": 0, "not_checked": 50}
    assert "0 sessions sound, 0 damaged, 50 not checked" in report.summary()


@pytest.mark.parametrize(("table", "code"), [("receipts", "projection_drift"),
                                             ("heads", "record_unreadable")])
def test_a_dropped_table_stops_the_audit_with_one_finding(ledger: str, table: str,
                                                          code: str) -> None:
    direct_sql(ledger, f"DROP TABLE {table}")
    report = audit_ledger(ledger)
    assert [(f.code, f.session) for f in report.findings] == [(code, None)]
    assert f"no {table} table" in report.findings[0].message
    assert report.counts()["not_checked"] == 50


def test_a_session_whose_blob_store_cannot_be_opened_is_not_checked(pg_url: str,
                                                                    tmp_path: Path) -> None:
    with PostgresLedger(pg_url) as writer:
        _synthetic(writer, "fine", tmp_path / "fine", 1)
        writer.append("elsewhere", "session_started", {"workdir": "/nonexistent", "mode": {},
                                                       "blobs": "nosuch://bucket/x"})
        writer.append("elsewhere", "artifact_saved", {
            "artifact_id": "a1", "filename": "a.txt", "sha256": "ab" * 32, "size": 1})
    report = audit_ledger(pg_url)
    statuses = {s.session: s.status for s in report.sessions or ()}
    assert statuses == {"fine": "sound", "elsewhere": "not_checked"}
    assert not report.clean and "blobs_unreadable" in {f.code for f in report.findings}
    assert "1 session sound, 0 damaged, 1 not checked" in report.summary()


# ---------------------------------------------------------------------- progress


def test_progress_off_a_terminal_is_whole_lines_one_a_tenth() -> None:
    out = io.StringIO()
    show = ProgressLines(out)
    for done in range(5001):
        show("chain", done, 5000)
    show("chain", 5000, 5000)  # said again: not shown again
    lines = out.getvalue().split("\n")
    assert lines[-1] == "" and "\r" not in out.getvalue()  # every line ended
    shown = lines[:-1]
    assert shown[0] == "audit: chain 0/5000" and shown[-1] == "audit: chain 5000/5000"
    assert 11 <= len(shown) <= 13  # a tenth each (a slow machine may add one a second)
    quiet = io.StringIO()
    ProgressLines(quiet)("chain", 5, 10)  # too little to show
    assert quiet.getvalue() == ""


def test_progress_on_a_terminal_rewrites_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    master, slave = pty.openpty()
    try:
        with open(slave, "w", closefd=False) as terminal:
            show = ProgressLines(terminal)
            for done in range(101):
                show("sessions", done, 100)
        # The pty hands written bytes to its reader from a kernel work queue, so one read
        # may return only the first of them on a loaded machine: read until the line ends.
        data = b""
        while not data.endswith(b"\n") and select.select([master], [], [], 10)[0]:
            data += os.read(master, 65536)
        text = data.decode()
    finally:
        os.close(master)
        os.close(slave)
    assert text.startswith("\raudit: sessions 0/100")
    assert text.rstrip("\r\n").endswith("\raudit: sessions 100/100")
    assert text.count("\n") == 1  # one line, ended when the stage is done
    print_progress("blobs", 2000, 2000)  # the CLI's: stderr is not a terminal under pytest
    assert capsys.readouterr().err == "audit: blobs 2000/2000\n"
