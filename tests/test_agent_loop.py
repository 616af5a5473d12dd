"""The agent loop end to end: real Hosts, real HTTP to a scripted model server on 127.0.0.1.

Scripted replies that must cite a cell id are callables: they read the id from
the Observation in the request the loop just sent, as a real model would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _agent import CELL_ID, USAGE, fence, run, text, tool
from scripted_llm import RecordedRequest, ScriptedLLMServer, chat_reply, content_chunks

from host_kernel._paths import default_record_dir
from host_kernel.agent.events import EVENTS_FILE, read_records
from host_kernel.agent.layers import system_prefix
from host_kernel.agent.loop import AgentResult, Outcome, Prices
from host_kernel.agent.projection import replay
from host_kernel.cli import main
from host_kernel.prompts import CONCLUSION_GATE, SUMMARY_FORK, SUMMARY_HEADINGS
from host_kernel.skills import Catalog

PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")

SOURCES = {
    "pkg/__init__.py": "",
    "pkg/core.py": "def add(a, b):\n    return a + b\n",
    "pkg/cli.py": "import sys\nfrom pkg.core import add\n\n\ndef main():\n"
                  "    print(add(*map(int, sys.argv[1:3])))\n\n\nif __name__ == '__main__':\n"
                  "    main()\n",
    "tests/test_core.py": "from pkg.core import add\n\n\ndef test_add():\n"
                          "    assert add(1, 2) == 3\n",
}
TEST_CMD = "python -m pytest -q tests"
ARCHITECTURE = "pkg.core owns the arithmetic; pkg.cli is the thin command-line entry point."


# ----------------------------------------------------------------------------- scripting


def streamed_tool(name: str, args: dict[str, Any], call_id: str = "call_s") -> list[Any]:
    raw = json.dumps(args)
    half = len(raw) // 2
    return [
        {"model": "scripted-model", "choices": [{"index": 0, "delta": {
            "role": "assistant", "tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": raw[:half]}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": raw[half:]}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": USAGE},
    ]


def streamed_text(content: str) -> list[Any]:
    middle = len(content) // 2
    return [*content_chunks(content[:middle], content[middle:]), {"choices": [], "usage": USAGE}]


def messages_of(request: RecordedRequest) -> list[dict[str, Any]]:
    return list(request.json()["messages"])


def last_message(request: RecordedRequest) -> dict[str, Any]:
    return messages_of(request)[-1]


def cell_ids(request: RecordedRequest) -> list[str]:
    return CELL_ID.findall(str(last_message(request)["content"]))


def write_and_save() -> str:
    writes = "\n".join(f"host.write_file({p!r}, {c!r})" for p, c in SOURCES.items())
    saves = "\n".join(f"host.save_artifact({p!r})" for p in SOURCES)
    return writes + "\n" + saves + "\nprint('wrote', len(host.artifacts()), 'artifacts')"


def declarations(evidence_cell: str) -> dict[str, Any]:
    return {"source_files": list(SOURCES), "entry_points": ["pkg/cli.py"],
            "architecture_summary": ARCHITECTURE,
            "test_evidence": [{"command": TEST_CMD, "producing_cell_id": evidence_cell}]}


def turn_requests(server: ScriptedLLMServer) -> list[RecordedRequest]:
    """The agent's own turns: the requests that carry the tools field."""
    return [r for r in server.requests if "tools" in r.json()]


# ----------------------------------------------------------------------------- sessions


