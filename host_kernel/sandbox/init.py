"""The sandbox's first process: namespaces, ``/proc``, Landlock, then the kernel.

Run by the Host as ``python -I -S -c "…main(…)" --control FD -- ARGV…``
(jupyter_client launches it in place of the kernel). It owns, in order:

1. **Launcher** (in the Host's PID namespace): reads the session's ruleset from
   the control socket, joins the sandbox's cgroups and sets its rlimits
   (host_kernel/sandbox/world.py ``Limits``), then ``unshare``s a user, mount,
   PID and network namespace, mapping the user to itself (no new privilege
   outside), and forks. It waits for its child and exits with its status, so
   jupyter_client sees one process whose life is the kernel's.
2. **Init** (PID 1 of the new namespace): mounts a fresh ``/proc`` that shows
   only the sandbox's processes (the Host, its pid and its environment block are
   not there to read), builds the private view (fresh ``/tmp``, ``/dev/shm`` and
   runtime folders, the session's own paths bound back: ``world.View``), brings
   ``lo`` up in the network namespace (the Host attaches slirp4netns to it when
   the session has network), builds the Landlock ruleset once (after the view,
   so its paths name the sandbox's own folders), and starts the kernel. It ends
   the generation when a limit is reached (an OOM kill, a refused fork) and says
   which to the Host.
3. **Spawner**: keeps one command's process forked and confined ahead of
   time and hands the Host its two sockets (orders in, exit status out), so a
   ``host.bash`` call sends its orders straight to it; serves the Host's
   requests over the control socket (a socketpair nobody else holds): start a
   command on request when none is waiting, signal a command's process group;
   reports each exit, and reaps every orphan, as an init must.

Each child is confined between fork and exec: parent-death signal, session,
cwd, standard streams, default signal dispositions, ``no_new_privs`` and
``landlock_restrict_self``, every other descriptor closed, then ``execve``.
Init itself is trusted code and is not Landlocked; no confined process can
ptrace it, signal it (Landlock scopes, ABI 6) or reach its control socket.

A **standby** sandbox (a pool's, host_kernel/host/_pool.py) is started before its
session with the pool's broad ruleset: it forks no command ahead of time until the
Host sends the session's ruleset (op ``narrow``), which every later child enters on
top of the first; the kernel narrows itself (host_kernel/kernel/standby.py).

When the namespaces cannot be made (no unprivileged user namespaces, or a
``/proc`` that may not be mounted again), the launcher serves as spawner itself
and says why in its hello: confinement is then Landlock alone. A network
namespace or a private view that cannot be made is left out alone, and the
hello says why.

This module imports little on purpose (no json, socket or signal wrappers: their
enum imports cost more than the rest of the start): it is on the path of every
kernel start. Messages are ``marshal``-ed dicts; both ends run the same interpreter.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # (no stub; the enum-free signal module)
import _socket
import ctypes
import marshal
import os
import select
import sys
import time

from .._fds import recv_fds, send_fds
from . import world

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_PR_SET_PDEATHSIG = 1
_MAX_MSG = 1 << 20
_MAX_FDS = 8
#: Seconds of quiet after which init forks the next command's process ahead of time.
_PREPARE_WHEN_IDLE = 0.02
_SIGKILL = _signal.SIGKILL
#: In the kernel's command line, replaced by the spawner's own pid (the kernel's parent).
SPAWNER_PID = "@SPAWNER_PID@"
#: Seconds between init's looks at the sandbox's limits (a refused fork, a crowded /proc).
_WATCH_EVERY = 0.2
#: init's exit status when it ended the generation at a limit (as if SIGKILLed).
LIMIT_EXIT = 137

_libc = ctypes.CDLL(None, use_errno=True)


def _send(ctl: Any, message: dict[str, Any]) -> None:
    try:
        ctl.send(marshal.dumps(message))
    except OSError:
        pass  # the Host is gone; the loop sees EOF next


def recv_with_fds(sock: Any, bufsize: int = _MAX_MSG, maxfds: int = _MAX_FDS,
                  flags: int = 0) -> tuple[bytes, list[int]]:
    """One message and the descriptors it carried (the Host's side uses it too)."""
    return recv_fds(sock, bufsize, maxfds, flags)


def _exec_child(argv: list[str], cwd: str, env: dict[str, str], fds: list[int],
                rulesets: list[int], new_session: bool, handoff: Any) -> None:
    """In a child forked on demand (the kernel, or a command when none was waiting):
    confine, then exec. Never returns."""
    try:
        _confine_self(rulesets, new_session)
        _trace_self(handoff)
        _exec_orders({"argv": argv, "cwd": cwd, "env": env}, fds)
    except BaseException as exc:  # noqa: BLE001 - report and die; never return to the loop
        _cannot_start(argv, exc)


def _exec_orders(msg: dict[str, Any], fds: list[int]) -> None:
    """cwd, the three standard streams, nothing else open, then ``execve``."""
    argv = msg["argv"]
    os.chdir(msg["cwd"])
    for target, fd in enumerate(fds[:3]):
        if fd != target:
            os.dup2(fd, target)
    os.closerange(3, 1 << 20)
    file = msg.get("file") or argv[0]
    if "/" in file:
        os.execve(file, argv, msg["env"])
    os.execvpe(file, argv, msg["env"])


def _cannot_start(argv: list[str], exc: BaseException) -> None:
    """Say why on the command's stderr and end the child; it never returns to init's loop.
    The status is a shell's: 126 when the file may not be run, 127 otherwise."""
    try:
        os.write(2, f"host_kernel sandbox: cannot start {argv[:1]}: {exc}\n".encode())
    finally:
        os._exit(126 if isinstance(exc, PermissionError) else 127)


def _confine_self(rulesets: list[int], new_session: bool) -> None:
    """The part of a child's start that needs no orders: death signal, session, default
    signal dispositions, then Landlock: each ruleset in turn, stacked (a domain of its own)."""
    _libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    if new_session:
        os.setsid()
    _signal.set_wakeup_fd(-1)
    for sig in (_signal.SIGINT, _signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGCHLD,
                _signal.SIGTERM, _signal.SIGHUP):
        _signal.signal(sig, _signal.SIG_DFL)
    if rulesets:
        from .landlock import restrict_self
        for fd in rulesets:
            restrict_self(fd)


def _trace_self(handoff: Any) -> None:
    """Install the tracing filter and hand its listener to init (docs/lineage.md).

    Nothing the filter watches may be called between the two: until init holds the
    listener, such a call would wait for an answer nobody gives. If the filter cannot
    be installed, say why instead; the process then runs untraced and the record says so.
    """
    if handoff is None:
        return
    from .trace import install_filter
    try:
        listener = install_filter()
    except OSError as exc:
        handoff.send(marshal.dumps({"error": f"seccomp filter refused: {exc}"}))
    else:
        send_fds(handoff, marshal.dumps({"listener": True}), [listener])
        os.close(listener)
    handoff.close()


def _await_orders(orders: Any, rulesets: list[int], handoff: Any) -> None:
    """A command's process forked ahead of time: confine now, wait, then exec. Never returns.

    Forking and confining while init is idle takes the fork, Python's after-fork work
    and the Landlock call off the path of a ``host.bash`` call; only the orders (argv,
    cwd, environment, standard streams) are left for when the command is asked for.
    """
    argv: list[str] = ["?"]
    try:
        _confine_self(rulesets, new_session=True)
        _trace_self(handoff)
        keep = orders.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 20)
        data, fds = recv_with_fds(orders)
        if not data or len(fds) != 3:
            os._exit(0)  # init let us go unused
        msg = marshal.loads(data)
        argv = msg["argv"]
        _exec_orders(msg, fds)
    except BaseException as exc:  # noqa: BLE001 - report and die; never return to the loop
        _cannot_start(argv, exc)


