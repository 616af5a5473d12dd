"""The kernel factory's process: ``python -m host_kernel.factory``.

Owns one user's standby kernels across processes: a :class:`HostPool` kept full,
a Unix socket only this user's unconfined processes may use, and the hand-out of
a standby to a Host (its descriptors sent with ``SCM_RIGHTS``; the factory keeps
none of them). Each Host keeps its connection open for its session: the factory
exits once no session has been attached for its idle time, or when its socket
is removed (the user's runtime folder going at logout).

Who may connect is decided by the operating system, not by what a peer says:
the peer's uid, mount and PID namespaces, its no_new_privs flag and the rest of its
rights (groups, capabilities, seccomp filters, which must be the factory's), read from
``/proc`` for the pid the kernel gives (``SO_PEERCRED``), checked to still be
the same process through a pidfd (``SO_PEERPIDFD``) where the kernel has one. A
confined kernel lives in a mount namespace of its own whose view covers this
folder; it cannot even name the socket (docs/security.md, "The kernel factory").
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .._procs import listen_at
from ..host._pool import HostPool, Standby
from ..sandbox.limits import KernelLimits
from ._adopt import forget, handover
from ._place import Place, identity, idle_seconds, size

__all__ = ["CREDENTIALS", "Factory", "credentials", "main", "peer_refusal"]

#: Largest request or reply (JSON) on the socket.
MAX_MESSAGE = 1 << 16
#: ``SO_PEERPIDFD`` (Linux 6.5), not named by Python 3.11's socket module.
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)
#: Seconds at most a Host waits in a take for a standby that is starting.
MAX_WAIT = 30.0


def _ns(pid: int | str, name: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{name}")


#: The lines of ``/proc/PID/status`` that say what a process may do: its user and groups
#: (all four ids each, and the supplementary groups), its capability sets, no_new_privs
#: and its seccomp filters. A peer must have all of them as the factory has them.
CREDENTIALS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
               "NoNewPrivs", "Seccomp", "Seccomp_filters")


def credentials(pid: int | str) -> dict[str, str]:
    """The :data:`CREDENTIALS` lines of ``pid``'s status, as the kernel writes them."""
    found: dict[str, str] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in CREDENTIALS:
                found[name] = " ".join(value.split())
    return found


def peer_refusal(conn: socket.socket) -> str | None:
    """Why the process at the other end of ``conn`` may not use the factory, or None.

    Same user; same mount and PID namespaces as the factory (a sandboxed kernel has its
    own); no no_new_privs (every Landlock-confined process has it set, so a Host that
    runs with it set is refused too, and starts cold); and otherwise the very rights the
    factory has (:data:`CREDENTIALS`: groups, capabilities, seccomp filters), since what
    it hands out, a standby kernel or a fork of the relay zygote, runs with the factory's
    rights, not the peer's: a process that gave up a group or a capability, or runs under
    a seccomp filter, would get them back. The pid is pinned by a pidfd taken before the
    checks and found alive after them, so a pid recycled in between cannot pass.
    """
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    if uid != os.getuid():
        return f"uid {uid} is not the factory's user"
    pidfd = -1
    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        pass  # an older kernel: the pid alone
    try:
        for name in ("mnt", "pid"):
            if _ns(pid, name) != _ns("self", name):
                return f"the peer runs in another {name} namespace (a sandbox)"
        theirs, mine = credentials(pid), credentials("self")
        if theirs.get("NoNewPrivs") != "0":
            # Every Landlock-confined process has it; where kernels share the factory's
            # namespaces (no private view), this is what tells one from a Host.
            return "the peer runs with no_new_privs (as every confined process does)"
        differ = [name for name in CREDENTIALS if theirs.get(name) != mine.get(name)]
        if differ:
            return (f"the peer's rights differ from the factory's ({', '.join(differ)}): what "
                    f"the factory hands out would run with the factory's")
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, 0)
    except OSError as exc:
        return f"the peer could not be checked: {exc}"
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return None


