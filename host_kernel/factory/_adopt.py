"""A standby kernel crossing from the factory to a Host: what goes over the socket, and the
objects the Host rebuilds from it.

Owns :func:`handover` (the factory's side: a :class:`~host_kernel.host._pool.Standby`
as JSON and descriptors), :func:`adopt` (the Host's side: a Standby whose
KernelManager watches a process it did not start) and :class:`PidfdProcess` (that
process, watched and signalled through a pidfd, so a recycled pid is never signalled).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from jupyter_client.provisioning.factory import KernelProvisionerFactory

from ..host._kernel import manager_pid, new_manager, standby_argv
from ..host._pool import Standby
from ..sandbox.client import Sandbox
from ..sandbox.policy import Policy

__all__ = ["PidfdProcess", "adopt", "handover"]


class PidfdProcess:
    """A kernel process another process started: the slice of ``subprocess.Popen`` that
    jupyter_client's local provisioner and our ``stop_manager`` use.

    It is not this process's child, so its exit status is not ours to read: once it has
    ended, :attr:`returncode` is ``-signal.SIGKILL`` when this side killed it, else -1.
    """

    stdin = stdout = stderr = None

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.args: list[str] = []
        self._pidfd = pidfd
        self._killed = False
        self.returncode: int | None = None

    def _ended(self, timeout: float) -> bool:
        if self.returncode is not None:
            return True
        if self._pidfd < 0:
            return True
        ready, _, _ = select.select([self._pidfd], [], [], timeout)
        if not ready:
            return False
        self.returncode = -signal.SIGKILL if self._killed else -1
        os.close(self._pidfd)
        self._pidfd = -1
        return True

    def poll(self) -> int | None:
        return self.returncode if self._ended(0) else None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ended(1.0 if deadline is None else
                              max(0.0, min(1.0, deadline - time.monotonic()))):
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        if sig == signal.SIGKILL:
            self._killed = True
        signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def handover(standby: Standby) -> tuple[dict[str, Any], list[int]]:
    """The factory's side: what a Host needs to take ``standby`` (JSON), and the
    descriptors (the orders socket, a pidfd of its init, the sandbox's sockets). The
    caller sends them, then calls :func:`forget`."""
    pid = manager_pid(standby.manager)
    if pid is None or standby.sandbox is None:
        raise OSError("only a running, confined standby is handed over")
    pidfd = os.pidfd_open(pid)
    try:
        box, box_fds = standby.sandbox.handover()
    except BaseException:
        os.close(pidfd)
        raise
    info = {"pool": standby.pool, "folder": str(standby.folder), "started": standby.started,
            "hello": standby.hello, "broad": None if standby.broad is None
            else standby.broad.to_dict(), "pid": pid, "sandbox": box}
    return info, [standby.orders_fd, pidfd, *box_fds]


def forget(standby: Standby, pidfd: int) -> None:
    """The factory's side, once sent: close its copies and leave the processes to the Host."""
    os.close(pidfd)
    if standby.orders_fd >= 0:
        os.close(standby.orders_fd)
        standby.orders_fd = -1
    if standby.sandbox is not None:
        standby.sandbox.forget()


def adopt(info: dict[str, Any], fds: list[int]) -> Standby:
    """The Host's side: a Standby it can narrow, adopt, stop and remove, owning ``fds``."""
    orders_fd, pidfd, *box_fds = fds
    folder = Path(info["folder"])
    sandbox = Sandbox.adopted(info["sandbox"], box_fds)
    manager = new_manager(folder / "kernel.json", standby_argv(sandbox))
    manager.load_connection_file()
    factory = KernelProvisionerFactory.instance(parent=manager)
    provisioner: Any = factory.create_provisioner_instance(manager.kernel_id,
                                                           manager.kernel_spec, parent=manager)
    process = PidfdProcess(int(info["pid"]), pidfd)
    provisioner.process = process
    provisioner.pid = process.pid
    provisioner.pgid = process.pid  # init leads its own session (jupyter_client starts it so)
    provisioner.connection_info = manager.get_connection_info()
    manager.provisioner = provisioner
    broad = None if info["broad"] is None else Policy.from_dict(info["broad"])
    return Standby(str(info["pool"]), folder, manager, sandbox, broad, dict(info["hello"]),
                   orders_fd, started=str(info["started"]))
