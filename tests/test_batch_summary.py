"""A batch's summary is its record's word: accepted work is never misreported or rerun,
and a task not accepted says why.

Real worker processes of a Dask LocalCluster, real Hosts and confined kernels, real
record folders (on a small tmpfs where a disk must fill up) and the suite's PostgreSQL
server, in front of which a loopback forwarder plays a server that is starting up. One
two-worker cluster serves the module.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from _helpers import batch_cluster
from distributed import Client
from nbformat.v4 import new_code_cell, new_notebook

from host_kernel.batch import MAX_REQUEUES, Task, TaskSummary, run_batch
from host_kernel.browse import session_cause
from host_kernel.cli import main
from host_kernel.store.verified import open_verified, open_verified_ledger

DISK_FULL = ("storage_error: the record's disk is full (No space left on device); nothing "
             "was stored (host.save_artifact)")


def notebook(path: Path, *cells: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "base.txt").write_text("7\n")
    nbformat.write(new_notebook(cells=[new_code_cell(c) for c in cells]), path)
    return path


#: A notebook's work: an artifact saved and a submission accepted.
SUBMITS = ("rows = [int(open('base.txt').read()), 2]",
           "host.write_file('out/rows.csv', ''.join(f'{r}\\n' for r in rows))",
           "a = host.save_artifact('out/rows.csv')",
           "host.submit_output({'rows': rows}, ['wrote 2 rows to out/rows.csv'])")


# ---------------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """A two-worker LocalCluster for the module (its workers' temp folder its own); the
    multiprocessing resource tracker its workers start is stopped after, when it was."""
    with batch_cluster("hkbs-") as c:
        yield c


@contextlib.contextmanager
def tls_of(client: Client) -> Iterator[None]:
    """Dask's configuration holding the cluster's TLS certificates: how `--scheduler`
    connects to it."""
    import dask

    security = client.cluster.security
    with dask.config.set({"distributed.comm.require-encryption": True,
                          "distributed.comm.tls.ca-file": security.tls_ca_file,
                          "distributed.comm.tls.client.cert": security.tls_client_cert,
                          "distributed.comm.tls.client.key": security.tls_client_key}):
        yield


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A folder on a 6 MiB tmpfs: a disk that fills up for real."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# ---------------------------------------------------------------------- the ledger's word


def test_a_task_accepted_before_its_worker_died_is_reported_accepted_and_not_rerun(
        client: Client, tmp_path: Path, pg_url: str) -> None:
    """The worker is SIGKILLed after the verdict, while a later cell runs: the scheduler
    gives the task to another worker, which finds the session accepted in the ledger and
    returns that instead of a new session."""
    nb = notebook(tmp_path / "nbs" / "done.ipynb", *SUBMITS,
                  "host.write_file('accepted.txt', 'yes')\nimport time\ntime.sleep(60)")
    workspaces = tmp_path / "ws"
    status = workspaces / "done" / "attempt-1.json"
    marker = workspaces / "done" / "attempt-1" / "accepted.txt"
    killed: list[int] = []

    def kill_its_worker() -> None:
        deadline = time.monotonic() + 90
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if marker.exists():
            killed.append(json.loads(status.read_text())["pid"])
            os.kill(killed[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_its_worker)
    killer.start()
    try:
        result = run_batch([Task.notebook(nb)], scheduler=client, workspaces=workspaces,
                           ledger=pg_url, blobs=f"file://{tmp_path / 'blobs'}")
    finally:
        killer.join()
    assert killed, "the task's worker was never killed"
    (summary,) = result.summaries
    session = json.loads(status.read_text())["session"]
    assert (summary.outcome, summary.attempt, summary.session_id) == ("accepted", 1, session)
    assert summary.detail == f"accepted in attempt 1 (session {session}); not run again"
    assert not summary.skipped and summary.cause is None
    # Never rerun: no second attempt, one session in the ledger.
    assert not (workspaces / "done" / "attempt-2").exists()
    with open_verified_ledger(pg_url) as trusted:
        assert [r[0] for r in trusted.query("SELECT session FROM sessions")] == [session]
        head = trusted.query("SELECT hash FROM events WHERE session = ? ORDER BY seq DESC "
                             "LIMIT 1", (session,))[0][0]
        (verdict,) = trusted.query("SELECT submission_id, accepted FROM submissions")
    # Its verdict, artifact and head are the ledger's, not the dead worker's memory.
    assert [(v.submission_id, v.accepted) for v in summary.verdicts] == [
        (verdict[0], True)]
    assert [a.filename for a in summary.artifacts] == ["rows.csv"]
    assert summary.head == head
    client.wait_for_workers(2, timeout=60)


def test_a_batch_run_again_over_the_same_records_reruns_only_what_was_not_accepted(
        client: Client, tmp_path: Path) -> None:
    nbs = tmp_path / "nbs"
    good = notebook(nbs / "good.ipynb", *SUBMITS)
    flaky = notebook(nbs / "flaky.ipynb", "import os\nassert not os.path.exists('fail.flag'), "
                                          "'fail.flag is there'", *SUBMITS)
    bare = notebook(nbs / "bare.ipynb", "x = 1", "print(x + 1)")  # submits nothing
    (nbs / "fail.flag").write_text("")
    records = tmp_path / "records"
    tasks = [Task.notebook(good), Task.notebook(flaky), Task.notebook(bare)]
    first = run_batch(tasks, scheduler=client, workspaces=tmp_path / "ws1", records=records)
    outcomes = {s.name: s.outcome for s in first.summaries}
    assert outcomes == {"good": "accepted", "flaky": "failed", "bare": "ran"}, first
    assert first.summaries[2].detail == "2 cells ok, no submission"
    assert first.summaries[1].cause == "AssertionError: fail.flag is there"

    (nbs / "fail.flag").unlink()
    seen: list[TaskSummary] = []
    second = run_batch(tasks, scheduler=client, workspaces=tmp_path / "ws2", records=records,
                       on_result=seen.append)
    assert second.ok and not second.accepted, [(s.name, s.detail, s.cause)
                                                for s in second.summaries]
    again_good, again_flaky, again_bare = second.summaries
    for earlier, now in ((first.summaries[0], again_good), (first.summaries[2], again_bare)):
        assert now.skipped and now.session_id == earlier.session_id
        assert now.outcome == earlier.outcome
        assert now.detail == f"skipped: {earlier.outcome} in session {earlier.session_id}"
        assert now.head == earlier.head and now.verdicts == earlier.verdicts
        assert not (tmp_path / "ws2" / now.name).exists()  # nothing run for it
    # The failed task runs again, as its next attempt, in a record folder of its own.
    assert not again_flaky.skipped and again_flaky.attempt == 2
    assert again_flaky.record == str(records / "flaky" / "attempt-2")
    assert again_flaky.session_id != first.summaries[1].session_id
    assert len(second.skipped) == 2 and len(seen) == 3


# ---------------------------------------------------------------------- causes


def test_a_full_disk_is_named_as_the_cause_in_the_table_json_and_ls(
        client: Client, tmp_path: Path, small_disk: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The failing task's record folders on a 6 MiB tmpfs (a link leads there): saving a
    12 MiB artifact fails for real. The other task's record is on a disk of its own: a
    full disk fails every writer on it, and that task must be accepted."""
    nbs = tmp_path / "nbs"
    notebook(nbs / "full.ipynb", "import os\nopen('big.bin', 'wb').write(os.urandom(12 << 20))",
             "host.save_artifact('big.bin')", "print('never')")
    notebook(nbs / "fine.ipynb", *SUBMITS)
    records, workspaces = tmp_path / "records", tmp_path / "ws"
    records.mkdir()
    (records / "full").symlink_to(small_disk)
    address = client.scheduler.address
    with tls_of(client):
        code = main(["batch", str(nbs), "--scheduler", address, "--workspaces",
                     str(workspaces), "--records", str(records)])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "1 accepted, 1 failed, 0 errors" in out, out
    # Not on a terminal: whole lines only, no bar, no carriage return, no escapes.
    assert "\r" not in out and "\x1b" not in out and out.endswith("\n")
    progress = [line for line in out.splitlines() if line.startswith("[")]
    assert len(progress) == 2, out
    assert any(line.startswith("[") and "full (notebook): failed" in line
               and line.endswith(f"cell 2: error: {DISK_FULL}") for line in progress), out
    (row,) = [line for line in out.splitlines() if line.split()[:1] == ["full"]]
    assert f"cell 2: error: {DISK_FULL}" in row, out

    record = records / "full" / "attempt-1"
    assert main(["ls", str(record)]) == 0
    listed, _ = capsys.readouterr()
    assert DISK_FULL in listed, listed
    assert main(["ls", str(record), "--json"]) == 0
    (session,) = json.loads(capsys.readouterr()[0])["rows"]
    assert session["cause"] == DISK_FULL

    # --resume the batch, as JSON lines: the accepted task is skipped, the other fails
    # again, for the same cause, said in its JSON line.
    with tls_of(client):
        code = main(["batch", "--resume", str(workspaces), "--scheduler", address, "--json"])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    lines = {line["name"]: line for line in map(json.loads, out.splitlines())
             if line["type"] == "task"}
    assert lines["fine"]["skipped"] and lines["fine"]["outcome"] == "accepted"
    assert lines["fine"]["detail"].startswith("skipped: accepted in session ")
    assert (lines["full"]["outcome"], lines["full"]["attempt"]) == ("failed", 2)
    assert (lines["full"]["detail"], lines["full"]["cause"]) == ("cell 2: error", DISK_FULL)
    assert TaskSummary.from_dict(lines["full"]).cause == DISK_FULL


def test_a_refused_verdict_is_a_sessions_cause_and_an_agents_errors_before_acceptance_are_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from host_kernel import Host

    schema = "{'type': 'object', 'properties': {'x': {'type': 'integer'}}}"
    (tmp_path / "refused").mkdir()
    (tmp_path / "recovered").mkdir()
    with Host(tmp_path / "refused", record_dir=tmp_path / "r1") as host:
        host.execute(f"host.submit_output({{'x': 'a'}}, ['one'], output_schema={schema})")
        refused = host.session_id
    with Host(tmp_path / "recovered", record_dir=tmp_path / "r2") as host:
        host.execute("1 / 0")
        host.execute("host.submit_output({'x': 1}, ['one'])")
        recovered = host.session_id
    with open_verified(tmp_path / "r1") as trusted:
        cause = session_cause(trusted, refused)
    assert cause is not None and cause.code == "output_schema"
    assert str(cause) == ("output_schema: output does not match output_schema at x: 'a' is "
                          "not of type 'integer'")
    with open_verified(tmp_path / "r2") as trusted:
        assert session_cause(trusted, recovered) is None
        first = session_cause(trusted, recovered, after_accepted=False)
    assert first is not None and str(first) == "ZeroDivisionError: division by zero"
    assert main(["ls", str(tmp_path / "r1"), "--json"]) == 0
    assert json.loads(capsys.readouterr()[0])["rows"][0]["cause"] == str(cause)


# ---------------------------------------------------------------------- a store unavailable


class StartingUp:
    """A PostgreSQL server's front door on 127.0.0.1, as it looks while the server
    restarts: each of the first ``refuse`` connections (every one, when None) is read up
    to its startup message and answered as PostgreSQL answers then, ``FATAL 57P03 the
    database system is starting up``; the others are forwarded to ``upstream``. Clients
    must not ask for TLS or GSSAPI first (:meth:`url` says so)."""

    def __init__(self, upstream: str, refuse: int | None) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.refuse = refuse
        self.refused = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url(self, database_url: str) -> str:
        parts = urllib.parse.urlsplit(database_url)
        netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{self.port}"
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path,
                                        "sslmode=disable&gssencmode=disable", ""))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() below
        self._listener.close()
        self._thread.join(5)
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)
        for sock in self._sockets:
            sock.close()

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            if self.refuse is None or self.refused < self.refuse:
                self.refused += 1
                self._start(self._starting_up, client)
                continue
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
            self._sockets.append(server)
            self._start(self._pump, client, server)
            self._start(self._pump, server, client)

    @staticmethod
    def _starting_up(client: socket.socket) -> None:
        with client:
            (length,) = struct.unpack("!I", client.recv(4, socket.MSG_WAITALL))
            client.recv(length - 4, socket.MSG_WAITALL)  # the startup message
            fields = b"".join(kind + text + b"\0" for kind, text in (
                (b"S", b"FATAL"), (b"V", b"FATAL"), (b"C", b"57P03"),
                (b"M", b"the database system is starting up"))) + b"\0"
            client.sendall(b"E" + struct.pack("!I", 4 + len(fields)) + fields)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


