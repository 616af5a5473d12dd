"""The control kernel: a kernelspec whose kernel is a Host relaying to a real ipykernel.

One relay kernel, started from the installed kernelspec through jupyter_client as
any frontend would, serves the tests in order; the last ones restart it, kill its
kernel and shut it down, and check that every process and folder it made is gone.
One more is started on its own and sent a cell before it is ready.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
import zmq
from _helpers import DROP_REPLY, MUTE_IDLE, descendants, wait_for
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from jupyter_client.session import Session

from host_kernel._paths import default_record_dir
from host_kernel.audit import audit
from host_kernel.cli import main as cli_main
from host_kernel.control.wire import Heartbeat
from host_kernel.export import export_notebook
from host_kernel.store.ledger import SQLiteLedger, rebuild


@contextlib.contextmanager
def kernelspecs(root: Path) -> Iterator[Path]:
    """The control kernel installed under ROOT (plain, and armed as host_kernel_pipeline),
    with JUPYTER_PATH pointing there for as long as the context lasts."""
    prefix = root / "jupyter-prefix"
    with contextlib.redirect_stdout(None):
        assert cli_main(["install", "--prefix", str(prefix)]) == 0
        assert cli_main(["install", "--prefix", str(prefix), "--mode", "reusable_pipeline",
                         "--name", "host_kernel_pipeline"]) == 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
        yield prefix


def hk_folders(tmpdir: Path) -> list[Path]:
    return sorted(tmpdir.glob("hk-*"))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class RelayKernel:
    """A control kernel started like a frontend starts one; TMPDIR is its own folder."""

    km: KernelManager
    kc: Any
    workdir: Path
    tmpdir: Path
    sent: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, workdir: Path, name: str = "host_kernel", *,
              ready: bool = True) -> RelayKernel:
        """Launch the kernelspec; with ``ready`` (as frontends do) wait until it answers
        ``kernel_info``, else return as soon as the process is launched."""
        tmpdir = workdir.parent / f"{workdir.name}-tmp"
        tmpdir.mkdir()
        km = KernelManager(kernel_name=name)
        km.start_kernel(cwd=str(workdir), env={**os.environ, "TMPDIR": str(tmpdir)})
        kc = km.client()
        kc.start_channels()
        try:
            if ready:
                kc.wait_for_ready(timeout=60)
        except RuntimeError:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        return cls(km, kc, workdir, tmpdir)

    def run(self, code: str, **kwargs: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Execute; return the reply and the iopub messages of the request."""
        seen: list[dict[str, Any]] = []
        self.sent.append(code)
        reply = self.kc.execute_interactive(code, timeout=30, output_hook=seen.append, **kwargs)
        return reply, seen

    def stdout(self, code: str) -> str:
        reply, seen = self.run(code)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(m["content"]["text"] for m in seen if m["msg_type"] == "stream")

    def reply_to(self, msg_id: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.1, deadline - time.monotonic())
            msg: dict[str, Any] = self.kc.get_shell_msg(timeout=left)
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg

    def stop(self) -> None:
        self.kc.stop_channels()
        if self.km.has_kernel:
            self.km.shutdown_kernel(now=False)
        self.km.cleanup_resources()

    @property
    def record(self) -> Path:
        return default_record_dir(self.workdir)

    def events(self, kind: str) -> list[dict[str, Any]]:
        with SQLiteLedger(self.record / "ledger.sqlite") as ledger:
            return [e.body for e in ledger.events() if e.kind == kind]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayKernel]:
    root = tmp_path_factory.mktemp("control")
    workdir = root / "ws"
    workdir.mkdir()
    with kernelspecs(root):
        k = RelayKernel.start(workdir)
        try:
            yield k
        finally:
            k.stop()


# ------------------------------------------------------------------ the kernelspec


