"""One kernel generation: a real ipykernel started through jupyter_client.

Owns starting, interrupting and stopping the ipykernel process of one
generation, over IPC sockets in a private folder, with the ``host`` extension
loaded before the first cell and the per-generation token in its environment.
It does not run cells; the Host does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from queue import Empty
from typing import Any

import zmq
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from .._errors import KernelError
from ..sandbox.client import Sandbox, SandboxError
from ._argv import (
    EXTENSION,
    LAUNCHER,
    kernel_argv,
    kernel_env,
    pinned,
    short_tempdir,
    standby_argv,
)

__all__ = ["EXTENSION", "LAUNCHER", "KernelGeneration", "kernel_argv", "kernel_env", "pinned",
           "short_tempdir", "standby_argv"]

#: Milliseconds between a client's tries to connect to a kernel that has not bound yet.
RECONNECT_MS = 5


class _OwnSpec(KernelSpecManager):
    """Always the interpreter running the Host, with our extension: never a stray spec."""

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._argv = argv

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            argv=self._argv,
            display_name="Python 3 (host_kernel)",
            language="python",
            resource_dir="",
            metadata={"debugger": False},
        )


class KernelGeneration:
    """The kernel process and client of one generation.

    Started cold here (:meth:`__init__`), or taken from a standby kernel that a pool
    started earlier (host_kernel/host/_pool.py): :meth:`order`, then :meth:`ready`.
    """

    #: What init said when it started (PID namespace or why not); empty unconfined.
    hello: dict[str, Any]
    #: Set once the kernel's channels are connected.
    client: BlockingKernelClient

    def __init__(self, generation: int, token: str, conn_file: Path, cwd: Path,
                 env: dict[str, str], startup_timeout: float,
                 sandbox: Sandbox | None = None) -> None:
        manager = new_manager(conn_file, kernel_argv(sandbox))
        self._setup(generation, token, manager, sandbox)
        try:
            if sandbox is None:
                manager.start_kernel(cwd=str(cwd), env=env)
            else:
                manager.start_kernel(cwd=str(cwd), env=env, pass_fds=sandbox.pass_fds)
                self.hello = sandbox.started(wait_network=False)
            self._connect(startup_timeout)
            if sandbox is not None:
                sandbox.wait_outbound()  # up while the kernel started: before its first cell
        except (Exception, SandboxError) as exc:
            self.stop()
            raise KernelError(
                f"the kernel of generation {generation} did not start: {exc}") from exc

    def _setup(self, generation: int, token: str, manager: KernelManager,
               sandbox: Sandbox | None) -> None:
        self.generation = generation
        self.token = token
        self.sandbox = sandbox
        self.manager = manager
        #: The generation's folder: its connection file and IPC sockets.
        self.folder = Path(manager.connection_file).parent
        #: What init said when it started (PID namespace or why not); empty unconfined.
        self.hello = {}

    @classmethod
    def order(cls, generation: int, token: str, manager: KernelManager,
              sandbox: Sandbox | None, hello: dict[str, Any], orders_fd: int,
              orders: dict[str, Any], ruleset_fd: int = -1) -> KernelGeneration:
        """Hand a standby kernel its session's ``orders`` (and the session's Landlock
        ruleset, ``ruleset_fd``) on the socket it reads them from (``orders_fd``;
        host_kernel/kernel/standby.py); :meth:`ready` opens this side's channels and
        waits for it (the Host records the session's start in between, while the kernel
        initialises: a start that fails there has no channels to stop half-started)."""
        self = cls.__new__(cls)
        self._setup(generation, token, manager, sandbox)
        self.hello = hello
        try:
            data = json.dumps(orders).encode() + b"\n"
            with socket.socket(fileno=os.dup(orders_fd)) as sock:
                sent = socket.send_fds(sock, [data], [ruleset_fd] if ruleset_fd >= 0 else [])
                if sent < len(data):
                    # Only what is left: sendall sends even nothing once, and a standby that
                    # took its whole orders may already have closed its end (EPIPE).
                    sock.sendall(data[sent:])
        except (Exception, SandboxError) as exc:
            self.stop()
            raise KernelError(f"the standby kernel did not take generation {generation}: "
                              f"{exc}") from exc
        return self

    def ready(self, timeout: float) -> None:
        """Wait until a kernel handed its orders answers as this generation's kernel (and a
        sandbox's network is up); stopped, and KernelError, if it does not."""
        try:
            if getattr(self, "client", None) is None:
                self._channels()
            wait_ready(self.client, self.manager, timeout)
            if self.sandbox is not None:
                self.sandbox.wait_outbound()  # attached at narrow, up while the kernel adopted
        except (Exception, SandboxError) as exc:
            self.stop()
            raise KernelError(f"the standby kernel did not take generation "
                              f"{self.generation}: {exc}") from exc

    def _connect(self, timeout: float) -> None:
        self._channels()
        wait_ready(self.client, self.manager, timeout)

    def _channels(self) -> None:
        # (the manager's client would make a ZeroMQ context of its own, with the default
        # 100 ms between tries to connect to a kernel that has not bound yet)
        self.client = self.manager.client(context=_context())
        # No heartbeat channel: the Host tells a dead kernel by its process (``is_alive``),
        # and jupyter_client's heartbeat is a thread of its own with an event loop and a
        # socket per kernel, pinging every second, which made a session's start and each
        # restart pay for a thread (and, under load, a socket it could fail to make).
        self.client.start_channels(hb=False)

    @property
    def pid(self) -> int | None:
        return manager_pid(self.manager)

    def is_alive(self) -> bool:
        return bool(self.manager.is_alive())

    def interrupt(self) -> None:
        if self.is_alive():
            self.manager.interrupt_kernel()

    def stop(self) -> None:
        """Stop the kernel now and release its channels and IPC files."""
        stop_manager(self.manager, getattr(self, "client", None), self.sandbox)

    def retire(self) -> threading.Thread:
        """End the kernel's processes now; reap them and release the rest in the background.

        jupyter_client's own stop polls every 0.1 s until the process is reaped: a
        restart should not wait for that. The processes are killed before this returns
        (SIGKILL to the kernel's process group, and a sandbox's init takes its whole
        PID namespace down), so nothing of this generation runs beside the next.
        """
        kill_now(self.manager)
        if self.sandbox is not None:
            self.sandbox.close()

        def finish() -> None:
            try:
                self.stop()
            finally:
                close_thread_loop()

        thread = threading.Thread(target=finish, name=f"host-kernel-retire-{self.generation}",
                                  daemon=True)
        thread.start()
        return thread