def test_a_task_whose_ledger_was_unavailable_at_its_start_is_requeued_without_an_attempt(
        client: Client, tmp_path: Path, pg_url: str) -> None:
    """The ledger's server answers the first connection as a server that is starting up;
    with no patience, that task's Host cannot start. The task runs again as attempt 1,
    into a ledger that holds its one session; a task whose ledger never comes back ends
    ``error``, saying so, once its requeues are spent."""
    from host_kernel.store.pg import ledger_key

    key = ledger_key(pg_url)  # read on the driver past the proxy: the workers get it
    nb = notebook(tmp_path / "nbs" / "once.ipynb", *SUBMITS)
    proxy = StartingUp(pg_url, refuse=1)
    try:
        result = run_batch([Task.notebook(nb)], scheduler=client, ledger=proxy.url(pg_url),
                           ledger_key=key, workspaces=tmp_path / "ws", store_patience=0)
    finally:
        proxy.close()
    (summary,) = result.summaries
    assert proxy.refused == 1  # its first start did fail
    assert (summary.outcome, summary.attempt, summary.abandoned) == ("accepted", 1, ()), summary
    assert result.reruns == 0
    assert sorted(p.name for p in (tmp_path / "ws" / "once").iterdir()) == [
        "attempt-1", "attempt-1.json"]
    with open_verified_ledger(pg_url, key=key) as trusted:
        sessions = [r[0] for r in trusted.query("SELECT session FROM sessions")]
    assert sessions == [summary.session_id]  # the start that failed left nothing

    gone = StartingUp(pg_url, refuse=None)
    try:
        lost = run_batch([Task.notebook(nb, name="never")], scheduler=client,
                         ledger=gone.url(pg_url), ledger_key=key, workspaces=tmp_path / "ws2",
                         store_patience=0).summaries[0]
    finally:
        gone.close()
    assert gone.refused == 1 + MAX_REQUEUES
    assert (lost.outcome, lost.attempt, lost.session_id) == ("error", 1, None), lost
    assert lost.cause is not None and lost.cause.startswith("store_unavailable: task never: ")
    assert "starting up" in lost.cause
    assert not (tmp_path / "ws2" / "never" / "attempt-1").exists()


def test_progress_when_not_on_a_terminal_is_one_whole_line_per_update(tmp_path: Path) -> None:
    """Each finished task is one write of one line, flushed: a log reader or `tail -f`
    never sees half a line or a line rewritten in place."""
    from host_kernel.batch.commands import _Progress

    class Stream:
        def __init__(self) -> None:
            self.writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return len(text)

        def flush(self) -> None:
            self.writes.append("<flush>")

        def isatty(self) -> bool:
            return False

    stream = Stream()
    progress = _Progress(2, False, stream)  # type: ignore[arg-type]
    progress(TaskSummary("a", "notebook", "accepted", detail="1 cell ok, 0 submissions "
                         "accepted"))
    progress(TaskSummary("b", "notebook", "failed", detail="cell 2: error",
                         cause="storage_error: the record's disk is full\nsecond line"))
    progress.stop()
    assert stream.writes == [
        "[1/2] a (notebook): accepted, 0.0 s\n", "<flush>",
        ("[2/2] b (notebook): failed, 0.0 s: cell 2: error: storage_error: the record's "
         "disk is full\\nsecond line\n"), "<flush>"]
