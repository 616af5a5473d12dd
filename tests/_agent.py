"""Helpers for agent tests: scripted replies, a client of the scripted server, a run.

The server is :class:`scripted_llm.ScriptedLLMServer` on 127.0.0.1; every request
goes over real HTTP through the real :class:`~host_kernel.llm.LLMClient`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from scripted_llm import RecordedRequest, ScriptedLLMServer, chat_reply

from host_kernel.agent.loop import AgentResult, run_agent
from host_kernel.agent.sysprompt import Layers
from host_kernel.llm import LLMClient, LLMConfig

USAGE = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
CELL_ID = re.compile(r"\[cell id: ([A-Za-z0-9_-]+)\]")


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


def text(content: str, usage: dict[str, Any] | None = USAGE) -> dict[str, Any]:
    return chat_reply(content, usage=usage)


def tool(name: str, args: Any, call_id: str = "call_1",
         usage: dict[str, Any] | None = USAGE) -> dict[str, Any]:
    raw = args if isinstance(args, str) else json.dumps(args)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}
    return chat_reply(None, tool_calls=[call], finish_reason="tool_calls", usage=usage)


def finalize(summary: str = "done", call_id: str = "call_f") -> dict[str, Any]:
    return tool("finalize_response", {"summary": summary, "completion_bullets": [summary]},
                call_id)


def client(server: ScriptedLLMServer) -> LLMClient:
    return LLMClient(LLMConfig(server.base_url, "scripted", timeout=30.0, max_retries=2,
                               backoff=0.001))


def layers(root: Path, workdir: Path) -> Layers:
    """System prompt layers of the test's own: base and user under ``root``."""
    return Layers(base=root / "base", user=root / "user", project=workdir / ".host_kernel")


def run(server: ScriptedLLMServer, workdir: Path, task: str | None, **kwargs: Any
        ) -> AgentResult:
    with client(server) as llm:
        return run_agent(task, workdir=workdir, llm=llm, **kwargs)


def turns(server: ScriptedLLMServer) -> list[dict[str, Any]]:
    """The bodies of the agent's own turns (the requests that carry the tools field)."""
    return [r.json() for r in server.requests if "tools" in r.json()]


def system_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The leading system messages of a request."""
    out = []
    for message in body["messages"]:
        if message["role"] != "system":
            break
        out.append(message)
    return out


def last_content(request: RecordedRequest) -> str:
    return str(request.json()["messages"][-1]["content"])

