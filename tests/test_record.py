"""The ledger: hash chain, projections rebuilt from events, tamper detection, durability."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from host_kernel import Host
from host_kernel.store.ledger import (
    RecordRefused,
    SQLiteLedger,
    check_chain,
    projection_rows,
    rebuild,
)


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Default record folders go under this test's own state folder, not ~/.local/state."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


def _busy_session(workdir: Path) -> Path:
    with Host(workdir, mode="reusable_pipeline") as h:
        h.execute("print('hello')")
        h.execute("1/0")
        h.execute("host.write_file('a.txt', 'x')")
        h.execute("host.bash('echo hi')")
        h.execute("host.save_artifact('a.txt')")
        h.execute("import os; os._exit(3)")
        h.execute("print('generation 2')")
        return h.record_dir


def test_rebuild_from_events_equals_the_live_projection(workdir: Path) -> None:
    record = _busy_session(workdir)
    with SQLiteLedger(record / "ledger.sqlite") as live:
        fresh = rebuild(live)
        assert projection_rows(fresh) == projection_rows(live)
        kinds = [e.kind for e in live.events()]
        assert kinds[0] == "session_started" and kinds[-1] == "session_ended"
        for kind in ("cell_started", "cell_finished", "file_written", "receipt_recorded",
                     "artifact_saved", "generation_started"):
            assert kind in kinds
        assert len(projection_rows(live)["cells"]) == 7
        fresh.close()


def test_intact_chain_has_no_problems(workdir: Path) -> None:
    record = _busy_session(workdir)
    with SQLiteLedger(record / "ledger.sqlite") as live:
        assert check_chain(live) == []


def test_an_edited_event_breaks_the_chain_and_the_checker_says_where(workdir: Path) -> None:
    record = _busy_session(workdir)
    db = sqlite3.connect(record / "ledger.sqlite")
    seq = db.execute("SELECT seq FROM events WHERE kind = 'receipt_recorded'").fetchone()[0]
    db.execute("UPDATE events SET body = replace(body, '\"exit_status\":0', '\"exit_status\":1')"
               " WHERE seq = ?", (seq,))
    db.commit()
    db.close()
    with SQLiteLedger.open_readonly(record / "ledger.sqlite") as live:
        problems = check_chain(live)
    assert [p.seq for p in problems] == [seq]
    assert "edited" in str(problems[0])
    # and no writer will extend it: the next Host on this record refuses to start
    with pytest.raises(RecordRefused, match=f"event {seq}") as refused:
        SQLiteLedger(record / "ledger.sqlite")
    assert refused.value.code == "chain_broken"


def test_a_deleted_event_is_found(workdir: Path) -> None:
    record = _busy_session(workdir)
    db = sqlite3.connect(record / "ledger.sqlite")
    db.execute("DELETE FROM events WHERE seq = 5")
    db.commit()
    db.close()
    with SQLiteLedger.open_readonly(record / "ledger.sqlite") as live:
        problems = check_chain(live)
    assert problems and problems[0].seq == 6
    assert "deleted" in str(problems[0])


def test_each_cell_is_committed_before_execute_returns(host: Host) -> None:
    obs = host.execute("print(1)")
    # A second, independent connection sees it at once: it is on disk, not in a buffer.
    db = sqlite3.connect(host.record_dir / "ledger.sqlite")
    row = db.execute("SELECT status FROM cells WHERE cell_id = ?", (obs.cell_id,)).fetchone()
    db.close()
    assert row == ("ok",)


def test_two_sessions_share_one_chain(workdir: Path) -> None:
    with Host(workdir) as a:
        a.execute("pass")
    with Host(workdir) as b:
        b.execute("pass")
    assert a.record_dir == b.record_dir
    with SQLiteLedger.open_readonly(a.record_dir / "ledger.sqlite") as live:
        assert check_chain(live) == []
        sessions = {r["session"] for r in live.query("SELECT session FROM sessions")}
    assert sessions == {a.session_id, b.session_id}


def test_record_folder_is_private(host: Host) -> None:
    assert (host.record_dir.stat().st_mode & 0o777) == 0o700
