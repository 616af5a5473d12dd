"""Resuming an agent session, and the system prompt as a log: real Hosts, real HTTP.

A session is resumed after it finished, after its Host was killed mid-cell, and
after a SYSTEM.md changed between runs. Each time the requests the scripted
server received are compared byte for byte: the leading system messages and the
tools field of the original and the resumed requests, and the rebuilt history.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from _agent import fence, finalize, layers, run, system_of, text, turns
from _helpers import wait_for
from scripted_llm import ScriptedLLMServer

from host_kernel import Host
from host_kernel._errors import HostKernelError, RecordError
from host_kernel._paths import default_record_dir
from host_kernel.agent.events import EVENTS_FILE, read_records, sessions_in
from host_kernel.agent.loop import Outcome
from host_kernel.agent.projection import replay
from host_kernel.agent.sysprompt import prompt_at
from host_kernel.audit import audit
from host_kernel.cli import main
from host_kernel.store.ledger import SQLiteLedger


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


def events(result_or_path: Any) -> list[dict[str, Any]]:
    path = getattr(result_or_path, "events_path", result_or_path)
    return [r for r in read_records(path) if r is not None]


def kinds(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == kind]


def ledger_events(record: Path, session: str) -> list[tuple[str, dict[str, Any]]]:
    with SQLiteLedger(record / "ledger.sqlite") as ledger:
        rows = ledger.query("SELECT kind, body FROM events WHERE session = ? ORDER BY seq",
                            (session,))
        return [(r["kind"], json.loads(r["body"])) for r in rows]


def test_a_finished_session_resumes_with_the_same_prefix_and_history(ws: Path,
                                                                     tmp_path: Path) -> None:
    lay = layers(tmp_path, ws)
    script = [text(fence("x = 6 * 7\nopen('answer.txt', 'w').write(str(x))\nprint(x)")),
              finalize("42")]
    with ScriptedLLMServer(script) as server:
        first = run(server, ws, "compute 6*7 and keep it in answer.txt", system_layers=lay)
        assert first.outcome is Outcome.ACCEPTED, first.reason
        original = turns(server)[-1]
        server.push(text(fence("print(x)")),
                    text(fence("print(open('answer.txt').read())")), finalize("still 42"))
        second = run(server, ws, "check the answer again", system_layers=lay,
                     resume=first.session_id)
        resumed = turns(server)[2:]

    assert second.outcome is Outcome.ACCEPTED and second.resumed, second.reason
    assert second.session_id == first.session_id and second.events_path == first.events_path
    # The prefix: the same leading system messages and the same tools field, byte for byte.
    for body in resumed:
        assert json.dumps(system_of(body)) == json.dumps(system_of(original))
        assert json.dumps(body["tools"]) == json.dumps(original["tools"])
    # The history is rebuilt as it was sent: everything after the environment block.
    lead = len(system_of(original))
    sent_before = original["messages"][lead + 1:]
    assert resumed[0]["messages"][lead + 1:lead + 1 + len(sent_before)] == sent_before
    env_before, env_after = original["messages"][lead]["content"], \
        resumed[0]["messages"][lead]["content"]
    assert "kernel generation: 1" in env_before and "kernel generation: 2" in env_after
    notice = resumed[0]["messages"][-1]["content"]
    assert notice.startswith("[Host] This session was resumed") and "generation 2" in notice
    assert "## Follow-up task\ncheck the answer again" in notice
    # Memory is gone (NameError), the file survived.
    assert "NameError" in resumed[1]["messages"][-1]["content"]
    assert "42" in resumed[2]["messages"][-1]["content"]

    records = events(second)
    assert sessions_in(second.events_path) == [first.session_id]
    seqs = [r["seq"] for r in records]
    assert seqs == list(range(1, len(records) + 1))  # one stream, seq continuing
    assert [r["data"]["previous_outcome"] for r in kinds(records, "session_resumed")] == [
        "accepted"]
    assert len(kinds(records, "system_prompt")) == 2  # the seed and the Host block, once
    snap = replay(second.events_path)
    assert snap.resumes == 1 and snap.outcome == "accepted"
    assert [c.state for c in snap.cells] == ["ok", "error", "ok"]
    ledger = ledger_events(second.record_dir, first.session_id)
    generations = [(b["generation"], b["reason"]) for k, b in ledger if k == "generation_started"]
    assert generations == [(1, "start"), (2, "resume")]
    assert [b["previous"] for k, b in ledger if k == "session_resumed"] == ["ended"]
    report = audit(second.record_dir)
    assert report.clean, [str(f) for f in report.findings]


def test_resuming_needs_the_session_and_a_followup_once_it_was_accepted(ws: Path) -> None:
    with ScriptedLLMServer([finalize("nothing to do")]) as server:
        first = run(server, ws, "say hello")
    assert first.accepted
    with ScriptedLLMServer([]) as server:
        with pytest.raises(ValueError, match="task must be"):
            run(server, ws, None)
        with pytest.raises(ValueError, match="already ended with an accepted completion"):
            run(server, ws, None, resume=first.session_id)
        with pytest.raises(HostKernelError, match="unknown_session"):
            run(server, ws, "go on", resume="not-a-session")
        assert not server.requests
    # Nothing was appended by the refusals: the session still ends accepted, once.
    assert replay(first.events_path).resumes == 0
    assert main(["run", "--workdir", str(ws), "--base-url", server.base_url, "--model", "m",
                 "--resume", "zz"]) == 2
    assert main(["run", "--workdir", str(ws), "--base-url", server.base_url, "--model", "m",
                 "--resume", first.session_id]) == 2  # accepted: a follow-up is needed
    assert main(["run", "--workdir", str(ws), "--base-url", server.base_url, "--model", "m",
                 "--resume", first.session_id[:8], "--mode", "analysis_run", "go"]) == 2


# ----------------------------------------------------------------------------- a crash

RUN_SCRIPT = """
import sys
from host_kernel.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _agent_kernels(session: str) -> list[int]:
    """Processes whose environment names this Host session (its kernels)."""
    found = []
    needle = f"HOST_KERNEL_SESSION={session}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_a_session_whose_host_was_killed_mid_cell_resumes(ws: Path) -> None:
    marker = ws / "started"
    hang = fence("import time\nopen('started', 'w').write('x')\ntime.sleep(120)")
    script = [text(fence("open('kept.txt', 'w').write('kept')\nprint('wrote')")), text(hang)]
    runtime = Path(tempfile.mkdtemp(prefix="hkr-", dir="/tmp"))  # a killed Host leaves it
    with ScriptedLLMServer(script) as server:
        proc = subprocess.Popen(
            [sys.executable, "-c", RUN_SCRIPT, "run", "write kept.txt then wait",
             "--workdir", str(ws), "--base-url", server.base_url, "--model", "scripted",
             "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "TMPDIR": str(runtime)})
        try:
            wait_for(marker.exists, 120, "the second cell to start")
            before = turns(server)[-1]
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        record = default_record_dir(ws)
        (session,) = sessions_in(record / EVENTS_FILE)
        wait_for(lambda: not _agent_kernels(session), 20, "the orphaned kernel to exit")
        shutil.rmtree(runtime, ignore_errors=True)
        crashed = events(record / EVENTS_FILE)
        assert not kinds(crashed, "session_ended")  # it never ended

        server.push(text(fence("print(open('kept.txt').read())")), finalize("kept is kept"))
        result = run(server, ws, None, resume=session)
        after = turns(server)[2:]
    assert result.outcome is Outcome.ACCEPTED, result.reason
    assert json.dumps(system_of(after[0])) == json.dumps(system_of(before))
    assert json.dumps(after[0]["tools"]) == json.dumps(before["tools"])
    notice = after[0]["messages"][-1]["content"]
    assert "it crashed" in notice and "host_died" in notice
    assert after[0]["messages"][-2]["role"] == "assistant"  # the unanswered reply, kept
    assert "kept" in after[1]["messages"][-1]["content"]
    records = events(result)
    (resumed,) = kinds(records, "session_resumed")
    assert resumed["data"]["previous_outcome"] is None and resumed["data"]["generation"] == 2
    ledger = ledger_events(record, session)
    finished = [b for k, b in ledger if k == "cell_finished"]
    assert [b["status"] for b in finished][:2] == ["ok", "host_died"]
    assert [b["previous"] for k, b in ledger if k == "session_resumed"] == ["host_died"]
    snap = replay(result.events_path)
    assert snap.outcome == "accepted" and snap.resumes == 1
    # What the crashed run left open is closed in the stream too, as in the record.
    assert [c.state for c in snap.cells] == ["ok", "host_died", "ok"]
    report = audit(record)
    assert report.clean, [str(f) for f in report.findings]


# ----------------------------------------------------------------------------- SYSTEM.md


def test_a_changed_system_md_appends_one_replace_and_the_appends_and_then_nothing(
        ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lay = layers(tmp_path, ws)
    for folder in (lay.base, lay.user, lay.project):
        folder.mkdir(parents=True, exist_ok=True)
    (lay.project / "SYSTEM.md").write_text("You are the v1 analyst.\n")
    (lay.user / "APPEND_SYSTEM.md").write_text("Prefer pandas.\n")
    (lay.project / "APPEND_SYSTEM.md").write_text("Data lives in data/.\n")

    with ScriptedLLMServer([finalize("one")]) as server:
        first = run(server, ws, "say one", system_layers=lay)
        (original,) = turns(server)
        (lay.project / "SYSTEM.md").write_text("You are the v2 analyst.\n")
        server.push(finalize("two"))
        second = run(server, ws, "say two", system_layers=lay, resume=first.session_id)
        server.push(finalize("three"))
        third = run(server, ws, "say three", system_layers=lay, resume=first.session_id)
        _, changed, unchanged = turns(server)

    assert first.accepted and second.accepted and third.accepted
    texts = [m["content"] for m in system_of(original)]
    assert texts[:3] == ["You are the v1 analyst.", "Data lives in data/.", "Prefer pandas."]
    assert [m["content"] for m in system_of(changed)][:3] == [
        "You are the v2 analyst.", "Data lives in data/.", "Prefer pandas."]
    assert system_of(changed)[1:] == system_of(original)[1:]  # the blocks after the seed
    assert json.dumps(system_of(unchanged)) == json.dumps(system_of(changed))

    records = events(third)
    entries = kinds(records, "system_prompt")
    ops = [(e["data"]["op"], e["data"]["source"]) for e in entries]
    assert ops == [("append", "project:SYSTEM.md"), ("append", "project:APPEND_SYSTEM.md"),
                   ("append", "user:APPEND_SYSTEM.md"), ("append", "host"),
                   ("replace", "project:SYSTEM.md"), ("append", "project:APPEND_SYSTEM.md"),
                   ("append", "user:APPEND_SYSTEM.md"), ("append", "host")]
    reconciled = [r["data"]["reconciled"] for r in kinds(records, "session_resumed")]
    assert reconciled == [4, 0]  # one replace + three appends; then a true no-op

    # The prompt at any earlier event: before and after the reconciliation.
    before_at = entries[3]["seq"]
    after_at = entries[-1]["seq"]
    assert prompt_at(records, before_at)[0] == "You are the v1 analyst."
    assert prompt_at(records, after_at)[0] == "You are the v2 analyst."
    assert len(prompt_at(records, after_at)) == 4
    assert main(["trace", str(first.record_dir), "--at", str(before_at)]) == 0
    out = capsys.readouterr().out
    assert "=== system block 1 of 4 (append at event" in out and "v1 analyst" in out
    assert "v2 analyst" not in out
    assert main(["trace", str(first.record_dir), "--at", str(after_at), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [b["op"] for b in shown["blocks"]] == ["replace", "append", "append", "append"]
    assert shown["blocks"][0]["text"] == "You are the v2 analyst."
    assert main(["trace", str(first.record_dir), "--at", "100000"]) == 2
    assert "has" in capsys.readouterr().err


def test_single_style_joins_the_blocks_into_one_system_message(ws: Path,
                                                               tmp_path: Path) -> None:
    lay = layers(tmp_path, ws)
    lay.project.mkdir(parents=True)
    (lay.project / "APPEND_SYSTEM.md").write_text("Extra rule.\n\n")
    with ScriptedLLMServer([finalize("ok")]) as server:
        result = run(server, ws, "say ok", system_layers=lay, system_style="single")
        server.push(finalize("still one"))
        again = run(server, ws, "again", system_layers=lay, resume=result.session_id)
        body, resumed = turns(server)
    assert result.accepted and again.accepted
    (system,) = system_of(body)
    parts = system["content"].split("\n\n---\n\n")
    assert len(parts) == 3 and parts[1] == "Extra rule."
    assert system_of(resumed) == [system]  # the session keeps the style it was started with


def test_a_budget_stops_the_run_and_says_how_many_calls_were_unpriced(ws: Path) -> None:
    priced = {"prompt_tokens": 1000, "completion_tokens": 1000, "total_tokens": 2000,
              "cost": 0.03}
    script = [text(fence("print(1)"), usage=priced), text(fence("print(2)"), usage=None),
              text(fence("print(3)"), usage=priced), finalize("never reached")]
    with ScriptedLLMServer(script) as server:
        result = run(server, ws, "count", budget_usd=0.05)
        assert server.remaining == 1
    assert result.outcome is Outcome.BUDGET
    assert "$0.060000 passed the budget $0.050000" in (result.reason or "")
    assert "1 provider call(s) reported no price" in (result.reason or "")
    snap = result.snapshot
    assert snap.costs.priced == 2 and snap.costs.unpriced == 1
    assert snap.outcome == "budget_exceeded"


def test_the_cli_resumes_by_prefix_and_stops_at_a_budget(
        ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    priced = {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20, "cost": 0.5}
    with ScriptedLLMServer([text(fence("print('spent')"), usage=priced)]) as server:
        base = ["run", "--workdir", str(ws), "--base-url", server.base_url, "--model", "m",
                "--quiet"]
        assert main([*base, "spend money", "--budget-usd", "0.25"]) == 1
        out = capsys.readouterr().out
        assert "outcome: budget_exceeded after 1 step(s)" in out
        assert "0 provider call(s) reported no price" in out
        session = out.split("session: ")[1].split()[0]
        server.push(finalize("resumed"))
        assert main([*base, "--resume", session[:8], "--budget-usd", "5"]) == 0
        out = capsys.readouterr().out
        assert "outcome: accepted" in out and f"session: {session}" in out
    snap = replay(default_record_dir(ws) / EVENTS_FILE)
    assert snap.resumes == 1 and snap.costs.usd == pytest.approx(0.5)


def test_every_abandoned_session_is_closed_as_its_own(ws: Path, tmp_path: Path) -> None:
    """Two sessions whose Host process is gone, one with a cell left running: the next
    Host ends each of them, and finishes the running cell in its own session."""
    import socket

    record = tmp_path / "record"
    with Host(ws, record_dir=record) as host:
        first = host.session_id
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone = int(dead.stdout)
    with SQLiteLedger(record / "ledger.sqlite") as ledger:
        for session in ("abandoned-a", "abandoned-b"):
            ledger.append(session, "session_started", {
                "workdir": str(ws), "mode": {"name": "analysis_run", "armed": False},
                "pid": gone, "host": socket.gethostname()})
        ledger.append("abandoned-b", "generation_started", {"generation": 1, "reason": "start"})
        ledger.append("abandoned-b", "cell_started", {"cell_id": "c-b", "generation": 1,
                                                      "code": "x"})
    with Host(ws, record_dir=record):
        pass
    for session in ("abandoned-a", "abandoned-b"):
        ended = [b for k, b in ledger_events(record, session) if k == "session_ended"]
        assert [b["reason"] for b in ended] == ["host_died"]
    finished = [b for k, b in ledger_events(record, "abandoned-b") if k == "cell_finished"]
    assert [(b["cell_id"], b["status"]) for b in finished] == [("c-b", "host_died")]
    assert not [b for k, b in ledger_events(record, "abandoned-a") if k == "cell_finished"]
    assert [k for k, _ in ledger_events(record, first)][-1] == "session_ended"


def test_a_session_taken_up_by_a_live_host_cannot_be_taken_up_again(ws: Path,
                                                                    tmp_path: Path) -> None:
    record = tmp_path / "record"
    with Host(ws, record_dir=record) as first:
        session = first.session_id
    with Host(ws, record_dir=record, resume=session) as again:
        assert again.generation == 2
        with pytest.raises(RecordError, match="session_running"):
            Host(ws, record_dir=record, resume=session).start()
        assert again.execute("print('still mine')").status == "ok"
    with Host(ws, record_dir=record, resume=session) as third:
        assert third.generation == 3
    report = audit(record)
    assert report.clean, [str(f) for f in report.findings]
    kinds_seen = [k for k, _ in ledger_events(record, session)]
    assert kinds_seen.count("session_resumed") == 2