def test_install_writes_a_kernelspec_that_launches_the_control_kernel(tmp_path: Path) -> None:
    with kernelspecs(tmp_path) as prefix:
        spec = KernelSpecManager().get_kernel_spec("host_kernel")
        assert spec.display_name == "Python 3 (host_kernel)"
        assert spec.argv[1:] == ["-P", "-m", "host_kernel.control", "-f", "{connection_file}"]
        assert Path(spec.argv[0]).name.startswith("python")
        assert spec.interrupt_mode == "message"
        armed = KernelSpecManager().get_kernel_spec("host_kernel_pipeline")
        assert armed.argv[-2:] == ["--mode", "reusable_pipeline"]
        with contextlib.redirect_stdout(None):
            assert cli_main(["uninstall", "--name", "host_kernel_pipeline"]) == 0
            assert cli_main(["uninstall", "--name", "host_kernel_pipeline"]) == 2
        assert "host_kernel_pipeline" not in KernelSpecManager().find_kernel_specs()
        assert (prefix / "share" / "jupyter" / "kernels" / "host_kernel" / "kernel.json").is_file()


def test_install_refuses_an_unknown_mode(tmp_path: Path) -> None:
    with contextlib.redirect_stderr(None):
        assert cli_main(["install", "--prefix", str(tmp_path), "--mode", "nonsense"]) == 2


# ------------------------------------------------------------------ start


def test_kernel_info_is_answered_by_the_real_kernel_and_the_heartbeat_by_the_relay(
        kernel: RelayKernel) -> None:
    reply = kernel.reply_to(kernel.kc.kernel_info())["content"]
    assert reply["status"] == "ok"
    assert reply["implementation"] == "ipython"
    # The kernelspec runs this interpreter, and so does the kernel the Host starts.
    assert reply["language_info"]["name"] == "python"
    assert reply["language_info"]["version"] == platform.python_version()
    # The channel counts as beating once its first ping came back: on a loaded machine
    # that can be a moment after the kernel_info reply.
    wait_for(kernel.kc.hb_channel.is_beating, 30, "the relay's heartbeat")


def test_kernel_info_advertises_only_what_the_relay_supports(kernel: RelayKernel) -> None:
    # ipykernel offers the debugger and kernel subshells; the relay carries neither (the
    # kernelspec says debugger: false, and subshell cells wait in the one queue).
    on_shell = kernel.reply_to(kernel.kc.kernel_info())["content"]
    request = kernel.kc.session.msg("kernel_info_request")
    kernel.kc.control_channel.send(request)
    on_control = kernel.kc.control_channel.get_msg(timeout=30)
    assert on_control["parent_header"]["msg_id"] == request["header"]["msg_id"]
    for reply in (on_shell, on_control["content"]):
        assert reply["status"] == "ok"
        assert "debugger" not in reply["supported_features"]
        assert "kernel subshells" not in reply["supported_features"]
        assert reply.get("debugger", False) is False


def test_a_cell_sent_before_the_real_kernel_is_ready_is_run_and_recorded(
        tmp_path: Path) -> None:
    workdir = tmp_path / "early"
    workdir.mkdir()
    with kernelspecs(tmp_path):
        early = RelayKernel.start(workdir, ready=False)
        try:
            # Sent at once, while the relay process is still starting: the request waits
            # in the client's socket, then in the relay's, and runs once the kernel is up.
            msg_id = early.kc.execute("print('early', 6 * 7)")
            reply = early.reply_to(msg_id, timeout=60)["content"]
            assert reply["status"] == "ok"
            reply = early.reply_to(early.kc.kernel_info())["content"]
            assert reply["language_info"]["name"] == "python"
        finally:
            early.stop()
    [started] = early.events("cell_started")
    assert started["code"] == "print('early', 6 * 7)"
    [finished] = early.events("cell_finished")
    assert finished["status"] == "ok"
    assert finished["outputs"][0]["text"] == "early 42\n"


def test_the_heartbeat_echoes_through_signals_and_ends_with_its_context() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    heartbeat = Heartbeat(router)
    heartbeat.start()
    client = ctx.socket(zmq.REQ)
    client.connect(f"tcp://127.0.0.1:{port}")
    handled: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, _frame: handled.append(signum))
    try:
        for i in range(6):
            # A signal for the relay may be delivered to the heartbeat's thread.
            signal.pthread_kill(heartbeat.ident or 0, signal.SIGUSR1)
            client.send(b"ping %d" % i)
            assert client.poll(5000), "the heartbeat stopped answering"
            assert client.recv() == b"ping %d" % i
    finally:
        signal.signal(signal.SIGUSR1, previous)
        client.close(linger=0)
        ctx.term()  # what the relay does at its end
    heartbeat.join(timeout=5)
    assert not heartbeat.is_alive()
    assert handled


