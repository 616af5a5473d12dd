"""``host-kernel batch`` and run_batch: many sessions on a real Dask LocalCluster.

Real worker processes, real Hosts and confined kernels, the tests' scripted
OpenAI-compatible server on 127.0.0.1 for the agent tasks, and the suite's real
PostgreSQL server for the shared ledger. One two-worker cluster serves the module;
the CLI tests start their own where they test that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from _agent import fence, finalize, text
from _helpers import PROXIES, batch_cluster, descendants
from distributed import Client
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from scripted_llm import RecordedRequest, ScriptedLLMServer

from host_kernel.audit import audit, audit_ledger
from host_kernel.batch import (
    BatchResult,
    Settings,
    Task,
    TaskInvalid,
    TaskSummary,
    load_tasks,
    run_batch,
    run_task,
)
from host_kernel.cli import main
from host_kernel.llm import LLMConfig
from host_kernel.sandbox.client import probe
from host_kernel.store.pg import PostgresLedger

REPO = Path(__file__).resolve().parent.parent
#: What every session's confinement is here: Landlock where the machine has it.
CONFINED = "landlock" if probe(None).active else "none"


# ---------------------------------------------------------------------- helpers


def write_notebook(path: Path, n: int, *, fail: bool = False, sleep: float = 0.0,
                   submit: bool = True) -> Path:
    """A small notebook: it reads an input beside it, writes a file through the Host,
    saves it as an artifact and (``submit``) submits its rows."""
    cells = [new_markdown_cell(f"# notebook {n}"),
             new_code_cell(f"base = int(open('base.txt').read())\nrows = [base, {n}, {n} ** 2]"),
             new_code_cell("host.write_file('out/rows.csv', 'n\\n' + ''.join(f'{r}\\n' "
                           "for r in rows))"),
             new_code_cell("a = host.save_artifact('out/rows.csv')\nprint(a.sha256)")]
    if sleep:
        cells.insert(1, new_code_cell(f"host.write_file('started.txt', 'yes')\n"
                                      f"import time\ntime.sleep({sleep})"))
    if submit:
        cells.append(new_code_cell("host.submit_output({'rows': rows}, "
                                   "[f'wrote {len(rows)} rows to out/rows.csv'])"))
    if fail:
        cells.append(new_code_cell("raise ValueError('this notebook fails on purpose')"))
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "base.txt").write_text("7\n")
    nbformat.write(new_notebook(cells=cells), path)
    return path


def agent_reply(request: RecordedRequest) -> dict[str, Any]:
    """The scripted model of every agent task, deciding from the conversation alone (so a
    rerun gets the same replies): first a cell that writes and saves k squared, then
    finalize_response."""
    messages = request.json()["messages"]
    first = next(str(m["content"]) for m in messages if m["role"] == "user")
    found = re.search(r"TASK-(\d+)", first)
    assert found is not None, first
    k = int(found.group(1))
    if not any(m["role"] == "assistant" for m in messages):
        return text(fence(f"host.write_file('square.txt', str({k} ** 2))\n"
                          f"print(host.save_artifact('square.txt').sha256)"))
    return finalize(f"{k} squared is {k * k}, in square.txt")


def llm_config(server: ScriptedLLMServer) -> LLMConfig:
    return LLMConfig(server.base_url, "scripted", timeout=30.0, max_retries=2, backoff=0.001)


def working_in(folder: Path) -> list[int]:
    """Processes whose current directory lies in ``folder`` (a kernel in its workspace)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd == str(folder) or cwd.startswith(f"{folder}/"):
                found.append(int(entry))
    return found


def failures(result: BatchResult) -> list[tuple[str, str, str, str | None]]:
    return [(s.name, s.outcome, s.detail, s.error) for s in result.failed]


def warm_sessions(events: Any) -> dict[str, bool]:
    """Whether each session's first kernel came from its worker's pool."""
    warm: dict[str, bool] = {}
    for event in events:
        if event.kind == "generation_started" and event.session not in warm:
            warm[event.session] = bool((event.body.get("warm") or {}).get("used"))
    return warm


