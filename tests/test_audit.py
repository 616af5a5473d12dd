"""audit: a clean record passes; each kind of tampering is reported precisely."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from host_kernel import Host
from host_kernel.audit import audit

from _helpers import run_ok

from _pipeline import build_package, submit


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Default record folders go under this test's own state folder, not ~/.local/state."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


@pytest.fixture
def record(workdir: Path) -> Path:
    with Host(workdir, mode="reusable_pipeline") as h:
        h._evidence_cell = build_package(h)  # type: ignore[attr-defined]
        accepted, _, text = submit(h)
        assert accepted, text
        run_ok(h, "host.write_file('data.csv', 'a,b\\n1,2\\n')\nhost.save_artifact('data.csv')")
        return h.record_dir


def _codes(report) -> list[str]:  # type: ignore[no-untyped-def]
    return [f.code for f in report.findings if f.fatal]


def test_a_clean_record_passes(record: Path) -> None:
    report = audit(record)
    assert report.clean, [str(f) for f in report.findings]
    assert report.submissions == 1 and report.receipts == 1 and report.artifacts == 5
    assert report.events > 20
    assert not report.findings  # no warning either: every event carries a MAC under the key


def test_the_record_lives_outside_the_workspace_by_default(record: Path, workdir: Path,
                                                           state_home: Path) -> None:
    assert state_home in record.parents and workdir not in record.parents
    assert (record / "record.key").stat().st_mode & 0o777 == 0o600


def test_audit_leaves_the_record_folder_byte_for_byte_as_it_was(record: Path) -> None:
    def snapshot() -> dict[str, tuple[int, int]]:
        return {str(p.relative_to(record)): (p.stat().st_size, p.stat().st_mtime_ns)
                for p in record.rglob("*")}

    before = snapshot()
    ledger = (record / "ledger.sqlite").read_bytes()
    assert audit(record).clean
    assert snapshot() == before
    assert (record / "ledger.sqlite").read_bytes() == ledger


def test_a_receipt_edited_in_the_stored_projection_is_drift(record: Path) -> None:
    db = sqlite3.connect(record / "ledger.sqlite")
    receipt_id = db.execute("SELECT receipt_id FROM receipts").fetchone()[0]
    db.execute("UPDATE receipts SET exit_status = 7")
    db.commit()
    db.close()
    report = audit(record)
    assert _codes(report) == ["projection_drift"]
    [drift] = report.findings
    assert drift.where == f"receipts {receipt_id}" and "exit_status" in drift.message
    assert "7" not in drift.message  # names what drifted, never shows the drifted value


def test_an_edited_event_is_reported_with_its_seq(record: Path) -> None:
    db = sqlite3.connect(record / "ledger.sqlite")
    seq = db.execute("SELECT seq FROM events WHERE kind = 'cell_started' LIMIT 1").fetchone()[0]
    db.execute("UPDATE events SET body = replace(body, 'host', 'HOST') WHERE seq = ?", (seq,))
    db.commit()
    db.close()
    report = audit(record)
    assert not report.clean
    assert [f.where for f in report.findings if f.code == "chain_broken"] == [f"event {seq}"]


def test_a_changed_blob_is_reported(record: Path) -> None:
    blob = next((record / "blobs" / "sha256").rglob("*"))
    while blob.is_dir():
        blob = next(blob.iterdir())
    os.chmod(blob, 0o644)
    blob.write_bytes(b"changed")
    report = audit(record)
    assert "blob_altered" in _codes(report)
    assert any(f.where == f"blob {blob.name}" for f in report.findings)


def test_a_deleted_receipt_is_reported(record: Path) -> None:
    db = sqlite3.connect(record / "ledger.sqlite")
    seq = db.execute("SELECT seq FROM events WHERE kind = 'receipt_recorded'").fetchone()[0]
    db.execute("DELETE FROM events WHERE seq = ?", (seq,))
    db.execute("DELETE FROM receipts")
    db.commit()
    db.close()
    report = audit(record)
    codes = _codes(report)
    assert "chain_broken" in codes
    # the accepted submission cited that receipt: it no longer verifies
    assert "submission_unbacked" in codes
    unbacked = next(f for f in report.findings if f.code == "submission_unbacked")
    assert "receipt_missing" in unbacked.message


def test_a_deleted_receipt_output_is_reported(record: Path) -> None:
    db = sqlite3.connect(record / "ledger.sqlite")
    body = json.loads(db.execute("SELECT body FROM receipts").fetchone()[0])
    db.close()
    sha = body["stdout_sha256"]
    blob = record / "blobs" / "sha256" / sha[:2] / sha
    os.chmod(blob.parent, 0o755)
    blob.unlink()
    report = audit(record)
    assert "receipt_stream_missing" in _codes(report)


def test_missing_record_is_a_failure(tmp_path: Path) -> None:
    report = audit(tmp_path)
    assert not report.clean and _codes(report) == ["record_missing"]
