"""The cell path: the kernel we launch, what one cell commits to the record and when, a
Host killed mid-cell, the Host's reading of kernel messages, and a long-ish session."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.session import Session

from host_kernel import Host
from host_kernel._paths import default_record_dir
from host_kernel.audit import audit
from host_kernel.export import export_notebook
from host_kernel.host._outputs import CellRun, Outputs
from host_kernel.host._kernel import kernel_argv
from host_kernel.store.ledger import SQLiteLedger, check_chain

from _helpers import run_ok


def _events(host: Host, after: int) -> list[tuple[int, str, dict[str, Any]]]:
    rows = host.ledger.query("SELECT seq, kind, body FROM events WHERE seq > ? ORDER BY seq",
                             (after,))
    return [(r["seq"], r["kind"], json.loads(r["body"])) for r in rows]


# -- the kernel we launch ----------------------------------------------------------------------


def test_the_kernels_history_is_in_memory_and_in_and_i_still_work(host: Host) -> None:
    assert "--HistoryManager.hist_file=:memory:" in kernel_argv(None)
    run_ok(host, "a = 20")
    obs = host.execute("a + 1")
    assert obs.outputs[0]["data"]["text/plain"] == "21"
    text = run_ok(host, "print(In[1], '|', _i, '|', _i2, '|', Out[2], '|', _)")
    assert "a = 20 | a + 1 | a + 1 | 21 | 21" in text
    history = run_ok(host, "%history -n 1-2")
    assert "1: a = 20" in history and "2: a + 1" in history
    # No history file, no thread writing one; and what a frontend asks for is answered.
    manager = run_ok(host, "import os\nhm = get_ipython().history_manager\n"
                           "print(hm.hist_file, hm.save_thread, os.listdir(os.path.dirname("
                           "get_ipython().profile_dir.location + '/')), "
                           "[c for _, _, c in hm.get_tail(10, include_latest=True)])")
    assert ":memory: None" in manager and "history.sqlite" not in manager
    assert "'a + 1'" in manager


def test_a_host_kernel_package_a_cell_leaves_in_the_workspace_does_not_stop_the_next_kernel(
        host: Host, workdir: Path) -> None:
    # The kernel is launched by this installation's package, not by whatever
    # `host_kernel` comes first on the session's path (the workspace, the overlay).
    plant = ("import os\n"
             "for root in ('.', os.environ.get('PIP_TARGET') or '.'):\n"
             "    d = os.path.join(root, 'host_kernel', 'kernel')\n"
             "    os.makedirs(d, exist_ok=True)\n"
             "    for f in ('__init__.py', 'kernel/__init__.py'):\n"
             "        open(os.path.join(root, 'host_kernel', f), 'w').write('')\n"
             "    open(os.path.join(d, 'launch.py'), 'w').write("
             "\"open('planted-ran', 'w')\\ndef main():\\n    return 3\\n\")\n")
    run_ok(host, plant)
    assert (workdir / "host_kernel" / "kernel" / "launch.py").is_file()
    assert host.restart() == 2
    assert "42" in run_ok(host, "print(6 * 7)")
    assert not (workdir / "planted-ran").exists()
    assert "size=1" in run_ok(host, "print('size=%d' % host.write_file('w.txt', 'x').size)")


def test_the_control_kernelspec_runs_our_relay_whatever_its_folder_holds(tmp_path: Path) -> None:
    from host_kernel.control.kernelspec import kernel_json
    planted = tmp_path / "host_kernel" / "control"
    planted.mkdir(parents=True)
    (tmp_path / "host_kernel" / "__init__.py").write_text("")
    (planted / "__init__.py").write_text("")
    (planted / "__main__.py").write_text("open('planted-ran', 'w')\nraise SystemExit(3)\n")
    argv = kernel_json()["argv"]
    done = subprocess.run([*argv[:argv.index("-f")], "--help"], check=False, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "host_kernel.control" in done.stdout
    assert not (tmp_path / "planted-ran").exists()


# -- what one cell commits -----------------------------------------------------------------------


def test_a_cell_commits_started_before_it_runs_and_finished_before_execute_returns(
        host: Host) -> None:
    db = host.record_dir / "ledger.sqlite"
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        # An independent reader: what it sees is committed, not buffered in the Host.
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            while not done.is_set():
                row = conn.execute("SELECT status FROM cells WHERE code LIKE '%sleep(1.5)%'"
                                   ).fetchone()
                if row is not None and (not seen or seen[-1] != row[0]):
                    seen.append(row[0])
                time.sleep(0.02)
        finally:
            conn.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        obs = host.execute("import time\ntime.sleep(1.5)")
    finally:
        done.set()
        watcher.join()
    assert obs.status == "ok"
    assert seen and seen[0] == "running"
    row = sqlite3.connect(db).execute("SELECT status FROM cells WHERE cell_id = ?",
                                      (obs.cell_id,)).fetchone()
    assert row == ("ok",)


def test_a_pass_cell_appends_exactly_its_pair_of_events(host: Host) -> None:
    run_ok(host, "pass")
    before = host.ledger.known_head.seq
    obs = host.execute("pass")
    events = _events(host, before)
    assert [(kind, body["cell_id"]) for _, kind, body in events] == [
        ("cell_started", obs.cell_id), ("cell_finished", obs.cell_id)]
    assert [seq for seq, _, _ in events] == [before + 1, before + 2]
    finished = events[1][2]
    assert finished["status"] == "ok" and finished["outputs"] == []
    assert finished["execution_count"] == obs.execution_count


def test_a_cells_calls_are_recorded_between_its_started_and_finished_events(
        host: Host) -> None:
    before = host.ledger.known_head.seq
    obs = host.execute("host.write_file('a.txt', 'x')\nhost.write_file('b.txt', 'y')\n"
                       "print('done')")
    assert obs.status == "ok", obs.text
    events = _events(host, before)
    assert [kind for _, kind, _ in events] == ["cell_started", "file_written", "file_written",
                                               "cell_finished"]
    assert {body["cell_id"] for _, _, body in events} == {obs.cell_id}
    row = host.ledger.query("SELECT outputs FROM cells WHERE cell_id = ?", (obs.cell_id,))[0]
    assert json.loads(row["outputs"]) == events[-1][2]["outputs"] == [
        {"output_type": "stream", "name": "stdout", "text": "done\n"}]


def test_many_small_prints_fold_into_one_stream_output_in_order(host: Host) -> None:
    obs = host.execute("import sys\nfor i in range(3000):\n"
                       "    print(i, flush=True)\n    sys.stderr.write(f'e{i}\\n')\n"
                       "    sys.stderr.flush()")
    assert obs.status == "ok"
    text = {o["name"]: "" for o in obs.outputs}
    for o in obs.outputs:
        text[o["name"]] += o["text"]
    assert text["stdout"] == "".join(f"{i}\n" for i in range(3000))
    assert text["stderr"] == "".join(f"e{i}\n" for i in range(3000))
    recorded = json.loads(host.ledger.query("SELECT outputs FROM cells WHERE cell_id = ?",
                                            (obs.cell_id,))[0]["outputs"])
    assert recorded == list(obs.outputs)


def test_no_output_is_lost_while_the_hosts_reader_is_held_up(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Host that reads late (a loaded machine, here a reader held up 1.5 s at the
    cell's first message) still gets every message: its IOPub subscription queues
    without ZeroMQ's default limit of 1,000 messages, past which the kernel's publisher
    drops them silently (a loaded CI run lost a dozen lines of the test above)."""
    receive, held = CellRun.receive, threading.Event()

    def late(self: CellRun, *args: Any, **kwargs: Any) -> Any:
        if not held.is_set():
            held.set()
            time.sleep(1.5)
        return receive(self, *args, **kwargs)

    monkeypatch.setattr(CellRun, "receive", late)
    obs = host.execute("for i in range(5000):\n    print(i, flush=True)", timeout=120)
    assert obs.status == "ok" and held.is_set()
    text = "".join(o["text"] for o in obs.outputs if o.get("name") == "stdout")
    assert text == "".join(f"{i}\n" for i in range(5000))


