"""The relay zygote: control-kernel relays forked ready-imported, for every kernelspec start.

A Jupyter frontend launches ``python -P -m host_kernel.control -f FILE`` for every kernel
start and every restart, and that process used to import the Host (about half a second)
before it could answer. Now it first asks the user's **relay zygote**: a process of the
user's that has imported the relay and the Host once, and waits on a socket beside the
kernel factory's (host_kernel/factory). The zygote forks; the child becomes this kernel's
relay, with the launching process's folder, environment, standard streams, umask and
arguments. The launching process stays the frontend's kernel process: it passes signals
on, and exits with the relay's exit status; if it is killed, its relay kills itself.

A fork is served only where it gives what a fresh launch would:

- the same interpreter and package code (the socket is keyed as the factory's);
- the same interpreter start-up: ``sys.path``, ``sys.flags``, ``-X`` and ``-W`` options,
  and every ``PYTHON*``, ``LANG``, ``LC_*`` and ``HOME`` variable (read once, at start);
- the same process context: namespaces, cgroup, resource limits, nice value, security
  label (its rights, from groups and capabilities to no_new_privs and seccomp filters,
  are the factory's peer rule already).

Otherwise the launching process runs its relay itself, as before, and says why on its
standard error. Who may ask is the factory's rule (same user, same mount and PID
namespaces, no no_new_privs, the same groups, capabilities and seccomp filters), and
the socket lies in the factory's folder, which no confined kernel sees.
``HOST_KERNEL_FACTORY=off`` turns it off with the factory. The first launch that finds
no zygote starts one, and runs its own relay; the zygote exits when it has no relay
left and the factory is gone or it has been idle
``HOST_KERNEL_FACTORY_IDLE`` seconds.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from .._launch import ENTRIES, REPLY_TIMEOUT, read_line, socket_path, startup
from .._procs import listen_at

__all__ = ["Zygote", "main"]

#: Seconds the zygote stays with no relay and no factory (one may be starting).
FACTORY_GRACE = 10.0
#: Namespaces a launching process must share with the zygote.
NAMESPACES = ("mnt", "pid", "net", "user", "uts", "ipc", "cgroup")


class Zygote:
    """Relays forked on request; each child's exit reported to its launching process."""

    def __init__(self, place: Any, idle: float, lock: int) -> None:
        import selectors
        import time

        self.place = place
        self.lock = lock
        self.path = socket_path(place)
        self.idle = idle
        self._time = time.monotonic
        self._last = time.monotonic()
        self._facts = startup()
        self._sel = selectors.DefaultSelector()
        #: pidfd -> the child's pid, and its launching process's connection (None: killed)
        self._children: dict[int, tuple[int, socket.socket | None]] = {}
        self._listener: socket.socket | None = None
        self._factory_seen = False

    def serve(self) -> int:
        import selectors

        # Replaces a dead zygote's socket (we hold the lock); appears only once listening.
        listener = self._listener = listen_at(str(self.path), socket.SOCK_STREAM, 16)
        inode = os.stat(self.path).st_ino
        self._sel.register(listener, selectors.EVENT_READ)
        while True:
            for key, _ in self._sel.select(timeout=1.0):
                if key.fileobj is listener:
                    self._accept()
                else:
                    self._reap(key.fd)
            if not self._children and self._over():
                break
            try:
                if os.stat(self.path).st_ino != inode:
                    break  # another zygote's now
            except OSError:
                break  # the socket is gone: so is the folder, or we were asked to go
        listener.close()
        try:
            if os.stat(self.path).st_ino == inode:
                self.path.unlink()
        except OSError:
            pass
        return 0

    def _over(self) -> bool:
        quiet = self._time() - self._last
        if self.place.socket.exists():
            self._factory_seen = True
        elif self._factory_seen or quiet > min(self.idle, FACTORY_GRACE):
            return True  # the factory ended (or never came): so have the user's sessions
        return quiet > self.idle

    def _accept(self) -> None:
        assert self._listener is not None
        conn, _ = self._listener.accept()
        self._last = self._time()
        fds: list[int] = []
        try:
            conn.settimeout(REPLY_TIMEOUT)
            from ..factory._server import peer_refusal

            why = peer_refusal(conn)
            data, fds = read_line(conn, deadline=self._time() + REPLY_TIMEOUT)
            request = json.loads(data)
            pid = self._peer_pid(conn)
            why = why or self._refusal(request, pid, fds)
            if why is not None:
                sys.stderr.write(f"host_kernel zygote: not forked for pid {pid}: {why}\n")
                sys.stderr.flush()
                conn.sendall(json.dumps({"refused": why}).encode() + b"\n")
                conn.close()
                return
            self._fork(conn, request, fds, pid)
        except (OSError, ValueError, KeyError, TypeError):
            conn.close()
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass

    @staticmethod
    def _peer_pid(conn: socket.socket) -> int:
        import struct

        pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        struct.calcsize("3i")))
        return int(pid)

    def _refusal(self, request: Any, pid: int, fds: list[int]) -> str | None:
        """Why a fork would not be what this launch would have been, or None."""
        if not isinstance(request, dict) or len(fds) != 3:
            return "a garbled request"
        theirs = request.get("startup")
        if not isinstance(theirs, dict):
            return "a garbled request"
        differ = sorted(k for k in self._facts if self._facts[k] != theirs.get(k))
        if differ:
            return "its interpreter started otherwise than the zygote's: " + ", ".join(differ)
        if request.get("entry") not in ENTRIES:
            return "a garbled request"
        why = self._path_refusal(request.get("path"))
        if why is not None:
            return why
        for name in NAMESPACES:
            if _read(f"/proc/{pid}/ns/{name}", link=True) != _read(f"/proc/self/ns/{name}",
                                                                     link=True):
                return f"it runs in another {name} namespace"
        for name in ("cgroup", "limits", "attr/current"):
            if _read(f"/proc/{pid}/{name}") != _read(f"/proc/self/{name}"):
                return f"its {name} differ from the zygote's"
        if os.getpriority(os.PRIO_PROCESS, pid) != os.getpriority(os.PRIO_PROCESS, 0):
            return "its nice value differs from the zygote's"
        if not (isinstance(request.get("argv"), list)
                and all(isinstance(a, str) for a in request["argv"])
                and isinstance(request.get("env"), dict) and isinstance(request.get("cwd"), str)
                and isinstance(request.get("umask"), int)):
            return "a garbled request"
        return None

    @staticmethod
    def _path_refusal(path: object) -> str | None:
        """Why the launch's ``sys.path`` would import otherwise than the fork's, or None.

        The same as the zygote's, or that with one folder ahead (a script's own folder, as
        the ``host-kernel`` console script has its bin folder) that holds nothing by the
        name of a module the zygote has imported: the fork then takes that path, and every
        import resolves as it would have in the launch."""
        if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
            return "a garbled request"
        if path == sys.path:
            return None
        if path[1:] != sys.path or not path[0]:
            return "its import path differs from the zygote's"
        try:
            names = os.listdir(path[0])
        except OSError:
            return None  # nothing importable there
        top = {m.partition(".")[0] for m in sys.modules}
        shadows = sorted({n.partition(".")[0] for n in names} & top)
        if shadows:
            return f"{path[0]} ahead on its import path holds {shadows[0]!r}, imported already"
        return None

    def _fork(self, conn: socket.socket, request: dict[str, Any], fds: list[int],
              pid: int) -> None:
        import selectors

        if len(os.listdir("/proc/self/task")) != 1:
            raise OSError("the zygote is not single-threaded; it does not fork")
        launcher = os.pidfd_open(pid)
        go_r, go_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            child = os.fork()
        except OSError:
            for fd in (launcher, go_r, go_w):
                os.close(fd)
            raise
        if child == 0:
            try:
                os.close(go_w)
                self._become(conn, request, fds, launcher, go_r)
            except BaseException:  # noqa: BLE001 - said on the launch's stderr, then gone
                import traceback

                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(70)
        os.close(go_r)
        os.close(launcher)
        pidfd = os.pidfd_open(child)
        served: socket.socket | None = conn
        try:
            socket.send_fds(conn, [json.dumps({"pid": child}).encode() + b"\n"], [pidfd])
            ack, _ = read_line(conn, 64, deadline=self._time() + REPLY_TIMEOUT)
            if ack.strip() != b"go":
                raise OSError("the launching process went away")
            os.write(go_w, b"g")
            conn.settimeout(None)
        except (OSError, ValueError):
            # Never two processes for one launch: the launch runs its own now.
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            conn.close()
            served = None
        finally:
            os.close(go_w)
        sys.stderr.write(f"host_kernel zygote: {'forked' if served else 'killed'} {child} "
                         f"for {request['entry']} (pid {pid})\n")
        sys.stderr.flush()
        self._children[pidfd] = (child, served)  # reaped either way
        self._sel.register(pidfd, selectors.EVENT_READ)

    def _reap(self, pidfd: int) -> None:
        self._sel.unregister(pidfd)
        child, conn = self._children.pop(pidfd)
        _, status = os.waitpid(child, 0)
        os.close(pidfd)
        self._last = self._time()
        if conn is None:
            return  # killed before it ran: its launch ran its own
        try:
            conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode()
                         + b"\n")
        except OSError:
            pass  # the launching process is gone (so its relay killed itself)
        conn.close()

    def _become(self, conn: socket.socket, request: dict[str, Any], fds: list[int],
                launcher: int, go: int) -> None:
        """In the child: this launch's relay, once the launching process has said go."""
        import tempfile
        import threading

        os.setsid()
        os.close(self.lock)  # the zygote's alone: a relay must not keep the next one out
        conn.close()
        assert self._listener is not None
        self._listener.close()
        for pidfd, (_, other) in self._children.items():
            if other is not None:
                other.close()
            os.close(pidfd)
        self._sel.close()
        if os.read(go, 1) != b"g":
            os._exit(0)  # the launching process runs its own relay
        os.close(go)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in request["env"].items()})
        tempfile.tempdir = None
        sys.argv = [str(request.get("argv0") or "host_kernel.control"), *request["argv"]]
        sys.path[:] = request["path"]
        sys.executable = str(request.get("executable") or sys.executable)  # its name for it
        _standard_streams()

        def watch() -> None:  # the launching process killed: so is its relay
            select.select([launcher], [], [])
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, daemon=True, name="host-kernel-launcher").start()
        if request["entry"] == "cli":
            from ..cli import main as run
        else:
            from ._run import run
        try:
            code = run(request["argv"])
        except SystemExit as exc:  # argparse's refusal, as the process would have ended
            if isinstance(exc.code, str):
                sys.stderr.write(exc.code + "\n")
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _standard_streams() -> None:
    """``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` over the launch's descriptors, as
    the interpreter makes them at start (a terminal's stdout line-buffered, a pipe's not;
    the encoding and error handling the same start-up gave the zygote)."""
    import io

    def text(fd: int, mode: str, old: Any, line: bool) -> io.TextIOWrapper:
        raw = open(fd, mode + "b", buffering=-1, closefd=False)  # noqa: SIM115 - kept open
        return io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors,
                                line_buffering=line)

    if sys.__stdin__ is not None:
        sys.stdin = sys.__stdin__ = text(0, "r", sys.__stdin__, False)  # type: ignore[misc]
    if sys.__stdout__ is not None:
        sys.stdout = sys.__stdout__ = text(1, "w", sys.__stdout__, os.isatty(1))  # type: ignore[misc]
    if sys.__stderr__ is not None:
        sys.stderr = sys.__stderr__ = text(2, "w", sys.__stderr__, True)  # type: ignore[misc]


