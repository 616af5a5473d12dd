"""The Host's side of a sandbox: probing, launching the init process, spawning commands.

Owns :func:`probe` (is Landlock here, which ABI, or why not),
:class:`Confinement` (what a session's record says about it), :class:`Sandbox`
(one kernel generation's init process, reached over a socketpair only the
Host and init hold) and :class:`ConfinedProcess` (a ``host.bash`` command
started by init, with the slice of the ``subprocess.Popen`` interface that
``host/_bash.py`` uses). It does not decide the rules (``policy``) nor
enforce them (``init``, ``landlock``).
"""

from __future__ import annotations

import marshal
import mmap
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .init import recv_with_fds
from .landlock import abi_version
from .policy import SHARED_WRITABLE, Policy, rules_for_record, ruleset_spec

__all__ = ["ConfinedProcess", "Confinement", "Sandbox", "SandboxError", "probe"]

#: Seconds to wait for init's hello, and for a reply to a spawn request.
HELLO_TIMEOUT = 30.0
REPLY_TIMEOUT = 10.0


#: The package's parent folder, put on init's path by hand since ``-S`` skips site.
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_INIT_CODE = ("import sys; sys.path.insert(0, " + repr(_PACKAGE_PARENT) + "); "
              "from host_kernel.sandbox.init import main; sys.exit(main(sys.argv[1:]))")


class SandboxError(OSError):
    """The sandbox could not start, or stopped answering."""


@dataclass(frozen=True)
class Confinement:
    """What the session's record says about confinement."""

    #: "landlock" when enforced, "none" when not.
    status: str
    abi: int = 0
    reason: str | None = None
    network: bool = True
    pid_namespace: bool | None = None
    pid_namespace_reason: str | None = None
    rules: list[dict[str, Any]] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    interpreter_writable: list[str] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.status == "landlock"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "abi": self.abi, "reason": self.reason,
                "network": self.network, "pid_namespace": self.pid_namespace,
                "pid_namespace_reason": self.pid_namespace_reason, "rules": self.rules,
                "hidden": self.hidden, "interpreter_writable": self.interpreter_writable}

    def notice(self) -> str | None:
        """The sentence the first Observation carries when confinement is weaker than usual."""
        if not self.active:
            return (f"confinement: none ({self.reason}). Cell code and host.bash commands run "
                    f"with this user's full rights; the record is protected only by protocol.")
        parts = []
        if self.pid_namespace is False:
            parts.append(f"no PID namespace ({self.pid_namespace_reason}): /proc still shows "
                         f"the Host's processes")
        if self.interpreter_writable:
            parts.append("the interpreter is installed inside the workspace, so confined code "
                         "can change it: " + ", ".join(self.interpreter_writable))
        if not parts:
            return None
        return "confinement: landlock, but " + "; ".join(parts) + "."


def probe(policy: Policy | None, *, network: bool = True) -> Confinement:
    """Whether confinement is possible here, and the rules ``policy`` would apply."""
    abi = abi_version()
    if abi < 1:
        if os.environ.get("HOST_KERNEL_FAKE_NO_LANDLOCK") == "1":
            reason = "Landlock switched off by HOST_KERNEL_FAKE_NO_LANDLOCK=1 (a test switch)"
        elif sys.platform != "linux":
            reason = f"Landlock is Linux-only; this is {sys.platform}"
        else:
            reason = (f"this Linux kernel ({os.uname().release}) has no usable Landlock "
                      f"(needs 5.13+ with landlock in the LSM list)")
        return Confinement("none", 0, reason, network)
    if policy is None:
        return Confinement("landlock", abi, None, network)
    if not network and abi < 4:
        reason = f"network=False needs Landlock ABI 4, this kernel has {abi}"
        return Confinement("none", abi, reason, network)
    return Confinement("landlock", abi, None, network, rules=rules_for_record(policy, abi),
                       hidden=list(policy.hidden),
                       interpreter_writable=policy.interpreter_writable())