def test_an_armed_pipeline_session_ends_accepted_through_finalize_response(
        workdir: Path) -> None:
    def finalize(request: RecordedRequest) -> dict[str, Any]:
        ids = cell_ids(request)
        assert len(ids) == 2, last_message(request)["content"]
        return tool("finalize_response", {
            "output": {"summary": "an adder with a CLI", "files": ["pkg/core.py"]},
            "completion_bullets": ["wrote pkg.core.add and its CLI", "ran its tests"],
            "task_status": "completed", **declarations(ids[-1])})

    reply = ("Plan: pkg.core owns add, pkg.cli is the entry point.\n\n"
             + fence(write_and_save()) + "\n\nNow the tests:\n\n"
             + fence(f"host.bash({TEST_CMD!r})"))
    with ScriptedLLMServer([text(reply), finalize]) as server:
        result = run(server, workdir, "build a tiny adder package with a CLI and tests",
                     mode="reusable_pipeline", prices=Prices(1.0, 2.0))
        requests = list(server.requests)

    assert result.outcome is Outcome.ACCEPTED and result.accepted, result.reason
    assert result.verdict is not None and result.verdict.accepted and result.verdict.armed
    assert result.steps == 2 and len(requests) == 2
    first = messages_of(requests[0])
    assert [m["role"] for m in first] == ["system", "system", "user"]
    assert "## Task mode: reusable_pipeline (selected explicitly)" in first[2]["content"]
    assert all("Task mode" not in m["content"] for m in first[:2])
    assert "finalize_response" in [t["function"]["name"] for t in requests[0].json()["tools"]]
    second = messages_of(requests[1])
    assert [m["role"] for m in second] == ["system", "system", "user", "assistant", "user"]
    assert "[cell 2 of 2: ok]" in second[4]["content"] and "1 passed" in second[4]["content"]

    snap = result.snapshot
    assert [c.state for c in snap.cells] == ["ok", "ok"]
    assert len(snap.artifacts) == len(SOURCES) and len(snap.receipts) == 1
    assert snap.cells[1].receipts == snap.receipts
    assert [(v.accepted, v.via) for v in snap.verdicts] == [(True, "finalize_response")]
    assert snap.tool_calls[0].state == "accepted"
    assert snap.tokens.prompt == 240 and snap.tokens.unreported == 0
    assert snap.costs.priced == 2 and snap.costs.usd == pytest.approx(2 * (120 + 60) / 1e6)
    assert snap.outcome == "accepted"


def test_claimed_tests_are_refused_until_they_run_then_a_cell_submission_is_accepted(
        workdir: Path) -> None:
    def claim(request: RecordedRequest) -> list[Any]:
        (write_cell,) = cell_ids(request)  # the cell that only wrote files
        return streamed_tool("finalize_response", {
            "summary": "All tests pass.", "completion_bullets": ["wrote the adder"],
            **declarations(write_cell)})

    def run_tests(request: RecordedRequest) -> list[Any]:
        refusal = last_message(request)
        assert refusal["role"] == "tool" and "refused" in refusal["content"]
        assert "[receipt_missing]" in refusal["content"]
        return streamed_text("I had not run them. Running now.\n" + fence(
            f"r = host.bash({TEST_CMD!r})\nprint('exit', r.exit_status)"))

    def submit_in_cell(request: RecordedRequest) -> list[Any]:
        (test_cell,) = cell_ids(request)
        d = declarations(test_cell)
        return streamed_text(fence(
            f"host.submit_output({{'summary': 'adder'}}, ['wrote and tested the adder'], "
            f"source_files={d['source_files']!r}, entry_points={d['entry_points']!r}, "
            f"architecture_summary={ARCHITECTURE!r}, test_evidence={d['test_evidence']!r})"))

    script = [streamed_text(fence(write_and_save())), claim, run_tests, submit_in_cell]
    with ScriptedLLMServer(script) as server:
        result = run(server, workdir, "build a tiny adder package", mode="reusable_pipeline",
                     stream=True)
        requests = list(server.requests)

    assert result.accepted, result.reason
    assert all(r.json()["stream"] is True for r in requests)
    snap = result.snapshot
    assert [(v.accepted, v.via) for v in snap.verdicts] == [
        (False, "finalize_response"), (True, "cell")]
    assert "receipt_missing" in snap.verdicts[0].failed
    assert snap.tool_calls[0].state == "refused"
    assert result.steps == 4 and snap.outcome == "accepted"
    # Only the step-3 cell ran the tests, so only it holds a receipt.
    assert [len(c.receipts) for c in snap.cells] == [0, 1, 0]


@dataclass
class DeathRun:
    result: AgentResult
    requests: list[RecordedRequest]


@pytest.fixture(scope="module")
def death_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeathRun]:
    """An analysis session whose kernel dies at step 2 and whose history is compacted at 3."""
    summary = "\n".join(f"## {h}\nNone recorded" if h != "Active Kernel Generation"
                        else f"## {h}\n2" for h in SUMMARY_HEADINGS)

    def summary_fork(request: RecordedRequest) -> dict[str, Any]:
        return text(summary)

    ws = tmp_path_factory.mktemp("death") / "ws"
    ws.mkdir()
    script = [
        text(fence("x = 41\nprint(x + 1)")),
        text(fence("import os\nos.kill(os.getpid(), 9)")),
        summary_fork,
        tool("finalize_response", {"summary": "x is gone with generation 1",
                                   "completion_bullets": ["observed a kernel death"]}),
    ]
    saved = {name: os.environ.pop(name) for name in PROXIES if name in os.environ}
    try:
        with ScriptedLLMServer(script) as server:
            result = run(server, ws, "compute 41 + 1 and keep x", token_budget=1)
            yield DeathRun(result, list(server.requests))
    finally:
        os.environ.update(saved)