class Factory:
    """Standby kernels for this user's Hosts, served on ``place.socket``."""

    def __init__(self, place: Place, *, size: int, idle: float,
                 roots: list[str] | None = None) -> None:
        self.place = place
        self.idle = idle
        self.pool = HostPool(size=size, roots=roots)
        self.identity = identity()
        self._lock = threading.Lock()
        self._leases = 0
        self._last = time.monotonic()
        self._stop = threading.Event()

    # ------------------------------------------------------------------ the process

    def serve(self) -> int:
        """Serve until idle; 0 also when another factory holds the lock already."""
        self.place.ensure()
        lock = os.open(self.place.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            return 0  # another factory serves this user and installation
        listener = listen_at(str(self.place.socket), socket.SOCK_SEQPACKET, 64)
        try:
            inode = os.stat(self.place.socket).st_ino
            signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
            self.pool.start()
            self._log(f"serving {self.place.socket} (pid {os.getpid()}, "
                      f"{self.pool.size} standbys, idle {self.idle:g} s)")
            if not self.pool.confinement.active:
                self._log("kernels here are not confined: the factory serves no session")
            while not self._stop.is_set():
                ready, _, _ = select.select([listener], [], [], 0.25)
                if ready:
                    conn, _ = listener.accept()
                    with self._lock:  # counted now: the idle check below must see it
                        self._leases += 1
                    threading.Thread(target=self._attach, args=(conn,), daemon=True,
                                     name="host-kernel-factory-session").start()
                if self._idle_over() or not self._still_mine(inode):
                    break
        finally:
            self._stop.set()
            listener.close()
            try:
                if os.stat(self.place.socket).st_ino == inode:
                    os.unlink(self.place.socket)
            except (OSError, UnboundLocalError):
                pass
            self.pool.close()
            os.close(lock)
        self._log("exiting (idle, stopped, or its socket gone)")
        return 0

    def _idle_over(self) -> bool:
        with self._lock:
            return self._leases == 0 and time.monotonic() - self._last >= self.idle

    def _still_mine(self, inode: int) -> bool:
        try:
            return os.stat(self.place.socket).st_ino == inode
        except OSError:
            return False

    def _log(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        print(f"{stamp} host-kernel factory: {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ one session

    def _attach(self, conn: socket.socket) -> None:
        """Serve one connection (counted as a lease by the accepting loop) until it ends."""
        try:
            with conn:
                why = peer_refusal(conn)
                if why is not None:
                    self._log(f"refused a connection: {why}")
                    # Its first request is read (and ignored) first: closing with it unread
                    # would reset the connection before the peer reads why.
                    conn.settimeout(1.0)
                    conn.recv(MAX_MESSAGE)
                    conn.send(json.dumps({"ok": False, "reason": why}).encode())
                    return
                took = False
                while True:
                    data = conn.recv(MAX_MESSAGE)
                    if not data:
                        return  # the session ended (or its Host did)
                    request = json.loads(data)
                    op = request.get("op") if isinstance(request, dict) else None
                    if op == "hello":
                        conn.send(json.dumps(self._hello()).encode())
                    elif op == "take" and not took:
                        took = True
                        self._take(conn, request)
                    else:
                        conn.send(json.dumps({"ok": False, "reason":
                                              f"unknown or repeated request {op!r}"}).encode())
        except (OSError, ValueError) as exc:
            self._log(f"a session's connection failed: {exc}")
        finally:
            with self._lock:
                self._leases -= 1
                self._last = time.monotonic()

    def _hello(self) -> dict[str, Any]:
        pool = self.pool
        return {"ok": True, "pid": os.getpid(), "id": pool.id, **self.identity,
                "roots": list(pool.roots), "confined": pool.confinement.active,
                "traced": pool.traced, "stats": dict(pool.stats), "broken": pool.broken,
                "waiting": len(pool.pids()), "folders": pool.folders()}

    def refusal(self, request: dict[str, Any]) -> str | None:
        """Why this factory's standbys cannot serve the session a take describes."""
        pool = self.pool
        if not pool.confinement.active:
            return "the factory's kernels are not confined here, so it serves no session"
        workspace = os.path.realpath(str(request.get("workspace", "")))
        if not any(workspace == r or workspace.startswith(r.rstrip("/") + "/")
                   for r in pool.roots):
            return (f"the workspace is outside the factory's folders "
                    f"({', '.join(pool.roots)})")
        limits = request.get("limits")
        return pool.refusal(confined=bool(request.get("confined")),
                            traced=bool(request.get("traced")),
                            hidden=frozenset(request.get("hidden", ())),
                            limits=None if limits is None else KernelLimits(**limits))

    def _take(self, conn: socket.socket, request: dict[str, Any]) -> None:
        why = self.refusal(request)
        standby = None
        if why is None:
            wait = min(MAX_WAIT, max(0.0, float(request.get("wait", 0.0))))
            standby = self.pool.take(wait=wait)
            if standby is None:
                why = "no standby kernel was waiting in the factory"
        if standby is None:
            conn.send(json.dumps({"ok": False, "reason": why}).encode())
            return
        try:
            info, fds = handover(standby)
        except OSError as exc:
            standby.close()
            conn.send(json.dumps({"ok": False, "reason": f"the standby failed: {exc}"}).encode())
            return
        try:
            socket.send_fds(conn, [json.dumps({"ok": True, "standby": info}).encode()], fds)
        except OSError:
            os.close(fds[1])
            standby.close()  # never handed out: never handed to anyone else either
            raise
        process = standby.manager.provisioner.process  # type: ignore[union-attr]
        forget(standby, fds[1])
        self._reap(standby, process)

    def _reap(self, standby: Standby, process: Any) -> None:
        """Wait for a handed-out kernel's init (this process's child) to end, so it does
        not linger as a zombie; everything else of it is the Host's."""
        def wait() -> None:
            try:
                process.wait()
            except OSError:
                pass
            # Dropped only now: jupyter_client's manager removes the connection file when
            # it is collected, which the kernel reads after its orders arrive.
            standby.manager = None  # type: ignore[assignment]
        thread = threading.Thread(target=wait, daemon=True, name="host-kernel-factory-reap")
        thread.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m host_kernel.factory",
                                     description="Keep standby kernels for this user's Hosts.")
    parser.add_argument("--folder", default=None, help="where the socket lives")
    parser.add_argument("--root", action="append", default=None,
                        help="a folder beneath which the workspaces served lie (repeatable; "
                             "default: home and the temp folder)")
    parser.add_argument("--size", type=int, default=None, help="standbys kept started")
    parser.add_argument("--idle", type=float, default=None,
                        help="seconds with no session before exiting")
    parser.add_argument("--foreground", action="store_true",
                        help="do not detach (the default detaches from the starting process)")
    args = parser.parse_args(argv)
    place = Place(Path(args.folder) if args.folder else None)
    if not args.foreground and os.fork() > 0:
        os._exit(0)  # the starter reaps this one at once; the factory is init's child now
    if not args.foreground:
        os.setsid()
    factory = Factory(place, size=args.size or size(),
                      idle=idle_seconds() if args.idle is None else args.idle, roots=args.root)
    return factory.serve()
