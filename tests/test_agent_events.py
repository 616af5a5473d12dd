"""The agent's event stream: the NDJSON log, the projection, replay, and `host-kernel trace`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scripted_llm import ScriptedLLMServer, chat_reply

from host_kernel._paths import default_record_dir
from host_kernel.agent.events import (
    EVENT_TYPES,
    CellCompleted,
    CellProposed,
    CellStarted,
    CompactionCompleted,
    CompactionStarted,
    ErrorEvent,
    EventLog,
    ProviderBudget,
    ReceiptRecorded,
    SessionEnded,
    SessionStarted,
    read_records,
)
from host_kernel.agent.loop import run_agent
from host_kernel.agent.projection import Projection, Snapshot, fold, replay
from host_kernel.cli import main
from host_kernel.llm import LLMClient, LLMConfig

SESSION = "s-1"


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    events = EventLog(tmp_path / "agent-events.ndjson", SESSION)
    yield events
    events.close()


def started() -> SessionStarted:
    return SessionStarted("task", "analysis_run", False, "m", "/ws", "/ws/.host_kernel", 5,
                          1000, False)


def budget(prompt: int | None, completion: int | None = None,
           cost: float | None = None) -> ProviderBudget:
    total = None if prompt is None else prompt + (completion or 0)
    return ProviderBudget(1, "turn", "m", prompt, completion, total, cost,
                          None if cost is None else "provider", 0.1)


def record(kind: str, data: Any, seq: int = 1) -> dict[str, Any]:
    return {"v": 1, "seq": seq, "ts": 0.0, "session": SESSION, "kind": kind, "data": data}


# ----------------------------------------------------------------------------- the log


def test_every_event_is_one_ndjson_line_and_listeners_get_the_record_as_written(
        log: EventLog) -> None:
    heard: list[dict[str, Any]] = []
    log.subscribe(heard.append)
    log.emit(started())
    log.emit(CellProposed("s1c1", 1, "print(1)"))
    lines = log.path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == heard
    assert [r["seq"] for r in heard] == [1, 2]
    assert heard[1] == {"v": 1, "seq": 2, "ts": heard[1]["ts"], "session": SESSION,
                        "kind": "cell_proposed",
                        "data": {"proposal": "s1c1", "step": 1, "code": "print(1)"}}


def test_a_broken_listener_is_detached_and_recorded_as_an_error(log: EventLog) -> None:
    def broken(record: dict[str, Any]) -> None:
        raise RuntimeError("printer fell over")

    log.subscribe(broken)
    log.emit(started())
    log.emit(started())  # no second failure: the listener is gone
    kinds = [r["kind"] for r in read_records(log.path) if r]
    assert kinds == ["session_started", "error", "session_started"]
    assert replay(log.path).errors[0].message == "printer fell over"


def test_every_event_type_has_a_distinct_kind_and_serialises_to_json() -> None:
    kinds = [t.kind for t in EVENT_TYPES]
    assert len(set(kinds)) == len(kinds)
    assert {"session_started", "session_ended", "user_input", "prompt_rendered",
            "provider_budget", "cell_proposed", "cell_started", "cell_completed", "receipt",
            "artifact", "submission_verdict", "compaction_started", "compaction_completed",
            "error"} <= set(kinds)


# ----------------------------------------------------------------------------- the projection


def test_costs_sum_priced_samples_and_count_unpriced_ones_unknown_is_not_zero(
        log: EventLog) -> None:
    projection = Projection()
    log.subscribe(projection)
    log.emit(started())
    assert projection.snapshot.tokens.prompt is None and projection.snapshot.costs.usd is None
    log.emit(budget(None))
    snap = projection.snapshot
    assert (snap.tokens.prompt, snap.tokens.unreported, snap.largest_prompt) == (None, 1, None)
    assert (snap.costs.usd, snap.costs.unpriced) == (None, 1)
    log.emit(budget(1000, 50, cost=0.25))
    log.emit(budget(3000, 10))
    log.emit(budget(2000, 20, cost=0.5))
    snap = projection.snapshot
    assert (snap.tokens.prompt, snap.tokens.completion, snap.tokens.total) == (6000, 80, 6080)
    assert (snap.tokens.reported, snap.tokens.unreported) == (3, 1)
    assert (snap.costs.usd, snap.costs.priced, snap.costs.unpriced) == (0.75, 2, 2)
    assert snap.largest_prompt == 3000 and snap.requests == 4


def test_a_cells_lifecycle_is_keyed_by_id_and_receipts_attach_to_it(log: EventLog) -> None:
    projection = Projection()
    log.subscribe(projection)
    log.emit(CellProposed("s1c1", 1, "host.bash('true')"))
    assert projection.snapshot.cell("s1c1") is not None
    assert projection.snapshot.cells[0].state == "proposed"
    log.emit(CellStarted("s1c1", 1))
    assert projection.snapshot.cells[0].state == "running"
    log.emit(CellCompleted("s1c1", 1, "CELLID", "ok", 1, 0.5))
    log.emit(ReceiptRecorded("CELLID", "R1", "true", 0))
    cell = projection.snapshot.cell("CELLID")
    assert cell is not None and cell.proposal == "s1c1"
    assert (cell.state, cell.generation, cell.receipts) == ("ok", 1, ("R1",))


def test_compaction_state_follows_started_completed_and_failed(log: EventLog) -> None:
    projection = Projection()
    log.subscribe(projection)
    log.emit(CompactionStarted(3, 9000, 10000, 12))
    assert projection.snapshot.compaction.state == "running"
    log.emit(CompactionCompleted(3, False, 12, 10, ["Done"], 1))
    assert (projection.snapshot.compaction.state, projection.snapshot.compaction.failures) == (
        "failed", 1)
    log.emit(CompactionStarted(4, 9500, 10000, 13))
    log.emit(CompactionCompleted(4, True, 5, 800, [], 2))
    comp = projection.snapshot.compaction
    assert (comp.state, comp.count, comp.last_kernel_generation) == ("idle", 1, 2)


def test_unknown_kinds_and_malformed_records_are_counted_never_raised() -> None:
    snap = Snapshot()
    for item in [record("from_the_future", {"x": 1}), record("from_the_future", {}),
                 record("cell_completed", {"proposal": "p"}),  # step and status missing
                 record("receipt", "not a dict"), {"kind": 7}, None, [1, 2], "text"]:
        snap = fold(snap, item)
    assert snap.unknown_kinds == (("from_the_future", 2),)
    assert snap.malformed == 6 and snap.events == 8


def test_folding_never_changes_a_snapshot_already_returned(log: EventLog) -> None:
    projection = Projection()
    log.subscribe(projection)
    log.emit(started())
    log.emit(CellProposed("s1c1", 1, "x"))
    earlier = projection.snapshot
    frozen_copy = earlier.to_dict()
    log.emit(CellCompleted("s1c1", 1, "C", "ok", 1, 0.1))
    log.emit(budget(10, 1, 0.1))
    log.emit(ErrorEvent("provider", "LLMStatusError", "boom"))
    log.emit(SessionEnded("error", 1, False))
    assert earlier.to_dict() == frozen_copy
    assert earlier is not projection.snapshot
    with pytest.raises(dataclasses.FrozenInstanceError):
        earlier.steps = 9  # type: ignore[misc]
    assert isinstance(earlier.cells, tuple)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
kinds = st.sampled_from([t.kind for t in EVENT_TYPES] + ["unheard_of"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.fixed_dictionaries({"kind": kinds, "data": json_values,
                                       "seq": json_values}), max_size=12))
def test_any_sequence_of_records_folds_without_raising(records: list[dict[str, Any]]) -> None:
    snap = Snapshot()
    for item in records:
        snap = fold(snap, item)
    assert snap.events == len(records)
    snap.render()
    json.dumps(snap.to_dict())


def test_new_kinds_with_fields_of_the_wrong_type_fold_and_render() -> None:
    """Found by the property above: a sub-task's task that is not a string once made
    render() raise. Each field of the wrong type is dropped or the record counted."""
    records = [
        {"kind": "subtask_started", "data": {"handle": "h", "task": {"a": 1}}},
        {"kind": "subtask_finished", "data": {"handle": "h", "outcome": "x", "cost_usd": 1,
                                              "session": {"x": 1}, "priced": "a"}},
        {"kind": "session_resumed", "data": {"generation": True}},
        {"kind": "tool_loaded", "data": {"name": {"x": 1}}},
        {"kind": "system_prompt", "data": {"op": ["replace"]}},
    ]
    snap = Snapshot()
    for record in records:
        snap = fold(snap, record)
    assert snap.subtasks[0].task is None and snap.subtasks[0].session is None
    assert snap.subtasks[0].cost_usd == 1.0 and snap.loaded_tools == ()
    assert snap.malformed == 1
    assert "sub-tasks (1):" in snap.render()
    json.dumps(snap.to_dict())


# ----------------------------------------------------------------------------- replay


def test_replay_reads_one_session_by_default_the_last(tmp_path: Path) -> None:
    path = tmp_path / "agent-events.ndjson"
    for session, steps in (("first", 3), ("second", 7)):
        events = EventLog(path, session)
        events.emit(started())
        events.emit(SessionEnded("step_limit", steps, False))
        events.close()
    with path.open("a") as f:
        f.write("{not json\n")
    assert replay(path).steps == 7
    assert replay(path).malformed == 1
    assert replay(path, "first").steps == 3 and replay(path, "first").session == "first"


def test_live_projection_and_replay_of_the_file_are_identical(workdir: Path) -> None:
    code = ("host.write_file('data.csv', 'a,b\\n1,2\\n')\nhost.save_artifact('data.csv')\n"
            "host.bash('wc -l data.csv')")
    finalize = chat_reply(None, finish_reason="tool_calls", tool_calls=[{
        "id": "f", "type": "function", "function": {"name": "finalize_response", "arguments":
            json.dumps({"output": {"artifacts": ["data.csv"], "rows": 1},
                        "completion_bullets": ["wrote and saved data.csv"]})}}],
        usage={"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12})
    script = [chat_reply(f"```python\n{code}\n```"), finalize]
    with ScriptedLLMServer(script) as server, LLMClient(
            LLMConfig(server.base_url, "m", timeout=30.0)) as llm:
        result = run_agent("write a small table", workdir=workdir, llm=llm)
    assert result.accepted, result.reason
    live = result.snapshot
    assert replay(result.events_path, result.session_id) == live
    assert replay(result.events_path) == live
    refolded = Projection()
    for item in read_records(result.events_path):
        refolded.feed(item)
    assert refolded.snapshot == live
    assert len(live.receipts) == 1 and len(live.artifacts) == 1
    assert live.cells[0].receipts == live.receipts and live.cells[0].artifacts == live.artifacts
    assert live.tokens.reported == 1 and live.tokens.unreported == 1


def test_trace_prints_the_snapshot_as_text_or_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ws").mkdir()
    record_dir = default_record_dir(tmp_path / "ws")  # a workspace's record, outside it
    record_dir.mkdir(parents=True)
    events = EventLog(record_dir / "agent-events.ndjson", "abc")
    events.emit(started())
    events.emit(budget(100, 5, 0.01))
    events.emit(CellProposed("s1c1", 1, "print(1)"))
    events.emit(CellCompleted("s1c1", 1, "CID", "ok", 1, 0.2))
    events.emit(SessionEnded("accepted", 1, True))
    events.close()

    assert main(["trace", str(tmp_path / "ws")]) == 0
    out = capsys.readouterr().out
    assert "outcome   accepted" in out and "CID" in out and "$0.010000" in out
    assert main(["trace", str(record_dir / "agent-events.ndjson"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cells"][0]["cell_id"] == "CID" and data["tokens"]["prompt"] == 100
    assert main(["trace", str(record_dir), "--list"]) == 0
    assert capsys.readouterr().out == "abc\n"
    assert main(["trace", str(tmp_path)]) == 1
    assert "no agent-events.ndjson" in capsys.readouterr().err