def test_after_a_kernel_death_the_next_prompt_carries_the_new_generation(
        death_run: DeathRun) -> None:
    result, requests = death_run.result, death_run.requests
    assert result.accepted, result.reason
    after = messages_of(requests[3])
    assert "kernel generation: 2" in after[2]["content"]
    assert "kernel generation: 1" in messages_of(requests[1])[2]["content"]
    assert "The kernel is now generation 2 (it was 1)" in after[-1]["content"]
    assert "kernel died" in after[-1]["content"]
    assert result.snapshot.kernel_generation == 2
    assert [c.state for c in result.snapshot.cells] == ["ok", "kernel_died"]


def test_the_compaction_summary_is_given_the_hosts_generation_and_replaces_old_turns(
        death_run: DeathRun) -> None:
    fork = messages_of(death_run.requests[2])
    assert fork[0]["content"].startswith(SUMMARY_FORK)
    assert fork[0]["content"].endswith("## kernel_generation\n2")
    assert "BEGIN TRANSCRIPT" in fork[1]["content"] and "x = 41" in fork[1]["content"]
    after = messages_of(death_run.requests[3])
    # system blocks, environment+task, summary, then the last exchange only (the death).
    assert [m["role"] for m in after] == ["system", "system", "user", "user", "assistant",
                                          "user"]
    assert after[3]["content"].startswith("## Summary of earlier work")
    assert "the kernel is at generation 2" in after[3]["content"]
    assert all("x = 41" not in str(m["content"]) for m in after[4:])
    comp = death_run.result.snapshot.compaction
    assert (comp.count, comp.state, comp.last_kernel_generation) == (1, "idle", 2)


def test_the_system_prefix_is_byte_identical_across_restart_and_compaction(
        death_run: DeathRun) -> None:
    turns = [r for r in death_run.requests if "tools" in r.json()]
    assert len(turns) == 3
    prefixes = {json.dumps(messages_of(r)[:2]) for r in turns}
    lines = Catalog.default(death_run.result.record_dir).catalog_lines()
    assert prefixes == {json.dumps([{"role": "system", "content": b}
                                    for b in system_prefix(lines)])}
    tools = {json.dumps(r.json()["tools"], sort_keys=True) for r in turns}
    assert len(tools) == 1
    hashes = [r["data"]["layer_hashes"]["system"]
              for r in read_records(death_run.result.events_path)
              if r and r["kind"] == "prompt_rendered" and r["data"]["purpose"] == "turn"]
    assert len(hashes) == 3 and len(set(hashes)) == 1


def test_a_429_is_retried_and_bad_tool_calls_come_back_as_tool_errors(workdir: Path) -> None:
    bad_json = chat_reply(None, tool_calls=[{"id": "c1", "type": "function", "function": {
        "name": "finalize_response", "arguments": "{not json"}}], finish_reason="tool_calls")
    script = [
        (429, {"error": {"message": "slow down"}}, {"Retry-After": "0"}),
        chat_reply(None, tool_calls=[{"id": "c0", "type": "function", "function": {
            "name": "shell", "arguments": "{}"}}], finish_reason="tool_calls"),
        bad_json,
        chat_reply(None, tool_calls=[{"id": "c2", "type": "function", "function": {
            "name": "finalize_response",
            "arguments": json.dumps({"output": {"answer": 4}, "extra": 1,
                                     "completion_bullets": ["added 2 and 2"]})}}],
            finish_reason="tool_calls"),
    ]
    with ScriptedLLMServer(script) as server:
        result = run(server, workdir, "what is 2 + 2?")
        requests = list(server.requests)

    assert result.accepted, result.reason
    assert len(requests) == 4 and requests[0].body == requests[1].body  # the retry
    tool_results = [m for m in messages_of(requests[3]) if m["role"] == "tool"]
    assert "no tool named 'shell'" in tool_results[0]["content"]
    assert "not valid JSON" in tool_results[1]["content"]
    snap = result.snapshot
    assert [t.state for t in snap.tool_calls] == ["error", "error", "accepted"]
    assert snap.requests == 3  # one logical call survived the 429
    # No usage and no price were reported: unknown, not zero.
    assert snap.tokens.prompt is None and snap.tokens.unreported == 3
    assert snap.costs.usd is None and snap.costs.unpriced == 3
    assert snap.largest_prompt is None