# ------------------------------------------------------------------ cells


def test_host_cell_id_is_the_minted_id_recorded_beside_the_frontends_and_exported(
        kernel: RelayKernel) -> None:
    content = {"code": "print(host.cell_id)", "silent": False, "store_history": True,
               "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
    msg = kernel.kc.session.msg("execute_request", content,
                                metadata={"cellId": "frontend-cell-1"})
    kernel.kc.shell_channel.send(msg)
    kernel.sent.append(content["code"])
    assert kernel.reply_to(msg["header"]["msg_id"])["content"]["status"] == "ok"
    printed = ""
    while not printed:
        out = kernel.kc.get_iopub_msg(timeout=10)
        mine = out["parent_header"]["msg_id"] == msg["header"]["msg_id"]
        if out["msg_type"] == "stream" and mine:
            printed = out["content"]["text"].strip()
    started = [b for b in kernel.events("cell_started") if b["cell_id"] == printed]
    assert started and started[0]["frontend_cell_id"] == "frontend-cell-1"
    exported = {c.id: c for c in export_notebook(kernel.record).cells}
    assert exported[printed].metadata["host_kernel"]["frontend_cell_id"] == "frontend-cell-1"
    assert exported[printed].outputs[0]["text"].strip() == printed


def test_outputs_of_every_kind_reach_the_client_and_the_record(kernel: RelayKernel) -> None:
    reply, seen = kernel.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
                             "from IPython.display import HTML, display\n"
                             "display(HTML('<i>h</i>'))\n6 * 7")
    assert reply["content"]["status"] == "ok"
    kinds = [m["msg_type"] for m in seen]
    assert {"stream", "display_data", "execute_result"} <= set(kinds)
    finished = kernel.events("cell_finished")[-1]
    recorded = {o["output_type"] for o in finished["outputs"]}
    assert recorded == {"stream", "display_data", "execute_result"}
    assert finished["execution_count"] == reply["content"]["execution_count"]


def test_input_round_trips_through_the_relay(kernel: RelayKernel) -> None:
    prompts: list[str] = []

    def answer(msg: dict[str, Any]) -> None:
        prompts.append(msg["content"]["prompt"])
        kernel.kc.input("relayed answer")

    reply, seen = kernel.run("name = input('who? ')\nprint('got', name)", allow_stdin=True,
                             stdin_hook=answer)
    assert reply["content"]["status"] == "ok"
    assert prompts == ["who? "]
    assert "got relayed answer" in "".join(m["content"].get("text", "") for m in seen)


def test_an_ipywidgets_comm_round_trips_through_the_relay(kernel: RelayKernel) -> None:
    pytest.importorskip("ipywidgets")
    reply, seen = kernel.run("import ipywidgets\nslider = ipywidgets.IntSlider(value=1)\nslider")
    assert reply["content"]["status"] == "ok"
    [opened] = [m for m in seen if m["msg_type"] == "comm_open"
                and m["content"]["data"]["state"].get("_model_name") == "IntSliderModel"]
    comm_id = opened["content"]["comm_id"]
    update = kernel.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {
        "method": "update", "state": {"value": 7}, "buffer_paths": []}})
    kernel.kc.shell_channel.send(update)
    echoed = None
    deadline = time.monotonic() + 10
    while echoed is None and time.monotonic() < deadline:
        msg = kernel.kc.get_iopub_msg(timeout=10)
        if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == comm_id:
            echoed = msg["content"]["data"]
    assert echoed is not None and echoed["state"]["value"] == 7
    assert kernel.stdout("print(slider.value)").strip() == "7"