# ---------------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def worker_processes() -> Iterator[None]:
    """Starting worker processes starts multiprocessing's resource tracker, which otherwise
    lives as long as this process (and the suite counts it as a leftover): stopped at the
    end of the module when the module started it."""
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    tracking = getattr(tracker, "_fd", None) is not None
    try:
        yield
    finally:
        if not tracking:
            tracker._stop()


@pytest.fixture(scope="module")
def client(worker_processes: None) -> Iterator[Client]:
    """A two-worker LocalCluster for the module; its workers' temp folder is its own, so
    the runtime folder of a Host killed with its worker is removed with it."""
    with batch_cluster("hkb-", stop_tracker=False) as c:
        yield c


# ---------------------------------------------------------------------- (a) the batch


def test_twenty_notebooks_and_ten_agent_tasks_on_two_workers_all_accepted_in_one_ledger(
        client: Client, tmp_path: Path, pg_url: str) -> None:
    notebooks = [write_notebook(tmp_path / "nbs" / f"nb{n:02d}.ipynb", n) for n in range(20)]
    tasks = [Task.notebook(p) for p in notebooks] + [
        Task.agent(f"TASK-{k}: write {k} squared to square.txt and save it as an artifact")
        for k in range(10)]
    blobs = tmp_path / "blobs"
    seen: list[TaskSummary] = []
    with ScriptedLLMServer([agent_reply] * 40) as server:
        result = run_batch(tasks, scheduler=client, ledger=pg_url, blobs=f"file://{blobs}",
                           llm=llm_config(server), workspaces=tmp_path / "ws",
                           on_result=seen.append)

    assert result.accepted, failures(result)
    assert [s.name for s in result.summaries] == [f"nb{n:02d}" for n in range(20)] + [
        f"agent-{k}" for k in range(1, 11)]
    assert sorted(s.name for s in seen) == sorted(s.name for s in result.summaries)
    sessions = [s.session_id for s in result.summaries]
    assert None not in sessions and len(set(sessions)) == 30
    assert {s.worker for s in result.summaries} == set(client.scheduler_info()["workers"])
    assert {s.record for s in result.summaries} == {pg_url}
    assert {s.confinement for s in result.summaries} == {CONFINED}
    assert all(s.attempt == 1 and not s.abandoned for s in result.summaries)
    for s in result.summaries:
        assert s.verdict is not None and s.verdict.accepted, s
        (artifact,) = s.artifacts
        assert artifact.filename == ("rows.csv" if s.kind == "notebook" else "square.txt")
        sha = artifact.sha256
        assert (blobs / "blobs" / "sha256" / sha[:2] / sha).is_file()
        assert Path(s.workspace or "").name == "attempt-1"

    # One ledger holds all thirty sessions; its audit of them is clean.
    report = audit_ledger(pg_url, sessions=[str(s) for s in sessions],
                          blobs=f"file://{blobs}")
    assert report.clean, [str(f) for f in report.findings]
    assert report.artifacts == 30 and report.submissions == 30
    with PostgresLedger.open_readonly(pg_url) as ledger:
        warm = warm_sessions(ledger.events())
        # Each summary's head is its session's last event, as a reviewer holds it to.
        for s in result.summaries:
            assert s.session_id is not None
            assert s.head == ledger.query("SELECT hash FROM events WHERE session = ? ORDER "
                                          "BY n DESC LIMIT 1", (s.session_id,))[0][0]
    assert set(warm) == set(sessions)
    assert sum(warm.values()) >= 20, warm  # sessions start from their worker's standby


# ---------------------------------------------------------------------- (b) a worker dies