class _Spawner:
    """The request loop: start confined commands, signal them, report their exits."""

    def __init__(self, ctl: Any, ruleset_fd: int, supervisor: Any = None,
                 trace: Any = None, standby: bool = False, view: Any = None,
                 limits: Any = None) -> None:
        self.ctl = ctl
        #: The private view (world.View; None without one) and the limits (world.Limits).
        self.view = view
        self.limits = limits
        #: The rulesets every child enters, in order: the first from the setup; a standby
        #: sandbox gets the session's on top when it is handed out (op "narrow").
        self.rulesets = [] if ruleset_fd < 0 else [ruleset_fd]
        #: A standby sandbox offers no command process until it knows its session.
        self.standby = standby
        #: The tracing supervisor (host_kernel/sandbox/trace.py) and the socket the Host
        #: collects its accesses on; both None when the session is not traced.
        self.supervisor = supervisor
        self.trace = trace
        #: Why some process could not be traced (sent with every collection).
        self.trace_error: str | None = None
        self._poll = select.poll()
        #: pid → the command's status socket (the Host reads its pid, then its exit).
        self.children: dict[int, Any] = {}
        self.main_pid = -1
        #: The process last offered to the Host, until it exits (at most one at a time).
        self.offered: int | None = None
        #: An offer whose process is still confining itself: (pid, the socket its tracing
        #: listener comes on, orders and status sockets for the Host). Init serves calls
        #: meanwhile, and hands the offer over once it holds the listener.
        self._pending: tuple[int, Any, Any, Any] | None = None

    def offer(self) -> None:
        """Fork the next command's process ahead of time and hand the Host its sockets.

        The child confines itself and waits for orders on a socket whose other end
        goes to the Host, with the command's status socket: a ``host.bash`` call then
        sends its orders straight to the waiting process, and init only reports the
        exit. Another is offered once this one has exited.

        A traced child is handed over only once init holds its tracing listener, but
        init does not wait for that here: the child's confining (Landlock, the filter)
        takes a millisecond or more, just when the Host is recording the last command
        and the kernel carries on, and their traced calls (and the Host's collection)
        are served meanwhile; :meth:`_offer_listened` hands it over.
        """
        orders_init, orders_child = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        status_init, status_host = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        mine, theirs = self._handoff()
        pid = os.fork()
        if pid == 0:
            _await_orders(orders_child, self.rulesets, theirs)  # closes every other descriptor
        orders_child.close()
        self.children[pid] = status_init
        self.offered = pid
        if mine is None:
            self._hand_over(pid, orders_init, status_host)
            return
        theirs.close()
        self._pending = (pid, mine, orders_init, status_host)
        self._poll.register(mine.fileno(), select.POLLIN)

    def _offer_listened(self) -> None:
        """The pending offer's child sent its listener (or died trying): serve it, then
        hand the offer to the Host."""
        if self._pending is None:
            return
        pid, mine, orders_init, status_host = self._pending
        self._pending = None
        self._poll.unregister(mine.fileno())
        self._listen(pid, mine)
        self._hand_over(pid, orders_init, status_host)

    def _drop_pending(self) -> None:
        """The pending offer's child died before it was handed over: forget the offer."""
        if self._pending is not None:
            _, mine, orders_init, status_host = self._pending
            self._pending = None
            self._poll.unregister(mine.fileno())
            for sock in (mine, orders_init, status_host):
                sock.close()

    def _hand_over(self, pid: int, orders_init: Any, status_host: Any) -> None:
        try:
            send_fds(self.ctl, marshal.dumps({"ready": pid}),
                             [orders_init.fileno(), status_host.fileno()])
        except OSError:
            pass  # the Host is gone; the loop sees EOF next
        finally:
            orders_init.close()
            status_host.close()

    def spawn(self, argv: list[str], cwd: str, env: dict[str, str], fds: list[int],
              new_session: bool, source: int | None = None) -> int:
        """Fork, confine and exec; ``source`` names the tracing listener (default: the pid)."""
        mine, theirs = self._handoff()
        pid = os.fork()
        if pid == 0:
            _exec_child(argv, cwd, env, fds, self.rulesets, new_session, theirs)
        self._watch(pid if source is None else source, mine, theirs)
        return pid

    def _handoff(self) -> tuple[Any, Any]:
        if self.supervisor is None:
            return None, None
        return _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)

    def _watch(self, source: int, mine: Any, theirs: Any) -> None:
        """Take the listener the child just installed and serve it from now on."""
        if mine is None:
            return
        theirs.close()
        self._listen(source, mine)

    def _listen(self, source: int, mine: Any) -> None:
        """Read the child's listener from ``mine`` (waiting for it) and serve it."""
        try:
            data, fds = recv_with_fds(mine, 4096, 1)
            # No message: the child died before its exec, so nothing of it ran untraced.
            message = marshal.loads(data) if data else {}
        except (OSError, ValueError, EOFError) as exc:
            message, fds = {"error": f"no listener from the child: {exc}"}, []
        finally:
            mine.close()
        if fds:
            self.supervisor.add(fds[0], source)
            self._poll.register(fds[0], select.POLLIN)
        elif "error" in message and self.trace_error is None:
            self.trace_error = str(message["error"])
            self.supervisor.bump()  # so the Host asks, and hears why

    def serve(self, kernel_argv: list[str]) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        _signal.set_wakeup_fd(wake_w)
        _signal.signal(_signal.SIGCHLD, lambda *_: None)
        me = str(os.getpid())
        kernel_argv = [a.replace(SPAWNER_PID, me) for a in kernel_argv]
        ctl_fd = self.ctl.fileno()
        trace_fd = -1 if self.trace is None else self.trace.fileno()
        for fd in (ctl_fd, wake_r, trace_fd):
            if fd >= 0:
                self._poll.register(fd, select.POLLIN)
        watched: list[int] = [] if self.limits is None else list(self.limits.fds)
        for fd in watched:
            self._poll.register(fd, self.limits.poll_mask)
        every = int(_WATCH_EVERY * 1000)
        next_look = 0.0
        self.main_pid = self.spawn(kernel_argv, os.getcwd(), dict(os.environ), [0, 1, 2],
                                   new_session=False, source=0)
        if not self.standby:
            self.offer()
        listeners = {} if self.supervisor is None else self.supervisor.sources
        while True:
            # When the offered process has been used and has exited, offer the next when
            # init is idle (not while a command starts and runs on the same CPUs).
            idle = (None if self.offered is not None or self.standby
                    else int(_PREPARE_WHEN_IDLE * 1000))
            wait = idle if self.limits is None else every if idle is None else min(idle, every)
            try:
                events = self._poll.poll(wait)
            except InterruptedError:
                continue
            if self.limits is not None:
                now = time.monotonic()
                if now >= next_look or any(fd in watched for fd, _ in events):
                    next_look = now + _WATCH_EVERY
                    reached = self.limits.check()
                    if reached is not None:
                        return self._limit_reached(reached)
            if not events:
                if idle is not None:
                    self.offer()
                continue
            ready = set()
            for fd, mask in events:
                if fd in listeners:
                    # Calls waiting first: a traced process is stopped until answered.
                    if not (mask & select.POLLIN and self.supervisor.serve(fd)):
                        self._poll.unregister(fd)
                        self.supervisor.remove(fd)
                else:
                    ready.add(fd)
            if self._pending is not None and self._pending[1].fileno() in ready:
                self._offer_listened()
            if trace_fd in ready and not self._collect():
                self.trace = None
                self._poll.unregister(trace_fd)
                trace_fd = -1
            if wake_r in ready:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                code = self._reap()
                if code is not None:
                    return code
            if ctl_fd in ready and not self._request():
                return self._shutdown()

    def _reap(self) -> int | None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                return None
            code = os.waitstatus_to_exitcode(status)
            if pid == self.main_pid:
                self._kill_children()
                reached = None if self.limits is None else self.limits.check()
                if reached is not None:  # the OOM killer took the kernel itself
                    _send(self.ctl, {"limit": reached})
                return code
            status = self.children.pop(pid, None)
            if status is not None:
                _send(status, {"exit": code})
                status.close()
            if pid == self.offered:
                # Used and done (or dead unused): offer the next while the Host records it.
                self.offered = None
                self._drop_pending()
                self.offer()

    def _collect(self) -> bool:
        """The Host asked for what was traced since its last ask: send it, in pieces."""
        try:
            if not self.trace.recv(64):
                return False
            accesses, dropped = self.supervisor.take()
            data = marshal.dumps((accesses, self.supervisor.take_before()))
            piece = 1 << 16
            self.trace.send(marshal.dumps({"size": len(data), "dropped": dropped,
                                           "error": self.trace_error}))
            for i in range(0, len(data), piece):
                self.trace.send(data[i:i + piece])
        except OSError:
            return False
        return True

    def _request(self) -> bool:
        try:
            data, fds = recv_with_fds(self.ctl)
        except OSError:
            return False
        if not data:
            return False
        try:
            msg = marshal.loads(data)
            op = msg.get("op")
            if op == "spawn" and len(fds) == 4:
                # fds: stdin, stdout, stderr, and the command's own status socket.
                status = _socket.socket(fileno=os.dup(fds[3]))
                try:
                    pid = self.spawn(msg["argv"], msg["cwd"], msg["env"], fds[:3],
                                     new_session=True)
                except OSError as exc:
                    _send(status, {"error": str(exc)})
                    status.close()
                else:
                    self.children[pid] = status
                    _send(status, {"pid": pid})
            elif op == "narrow" and self.standby:
                self._narrow(msg)
            elif op == "kill":
                pid, sig = int(msg["pid"]), int(msg["sig"])
                if pid in self.children:
                    try:
                        os.killpg(pid, sig)
                    except OSError:
                        pass
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def _narrow(self, msg: dict[str, Any]) -> None:
        """The session this standby sandbox now serves: its paths bound into the private
        view, its ruleset (built here, after them, so it names what the sandbox sees),
        stacked on the first for every process started from now on and sent back for
        the kernel to enter, and the folders the tracer keeps."""
        error = None
        if self.view is not None and msg.get("keep"):
            try:
                self.view.add([], list(msg["keep"]))
            except OSError as exc:
                error = f"the session's folders could not be shown in the private view: {exc}"
        ruleset = _ruleset(msg)
        self.rulesets.append(ruleset)
        try:
            send_fds(self.ctl, marshal.dumps({"narrowed": True, "error": error}),
                             [ruleset])
        except OSError:
            pass  # the Host is gone; the loop sees EOF next
        if self.supervisor is not None and msg.get("trace_roots") is not None:
            self.supervisor.keep_under(list(msg["trace_roots"]),
                                       list(msg.get("trace_resolve", ())))
        self.standby = False
        if self.offered is None:
            self.offer()

    def _limit_reached(self, which: str) -> int:
        """A limit was reached: end the generation (every process of the sandbox) and
        tell the Host which limit, so the record and the next Observation can say so."""
        if os.getpid() == 1:
            try:
                os.kill(-1, _SIGKILL)  # PID 1 of its own namespace: every process in it
            except OSError:
                pass
        self._shutdown()
        _send(self.ctl, {"limit": which})
        return LIMIT_EXIT

    def _kill_children(self) -> None:
        for pid in list(self.children):
            try:
                os.killpg(pid, _SIGKILL)
            except OSError:
                pass

    def _shutdown(self) -> int:
        """The Host is gone (control socket closed): take everything down."""
        self._kill_children()
        if self.main_pid > 0:
            try:
                os.kill(self.main_pid, _SIGKILL)
            except OSError:
                pass
        return 137


