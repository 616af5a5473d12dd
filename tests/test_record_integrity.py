"""Integrity while live and offline: foreign events refused before an append, the record
key, audit that never writes and never calls an empty record clean, projection drift,
readers that verify, and the external head anchor.

Every test works on a real SQLite file filled through ``SQLiteLedger.append`` (no
kernel), and the command line runs as a real subprocess.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from host_kernel._paths import default_record_dir
from host_kernel.audit import audit
from host_kernel.export import export_notebook
from host_kernel.lineage.graph import record_lineage, record_receipt_statement
from host_kernel.store.blobs import FileBlobStore
from host_kernel.store.ledger import (
    GENESIS,
    KEY_NAME,
    ForeignEventError,
    RecordRefused,
    SQLiteLedger,
    canonical_json,
    check_chain,
    check_macs,
    event_hash,
    event_mac,
    load_record_key,
)
from host_kernel.store.verified import open_verified

ARTIFACT = "0b6f8a52-0000-4000-8000-000000000001"
RECEIPT = "5d1e7c33-0000-4000-8000-000000000002"


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


def fill(record: Path, workdir: Path | None = None) -> None:
    """A small, complete, clean session: a cell with a receipt and an artifact, blobs too."""
    record.mkdir(parents=True, exist_ok=True)
    blobs = FileBlobStore(record)
    out, err, data = (blobs.put_bytes(b) for b in (b"2 a.csv\n", b"", b"x\n1\n"))
    with SQLiteLedger(record / "ledger.sqlite") as ledger:
        ledger.append("s1", "session_started", {"workdir": str(workdir or record), "mode": {}})
        ledger.append("s1", "generation_started", {"generation": 1, "reason": "start"})
        ledger.append("s1", "cell_started", {"cell_id": "c1", "generation": 1, "code": "x"})
        ledger.append("s1", "receipt_recorded", {
            "receipt_id": RECEIPT, "cell_id": "c1", "generation": 1, "command": "wc -l a.csv",
            "exit_status": 0, "stdout_sha256": out.sha256, "stderr_sha256": err.sha256})
        ledger.append("s1", "artifact_saved", {
            "artifact_id": ARTIFACT, "cell_id": "c1", "generation": 1, "filename": "a.csv",
            "sha256": data.sha256, "size": data.size, "source_path": "a.csv",
            "lineage": {"inputs": [{"key": "r", "receipt_id": RECEIPT, "method": "receipt"}]}})
        ledger.append("s1", "cell_finished", {"cell_id": "c1", "status": "ok", "outputs": []})
        ledger.append("s1", "session_ended", {"generation": 1})


def forge(db: Path, *, mac: str | None = None, prev: str | None = None) -> int:
    """Append an event the way a same-user process could: chained, but not by the Host."""
    conn = sqlite3.connect(db)
    seq, last = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    prev = last if prev is None else prev
    ts, body = time.time(), canonical_json({"note": "forged"})
    digest = event_hash(prev, seq + 1, "intruder", ts, "note", body)
    conn.execute("INSERT INTO events (seq, session, ts, kind, body, prev, hash, mac) "
                 "VALUES (?,?,?,?,?,?,?,?)", (seq + 1, "intruder", ts, "note", body, prev,
                                              digest, mac))
    conn.commit()
    conn.close()
    return int(seq) + 1


def count(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        conn.close()


def files(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "host_kernel", *map(str, args)], check=False,
                          cwd=cwd, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def fatal_codes(record: Path, **kwargs: str) -> list[str]:
    return [f.code for f in audit(record, **kwargs).findings if f.fatal]  # type: ignore[arg-type]


# ----------------------------------------------------------------- live: foreign events


@pytest.mark.parametrize("how", ["no mac", "wrong mac", "chain broken"])
def test_a_foreign_event_is_refused_before_the_next_append_and_nothing_is_appended(
        tmp_path: Path, how: str) -> None:
    db = tmp_path / "ledger.sqlite"
    with SQLiteLedger(db) as ledger:
        ledger.append("s1", "session_started", {"mode": {}})
        ledger.append("s1", "note", {"n": 1})
        key = load_record_key(tmp_path)
        if how == "no mac":
            seq = forge(db)
        elif how == "wrong mac":
            seq = forge(db, mac="0" * 64)
        else:  # a key holder's MAC on an event that does not chain on
            conn = sqlite3.connect(db)
            seq = forge(db, prev="1" * 64)
            digest = conn.execute("SELECT hash FROM events WHERE seq = ?", (seq,)).fetchone()[0]
            conn.execute("UPDATE events SET mac = ? WHERE seq = ?", (event_mac(key, digest), seq))
            conn.commit()
            conn.close()
        with pytest.raises(ForeignEventError, match=f"event {seq}") as refused:
            ledger.append("s1", "note", {"n": 2})
        assert refused.value.code == "foreign_event" and refused.value.seqs == (seq,)
        assert count(db) == seq  # the Host's event was not appended after the foreign one
        with pytest.raises(ForeignEventError):  # and it stays refused
            ledger.append("s1", "note", {"n": 3})
        assert count(db) == seq


def test_events_removed_behind_a_writers_back_are_refused(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    with SQLiteLedger(db) as ledger:
        for n in range(3):
            ledger.append("s1", "note", {"n": n})
        conn = sqlite3.connect(db)
        conn.execute("DELETE FROM events WHERE seq = 3")
        conn.commit()
        conn.close()
        with pytest.raises(ForeignEventError, match="event 3") as refused:
            ledger.append("s1", "note", {"n": 4})
        assert refused.value.code == "foreign_event"
    assert count(db) == 2


def test_two_writers_on_one_record_share_its_key_and_interleave(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    with SQLiteLedger(db) as a, SQLiteLedger(db) as b:
        key = (tmp_path / KEY_NAME).read_bytes()
        for n in range(10):
            (a if n % 2 else b).append("s", "note", {"n": n})
            (a if n % 3 else b).append("s", "note", {"n": n, "again": True})
        assert a.head() == b.head() == b.known_head
        assert a.known_head is not None and a.known_head.seq in (19, 20)
    assert (tmp_path / KEY_NAME).read_bytes() == key  # made once, by the first writer
    assert len(key) == 32 and (tmp_path / KEY_NAME).stat().st_mode & 0o777 == 0o600
    with SQLiteLedger.open_readonly(db) as ledger:
        assert check_chain(ledger) == [] and check_macs(ledger, key) == []
        assert ledger.query("SELECT count(*) FROM events WHERE mac IS NULL")[0][0] == 0
    assert count(db) == 20


def test_a_writer_will_not_open_a_record_holding_forged_events(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    with SQLiteLedger(db) as ledger:
        ledger.append("s1", "note", {})
    seq = forge(db)
    with pytest.raises(ForeignEventError, match=f"event {seq}"):
        SQLiteLedger(db)
    assert count(db) == seq


def test_a_missing_key_for_authenticated_events_is_not_replaced(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    with SQLiteLedger(db) as ledger:
        ledger.append("s1", "note", {})
    (tmp_path / KEY_NAME).unlink()
    with pytest.raises(RecordRefused) as refused:
        SQLiteLedger(db)
    assert refused.value.code == "record_key_missing"
    assert not (tmp_path / KEY_NAME).exists()


def test_a_ledger_from_before_macs_is_upgraded_and_chain_checked_only(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, session TEXT NOT NULL, "
                 "ts REAL NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL, prev TEXT NOT NULL, "
                 "hash TEXT NOT NULL)")
    prev = GENESIS
    for seq in (1, 2):
        body = canonical_json({"n": seq})
        digest = event_hash(prev, seq, "old", 1.5, "note", body)
        conn.execute("INSERT INTO events VALUES (?,?,?,?,?,?,?)",
                     (seq, "old", 1.5, "note", body, prev, digest))
        prev = digest
    conn.commit()
    conn.close()
    before = files(tmp_path)
    report = audit(tmp_path)  # read-only: reads the old layout, changes nothing, makes no key
    assert report.clean and [f.code for f in report.findings] == ["macs_unchecked"]
    assert files(tmp_path) == before
    with SQLiteLedger(db) as ledger:
        ledger.append("new", "note", {"n": 3})
    conn = sqlite3.connect(db)
    macs = [r[0] for r in conn.execute("SELECT mac FROM events ORDER BY seq")]
    conn.close()
    assert macs[:2] == [None, None] and macs[2] is not None
    report = audit(tmp_path)
    assert report.clean, [str(f) for f in report.findings]
    legacy = next(f for f in report.findings if f.code == "events_without_mac")
    assert not legacy.fatal and "2 events" in legacy.message


# ----------------------------------------------------------------- audit never writes


def test_a_zero_byte_ledger_is_empty_not_clean_and_stays_zero_bytes(tmp_path: Path) -> None:
    (tmp_path / "ledger.sqlite").touch()
    before = files(tmp_path)
    report = audit(tmp_path)
    assert [f.code for f in report.findings] == ["ledger_empty"] and not report.clean
    proc = cli("audit", tmp_path, cwd=tmp_path)
    assert proc.returncode == 1 and "FAIL [ledger_empty]" in proc.stdout
    assert files(tmp_path) == before  # zero bytes, same mtime, no -wal, -shm or key made


def test_a_ledger_with_no_events_is_empty_not_clean(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "ledger.sqlite")
    conn.execute("CREATE TABLE other (x)")
    conn.commit()
    conn.close()
    assert fatal_codes(tmp_path) == ["ledger_empty"]
    (tmp_path / "ledger.sqlite").unlink()
    SQLiteLedger(tmp_path / "ledger.sqlite").close()  # the schema, and not one event
    before = files(tmp_path)
    assert fatal_codes(tmp_path) == ["ledger_empty"]
    assert files(tmp_path) == before
    with pytest.raises(RecordRefused) as refused:
        open_verified(tmp_path)
    assert refused.value.code == "ledger_empty"


@pytest.mark.parametrize("cut", ["half", "after the header", "inside the header", "not sqlite"])
def test_a_truncated_ledger_is_reported_as_truncated(tmp_path: Path, cut: str) -> None:
    record = tmp_path / "record"
    fill(record)
    with SQLiteLedger(record / "ledger.sqlite") as ledger:
        for n in range(200):
            ledger.append("s2", "note", {"n": n, "pad": "x" * 400})
    db = record / "ledger.sqlite"
    data = db.read_bytes()
    db.write_bytes({"half": data[: len(data) // 2], "after the header": data[:4096 * 2],
                    "inside the header": data[:60], "not sqlite": os.urandom(8192)}[cut])
    before = files(record)
    assert fatal_codes(record) == ["ledger_truncated"]
    proc = cli("audit", record, cwd=tmp_path)
    assert proc.returncode == 1 and "FAIL [ledger_truncated]" in proc.stdout
    assert files(record) == before
    with pytest.raises(RecordRefused) as refused:
        open_verified(record)
    assert refused.value.code == "ledger_truncated"


def test_a_damaged_page_is_reported_as_truncated(tmp_path: Path) -> None:
    fill(tmp_path)
    with SQLiteLedger(tmp_path / "ledger.sqlite") as ledger:
        for n in range(200):
            ledger.append("s2", "note", {"n": n, "pad": "x" * 400})
    data = bytearray((tmp_path / "ledger.sqlite").read_bytes())
    data[4096 * 5:4096 * 6] = b"\xff" * 4096
    (tmp_path / "ledger.sqlite").write_bytes(bytes(data))
    assert fatal_codes(tmp_path) == ["ledger_truncated"]


def test_audit_of_a_live_record_reads_the_log_and_leaves_no_file_behind(tmp_path: Path) -> None:
    fill(tmp_path)
    assert not (tmp_path / "ledger.sqlite-wal").exists()  # the last writer cleaned up
    before = files(tmp_path)
    report = audit(tmp_path)
    assert report.clean and report.events == 7 and report.head is not None
    assert files(tmp_path) == before
    with SQLiteLedger(tmp_path / "ledger.sqlite") as live:  # a Host holding the record open
        event = live.append("s2", "note", {})
        ledger_bytes = (tmp_path / "ledger.sqlite").read_bytes()
        names = set(os.listdir(tmp_path))
        report = audit(tmp_path)
        assert report.clean and report.events == 8 and report.head == event.hash
        assert set(os.listdir(tmp_path)) == names
        assert (tmp_path / "ledger.sqlite").read_bytes() == ledger_bytes


def test_a_log_that_cannot_be_read_without_writing_is_skipped_and_said(tmp_path: Path) -> None:
    live_dir, copy = tmp_path / "live", tmp_path / "copy"
    fill(live_dir)
    copy.mkdir()
    with SQLiteLedger(live_dir / "ledger.sqlite") as live:
        live.append("s2", "note", {})
        # a copy of the file and its log, but not the log's index (-shm): reading the log
        # would mean creating that index in the record folder
        for name in ("ledger.sqlite", "ledger.sqlite-wal", KEY_NAME):
            shutil.copy2(live_dir / name, copy / name)
    before = files(copy)
    report = audit(copy)
    assert "wal_unread" in [f.code for f in report.findings if not f.fatal]
    assert files(copy) == before


def test_audit_without_the_key_checks_the_chain_and_says_so(tmp_path: Path) -> None:
    fill(tmp_path)
    (tmp_path / KEY_NAME).unlink()
    report = audit(tmp_path)
    assert report.clean
    [note] = report.findings
    assert note.code == "macs_unchecked" and not note.fatal


def test_audit_reports_an_event_whose_mac_the_key_does_not_vouch_for(tmp_path: Path) -> None:
    fill(tmp_path)
    seq = forge(tmp_path / "ledger.sqlite", mac="ab" * 32)
    report = audit(tmp_path)
    assert [(f.code, f.where) for f in report.findings if f.fatal] == [
        ("event_unauthenticated", f"event {seq}")]
    with pytest.raises(RecordRefused) as refused:
        open_verified(tmp_path)
    assert refused.value.code == "event_unauthenticated"


# ----------------------------------------------------------------- projection drift


@pytest.mark.parametrize("edit, where", [
    (("UPDATE receipts SET exit_status = 0, body = replace(body, '\"exit_status\":0', "
      "'\"exit_status\":1')"), f"receipts {RECEIPT}"),
    (f"UPDATE artifacts SET sha256 = '{'e' * 64}'", f"artifacts {ARTIFACT}"),
    ("DELETE FROM cells", "cells c1"),
    ("INSERT INTO submissions (submission_id, accepted) VALUES ('fake', 1)", "submissions fake"),
])
def test_stored_projections_that_disagree_with_the_events_are_drift(
        tmp_path: Path, edit: str, where: str) -> None:
    fill(tmp_path)
    conn = sqlite3.connect(tmp_path / "ledger.sqlite")
    conn.execute(edit)
    conn.commit()
    conn.close()
    report = audit(tmp_path)
    assert [(f.code, f.where) for f in report.findings if f.fatal] == [("projection_drift", where)]
    with pytest.raises(RecordRefused, match="disagree with the events") as refused:
        open_verified(tmp_path)
    assert refused.value.code == "projection_drift"


def test_readers_refuse_drift_and_never_show_the_stored_value(tmp_path: Path) -> None:
    fill(tmp_path)
    assert record_lineage(tmp_path, ARTIFACT).node(f"artifact:{ARTIFACT}").label == "a.csv"
    assert record_receipt_statement(tmp_path, RECEIPT)["predicate"]["byproducts"][
        "return-value"] == 0
    conn = sqlite3.connect(tmp_path / "ledger.sqlite")
    conn.execute("UPDATE receipts SET exit_status = 3")
    conn.execute("UPDATE artifacts SET filename = 'forged.csv'")
    conn.commit()
    conn.close()
    for read in (lambda: record_lineage(tmp_path, ARTIFACT),
                 lambda: record_receipt_statement(tmp_path, RECEIPT),
                 lambda: export_notebook(tmp_path)):
        with pytest.raises(RecordRefused) as refused:
            read()
        assert refused.value.code == "projection_drift"
        assert "forged" not in str(refused.value)
    for args in (["lineage", ARTIFACT, "--record", tmp_path],
                 ["receipt", RECEIPT, "--record", tmp_path], ["export", tmp_path]):
        proc = cli(*args, cwd=tmp_path)
        assert proc.returncode == 1, args
        assert proc.stdout == "" and "forged" not in proc.stderr
        assert proc.stderr.startswith(f"host-kernel {args[0]}: error: [projection_drift]")
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_readers_refuse_a_broken_chain(tmp_path: Path) -> None:
    fill(tmp_path)
    conn = sqlite3.connect(tmp_path / "ledger.sqlite")
    conn.execute("UPDATE events SET body = replace(body, 'wc -l', 'rm -rf') "
                 "WHERE kind = 'receipt_recorded'")
    conn.commit()
    conn.close()
    proc = cli("receipt", RECEIPT, "--record", tmp_path, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("host-kernel receipt: error: [chain_broken]") and "event 4" in proc.stderr


def test_readers_find_a_workspace_record_at_its_default_place(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    fill(default_record_dir(workspace), workspace)
    proc = cli("lineage", ARTIFACT, "--format", "json", cwd=workspace)
    assert proc.returncode == 0, proc.stderr
    assert f'"root": "artifact:{ARTIFACT}"' in proc.stdout
    proc = cli("receipt", RECEIPT, "--workdir", workspace, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert cli("audit", workspace, cwd=tmp_path).returncode == 0


# ----------------------------------------------------------------- the external anchor


def test_expect_head_holds_the_record_to_a_head_kept_elsewhere(tmp_path: Path) -> None:
    fill(tmp_path)
    with SQLiteLedger.open_readonly(tmp_path / "ledger.sqlite") as ledger:
        head = ledger.head()
    assert head is not None and head.seq == 7
    assert audit(tmp_path, expect_head=head.hash).clean
    assert audit(tmp_path, expect_head=head.hash.upper()).clean
    proc = cli("audit", tmp_path, "--expect-head", head.hash, cwd=tmp_path)
    assert proc.returncode == 0 and f"head: {head.hash}" in proc.stdout

    # a rewrite that keeps the chain intact (every hash recomputed) passes check_chain,
    # but not the head kept elsewhere
    conn = sqlite3.connect(tmp_path / "ledger.sqlite")
    conn.execute("DELETE FROM events WHERE seq = 7")
    conn.commit()
    conn.close()
    report = audit(tmp_path, expect_head=head.hash)
    [finding] = [f for f in report.findings if f.fatal and f.code == "head_mismatch"]
    assert "no event has the expected hash" in finding.message
    proc = cli("audit", tmp_path, "--expect-head", head.hash, cwd=tmp_path)
    assert proc.returncode == 1 and "FAIL [head_mismatch]" in proc.stdout
