"""Kernel generations: how each kernel of a session is launched, started, swapped and ended.

Owns what every generation is launched with (the environment, the session's
private folders, the confinement policy, decided once at start), where its
kernel comes from (cold, a pool's warm standby narrowed to the session, or the
spare started ahead for the next restart), the generation's token and tracer,
the ``generation_started`` event, kernels retired and stopped, and the notices
that tell an agent the session is unconfined or untraced. It does not run cells
(host/_cells.py) or decide when to restart (the cells and the facade do).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ConfinementError, KernelError
from .._ids import mint_token
from ..sandbox.client import Confinement, Sandbox, SandboxError, probe
from ..sandbox.landlock import LandlockError
from ..sandbox.policy import Policy, uncovered
from ..sandbox.trace import unavailable as trace_unavailable
from ._kernel import KernelGeneration, close_thread_loop, kernel_env, short_tempdir
from ._options import HostOptions
from ._pool import HostPool, Standby
from ._trace import TraceLog
from ._workspace import Workspace

if TYPE_CHECKING:
    from ..factory._client import FactoryPool

__all__ = ["KERNEL_SET_ENV", "PRIVATE_DIRS", "Generations"]

#: Sub-folders of a session's private folder, each named in the kernel's environment.
PRIVATE_DIRS = {"TMPDIR": "tmp", "IPYTHONDIR": "ipython", "XDG_CACHE_HOME": "cache",
                "MPLCONFIGDIR": "mpl", "JUPYTER_RUNTIME_DIR": "jupyter", "PIP_TARGET": "site"}
#: Variables ipykernel sets in its own environment at start-up.
KERNEL_SET_ENV = frozenset({"MPLBACKEND", "JPY_PARENT_PID", "PYDEVD_DISABLE_FILE_VALIDATION",
                            "CLICOLOR", "PAGER", "GIT_PAGER", "FORCE_COLOR", "TERM",
                            "JPY_SESSION_NAME", "CLICOLOR_FORCE", "PYDEVD_USE_FRAME_EVAL"})

#: A limit a generation can reach → the Host option that raises it.
_OPTION_OF = {"memory": "memory_limit", "processes": "process_limit"}

#: Appends an event to the session's record (host/_record.py).
Append = Callable[[str, dict[str, Any]], Any]


def _asked(kernel: KernelGeneration, limit: str) -> int | None:
    """The bound a generation had for ``limit`` ("memory", "processes")."""
    limits = None if kernel.sandbox is None else kernel.sandbox.limits
    return None if limits is None else limits.to_dict().get(limit)


def inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class Generations:
    """The kernels of one session, one generation at a time."""

    def __init__(self, workdir: Path, options: HostOptions, workspace: Workspace,
                 append: Append, new_generation: Callable[[], None]) -> None:
        self.workdir = workdir
        self.options = options
        self.workspace = workspace
        self._append = append
        self._new_generation = new_generation  # lineage forgets names in memory
        #: The generation running now; None before start and after close.
        self.kernel: KernelGeneration | None = None
        #: Generations an earlier process of this session ran (a resumed session).
        self.prior = 0
        #: Tokens of earlier generations: a call carrying one is ``stale_token``.
        self.old_tokens: set[str] = set()
        #: What the record says about confinement; decided at :meth:`prepare`.
        self.confinement: Confinement | None = None
        self.policy: Policy | None = None
        self.runtime_dir: Path | None = None
        self.private_dir: Path | None = None
        self.launch_env: dict[str, str] = {}
        #: The current generation's tracer, None when untraced.
        self.trace: TraceLog | None = None
        #: What the record says about tracing: {"status": "seccomp"} or why not.
        self.tracing: dict[str, Any] = {}
        self._standby: Standby | None = None
        #: The first generation's kernel, handed its orders ahead (:meth:`hand_orders`), and
        #: the ``warm`` body its ``generation_started`` will carry.
        self._handed: tuple[KernelGeneration, dict[str, Any]] | None = None
        #: Starts the call server (once, before any kernel is started or waited for).
        self._listen: Callable[[], None] | None = None
        #: Why the pool did not serve this session (recorded with the first generation).
        self._pool_miss: str | None = None
        #: Where a warm kernel was sought ({"pool": id, "factory": bool}); None: nowhere.
        self._warm: dict[str, Any] | None = None
        #: The user's kernel factory, while this session holds its lease.
        self._factory: FactoryPool | None = None
        self.spare_kernel: KernelGeneration | None = None
        self._spare_thread: threading.Thread | None = None
        self._spare_lock = threading.Lock()
        #: Why the last spare could not be started (recorded at the next restart).
        self.spare_error: str | None = None
        #: Set at close: a spare that finishes starting afterwards is stopped at once.
        self.closed = False
        #: Folders the Host took over from a standby (removed at close).
        self._owned_dirs: list[Path] = []
        #: Threads reaping the kernels of earlier generations (joined at close).
        self._retiring: list[threading.Thread] = []
        #: The files and folders confined code may not read (the record, its secrets).
        self._hidden: list[str] = []
        #: Why the last generation ended, when a limit ended it (the record says it too in
        #: the next ``generation_started``, as ``ended``); None otherwise.
        self.ended: str | None = None

    @property
    def generation(self) -> int:
        return 0 if self.kernel is None else self.kernel.generation

    # ------------------------------------------------------------------ the launch

    def prepare(self, confinement: Confinement, hidden: list[str], session_id: str,
                socket_path: Callable[[Path], str],
                listen: Callable[[], None] | None = None) -> None:
        """Decide how every generation is launched: the private folders (a standby's
        when the pool serves the session), the environment, and the confinement policy.

        ``hidden`` are the files and folders confined code may not read (the record, its
        stores' secrets); ``socket_path`` returns the call socket's path in the runtime
        folder; ``listen`` starts the call server there, which :meth:`start` does before
        it starts (or waits for) any kernel. Without ``listen``, ``socket_path`` starts it.
        """
        options = self.options
        self._hidden = list(hidden)
        self._listen = listen
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="hk-", dir=short_tempdir()))
        self._take_standby(confinement)
        if self._standby is not None:
            self.private_dir = self._standby.private
        else:
            self.private_dir = self.runtime_dir / "s"
            self.private_dir.mkdir()
        self.launch_env = self._build_env(socket_path(self.runtime_dir), session_id)
        if confinement.active:
            self.launch_env["HOST_KERNEL_CONFINED"] = "1"
            self.policy = Policy.for_session(self.workdir, self.private_dir, hidden,
                                             network=options.network,
                                             extra_read=options.read_paths)
            confinement = probe(self.policy, network=options.network)
            if not confinement.active and options.require_confinement:
                raise ConfinementError(f"confinement is required but not available: "
                                       f"{confinement.reason}")
            if confinement.active and options.require_confinement and confinement.missing():
                raise ConfinementError(f"confinement is required but the kernel's private "
                                       f"world is not available: {confinement.missing()}")
            if not confinement.active:
                self.policy = None
                del self.launch_env["HOST_KERNEL_CONFINED"]
        self.confinement = confinement
        if self.why_untraced() is None:
            # The kernel's audit hook would only repeat, slower and less reliably,
            # what the tracer sees; the extension leaves it out (docs/lineage.md).
            self.launch_env["HOST_KERNEL_TRACED"] = "1"

    def _build_env(self, socket_path: str, session_id: str) -> dict[str, str]:
        """The kernel's environment: the Host's, less its own secrets, plus the session's
        private folders (temp, IPython, caches, the package overlay) and the call socket.

        The record's location is not in it: confined code has no business there.
        """
        if self.private_dir is None:
            raise KernelError("the session's private folder is not made yet")
        hidden = self.options.hidden_env
        blobs = self.options.blobs is not None
        base = {k: v for k, v in os.environ.items()
                if k not in hidden and not k.startswith("HOST_KERNEL_")
                and not (blobs and k.startswith("FSSPEC_"))}
        env = kernel_env(base)
        for name, sub in PRIVATE_DIRS.items():
            folder = self.private_dir / sub
            folder.mkdir(exist_ok=True)
            env[name] = str(folder)
        overlay = env["PIP_TARGET"]
        # `pip install` (a cell's %pip, or host.bash) lands in the session's overlay,
        # which is first on the kernel's import path and its scripts first on PATH.
        env["PYTHONPATH"] = os.pathsep.join([overlay] + [p for p in env.get(
            "PYTHONPATH", "").split(os.pathsep) if p])
        env["PATH"] = os.pathsep.join([os.path.join(overlay, "bin"), env["PATH"]])
        env["PIP_CACHE_DIR"] = str(self.private_dir / "cache" / "pip")
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        env.update({
            "HOST_KERNEL_SOCKET": socket_path,
            "HOST_KERNEL_WORKSPACE": str(self.workdir),
            "HOST_KERNEL_SESSION": session_id,
        })
        return env

    def env_of(self, generation: int, token: str) -> dict[str, str]:
        """The environment the Host launched a generation's kernel with: the baseline a
        receipt's "changed" variables are measured against. Built from the Host's own
        values, never from what the kernel sends."""
        return self.launch_env | {"HOST_KERNEL_TOKEN": token,
                                  "HOST_KERNEL_GENERATION": str(generation)}

    # ------------------------------------------------------------------ the pool

    def _take_standby(self, confinement: Confinement) -> None:
        """A standby kernel from the pool (the Host's own, else the user's kernel factory),
        when it can serve this session; else why not."""
        pool: HostPool | FactoryPool | None = self.options.pool
        if pool is None:
            from ..factory import disabled

            if not (self.options.factory and confinement.active) or disabled():
                return
            from ..factory._client import FactoryPool

            self._factory, why = FactoryPool.reach()
            if self._factory is None:
                self._warm = {"pool": None, "factory": True}
                self._pool_miss = why
                return
            pool = self._factory
        self._warm = {"pool": pool.id, "factory": pool is self._factory}
        self._standby, why = pool.serve(
            workspace=str(self.workdir), confined=confinement.active,
            traced=confinement.active and self.options.trace and trace_unavailable() is None,
            hidden=self.options.hidden_env, limits=self.options.kernel_limits,
            wait=self.options.startup_timeout)
        if self._standby is not None:
            self._owned_dirs.append(self._standby.folder)
        self._pool_miss = why
        if self._standby is None:
            self._end_lease()

    def _end_lease(self) -> None:
        """Tell the factory this session needs nothing more of it (it may exit when idle)."""
        factory, self._factory = self._factory, None
        if factory is not None:
            factory.close()

    def _release_standby(self, why: str) -> None:
        """The standby cannot serve this session after all: stop it and start cold.

        It is not given back to the pool: the session's environment and policy already
        name its folder (the session's private folder lives there), which must never
        serve another session. The Host keeps the folder until it closes.
        """
        standby, self._standby = self._standby, None
        if standby is not None:
            standby.stop()
            self._pool_miss = why

    # ------------------------------------------------------------------ starting one

    def start(self, reason: str) -> None:
        """Start the next generation (the first, or a restart), and record it."""
        listen, self._listen = self._listen, None
        if listen is not None:
            listen()  # before any kernel of the session can call the Host
        previous = self.kernel
        generation = (self.prior if previous is None else previous.generation) + 1
        body: dict[str, Any] = {"generation": generation, "reason": reason}
        self.ended = None
        if previous is not None:
            limit = None if previous.sandbox is None else previous.sandbox.limit_reached()
            if limit is not None:
                self.ended = self._limit_notice(previous, limit)
                body["ended"] = {"generation": previous.generation, "reason": self.ended,
                                 "limit": limit, "max": _asked(previous, limit)}
            self.old_tokens.add(previous.token)
            self._retiring = [t for t in self._retiring if t.is_alive()]
            self._retiring.append(previous.retire())
            self.kernel = None
            self._new_generation()
        self.trace = None
        kernel = self._swap_in_spare(generation, body) if previous is not None else None
        if kernel is None and (self._standby is not None or self._handed is not None):
            kernel = self._adopt_standby(generation, body)
        if kernel is None:
            kernel = self._new_kernel(generation)
        self.kernel = kernel
        why_untraced = self.why_untraced()
        sandbox = kernel.sandbox
        if sandbox is not None and sandbox.traced:
            self.trace = TraceLog(sandbox, self.workspace)
        elif sandbox is not None and why_untraced is None:
            why_untraced = "the sandbox's init could not trace (see its hello)"
        self.tracing = ({"status": "seccomp"} if self.trace is not None else
                        {"status": "audit-hook", "reason": why_untraced})
        body["tracing"] = self.tracing
        if sandbox is not None:
            hello = kernel.hello
            folder = kernel.folder
            isolation = sandbox.isolation()
            body["confinement"] = {"status": "landlock",
                                   "pid_namespace": hello.get("pid_namespace"),
                                   "pid_namespace_reason": hello.get("reason"),
                                   "rules_added": [{"path": str(folder), "access": "write"},
                                                   {"path": str(folder / "kernel.json"),
                                                    "access": "read_file"}],
                                   **isolation}
            self._learn(hello, isolation)
        else:
            body["confinement"] = {"status": "none"}
        if self._warm is not None and generation == self.prior + 1 and "warm" not in body:
            body["warm"] = {**self._warm, "used": False, "reason": self._pool_miss}
        self._append("generation_started", body)
        if self.options.spare:
            self._start_spare(generation + 1)

    def _learn(self, hello: dict[str, Any], isolation: dict[str, Any]) -> None:
        """What the first generation's start shows of the private world goes into the
        session's confinement (its first Observation's notice); a Host that requires
        confinement refuses to go on without it."""
        confinement = self.confinement
        if confinement is None:
            return
        network, view = isolation["network"], isolation["view"]
        changes: dict[str, Any] = {}
        if confinement.pid_namespace is None:
            changes.update(pid_namespace=bool(hello.get("pid_namespace")),
                           pid_namespace_reason=hello.get("reason"))
        if confinement.network_namespace is None:
            changes.update(network_namespace=bool(network["namespace"]),
                           network_namespace_reason=network["reason"])
        if confinement.private_view is None:
            changes.update(private_view=bool(view["private"]),
                           private_view_reason=view["reason"])
            if network["namespace"] and self.options.network and network["outbound"] == "none":
                changes.update(outbound_failed=network["reason"] or "slirp4netns failed")
        if changes:
            confinement = self.confinement = dataclasses.replace(confinement, **changes)
        if self.options.require_confinement and confinement.missing():
            raise ConfinementError(f"confinement is required but the kernel's private world "
                                   f"could not be made: {confinement.missing()}")

    @staticmethod
    def _limit_notice(kernel: KernelGeneration, limit: str) -> str:
        """The sentence the record and the next Observation give for a generation that a
        limit ended."""
        asked = _asked(kernel, limit)
        bound = "" if asked is None else (f" ({asked / 2**30:.1f} GiB)" if limit == "memory"
                                          else f" ({asked})")
        option = _OPTION_OF.get(limit, "memory_limit")
        return (f"limit reached: {limit}. Generation {kernel.generation} used all the "
                f"{limit} it may{bound}, so it was ended; raise it with Host({option}=...) "
                f"if the work needs more.")

    def _keep(self) -> list[str]:
        """Paths the private view shows beside the policy's: the runtime folder (the call
        socket) and the session's own hidden files, there but unreadable."""
        return [str(self.runtime_dir), *self._hidden]

    def _parts(self, generation: int, folder: Path
               ) -> tuple[str, dict[str, str], Policy | None, list[str] | None]:
        """A generation's token, environment, policy (None unconfined) and trace roots."""
        token = mint_token()
        env = self.env_of(generation, token)
        policy = None
        if self.policy is not None and self.confinement is not None:
            policy = self.policy.with_generation(folder, folder / "kernel.json")
        roots = None if self.why_untraced() else TraceLog.roots(self.workspace)
        return token, env, policy, roots

    def _new_kernel(self, generation: int) -> KernelGeneration:
        """A kernel started now, cold."""
        if self.runtime_dir is None:
            raise KernelError("the session's runtime folder is gone")
        folder = self.runtime_dir / f"g{generation}"
        folder.mkdir()
        token, env, policy, roots = self._parts(generation, folder)
        sandbox = None
        if policy is not None and self.confinement is not None:
            sandbox = Sandbox(policy, self.confinement.abi, trace_roots=roots,
                              keep=self._keep(), limits=self.options.kernel_limits)
        return KernelGeneration(generation, token, folder / "kernel.json", self.workdir, env,
                                self.options.startup_timeout, sandbox)

    def hand_orders(self) -> None:
        """Hand the first generation's orders to the standby now, when the session has one:
        its kernel narrows and starts while the Host records the session's start, and
        :meth:`start` then only waits for it. Nothing of the session runs before this
        (the caller has read what it reads of the workspace), and the call server starts
        only in :meth:`start`, so no call from this kernel reaches the Host before the
        session's start is recorded."""
        if self._standby is not None and self.kernel is None and self._handed is None:
            self._handed = self._order_standby(self.prior + 1)

    def _adopt_standby(self, generation: int, body: dict[str, Any]) -> KernelGeneration | None:
        """The pool's standby, narrowed to this session; None (and why, recorded) if not."""
        handed, self._handed = self._handed, None
        if handed is not None and handed[0].generation != generation:
            handed[0].stop()  # (not the generation it was ordered for: never the case)
            handed = None
        if handed is None:
            handed = self._order_standby(generation)
        if handed is None:
            return None
        kernel, warm = handed
        try:
            kernel.ready(self.options.startup_timeout)
        except KernelError as exc:  # stopped; its folder holds the session's private one
            self._pool_miss = f"the standby kernel failed: {exc}"
            return None
        body["warm"] = warm
        return kernel

    def _order_standby(self, generation: int
                       ) -> tuple[KernelGeneration, dict[str, Any]] | None:
        """The pool's standby, narrowed to this session and handed its orders, with the
        ``warm`` body to record; None (and why, recorded) if it cannot serve."""
        standby, warm = self._standby, self._warm
        if standby is None or warm is None:
            return None
        token, env, policy, roots = self._parts(generation, standby.folder)
        if (policy is None) != (standby.sandbox is None):
            self._release_standby("the standby's confinement is not the session's")
            return None
        if policy is not None and standby.broad is not None:
            missing = uncovered(standby.broad, policy)
            if missing:
                self._release_standby(f"the pool's domain does not grant the session's rules "
                                      f"on {', '.join(missing[:3])}")
                return None
        handed_out = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
        self._standby = None
        was_ready = standby.ready()
        orders: dict[str, Any] = {"env": env, "cwd": str(self.workdir), "ruleset": False}
        ruleset = -1
        try:
            if policy is not None and standby.sandbox is not None \
                    and self.confinement is not None:
                # Built by the sandbox's init (trusted, untraced), after the session's paths
                # were bound into its view, and handed over: the standby only enters it.
                ruleset = standby.sandbox.narrow(policy, roots, keep=self._keep())
                orders["ruleset"] = True
            kernel = KernelGeneration.order(generation, token, standby.manager,
                                            standby.sandbox, standby.hello, standby.orders_fd,
                                            orders, ruleset)
        except (KernelError, SandboxError, LandlockError) as exc:
            standby.stop()  # its folder holds the session's private one: the Host keeps it
            self._pool_miss = f"the standby kernel failed: {exc}"
            return None
        finally:
            if ruleset >= 0:
                os.close(ruleset)
        os.close(standby.orders_fd)  # read by now: nothing more goes down that socket
        standby.orders_fd = -1
        return kernel, {**warm, "used": True, "standby_started": standby.started,
                        "handed_out": handed_out, "ready": was_ready,
                        "pool_writable": [] if standby.broad is None
                        else list(standby.broad.writable)}

    # ------------------------------------------------------------------ the spare kernel

    def _start_spare(self, generation: int) -> None:
        """Start the next generation's kernel in the background, for a restart to swap in."""
        with self._spare_lock:
            if self._spare_thread is not None or self.spare_kernel is not None:
                return
            thread = threading.Thread(target=self._make_spare, args=(generation,),
                                      name="host-kernel-spare", daemon=True)
            self._spare_thread = thread
        thread.start()

    def _make_spare(self, generation: int) -> None:
        kernel = None
        error = None
        try:
            kernel = self._new_kernel(generation)
        except (KernelError, SandboxError, OSError) as exc:
            error = str(exc)
        with self._spare_lock:
            self._spare_thread = None
            if self.closed or self.kernel is None or self.kernel.generation + 1 != generation:
                stale = kernel
                kernel = None
            else:
                stale = None
                self.spare_kernel = kernel
                self.spare_error = error
        if stale is not None:
            stale.stop()
            shutil.rmtree(stale.folder, ignore_errors=True)
        close_thread_loop()

    def _swap_in_spare(self, generation: int, body: dict[str, Any]) -> KernelGeneration | None:
        """The spare, when one was started for this generation and is alive; else None."""
        if not self.options.spare:
            return None
        thread = self._spare_thread
        if thread is not None:
            thread.join(self.options.startup_timeout)  # still starting: still sooner than anew
        with self._spare_lock:
            spare, self.spare_kernel = self.spare_kernel, None
            error, self.spare_error = self.spare_error, None
        if spare is not None and (spare.generation != generation or not spare.is_alive()):
            spare.stop()
            shutil.rmtree(spare.folder, ignore_errors=True)
            error = "the spare kernel died while it waited"
            spare = None
        body["spare"] = {"used": spare is not None} | ({} if spare else {"reason": error or
                                                        "no spare kernel had started"})
        return spare

    def _drop_spare(self) -> None:
        thread = self._spare_thread
        if thread is not None:
            thread.join(self.options.startup_timeout)
        with self._spare_lock:
            spare, self.spare_kernel = self.spare_kernel, None
        if spare is not None:
            spare.stop()
            shutil.rmtree(spare.folder, ignore_errors=True)

    # ------------------------------------------------------------------ notices

    def why_untraced(self) -> str | None:
        """Why this session's file access cannot be traced at the OS level, or None."""
        if not self.options.trace:
            return "tracing switched off (Host(trace=False))"
        if self.policy is None or self.confinement is None or not self.confinement.active:
            why = None if self.confinement is None else self.confinement.reason
            return f"the tracer runs in the sandbox, and this session is unconfined ({why})"
        return trace_unavailable()

    def tracing_notice(self) -> str | None:
        if self.tracing.get("status") == "seccomp":
            return None
        return (f"lineage: file access is not traced at the OS level "
                f"({self.tracing.get('reason')}); the kernel's own audit hook reports it, "
                f"which misses reads made in C and by other processes, and which cell code "
                f"can fool.")

    # ------------------------------------------------------------------ ending

    def teardown(self) -> None:
        """Stop every kernel of the session (current, spare, retiring, standby) and remove
        the folders the session owns. Safe to call twice."""
        if self._handed is not None:
            handed, self._handed = self._handed, None
            handed[0].stop()
        if self.kernel is not None:
            self.kernel.stop()
            self.kernel = None
        self._drop_spare()
        for thread in self._retiring:
            thread.join(timeout=30)
        self._retiring.clear()
        if self._standby is not None:
            standby, self._standby = self._standby, None
            standby.close()
        for folder in self._owned_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        self._owned_dirs.clear()
        self._end_lease()

    def remove_runtime(self) -> None:
        """Remove the runtime folder (after the call server that lives in it stopped)."""
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            self.runtime_dir = None
