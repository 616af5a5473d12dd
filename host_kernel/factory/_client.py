"""A Host's side of the kernel factory: reach it (starting it when it is not running),
ask it for a standby, and hold the session's connection until the session ends.

Owns :class:`FactoryPool`, which the Host's launch uses as it uses a
:class:`~host_kernel.host._pool.HostPool` (``serve``). Any failure (no factory yet,
one that does not answer in time, another installation's, an unsafe folder) is a
reason the record gives for a cold start, never an error: a dead factory never
blocks a session.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from typing import Any

from ..host._kernel import pinned
from ..host._pool import Standby
from ..sandbox.limits import KernelLimits
from ._adopt import adopt
from ._place import FACTORY_ENV, FactoryUnavailable, Place, disabled

__all__ = ["FactoryPool"]

#: Seconds a Host waits for the factory's hello before starting cold.
HELLO_TIMEOUT = 2.0
#: Seconds beyond the asked wait that a take may take before the Host starts cold.
TAKE_SLACK = 10.0
#: Descriptors a hand-out carries at most (orders, pidfd, init, trace, counter).
MAX_FDS = 8


class FactoryPool:
    """The user's kernel factory, reached for one session (its connection is the lease)."""

    def __init__(self, sock: socket.socket, hello: dict[str, Any], place: Place) -> None:
        self._sock = sock
        self.hello = hello
        self.place = place
        self.id = str(hello["id"])
        self.pid = int(hello["pid"])

    @classmethod
    def reach(cls, *, start: bool = True, place: Place | None = None
              ) -> tuple[FactoryPool | None, str | None]:
        """The running factory (and None), or None and why not; with ``start``, a factory
        found not running is started for the sessions after this one."""
        why = disabled()
        if why is not None:
            return None, why
        try:
            place = place or Place()
            place.ensure()
        except FactoryUnavailable as exc:
            return None, f"the kernel factory cannot be used: {exc}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.settimeout(HELLO_TIMEOUT)
        try:
            sock.connect(str(place.socket))
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if not start:
                return None, "the kernel factory is not running"
            try:
                spawn(place)
            except OSError as exc:
                return None, f"the kernel factory could not be started: {exc}"
            return None, ("the kernel factory was not running; it is starting now, for the "
                          "sessions after this one")
        except OSError as exc:
            sock.close()
            return None, f"the kernel factory could not be reached: {exc}"
        try:
            sock.send(json.dumps({"op": "hello"}).encode())
            hello = json.loads(sock.recv(1 << 16) or b"{}")
        except (OSError, ValueError) as exc:
            sock.close()
            return None, f"the kernel factory did not answer within {HELLO_TIMEOUT:g} s ({exc})"
        if not isinstance(hello, dict) or not hello.get("ok"):
            sock.close()
            why = hello.get("reason") if isinstance(hello, dict) else "an unreadable hello"
            return None, f"the kernel factory refused this process: {why}"
        mine = place.identity
        other = [k for k in mine if hello.get(k) != mine[k]]
        if other:
            sock.close()
            return None, f"the kernel factory runs another installation ({', '.join(other)})"
        return cls(sock, hello, place), None

    def serve(self, *, workspace: str, confined: bool, traced: bool, hidden: frozenset[str],
              limits: KernelLimits | None, wait: float) -> tuple[Standby | None, str | None]:
        """A standby handed over for this session, or None and why not."""
        request = {"op": "take", "workspace": workspace, "confined": confined,
                   "traced": traced, "hidden": sorted(hidden), "wait": wait,
                   "limits": None if limits is None else limits.to_dict()}
        try:
            self._sock.settimeout(wait + TAKE_SLACK)
            self._sock.send(json.dumps(request).encode())
            data, fds, _flags, _addr = socket.recv_fds(self._sock, 1 << 16, MAX_FDS)
        except OSError as exc:
            return None, f"the kernel factory did not hand a kernel over: {exc}"
        try:
            reply = json.loads(data or b"{}")
            if not isinstance(reply, dict):
                raise TypeError("the reply is not an object")
            if not reply.get("ok"):
                for fd in fds:
                    os.close(fd)
                return None, f"the kernel factory: {reply.get('reason', 'no reply')}"
            return adopt(reply["standby"], list(fds)), None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            return None, f"the kernel factory's hand-over was unreadable: {exc}"

    def close(self) -> None:
        """End the lease: the factory counts this session as ended."""
        self._sock.close()


def spawn(place: Place) -> None:
    """Start the factory in the background (it detaches; a second one started at the same
    moment finds the lock taken and exits)."""
    env = {k: v for k, v in os.environ.items() if k != FACTORY_ENV}
    with open(place.log, "ab") as log:
        proc = subprocess.Popen([*pinned("host_kernel.factory._server"), "--folder",
                                 str(place.folder)], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=log, cwd="/", env=env, start_new_session=True,
                                close_fds=True)
    # It forks and its first process exits at once: reap that one, off the session's path.
    threading.Thread(target=proc.wait, daemon=True, name="host-kernel-factory-start").start()
