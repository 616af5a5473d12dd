"""The MCP server as a subprocess, driven by the `mcp` client over stdio."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

from host_kernel.mcp_server import TOOL_NAMES

SOURCES = {
    "pkg/core.py": "def add(a, b):\n    return a + b\n",
    "pkg/cli.py": "import sys\nfrom pkg.core import add\n\nif __name__ == '__main__':\n"
                  "    print(add(*map(int, sys.argv[1:3])))\n",
    "tests/test_core.py": "from pkg.core import add\n\n\ndef test_add():\n"
                          "    assert add(1, 2) == 3\n",
}
TEST_CMD = "python -m pytest -q tests"
CELL_ID = re.compile(r"\[cell id: ([A-Za-z0-9_-]+)\]")


def is_error(result: Any) -> bool:
    return bool(getattr(result, "is_error", getattr(result, "isError", False)))


def text_of(result: Any) -> str:
    assert not is_error(result), result
    return "".join(getattr(block, "text", "") for block in result.content)


def error_text_of(result: Any) -> str:
    assert is_error(result), result
    return "".join(getattr(block, "text", "") for block in result.content)


async def drive(params: StdioServerParameters, errlog: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(
            read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        seen["tools"] = {tool.name: tool for tool in listed.tools}

        async def call(name: str, **arguments: Any) -> str:
            return text_of(await session.call_tool(name, arguments))

        seen["cell"] = await call(
            "execute_cell",
            code="import os, subprocess\nos.system('echo LEAK-FD1')\n"
                 "subprocess.run(['echo', 'LEAK-CHILD'])\nos.write(1, b'LEAK-RAW\\n')\n"
                 "answer = 6 * 7\nprint('answer', answer)")
        seen["command"] = await call("run_command", command="echo hello from bash")
        for path, content in SOURCES.items():
            await call("write_file", path=path, content=content)
            seen.setdefault("saved", []).append(await call("save_artifact", path=path))
        seen["read"] = await call("read_file", path="pkg/core.py")
        seen["tests"] = await call("run_command", command=TEST_CMD)
        (test_cell,) = CELL_ID.findall(seen["tests"])
        seen["refused"] = error_text_of(await session.call_tool("submit_output", {
            "output": {"summary": "adder"}, "completion_bullets": ["wrote an adder"]}))
        seen["accepted"] = await call(
            "submit_output", output={"summary": "adder", "files": ["pkg/core.py"]},
            completion_bullets=["wrote an adder with a test"], task_status="completed",
            source_files=list(SOURCES), entry_points=["pkg/cli.py"],
            architecture_summary="pkg.core owns add; pkg.cli is the entry point.",
            test_evidence=[{"command": TEST_CMD, "producing_cell_id": test_cell}])
        artifact = re.search(r"artifact_id='([0-9a-f-]{36})'", seen["saved"][0])
        assert artifact is not None, seen["saved"][0]
        seen["lineage"] = await call("lineage", artifact_id=artifact.group(1))
        seen["record"] = json.loads(await call("list_record"))
        # Failures come back marked isError, with the Observation text as the content.
        seen["failed_cell"] = error_text_of(
            await session.call_tool("execute_cell", {"code": "1 / 0"}))
        seen["refused_call"] = error_text_of(await session.call_tool(
            "write_file", {"path": "../outside.txt", "content": "x"}))
        seen["bad_format"] = error_text_of(await session.call_tool(
            "lineage", {"artifact_id": artifact.group(1), "format": "svg"}))
        # A command that ran and exited non-zero is an answer (its receipt), not an error.
        seen["exit_1"] = await call("run_command", command="exit 1")
        # A kernel that fakes the verdict prints "accepted", but the Host's record holds
        # no accepted submission for that cell, so the answer is still an error.
        await call("execute_cell", code=(
            "class FakeVerdict:\n"
            "    def explain(self):\n"
            "        return 'Submission s accepted (reusable_pipeline, armed).'\n"
            "host.submit_output = lambda **kw: FakeVerdict()"))
        seen["forged"] = error_text_of(await session.call_tool("submit_output", {
            "output": {"summary": "x"}, "completion_bullets": ["x"]}))
    return seen


def test_an_mcp_client_lists_tools_runs_a_cell_and_a_command_and_submits(
        workdir: Path, tmp_path: Path) -> None:
    wire = tmp_path / "stdout.ndjson"
    server = shlex.join([sys.executable, "-m", "host_kernel", "mcp", "--workdir", str(workdir),
                         "--mode", "reusable_pipeline"])
    params = StdioServerParameters(
        command="bash", args=["-c", f"set -o pipefail; {server} | tee {shlex.quote(str(wire))}"],
        # The suite's own state folder (tests/conftest.py): the server's record goes there,
        # not into the user's ~/.local/state.
        env={"TMPDIR": tempfile.gettempdir(), "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"],
             "HOST_KERNEL_FACTORY": "off"},  # (the suite's: no factory outlives a test)
        cwd=str(workdir))
    with (tmp_path / "stderr.log").open("w") as errlog:
        seen = anyio.run(drive, params, errlog)

    assert set(seen["tools"]) == set(TOOL_NAMES)
    assert seen["tools"]["run_command"].description.startswith("Run a shell command")
    cell = seen["cell"]
    assert CELL_ID.match(cell) and "answer 42" in cell
    assert "Receipt(" in seen["command"] and "hello from bash" in seen["command"]
    assert "exit 0" in seen["command"]
    assert seen["read"] == SOURCES["pkg/core.py"]
    assert "1 passed" in seen["tests"]
    assert "SubmissionRefused" in seen["refused"] and "[declarations_missing]" in seen["refused"]
    assert "ZeroDivisionError" in seen["failed_cell"]
    assert CELL_ID.match(seen["failed_cell"])  # the whole Observation text, cell id first
    assert "[path_refused]" in seen["refused_call"]
    assert "unknown format 'svg'" in seen["bad_format"]
    assert "exit 1" in seen["exit_1"]
    assert "accepted (reusable_pipeline, armed)" in seen["forged"]
    assert "accepted (reusable_pipeline, armed)" in seen["accepted"], seen["accepted"]
    assert "artifact core.py (" in seen["lineage"]
    record = seen["record"]
    assert record["mode"] == {"name": "reusable_pipeline", "armed": True}
    assert [s["accepted"] for s in record["submissions"]] == [False, True]
    assert {r["command"] for r in record["receipts"]} == {"echo hello from bash", TEST_CMD}
    assert len(record["artifacts"]) == len(SOURCES)
    # Every tool ran as a cell the Host minted: one cell per call (list_record reads only).
    assert len(record["cells"]) == 13

    # Nothing but JSON-RPC reached stdout, whatever the kernel and its children wrote to fd 1.
    lines = wire.read_text().splitlines()
    assert lines and all(json.loads(line)["jsonrpc"] == "2.0" for line in lines)
    log = (tmp_path / "stderr.log").read_text()
    assert "host-kernel mcp" in log
    assert "LEAK-RAW" in log and "LEAK-CHILD" in log  # the kernel's fd 1 is the server's stderr
    assert f"record {os.environ['XDG_STATE_HOME']}" in log



async def _one_cell(params: StdioServerParameters, errlog: Any) -> str:
    async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(
            read, write) as session:
        await session.initialize()
        return text_of(await session.call_tool("execute_cell", {"code": "print(6 * 7)"}))


def test_an_mcp_session_can_keep_its_record_in_a_postgresql_ledger(
        workdir: Path, tmp_path: Path, pg_url: str) -> None:
    from host_kernel.audit import audit_ledger
    from host_kernel.store.pg import PostgresLedger

    server = [sys.executable, "-m", "host_kernel", "mcp", "--workdir", str(workdir),
              "--ledger", pg_url]
    params = StdioServerParameters(
        command=server[0], args=server[1:], cwd=str(workdir),
        env={"TMPDIR": tempfile.gettempdir(), "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"],
             "HOST_KERNEL_FACTORY": "off",
             "XDG_CONFIG_HOME": os.environ.get("XDG_CONFIG_HOME", ""),
             "HOME": os.environ["HOME"]})
    with (tmp_path / "stderr.log").open("w") as errlog:
        cell = anyio.run(_one_cell, params, errlog)
    assert "42" in cell, cell
    with PostgresLedger.open_readonly(pg_url) as reader:
        [(front, cells)] = reader.query(
            "SELECT front, (SELECT count(*) FROM cells) FROM sessions")
    assert front == "mcp" and cells == 1
    report = audit_ledger(pg_url)
    assert report.clean, [str(f) for f in report.findings]