def new_manager(conn_file: Path, argv: list[str]) -> KernelManager:
    """A KernelManager for our own kernel command line, over IPC in ``conn_file``'s folder.

    Its ZeroMQ context retries a connection every few milliseconds (not ZeroMQ's 100 ms),
    so a client that connects before the kernel has bound is ready as soon as it binds.
    """
    return KernelManager(transport="ipc", connection_file=str(conn_file),
                         kernel_spec_manager=_OwnSpec(argv), kernel_name="host_kernel",
                         context=_context())


def started_manager(conn_file: Path, argv: list[str], process: subprocess.Popen[bytes]
                    ) -> KernelManager:
    """A KernelManager for a kernel process this process started itself, before it
    imported jupyter_client (host/_pool.py ``HostPool._launch``): it writes the connection
    file (read by a standby only once it has its orders) and watches, signals and stops
    ``process`` through jupyter_client's own local provisioner, as if it had started it.

    ``argv`` is the kernelspec's command line; the process must have been started with
    exactly the command jupyter_client would have made of it, or KernelError."""
    manager = new_manager(conn_file, argv)
    command = [os.path.expanduser(a) for a in manager.format_kernel_cmd()]
    if command != list(process.args):  # type: ignore[arg-type]
        raise KernelError("the standby was started with another command line than its "
                          "kernelspec's")
    manager.write_connection_file()
    provisioner: Any = LocalProvisioner(kernel_id=manager.kernel_id,
                                        kernel_spec=manager.kernel_spec, parent=manager)
    provisioner.process = process
    provisioner.pid = process.pid
    provisioner.pgid = process.pid  # started as the leader of its own session
    provisioner.connection_info = manager.get_connection_info()
    manager.provisioner = provisioner
    return manager