def _relay(child: int) -> int:
    """The launcher after the fork: wait for init and pass its exit status on."""
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status)


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


def _ruleset(setup: dict[str, Any]) -> int:
    from .landlock import Ruleset

    ruleset = Ruleset(int(setup["abi"]), network=bool(setup["network"]))
    for path, access in setup["rules"]:
        ruleset.allow(path, access)
    return ruleset.fd


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--control" or argv[2] != "--":
        sys.stderr.write("usage: python -m host_kernel.sandbox.init --control FD -- ARGV...\n")
        return 2
    ctl = _socket.socket(fileno=int(argv[1]))
    kernel_argv = argv[3:]
    # Interrupts are for the kernel: jupyter_client signals the whole process group.
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    data, setup_fds = recv_with_fds(ctl, _MAX_MSG, 2)
    setup = marshal.loads(data)
    hello: dict[str, Any] = {"hello": True, "launcher": os.getpid()}
    limits = world.enter_limits(setup, hello)
    reason = None
    namespaces = False
    want_net = bool(setup.get("netns"))
    if setup.get("namespaces", True):
        try:
            hello["network_reason"] = world.unshare(want_net)
            namespaces = True
        except OSError as exc:
            reason = str(exc)
    hello["network_namespace"] = namespaces and want_net and not hello.get("network_reason")
    if want_net and not namespaces:
        hello["network_reason"] = f"no namespaces ({reason})"
    view = None
    if namespaces:
        child = os.fork()
        if child:
            ctl.close()
            return _exit_code(_relay(child))
        _libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
        try:
            world.mount_proc()
        except OSError as exc:
            reason = f"{exc}; /proc still shows the Host"
            namespaces = False
            hello["view_reason"] = reason
        else:
            view = world.inside(setup, hello, limits)
    elif setup.get("view"):
        hello["view_reason"] = f"no mount namespace ({reason})"
    why = world.drop_capabilities()
    hello["capabilities"] = "files only" if why is None else why
    if why is not None and os.geteuid() != 0:
        hello["capabilities"] = "none"  # (an unprivileged user's processes hold none anyway)
    ruleset_fd = _ruleset(setup)
    memory = setup.get("memory")
    if memory:
        # Every process of the sandbox inherits it (a reproduction's bound; docs/verification.md).
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (int(memory), int(memory)))
    supervisor = trace = None
    roots = setup.get("trace_roots")
    if roots is not None and len(setup_fds) == 2:
        import mmap

        from .trace import Supervisor
        counter = mmap.mmap(setup_fds[1], 8)
        os.close(setup_fds[1])
        # Reads stamped with the file's stat key at open: the Host hashes a file once
        # per content, not once per read (docs/lineage.md, "Hashes").
        supervisor = Supervisor(list(roots), counter=counter,
                                resolve=list(setup.get("trace_resolve", ())), stamp_reads=True)
        trace = _socket.socket(fileno=setup_fds[0])
    else:
        for fd in setup_fds:
            os.close(fd)
    if supervisor is not None:
        hello["supervisor"] = supervisor.implementation  # "c" or "python" (trace.py)
    hello.update({"pid_namespace": namespaces, "reason": reason,
                  "traced": supervisor is not None, "view": view is not None,
                  "masked": [] if view is None else view.masked,
                  "limits": {} if limits is None else limits.report})
    _send(ctl, hello)
    spawner = _Spawner(ctl, ruleset_fd, supervisor, trace, bool(setup.get("standby")),
                       view, limits)
    return _exit_code(spawner.serve(kernel_argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