def test_an_interrupt_from_the_client_stops_a_sleeping_cell_promptly(
        kernel: RelayKernel) -> None:
    msg_id = kernel.kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    kernel.sent.append("sleep")
    # Wait until the cell's own code runs: an interrupt that lands between execute_input
    # and the code is caught by ipykernel's loop ("KeyboardInterrupt caught in kernel")
    # and the cell then sleeps on.
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=30)
        if (msg["msg_type"] == "stream" and msg["parent_header"]["msg_id"] == msg_id
                and "sleeping" in msg["content"]["text"]):
            break
    t0 = time.monotonic()
    kernel.km.interrupt_kernel()
    reply = kernel.reply_to(msg_id, timeout=10)
    assert time.monotonic() - t0 < 5
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    cell = [b for b in kernel.events("cell_started") if "time.sleep(60)" in b["code"]][-1]
    assert any(e["cell_id"] == cell["cell_id"] for e in kernel.events("interrupt_requested"))
    finished = [b for b in kernel.events("cell_finished") if b["cell_id"] == cell["cell_id"]]
    assert finished[0]["status"] == "error"


def test_requests_queued_behind_a_failing_cell_are_aborted_as_ipykernel_does(
        kernel: RelayKernel) -> None:
    # The failing cell runs a moment first, so the second request is queued behind it even
    # when this process is descheduled between the two sends (ipykernel aborts what is
    # queued when the error is handled, not what arrives later).
    failing = kernel.kc.execute("import time\ntime.sleep(0.5)\nraise ValueError('stop here')")
    queued = kernel.kc.execute("print('must not run')")
    kernel.sent += ["failing", "queued"]
    assert kernel.reply_to(failing)["content"]["status"] == "error"
    assert kernel.reply_to(queued)["content"]["status"] == "aborted"
    statuses = {b["cell_id"]: b["status"] for b in kernel.events("cell_finished")}
    aborted = [b for b in kernel.events("cell_started") if b["code"] == "print('must not run')"]
    assert statuses[aborted[0]["cell_id"]] == "aborted"
    assert kernel.stdout("print('after')") == "after\n"


def test_an_aborted_reply_the_relay_builds_has_ipykernels_shape(kernel: RelayKernel) -> None:
    failing = kernel.kc.execute("import time\ntime.sleep(0.5)\nraise ValueError('stop here')")
    queued = kernel.kc.execute("print('must not run')")
    kernel.sent += ["failing", "queued"]
    real = kernel.reply_to(failing)  # built by ipykernel itself
    built = kernel.reply_to(queued)  # built by the relay
    assert built["content"] == {"status": "aborted"}
    assert set(built["metadata"]) == set(real["metadata"]) == {
        "started", "dependencies_met", "engine", "status"}
    assert built["metadata"]["status"] == "aborted"
    assert built["metadata"]["engine"] == real["metadata"]["engine"]
    for started in (built["metadata"]["started"], real["metadata"]["started"]):
        assert isinstance(started, str) and started.endswith("Z"), started
        dt.datetime.fromisoformat(started.replace("Z", "+00:00"))


def test_a_message_with_a_bad_signature_is_dropped(kernel: RelayKernel) -> None:
    forger = Session(key=b"not the key")
    forged = forger.msg("execute_request", {"code": "print('forged')", "silent": False})
    kernel.kc.shell_channel.socket.send_multipart(forger.serialize(forged))
    with pytest.raises(Empty):
        kernel.reply_to(forged["header"]["msg_id"], timeout=0.5)
    assert not [b for b in kernel.events("cell_started") if "forged" in b["code"]]


def test_completion_inspection_and_history_pass_through(kernel: RelayKernel) -> None:
    kernel.run("relay_value = 41")
    msg_id = kernel.kc.complete("relay_val", 9)
    assert "relay_value" in kernel.reply_to(msg_id)["content"]["matches"]
    msg_id = kernel.kc.inspect("relay_value", 11)
    assert kernel.reply_to(msg_id)["content"]["found"]
    # How much history the Host's kernels keep is host/_kernel.py's choice (in memory,
    # or none), so the reply may be empty: what matters here is that the request
    # reaches the kernel and its answer comes back.
    msg_id = kernel.kc.history(hist_access_type="tail", n=2)
    assert kernel.reply_to(msg_id)["content"]["status"] == "ok"


# ------------------------------------------------------------------ generations