_CONTEXT: zmq.Context[Any] | None = None
_CONTEXT_LOCK = threading.Lock()


def _context() -> zmq.Context[Any]:
    global _CONTEXT
    with _CONTEXT_LOCK:
        if _CONTEXT is None or _CONTEXT.closed:
            ctx: zmq.Context[Any] = zmq.Context()
            ctx.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
            # No limit on what a socket queues for the Host to read: past ZeroMQ's default
            # of 1,000 messages the kernel's IOPub publisher drops the rest silently, and a
            # Host reading late (a loaded machine) lost outputs, or could lose a cell's
            # idle status and wait on. ZeroMQ's I/O thread queues them as they come, and
            # the Host's output budget (_outputs.Outputs) bounds what it keeps of them.
            ctx.setsockopt(zmq.RCVHWM, 0)
            _CONTEXT = ctx
        return _CONTEXT


def wait_ready(client: BlockingKernelClient, manager: KernelManager, timeout: float) -> None:
    """Return once the kernel answers ``kernel_info`` and its IOPub reaches the client.

    jupyter_client's ``wait_for_ready`` gives IOPub a fixed 0.2 s per try; this asks
    again every few milliseconds instead, so a kernel that is ready is seen at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        client.kernel_info()
        try:
            reply = client.get_shell_msg(timeout=0.25)
        except Empty:
            reply = None
        if reply is not None and reply["msg_type"] == "kernel_info_reply":
            # A subscription takes a moment to reach the kernel: until some IOPub
            # message arrives, the first cell's output could be lost.
            try:
                client.get_iopub_msg(timeout=0.01)
            except Empty:
                pass
            else:
                return  # (stray replies are skipped by their parent's id: Host._run)
        if not manager.is_alive():
            raise KernelError("the kernel died before it was ready")
        if time.monotonic() > deadline:
            raise KernelError(f"the kernel was not ready within {timeout:g} s")


def close_thread_loop() -> None:
    """Close the event loop jupyter_client's blocking calls made for this thread.

    Each thread that starts or stops a kernel gets one (jupyter_core's ``run_sync``);
    a background thread that ends must close its own, or it is left to the collector.
    """
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        return
    if not loop.is_running() and not loop.is_closed():
        loop.close()
    asyncio.set_event_loop(None)


def manager_pid(manager: KernelManager) -> int | None:
    prov: Any = manager.provisioner
    proc = getattr(prov, "process", None)
    return None if proc is None else int(proc.pid)


def kill_now(manager: KernelManager) -> Any:
    """SIGKILL the kernel's process group (the kernel, or a sandbox's launcher and all it
    started); returns the process, or None when there is none left to kill."""
    prov: Any = manager.provisioner
    proc = getattr(prov, "process", None)
    if proc is None or proc.poll() is not None:
        return None
    try:
        pgid = getattr(prov, "pgid", None)
        if pgid:
            os.killpg(pgid, signal.SIGKILL)
        else:
            proc.kill()
    except OSError:
        pass  # gone already
    return proc


def stop_manager(manager: KernelManager, client: BlockingKernelClient | None,
                 sandbox: Sandbox | None) -> None:
    """Stop a kernel now and release its channels, IPC files and sandbox.

    The kernel is killed and reaped here (a blocking wait, not jupyter_client's
    polls every 0.1 s); jupyter_client's own shutdown then only tidies up.
    """
    if client is not None:
        client.stop_channels()
    proc = kill_now(manager)
    if sandbox is not None:
        sandbox.close()
    if proc is not None:
        try:
            proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - jupyter_client's shutdown below tries again
            pass
    try:
        if manager.has_kernel:
            manager.shutdown_kernel(now=True)
    except Exception:  # already dead or never started: what matters is cleanup below
        pass
    manager.cleanup_resources(restart=False)
    if sandbox is not None:
        sandbox.release()  # its processes are reaped: its cgroups and slirp4netns go
