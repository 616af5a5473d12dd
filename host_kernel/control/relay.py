"""The relay: the kernel process a Jupyter frontend launches, with a Host inside it.

Owns the wire between the frontend and the real ipykernel. It binds the five
channels named in the frontend's connection file (shell, control and stdin as
ROUTER, iopub as XPUB, heartbeat answered on its own thread), starts a
:class:`~host_kernel.host._relay_support.RelayHost` (whose kernel listens on
private IPC channels), and moves every message both ways: each one's HMAC is
checked with the sender side's key and re-signed with the other side's; the
frames themselves are passed on unchanged, except the ``cellId`` of a
forwarded ``execute_request``'s metadata, which becomes the Host-minted id.

What it records, through the RelayHost: every ``execute_request`` as a cell
(its outputs folded from iopub), interrupts, shutdowns and kernel deaths. To
keep "the cell the Host is running" exact, it holds shell requests in arrival
order and forwards the next ``execute_request`` only after the kernel's reply
and idle status for the previous one; comm messages skip the queue, as they do
inside ipykernel. That reply and idle status reach the frontend only once the
cell is in the record, so a frontend that sees a cell end can read it there.
When a cell fails with ``stop_on_error`` the execute requests held behind it
are answered ``aborted``, in the shape ipykernel gives such replies. The
kernel's ``kernel_info_reply`` is passed on with what the relay does not carry
taken out of it: the debugger (the kernelspec says ``debugger: false``) and
kernel subshells (the relay runs every cell in one queue, so a frontend must
not think it may run cells side by side); see :data:`WITHHELD_FEATURES`.

It does not own the record's meaning (the Host does) nor the kernelspec
(``kernelspec``). A frontend's restart ends this process; the session goes on
in the next one (``handover``).
"""

from __future__ import annotations

import collections
import datetime as dt
import enum
import hmac
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from jupyter_client.session import Session

from .._errors import HostKernelError
from ..host._cells import join
from ..host._outputs import Outputs
from ..host._relay_support import KernelSockets, RelayHost, ResumeState
from ..host._render import cut_notice
from .handover import leave_marker, marker_path, start_sentinel, take_marker
from .wire import DELIM, Frames, Heartbeat, has_message, send_frames

__all__ = ["Relay", "RelayState"]

#: Shell messages ipykernel handles even while a cell runs; they are never held.
COMMS = frozenset({"comm_open", "comm_msg", "comm_close"})
OUTPUTS = frozenset({"stream", "display_data", "execute_result", "error", "clear_output",
                     "update_display_data"})
#: ``supported_features`` of ipykernel's ``kernel_info_reply`` that the relay does not
#: honour, so it does not advertise them: debug requests are not relayed as the protocol
#: wants them (and the kernelspec says ``debugger: false``), and subshell execute requests
#: are queued with every other cell, never run concurrently.
WITHHELD_FEATURES = frozenset({"debugger", "kernel subshells"})
#: Seconds the loop waits for a message before looking after the kernel.
TICK = 0.1
#: The Host's modules a session needs only at a cell (the dataflow tracker, values and
#: their cards, the verifier, the reproduction): not imported on the way to the kernel's
#: start, where they would compete with it for the CPUs, but in the background at the
#: relay's first quiet moment after it, so the first cell does not wait for them either.
#: The relay zygote imports them ahead (control/_zygote.py).
CELL_MODULES = ("host_kernel.lineage.flow", "host_kernel.lineage.statements",
                "host_kernel._models", "host_kernel.verify", "host_kernel.reproduce",
                "host_kernel.reproduce.world")
#: How often the kernel process is checked for life.
LIVENESS_EVERY = 0.25
#: After a cell's execute_reply (or idle status), how long to wait for the other one
#: before finishing the cell anyway, counted from the cell's last IOPub message too (a
#: backlog of its output still being relayed ends with its idle).
END_GRACE = 1.0
#: A cell's notice (and the error the frontend is answered with) when the kernel said the
#: cell was idle but never answered it.
_REPLY_MISSING = (f"The kernel said this cell was idle but never answered it; the relay "
                  f"ended the cell {END_GRACE:g} s later and recorded it as an error.")