def test_a_cell_that_mutes_its_idle_is_ended_by_the_relay_and_recorded_so(
        kernel: RelayKernel) -> None:
    """Code that keeps the kernel from ever saying idle: the relay ends the cell END_GRACE
    after its reply, gives the frontend an idle of its own, and the record says so."""
    try:
        t0 = time.monotonic()
        reply, seen = kernel.run(MUTE_IDLE + "print('muted')")
        assert reply["content"]["status"] == "ok"
        assert time.monotonic() - t0 < 15
        assert any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
                   for m in seen)  # the relay's own
        body = kernel.events("cell_finished")[-1]
        assert body["idle_missing"] is True and "never said it was idle" in body["notice"]
        assert body["outputs"][0]["text"] == "muted\n"
    finally:
        reply, _ = kernel.run("k._publish_status = _publish")
    assert reply["content"]["status"] == "ok"
    assert kernel.stdout("print('back')") == "back\n"
    assert "idle_missing" not in kernel.events("cell_finished")[-1]


def test_a_cell_that_drops_its_reply_is_answered_by_the_relay_as_an_error(
        kernel: RelayKernel) -> None:
    """The other half: code that keeps the kernel's execute_reply from being sent. The
    frontend still gets an answer (an error saying why), and the record the same."""
    t0 = time.monotonic()
    reply, _ = kernel.run(DROP_REPLY)
    assert time.monotonic() - t0 < 15
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "ReplyMissing"
    body = kernel.events("cell_finished")[-1]
    assert body["status"] == "error" and "never answered it" in body["notice"]
    assert body["reply_missing"] is True and "idle_missing" not in body
    assert kernel.stdout("print('back')") == "back\n"  # put back by the cell itself


def test_a_kernel_death_is_recorded_and_the_next_cell_runs_in_a_new_generation(
        kernel: RelayKernel) -> None:
    reply, _ = kernel.run("import os\nos._exit(1)")
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KernelDied"
    assert "generation 2" in reply["content"]["evalue"]
    assert kernel.stdout("print(host.generation)").strip() == "2"
    started = kernel.events("generation_started")[-1]
    assert (started["generation"], started["reason"]) == (2, "kernel_died")
    died = [b for b in kernel.events("cell_finished") if b["status"] == "kernel_died"]
    assert died and "in memory is gone" in died[-1]["notice"]


def test_a_restart_from_the_client_is_the_next_generation_of_the_same_session(
        kernel: RelayKernel) -> None:
    kernel.km.restart_kernel(now=False)
    kernel.kc.wait_for_ready(timeout=60)
    assert kernel.stdout("print(host.generation)").strip() == "3"
    with SQLiteLedger(kernel.record / "ledger.sqlite") as ledger:
        sessions = {e.session for e in ledger.events()}
        started = [e for e in ledger.events() if e.kind == "session_started"]
    assert len(sessions) == 1 and len(started) == 1
    started = kernel.events("generation_started")[-1]
    assert (started["generation"], started["reason"]) == (3, "restart")
    assert kernel.events("frontend_shutdown")[-1]["restart"] is True


def test_shutdown_ends_the_session_and_leaves_no_process_or_folder(
        kernel: RelayKernel) -> None:
    relay = kernel.km.provisioner.process.pid  # type: ignore[union-attr]
    # The inner kernel's own pid is the one in its sandbox's PID namespace; its
    # descendants of the relay, seen from here, are what must go.
    started = descendants(relay)
    assert len(started) >= 2  # at least the inner kernel (and the sandbox's init)
    kernel.stop()
    deadline = time.monotonic() + 5
    while (any(map(alive, started)) or alive(relay)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(relay) and not [p for p in started if alive(p)]
    assert hk_folders(kernel.tmpdir) == []
    assert kernel.events("session_ended")
    report = audit(kernel.record)
    assert report.clean, [str(f) for f in report.findings]
    with SQLiteLedger(kernel.record / "ledger.sqlite") as ledger:
        trusted = rebuild(ledger)
        try:
            rows = trusted.query("SELECT status FROM cells")
        finally:
            trusted.close()
    assert len(rows) == len(kernel.sent)  # every execute_request is a recorded cell
    assert all(r["status"] != "running" for r in rows)
    assert not list((kernel.record / "relay").glob("*.json"))  # the restart marker was taken
    assert json.loads(json.dumps(export_notebook(kernel.record)))["nbformat"] == 4