def test_a_worker_killed_mid_task_its_task_reruns_as_a_new_session_and_the_batch_completes(
        client: Client, tmp_path: Path, pg_url: str) -> None:
    notebooks = [write_notebook(tmp_path / "nbs" / f"quick{n}.ipynb", n) for n in range(5)]
    slow = write_notebook(tmp_path / "nbs" / "slow.ipynb", 99, sleep=5)
    workspaces, blobs = tmp_path / "ws", f"file://{tmp_path / 'blobs'}"
    started = workspaces / "slow" / "attempt-1" / "started.txt"
    killed: list[int] = []

    def kill_the_slow_tasks_worker() -> None:
        deadline = time.monotonic() + 90
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        running = [a for a, keys in client.processing().items()
                   if any(str(k).endswith("-slow") for k in keys)]
        if started.exists() and running:
            pid = client.run(os.getpid, workers=running)[running[0]]
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)  # that worker process only

    killer = threading.Thread(target=kill_the_slow_tasks_worker)
    killer.start()
    try:
        result = run_batch([Task.notebook(slow), *map(Task.notebook, notebooks)],
                           scheduler=client, workspaces=workspaces, ledger=pg_url, blobs=blobs)
    finally:
        killer.join()

    assert killed, "the slow task's worker was not found running it"
    assert result.accepted, failures(result)
    rerun = result.summaries[0]
    assert rerun.name == "slow" and rerun.attempt == 2 and result.reruns >= 1
    # The dead attempt's session is named, never reused: the rerun is a new session in a
    # new workspace.
    status = json.loads((workspaces / "slow" / "attempt-1.json").read_text())
    assert status["state"] == "running"
    dead = status["session"]
    assert rerun.abandoned == (dead,) and rerun.session_id != dead
    assert rerun.workspace == str(workspaces / "slow" / "attempt-2")
    # Nothing of the dead attempt runs on: its kernel went with its worker.
    deadline = time.monotonic() + 10
    while working_in(workspaces / "slow" / "attempt-1") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert working_in(workspaces / "slow" / "attempt-1") == []
    # The ledger's housekeeping closed the half-written session (a later Host found its
    # Host gone); every session of the batch, that one too, audits clean.
    with PostgresLedger.open_readonly(pg_url) as ledger:
        ends = [e for e in ledger.events(dead) if e.kind == "session_ended"]
        sessions = ledger.sessions()
    assert [e.body.get("reason") for e in ends] == ["host_died"]
    assert ends[0].body.get("recovered_by") in {s.session_id for s in result.summaries}
    assert set(sessions) == {s.session_id for s in result.summaries} | {dead}
    report = audit_ledger(pg_url, blobs=blobs)
    assert report.clean, [str(f) for f in report.findings]
    # The cluster carries on: the nanny started a new worker in the dead one's place.
    client.wait_for_workers(2, timeout=60)


def test_a_task_whose_worker_dies_more_often_than_retries_allow_is_an_error(
        worker_processes: None, tmp_path: Path) -> None:
    """run_batch's own LocalCluster, retries=0: the killed task is lost, the others run."""
    slow = write_notebook(tmp_path / "nbs" / "slow.ipynb", 1, sleep=5)
    quick = write_notebook(tmp_path / "nbs" / "quick.ipynb", 2)
    status = tmp_path / "ws" / "slow" / "attempt-1.json"
    started = tmp_path / "ws" / "slow" / "attempt-1" / "started.txt"

    def kill_its_worker() -> None:
        deadline = time.monotonic() + 90
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if started.exists():
            os.kill(json.loads(status.read_text())["pid"], signal.SIGKILL)

    killer = threading.Thread(target=kill_its_worker)
    killer.start()
    try:
        result = run_batch([Task.notebook(slow), Task.notebook(quick)], workers=1, retries=0,
                           workspaces=tmp_path / "ws", records=tmp_path / "records")
    finally:
        killer.join()
    lost, done = result.summaries
    assert (lost.name, lost.outcome, lost.attempt) == ("slow", "error", 1), lost
    assert lost.error == "its worker died in each of 1 attempts"
    assert lost.abandoned == (json.loads(status.read_text())["session"],)
    assert done.accepted and not result.accepted and result.counts()["error"] == 1


