"""The Host's side of a sandbox: probing, launching the init process, spawning commands.

Owns :class:`Sandbox` (one kernel generation's init process, reached over a
socketpair only the Host and init hold, with its private view, its network
namespace and slirp4netns, its cgroups) and :class:`ConfinedProcess` (a
``host.bash`` command started by init, with the slice of the
``subprocess.Popen`` interface that ``host/_bash.py`` uses). :func:`probe` and
:class:`Confinement` (what a session's record says about confinement) live in
``confinement`` and are re-exported here. It does not decide the rules
(``policy``, ``limits``) nor enforce them (``init``, ``world``, ``landlock``).
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
from typing import Any, BinaryIO

from .confinement import Confinement, probe
from .init import recv_with_fds
from .limits import Cgroups, KernelLimits
from .limits import sweep as sweep_cgroups
from .netns import Outbound, isolation_off, machine_resolv, outbound_unavailable
from .netns import reap as reap_outbound
from .policy import SHARED_WRITABLE, Policy, ruleset_spec, view_of

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
                 standby: bool = False, keep: Sequence[str | os.PathLike[str]] = (),
                 limits: KernelLimits | None = None, resolv: str | None = None) -> None:
        """``memory``: an address-space limit (bytes) for every process of the sandbox.
        ``trace_roots``: trace file access under these folders (host_kernel/sandbox/trace.py).
        ``standby``: started before its session (a pool's): ``policy`` is the pool's broad
        one, and no command runs until :meth:`narrow` stacks the session's on top.
        ``keep``: paths beside the policy's that the private view shows (the session's
        runtime folder, with its call socket). ``limits``: the generation's bounds (in
        cgroups of its own where the system delegates them, else rlimits). ``resolv``:
        the resolv.conf the sandbox sees when it has outbound traffic (default: the
        machine's, or slirp4netns's resolver where the machine's is on its own loopback).

        With ``namespaces`` (and unless ``HOST_KERNEL_ISOLATION=off``) the sandbox has a
        private view (policy.view_of) and a network namespace of its own: loopback only,
        or, when the policy allows network, outbound traffic through slirp4netns."""
        self.policy = policy
        self.abi = abi
        self.standby = standby
        self._host_end, self._init_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        setup: dict[str, Any] = {"abi": abi, "namespaces": namespaces, "network": policy.network,
                 "memory": memory, "rules": ruleset_spec(policy), "standby": standby}
        off = isolation_off() if namespaces else "no namespaces asked for"
        #: Why there is no network namespace (None: init makes one).
        self._no_netns = off or (outbound_unavailable() if policy.network else None)
        #: Whether slirp4netns is to serve the namespace (a standby's: once narrowed).
        self._wants_outbound = self._no_netns is None and policy.network
        self.outbound: Outbound | None = None
        self._outbound_error: str | None = None
        #: Why there is no private view (None: init makes one).
        self._no_view = off
        if off is None:
            setup["view"] = list(view_of(policy, keep))
        if self._no_netns is None:
            setup["netns"] = True
            if policy.network:
                setup["resolv"] = resolv if resolv is not None else machine_resolv()
        sweep_cgroups()
        reap_outbound()
        self.limits = limits
        self.cgroups = Cgroups(limits) if limits is not None else None
        if self.cgroups is not None:
            setup["limits"] = self.cgroups.spec()
        #: The limit init ended the generation at ("memory", "processes"), once it says so.
        self._limit: str | None = None
        #: The Host's end of the socket init sends traced accesses on (None: untraced).
        self._trace: socket.socket | None = None
        self._trace_lock = threading.Lock()
        #: Shared with init: how many accesses it has seen (trace.py's Supervisor.bump).
        self._counter: mmap.mmap | None = None
        self._counter_fd = -1
        self._collected = 0
        #: Why collecting failed once (every later collection fails the same way).
        self._trace_broken: str | None = None
        if trace_roots is not None:
            self._trace, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            setup["trace_roots"] = list(trace_roots)
            # Where confined code could plant a symlink leading into the roots.
            setup["trace_resolve"] = _resolve_for(policy, trace_roots)
            counter_fd = os.memfd_create("host-kernel-trace", os.MFD_CLOEXEC)
            # Kept open: a standby's sandbox is handed to another process with it
            # (host_kernel/factory), which maps the same counter.
            self._counter_fd = counter_fd
            try:
                os.ftruncate(counter_fd, 8)
                self._counter = mmap.mmap(counter_fd, 8)
                socket.send_fds(self._host_end, [marshal.dumps(setup)],
                                [theirs.fileno(), counter_fd])
            finally:
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

    def started(self, wait_network: bool = True) -> dict[str, Any]:
        """Call once init runs: wait for its hello and return it.

        When the sandbox has outbound traffic, slirp4netns is attached now; with
        ``wait_network=False`` its tap device comes up while the caller goes on (the
        kernel starting), and :meth:`wait_outbound` waits for it before the first cell."""
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
        if self._wants_outbound and not self.standby:
            self._connect_outbound()
            if wait_network:
                self.wait_outbound()
        return self.hello

    def _connect_outbound(self) -> None:
        if not self.hello.get("network_namespace"):
            return
        try:
            self.outbound = Outbound(int(self.hello["launcher"]))
        except (OSError, KeyError, ValueError) as exc:
            self._outbound_error = f"slirp4netns did not start: {exc}"

    def wait_outbound(self) -> None:
        """Return once slirp4netns has the network up (or failed: :meth:`isolation` says)."""
        if self.outbound is not None and self.outbound.error == "not ready yet":
            self._outbound_error = self.outbound.wait()

    def isolation(self) -> dict[str, Any]:
        """What the record says of this sandbox's private world (known once started)."""
        hello = self.hello
        netns = bool(hello.get("network_namespace"))
        if not netns:
            outbound = "the machine's"
        elif not self.policy.network:
            outbound = "none"
        elif self.outbound is not None and self._outbound_error is None:
            outbound = "slirp4netns"
        else:
            outbound = "none"
        network: dict[str, Any] = {
            "namespace": netns, "outbound": outbound, "machine_loopback": not netns,
            "reason": (self._no_netns or hello.get("network_reason")) if not netns
            else self._outbound_error or hello.get("network_reason")}
        view: dict[str, Any] = {"private": bool(hello.get("view")),
                                "masked": list(hello.get("masked", ())),
                                "reason": None if hello.get("view") else
                                (self._no_view or hello.get("view_reason"))}
        out: dict[str, Any] = {"network": network, "view": view,
                               "capabilities": hello.get("capabilities")}
        if self.limits is not None:
            out["limits"] = {"asked": self.limits.to_dict(),
                             "enforced": dict(hello.get("limits", {})),
                             "cgroup_missing": dict(self.cgroups.why) if self.cgroups else {},
                             "error": hello.get("limits_error")}
        return out

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
            while self._receive(socket.MSG_DONTWAIT) is not None:
                pass
            offered, self._offered = self._offered, None
            return offered

    def _receive(self, flags: int = 0) -> dict[str, Any] | None:
        """One message from init, kept where it belongs (an offer, a limit reached); None
        when there is none (``MSG_DONTWAIT``) or init is gone. Offer lock held."""
        try:
            data, fds = recv_with_fds(self._host_end, 4096, 2, flags)
        except (BlockingIOError, OSError):
            return None
        if not data:
            return None
        message: dict[str, Any] = marshal.loads(data)
        if "ready" in message and len(fds) == 2:
            if self._offered is not None:  # an older offer: let it go
                self._offered[1].close()
                self._offered[2].close()
            self._offered = (int(message["ready"]), socket.socket(fileno=fds[0]),
                             socket.socket(fileno=fds[1]))
            return message
        if "limit" in message:
            self._limit = str(message["limit"])
        if "narrowed" in message and len(fds) == 1:
            message["ruleset"] = fds[0]
            return message
        for fd in fds:
            os.close(fd)
        return message

    def limit_reached(self) -> str | None:
        """Which limit ended the generation ("memory", "processes"), if one did: what init
        said, else what the sandbox's cgroups count."""
        if self._host_end.fileno() >= 0:
            with self._offer_lock:
                while self._receive(socket.MSG_DONTWAIT) is not None:
                    pass
        if self._limit is None and self.cgroups is not None:
            self._limit = self.cgroups.reached()
        return self._limit

    def spawn(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
              stdin: int, stdout: int, stderr: int, file: str | None = None
              ) -> ConfinedProcess:
        """Start ``argv`` confined, in a session of its own, with these descriptors.

        Most often the process is already there: init forked and confined it ahead of
        time, and the orders go straight to it. Otherwise init forks one on request.
        ``file`` is the file to exec, when the caller has looked it up already.
        """
        # Resolved here with the command's own PATH, as execvp would, so the confined
        # child makes one execve instead of a walk along PATH.
        found = file if file is not None else (
            shutil.which(argv[0], path=env.get("PATH", os.defpath)) if argv else None)
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

    def narrow(self, policy: Policy, trace_roots: Sequence[str] | None,
               keep: Sequence[str | os.PathLike[str]] = ()) -> int:
        """A standby sandbox's session: its paths (``policy``'s, and ``keep``) shown in the
        private view, every process started from now on entering ``policy``'s ruleset on
        top of the pool's, the tracer keeping ``trace_roots``, and slirp4netns attached
        when the session has network.

        Returns the ruleset (a descriptor the caller closes), built by init after the
        session's paths were bound into its view, for the kernel already running to enter
        (host_kernel/kernel/standby.py). Call :meth:`wait_outbound` before its first cell.
        """
        if not self.standby:
            raise SandboxError("only a standby sandbox is narrowed after its start")
        message: dict[str, Any] = {"op": "narrow", "abi": self.abi, "network": policy.network,
                                   "rules": ruleset_spec(policy)}
        if self.hello.get("view"):
            message["keep"] = view_of(policy, keep)[1]
        if trace_roots is not None:
            message["trace_roots"] = list(trace_roots)
            message["trace_resolve"] = _resolve_for(policy, trace_roots)
        try:
            self._host_end.send(marshal.dumps(message))
            self._host_end.settimeout(REPLY_TIMEOUT)
            with self._offer_lock:
                while True:
                    reply = self._receive()
                    if reply is None:
                        raise OSError("init closed its socket")
                    if "narrowed" in reply:
                        break
        except OSError as exc:
            raise SandboxError(f"the standby sandbox has stopped: {exc}") from exc
        finally:
            if self._host_end.fileno() >= 0:
                self._host_end.settimeout(None)
        if "ruleset" not in reply:
            raise SandboxError("the standby sandbox sent no ruleset for its kernel")
        ruleset = int(reply["ruleset"])
        if reply.get("error"):
            os.close(ruleset)
            raise SandboxError(str(reply["error"]))
        self.policy = policy
        self.standby = False
        self._wants_outbound = self._no_netns is None and policy.network
        if self._wants_outbound:
            self._connect_outbound()
        return ruleset

    # ------------------------------------------------------------------ another process's

    def handover(self) -> tuple[dict[str, Any], list[int]]:
        """A started standby sandbox as another process takes it (host_kernel/factory):
        its state, and the descriptors it lives by (init's socket, the tracer's socket and
        counter). The caller sends both, then :meth:`forget` s its own copies."""
        if not self.standby or self._init_end.fileno() >= 0:
            raise SandboxError("only a started standby sandbox is handed over")
        fds = [self._host_end.fileno()]
        if self._trace is not None:
            fds += [self._trace.fileno(), self._counter_fd]
        state = {"policy": self.policy.to_dict(), "abi": self.abi, "hello": self.hello,
                 "no_netns": self._no_netns, "no_view": self._no_view,
                 "limits": None if self.limits is None else self.limits.to_dict(),
                 "cgroups": None if self.cgroups is None
                 else {"folders": self.cgroups.folders, "why": self.cgroups.why},
                 "traced": self._trace is not None}
        return state, fds

    def forget(self) -> None:
        """Close this process's copies of a handed-over sandbox's descriptors, leaving its
        processes and cgroups alone (they are the taker's now)."""
        self._host_end.close()
        self._close_trace()
        self.cgroups = None

    def _close_trace(self) -> None:
        if self._trace is not None:
            self._trace.close()
        if self._counter is not None:
            self._counter.close()
            self._counter = None
        if self._counter_fd >= 0:
            os.close(self._counter_fd)
            self._counter_fd = -1

    @classmethod
    def adopted(cls, state: dict[str, Any], fds: Sequence[int]) -> Sandbox:
        """The sandbox :meth:`handover` described, in this process, owning ``fds``."""
        self = cls.__new__(cls)
        self.policy = Policy.from_dict(state["policy"])
        self.abi = int(state["abi"])
        self.standby = True
        self._host_end = socket.socket(fileno=fds[0])
        self._init_end = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._init_end.close()  # init's end went to init long ago
        self._no_netns = state["no_netns"]
        self._no_view = state["no_view"]
        self._wants_outbound = self._no_netns is None and self.policy.network
        self.outbound = None
        self._outbound_error = None
        limits = state["limits"]
        self.limits = None if limits is None else KernelLimits(**limits)
        self.cgroups = None
        if self.limits is not None and state["cgroups"] is not None:
            self.cgroups = Cgroups.adopted(self.limits, state["cgroups"]["folders"],
                                           state["cgroups"]["why"])
        self._limit = None
        self._trace = None
        self._trace_lock = threading.Lock()
        self._counter = None
        self._counter_fd = -1
        self._collected = 0
        self._trace_broken = None
        if state["traced"]:
            self._trace = socket.socket(fileno=fds[1])
            self._counter_fd = fds[2]
            self._counter = mmap.mmap(self._counter_fd, 8)
        self.hello = dict(state["hello"])
        self._offered = None
        self._offer_lock = threading.Lock()
        return self

    def signal(self, pid: int, sig: int) -> None:
        try:
            self._host_end.send(marshal.dumps({"op": "kill", "pid": pid, "sig": int(sig)}))
        except OSError:
            pass

    def close(self) -> None:
        """Let init go: seeing its socket close, it takes its namespace down. Safe to
        call twice; :meth:`release` finishes once the processes are reaped."""
        if self._host_end.fileno() >= 0:
            with self._offer_lock:  # what init said last (a limit reached) is kept
                while self._receive(socket.MSG_DONTWAIT) is not None:
                    pass
        if self._init_end.fileno() >= 0:
            self._init_end.close()
        try:
            self._host_end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._host_end.close()
        self._close_trace()
        with self._offer_lock:
            if self._offered is not None:
                self._offered[1].close()
                self._offered[2].close()
                self._offered = None
        if self.outbound is not None:
            self.outbound.close()
        if self.cgroups is not None:
            self.limit_reached()  # read now: the counters go with the folders
            self.cgroups.remove(0.0)

    def release(self, wait: float = 5.0) -> None:
        """After the sandbox's processes were reaped: remove its cgroups (waiting up to
        ``wait`` seconds for the last to go) and reap slirp4netns."""
        self.close()
        if self.cgroups is not None:
            self.cgroups.remove(wait)
        reap_outbound(wait)
        sweep_cgroups()


def _resolve_for(policy: Policy, roots: Sequence[str]) -> list[str]:
    """Where confined code could plant a symlink leading into the roots."""
    return [p for p in (*policy.writable, *SHARED_WRITABLE)
            if not any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)]


def popen_confined(sandbox: Sandbox, argv: Sequence[str], *, cwd: str,
                   env: Mapping[str, str], file: str | None = None) -> ConfinedProcess:
    """Like ``Popen(argv, stdin=DEVNULL, stdout=PIPE, stderr=PIPE, start_new_session=True)``;
    ``file`` as :meth:`Sandbox.spawn` takes it."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        proc = sandbox.spawn(argv, cwd=cwd, env=env, stdin=devnull, stdout=out_w, stderr=err_w,
                             file=file)
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
