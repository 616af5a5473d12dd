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

import itertools
import marshal
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .landlock import abi_version
from .policy import Policy, rules_for_record, ruleset_spec

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
    """A command init started for the Host; quacks like the part of Popen we use."""

    def __init__(self, sandbox: Sandbox, pid: int, args: Sequence[str],
                 stdout: BinaryIO | None, stderr: BinaryIO | None) -> None:
        self._sandbox = sandbox
        self.pid = pid  # in the sandbox's PID namespace
        self.args = list(args)
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._done = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the command's whole process group (it leads its own session)."""
        if self.returncode is None:
            self._sandbox.signal(self.pid, sig)


class Sandbox:
    """One generation's init process, as seen from the Host.

    Create it, put :meth:`argv` in front of the kernel's command line and
    :attr:`pass_fds` into the launch, then call :meth:`started` once the process
    runs. :meth:`spawn` starts a confined command; :meth:`close` lets init go.
    """

    def __init__(self, policy: Policy, abi: int, *, namespaces: bool = True) -> None:
        self.policy = policy
        self.abi = abi
        self._host_end, self._init_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._host_end.send(marshal.dumps({"abi": abi, "namespaces": namespaces,
                                           "network": policy.network,
                                           "rules": ruleset_spec(policy)}))
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._replies: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self._procs: dict[int, ConfinedProcess] = {}
        #: Exits reported before the spawn reply was read (a command that ends at once).
        self._early_exits: dict[int, int] = {}
        self._hello = threading.Event()
        self.hello: dict[str, Any] = {}
        self._closed = False
        self._reader: threading.Thread | None = None

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._init_end.fileno(),)

    def argv(self, kernel_argv: Sequence[str]) -> list[str]:
        # -I -S: no user site, no .pth files, no PYTHON* variables: init is trusted code and
        # runs before any confinement, so nothing the workspace holds may reach it.
        return [sys.executable, "-I", "-S", "-c", _INIT_CODE,
                "--control", str(self._init_end.fileno()), "--", *kernel_argv]

    def started(self) -> dict[str, Any]:
        """Call once init runs: start listening, wait for its hello, return it."""
        self._init_end.close()
        self._reader = threading.Thread(target=self._read, name="sandbox-reader", daemon=True)
        self._reader.start()
        if not self._hello.wait(HELLO_TIMEOUT):
            raise SandboxError("the sandbox's init process did not answer")
        return self.hello

    def _read(self) -> None:
        while True:
            try:
                data = self._host_end.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            msg = marshal.loads(data)
            if msg.get("hello"):
                self.hello = msg
                self._hello.set()
            elif "exit" in msg:
                with self._lock:
                    proc = self._procs.pop(msg["exit"], None)
                    if proc is None:
                        self._early_exits[msg["exit"]] = msg["code"]
                if proc is not None:
                    proc._exited(msg["code"])
            elif "id" in msg:
                with self._lock:
                    waiter = self._replies.pop(msg["id"], None)
                if waiter is not None:
                    waiter[1].append(msg)
                    waiter[0].set()
        # init is gone: every command it ran is gone with it (its PID namespace ended).
        with self._lock:
            self._closed = True
            procs, self._procs = list(self._procs.values()), {}
            waiters, self._replies = list(self._replies.values()), {}
        for proc in procs:
            proc._exited(-signal.SIGKILL)
        for event, _ in waiters:
            event.set()
        self._hello.set()

    def spawn(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
              stdin: int, stdout: int, stderr: int) -> ConfinedProcess:
        """Start ``argv`` confined, in a session of its own, with these descriptors."""
        request_id = next(self._ids)
        event = threading.Event()
        box: list[dict[str, Any]] = []
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox has stopped (the kernel generation ended)")
            self._replies[request_id] = (event, box)
        message = marshal.dumps({"op": "spawn", "id": request_id, "argv": list(argv),
                                 "cwd": cwd, "env": dict(env)})
        try:
            socket.send_fds(self._host_end, [message], [stdin, stdout, stderr])
        except OSError as exc:
            raise SandboxError(f"the sandbox is not answering: {exc}") from exc
        if not event.wait(REPLY_TIMEOUT) or not box:
            raise SandboxError("the sandbox did not start the command")
        reply = box[0]
        if "error" in reply:
            raise SandboxError(f"the sandbox could not start the command: {reply['error']}")
        pid = int(reply["pid"])
        proc = ConfinedProcess(self, pid, argv, None, None)
        with self._lock:
            early = self._early_exits.pop(pid, None)
            if early is None:
                self._procs[pid] = proc
        if early is not None:
            proc._exited(early)
        return proc

    def signal(self, pid: int, sig: int) -> None:
        try:
            self._host_end.send(marshal.dumps({"op": "kill", "pid": pid, "sig": int(sig)}))
        except OSError:
            pass

    def close(self) -> None:
        """Stop listening; init, seeing the socket close, takes its namespace down."""
        if self._init_end.fileno() >= 0:
            self._init_end.close()
        try:
            self._host_end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._host_end.close()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)


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