class ConfinedProcess:
    """A command init started for the Host; quacks like the part of Popen we use.

    Its status socket (one end held by init) brings the pid, then the exit code;
    the Host's thread that waits reads it directly, with no thread in between. The
    pid is read only when it is needed, so the Host goes on to read the command's
    output while init is still handing it its orders.
    """

    def __init__(self, sandbox: Sandbox, status: socket.socket, args: Sequence[str],
                 pid: int | None = None) -> None:
        self._sandbox = sandbox
        self._status = status
        self.args = list(args)
        self.stdout: BinaryIO | None = None
        self.stderr: BinaryIO | None = None
        self.returncode: int | None = None
        #: Why init could not start the command, if it could not.
        self.error: str | None = None
        self._pid = pid
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        """The command's pid in the sandbox's PID namespace (0 if it never started)."""
        if self._pid is None and self._lock.acquire(timeout=REPLY_TIMEOUT):
            try:
                self._take_pid(REPLY_TIMEOUT)
            finally:
                self._lock.release()
        return self._pid or 0

    def _take_pid(self, timeout: float | None) -> bool:
        """Read init's first message (pid or error); True once it is known. Lock held."""
        if self._pid is not None or self.returncode is not None:
            return True
        reply = self._read(timeout)
        if reply is None:
            return False
        if "pid" in reply:
            self._pid = int(reply["pid"])
            return True
        # init could not start it, or died before it could say.
        self.error = str(reply.get("error", "the sandbox stopped before the command started"))
        self.returncode = 127 if "error" in reply else int(reply["exit"])
        self._status.close()
        return True

    def _read(self, timeout: float | None) -> dict[str, Any] | None:
        """One message from init, or None on timeout; EOF means init is gone (SIGKILL)."""
        self._status.settimeout(timeout)
        try:
            data = self._status.recv(4096)
        except (TimeoutError, BlockingIOError):
            return None
        except OSError:
            data = b""
        if not data:
            return {"exit": -signal.SIGKILL}
        message: dict[str, Any] = marshal.loads(data)
        return message

    def _collect(self, timeout: float | None) -> bool:
        """Take the exit code if it comes within ``timeout``; True once it is known.

        One thread reads at a time; another that finds it reading does not queue
        behind it (``poll`` answers "still running" at once, as Popen's does).
        """
        if self.returncode is not None:
            return True
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return self.returncode is not None
        try:
            if self.returncode is None:
                if not self._take_pid(timeout):
                    return False
                if self.returncode is not None:
                    return True
                reply = self._read(timeout)
                if reply is None:
                    return False
                self.returncode = int(reply["exit"])
                self._status.close()
            return True
        finally:
            self._lock.release()

    def poll(self) -> int | None:
        self._collect(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; ``subprocess.TimeoutExpired`` when it does not come in time."""
        if not self._collect(timeout) or self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the command's whole process group (it leads its own session)."""
        pid = self.pid
        if self.returncode is None and pid:
            self._sandbox.signal(pid, sig)


class Sandbox:
    """One generation's init process, as seen from the Host.

    Create it, put :meth:`argv` in front of the kernel's command line and
    :attr:`pass_fds` into the launch, then call :meth:`started` once the process
    runs. :meth:`spawn` starts a confined command; :meth:`close` lets init go.
    """

    def __init__(self, policy: Policy, abi: int, *, namespaces: bool = True,
                 memory: int | None = None, trace_roots: Sequence[str] | None = None,
                 standby: bool = False) -> None:
        """``memory``: an address-space limit (bytes) for every process of the sandbox.
        ``trace_roots``: trace file access under these folders (host_kernel/sandbox/trace.py).
        ``standby``: started before its session (a pool's): ``policy`` is the pool's broad
        one, and no command runs until :meth:`narrow` stacks the session's on top."""
        self.policy = policy
        self.abi = abi
        self.standby = standby
        self._host_end, self._init_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        setup: dict[str, Any] = {"abi": abi, "namespaces": namespaces, "network": policy.network,
                 "memory": memory, "rules": ruleset_spec(policy), "standby": standby}
        #: The Host's end of the socket init sends traced accesses on (None: untraced).
        self._trace: socket.socket | None = None
        self._trace_lock = threading.Lock()
        #: Shared with init: how many accesses it has seen (trace.py's Supervisor.bump).
        self._counter: mmap.mmap | None = None
        self._collected = 0
        #: Why collecting failed once (every later collection fails the same way).
        self._trace_broken: str | None = None
        if trace_roots is not None:
            self._trace, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            setup["trace_roots"] = list(trace_roots)
            # Where confined code could plant a symlink leading into the roots.
            setup["trace_resolve"] = _resolve_for(policy, trace_roots)
            counter_fd = os.memfd_create("host-kernel-trace", os.MFD_CLOEXEC)
            try:
                os.ftruncate(counter_fd, 8)
                self._counter = mmap.mmap(counter_fd, 8)
                socket.send_fds(self._host_end, [marshal.dumps(setup)],
                                [theirs.fileno(), counter_fd])
            finally:
                os.close(counter_fd)
                theirs.close()
        else:
            self._host_end.send(marshal.dumps(setup))
        self.hello: dict[str, Any] = {}
        #: A process init forked and confined ahead of time: (pid, orders, status) sockets.
        self._offered: tuple[int, socket.socket, socket.socket] | None = None
        self._offer_lock = threading.Lock()

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._init_end.fileno(),)

    def argv(self, kernel_argv: Sequence[str]) -> list[str]:
        # -I -S: no user site, no .pth files, no PYTHON* variables: init is trusted code and
        # runs before any confinement, so nothing the workspace holds may reach it.
        return [sys.executable, "-I", "-S", "-c", _INIT_CODE,
                "--control", str(self._init_end.fileno()), "--", *kernel_argv]

    def started(self) -> dict[str, Any]:
        """Call once init runs: wait for its hello and return it."""
        self._init_end.close()
        self._host_end.settimeout(HELLO_TIMEOUT)
        try:
            data = self._host_end.recv(1 << 16)
        except OSError as exc:
            raise SandboxError(f"the sandbox's init process did not answer: {exc}") from exc
        if not data:
            raise SandboxError("the sandbox's init process exited before it was ready")
        self._host_end.settimeout(None)
        self.hello = marshal.loads(data)
        return self.hello

    @property
    def traced(self) -> bool:
        """Whether init traces this sandbox's processes (known once :meth:`started`)."""
        return self._trace is not None and bool(self.hello.get("traced"))

    def collect_trace(self) -> tuple[list[tuple[Any, ...]], int, str | None,
                                     list[tuple[Any, ...]]]:
        """What init traced since the last collection: ``(accesses, dropped, error,
        before)``.

        Each access is ``(t_ns, source, kind, path[, path2])`` and each before-state
        ``(seq, source, path, type, size, mtime_ns, ctime_ns, inode, sha256)``
        (trace.py); ``error`` says why some process went untraced. Raises SandboxError
        when init is gone.
        """
        if self._trace is None:
            return [], 0, None, []
        with self._trace_lock:
            if self._trace_broken is not None:
                raise SandboxError(self._trace_broken)
            seen = int.from_bytes(self._counter[:8], "little") if self._counter else -1
            if seen == self._collected:
                return [], 0, None, []  # nothing new since the last collection
            try:
                self._trace.settimeout(REPLY_TIMEOUT)
                self._trace.send(b"collect")
                head = marshal.loads(self._trace.recv(4096))
                size = int(head["size"])
                parts = []
                got = 0
                while got < size:
                    part = self._trace.recv(1 << 17)
                    if not part:
                        raise OSError("init closed the trace socket")
                    parts.append(part)
                    got += len(part)
            except (OSError, EOFError, ValueError, KeyError) as exc:
                # A reply cut short leaves the socket out of step: never read it again.
                self._trace_broken = f"the tracer stopped answering: {exc}"
                raise SandboxError(self._trace_broken) from exc
            self._collected = seen
        accesses: list[tuple[Any, ...]] = []
        before: list[tuple[Any, ...]] = []
        if size:
            accesses, before = marshal.loads(b"".join(parts))
        return accesses, int(head.get("dropped", 0)), head.get("error"), before

    def _take_offer(self) -> tuple[int, socket.socket, socket.socket] | None:
        """The waiting process init offered last, if its offer has arrived (no waiting)."""
        with self._offer_lock:
            while True:
                try:
                    data, fds = recv_with_fds(self._host_end, 4096, 2, socket.MSG_DONTWAIT)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                message = marshal.loads(data)
                if "ready" in message and len(fds) == 2:
                    if self._offered is not None:  # an older offer: let it go
                        self._offered[1].close()
                        self._offered[2].close()
                    self._offered = (int(message["ready"]), socket.socket(fileno=fds[0]),
                                     socket.socket(fileno=fds[1]))
                else:
                    for fd in fds:
                        os.close(fd)
            offered, self._offered = self._offered, None
            return offered

    def spawn(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
              stdin: int, stdout: int, stderr: int) -> ConfinedProcess:
        """Start ``argv`` confined, in a session of its own, with these descriptors.

        Most often the process is already there: init forked and confined it ahead of
        time, and the orders go straight to it. Otherwise init forks one on request.
        """
        # Resolved here with the command's own PATH, as execvp would, so the confined
        # child makes one execve instead of a walk along PATH.
        found = shutil.which(argv[0], path=env.get("PATH", os.defpath)) if argv else None
        orders = {"argv": list(argv), "cwd": cwd, "env": dict(env), "file": found or argv[0]}
        offered = self._take_offer()
        if offered is not None:
            pid, orders_socket, status = offered
            try:
                socket.send_fds(orders_socket, [marshal.dumps(orders)], [stdin, stdout, stderr])
            except OSError:
                status.close()  # it died waiting: ask init for a fresh one below
            else:
                return ConfinedProcess(self, status, argv, pid=pid)
            finally:
                orders_socket.close()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        message = marshal.dumps({"op": "spawn", **orders})
        try:
            socket.send_fds(self._host_end, [message], [stdin, stdout, stderr, theirs.fileno()])
        except OSError as exc:
            mine.close()
            raise SandboxError(f"the sandbox has stopped (the kernel generation ended): "
                               f"{exc}") from exc
        finally:
            theirs.close()
        return ConfinedProcess(self, mine, argv)

    def narrow(self, policy: Policy, trace_roots: Sequence[str] | None) -> None:
        """A standby sandbox's session: every process started from now on enters
        ``policy``'s ruleset on top of the pool's, and the tracer keeps ``trace_roots``.

        The kernel already running narrows itself (host_kernel/kernel/standby.py).
        """
        if not self.standby:
            raise SandboxError("only a standby sandbox is narrowed after its start")
        message = {"op": "narrow", "abi": self.abi, "network": policy.network,
                   "rules": ruleset_spec(policy)}
        if trace_roots is not None:
            message["trace_roots"] = list(trace_roots)
            message["trace_resolve"] = _resolve_for(policy, trace_roots)
        try:
            self._host_end.send(marshal.dumps(message))
        except OSError as exc:
            raise SandboxError(f"the standby sandbox has stopped: {exc}") from exc
        self.policy = policy
        self.standby = False

    def signal(self, pid: int, sig: int) -> None:
        try:
            self._host_end.send(marshal.dumps({"op": "kill", "pid": pid, "sig": int(sig)}))
        except OSError:
            pass

    def close(self) -> None:
        """Let init go: seeing its socket close, it takes its namespace down."""
        if self._init_end.fileno() >= 0:
            self._init_end.close()
        try:
            self._host_end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._host_end.close()
        if self._trace is not None:
            self._trace.close()
        if self._counter is not None:
            self._counter.close()
            self._counter = None
        with self._offer_lock:
            if self._offered is not None:
                self._offered[1].close()
                self._offered[2].close()
                self._offered = None


def _resolve_for(policy: Policy, roots: Sequence[str]) -> list[str]:
    """Where confined code could plant a symlink leading into the roots."""
    return [p for p in (*policy.writable, *SHARED_WRITABLE)
            if not any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)]


def popen_confined(sandbox: Sandbox, argv: Sequence[str], *, cwd: str,
                   env: Mapping[str, str]) -> ConfinedProcess:
    """Like ``Popen(argv, stdin=DEVNULL, stdout=PIPE, stderr=PIPE, start_new_session=True)``."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        proc = sandbox.spawn(argv, cwd=cwd, env=env, stdin=devnull, stdout=out_w, stderr=err_w)
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        for fd in (out_w, err_w, devnull):
            os.close(fd)
    proc.stdout = os.fdopen(out_r, "rb", buffering=0)
    proc.stderr = os.fdopen(err_r, "rb", buffering=0)
    return proc
