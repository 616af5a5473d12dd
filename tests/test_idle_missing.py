"""A cell whose kernel answers but never says it is idle: the Host does not wait forever.

ipykernel publishes a cell's ``idle`` status right after its execute_reply, but code in
the kernel can stop it (here by replacing the kernel's ``_publish_status``). Before
IDLE_GRACE existed, ``Host.execute`` waited for that idle with no end: one line of a
cell wedged the Host. These cells are the ones that did.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _helpers import DROP_REPLY, MUTE_IDLE
from _tracing_helpers import finished

from host_kernel import Host
from host_kernel.audit import audit
from host_kernel.host import _cells
from host_kernel.host._cells import IDLE_GRACE, REPLY_GRACE
from host_kernel.host._outputs import CellRun

#: A safety net: without the grace, the old Host interrupted and restarted the kernel
#: here (status "timeout", a new generation), which the assertions below reject.
NET = 60.0


def test_a_cell_that_mutes_its_idle_ends_after_the_grace_and_says_so(
        workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grace = 0.6  # shorter than the default, so the four muted cells below take less time
    monkeypatch.setattr(_cells, "IDLE_GRACE", grace)
    with Host(workdir) as h:
        t0 = time.monotonic()
        muted = h.execute(MUTE_IDLE + "print('still here')", timeout=NET)
        took = time.monotonic() - t0
        assert muted.status == "ok", muted.text
        assert muted.generation == 1
        assert grace <= took < NET / 2
        assert "never said it was idle" in (muted.notice or "")
        assert [o.get("text") for o in muted.outputs] == ["still here\n"]
        assert finished(h, muted)["idle_missing"] is True

        # The kernel still runs cells; an error is still an error; its state survived.
        later = h.execute("print(k is get_ipython().kernel)", timeout=NET)
        assert later.status == "ok" and later.generation == 1
        assert later.outputs[0]["text"] == "True\n"
        failed = h.execute("1/0", timeout=NET)
        assert failed.status == "error" and failed.generation == 1
        assert finished(h, failed)["idle_missing"] is True

        # Put back, cells end on their idle again, with nothing flagged.
        h.execute("k._publish_status = _publish", timeout=NET)
        t0 = time.monotonic()
        plain = h.execute("pass", timeout=NET)
        assert time.monotonic() - t0 < IDLE_GRACE  # the default: ended by its idle
        assert plain.notice is None
        assert "idle_missing" not in finished(h, plain)
    report = audit(h.record_dir)
    assert report.clean, [str(f) for f in report.findings]


def test_a_cell_whose_idle_comes_late_keeps_the_output_sent_before_it(
        workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the grace, a late idle is waited for: output sent between the reply and the
    idle (a background thread's) is the cell's."""
    monkeypatch.setattr(_cells, "IDLE_GRACE", 8.0)  # room for a loaded machine
    code = (MUTE_IDLE
            + "import threading, time\n"
            "from IPython.display import display\n"
            "def _late(parent=k.get_parent()):\n"
            "    time.sleep(0.5)\n"
            "    k.session.send(k.iopub_socket, 'stream', {'name': 'stdout', 'text': 'late\\n'},\n"
            "                   parent=parent, ident=k._topic('stream'))\n"
            "    k._publish_status = _publish\n"
            "    _publish('idle', 'shell', parent)\n"
            "threading.Thread(target=_late).start()\n")
    with Host(workdir) as h:
        t0 = time.monotonic()
        obs = h.execute(code, timeout=NET)
        took = time.monotonic() - t0
        assert obs.status == "ok", obs.text
        assert 0.5 <= took < 8.0
        assert obs.notice is None
        assert "late\n" in [o.get("text") for o in obs.outputs]
        assert "idle_missing" not in finished(h, obs)


