"""Benchmarks of the agent's resume and delegation paths.

* ``agent_rebuild``: a long session's conversation rebuilt from its event log,
  as ``host-kernel run --resume`` does (every record read, the conversation
  folded, the messages rendered), against parsing the same file's lines with
  ``json.loads`` alone: the least any reader of the log does.
* ``subtask_roundtrip``: one cell that delegates a sub-task (whose scripted model
  finishes at once) and collects it: a child Host, kernel, agent turn, verdict
  and verified record read, against a bare ``Host`` start and close, the part
  of a child session that no design can skip.

The model is the tests' scripted OpenAI-compatible server on 127.0.0.1
(tests/scripted_llm.py), so what is timed is ours, not a provider's.
It does not own the timing discipline, the report or the registry
(benchmarks/registry.py lists :data:`AGENT`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks._harness import REPO, Plan, Result, interleaved, scratch, timed
from host_kernel import Host
from host_kernel.agent.conversation import Conversation, rebuild
from host_kernel.agent.events import (
    EventLog,
    MessageAppended,
    PromptRendered,
    ProviderBudget,
    SessionStarted,
    SystemPromptEntry,
)
from host_kernel.agent.layers import SessionAnchors, system_prefix

__all__ = ["AGENT"]


def _long_log(path: Path, turns: int) -> str:
    session = "bench-session"
    log = EventLog(path, session)
    log.emit(SessionStarted("a long task", "analysis_run", False, "m", "/ws", "/rec", turns,
                            100_000, False))
    for block in system_prefix():
        log.emit(SystemPromptEntry("append", block, "builtin"))
    cell = "import pandas as pd\n" + "x = 1\n" * 40
    observation = "row\t" * 200
    for step in range(1, turns + 1):
        log.emit(PromptRendered(step, "turn", step, {"system": "0" * 64}, step * 2, 1000, 250))
        log.emit(ProviderBudget(step, "turn", "m", 1000, 100, 1100, None, None, 0.1))
        log.emit(MessageAppended({"role": "assistant", "content": f"```python\n{cell}```"},
                                 "model"))
        log.emit(MessageAppended({"role": "user", "content": observation}, "observation"))
    log.close()
    return session


def bench_agent_rebuild(plan: Plan) -> Result:
    turns, n = plan.n(2000, 200), plan.n(9, 3)
    anchors = SessionAnchors("2026-01-01", "/ws", "/ws", "main", 2, "/rec")
    with scratch() as root:
        path = root / "agent-events.ndjson"
        session = _long_log(path, turns)

        def ours() -> float:
            def resume() -> None:
                state = rebuild(path, session)
                Conversation(state, anchors, "## Task\nt").messages()
            return timed(resume)

        def base() -> float:
            def parse() -> None:
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        json.loads(line)
            return timed(parse)

        ours(), base()
        a, b = interleaved(n, ours, base)
        size = path.stat().st_size
    return Result("agent_rebuild", a, b, 2.0,
                  notes=(f"{turns} turns ({4 * turns + 3} events)", f"log {size / 1e6:.1f} MB"))


def bench_subtask_roundtrip(plan: Plan) -> Result:
    sys.path.insert(0, str(REPO / "tests"))
    from scripted_llm import ScriptedLLMServer, chat_reply

    from host_kernel.agent.delegation import DelegationConfig, Delegator
    from host_kernel.llm import LLMClient, LLMConfig

    n = plan.n(7, 2)
    finish = json.dumps({"summary": "done", "completion_bullets": ["done"]})

    def reply(request: object) -> dict[str, object]:
        return chat_reply(None, finish_reason="tool_calls", tool_calls=[
            {"id": "f", "type": "function",
             "function": {"name": "finalize_response", "arguments": finish}}])

    with scratch() as root, ScriptedLLMServer() as server, \
            LLMClient(LLMConfig(server.base_url, "m")) as llm:
        (root / "ws").mkdir()
        (root / "bare").mkdir()
        delegator = Delegator(llm, DelegationConfig(max_total=10_000))
        with Host(root / "ws", record_dir=root / "record", delegator=delegator) as host:
            delegator.attach(host)

            def ours() -> float:
                server.push(reply)
                code = "r = host.collect(host.delegate('SUBTASK: finish')); assert r.accepted"
                return timed(lambda: _ok(host.execute(code)))

            def base() -> float:
                def bare() -> None:
                    with Host(root / "bare", record_dir=root / "bare-record"):
                        pass
                return timed(bare)

            ours(), base()
            a, b = interleaved(n, ours, base)
        delegator.shutdown()
    return Result("subtask_roundtrip", a, b, 3.0,
                  notes=("child: one scripted turn, finalize_response accepted",))


def _ok(obs: object) -> None:
    if getattr(obs, "status", None) != "ok":
        raise RuntimeError(f"the delegating cell failed: {getattr(obs, 'text', obs)}")


AGENT: list[tuple[str, float, str, str, Callable[[Plan], Result]]] = [
    ("agent_rebuild", 2.0,
     "a long session's conversation rebuilt from its event log and rendered, as a resume "
     "does",
     "`json.loads` of every line of the same log",
     bench_agent_rebuild),
    ("subtask_roundtrip", 3.0,
     "one cell: `host.collect(host.delegate(...))`, the child a whole agent session (Host, "
     "kernel, one model turn, verdict, verified record read)",
     "a bare `Host` start and close",
     bench_subtask_roundtrip),
]