def test_a_rerun_of_a_finished_attempt_returns_its_summary_instead_of_a_new_session(
        tmp_path: Path) -> None:
    """The result died with its worker, not the session: the rerun reads the summary the
    finished attempt left beside its workspace."""
    nb = write_notebook(tmp_path / "nbs" / "once.ipynb", 1, submit=False)
    settings = Settings(str(tmp_path / "ws"), str(tmp_path / "records"), batch="b1",
                        secret=os.urandom(32))
    task = Task("notebook", str(nb), name="once")
    first = run_task(task, settings)
    assert first.outcome == "ran" and first.ok and not first.accepted, first
    assert first.attempt == 1 and first.detail == "3 cells ok, no submission"
    assert run_task(task, settings) == first
    assert sorted(p.name for p in (tmp_path / "ws" / "once").iterdir()) == [
        "attempt-1", "attempt-1.json"]


def test_an_attempt_that_never_finished_is_named_and_the_next_one_starts_fresh(
        tmp_path: Path) -> None:
    nb = write_notebook(tmp_path / "nbs" / "again.ipynb", 2, submit=False)
    folder = tmp_path / "ws" / "again"
    (folder / "attempt-1").mkdir(parents=True)
    (folder / "attempt-1" / "half.txt").write_text("left by a dead attempt")
    (folder / "attempt-1.json").write_text(json.dumps({"state": "running",
                                                       "session": "dead-session"}))
    summary = run_task(Task("notebook", str(nb), name="again"),
                       Settings(str(tmp_path / "ws"), str(tmp_path / "records")))
    assert summary.outcome == "ran" and summary.attempt == 2
    assert summary.abandoned == ("dead-session",)
    assert not (folder / "attempt-2" / "half.txt").exists()
    assert (folder / "attempt-2" / "again.ipynb").is_file()


# ---------------------------------------------------------------------- (c) the command


