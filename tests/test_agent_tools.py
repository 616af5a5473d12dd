"""Tool tiers and the skills catalog, through the agent loop: real Hosts, real HTTP.

Rare tools are one line in the prefix and a stub in the tools field; their schema
is loaded into the loaded-tools block (tool_view, or a bad call) and the prefix
never changes. Skills are retrieved with list_skills / search_skills /
skill_view, and inside cells with host.skills.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from _agent import fence, finalize, run, system_of, text, tool, turns
from scripted_llm import RecordedRequest, ScriptedLLMServer, chat_reply

from host_kernel.agent.events import read_records
from host_kernel.agent.loop import Outcome

CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "a.csv").write_text("x,y\n1,2\n3,4\n5,6\n")
    return folder


def project_skills(ws: Path, count: int) -> list[str]:
    """``count`` fixture skills in the project collection; returns their names."""
    folder = ws / ".host_kernel" / "skills"
    folder.mkdir(parents=True)
    names = []
    for i in range(count):
        name = f"fixture-{i:02d}"
        topic = "plotting scatter figures" if i == 7 else f"topic number {i}"
        (folder / f"{name}.md").write_text(
            f"---\nname: {name}\nsummary: A fixture about {topic}.\ntags: [fixture]\n---\n"
            f"# {name}\nBody of {name}.\n")
        names.append(name)
    return names


def tool_results(result_path: Path) -> list[dict[str, Any]]:
    return [r["data"]["message"] for r in read_records(result_path)
            if r and r["kind"] == "message" and r["data"]["message"]["role"] == "tool"]


def test_loading_a_rare_tool_leaves_the_prefix_byte_identical(ws: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    with ScriptedLLMServer([finalize("plain")]) as server:
        plain = run(server, other, "finish at once")
        (without,) = turns(server)
    script = [tool("tool_view", {"name": "skill_view"}),
              tool("skill_view", {"name": "load-tabular-data"}), finalize("loaded")]
    with ScriptedLLMServer(script) as server:
        loaded = run(server, ws, "finish at once")
        bodies = turns(server)
    assert plain.accepted and loaded.accepted
    for body in bodies:
        assert json.dumps(system_of(body)) == json.dumps(system_of(without))
        assert json.dumps(body["tools"]) == json.dumps(without["tools"])
    lead = len(system_of(without))
    assert "## Loaded tools" not in without["messages"][lead]["content"]
    assert "## Loaded tools" not in bodies[0]["messages"][lead]["content"]
    block = bodies[1]["messages"][lead]["content"]
    assert "## Loaded tools" in block and "### skill_view" in block
    assert "# Load tabular data safely" in bodies[2]["messages"][-1]["content"]
    assert loaded.snapshot.loaded_tools == ("skill_view",)
    # A frequent tool is never loaded: it is already whole in the prefix.
    assert "skill_view" in " ".join(m["content"] for m in system_of(without))


def test_a_bad_call_to_a_rare_tool_loads_its_schema_and_the_next_call_succeeds(
        ws: Path) -> None:
    script = [tool("skill_view", {"skill": "load-tabular-data"}, "c1"),
              tool("skill_view", {"name": "load-tabular-data"}, "c2"), finalize("read it")]
    with ScriptedLLMServer(script) as server:
        result = run(server, ws, "read the tabular skill")
        bodies = turns(server)
    assert result.accepted, result.reason
    first, second = (m["content"] for m in tool_results(result.events_path)[:2])
    assert first.startswith("skill_view was not run:") and "'name' is a required" in first
    assert "loaded-tools block" in first and '"required": ["name"]' in first
    assert second.startswith("# skill load-tabular-data (bundled)")
    loads = [r["data"] for r in read_records(result.events_path)
             if r and r["kind"] == "tool_loaded"]
    assert loads == [{"name": "skill_view", "why": "bad_arguments"}]
    lead = len(system_of(bodies[0]))
    assert "### skill_view" in bodies[1]["messages"][lead]["content"]
    states = [c.state for c in result.snapshot.tool_calls]
    assert states == ["error", "ok", "accepted"]


def test_unknown_tools_bad_frequent_calls_and_the_execute_tool(ws: Path) -> None:
    script = [tool("no_such_tool", {}, "c1"), tool("tool_view", {"name": "nope"}, "c2"),
              tool("execute", {"cell": "print(1)"}, "c3"),
              tool("execute", {"code": "print(6 * 7)"}, "c4"),
              tool("tool_view", {"name": "execute"}, "c5"), finalize("42")]
    with ScriptedLLMServer(script) as server:
        result = run(server, ws, "use the execute tool")
    assert result.accepted, result.reason
    contents = [m["content"] for m in tool_results(result.events_path)]
    assert contents[0].startswith("there is no tool named 'no_such_tool'")
    assert contents[1].startswith("there is no tool named 'nope'")
    assert contents[2].startswith("execute was not run:") and "loaded-tools" not in contents[2]
    assert contents[3].strip() == "42"
    assert "already in the tool map" in contents[4]
    assert result.snapshot.loaded_tools == ()
    assert [c.state for c in result.snapshot.cells] == ["ok"]


def test_two_execute_calls_in_one_reply_are_two_cells(ws: Path) -> None:
    calls = [{"id": f"e{i}", "type": "function", "function": {
        "name": "execute", "arguments": json.dumps({"code": f"print({i} * 11)"})}}
        for i in (1, 2)]
    script = [chat_reply(None, tool_calls=calls, finish_reason="tool_calls"), finalize("two")]
    with ScriptedLLMServer(script) as server:
        result = run(server, ws, "run two cells")
    assert result.accepted, result.reason
    cells = result.snapshot.cells
    assert [(c.proposal, c.state) for c in cells] == [("s1t1", "ok"), ("s1t2", "ok")]
    assert len({c.cell_id for c in cells}) == 2
    assert [m["content"].strip() for m in tool_results(result.events_path)[:2]] == ["11", "22"]


def test_list_skills_pages_a_collection_of_30_exactly_once_with_the_total(ws: Path) -> None:
    names = project_skills(ws, 30)

    def page(offset: int, call_id: str) -> dict[str, Any]:
        return tool("list_skills", {"collection": "project", "offset": offset}, call_id)

    script = [page(0, "p0"), page(10, "p1"), page(20, "p2"), page(30, "p3"),
              tool("search_skills", {"query": ["plotting"]}, "s1"),
              tool("search_skills", {"query": "chart diagram"}, "s2"), finalize("paged")]
    with ScriptedLLMServer(script) as server:
        result = run(server, ws, "page through the project skills")
        first = turns(server)[0]
    assert result.accepted, result.reason
    contents = [m["content"] for m in tool_results(result.events_path)]
    pages = [json.loads(c) for c in contents[:4]]
    seen = [item["name"] for p in pages for item in p["items"]]
    assert seen == names  # each exactly once, in order
    assert {p["total"] for p in pages} == {30}
    assert [p["next_offset"] for p in pages] == [10, 20, None, None]
    assert "fixture-07 (project, score" in contents[4]  # found by its literal word
    assert contents[5].startswith("no skill shares a word")  # no synonyms
    # The prefix holds the catalog lines only: 20 lines, then a pointer to list_skills.
    host_block = system_of(first)[-1]["content"]
    assert "Skills: 38 in the catalog (bundled 8, user 0, project 30)." in host_block
    assert "and 18 more: page with list_skills" in host_block
    assert "Body of fixture-00" not in host_block


def test_a_model_that_retrieves_a_skill_and_follows_it_is_accepted(ws: Path) -> None:
    folder = ws / ".host_kernel" / "skills"
    folder.mkdir(parents=True)
    (folder / "count-csv-rows.md").write_text(
        "---\nname: count-csv-rows\nsummary: Count the data rows of a CSV file, header "
        "excluded.\ntags: [csv, rows]\n---\n# Count CSV rows\nRun this, with the path:\n\n"
        "```python\nimport csv\nwith open('data/a.csv', newline='') as f:\n"
        "    rows = list(csv.reader(f))[1:]\nprint('data rows:', len(rows))\n```\n")

    def follow(request: RecordedRequest) -> dict[str, Any]:
        found = str(request.json()["messages"][-1]["content"])
        (code,) = CODE_BLOCK.findall(found)  # the skill's own recipe, as retrieved
        return tool("execute", {"code": code}, "run")

    def answer(request: RecordedRequest) -> dict[str, Any]:
        seen = str(request.json()["messages"][-1]["content"])
        count = re.search(r"data rows: (\d+)", seen)
        assert count is not None, seen
        return finalize(f"a.csv has {count.group(1)} data rows")

    script = [tool("search_skills", {"query": ["count rows", "csv"]}, "find"),
              tool("skill_view", {"name": "count-csv-rows"}, "view"), follow, answer]
    with ScriptedLLMServer(script) as server:
        result = run(server, ws, "how many data rows does data/a.csv have?")
    assert result.outcome is Outcome.ACCEPTED, result.reason
    assert result.snapshot.verdicts[-1].accepted
    messages = tool_results(result.events_path)
    assert "count-csv-rows (project" in messages[0]["content"]
    assert messages[1]["content"].startswith("# skill count-csv-rows (project)")
    assert "data rows: 3" in messages[2]["content"]


def test_host_skills_inside_a_cell(ws: Path) -> None:
    project_skills(ws, 3)
    cell = fence(
        "page = host.skills.list(collection='project')\n"
        "print('total', page['total'], [i['name'] for i in page['items']])\n"
        "hits = host.skills.search('tabular csv')\nprint('top', hits[0]['skill']['name'] "
        "if 'skill' in hits[0] else hits[0]['name'])\n"
        "print('body', host.skills.get('fixture-01')['body'].strip())\n"
        "try:\n    host.skills.get('no-such-skill')\nexcept Exception as exc:\n"
        "    print(type(exc).__name__)")
    with ScriptedLLMServer([text(cell), finalize("listed")]) as server:
        result = run(server, ws, "use host.skills")
        seen = str(turns(server)[1]["messages"][-1]["content"])
    assert result.accepted, result.reason
    assert "total 3 ['fixture-00', 'fixture-01', 'fixture-02']" in seen
    assert "top load-tabular-data" in seen
    assert "body # fixture-01\nBody of fixture-01." in seen
    assert "BadArguments" in seen


def test_a_reply_with_a_lone_surrogate_is_kept_as_a_replacement_character(ws: Path) -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "execute", "arguments": json.dumps({"code": "print('ok')"})}}
    raw = json.dumps({"choices": [{"index": 0, "message": {
        "role": "assistant", "content": "thinking \ud83d", "tool_calls": [call]},
        "finish_reason": "tool_calls"}]})
    script = [(200, raw.encode(), {"Content-Type": "application/json"}), finalize("fine")]
    with ScriptedLLMServer(script) as server:
        result = run(server, ws, "survive an odd reply")
    assert result.accepted, result.reason
    models = [r["data"]["message"]["content"] for r in read_records(result.events_path)
              if r and r["kind"] == "message" and r["data"]["source"] == "model"]
    assert models[0] == "thinking \ufffd"