#: How long a shutdown waits for the kernel's reply, and then for its iopub copy.
SHUTDOWN_WAIT, SHUTDOWN_GRACE = 3.0, 0.3


class RelayState(enum.Enum):
    BOUND = "bound"          # frontend channels bound; the Host and its kernel are starting
    RUNNING = "running"      # relaying
    STOPPING = "stopping"    # a shutdown was forwarded; waiting for the kernel's reply
    STOPPED = "stopped"      # the loop has ended; channels and Host are being closed


@dataclass(slots=True)
class _Inflight:
    """The one execute_request the kernel has now."""

    msg_id: str
    header: dict[str, Any]
    idents: list[bytes]
    stop_on_error: bool
    outputs: Outputs = field(default_factory=Outputs)
    execution_count: int | None = None
    reply: Frames | None = None  # held until the cell is recorded
    idle: Frames | None = None   # likewise
    first_end: float = 0.0      # when the first of the two arrived
    last_heard: float = 0.0     # when the last IOPub message of the cell arrived

    def ended(self) -> bool:
        both = self.reply is not None and self.idle is not None
        return both or (self.first_end > 0 and time.monotonic()
                        - max(self.first_end, self.last_heard) > END_GRACE)


@dataclass(slots=True)
class _Shutdown:
    restart: bool
    deadline: float
    request: Frames
    header: dict[str, Any]
    replied_at: float | None = None
    broadcast: bool = False


def _log(text: str) -> None:
    print(f"[host_kernel relay] {text}", file=sys.stderr, flush=True)