def test_an_updated_display_is_recorded_as_last_shown(host: Host) -> None:
    obs = host.execute("from IPython.display import display\n"
                       "h = display('first', display_id=True)\nprint('between')\n"
                       "h.update('second')")
    assert obs.status == "ok"
    assert [o["output_type"] for o in obs.outputs] == ["display_data", "stream"]
    assert obs.outputs[0]["data"]["text/plain"] == "'second'"


# -- a Host killed mid-cell ----------------------------------------------------------------------

def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


KILLED_HOST = """
import json, sys
from host_kernel import Host
with Host(sys.argv[1]) as h:
    print(json.dumps({"kernel": h.kernel_pid, "session": h.session_id}), flush=True)
    h.execute("import time\\ntime.sleep(120)")
"""


def test_a_cell_running_when_its_host_is_killed_is_recorded_as_host_died(
        workdir: Path) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="hkc-", dir="/tmp"))  # IPC paths must stay short
    proc = subprocess.Popen([sys.executable, "-c", KILLED_HOST, str(workdir)],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(runtime)})
    db = default_record_dir(workdir) / "ledger.sqlite"
    try:
        info = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        deadline = time.monotonic() + 60
        while True:
            with SQLiteLedger.open_readonly(db) as ledger:
                if ledger.query("SELECT 1 FROM cells WHERE status = 'running'"):
                    break
            assert time.monotonic() < deadline, "the cell never showed as running"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    deadline = time.monotonic() + 15
    while not _gone(info["kernel"]):
        assert time.monotonic() < deadline, "the orphaned kernel did not exit"
        time.sleep(0.05)
    shutil.rmtree(runtime, ignore_errors=True)
    with Host(workdir) as again:
        run_ok(again, "pass")
        rows = again.ledger.query("SELECT status FROM cells WHERE session = ?",
                                  (info["session"],))
        assert [r["status"] for r in rows] == ["host_died"]
        finished = again.ledger.query(
            "SELECT body FROM events WHERE session = ? AND kind = 'cell_finished'",
            (info["session"],))
        assert json.loads(finished[0]["body"])["recovered_by"] == again.session_id
    assert audit(default_record_dir(workdir)).clean