def test_a_plain_final_answer_is_gated_and_must_go_through_finalize(workdir: Path) -> None:
    def expect(fragment: str, reply: dict[str, Any]) -> Callable[[RecordedRequest], Any]:
        def check(request: RecordedRequest) -> dict[str, Any]:
            assert fragment in last_message(request)["content"]
            return reply
        return check

    def gate(answer: str) -> Callable[[RecordedRequest], Any]:
        def check(request: RecordedRequest) -> dict[str, Any]:
            system = messages_of(request)[0]["content"]
            assert system == CONCLUSION_GATE and "tools" not in request.json()
            return text(answer)
        return check

    script = [
        text("Let me think about how to approach this."), gate("NO"),
        expect("no ```python cell and no tool call", text("The answer is 42.")), gate("YES"),
        expect("no evidence", text(fence("print(6 * 7)"))),
        text("The answer is 42."), gate("YES"),
        expect("Call the finalize_response tool", tool(
            "finalize_response", {"summary": "42", "completion_bullets": ["computed 6*7"]})),
    ]
    with ScriptedLLMServer(script) as server:
        result = run(server, workdir, "what is six times seven?")
        assert server.remaining == 0

    assert result.accepted, result.reason
    assert result.snapshot.gates == ((False, False), (True, False), (True, True))
    assert result.steps == 5


def test_the_step_limit_ends_a_session_without_a_verdict(workdir: Path) -> None:
    cut = chat_reply("```python\nfor i in range(", finish_reason="length")
    with ScriptedLLMServer([cut, text(fence("print(2)"))]) as server:
        result = run(server, workdir, "count", max_steps=2)
        assert "cut off at the token limit" in last_message(server.requests[1])["content"]
    assert len(server.requests) == 2  # a cut-off reply is not sent to the conclusion gate
    assert result.outcome is Outcome.STEP_LIMIT and not result.accepted
    assert result.verdict is None and "step limit (2)" in (result.reason or "")
    assert replay(result.events_path).outcome == "step_limit"


# ----------------------------------------------------------------------------- the command


def test_host_kernel_run_exits_0_only_when_accepted_and_prints_the_verdict(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    accept = tool("finalize_response", {"summary": "4", "completion_bullets": ["added"]})
    with ScriptedLLMServer([accept]) as server:
        code = main(["run", "what is 2 + 2?", "--workdir", str(workdir), "--base-url",
                     server.base_url, "--model", "m"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "accepted" in out and "outcome: accepted after 1 step(s)" in out
    assert "[host-kernel run] session ended: accepted" in err
    assert len(err.splitlines()) < 12  # progress without flooding

    with ScriptedLLMServer([text(fence("print(1)"))]) as server:
        code = main(["run", "count", "--workdir", str(workdir), "--base-url", server.base_url,
                     "--model", "m", "--max-steps", "1", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "No submission was verified" in out and "outcome: step_limit" in out
    assert err == ""

    assert main(["run", "x", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                 "--api-key-env", "HOST_KERNEL_TEST_UNSET_KEY"]) == 2
    assert "HOST_KERNEL_TEST_UNSET_KEY: that variable is not set" in capsys.readouterr().err


def test_ctrl_c_interrupts_the_running_cell_records_it_and_exits_130(workdir: Path) -> None:
    reply = text(fence("import time\nprint('sleeping', flush=True)\ntime.sleep(60)"))
    env = {k: v for k, v in os.environ.items() if k not in PROXIES}
    env["TMPDIR"] = tempfile.gettempdir()  # the suite checks its own folder for leftovers
    events = default_record_dir(workdir) / EVENTS_FILE
    with ScriptedLLMServer([reply]) as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "host_kernel", "run", "sleep a while", "--workdir",
             str(workdir), "--base-url", server.base_url, "--model", "m"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if events.exists() and '"cell_started"' in events.read_text():
                    break
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.1)
            time.sleep(1.0)  # let the cell reach its sleep
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 130, err
    assert "outcome: interrupted" in out
    snap = replay(events)
    assert snap.outcome == "interrupted"
    (cell,) = snap.cells
    assert cell.state == "error" and cell.cell_id is not None  # the kernel's KeyboardInterrupt
