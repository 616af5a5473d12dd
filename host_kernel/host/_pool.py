"""Warm starts: kernels started before their sessions, handed out in one step.

Owns :class:`HostPool` (a number of standby kernels, refilled in the background)
and :class:`Standby` (one of them: its KernelManager, its sandbox, its folder).
It does not run sessions: a Host given ``pool=`` takes a standby at start and
hands it the session's orders (host/_kernel.py ``KernelGeneration.order``;
host_kernel/kernel/standby.py narrows the kernel before it runs anything).

A standby is confined from its ``execve`` on, in the pool's broad domain:
reads as any session's, writes beneath the pool's ``roots`` (where the
workspaces it serves live) and its own folder. Its sandbox's init starts no
command until the Host stacks the session's ruleset on it (docs/security.md,
"Warm starts").
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import BadArguments, KernelError
from .._ids import mint_uuid
from ..kernel.standby import READY
from ..sandbox.client import Confinement, Sandbox, SandboxError, probe
from ..sandbox.limits import KernelLimits
from ..sandbox.policy import Policy
from ..sandbox.trace import unavailable as trace_unavailable
from ._argv import kernel_env, short_tempdir, standby_argv
from ._redact import Redactor

if TYPE_CHECKING:  # jupyter_client is imported only once a standby runs (HostPool._launch)
    from jupyter_client.manager import KernelManager

__all__ = ["HostPool", "Standby"]

#: Starts that fail in a row before the pool stops trying (and says why).
MAX_FAILURES = 3
#: Seconds the refill waits after a hand-out while another standby still waits. The
#: standby just handed out is starting its session's kernel; a new one started beside it
#: takes a core from it (importing ipykernel is a core's work), which made a warm
#: start's last step (the kernel's initialisation, 20 ms alone) take twice as long.
#: With no standby left, the refill starts at once: a session may be waiting for it.
QUIET = 1.0


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Standby:
    """One kernel started ahead of its session."""

    pool: str
    folder: Path
    manager: KernelManager
    sandbox: Sandbox | None
    #: The pool's broad policy (None when unconfined).
    broad: Policy | None
    hello: dict[str, Any]
    #: The Host's end of the socket the kernel reads its orders from (its standard input).
    orders_fd: int
    started: str = field(default_factory=_now)

    @property
    def conn_file(self) -> Path:
        return self.folder / "kernel.json"

    @property
    def private(self) -> Path:
        """The session's private folder (temp, IPython, caches), inside the standby's."""
        return self.folder / "s"

    def ready(self) -> bool:
        """Whether it has finished its imports and waits for orders."""
        return (self.folder / READY).exists()

    def alive(self) -> bool:
        return bool(self.manager.is_alive())

    def stop(self) -> None:
        """Stop its processes; its folder stays (a Host that took it may be using it)."""
        if self.orders_fd >= 0:
            os.close(self.orders_fd)
            self.orders_fd = -1
        from ._kernel import stop_manager

        stop_manager(self.manager, None, self.sandbox)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


class HostPool:
    """Kernels started before their sessions: ``Host(workdir, pool=pool)`` starts warm.

    ``HostPool(size=2, roots=None)``: ``size`` standbys are kept started; ``roots``
    are the folders beneath which the workspaces it serves lie (default: the home
    folder and the temp folder); ``hide_env`` names variables left out of the
    standbys' environment beside those whose names look secret. A Host whose session
    the standbys cannot serve (workspace outside the roots, a secret name in their
    environment, tracing or confinement not as theirs) starts cold, and its record
    says why. Use as a context manager, or call :meth:`start` and :meth:`close`;
    closing stops every standby not yet handed out. A standby handed out is replaced
    at once when none is left, else after :data:`QUIET` seconds.
    """

    def __init__(self, size: int = 2, *, roots: Sequence[str | os.PathLike[str]] | None = None,
                 trace: bool = True, startup_timeout: float = 60.0,
                 hide_env: Sequence[str] = (), refill: bool = True) -> None:
        """``refill=False``: start ``size`` standbys once and no more (a process that will
        start one session, such as the control kernel, starting its kernel early)."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise BadArguments("size must be a positive number of kernels")
        if not isinstance(refill, bool):
            raise BadArguments("refill must be True or False")
        if not isinstance(trace, bool):
            raise BadArguments("trace must be True or False")
        try:  # taken once: an iterator checked here would be empty when filtering below
            hidden = frozenset(hide_env) if not isinstance(hide_env, str) else None
        except TypeError:
            hidden = None
        if hidden is None or not all(isinstance(n, str) for n in hidden):
            raise BadArguments("hide_env must be a list of variable names")
        if roots is None:
            roots = [Path.home(), tempfile.gettempdir()]
        self.roots = tuple(dict.fromkeys(os.path.realpath(os.fspath(r)) for r in roots
                                         if os.path.isdir(os.fspath(r))))
        if not self.roots:
            raise BadArguments("the pool needs at least one existing root folder")
        self.size = size
        self.refill = refill
        self.trace = trace
        self.startup_timeout = startup_timeout
        self.id = mint_uuid()
        #: The bounds every standby starts with (the machine's defaults): a session that
        #: asks for others starts cold.
        self.limits = KernelLimits.defaults()
        self.confinement: Confinement = probe(None)
        #: Whether standbys are traced (confined, tracing possible and asked for).
        self.traced = bool(trace and self.confinement.active and trace_unavailable() is None)
        self._cond = threading.Condition()
        self._idle: list[Standby] = []
        #: Whether the refilling thread is starting a standby now.
        self._starting = False
        #: When the last standby was handed out (``time.monotonic``): see :data:`QUIET`.
        self._handed_at = -QUIET
        #: A standby's process launched by :meth:`start`, for the thread to adopt.
        self._launched: _Launched | None = None
        self._failures = 0
        #: Why the pool stopped refilling, if it did.
        self.broken: str | None = None
        self._closed = False
        self._started = False
        self._thread: threading.Thread | None = None
        #: Counts: handed out, replaced (found dead), refused (a session it could not serve).
        self.stats = {"handed_out": 0, "replaced": 0, "started": 0}
        redactor = Redactor()
        self._env = kernel_env({k: v for k, v in os.environ.items()
                                if not k.startswith("HOST_KERNEL_") and k not in hidden
                                and not redactor.is_secret_name(k)})

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> HostPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> HostPool:
        with self._cond:
            if self._closed:
                raise KernelError("the pool is closed")
            if self._started:
                return self
            self._started = True
            # Said now, not when the thread gets to it: a Host taking a standby right
            # after start() waits for this one instead of starting cold.
            self._starting = True
        if not self.refill:
            # A process that starts one session (the control kernel) starts its kernel
            # before its own heavy imports: the process is launched here, in the caller's
            # thread and without jupyter_client; the thread adopts it (_adopt).
            try:
                self._launched = self._launch()
            except Exception:  # noqa: BLE001 - the thread tries again, counts the failure
                self._launched = None  # and says why (``broken``) if it keeps failing
        self._thread = threading.Thread(target=self._fill, name="host-kernel-pool", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop every standby not handed out, and the refilling. Safe to call twice."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for standby in idle:
            standby.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.startup_timeout + 5)
        with self._cond:
            launched, self._launched = self._launched, None
        if launched is not None:  # launched, never adopted: the thread did not get to it
            launched.discard()

    @property
    def closed(self) -> bool:
        return self._closed

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Block until ``size`` standbys have finished their imports (benchmarks, tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                if self._closed or self.broken:
                    return False
                idle = list(self._idle)
            if len(idle) >= self.size and all(s.ready() for s in idle):
                return True
            time.sleep(0.01)
        return False

    def pids(self) -> list[int]:
        """The pids of the standbys waiting now (for tests and tools)."""
        with self._cond:
            idle = list(self._idle)
        out = []
        for standby in idle:
            proc = getattr(standby.manager.provisioner, "process", None)
            if proc is not None:
                out.append(int(proc.pid))
        return out

    def folders(self) -> list[str]:
        """The folders of the standbys waiting now (for tests and tools)."""
        with self._cond:
            return [str(s.folder) for s in self._idle]

    # ------------------------------------------------------------------ handing out

    def refusal(self, *, confined: bool, traced: bool, hidden: frozenset[str],
                limits: KernelLimits | None = None) -> str | None:
        """Why this pool's standbys cannot serve a session like this, or None."""
        if self._closed:
            return "the pool is closed"
        if self.broken:
            return f"the pool cannot start kernels: {self.broken}"
        if confined != self.confinement.active:
            return ("the session is confined and the pool's kernels are not" if confined else
                    "the pool's kernels are confined and the session is not")
        if traced != self.traced:
            return ("the session is traced and the pool's kernels are not" if traced else
                    "the pool's kernels are traced and the session is not")
        if confined and limits is not None and limits != self.limits:
            return (f"the session's kernel limits ({limits.to_dict()}) are not the pool's "
                    f"({self.limits.to_dict()})")
        secret = sorted(hidden & frozenset(self._env))
        if secret:
            return (f"the pool's kernels started with {', '.join(secret)} in their environment, "
                    f"which this session hides")
        return None

    def serve(self, *, workspace: str, confined: bool, traced: bool, hidden: frozenset[str],
              limits: KernelLimits | None, wait: float) -> tuple[Standby | None, str | None]:
        """A standby for a session like this (``workspace``: checked by the Host against
        the standby's domain when it adopts it), or None and why not."""
        why = self.refusal(confined=confined, traced=traced, hidden=hidden, limits=limits)
        if why is not None:
            return None, why
        standby = self.take(wait=wait)
        return (standby, None) if standby is not None else (None, "no standby kernel was waiting")

    def take(self, wait: float = 0.0) -> Standby | None:
        """The oldest live standby, ready ones first; None when none is waiting.

        When none is waiting but one is starting, wait for it up to ``wait`` seconds:
        it is further on than a kernel started now would be. A standby found dead is
        stopped and replaced, never handed out.
        """
        deadline = time.monotonic() + wait
        with self._cond:
            while not self._idle and self._starting and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            idle = sorted(self._idle, key=lambda s: not s.ready())
            chosen = None
            dead = []
            for standby in idle:
                if standby.alive():
                    chosen = standby
                    break
                dead.append(standby)
            for standby in [*dead, *([chosen] if chosen else [])]:
                self._idle.remove(standby)
            self.stats["replaced"] += len(dead)
            if chosen is not None:
                self.stats["handed_out"] += 1
                self._handed_at = time.monotonic()
            self._cond.notify_all()
        for standby in dead:
            standby.close()
        return chosen

    # ------------------------------------------------------------------ refilling

    def _fill(self) -> None:
        try:
            self._refill()
        finally:
            from ._kernel import close_thread_loop

            close_thread_loop()

    def _refill(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if len(self._idle) >= self.size:
                        self._cond.wait()
                        continue
                    quiet = self._handed_at + QUIET - time.monotonic()
                    if not self._idle or quiet <= 0:
                        break
                    self._cond.wait(quiet)  # another standby still waits: no hurry
                if self._closed or (not self.refill and self.stats["started"] >= self.size):
                    return
                self._starting = True
            with self._cond:
                launched, self._launched = self._launched, None
            try:
                standby = (self._adopt(launched) if launched is not None
                           else self._start_one())
            except (KernelError, SandboxError, OSError) as exc:
                with self._cond:
                    self._starting = False
                    self._cond.notify_all()
                self._failures += 1
                if self._failures >= MAX_FAILURES:
                    with self._cond:
                        self.broken = str(exc)
                    return
                time.sleep(0.1 * self._failures)
                continue
            self._failures = 0
            with self._cond:
                self._starting = False
                self._cond.notify_all()
                if self._closed:
                    close = True
                else:
                    close = False
                    self._idle.append(standby)
                    self.stats["started"] += 1
            if close:
                standby.close()
                return

    def _start_one(self) -> Standby:
        return self._adopt(self._launch())

    def _launch(self) -> _Launched:
        """Start a standby's process (the sandbox's init, then the standby) as
        jupyter_client would (host/_kernel.py ``started_manager`` checks it), without
        jupyter_client: :meth:`_adopt` then builds its KernelManager."""
        folder = Path(tempfile.mkdtemp(prefix="hks-", dir=short_tempdir()))
        conn_file = folder / "kernel.json"
        (folder / "s").mkdir()
        sandbox = None
        broad = None
        try:
            if self.confinement.active:
                broad = Policy.for_pool(self.roots, folder).with_generation(folder, conn_file)
                sandbox = Sandbox(broad, self.confinement.abi, standby=True,
                                  trace_roots=[] if self.traced else None, limits=self.limits)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        spec = standby_argv(sandbox)
        argv = [os.path.expanduser(a.replace("{connection_file}", str(conn_file))) for a in spec]
        # As jupyter_client's provisioner and launcher make it.
        env = dict(self._env)
        env.pop("PYTHONEXECUTABLE", None)
        env["JPY_PARENT_PID"] = str(os.getpid())
        # The orders come on the kernel's standard input, a socket only this pool holds
        # (a socket, so the Host can hand over the session's Landlock ruleset with them)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        orders_r, orders_w = theirs.detach(), mine.detach()
        try:
            process = subprocess.Popen(argv, stdin=orders_r, cwd=str(folder), env=env,
                                       start_new_session=True,
                                       pass_fds=() if sandbox is None else sandbox.pass_fds)
        except BaseException:
            os.close(orders_w)
            _Launched.release(folder, sandbox)
            raise
        finally:
            os.close(orders_r)
        return _Launched(folder, conn_file, sandbox, broad, spec, process, orders_w)

    def _adopt(self, launched: _Launched) -> Standby:
        """The launched standby with its KernelManager, once its sandbox's init said hello."""
        from ._kernel import started_manager, stop_manager

        sandbox = launched.sandbox
        hello: dict[str, Any] = {}
        try:
            manager = started_manager(launched.conn_file, launched.spec, launched.process)
        except BaseException as exc:
            launched.discard()
            if isinstance(exc, (KernelError, SandboxError, OSError)):
                raise
            raise KernelError(f"a standby kernel did not start: {exc}") from exc
        try:
            if sandbox is not None:
                hello = sandbox.started()
        except BaseException as exc:
            os.close(launched.orders_w)
            stop_manager(manager, None, sandbox)
            shutil.rmtree(launched.folder, ignore_errors=True)
            if isinstance(exc, (KernelError, SandboxError, OSError)):
                raise
            raise KernelError(f"a standby kernel did not start: {exc}") from exc
        return Standby(self.id, launched.folder, manager, sandbox, launched.broad, hello,
                       launched.orders_w)


@dataclass
class _Launched:
    """A standby's process, started, not yet given its KernelManager."""

    folder: Path
    conn_file: Path
    sandbox: Sandbox | None
    broad: Policy | None
    #: Its kernelspec's command line (``{connection_file}`` not filled in).
    spec: list[str]
    process: subprocess.Popen[bytes]
    #: The pool's end of the socket the standby reads its orders from.
    orders_w: int

    def discard(self) -> None:
        """Kill its processes (init leads its own session: the group goes), reap, and
        remove what it had."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass  # gone already
        self.process.wait()
        os.close(self.orders_w)
        self.release(self.folder, self.sandbox)

    @staticmethod
    def release(folder: Path, sandbox: Sandbox | None) -> None:
        if sandbox is not None:
            sandbox.close()
            sandbox.release()
        shutil.rmtree(folder, ignore_errors=True)