# -- reading the kernel's messages ---------------------------------------------------------------


class _Socket:
    """Hands out prepared multipart messages, as a zmq socket's recv_multipart would."""

    def __init__(self, messages: list[list[bytes]]) -> None:
        self.messages = messages

    def recv_multipart(self) -> list[bytes]:
        return self.messages.pop(0)


def test_the_host_keeps_only_signed_unreplayed_replies_to_its_own_request() -> None:
    ours = Session(key=b"k" * 32)
    forger = Session(key=b"x" * 32)
    request = ours.msg("execute_request", {"code": "pass"})
    other = ours.msg("execute_request", {"code": "pass"})
    reply = ours.serialize(ours.msg("status", {"execution_state": "idle"}, parent=request))
    forged = forger.serialize(forger.msg("status", {"execution_state": "idle"},
                                         parent=request))
    stray = ours.serialize(ours.msg("status", {"execution_state": "idle"}, parent=other))
    run = CellRun(ours, request["header"]["msg_id"])
    socket = _Socket([forged, stray, reply, list(reply), [b"junk"]])
    assert run.receive(socket) is None  # signed with another key
    assert run.receive(socket) is None  # answers another request
    got = run.receive(socket)
    assert got is not None and got["msg_type"] == "status"
    assert got["content"] == {"execution_state": "idle"}
    assert run.receive(socket) is None  # the same signature again: a replay
    assert run.receive(socket) is None  # not a message at all


def test_outputs_handed_out_are_not_changed_by_later_messages() -> None:
    outputs = Outputs()

    def stream(text: str) -> dict[str, Any]:
        return {"msg_type": "stream", "header": {"msg_type": "stream"},
                "content": {"name": "stdout", "text": text}}

    outputs.add(stream("a"))
    outputs.add(stream("b"))
    first = outputs.final
    assert first == [{"output_type": "stream", "name": "stdout", "text": "ab"}]
    outputs.add(stream("c"))
    assert first[0]["text"] == "ab"
    assert outputs.final == [{"output_type": "stream", "name": "stdout", "text": "abc"}]


def test_an_output_nbformat_cannot_hold_is_left_out_not_raised() -> None:
    outputs = Outputs()
    outputs.add({"msg_type": "display_data", "header": {"msg_type": "display_data"},
                 "content": {"data": 5, "metadata": {}}})
    outputs.add({"msg_type": "stream", "header": {"msg_type": "stream"},
                 "content": {"name": "stdout", "text": 7}})
    assert outputs.final == []


# -- a long-ish session --------------------------------------------------------------------------


def _cell(i: int) -> str:
    if i % 100 == 99:
        return f"_ = host.write_file('notes/n{i % 7}.txt', 'cell {i}')"
    return (f"v{i % 16} = {i}", f"w = v{(i - 1) % 16} * 2", "print(w)", "w")[i % 4]


def test_a_300_cell_session_audits_clean_and_exports_every_cell(workdir: Path) -> None:
    with Host(workdir) as host:
        for i in range(300):
            obs = host.execute(_cell(i))
            assert obs.status == "ok", obs.text
        session = host.session_id
        record = host.record_dir
    report = audit(record)
    assert report.clean, [str(f) for f in report.findings]
    with SQLiteLedger.open_readonly(record / "ledger.sqlite") as ledger:
        assert check_chain(ledger) == []
        kinds = [r["kind"] for r in ledger.query("SELECT kind FROM events WHERE session = ?",
                                                 (session,))]
    assert kinds.count("cell_started") == kinds.count("cell_finished") == 300
    assert kinds.count("file_written") == 3
    nb = export_notebook(record, session)
    assert len(nb.cells) == 300
    assert nb.cells[2].outputs[0]["text"] == "0\n"


@pytest.mark.parametrize("mark", ["\ue000", '"', "\\"])
def test_outputs_holding_odd_text_are_stored_byte_for_byte_as_the_events_say(
        host: Host, mark: str) -> None:
    from host_kernel.store.ledger import projection_rows, rebuild

    obs = host.execute(f"print({mark * 3!r} * 2)")
    assert obs.outputs[0]["text"] == mark * 6 + "\n"
    fresh = rebuild(host.ledger)
    try:
        assert projection_rows(fresh) == projection_rows(host.ledger)
    finally:
        fresh.close()