def test_output_read_long_after_the_reply_is_all_kept(
        workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Host that reads IOPub behind the kernel (a loaded machine; here each message
    read 2 ms late) sees the reply long before the idle that ends the backlog: the grace
    counts from IOPub's last message, so no output is cut off. (The whole suite beside
    two CPU hogs lost 36 MB of a 200 MB cell this way when the grace ran from the reply.)"""
    monkeypatch.setattr(_cells, "IDLE_GRACE", 0.5)
    receive = CellRun.receive

    def late(self: CellRun, socket: object, **kwargs: object) -> object:
        time.sleep(0.002)
        return receive(self, socket, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CellRun, "receive", late)
    with Host(workdir) as h:
        t0 = time.monotonic()
        obs = h.execute("for i in range(1500):\n    print(i, flush=True)", timeout=NET)
        assert time.monotonic() - t0 > 1.5  # the backlog outlasted the grace threefold
        assert obs.status == "ok" and obs.notice is None, obs.text[-300:]
        assert "idle_missing" not in finished(h, obs)
        assert "".join(o["text"] for o in obs.outputs).split() == [str(i) for i in range(1500)]


def test_a_cell_that_drops_its_reply_ends_at_its_idle_as_an_error(workdir: Path) -> None:
    """The other half: code that keeps the kernel's execute_reply from being sent. The
    Host ends the cell REPLY_GRACE after its idle and records an error saying why."""
    with Host(workdir) as h:
        t0 = time.monotonic()
        obs = h.execute(DROP_REPLY + "print('dropped')", timeout=NET)
        assert REPLY_GRACE <= time.monotonic() - t0 < NET / 2
        assert obs.status == "error" and obs.generation == 1
        assert "never answered it" in (obs.notice or "")
        assert finished(h, obs)["reply_missing"] is True
        assert [o.get("text") for o in obs.outputs] == ["dropped\n"]
        after = h.execute("print('back')", timeout=NET)  # the cell put send back
        assert after.status == "ok" and after.notice is None
        assert "reply_missing" not in finished(h, after)
    report = audit(h.record_dir)
    assert report.clean, [str(f) for f in report.findings]


def test_the_relays_grace_also_counts_from_the_cells_last_iopub_message() -> None:
    """The control kernel's rule for a cell with its reply in and no idle: it ends only
    after END_GRACE of quiet, from the reply and from the cell's last IOPub message
    (a backlog the relay is still forwarding ends with the idle)."""
    from host_kernel.control.relay import END_GRACE, _Inflight
    from host_kernel.control.wire import DELIM, Frames

    now = time.monotonic()
    cell = _Inflight("m", {}, [], True)
    assert not cell.ended()  # neither reply nor idle yet
    cell.reply = Frames.split([DELIM, b"", b"{}", b"{}", b"{}", b"{}"])
    cell.first_end = now - END_GRACE - 1
    cell.last_heard = now - 0.1  # output still coming
    assert not cell.ended()
    cell.last_heard = now - END_GRACE - 0.5  # quiet for the whole grace
    assert cell.ended()


class _Flood:
    """A shell socket a kernel floods without end: always a message ready, never the
    cell's reply (nothing a Session can even read)."""

    def __init__(self) -> None:
        self.read = 0

    def poll(self, timeout: int = 0) -> bool:
        return True

    def recv_multipart(self) -> list[bytes]:
        self.read += 1
        if self.read > 2_000_000:  # the bound is gone: fail instead of looping for ever
            raise AssertionError("read without end")
        return [b"not a jupyter message"]


def test_a_shell_flood_holds_the_host_neither_at_a_look_nor_at_the_drain() -> None:
    from jupyter_client.session import Session

    run = CellRun(Session(key=b"k"), "the-cell")
    flood = _Flood()
    assert _cells.CellRunner._take_reply(run, flood, 0.0, most=256) is False
    assert flood.read == 256  # a look at a busy cell reads at most 256
    flood = _Flood()
    t0 = time.monotonic()
    assert _cells.CellRunner._take_reply(run, flood, 0.2) is False
    assert time.monotonic() - t0 < 5  # the drain after the idle ends at its grace
    assert run.reply_status is None
