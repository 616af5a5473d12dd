"""The agent's prompt layers: the inventory, the byte-stable prefix, the variable context."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from host_kernel.agent.conversation import Conversation, ConversationState
from host_kernel.agent.layers import (
    DEFAULT_SEED,
    FINALIZE_FIELDS,
    FINALIZE_TOOL,
    LAYERS,
    PERSONA,
    TOOL_SPECS,
    TOOLS,
    LayerClass,
    SessionAnchors,
    Tier,
    extract_cells,
    host_block,
    read_git_head,
    submission_from_arguments,
    system_prefix,
    task_message,
    tool_map,
)
from host_kernel.agent.sysprompt import Block, initial_entries
from host_kernel.prompts import SECURITY_GENERAL, SKILL_RETRIEVAL, task_mode_prompt

ANCHORS = SessionAnchors("2025-01-02", "/ws", "/ws", "main", 1, "/ws/.host_kernel")


def conversation(task_block: str) -> Conversation:
    """A conversation whose system prompt is the built-in one, as a new session logs it."""
    state = ConversationState()
    state.entries += initial_entries([Block(b, "test") for b in system_prefix()])
    return Conversation(state, ANCHORS, task_block)


def test_the_inventory_names_every_layer_with_its_class_and_place() -> None:
    by_name = {layer.name: layer for layer in LAYERS}
    assert list(by_name) == ["base_system", "tool_map", "environment", "task", "loaded_tools",
                             "history", "compaction_summary", "request_options"]
    immutable = {n for n, layer in by_name.items() if layer.layer_class is LayerClass.IMMUTABLE}
    assert immutable == {"base_system", "tool_map"}
    assert by_name["base_system"].where == "leading system messages"
    for name in ("environment", "task", "loaded_tools"):
        assert by_name[name].where.startswith("first user message")
    assert all(layer.holds for layer in LAYERS)


def test_the_prefix_holds_persona_api_security_and_the_tool_map_and_nothing_volatile(
) -> None:
    seed, fixed = system_prefix()
    assert seed == DEFAULT_SEED and seed.startswith(PERSONA)
    assert "host.bash(command" in seed and "host.submit_output(" in seed
    assert fixed.startswith(SECURITY_GENERAL) and fixed.endswith(tool_map())
    assert SKILL_RETRIEVAL not in fixed  # no catalog lines, no routing rules
    with_skills = host_block("Skills: 1 in the catalog.\n- a: b")
    assert SKILL_RETRIEVAL in with_skills and with_skills.endswith("- a: b")
    assert system_prefix() == (seed, fixed)  # a pure function of constants
    for text in (seed, fixed):
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)
        assert "generation 1" not in text and "Task mode" not in text
        for mode in ("reusable_pipeline", "codebase_change"):
            assert task_mode_prompt(mode, True) not in text


def test_frequent_tools_carry_their_arguments_and_rare_tools_one_line() -> None:
    lines = tool_map().splitlines()
    frequent = [t for t in TOOL_SPECS if t.tier is Tier.FREQUENT]
    rare = [t for t in TOOL_SPECS if t.tier is Tier.RARE]
    assert {t.name for t in frequent} >= {"execute", "finalize_response", "tool_view"}
    assert {t.name for t in rare} >= {"list_skills", "search_skills", "skill_view"}
    for spec in frequent:
        assert any(line.startswith(f"- {spec.sketch}: ") for line in lines)
        assert spec.sketch.startswith(spec.name + "(")
    for spec in rare:
        assert f"- {spec.name}: {spec.summary}" in lines
    # The tools field: frequent tools in full, rare ones as a stub that takes any object.
    by_name = {t["function"]["name"]: t["function"] for t in TOOLS}
    assert by_name["finalize_response"]["parameters"] == FINALIZE_TOOL["function"]["parameters"]
    for spec in rare:
        assert by_name[spec.name]["parameters"] == {"type": "object",
                                                   "additionalProperties": True}
        assert "tool_view" in by_name[spec.name]["description"]


def test_the_task_mode_fragment_goes_only_into_the_task_message() -> None:
    armed = task_message("build it", "reusable_pipeline", True)
    assert armed.startswith("## Task\nbuild it\n\n")
    assert armed.endswith(task_mode_prompt("reusable_pipeline", True))
    advisory = task_message("build it", "codebase_change", False)
    assert "(inferred from the request)" in advisory
    assert task_message("what is 2+2", "analysis_run", False) == "## Task\nwhat is 2+2"
    messages = conversation(armed).messages()
    assert [m["role"] for m in messages] == ["system", "system", "user"]
    assert all("Task mode" not in m["content"] for m in messages[:2])
    assert task_mode_prompt("reusable_pipeline", True) in messages[2]["content"]


def test_the_environment_block_carries_every_anchor() -> None:
    text = ANCHORS.render()
    for fact in ("date: 2025-01-02", "workspace root: /ws", "cwd (where cells start): /ws",
                 "git branch: main", "kernel generation: 1", "record: /ws/.host_kernel"):
        assert fact in text


def test_only_the_changed_layers_hash_differently() -> None:
    conv = conversation(task_message("t", "analysis_run", False))
    options = {"model": "m", "tools": list(TOOLS)}
    before = conv.layer_hashes(options)
    conv.state.history.append({"role": "assistant", "content": "hi"})
    conv.anchors = SessionAnchors("2025-01-02", "/ws", "/ws", "main", 2, "/ws/.host_kernel")
    conv.state.summary = "## Summary"
    conv.state.loaded_tools.append("skill_view")
    after = conv.layer_hashes(options)
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"environment", "history", "compaction_summary", "loaded_tools"}
    assert before["compaction_summary"] is None and before["loaded_tools"] is None
    # Loading a tool changes the first user message, never a system message.
    assert conv.messages()[:2] == conversation("t").messages()[:2]
    assert "### skill_view" in conv.messages()[2]["content"]


def test_the_finalize_tool_takes_the_fields_of_submit_output() -> None:
    params = FINALIZE_TOOL["function"]["parameters"]
    assert set(params["properties"]) == set(FINALIZE_FIELDS)
    assert params["properties"]["task_status"]["enum"] == [
        "completed", "partial", "blocked", "failed"]
    submission, notes = submission_from_arguments(
        {"summary": "42", "completion_bullets": ["x"], "colour": "red",
         "test_evidence": [{"command": "pytest", "producing_cell_id": "abc"}]})
    assert submission.output == {"summary": "42"}
    assert submission.test_evidence == [{"command": "pytest", "producing_cell_id": "abc"}]
    assert notes == ["ignored unknown field(s): colour"]
    kept, _ = submission_from_arguments({"output": {"summary": "own", "n": 1},
                                         "summary": "other", "completion_bullets": ["x"]})
    assert kept.output == {"summary": "own", "n": 1}


def test_the_agent_package_exports_exactly_what_it_lists() -> None:
    from host_kernel import agent

    assert len(agent.__all__) == len(set(agent.__all__))
    assert set(agent.__all__) == set(agent._WHERE)
    for name in agent.__all__:
        assert getattr(agent, name) is not None


def test_python_fences_are_cells_and_other_fences_are_not() -> None:
    reply = ("Plan.\n```python\nx = 1\n```\nthen\n```bash\nls\n```\n"
             "```py\nprint('``` inside a string')\n```\n```python\n\n```\n")
    assert extract_cells(reply) == ["x = 1\n", "print('``` inside a string')\n"]
    assert extract_cells("no code here") == []


# ----------------------------------------------------------------------------- git HEAD


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_branch_is_read_from_git_head_of_an_enclosing_repository(tmp_path: Path) -> None:
    write(tmp_path / "repo" / ".git" / "HEAD", "ref: refs/heads/feature/x\n")
    (tmp_path / "repo" / "sub" / "dir").mkdir(parents=True)
    head = read_git_head(tmp_path / "repo" / "sub" / "dir")
    assert (head.found, head.branch, head.worktree) == (True, "feature/x", False)
    assert head.describe() == "feature/x"


def test_a_linked_worktree_is_followed_through_its_gitdir_file(tmp_path: Path) -> None:
    gitdir = tmp_path / "main" / ".git" / "worktrees" / "wt"
    write(gitdir / "HEAD", "ref: refs/heads/topic\n")
    write(tmp_path / "wt" / ".git", f"gitdir: {gitdir}\n")
    head = read_git_head(tmp_path / "wt")
    assert (head.branch, head.worktree) == ("topic", True)
    assert head.describe() == "topic (linked worktree)"
    write(tmp_path / "rel" / ".git", "gitdir: ../main/.git/worktrees/wt\n")
    assert read_git_head(tmp_path / "rel").branch == "topic"


def test_a_detached_head_and_a_missing_repository_are_said_plainly(tmp_path: Path) -> None:
    write(tmp_path / "d" / ".git" / "HEAD", "0123456789abcdef0123456789abcdef01234567\n")
    assert read_git_head(tmp_path / "d").describe() == "detached HEAD at 0123456789ab"
    write(tmp_path / "bad" / ".git", "not a pointer\n")
    assert read_git_head(tmp_path / "bad").describe().startswith("unknown (")
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    head = read_git_head(lonely)
    if head.found:  # the test folder itself sits inside a checkout
        pytest.skip("tmp_path is inside a git repository on this machine")
    assert head.describe() == "none (not inside a git repository)"