def _read(path: str, *, link: bool = False) -> str:
    try:
        if link:
            return os.readlink(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as exc:
        return f"<{exc.errno}>"


def preload() -> None:
    """Everything a relay imports, from its start to its first cells."""
    import importlib

    for name in ("host_kernel.control._run", "host_kernel.control.relay", "host_kernel.cli",
                 "host_kernel._cli.exec", "host_kernel.host._host",
                 "host_kernel.host._relay_support", "host_kernel.host._pool",
                 "host_kernel.factory._client", "host_kernel.factory._adopt",
                 "host_kernel.lineage.graph", "host_kernel.lineage.slice",
                 "host_kernel.sandbox.trace", "jupyter_client.session", "zmq"):
        importlib.import_module(name)
    from .relay import CELL_MODULES

    for name in CELL_MODULES:  # what a relay run alone imports only once it is started
        importlib.import_module(name)
    # jupyter_client's provisioner registry, made at a process's first KernelManager by
    # reading the entry points of every installed distribution (about 10 ms): made here
    # once, every relay and exec forked after it has it.
    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    KernelProvisionerFactory.instance()


def main(argv: list[str] | None = None) -> int:
    import argparse
    import fcntl
    import gc

    from ..factory._place import FactoryUnavailable, Place, idle_seconds

    parser = argparse.ArgumentParser(prog="python -m host_kernel.control._zygote",
                                     description="Fork control-kernel relays ready-imported.")
    parser.add_argument("--folder", default=None, help="the kernel factory's folder")
    parser.add_argument("--idle", type=float, default=None,
                        help="seconds with no relay and no request before exiting")
    parser.add_argument("--foreground", action="store_true", help="do not detach")
    args = parser.parse_args(argv)
    place = Place(Path(args.folder) if args.folder else None)
    try:
        place.ensure()
    except FactoryUnavailable as exc:
        sys.stderr.write(f"host_kernel zygote: {exc}\n")
        return 1
    lock = os.open(socket_path(place).with_suffix(".lock"),
                   os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another zygote serves this user and installation
    if not args.foreground and os.fork() > 0:
        os._exit(0)
    if not args.foreground:
        os.setsid()
    preload()
    gc.collect()
    gc.freeze()  # what the relays share stays shared: no collection touches it
    return Zygote(place, idle_seconds() if args.idle is None else args.idle, lock).serve()


if __name__ == "__main__":
    sys.exit(main())