class Relay:
    """Relay one frontend's channels to one RelayHost's kernel until shutdown.

    ``make_host(resume)`` builds the (unstarted) RelayHost; ``serve()`` runs it all
    and returns the process's exit code.
    """

    def __init__(self, connection: dict[str, Any], connection_file: str, record_dir: Path,
                 make_host: Callable[[ResumeState | None], RelayHost],
                 after_start: Callable[[], None] | None = None) -> None:
        """``after_start``: called once the Host has started (or failed to), before any
        message is relayed (the launcher lets its early standby go there)."""
        self.connection = connection
        self.after_start = after_start
        key = str(connection.get("key", "")).encode()
        self.frontend = Session(key=key, signature_scheme=connection.get("signature_scheme",
                                                                         "hmac-sha256"),
                                username="host_kernel")
        self.marker = marker_path(record_dir, connection_file, key)
        self.make_host = make_host
        self.state = RelayState.BOUND
        self.host: RelayHost | None = None
        self.kernel: KernelSockets | None = None
        self.ctx = zmq.Context()
        self.poller = zmq.Poller()
        self._held: collections.deque[tuple[Frames, dict[str, Any]]] = collections.deque()
        self._inflight: _Inflight | None = None
        self._shutdown: _Shutdown | None = None
        self._shell_origin: dict[str, list[bytes]] = {}
        self._control_origin: dict[str, list[bytes]] = {}
        # The ``engine`` of the relay's own execute replies: the kernel's ident once one of
        # its replies has named it, a stand-in of the same form until then.
        self._engine = str(uuid.uuid4())
        self._signals: set[int] = set()
        # As ipykernel does: when the launcher named itself (JPY_PARENT_PID), outlive it no more.
        parent = int(os.environ.get("JPY_PARENT_PID") or 0)
        self._parent = parent if parent == os.getppid() else 0
        self._next_liveness = 0.0
        self._preloaded = False
        self.exit_code = 0

    # ------------------------------------------------------------------ life cycle

    def serve(self) -> int:
        self._bind()
        try:
            host = self.make_host(take_marker(self.marker))
            try:
                host.start()
            except HostKernelError as exc:
                if not host.resumed:
                    raise
                _log(f"cannot continue the session ({exc}); starting a new one")
                host = self.make_host(None)
                host.start()
        except HostKernelError as exc:
            _log(f"the Host could not start: {exc}")
            self._close_channels()
            return 1
        finally:
            if self.after_start is not None:
                self.after_start()
        self.host = host
        self._sentinel = start_sentinel(host.runtime_dir)
        self._attach()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda n, _f: self._signals.add(n))
        self.state = RelayState.RUNNING
        try:
            while self.state is not RelayState.STOPPED:
                self._step()
        finally:
            self._finish()
        return self.exit_code

    def _bind(self) -> None:
        c = self.connection
        transport, ip = c.get("transport", "tcp"), c["ip"]

        def url(port: int) -> str:
            return f"ipc://{ip}-{port}" if transport == "ipc" else f"tcp://{ip}:{port}"

        def bound(kind: int, port_key: str) -> zmq.Socket[bytes]:
            sock = self.ctx.socket(kind)
            sock.linger = 1000
            sock.bind(url(int(c[port_key])))
            return sock

        self.f_shell = bound(zmq.ROUTER, "shell_port")
        self.f_control = bound(zmq.ROUTER, "control_port")
        self.f_stdin = bound(zmq.ROUTER, "stdin_port")
        self.f_iopub = bound(zmq.XPUB, "iopub_port")
        self.heartbeat = Heartbeat(bound(zmq.ROUTER, "hb_port"))
        self.heartbeat.start()
        for sock in (self.f_shell, self.f_control, self.f_stdin, self.f_iopub):
            self.poller.register(sock, zmq.POLLIN)

    def _attach(self) -> None:
        """Poll the current generation's sockets (again after every new generation)."""
        assert self.host is not None
        if self.kernel is not None:
            for sock in (self.kernel.shell, self.kernel.control, self.kernel.stdin,
                         self.kernel.iopub):
                self.poller.unregister(sock)
        self.kernel = self.host.kernel_sockets()
        for sock in (self.kernel.shell, self.kernel.control, self.kernel.stdin,
                     self.kernel.iopub):
            self.poller.register(sock, zmq.POLLIN)

    def _finish(self) -> None:
        host = self.host
        if host is not None:
            if self._inflight is not None:
                self._inflight = None
                host.finish_cell("kernel_died", None, [],
                                 notice="the kernel was shut down while this cell ran")
            if self._shutdown is not None and self._shutdown.restart:
                leave_marker(self.marker, host.suspend())
            else:
                host.close()
            if self._sentinel.stdin is not None:
                self._sentinel.stdin.close()
            self._sentinel.wait(timeout=5)
        self._close_channels()

    def _close_channels(self) -> None:
        for sock in (self.f_shell, self.f_control, self.f_stdin, self.f_iopub):
            sock.close()
        # Terminating the context ends the heartbeat's echo, which then closes its socket
        # (term waits for that, and for the frontend to take what was sent, up to the linger).
        self.ctx.term()
        self.heartbeat.join(timeout=2)

    # ------------------------------------------------------------------ the loop

    def _step(self) -> None:
        assert self.kernel is not None
        k = self.kernel
        ready = dict(self.poller.poll(int(TICK * 1000)))
        # New subscribers first: each is greeted (iopub_welcome) before anything else
        # this step publishes reaches it.
        for sock, handle in ((self.f_iopub, self._front_subscription),
                             (k.iopub, self._kernel_iopub), (k.shell, self._kernel_shell),
                             (k.stdin, self._kernel_stdin), (k.control, self._kernel_control),
                             (self.f_control, self._front_control),
                             (self.f_stdin, self._front_stdin),
                             (self.f_shell, self._front_shell)):
            if sock in ready and self.kernel is k:
                self._drain(sock, handle)
        if not ready and not self._preloaded:
            self._preloaded = True
            threading.Thread(target=_import, args=(CELL_MODULES,), name="host-kernel-preload",
                             daemon=True).start()
        self._tick()

    @staticmethod
    def _drain(sock: Any, handle: Callable[[list[bytes]], None]) -> None:
        for _ in range(256):  # bounded, so one busy channel cannot starve the others
            if not has_message(sock):
                return
            frames = sock.recv_multipart()
            try:
                handle(frames)
            except ValueError as exc:  # signed, but its JSON parts do not parse
                _log(f"dropped a malformed message ({exc})")

    def _tick(self) -> None:
        now = time.monotonic()
        assert self.host is not None
        while self._signals:
            signum = self._signals.pop()
            if signum == signal.SIGINT:
                self.host.interrupt_kernel(via="signal")
            else:
                self.state = RelayState.STOPPED
        if self._parent and os.getppid() != self._parent:  # the frontend's process is gone
            self.state = RelayState.STOPPED
        if self._inflight is not None and self._inflight.first_end:
            self._maybe_finish()
        if self.state is RelayState.RUNNING and now >= self._next_liveness:
            self._next_liveness = now + LIVENESS_EVERY
            if not self.host.kernel_alive():
                self._kernel_died()
        shutdown = self._shutdown
        if shutdown is not None and self.state is RelayState.STOPPING:
            if shutdown.replied_at is None and now > shutdown.deadline:
                self._reply_shutdown_ourselves(shutdown)
                self.state = RelayState.STOPPED
            elif shutdown.replied_at is not None and (
                    shutdown.broadcast or now - shutdown.replied_at > SHUTDOWN_GRACE):
                self.state = RelayState.STOPPED

    # ------------------------------------------------------------------ signing

    @staticmethod
    def _verified(session: Session, frames: list[bytes]) -> Frames | None:
        msg = Frames.split(frames)
        if msg is None:
            _log("dropped a message without the <IDS|MSG> delimiter")
            return None
        if not hmac.compare_digest(msg.signature, session.sign(msg.parts)):
            _log("dropped a message with a bad signature")
            return None
        return msg

    def _to_kernel(self, sock: Any, msg: Frames) -> None:
        assert self.kernel is not None
        send_frames(sock, [DELIM, self.kernel.session.sign(msg.parts), *msg.parts,
                           *msg.buffers])

    def _to_front(self, sock: Any, idents: list[bytes], msg: Frames) -> None:
        send_frames(sock, [*idents, DELIM, self.frontend.sign(msg.parts), *msg.parts,
                           *msg.buffers])

    def _compose(self, sock: Any, idents: list[bytes] | None, msg_type: str,
                 content: dict[str, Any], parent: dict[str, Any],
                 metadata: dict[str, Any] | None = None) -> None:
        """Send a message of the relay's own (an abort, a death, a status) to the frontend."""
        self.frontend.send(sock, msg_type, content, parent=parent, ident=idents,
                           metadata=metadata)

    def _status(self, state: str, parent: dict[str, Any]) -> None:
        self._compose(self.f_iopub, [b"kernel.host_kernel.status"], "status",
                      {"execution_state": state}, parent)

    # ------------------------------------------------------------------ frontend → kernel

    def _front_shell(self, frames: list[bytes]) -> None:
        msg = self._verified(self.frontend, frames)
        if msg is None:
            return
        header = msg.part(0)
        kind = header.get("msg_type")
        if kind in COMMS or (header.get("subshell_id") and kind != "execute_request"):
            self._forward_shell(msg, header)
        else:
            self._held.append((msg, header))
            self._pump()

    def _pump(self) -> None:
        while self._held and self._inflight is None and self.state is RelayState.RUNNING:
            msg, header = self._held.popleft()
            if header.get("msg_type") == "execute_request":
                self._start_cell(msg, header)
            else:
                self._forward_shell(msg, header)

    def _forward_shell(self, msg: Frames, header: dict[str, Any]) -> None:
        assert self.kernel is not None
        self._shell_origin[str(header.get("msg_id"))] = msg.idents
        self._to_kernel(self.kernel.shell, msg)

    def _start_cell(self, msg: Frames, header: dict[str, Any]) -> None:
        assert self.host is not None
        content, metadata = msg.part(3), msg.part(2)
        front_id = metadata.get("cellId")
        silent = bool(content.get("silent", False))
        cell_id = self.host.begin_cell(str(content.get("code", "")),
                                       frontend_cell_id=front_id if isinstance(front_id, str)
                                       else None, silent=silent)
        msg.replace(2, {**metadata, "cellId": cell_id})
        self._inflight = _Inflight(str(header.get("msg_id")), header, msg.idents,
                                   bool(content.get("stop_on_error", True)) and not silent)
        self._forward_shell(msg, header)
        self.host.prepare_cell()  # while the kernel runs it

    def _front_control(self, frames: list[bytes]) -> None:
        msg = self._verified(self.frontend, frames)
        if msg is None or self.host is None or self.kernel is None:
            return
        header = msg.part(0)
        kind = header.get("msg_type")
        if kind == "interrupt_request":
            self.host.note("interrupt_requested", via="message")
        elif kind == "shutdown_request":
            restart = bool(msg.part(3).get("restart", False))
            self.host.note("frontend_shutdown", restart=restart)
            self._shutdown = _Shutdown(restart, time.monotonic() + SHUTDOWN_WAIT, msg, header)
            self.state = RelayState.STOPPING
        self._control_origin[str(header.get("msg_id"))] = msg.idents
        self._to_kernel(self.kernel.control, msg)

    def _front_stdin(self, frames: list[bytes]) -> None:
        msg = self._verified(self.frontend, frames)
        if msg is not None and self.kernel is not None:
            self._to_kernel(self.kernel.stdin, msg)

    def _front_subscription(self, frames: list[bytes]) -> None:
        for frame in frames:  # XPUB: b"\x01" + topic on subscribe; greet as ipykernel does
            if frame[:1] == b"\x01":
                topic = frame[1:].decode("utf-8", "replace")
                self._compose(self.f_iopub, [topic.encode()] if topic else None,
                              "iopub_welcome", {"subscription": topic}, {})

    # ------------------------------------------------------------------ kernel → frontend

    def _kernel_shell(self, frames: list[bytes]) -> None:
        assert self.kernel is not None
        msg = self._verified(self.kernel.session, frames)
        if msg is None:
            return
        parent_id = str(msg.part(1).get("msg_id"))
        idents = self._shell_origin.pop(parent_id, None)
        if idents is None:
            return  # a late reply to the Host's own start-up kernel_info_request
        inf = self._inflight
        if inf is not None and parent_id == inf.msg_id:
            inf.reply = msg
            inf.first_end = inf.first_end or time.monotonic()
            metadata = msg.part(2)
            if isinstance(metadata.get("engine"), str):
                self._engine = metadata["engine"]
            self._maybe_finish()
            return
        self._to_front(self.f_shell, idents, self._honest(msg))

    def _kernel_iopub(self, frames: list[bytes]) -> None:
        assert self.kernel is not None
        msg = self._verified(self.kernel.session, frames)
        if msg is None:
            return
        header = msg.part(0)
        kind = header.get("msg_type")
        if kind == "iopub_welcome":
            return  # the kernel greeting the relay's subscription, not the frontend's
        if msg.part(1).get("session") == self.kernel.session.session:
            return  # about the Host's own request (its start-up kernel_info), not the frontend's
        if kind == "shutdown_reply" and self._shutdown is not None:
            self._shutdown.broadcast = True
        inf = self._inflight
        if inf is None or msg.part(1).get("msg_id") != inf.msg_id:
            self._to_front(self.f_iopub, msg.idents, msg)
            return
        inf.last_heard = time.monotonic()
        if kind == "status" and msg.part(3).get("execution_state") == "idle":
            inf.idle = msg
            inf.first_end = inf.first_end or time.monotonic()
            self._maybe_finish()
            return
        self._to_front(self.f_iopub, msg.idents, msg)
        if kind == "execute_input":
            count = msg.part(3).get("execution_count")
            inf.execution_count = count if isinstance(count, int) else None
        elif kind in OUTPUTS:
            # Kept within the cell's budget (host/_outputs.py): one that cannot fit is
            # counted and hashed from its frame, never parsed. The frontend has it whole.
            raw = msg.parts[3]
            content = msg.part(3) if inf.outputs.wants(kind, len(raw)) else None
            inf.outputs.add({"msg_type": kind, "header": header, "content": content,
                             "raw": raw})

    def _kernel_stdin(self, frames: list[bytes]) -> None:
        assert self.kernel is not None
        msg = self._verified(self.kernel.session, frames)
        if msg is None:
            return
        idents = self._shell_origin.get(str(msg.part(1).get("msg_id")))
        if idents is not None:
            self._to_front(self.f_stdin, idents, msg)

    def _kernel_control(self, frames: list[bytes]) -> None:
        assert self.kernel is not None
        msg = self._verified(self.kernel.session, frames)
        if msg is None:
            return
        idents = self._control_origin.pop(str(msg.part(1).get("msg_id")), None)
        if idents is None:
            return
        self._to_front(self.f_control, idents, self._honest(msg))
        if msg.part(0).get("msg_type") == "shutdown_reply" and self._shutdown is not None:
            self._shutdown.replied_at = time.monotonic()

    @staticmethod
    def _honest(msg: Frames) -> Frames:
        """``msg`` as the frontend may see it: a ``kernel_info_reply`` advertises only what
        the relay supports (:data:`WITHHELD_FEATURES` removed, ``debugger`` false)."""
        if msg.part(0).get("msg_type") != "kernel_info_reply":
            return msg
        content = dict(msg.part(3))
        features = content.get("supported_features")
        if isinstance(features, list):
            content["supported_features"] = [f for f in features if f not in WITHHELD_FEATURES]
        if "debugger" in content:
            content["debugger"] = False
        msg.replace(3, content)
        return msg

    # ------------------------------------------------------------------ cells

    def _maybe_finish(self) -> None:
        """Record the cell once its reply and idle status are in, then let the frontend see them."""
        inf = self._inflight
        if inf is None or not inf.ended():
            return
        assert self.host is not None
        reply = {} if inf.reply is None else inf.reply.part(3)
        if reply.get("status") == "error" and inf.stop_on_error:
            # Requests the frontend sent behind the failed cell may still sit unread in the
            # socket (the loop reads the kernel's channels first): hold them now, while a cell
            # is still in flight, so they are aborted below rather than run (as ipykernel
            # flushes its shell stream before aborting its queue).
            self._drain(self.f_shell, self._front_shell)
        self._inflight = None
        outputs = inf.outputs.final
        status = {"ok": "ok", "aborted": "aborted"}.get(str(reply.get("status")), "error")
        if status == "ok" and inf.outputs.saw_error:
            status = "error"
        cut = inf.outputs.cut
        notice = None if cut is None else cut_notice(cut)
        if inf.idle is None:
            notice = join(notice, f"The kernel answered this cell but never said it was idle; "
                                  f"the relay ended the cell once the kernel had sent nothing "
                                  f"for {END_GRACE:g} s after the answer. Output the kernel "
                                  f"sends later is not in this cell's record.")
        if inf.reply is None:
            notice = join(notice, _REPLY_MISSING)
        self.host.finish_cell(status, inf.execution_count, outputs,
                              dropped_chars=inf.outputs.dropped, notice=notice,
                              output_cut=cut, idle_missing=inf.idle is None,
                              reply_missing=inf.reply is None)
        self._release(inf)
        # Code in the kernel can keep either from coming; the frontend waits for both.
        if inf.reply is None:
            error = {"ename": "ReplyMissing", "evalue": _REPLY_MISSING,
                     "traceback": [_REPLY_MISSING]}
            self._compose(self.f_shell, inf.idents, "execute_reply",
                          {"status": "error", "execution_count": inf.execution_count, **error},
                          inf.header, self._reply_metadata("error"))
        if inf.idle is None:
            self._status("idle", inf.header)
        if reply.get("status") == "error" and inf.stop_on_error:
            self._abort_held(inf.header.get("subshell_id"))
        self._pump()

    def _release(self, inf: _Inflight) -> None:
        """Pass on the reply and idle status held for a cell now recorded."""
        if inf.reply is not None:
            self._to_front(self.f_shell, inf.idents, inf.reply)
        if inf.idle is not None:
            self._to_front(self.f_iopub, inf.idle.idents, inf.idle)

    def _abort_held(self, subshell: Any) -> None:
        """Answer the execute requests queued behind a failed cell ``aborted``, as ipykernel
        does."""
        assert self.host is not None
        keep: collections.deque[tuple[Frames, dict[str, Any]]] = collections.deque()
        for msg, header in self._held:
            if header.get("msg_type") != "execute_request" or header.get("subshell_id") != subshell:
                keep.append((msg, header))
                continue
            content, metadata = msg.part(3), msg.part(2)
            front_id = metadata.get("cellId")
            self.host.begin_cell(str(content.get("code", "")), silent=bool(content.get("silent")),
                                 frontend_cell_id=front_id if isinstance(front_id, str) else None)
            self.host.finish_cell("aborted", None, [], notice="not run: an earlier cell failed")
            self._status("busy", header)
            self._compose(self.f_shell, msg.idents, "execute_reply", {"status": "aborted"},
                          header, self._reply_metadata("aborted"))
            self._status("idle", header)
        self._held = keep

    def _reply_metadata(self, status: str) -> dict[str, Any]:
        """An execute_reply's metadata in ipykernel's shape: ``started`` (UTC, ``Z``),
        ``dependencies_met``, ``engine`` (the kernel's ident, as its own replies gave it) and
        ``status``."""
        started = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
        return {"started": started, "dependencies_met": True, "engine": self._engine,
                "status": status}

    def _kernel_died(self) -> None:
        """The kernel process is gone: record it, start the next generation, tell the frontend."""
        assert self.host is not None
        inf, self._inflight = self._inflight, None
        try:
            notice = self.host.kernel_died(None if inf is None else inf.execution_count,
                                           [] if inf is None else inf.outputs.final)
        except HostKernelError as exc:
            _log(f"the kernel died and no new one could be started: {exc}")
            self.exit_code = 1
            self.state = RelayState.STOPPED
            return
        _log(notice)
        self._shell_origin.clear()  # what was forwarded to the dead kernel gets no reply
        self._control_origin.clear()
        self._attach()
        if inf is not None:
            error = {"ename": "KernelDied", "evalue": notice, "traceback": [notice]}
            self._compose(self.f_iopub, [b"kernel.host_kernel.error"], "error", error, inf.header)
            if inf.reply is None:
                self._compose(self.f_shell, inf.idents, "execute_reply",
                              {"status": "error", "execution_count": inf.execution_count,
                               **error}, inf.header, self._reply_metadata("error"))
            self._release(inf)
            if inf.idle is None:
                self._status("idle", inf.header)
        self._pump()

    def _reply_shutdown_ourselves(self, shutdown: _Shutdown) -> None:
        content = {"status": "ok", "restart": shutdown.restart}
        self._compose(self.f_control, shutdown.request.idents, "shutdown_reply", content,
                      shutdown.header)
        self._compose(self.f_iopub, [b"kernel.host_kernel.shutdown"], "shutdown_reply", content,
                      shutdown.header)


def _import(names: tuple[str, ...]) -> None:
    """Import ``names`` (a background thread's work: a failure is the cell's to meet)."""
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the cell that needs it imports it and says why
            return