def test_the_command_on_a_local_cluster_prints_a_json_line_per_task_and_exits_0(
        tmp_path: Path) -> None:
    """Three notebooks, one of which submits nothing (``ran``, not ``accepted``), each
    recorded in a record folder named after its task; Dask's scratch folders are not left
    in $TMPDIR; and ``--resume`` skips all three, as done."""
    for n in range(3):
        write_notebook(tmp_path / "nbs" / f"nb{n}.ipynb", n, submit=n != 2)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k not in PROXIES}, "TMPDIR": str(scratch)}
    proc = subprocess.run(
        [sys.executable, "-m", "host_kernel", "batch", str(tmp_path / "nbs"), "--json",
         "--workers", "2", "--workspaces", str(tmp_path / "ws")],
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["type"] for line in lines] == ["task"] * 3 + ["batch"]
    by_name = {line["name"]: line for line in lines[:3]}
    assert sorted(by_name) == ["nb0", "nb1", "nb2"]
    assert all(line["confinement"] == CONFINED for line in lines[:3])
    assert [by_name[n]["outcome"] for n in ("nb0", "nb1", "nb2")] == ["accepted", "accepted",
                                                                     "ran"]
    assert by_name["nb2"]["detail"] == "3 cells ok, no submission"
    assert (lines[3]["accepted"], lines[3]["ran"], lines[3]["tasks"], lines[3]["workers"]) == (
        2, 1, 3, 2)
    for line in lines[:3]:
        assert audit(line["record"]).clean
        assert Path(line["record"]).name.startswith(f"{line['name']}-attempt-1-"), line
        assert TaskSummary.from_dict(line).to_dict() == {
            k: v for k, v in line.items() if k != "type"}
    assert not (scratch / "dask-scratch-space").exists(), sorted(os.listdir(scratch))
    assert not list(scratch.glob("hk-dask-*")), sorted(os.listdir(scratch))

    again = subprocess.run(
        [sys.executable, "-m", "host_kernel", "batch", "--resume", str(tmp_path / "ws"),
         "--workers", "1"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env, check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    rows = {line.split()[0]: line for line in again.stdout.splitlines()
            if line.split()[:1] in (["nb0"], ["nb1"], ["nb2"])}
    assert re.search(r"^nb2\s+notebook\s+ran\s+1\s.*skipped: ran in session", rows["nb2"]), \
        again.stdout
    assert re.search(r"^nb0\s+notebook\s+accepted\s+1\s", rows["nb0"]), again.stdout
    assert "2 accepted, 1 ran (no submission), 0 failed, 0 errors; 3 skipped (done " \
        "earlier)" in again.stdout, again.stdout
    assert not (scratch / "dask-scratch-space").exists()


@contextlib.contextmanager
def tls_of(client: Client) -> Iterator[None]:
    """Dask's configuration holding the module cluster's TLS certificates, as a user's
    ~/.config/dask would hold their cluster's: how `--scheduler tls://…` connects."""
    import dask

    security = client.cluster.security
    with dask.config.set({"distributed.comm.require-encryption": True,
                          "distributed.comm.tls.ca-file": security.tls_ca_file,
                          "distributed.comm.tls.client.cert": security.tls_client_cert,
                          "distributed.comm.tls.client.key": security.tls_client_key}):
        yield


def test_a_failing_notebook_makes_the_command_exit_1_and_the_table_names_it(
        client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write_notebook(tmp_path / "nbs" / "good.ipynb", 1)
    bad = write_notebook(tmp_path / "nbs" / "bad.ipynb", 2, fail=True)
    address = client.scheduler.address
    with tls_of(client):
        code = main(["batch", str(good), str(bad), "--scheduler", address, "--workspaces",
                     str(tmp_path / "ws")])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] in (
        ["good"], ["bad"])}
    assert re.search(r"^bad\s+notebook\s+failed\s+1\s.*cell 6: error", rows["bad"]), out
    assert re.search(r"^good\s+notebook\s+accepted\s+1\s", rows["good"]), out
    assert "1 accepted, 1 failed, 0 errors" in out


def test_a_task_file_mixes_notebooks_and_agent_tasks(
        client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_notebook(tmp_path / "job" / "nb.ipynb", 3)
    (tmp_path / "job" / "data.csv").write_text("x\n1\n")
    tasks = tmp_path / "job" / "tasks.jsonl"
    tasks.write_text("# one notebook, one agent task\n"
                     '{"notebook": "nb.ipynb", "name": "the-notebook"}\n\n'
                     '{"task": "TASK-5: square five", "inputs": ["data.csv"], '
                     '"mode": "analysis-run"}\n')
    with ScriptedLLMServer([agent_reply] * 4) as server, tls_of(client):
        code = main(["batch", "--tasks", str(tasks), "--scheduler", client.scheduler.address,
                     "--workspaces", str(tmp_path / "ws"), "--base-url", server.base_url,
                     "--model", "scripted", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    lines = {line["name"]: line for line in map(json.loads, out.splitlines())
             if line["type"] == "task"}
    assert set(lines) == {"the-notebook", "agent-1"}
    assert lines["agent-1"]["kind"] == "agent" and lines["agent-1"]["outcome"] == "accepted"
    workspace = Path(lines["agent-1"]["workspace"])
    assert (workspace / "data.csv").read_text() == "x\n1\n"
    assert (workspace / "square.txt").read_text() == "25"


# ---------------------------------------------------------------------- (d) bad input


def test_task_files_are_read_as_json_lines_or_a_json_list(tmp_path: Path) -> None:
    (tmp_path / "a.ipynb").write_text("{}")
    lines = tmp_path / "t.jsonl"
    lines.write_text('{"notebook": "a.ipynb", "inputs": ["d"]}\n{"task": "do it"}\n')
    listed = tmp_path / "t.json"
    listed.write_text(json.dumps([{"notebook": "a.ipynb", "inputs": ["d"]},
                                  {"task": "do it", "kind": "agent"}]))
    expected = [Task("notebook", str(tmp_path / "a.ipynb"), (str(tmp_path / "d"),)),
                Task("agent", "do it")]
    assert load_tasks(lines) == expected and load_tasks(listed) == expected


@pytest.mark.parametrize(("content", "says"), [
    ('{"notebook": "a.ipynb"}\nnot json\n', "line 2 is not JSON"),
    ('{"notebook": "a.ipynb", "task": "x"}\n', "one of them"),
    ('{"task": "x", "model": "m"}\n', "unknown key 'model'"),
    ('{"task": ""}\n', "task must be a non-empty string"),
    ('[{"task": "x", "inputs": "d"}]', "entry 1: inputs must be a list of paths"),
    ("\n# nothing\n", "holds no task"),
])
def test_a_bad_task_file_is_refused_naming_the_line(tmp_path: Path, content: str,
                                                    says: str) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(content)
    with pytest.raises(TaskInvalid, match=re.escape(says)):
        load_tasks(path)


def test_bad_input_to_the_command_is_one_error_line_and_starts_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write_notebook(tmp_path / "good.ipynb", 1)
    (tmp_path / "bad.jsonl").write_text('{"notebook": "good.ipynb"}\n{oops\n')
    (tmp_path / "agents.jsonl").write_text('{"task": "TASK-1"}\n')
    (tmp_path / "empty").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"tcp://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening
        before = descendants(os.getpid())
        cases = [
            (["batch", str(tmp_path / "absent.ipynb")], 2, "no such file"),
            (["batch", str(tmp_path / "empty")], 2, "no notebooks (*.ipynb) in"),
            (["batch"], 2, "give notebooks, folders of notebooks, or --tasks FILE"),
            (["batch", "--tasks", str(tmp_path / "bad.jsonl")], 2, "line 2 is not JSON"),
            (["batch", "--tasks", str(tmp_path / "agents.jsonl")], 2,
             "agent tasks need --base-url and --model"),
            (["batch", str(good), "--workers", "0"], 2, "--workers must be at least 1"),
            (["batch", str(good), "--workers", "2", "--scheduler", nobody], 2,
             "--workers sizes the local cluster"),
            (["batch", str(good), "--retries", "1", "--scheduler", nobody], 2,
             "distributed.scheduler.allowed-failures decides"),
            (["batch", str(good), "--mode", "nonsense"], 2, "nonsense"),
            (["batch", str(good), "--ledger", "sqlite:///x"], 2, "postgresql:// URL"),
            (["batch", str(good), "--scheduler", nobody, "--connect-timeout", "1",
              "--workspaces", str(tmp_path / "ws")], 1,
             f"no Dask scheduler answered at {nobody}"),
        ]
        for argv, exit_code, says in cases:
            code = main(argv)
            out, err = capsys.readouterr()
            assert code == exit_code, (argv, out, err)
            assert "Traceback" not in err
            assert err.startswith("host-kernel batch: error: ") or err.startswith("usage:"), err
            assert says in err, (argv, err)
            assert out == ""
        assert descendants(os.getpid()) - before == set()
    assert not (tmp_path / "ws").exists() or not any((tmp_path / "ws").iterdir())


def test_the_api_refuses_tasks_that_cannot_run_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(TaskInvalid, match="no such file"):
        run_batch([Task.notebook(tmp_path / "absent.ipynb")])
    with pytest.raises(TaskInvalid, match="agent tasks need llm="):
        run_batch([Task.agent("do something")])
    with pytest.raises(TaskInvalid, match="no such input"):
        run_batch([Task.agent("x", inputs=[tmp_path / "nothing"])], llm=LLMConfig(
            "http://127.0.0.1:9/v1", "m"))
    with pytest.raises(TaskInvalid, match="no tasks"):
        run_batch([])
    nb = write_notebook(tmp_path / "nbs" / "again.ipynb", 1)
    (tmp_path / "ws" / "again").mkdir(parents=True)
    with pytest.raises(TaskInvalid, match="holds workspaces of an earlier batch already"):
        run_batch([Task.notebook(nb)], workspaces=tmp_path / "ws")


def test_the_local_cluster_listens_on_loopback_only_and_speaks_only_tls(client: Client) -> None:
    """A kernel on this machine can reach loopback ports; a Dask client runs any code on
    the workers. The cluster takes only clients holding its in-memory certificates."""
    cluster = client.cluster
    assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
    assert cluster.dashboard_link.startswith("http://127.0.0.1:")
    assert ":8787/" not in cluster.dashboard_link
    assert all(addr.startswith("tls://127.0.0.1:") for addr in client.scheduler_info()["workers"])
    # The cluster's own client certificate gets through (so the refusals below are TLS's).
    _handshake(cluster.scheduler_address,
               ssl_context=cluster.security.get_connection_args("client")["ssl_context"])
    # A TLS client without a certificate, as a kernel's would be (it trusts any server).
    anyone = ssl.create_default_context()
    anyone.check_hostname, anyone.verify_mode = False, ssl.CERT_NONE
    with pytest.raises((OSError, TimeoutError)):
        _handshake(cluster.scheduler_address, ssl_context=anyone)
    with pytest.raises((OSError, TimeoutError)):
        _handshake(cluster.scheduler_address.replace("tls://", "tcp://"))


def _handshake(address: str, **connection_args: Any) -> None:
    """Dask's own connect (its handshake included) to ``address``, on an event loop of
    its own: a blocking Client would first start an IO thread, which Dask gives 10 s and
    a loaded machine can fail (an AssertionError) before any connection is tried."""
    from distributed.comm import connect

    async def attempt() -> None:
        comm = await connect(address, timeout=5, **connection_args)
        await comm.close()

    asyncio.run(attempt())


def test_a_tasks_kernel_reaches_no_other_tasks_workspace_or_status(client: Client) -> None:
    """Workspaces outside /tmp (which every kernel is kept from anyway): the second
    batch's kernel can read neither the first task's files nor its signed status."""
    root = Path(tempfile.mkdtemp(dir=Path.home(), prefix=".hk-batch-test-"))
    try:
        first = write_notebook(root / "nbs" / "first.ipynb", 1)
        done = run_batch([Task.notebook(first)], scheduler=client, workspaces=root / "ws")
        assert done.accepted, failures(done)
        secret = root / "ws" / "first" / "attempt-1" / "first.ipynb"
        status = root / "ws" / "first" / "attempt-1.json"
        assert secret.is_file() and status.is_file()
        probe = root / "probe" / "probe.ipynb"
        probe.parent.mkdir()
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
            "for p in (%r, %r):\n"
            "    try:\n"
            "        open(p).read()\n"
            "    except PermissionError:\n"
            "        continue\n"
            "    raise SystemExit('read ' + p)\n"
            "try:\n"
            "    open(%r, 'w').write('{}')\n"
            "except PermissionError:\n"
            "    pass\n"
            "else:\n"
            "    raise SystemExit('wrote the status file')\n" % (str(secret), str(status),
                                                               str(status)))]), probe)
        second = run_batch([Task.notebook(probe)], scheduler=client, workspaces=root / "ws")
        (summary,) = second.summaries
        if summary.confinement != CONFINED:
            pytest.skip(f"NO CONFINEMENT HERE: {summary.confinement}")
        assert summary.ok, failures(second)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_finished_status_is_reused_only_when_its_batch_signed_it(tmp_path: Path) -> None:
    from host_kernel.batch import _claim, _signature

    folder = tmp_path / "task"
    (folder / "attempt-1").mkdir(parents=True)
    summary = TaskSummary("task", "notebook", "accepted", session_id="s").to_dict()
    secret = os.urandom(32)
    forged = {"state": "finished", "batch": "b", "summary": summary, "mac": "0" * 64}
    (folder / "attempt-1.json").write_text(json.dumps(forged))
    n, _, reused, _ = _claim(folder, "b", secret)
    assert reused is None and n == 2  # not this batch's: a new attempt is claimed
    signed = {**forged, "mac": _signature(secret, summary)}
    (folder / "attempt-1.json").write_text(json.dumps(signed))
    n, _, reused, _ = _claim(folder, "b", secret)
    assert n == 1 and reused is not None and reused.accepted
