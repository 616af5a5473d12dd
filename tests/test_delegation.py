"""Sub-tasks: host.delegate and host.collect through real cells, real Hosts, real HTTP.

The parent and its children all talk to one scripted server; each child's task
carries a marker (``SUBTASK-…``) that routes its requests to its own script.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _agent import fence, finalize, run, text, turns
from _helpers import wait_for
from scripted_llm import ScriptedLLMServer

from host_kernel import Host
from host_kernel.agent.delegation import DelegationConfig
from host_kernel.agent.events import EVENTS_FILE, read_records
from host_kernel.agent.loop import Outcome
from host_kernel.audit import audit
from host_kernel.lineage.graph import record_lineage
from host_kernel.sandbox.client import probe
from host_kernel.sandbox.policy import hidden_paths
from host_kernel.store.ledger import SQLiteLedger


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "a.csv").write_text("x\n1\n2\n")
    (folder / "data" / "b.csv").write_text("x\n10\n20\n")
    (folder / "data" / "unused.csv").write_text("x\n1000\n")
    return folder


def summing_child(path: str) -> list[dict[str, Any]]:
    code = (f"import csv, json\nrows = list(csv.DictReader(open({path!r})))\n"
            f"total = sum(int(r['x']) for r in rows)\n"
            f"open('total.json', 'w').write(json.dumps({{'total': total}}))\n"
            f"saved = host.save_artifact('total.json')\nprint(total)")
    return [text(fence(code)), finalize(f"summed {path}")]


def task_of(body: dict[str, Any]) -> str:
    return next(str(m["content"]) for m in body["messages"] if m["role"] == "user")


def last_observation(server: ScriptedLLMServer, index: int) -> str:
    """The last message of the parent's ``index``-th turn (children's turns left out)."""
    parent = [b for b in turns(server) if "SUBTASK-" not in task_of(b)]
    return str(parent[index]["messages"][-1]["content"])


def subtask_rows(record: Path) -> list[tuple[str, dict[str, Any]]]:
    with SQLiteLedger(record / "ledger.sqlite") as ledger:
        return [(r["kind"], json.loads(r["body"])) for r in ledger.query(
            "SELECT kind, body FROM events WHERE kind LIKE 'subtask_%' ORDER BY seq")]


def test_two_subtasks_combined_into_one_artifact_name_both_in_its_lineage(ws: Path) -> None:
    delegate = fence(
        "a = host.delegate('SUBTASK-A: sum column x of data/a.csv', inputs=['data/a.csv'])\n"
        "b = host.delegate('SUBTASK-B: sum column x of data/b.csv', inputs=['data/b.csv'])\n"
        "ra, rb = host.collect(a, timeout=120), host.collect(b, timeout=120)\n"
        "print(ra.outcome, ra.accepted, rb.outcome, rb.accepted)")
    combine = fence(
        "import json\n"
        "ta = json.load(open(ra.load(ra.artifacts[0]['artifact_id'], 'from_a.json')))\n"
        "tb = json.load(open(rb.load(rb.artifacts[0]['artifact_id'], 'from_b.json')))\n"
        "host.write_file('combined.json', json.dumps({'total': ta['total'] + tb['total']}))\n"
        "combined = host.save_artifact('combined.json')\n"
        "print('total', ta['total'] + tb['total'], combined.artifact_id)")
    routes = {"SUBTASK-A": summing_child("data/a.csv"),
              "SUBTASK-B": summing_child("data/b.csv")}
    with ScriptedLLMServer([text(delegate), text(combine), finalize("33")],
                           routes=routes) as server:
        result = run(server, ws, "add the totals of a.csv and b.csv")
        collected = last_observation(server, 1)
        combined = last_observation(server, 2)

    assert result.outcome is Outcome.ACCEPTED, result.reason
    assert "accepted True accepted True" in collected
    assert "total 33" in combined
    artifact_id = combined.split()[-1]

    graph = record_lineage(result.record_dir, artifact_id)
    subtasks = [n for n in graph.nodes if n.kind == "subtask"]
    assert sorted(n.attrs["task"] for n in subtasks) == [
        "SUBTASK-A: sum column x of data/a.csv", "SUBTASK-B: sum column x of data/b.csv"]
    assert all(n.attrs["accepted"] and n.attrs["outcome"] == "accepted" for n in subtasks)
    files = {n.attrs["path"] for n in graph.nodes if n.kind == "file"}
    assert {"data/a.csv", "data/b.csv"} <= files and "data/unused.csv" not in files
    for node in subtasks:  # each sub-task is upstream of the artifact, its file upstream of it
        read = [e.dst for e in graph.edges if e.src == node.id]
        assert len(read) == 1 and read[0].startswith("file:data/")

    snap = result.snapshot
    assert [(t.state, t.accepted) for t in snap.subtasks] == [("accepted", True)] * 2
    rows = subtask_rows(result.record_dir)
    started = [b for k, b in rows if k == "subtask_started"]
    assert [b["inputs"][0]["from"] for b in started] == ["data/a.csv", "data/b.csv"]
    assert all(Path(b["folder"]).parent == result.record_dir / "subtasks" / b["handle"]
               for b in started)
    for body in started:  # each child has its own record, under the parent's
        child = Path(body["record_dir"])
        assert child.parent.parent == result.record_dir / "subtasks"
        report = audit(child)
        assert report.clean and report.submissions == 1, [str(f) for f in report.findings]
        (started_child,) = [r for r in read_records(child / EVENTS_FILE)
                            if r and r["kind"] == "session_started"]
        assert started_child["data"]["parent"] == {
            "session": result.session_id, "cell_id": body["cell_id"],
            "handle": body["handle"], "record_dir": str(result.record_dir)}
    report = audit(result.record_dir)
    assert report.clean, [str(f) for f in report.findings]


def test_a_child_that_hangs_is_cut_at_its_timeout_and_the_parent_sees_it(ws: Path) -> None:
    parent = fence(
        "import time\nt0 = time.monotonic()\n"
        "h = host.delegate('SUBTASK-HANG: wait forever', timeout=3)\n"
        "r = host.collect(h)\n"
        "print('outcome', r.outcome, r.accepted, round(time.monotonic() - t0))\nprint(r.error)")
    hang = [text(fence("import time\ntime.sleep(600)"))]
    with ScriptedLLMServer([text(parent), finalize("the child timed out")],
                           routes={"SUBTASK-HANG": hang}) as server:
        t0 = time.monotonic()
        result = run(server, ws, "try a sub-task that hangs")
        took = time.monotonic() - t0
        seen = last_observation(server, 1)

    assert result.outcome is Outcome.ACCEPTED, result.reason
    assert "outcome timeout False" in seen and "time limit of 3 s" in seen
    assert took < 90
    (collected,) = [b for k, b in subtask_rows(result.record_dir) if k == "subtask_collected"]
    assert collected["outcome"] == "timeout" and collected["accepted"] is False
    assert result.snapshot.subtasks[0].state == "timeout"
    # The child's record was closed: its cell ended, its session ended.
    child = Path([b for k, b in subtask_rows(result.record_dir)
                  if k == "subtask_started"][0]["record_dir"])
    report = audit(child)
    assert report.clean, [str(f) for f in report.findings]
    with SQLiteLedger(child / "ledger.sqlite") as ledger:
        assert ledger.query("SELECT count(*) FROM cells WHERE status = 'running'")[0][0] == 0
        assert ledger.query("SELECT count(*) FROM sessions WHERE ended IS NULL")[0][0] == 0


def test_collect_with_a_timeout_cuts_a_child_that_is_still_running(ws: Path) -> None:
    parent = fence("h = host.delegate('SUBTASK-SLOW: take long')\n"
                   "r = host.collect(h, timeout=1)\nprint('outcome', r.outcome, r.error)")
    slow = [text(fence("import time\ntime.sleep(600)"))]
    with ScriptedLLMServer([text(parent), finalize("cut")],
                           routes={"SUBTASK-SLOW": slow}) as server:
        result = run(server, ws, "collect with a timeout")
        seen = last_observation(server, 1)
    assert result.accepted, result.reason
    assert "outcome timeout" in seen and "collect's timeout of 1 s" in seen


@pytest.fixture
def outside_tmp(ws: Path) -> Iterator[tuple[Path, Path]]:
    """A workspace (with the ``ws`` fixture's files) and a record outside every folder that
    is hidden from all kernels anyway (/tmp, the records home): only there does a test show
    that what a sub-task is kept from is kept from it by its own hiding."""
    confinement = probe(None)
    if not confinement.active:
        pytest.skip(f"LOUD SKIP: no Landlock here ({confinement.reason}); a child's raw "
                    f"reads and writes outside its folder cannot be stopped without it")
    root = Path(tempfile.mkdtemp(prefix="hk-test-", dir=Path.home()))
    try:
        if any(str(root).startswith(h.rstrip("/") + "/") for h in hidden_paths()):
            pytest.skip(f"LOUD SKIP: {root} is hidden from every kernel already")
        shutil.copytree(ws, root / "ws")
        yield root / "ws", root / "record"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _fence(outside: list[str]) -> str:
    """A cell that tries to open each path for reading and for appending."""
    return (f"for path in {outside!r}:\n"
            "    for how in ('r', 'a'):\n"
            "        try:\n"
            "            open(path, how).close()\n"
            "            print('OPENED', how, path)\n"
            "        except OSError as exc:\n"
            "            print('refused', how, type(exc).__name__)\n")


def test_a_child_reaches_only_its_own_folder(outside_tmp: tuple[Path, Path]) -> None:
    """The child works on copies in a folder of the parent's record: it can neither write
    nor read the parent's workspace or record, and nothing it does changes them."""
    ws, record = outside_tmp
    (ws / "given").mkdir()
    (ws / "given" / "in.txt").write_text("input\n")
    outside = [str(ws / "data" / "a.csv"), str(ws / "escape.txt"),
               str(record / "ledger.sqlite"), str(record / "record.key")]
    child = fence(
        _fence(outside) +
        "try:\n    host.write_file('../escape2.txt', 'x')\n"
        "except Exception as exc:\n    print('host refused', type(exc).__name__)\n"
        "try:\n    host.delegate('SUBTASK-GRANDCHILD: nested')\n"
        "except Exception as exc:\n    print('nested refused', exc)\n"
        "text = open('given/in.txt').read()\nopen('given/in.txt', 'w').write('changed')\n"
        "open('out.txt', 'w').write(text.upper())\nprint('wrote out.txt')")
    parent = fence("h = host.delegate('SUBTASK-FENCED: try to escape', inputs=['given'])\n"
                   "r = host.collect(h, timeout=120)\nprint(r.outcome)")
    with ScriptedLLMServer([text(parent), finalize("fenced")],
                           routes={"SUBTASK-FENCED": [text(child), finalize("tried")]}) as server:
        result = run(server, ws, "delegate to a fenced child", record_dir=record)
        child_saw = str([b for b in turns(server) if "SUBTASK-FENCED" in task_of(b)][-1][
            "messages"][-1]["content"])
    assert result.accepted, result.reason
    assert "OPENED" not in child_saw, child_saw
    assert child_saw.count("refused r PermissionError") == 3, child_saw  # escape.txt: absent
    assert child_saw.count("refused a PermissionError") == 4, child_saw
    assert "host refused PathRefused" in child_saw
    assert "nested refused" in child_saw and "delegation_refused" in child_saw
    assert "wrote out.txt" in child_saw
    assert not (ws / "escape.txt").exists() and not (ws / "escape2.txt").exists()
    assert (ws / "data" / "a.csv").read_text() == "x\n1\n2\n"
    assert (ws / "given" / "in.txt").read_text() == "input\n"  # the child changed its copy
    assert not (ws / "given" / "out.txt").exists()
    (started,) = [b for k, b in subtask_rows(result.record_dir) if k == "subtask_started"]
    folder = Path(started["folder"])
    assert folder.parent.parent == result.record_dir / "subtasks"
    assert (folder / "out.txt").read_text() == "INPUT\n"
    assert started["inputs"] == [{"from": "given/in.txt", "path": "given/in.txt",
                                  "sha256": started["inputs"][0]["sha256"], "size": 6}]


def test_a_grandchild_is_kept_from_every_ancestor(outside_tmp: tuple[Path, Path]) -> None:
    """Each level hides what its parent hid too: a grandchild cannot read the top
    session's workspace or record, nor its parent's."""
    ws, record = outside_tmp
    outside = [str(ws / "data" / "a.csv"), str(record / "ledger.sqlite"),
               str(record / "record.key")]
    grandchild = [text(fence(_fence(outside))), finalize("looked")]
    child = [text(fence("r = host.collect(host.delegate('GRANDTASK: look around'), "
                        "timeout=120)\nprint(r.outcome)")), finalize("delegated")]
    parent = fence("r = host.collect(host.delegate('CHILDTASK: delegate once more'), "
                   "timeout=240)\nprint(r.outcome)")
    with ScriptedLLMServer([text(parent), finalize("done")],
                           routes={"GRANDTASK": grandchild, "CHILDTASK": child}) as server:
        result = run(server, ws, "two levels down", record_dir=record,
                     delegation=DelegationConfig(max_depth=2))
        saw = str([b for b in turns(server) if "GRANDTASK" in task_of(b)][-1][
            "messages"][-1]["content"])
    assert result.accepted, result.reason
    assert "OPENED" not in saw, saw
    assert saw.count("refused r PermissionError") == 3, saw
    assert saw.count("refused a PermissionError") == 3, saw


def test_concurrency_is_bounded(ws: Path) -> None:
    parent = fence(
        "hs = [host.delegate(f'SUBTASK-{n}: sum', inputs=[f'data/{n.lower()}.csv'])"
        " for n in ('A', 'B')]\n"
        "print([host.collect(h, timeout=120).outcome for h in hs])")
    routes = {"SUBTASK-A": summing_child("data/a.csv"),
              "SUBTASK-B": summing_child("data/b.csv")}
    with ScriptedLLMServer([text(parent), finalize("both")], routes=routes) as server:
        result = run(server, ws, "two sub-tasks, one at a time",
                     delegation=DelegationConfig(max_concurrent=1))
        order = [("A" if "SUBTASK-A" in task_of(b) else "B" if "SUBTASK-B" in task_of(b)
                  else "P") for b in turns(server)]
    assert result.accepted, result.reason
    children = [o for o in order if o != "P"]
    assert children in (["A", "A", "B", "B"], ["B", "B", "A", "A"])  # never interleaved


def test_delegation_outside_an_agent_session_and_bad_arguments_are_refused(
        ws: Path) -> None:
    with Host(ws) as host:
        obs = host.execute("host.delegate('x')")
        assert obs.status == "error" and "delegation_unavailable" in obs.text
    parent = fence(
        "for args in [dict(task=''), dict(task='t', inputs=['../outside.csv']),"
        " dict(task='t', inputs='data/a.csv', folder='.'), dict(task='t', timeout=-1),"
        " dict(task='t', mode='no_such_mode')]:\n"
        "    try:\n        host.delegate(**args)\n        print('ACCEPTED', args)\n"
        "    except Exception as exc:\n        print(type(exc).__name__, exc)\n"
        "try:\n    host.collect('st-nothing')\nexcept Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        # A result made up in the kernel names a child artifact no sub-task gave: the Host
        # loads only artifacts of this session or of a sub-task it collected itself.
        "from host_kernel.kernel.client import SubtaskResult\n"
        "fake = SubtaskResult.from_dict({'handle': 'st-00000000', 'outcome': 'accepted', "
        "'accepted': True, 'artifacts': [{'artifact_id': '0e4b6c1e-0000-4000-8000-"
        "000000000000'}]}, host)\n"
        "try:\n    fake.load(fake.artifacts[0]['artifact_id'])\nexcept Exception as exc:\n"
        "    print('forged', type(exc).__name__, exc.code)")
    with ScriptedLLMServer([text(parent), finalize("refused")]) as server:
        result = run(server, ws, "bad delegations", delegation=DelegationConfig(max_depth=1))
        seen = last_observation(server, 1)
    assert result.accepted and "ACCEPTED" not in seen, seen
    assert seen.count("BadArguments") == 5 and seen.count("PathRefused [path_refused]") == 1, seen
    assert "forged FileProblem file_problem" in seen, seen
    assert not subtask_rows(result.record_dir)
    with ScriptedLLMServer([text(fence("host.delegate('SUBTASK-X: x')")), finalize("no")]) \
            as server:
        result = run(server, ws, "depth zero", delegation=DelegationConfig(max_depth=0))
        assert "delegation_refused" in last_observation(server, 1)


def test_a_session_may_start_only_so_many_subtasks(ws: Path) -> None:
    parent = fence(
        "one = host.delegate('SUBTASK-ONE: say one')\n"
        "try:\n    host.delegate('SUBTASK-TWO: say two')\nexcept Exception as exc:\n"
        "    print(type(exc).__name__, exc)\nprint(host.collect(one, timeout=120).outcome)")
    with ScriptedLLMServer([text(parent), finalize("one only")],
                           routes={"SUBTASK-ONE": [finalize("one")]}) as server:
        result = run(server, ws, "two sub-tasks with room for one",
                     delegation=DelegationConfig(max_total=1))
        seen = last_observation(server, 1)
    assert result.accepted, result.reason
    assert "CallRefused [delegation_refused]" in seen and "already started 1 sub-tasks" in seen
    assert seen.rstrip().endswith("accepted")


def test_the_dataflow_provenance_prompt_gets_collected_results_as_candidates(
        ws: Path) -> None:
    """A Host with an LLM asks the dataflow-provenance prompt which inputs flowed into
    an artifact; a sub-task collected in the cell is one of the candidates, and the
    answer keeping it keeps the sub-task in the artifact's lineage."""
    from host_kernel.agent.delegation import Delegator
    from host_kernel.llm import LLMClient, LLMConfig

    def provenance(request: Any) -> dict[str, Any]:
        prompt = json.dumps(request.json()["messages"])
        handles = sorted(set(re.findall(r"subtask:st-[0-9a-f]{8}", prompt)))
        assert len(handles) == 1, prompt
        return text(json.dumps(handles))

    # The provenance prompt shows the cell's code, task text included: the child is told
    # apart by its workspace, which only its own environment block names.
    child = {"/subtasks/st-": [finalize("seven")]}
    with ScriptedLLMServer([provenance], routes=child) as server, \
            LLMClient(LLMConfig(server.base_url, "m")) as llm:
        delegator = Delegator(llm, DelegationConfig())
        with Host(ws, delegator=delegator, llm=llm) as host:
            delegator.attach(host)
            obs = host.execute(
                "r = host.collect(host.delegate('SUBTASK-P: say seven'), timeout=120)\n"
                "host.write_file('seven.txt', str(r.output))\n"
                "a = host.save_artifact('seven.txt')\nprint(a.artifact_id)")
            assert obs.status == "ok", obs.text
            artifact_id = obs.text.strip().splitlines()[-1]
            record = host.record_dir
        delegator.shutdown()
    graph = record_lineage(record, artifact_id)
    (subtask,) = [n for n in graph.nodes if n.kind == "subtask"]
    (edge,) = [e for e in graph.edges if e.dst == subtask.id and e.relation == "wasDerivedFrom"]
    assert edge.method == "llm-confirmed"


def test_closing_the_host_cuts_its_running_subtasks(ws: Path) -> None:
    """A Host given a delegator (the Python API) ends its children when it closes: each
    child's record is closed and no thread or kernel of theirs is left."""
    from host_kernel.agent.delegation import Delegator
    from host_kernel.llm import LLMClient, LLMConfig

    hang = [text(fence("import time\ntime.sleep(600)"))]
    with ScriptedLLMServer([], routes={"/subtasks/st-": hang}) as server, \
            LLMClient(LLMConfig(server.base_url, "m")) as llm:
        delegator = Delegator(llm, DelegationConfig())
        host = Host(ws, delegator=delegator).start()
        delegator.attach(host)
        obs = host.execute("h = host.delegate('wait forever')\nprint(h.handle)")
        assert obs.status == "ok", obs.text
        handle = obs.text.strip()
        wait_for(lambda: server.requests, 60, "the child to ask its model")
        t0 = time.monotonic()
        host.close()
        assert time.monotonic() - t0 < 60
    child = delegator._children[handle]
    assert child.done.is_set() and child.outcome == "timeout"
    assert not [t for t in threading.enumerate() if t.name.startswith("subtask-")]
    (started,) = [b for k, b in subtask_rows(host.record_dir) if k == "subtask_started"]
    with SQLiteLedger(Path(started["record_dir"]) / "ledger.sqlite") as ledger:
        assert ledger.query("SELECT count(*) FROM sessions WHERE ended IS NULL")[0][0] == 0
