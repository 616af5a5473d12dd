"""The Host: drives one ipykernel, attributes every call to the cell it runs, keeps the record.

Owns the session lifecycle (unopened → open → closed), kernel generations,
``execute`` and its Observation, the kernel→Host call channel (which calls
exist and who may make them), and appending every event to the ledger. Work on
files, commands and artifacts is delegated to ``_workspace``, ``_bash`` and
the blob store; verification to ``verify``; rendering to ``_render``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import datetime as dt
import enum
import fcntl
import hmac
import json
import mimetypes
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import nbformat

from .. import _version
from .._errors import (
    BadArguments,
    CallRefused,
    ConfinementError,
    FileProblem,
    HostCallError,
    HostKernelError,
    KernelError,
    RecordError,
    StorageError,
)
from .._ids import mint_cell_id, mint_token, mint_uuid
from .._models import Artifact, Observation, Status, Verdict
from .._paths import default_record_dir
from .._procs import pid_alive
from ..lineage.flow import OBSERVED, TRACED
from ..lineage.graph import build_lineage
from ..modes import TaskMode, resolve_task_mode
from ..reproduce import Limits, Reproducer, record_baseline
from ..reproduce.runner import DEFAULT_MEMORY
from ..sandbox.client import Confinement, Sandbox, SandboxError, probe
from ..sandbox.landlock import LandlockError, Ruleset
from ..sandbox.policy import Policy, ruleset_spec, uncovered
from ..sandbox.trace import unavailable as trace_unavailable
from ..store.blobs import FileBlobStore
from ..store.ledger import Event, ForeignEventError, SQLiteLedger, check_chain, rebuild
from ..store.pg import KEY_ENV, PostgresLedger, is_postgres_url, keys_folder, redact_url
from ..verify import LiveFiles, RecordView, Submission, unreadable_verdict, verify
from . import _subtasks
from ._bash import CommandContext, Redactor, kill_group, run_command
from ._kernel import KernelGeneration, close_thread_loop, kernel_env, short_tempdir
from ._lineage import CellIO, SessionLineage, confirm_with_llm
from ._pool import HostPool, Standby
from ._render import DEFAULT_TEXT_LIMIT, cell_header, cut, render_outputs
from ._server import CallServer, Emit
from ._trace import TracedAccess, TraceLog, now_ns
from ._workspace import HashCache, Workspace

__all__ = ["Host", "HostState"]

#: Seconds a Host waits for the record's sessions lock before it gives up.
SESSIONS_LOCK_WAIT = 30.0
#: Seconds the Host waits after interrupting a timed-out cell before restarting.
INTERRUPT_GRACE = 1.5
#: How often a waiting Host checks that the kernel process is still alive.
LIVENESS_POLL = 0.2
#: Most characters of stream output kept in the record for one cell; past it the
#: record says how much was dropped.
RECORD_OUTPUT_LIMIT = 16 * 1024 * 1024
#: Variables ipykernel sets in its own environment at start-up.
KERNEL_SET_ENV = frozenset({"MPLBACKEND", "JPY_PARENT_PID", "PYDEVD_DISABLE_FILE_VALIDATION",
                            "CLICOLOR", "PAGER", "GIT_PAGER", "FORCE_COLOR", "TERM",
                            "JPY_SESSION_NAME", "CLICOLOR_FORCE", "PYDEVD_USE_FRAME_EVAL"})


class HostState(enum.Enum):
    UNOPENED = "unopened"  # constructed; no kernel, no record yet
    OPEN = "open"          # a kernel generation is running and cells may execute
    CLOSED = "closed"      # kernel stopped, socket removed, ledger closed; terminal


@dataclass(frozen=True, slots=True)
class _RunningCell:
    cell_id: str
    generation: int
    token: str
    code: str = ""
    io: CellIO = field(default_factory=CellIO)
    #: When the Host sent the cell: CLOCK_MONOTONIC (the tracer's clock) and wall time.
    start_ns: int = 0
    start_wall_ns: int = 0

    @classmethod
    def now(cls, cell_id: str, generation: int, token: str, code: str) -> _RunningCell:
        """A cell about to be sent, stamped as the tracer will see it."""
        start_ns, start_wall_ns = now_ns()
        return cls(cell_id, generation, token, code, start_ns=start_ns,
                   start_wall_ns=start_wall_ns)


#: Sub-folders of a session's private folder, each named in the kernel's environment.
PRIVATE_DIRS = {"TMPDIR": "tmp", "IPYTHONDIR": "ipython", "XDG_CACHE_HOME": "cache",
                "MPLCONFIGDIR": "mpl", "JUPYTER_RUNTIME_DIR": "jupyter", "PIP_TARGET": "site"}


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class Host:
    """A trusted controller for one ipykernel and its record.

    ``Host(workdir, mode=None, request=None, record_dir=None)``: ``mode`` arms a task
    mode; without it, ``request`` (the task text) is classified and the mode is only
    detected. Use as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        mode: str | None = None,
        request: str | None = None,
        record_dir: str | os.PathLike[str] | None = None,
        *,
        text_limit: int = DEFAULT_TEXT_LIMIT,
        startup_timeout: float = 60.0,
        secret_names: tuple[str, ...] = (),
        front: str = "api",
        llm: Any = None,
        network: bool = True,
        require_confinement: bool = False,
        read_paths: tuple[str | os.PathLike[str], ...] = (),
        hide_paths: tuple[str | os.PathLike[str], ...] = (),
        hide_env: tuple[str, ...] = (),
        reproduce_timeout: float | None = None,
        reproduce_memory: int | None = DEFAULT_MEMORY,
        trace: bool = True,
        pool: HostPool | None = None,
        spare: bool = False,
        resume: str | None = None,
        delegator: Any = None,
        skills: Any = None,
        ledger: str | None = None,
        ledger_key: bytes | None = None,
        blobs: str | None = None,
    ) -> None:
        root = Path(workdir)
        if not root.is_dir():
            raise KernelError(f"workdir {workdir} is not a directory")
        self.workdir = Path(os.path.realpath(root))
        self.record_dir = Path(os.path.realpath(record_dir or default_record_dir(self.workdir)))
        if not isinstance(network, bool):
            raise BadArguments("network must be True or False")
        self.network = network
        self.require_confinement = require_confinement
        self.read_paths = tuple(str(p) for p in read_paths)
        #: Folders the confined kernel may not even read (a sub-task's parent workspace,
        #: all of it but the folder the sub-task works in).
        self.hide_paths = tuple(str(p) for p in hide_paths)
        if ledger is not None and not is_postgres_url(ledger):
            raise BadArguments("ledger must be a postgresql:// URL, or None for the SQLite "
                               "ledger in the record folder")
        if ledger_key is not None and (not isinstance(ledger_key, bytes) or ledger is None):
            raise BadArguments("ledger_key must be the bytes of a PostgreSQL ledger's record "
                               "key, given with ledger=")
        if blobs is not None and not isinstance(blobs, str):
            raise BadArguments("blobs must be an fsspec URL (s3://bucket/prefix, "
                               "file:///shared/path) or None")
        #: The PostgreSQL ledger's URL (docs/scale.md); None: SQLite in the record folder.
        self.ledger_url = ledger
        self._ledger_key = ledger_key
        #: Where artifacts' blobs are written through to (an fsspec URL); None: local only.
        self.blobs_url = blobs
        #: Names of the Host's own secrets, never put into the kernel's environment: an LLM
        #: key's, and with a PostgreSQL ledger libpq's own (a password, its files).
        self.hide_env = frozenset(hide_env) | _llm_key_names(llm) | (
            _PG_ENV if ledger is not None else frozenset()) | (
            _BLOB_ENV if blobs is not None else frozenset())
        if reproduce_timeout is not None and (isinstance(reproduce_timeout, bool) or not
                                              isinstance(reproduce_timeout, (int, float))
                                              or reproduce_timeout <= 0):
            raise BadArguments("reproduce_timeout must be a positive number of seconds or None")
        if reproduce_memory is not None and (isinstance(reproduce_memory, bool) or not
                                             isinstance(reproduce_memory, int)
                                             or reproduce_memory <= 0):
            raise BadArguments("reproduce_memory must be a positive number of bytes or None")
        #: Bounds of each reproduction of test evidence (docs/verification.md).
        self.reproduce_limits = Limits(reproduce_timeout, reproduce_memory)
        self._reproducer: Reproducer | None = None
        if not isinstance(trace, bool):
            raise BadArguments("trace must be True or False")
        #: Whether to trace file access at the OS level (docs/lineage.md); False leaves
        #: lineage to the in-kernel audit hook, and the record says so.
        self.trace = trace
        if pool is not None and not isinstance(pool, HostPool):
            raise BadArguments("pool must be a HostPool or None")
        if not isinstance(spare, bool):
            raise BadArguments("spare must be True or False")
        #: Where the first kernel comes from when it is warm (host/_pool.py).
        self.pool = pool
        #: Keep the next generation's kernel started, so a restart is a swap.
        self.spare = spare
        self._standby: Standby | None = None
        #: Why the pool did not serve this session (recorded with the first generation).
        self._pool_miss: str | None = None
        self._spare_kernel: KernelGeneration | None = None
        self._spare_thread: threading.Thread | None = None
        self._spare_lock = threading.Lock()
        #: Why the last spare could not be started (recorded at the next restart).
        self._spare_error: str | None = None
        #: Folders the Host took over from a standby (removed at close).
        self._owned_dirs: list[Path] = []
        #: Threads reaping the kernels of earlier generations (joined at close).
        self._retiring: list[threading.Thread] = []
        #: The current generation's tracer, None when untraced.
        self._trace: TraceLog | None = None
        #: What the record says about tracing: {"status": "seccomp"} or why not.
        self.tracing: dict[str, Any] = {}
        self._tracing_told = False
        #: What the record says about confinement; decided at start().
        self.confinement: Confinement | None = None
        self._policy: Policy | None = None
        self._private_dir: Path | None = None
        self._confinement_told = False
        self.mode: TaskMode = resolve_task_mode(request, mode)
        self.request = request
        self.text_limit = text_limit
        self.startup_timeout = startup_timeout
        self.front = front
        if resume is not None and (not isinstance(resume, str) or not resume):
            raise BadArguments("resume must be the id of a session in the record, or None")
        #: The session this Host takes up again instead of starting one (docs/agent.md).
        self.resume_session = resume
        self.session_id = resume or mint_uuid()
        #: Starts and collects sub-tasks for host.delegate/host.collect (an agent session's
        #: host_kernel.agent.delegation.Delegator); None: delegation is refused.
        self.delegator = delegator
        #: The skills catalog host.skills reads (host_kernel.skills.Catalog); loaded from
        #: the three collections on first use when not given.
        self.skills = skills
        self.workspace = Workspace(self.workdir, self.record_dir)
        self.redactor = Redactor(secret_names)
        #: An optional LLM client (host_kernel.llm.LLMClient) that may narrow lineage.
        self.llm = llm
        self._hash_cache: HashCache = {}
        self.lineage = SessionLineage(self.workspace, self._hash_cache,
                                      source_of=self._source_of)
        self.state = HostState.UNOPENED
        self._kernel: KernelGeneration | None = None
        #: Generations an earlier process of this session ran (a resumed relay session).
        self._prior_generations = 0
        self._running: _RunningCell | None = None
        self._verdicts: list[tuple[Verdict, str | None]] = []
        #: Set when a cell ignored the interrupt after Ctrl-C: the generation is restarted,
        #: with this reason, before the next cell.
        self._restart_due: str | None = None
        self._old_tokens: set[str] = set()
        #: How deep this Host holds the record's sessions lock (see _sessions_lock).
        self._lock_depth = 0
        self._pending_access: dict[str, Any] = {}
        #: host.bash processes still running, per cell, with an event set once recorded.
        self._commands: dict[str, list[tuple[subprocess.Popen[bytes], threading.Event]]] = {}
        self._commands_lock = threading.Lock()
        self._exec_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._launch_env: dict[str, str] = {}
        self._runtime_dir: Path | None = None
        self._server: CallServer | None = None
        self.ledger: SQLiteLedger | PostgresLedger | None = None
        self.blobs: FileBlobStore | None = None
        self._calls: dict[str, Callable[[_RunningCell, dict[str, Any], Emit], Any]] = {
            "ping": self._call_ping,
            "whoami": self._call_whoami,
            "write_file": self._call_write_file,
            "edit_file": self._call_edit_file,
            "read_file": self._call_read_file,
            "bash": self._call_bash,
            "save_artifact": self._call_save_artifact,
            "load_artifact": self._call_load_artifact,
            "artifacts": self._call_artifacts,
            "cell_access": self._call_cell_access,
            "submit_output": self._call_submit_output,
            "lineage": self._call_lineage,
            "skills": lambda cell, args, emit: _subtasks.skills_call(self, args),
            "delegate": lambda cell, args, emit: _subtasks.start(self, cell, args),
            "collect": lambda cell, args, emit: _subtasks.collect(self, cell, args),
        }
        #: seq → hash of every event this Host appended: the anchor that an edit of the
        #: SQLite file (even one that recomputes the whole chain) cannot move.
        self._appended: dict[int, str] = {}
        #: Set once a foreign event is found on the ledger's tail: every append then fails.
        self._foreign: RecordError | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Host:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Host:
        if self.state is not HostState.UNOPENED:
            raise KernelError(f"the Host is {self.state.value}; it can be started once")
        confinement = probe(None, network=self.network)
        if not confinement.active and self.require_confinement:
            raise ConfinementError(f"confinement is required but not available: "
                                   f"{confinement.reason}")
        if confinement.active and _inside(self.record_dir, self.workdir):
            raise ConfinementError(
                f"the record folder {self.record_dir} is inside the workspace {self.workdir}; "
                f"confined code may write anywhere in the workspace, so the record must live "
                f"outside it (leave record_dir unset for {default_record_dir(self.workdir)})")
        self.record_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.record_dir, 0o700)
        self.ledger, self.blobs = self._open_stores()
        shared = self._local_blob_folder()
        if confinement.active and shared is not None and (
                _inside(shared, self.workdir) or _inside(self.workdir, shared)):
            self.ledger.close()
            raise ConfinementError(
                f"the blob store's folder {shared} and the workspace {self.workdir} overlap; "
                f"confined code may read and write anywhere in the workspace, and the store "
                f"holds other sessions' artifacts, so it must live outside it")
        self.blobs.sweep()
        self._runtime_dir = Path(tempfile.mkdtemp(prefix="hk-", dir=short_tempdir()))
        socket_path = str(self._runtime_dir / "host.sock")
        try:
            self._take_standby(confinement)
            if self._standby is not None:
                self._private_dir = self._standby.private
            else:
                self._private_dir = self._runtime_dir / "s"
                self._private_dir.mkdir()
            self._server = CallServer(socket_path, self._dispatch)
            self._launch_env = self._build_env(socket_path)
            if confinement.active:
                self._launch_env["HOST_KERNEL_CONFINED"] = "1"
                self._policy = Policy.for_session(
                    self.workdir, self._private_dir,
                    [self.record_dir, *_llm_key_file(self.llm), *self._ledger_secrets(),
                     *self.hide_paths],
                    network=self.network, extra_read=self.read_paths)
                confinement = probe(self._policy, network=self.network)
                if not confinement.active and self.require_confinement:
                    raise ConfinementError(f"confinement is required but not available: "
                                           f"{confinement.reason}")
                if not confinement.active:
                    self._policy = None
                    del self._launch_env["HOST_KERNEL_CONFINED"]
            self.confinement = confinement
            if self._why_untraced() is None:
                # The kernel's audit hook would only repeat, slower and less reliably,
                # what the tracer sees; the extension leaves it out (docs/lineage.md).
                self._launch_env["HOST_KERNEL_TRACED"] = "1"
            self.redactor.learn(self._launch_env)
            self._begin_session()
        except BaseException:
            self._teardown()
            raise
        self.state = HostState.OPEN
        return self

    def _open_stores(self) -> tuple[SQLiteLedger | PostgresLedger, FileBlobStore]:
        """The ledger (SQLite in the record folder, or PostgreSQL by URL) and the blob
        store (the record folder's, written through to ``blobs`` when given)."""
        ledger: SQLiteLedger | PostgresLedger
        if self.ledger_url is None:
            ledger = SQLiteLedger(self.record_dir / "ledger.sqlite")
        else:
            ledger = PostgresLedger(self.ledger_url, key=self._ledger_key)
        try:
            if self.blobs_url is None:
                return ledger, FileBlobStore(self.record_dir)
            from ..store.fsblobs import MirroredBlobStore

            try:
                return ledger, MirroredBlobStore(self.record_dir, self.blobs_url)
            except ValueError as exc:  # a URL fsspec cannot use, a path it would glob
                raise BadArguments(f"blobs: {exc}") from None
        except BaseException:
            ledger.close()
            raise

    def _stores_named(self) -> dict[str, str]:
        """Where the record lives when it is not all in the record folder (no password)."""
        named = {}
        if self.ledger_url is not None:
            named["ledger"] = redact_url(self.ledger_url)
        if self.blobs_url is not None:
            named["blobs"] = redact_url(self.blobs_url)
        return named

    def _local_blob_folder(self) -> Path | None:
        """The folder of a ``blobs=`` store on a local or shared file system; None for an
        object store, or without ``blobs=``."""
        remote = getattr(self.blobs, "remote", None)
        if remote is None or not remote.local:
            return None
        return Path(os.path.realpath(remote.root))

    def _ledger_secrets(self) -> list[str]:
        """Files the kernel must not read because they open the record's stores: a
        PostgreSQL ledger's record key and libpq's password and service files; an object
        store's credentials, or the store's folder when it is on a local file system."""
        home = Path.home()
        # Every PostgreSQL ledger's key, whatever this session writes to: a kernel that
        # read one could forge events any database writer could then insert. The folder
        # is made now if missing, so that a key made there later is hidden too.
        with contextlib.suppress(OSError):
            keys_folder().mkdir(parents=True, exist_ok=True, mode=0o700)
        found: list[Path] = [keys_folder()]
        if os.environ.get(KEY_ENV):
            found.append(Path(os.environ[KEY_ENV]))
        if self.ledger_url is not None:
            found += [home / ".pgpass", home / ".pg_service.conf"]
            found += [Path(os.environ[n]) for n in ("PGPASSFILE", "PGSERVICEFILE")
                      if os.environ.get(n)]
        if self.blobs_url is not None:
            # A blob store on a local or shared file system: it holds other sessions'
            # artifacts (every task of a batch writes there).
            shared = self._local_blob_folder()
            if shared is not None:
                found.append(shared)
            found += [home / ".aws", home / ".config" / "gcloud", home / ".azure"]
            found += [Path(os.environ[n]) for n in ("AWS_SHARED_CREDENTIALS_FILE",
                                                    "AWS_CONFIG_FILE",
                                                    "GOOGLE_APPLICATION_CREDENTIALS")
                      if os.environ.get(n)]
        return [str(p) for p in found if p.exists()]

    def _take_standby(self, confinement: Confinement) -> None:
        """A standby kernel from the pool, when it can serve this session; else why not."""
        if self.pool is None:
            return
        hidden = frozenset(self.hide_env)
        why = self.pool.refusal(confined=confinement.active,
                                traced=confinement.active and self.trace
                                and trace_unavailable() is None, hidden=hidden)
        if why is None:
            self._standby = self.pool.take(wait=self.startup_timeout)
            if self._standby is None:
                why = "no standby kernel was waiting"
            else:
                self._owned_dirs.append(self._standby.folder)
        self._pool_miss = why

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

    def _build_env(self, socket_path: str) -> dict[str, str]:
        """The kernel's environment: the Host's, less its own secrets, plus the session's
        private folders (temp, IPython, caches, the package overlay) and the call socket.

        The record's location is not in it: confined code has no business there.
        """
        assert self._private_dir is not None
        base = {k: v for k, v in os.environ.items()
                if k not in self.hide_env and not k.startswith("HOST_KERNEL_")
                and not (self.blobs_url is not None and k.startswith("FSSPEC_"))}
        env = kernel_env(base)
        for name, sub in PRIVATE_DIRS.items():
            folder = self._private_dir / sub
            folder.mkdir(exist_ok=True)
            env[name] = str(folder)
        overlay = env["PIP_TARGET"]
        # `pip install` (a cell's %pip, or host.bash) lands in the session's overlay,
        # which is first on the kernel's import path and its scripts first on PATH.
        env["PYTHONPATH"] = os.pathsep.join([overlay] + [p for p in env.get(
            "PYTHONPATH", "").split(os.pathsep) if p])
        env["PATH"] = os.pathsep.join([os.path.join(overlay, "bin"), env["PATH"]])
        env["PIP_CACHE_DIR"] = str(self._private_dir / "cache" / "pip")
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        env.update({
            "HOST_KERNEL_SOCKET": socket_path,
            "HOST_KERNEL_WORKSPACE": str(self.workdir),
            "HOST_KERNEL_SESSION": self.session_id,
        })
        return env

    def _begin_session(self) -> None:
        """Record the session's start and start its first kernel generation.

        With ``resume`` the session named is taken up instead (:meth:`_take_up`). The
        relay front overrides this to continue a session across its own restart
        (host_kernel/host/_relay_support.py).
        """
        if self.resume_session is not None:
            self._take_up(self.resume_session)
            return
        if isinstance(self.ledger, PostgresLedger):
            # Held while this Host lives: another Host then knows the session is not
            # abandoned (the server lets the lock go when this process dies).
            self.ledger.claim(self.session_id)
        self._append("session_started", {
            "workdir": str(self.workdir), "record_dir": str(self.record_dir),
            "mode": {"name": self.mode.name, "armed": self.mode.armed,
                     "signals": list(self.mode.signals)},
            "request": self.request, "host_version": _version.__version__,
            "front": self.front, "pid": os.getpid(), "host": socket.gethostname(),
            "confinement": None if self.confinement is None else self.confinement.to_dict(),
            "kernel_env": sorted(self._launch_env), **self._stores_named(),
        })
        if self.mode.enforced and self.mode.name == "codebase_change":
            # Before any cell runs: the bytes the change applies to, kept where the
            # kernel cannot reach (the workspace, .git included, is writable to it).
            assert self.blobs is not None
            self._append("baseline_recorded", record_baseline(self.workdir, self.blobs))
        self._close_abandoned_sessions()
        self._start_generation("start")

    @contextlib.contextmanager
    def _sessions_lock(self) -> Iterator[None]:
        """Hold the record's lock on session ownership (taking a session up, closing an
        abandoned one), so two Hosts never both decide a session is theirs to change."""
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        if isinstance(self.ledger, PostgresLedger):
            # Sessions are held one by one (PostgresLedger.claim): no record-wide lock.
            yield
            return
        path = self.record_dir / "sessions.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise RecordError(f"cannot open the record's lock {path}: "
                              f"{exc.strerror or exc}") from None
        try:
            deadline = time.monotonic() + SESSIONS_LOCK_WAIT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RecordError(f"another Host has held the record's lock {path} "
                                          f"for {SESSIONS_LOCK_WAIT:g} s") from None
                    time.sleep(0.05)
            self._lock_depth = 1
            try:
                yield
            finally:
                self._lock_depth = 0
        finally:
            os.close(fd)

    def _take_up(self, session: str) -> None:
        """Continue ``session`` in a new generation (``resume``); see :meth:`_take_up_locked`."""
        with self._sessions_lock():
            self._take_up_locked(session)
        self._start_generation("resume")

    def _take_up_locked(self, session: str) -> None:
        """Continue ``session`` of this record in a new kernel generation.

        The chain must verify; the session must have been started from this workspace
        and must not be running (its Host process gone, or its session ended). A session
        whose Host died is first closed as the record closes any abandoned one (its
        running cells finished ``host_died``), then a ``session_resumed`` event reopens
        it, and the next generation starts with reason ``resume``. Nothing earlier is
        rewritten: memory of the earlier generations is gone, and the record says so.
        """
        assert self.ledger is not None
        pg = self.ledger if isinstance(self.ledger, PostgresLedger) else None
        if pg is not None and not pg.try_claim(session):
            # Held first, then read: no other Host can close it between the two.
            raise RecordError(f"session {session} is still running (its Host is connected "
                              f"to the ledger); it can be resumed once it ends",
                              code="session_running")
        problems = check_chain(self.ledger, session)
        if problems:
            raise RecordError(f"cannot resume session {session}: the record's chain is broken "
                              f"({problems[0]}); `host-kernel audit {self.record_dir}`")
        # On PostgreSQL the session's events are read replayed and checked (its MACs too):
        # any writer of the database could have changed the rows a plain query returns.
        source = rebuild(self.ledger, session) if pg is not None else self.ledger
        try:
            self._take_up_from(session, source, pg)
        finally:
            if source is not self.ledger:
                source.close()
        self._close_abandoned_sessions()

    def _take_up_from(self, session: str, source: Any, pg: PostgresLedger | None) -> None:
        rows = source.query("SELECT seq, hash, kind, body FROM events WHERE session = ? "
                            "ORDER BY seq", (session,))
        if not rows or rows[0]["kind"] != "session_started":
            raise RecordError(f"no session {session} in the record {self.record_dir}",
                              code="unknown_session")
        started = json.loads(rows[0]["body"])
        if started.get("workdir") != str(self.workdir):
            raise RecordError(f"session {session} ran in {started.get('workdir')}, not in "
                              f"{self.workdir}; resume it from its own workspace",
                              code="unknown_session")
        last_start = started
        ended: str | None = None  # how the session last ended, None while it runs
        generation = 0
        for row in rows:
            if row["kind"] in ("session_started", "session_resumed"):
                last_start, ended = json.loads(row["body"]), None
            elif row["kind"] == "session_ended":
                ended = "host_died" if json.loads(row["body"]).get("reason") == "host_died" \
                    else "ended"
            elif row["kind"] == "generation_started":
                generation = max(generation, int(json.loads(row["body"])["generation"]))
        pid = last_start.get("pid")
        if pg is None and ended is None and (last_start.get("host") != socket.gethostname()
                                             or not isinstance(pid, int) or pid_alive(pid)):
            raise RecordError(f"session {session} is still running (Host process {pid} on "
                              f"{last_start.get('host')}); it can be resumed once it ends",
                              code="session_running")
        self._appended = {r["seq"]: r["hash"] for r in rows}
        mode = started.get("mode") or {}
        self.mode = TaskMode(str(mode.get("name")), bool(mode.get("armed")),
                             tuple(mode.get("signals", ())))
        self.request = started.get("request")
        previous = ended or "host_died"
        if ended is None:
            for cell in source.query("SELECT cell_id FROM cells WHERE session = ? AND "
                                     "status = 'running'", (session,)):
                self._append("cell_finished", {
                    "cell_id": cell["cell_id"], "status": "host_died", "outputs": [],
                    "execution_count": None, "recovered_by": "resume"})
            self._append("session_ended", {"reason": "host_died", "recovered_by": "resume"})
        self._prior_generations = generation
        self._append("session_resumed", {
            "previous": previous, "host_version": _version.__version__, "front": self.front,
            "pid": os.getpid(), "host": socket.gethostname(),
            "confinement": None if self.confinement is None else self.confinement.to_dict(),
            "kernel_env": sorted(self._launch_env),
        })

    def _close_abandoned_sessions(self) -> None:
        """Close, once, the sessions of this record whose Host died (housekeeping: when
        the record's lock cannot be had, it is left for the next Host)."""
        try:
            with self._sessions_lock():
                self._close_abandoned_locked()
        except RecordError:
            if self.resume_session is not None:
                raise

    def _close_abandoned_locked(self) -> None:
        """Sessions whose Host died (killed, crashed) are closed in the record, once.

        Their cells left running are finished as ``host_died``; nothing else is changed.
        A session whose Host process is still alive on this machine is left alone.
        """
        assert self.ledger is not None
        if isinstance(self.ledger, PostgresLedger):
            self._close_abandoned_pg(self.ledger)
            return
        me = socket.gethostname()
        latest: dict[str, dict[str, Any]] = {}  # the Host process that holds each session
        for row in self.ledger.query(
                "SELECT e.session, e.body FROM events e JOIN sessions s ON s.session = e.session "
                "WHERE e.kind IN ('session_started', 'session_resumed') AND s.ended IS NULL "
                "AND e.session != ? ORDER BY e.seq", (self.session_id,)):
            latest[row["session"]] = json.loads(row["body"])
        for session, body in latest.items():
            pid = body.get("pid")
            if body.get("host") != me or not isinstance(pid, int) or pid_alive(pid):
                continue
            for cell in self.ledger.query("SELECT cell_id FROM cells WHERE session = ? AND "
                                          "status = 'running'", (session,)):
                self.ledger.append(session, "cell_finished", {
                    "cell_id": cell["cell_id"], "status": "host_died", "outputs": [],
                    "execution_count": None, "recovered_by": self.session_id})
            self.ledger.append(session, "session_ended", {
                "reason": "host_died", "recovered_by": self.session_id})

    def _close_abandoned_pg(self, ledger: PostgresLedger) -> None:
        """The PostgreSQL ledger's sessions whose Host is gone (no connection holds their
        lock, on any machine) are closed as on SQLite, then let go."""
        for row in ledger.query("SELECT session FROM sessions WHERE ended IS NULL AND "
                                "session != ? ORDER BY started", (self.session_id,)):
            session = row["session"]
            if not ledger.try_claim(session):
                continue  # its Host is alive (or another Host is closing it right now)
            try:
                # What to close is read from the session's checked events, never from the
                # stored tables (any writer of the database could have changed those).
                try:
                    trusted = rebuild(ledger, session)
                except RecordError:
                    continue  # a session that fails its checks is audit's to report
                with trusted:
                    ended = trusted.query("SELECT ended FROM sessions WHERE session = ?",
                                          (session,))
                    running = [r["cell_id"] for r in trusted.query(
                        "SELECT cell_id FROM cells WHERE session = ? AND status = 'running'",
                        (session,))]
                if not ended or ended[0]["ended"] is not None:
                    continue  # ended already (or no session_started): nothing to close
                for cell_id in running:
                    ledger.append(session, "cell_finished", {
                        "cell_id": cell_id, "status": "host_died", "outputs": [],
                        "execution_count": None, "recovered_by": self.session_id})
                ledger.append(session, "session_ended", {
                    "reason": "host_died", "recovered_by": self.session_id})
            finally:
                ledger.release(session)

    def close(self) -> str | None:
        """Stop the kernel, the call server and the ledger. Safe to call twice.

        Returns the chain's head as this Host last wrote it (:attr:`head`).
        """
        if self.state is HostState.CLOSED:
            return self.head
        if self.delegator is not None:
            # Sub-tasks end with the session that started them (each closes its record).
            self.delegator.shutdown()
        if self.state is HostState.OPEN and self.ledger is not None:
            try:
                self._append("session_ended", {"generation": self.generation})
            except HostKernelError:
                pass
        self._teardown()
        self.state = HostState.CLOSED
        return self.head

    def _teardown(self) -> None:
        if self._kernel is not None:
            self._kernel.stop()
            self._kernel = None
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
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
            self._runtime_dir = None
        if self.ledger is not None:
            self.ledger.close()

    def _require_open(self) -> None:
        if self.state is not HostState.OPEN:
            raise KernelError(f"the Host is {self.state.value}; use it inside `with Host(...)`"
                              " or call start() first")

    @property
    def generation(self) -> int:
        return 0 if self._kernel is None else self._kernel.generation

    @property
    def kernel_pid(self) -> int | None:
        """The pid of the process jupyter_client started for this generation: the kernel
        itself when unconfined; confined, the sandbox's launcher, which leads the
        kernel's process group (signal the group to reach the kernel) and exits with it."""
        return None if self._kernel is None else self._kernel.pid

    def _start_generation(self, reason: str) -> None:
        previous = self._kernel
        generation = (self._prior_generations if previous is None else previous.generation) + 1
        if previous is not None:
            self._old_tokens.add(previous.token)
            self._retiring = [t for t in self._retiring if t.is_alive()]
            self._retiring.append(previous.retire())
            self._kernel = None
            self.lineage.new_generation()
        body: dict[str, Any] = {"generation": generation, "reason": reason}
        self._trace = None
        kernel = self._swap_in_spare(generation, body) if previous is not None else None
        if kernel is None and self._standby is not None:
            kernel = self._adopt_standby(generation, body)
        if kernel is None:
            kernel = self._new_kernel(generation)
        self._kernel = kernel
        why_untraced = self._why_untraced()
        sandbox = kernel.sandbox
        if sandbox is not None and sandbox.traced:
            self._trace = TraceLog(sandbox, self.workspace)
        elif sandbox is not None and why_untraced is None:
            why_untraced = "the sandbox's init could not trace (see its hello)"
        self.tracing = ({"status": "seccomp"} if self._trace is not None else
                        {"status": "audit-hook", "reason": why_untraced})
        body["tracing"] = self.tracing
        if sandbox is not None:
            hello = kernel.hello
            folder = kernel.folder
            body["confinement"] = {"status": "landlock",
                                   "pid_namespace": hello.get("pid_namespace"),
                                   "pid_namespace_reason": hello.get("reason"),
                                   "rules_added": [{"path": str(folder), "access": "write"},
                                                   {"path": str(folder / "kernel.json"),
                                                    "access": "read_file"}]}
            if self.confinement is not None and self.confinement.pid_namespace is None:
                self.confinement = dataclasses.replace(
                    self.confinement, pid_namespace=bool(hello.get("pid_namespace")),
                    pid_namespace_reason=hello.get("reason"))
        else:
            body["confinement"] = {"status": "none"}
        if self.pool is not None and generation == self._prior_generations + 1 \
                and "warm" not in body:
            body["warm"] = {"pool": self.pool.id, "used": False, "reason": self._pool_miss}
        self._append("generation_started", body)
        if self.spare:
            self._start_spare(generation + 1)

    def _generation_parts(self, generation: int, folder: Path
                          ) -> tuple[str, dict[str, str], Policy | None, list[str] | None]:
        """A generation's token, environment, policy (None unconfined) and trace roots."""
        token = mint_token()
        env = self._launch_env | {"HOST_KERNEL_TOKEN": token,
                                  "HOST_KERNEL_GENERATION": str(generation)}
        policy = None
        if self._policy is not None and self.confinement is not None:
            policy = self._policy.with_generation(folder, folder / "kernel.json")
        roots = None if self._why_untraced() else TraceLog.roots(self.workspace)
        return token, env, policy, roots

    def _new_kernel(self, generation: int) -> KernelGeneration:
        """A kernel started now, cold."""
        assert self._runtime_dir is not None
        folder = self._runtime_dir / f"g{generation}"
        folder.mkdir()
        token, env, policy, roots = self._generation_parts(generation, folder)
        sandbox = None
        if policy is not None and self.confinement is not None:
            sandbox = Sandbox(policy, self.confinement.abi, trace_roots=roots)
        return KernelGeneration(generation, token, folder / "kernel.json", self.workdir, env,
                                self.startup_timeout, sandbox)

    def _adopt_standby(self, generation: int, body: dict[str, Any]) -> KernelGeneration | None:
        """The pool's standby, narrowed to this session; None (and why, recorded) if not."""
        standby = self._standby
        assert standby is not None and self.pool is not None
        token, env, policy, roots = self._generation_parts(generation, standby.folder)
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
        ruleset = None
        try:
            if policy is not None and standby.sandbox is not None:
                assert self.confinement is not None
                standby.sandbox.narrow(policy, roots)
                # Built here (trusted, untraced) and handed over: the standby only enters it.
                ruleset = Ruleset(self.confinement.abi, network=policy.network)
                for path, access in ruleset_spec(policy):
                    ruleset.allow(path, access)
                orders["ruleset"] = True
            kernel = KernelGeneration.adopt(generation, token, standby.manager, standby.sandbox,
                                            standby.hello, standby.orders_fd, orders,
                                            self.startup_timeout,
                                            -1 if ruleset is None else ruleset.fd)
        except (KernelError, SandboxError, LandlockError) as exc:
            standby.stop()  # its folder holds the session's private one: the Host keeps it
            self._pool_miss = f"the standby kernel failed: {exc}"
            return None
        finally:
            if ruleset is not None:
                os.close(ruleset.fd)
        os.close(standby.orders_fd)  # read by now: nothing more goes down that socket
        standby.orders_fd = -1
        body["warm"] = {"pool": self.pool.id, "used": True, "standby_started": standby.started,
                        "handed_out": handed_out, "ready": was_ready,
                        "pool_writable": [] if standby.broad is None
                        else list(standby.broad.writable)}
        return kernel

    # ------------------------------------------------------------------ the spare kernel

    def _start_spare(self, generation: int) -> None:
        """Start the next generation's kernel in the background, for a restart to swap in."""
        with self._spare_lock:
            if self._spare_thread is not None or self._spare_kernel is not None:
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
            if self.state is HostState.CLOSED or self._kernel is None \
                    or self._kernel.generation + 1 != generation:
                stale = kernel
                kernel = None
            else:
                stale = None
                self._spare_kernel = kernel
                self._spare_error = error
        if stale is not None:
            stale.stop()
            shutil.rmtree(stale.folder, ignore_errors=True)
        close_thread_loop()

    def _swap_in_spare(self, generation: int, body: dict[str, Any]) -> KernelGeneration | None:
        """The spare, when one was started for this generation and is alive; else None."""
        if not self.spare:
            return None
        thread = self._spare_thread
        if thread is not None:
            thread.join(self.startup_timeout)  # still starting: still sooner than anew
        with self._spare_lock:
            spare, self._spare_kernel = self._spare_kernel, None
            error, self._spare_error = self._spare_error, None
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
            thread.join(self.startup_timeout)
        with self._spare_lock:
            spare, self._spare_kernel = self._spare_kernel, None
        if spare is not None:
            spare.stop()
            shutil.rmtree(spare.folder, ignore_errors=True)

    def _why_untraced(self) -> str | None:
        """Why this session's file access cannot be traced at the OS level, or None."""
        if not self.trace:
            return "tracing switched off (Host(trace=False))"
        if self._policy is None or self.confinement is None or not self.confinement.active:
            why = None if self.confinement is None else self.confinement.reason
            return f"the tracer runs in the sandbox, and this session is unconfined ({why})"
        return trace_unavailable()

    def _tracing_notice(self) -> str | None:
        if self.tracing.get("status") == "seccomp":
            return None
        return (f"lineage: file access is not traced at the OS level "
                f"({self.tracing.get('reason')}); the kernel's own audit hook reports it, "
                f"which misses reads made in C and by other processes, and which cell code "
                f"can fool.")

    def restart(self, reason: str = "requested") -> int:
        """Start a fresh kernel: a new generation with a new token. Returns its number."""
        self._require_open()
        with self._exec_lock:
            self._start_generation(reason)
        return self.generation

    def _append(self, kind: str, body: dict[str, Any]) -> Event:
        assert self.ledger is not None
        if self._foreign is not None:
            raise self._foreign
        try:
            try:
                event = self.ledger.append(self.session_id, kind, body)
            except UnicodeEncodeError:
                # A lone surrogate (a kernel can send one, escaped, in any JSON it sends)
                # cannot be hashed as UTF-8: keep the event, with U+FFFD in its place.
                event = self.ledger.append(self.session_id, kind, _scrubbed(body))
        except ForeignEventError as exc:
            self._foreign = RecordError(
                f"the ledger's tail is not what this Host last wrote, and no holder of the "
                f"record key wrote what follows (seq {', '.join(map(str, exc.seqs)) or '?'}): "
                f"events were appended or edited behind the Host's back. The Host writes "
                f"nothing more to this record; "
                f"`host-kernel audit {self.record_dir}` shows the events.", code="foreign_event")
            self._note_foreign(kind, exc)
            raise self._foreign from exc
        self._appended[event.seq] = event.hash
        return event

    def _note_foreign(self, kind: str, exc: ForeignEventError) -> None:
        """The chain cannot take our own note once foreign events sit on its tail, so the
        detection goes into a plain log beside it (and audit finds the events themselves)."""
        line = json.dumps({"ts": time.time(), "session": self.session_id, "refused_kind": kind,
                           "seqs": list(exc.seqs), "problems": [str(p) for p in exc.problems]})
        try:
            with open(self.record_dir / "foreign-events.log", "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError:
            pass

    @property
    def head(self) -> str | None:
        """The hash of the last event this Host wrote or verified: an anchor to keep
        elsewhere and hand to ``host-kernel audit --expect-head``."""
        known = None if self.ledger is None else self.ledger.known_head
        return None if known is None else known.hash

    # ------------------------------------------------------------------ execute

    def execute(self, code: str, timeout: float | None = None, *,
                frontend_cell_id: str | None = None) -> Observation:
        """Run one cell in the kernel and return what the Host saw."""
        self._require_open()
        if not isinstance(code, str):
            raise BadArguments(f"code must be a str, not {type(code).__name__}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise BadArguments("timeout must be a positive number of seconds or None")
        with self._exec_lock:
            if self._restart_due is not None:  # a cell ignored Ctrl-C's interrupt
                reason, self._restart_due = self._restart_due, None
                self._start_generation(reason)
            kernel = self._kernel
            assert kernel is not None
            cell_id = mint_cell_id()
            self._append("cell_started", {"cell_id": cell_id, "generation": kernel.generation,
                                          "code": code, "frontend_cell_id": frontend_cell_id})
            running = self._running = _RunningCell.now(cell_id, kernel.generation,
                                                       kernel.token, code)
            t0 = time.monotonic()
            run: _Run | None = None
            finished = False
            try:
                try:
                    run = self._run(kernel, code, cell_id, timeout)
                finally:
                    self._running = None
                duration = time.monotonic() - t0
                notice = self._settle_commands(cell_id)
                # Before any restart below, which forgets every name in memory.
                lineage_body = self._cell_lineage(running, run.access)
                notice = self._after_run(kernel, run, notice, timeout)
                outputs = [self.redactor.deep(o) for o in run.outputs]
                body: dict[str, Any] = {
                    "cell_id": cell_id, "status": run.status,
                    "execution_count": run.execution_count,
                    "outputs": outputs, "duration": duration, "notice": notice,
                }
                if run.dropped_chars:
                    body["dropped_chars"] = run.dropped_chars
                if run.access is not None:
                    body["access"] = run.access
                body.update(lineage_body)
                self._append("cell_finished", body)
                finished = True
            except BaseException as exc:  # Ctrl-C, or a failure of the Host's own
                if not finished:           # never leave the cell `running` in the record
                    self._record_unfinished(kernel, cell_id, time.monotonic() - t0, exc, run)
                raise
            if run.host_interrupted:
                raise KeyboardInterrupt  # recorded; the caller's Ctrl-C goes on from here
            if not self._confinement_told:
                self._confinement_told = True
                told = None if self.confinement is None else self.confinement.notice()
                if told is not None:
                    notice = told if notice is None else f"{told} {notice}"
            if not self._tracing_told:
                self._tracing_told = True
                told = self._tracing_notice()
                if told is not None:
                    notice = told if notice is None else f"{told} {notice}"
            text = self._text(cell_id, run.status, outputs, notice, run.dropped_chars)
            return Observation(cell_id=cell_id, status=run.status, outputs=tuple(outputs),
                               execution_count=run.execution_count, generation=kernel.generation,
                               text=text, duration=duration, notice=notice)

    def _after_run(self, kernel: KernelGeneration, run: _Run, notice: str | None,
                   timeout: float | None) -> str | None:
        """What a cell's end does to the kernel (a restart after a death or a stuck cell),
        and the notice that says so."""
        if run.status == "kernel_died":
            old = kernel.generation
            self._start_generation("kernel_died")
            return _join(notice, f"The kernel died while running this cell (generation "
                                 f"{old}). The Host started generation {self.generation}: "
                                 f"every variable, import and object in memory is gone. "
                                 f"What survives: workspace files, saved artifacts and "
                                 f"the record.")
        if run.status == "interrupted":
            notice = _join(notice, "The Host's own process was interrupted (Ctrl-C) while "
                                   "this cell ran; the Host interrupted the cell and kept "
                                   "what it had printed.")
            if run.stuck:
                # Restarted before the next cell, not now: a Ctrl-C is no time to start a
                # kernel, and the cell is recorded first.
                self._restart_due = "interrupted"
                notice = _join(notice, f"The cell did not stop within {INTERRUPT_GRACE:g} s, "
                                       f"so the Host will restart the kernel before the next "
                                       f"cell (generation {kernel.generation + 1}); in-memory "
                                       f"state will be gone.")
            return notice
        if run.status == "timeout":
            if run.stuck:
                old = kernel.generation
                self._start_generation("timeout")
                return _join(notice, f"The cell ran past its {timeout:g} s timeout and "
                                     f"did not stop within {INTERRUPT_GRACE:g} s of an "
                                     f"interrupt, so the Host restarted the kernel: "
                                     f"generation {old} → {self.generation}; in-memory "
                                     f"state is gone. Workspace files, artifacts and the "
                                     f"record survive.")
            return _join(notice, f"The cell ran past its {timeout:g} s timeout; the Host "
                                 f"interrupted it (KeyboardInterrupt). The kernel and its state "
                                 f"are still there (generation {kernel.generation}).")
        return notice

    def _record_unfinished(self, kernel: KernelGeneration, cell_id: str, duration: float,
                           exc: BaseException, run: _Run | None) -> None:
        """Close the record of a cell whose ``execute`` was stopped before its
        ``cell_finished`` (a KeyboardInterrupt or SystemExit outside the cell loop, or a
        failure of the Host's own), so the record never keeps a cell ``running`` whose
        Host is alive. Best effort and short; the caller re-raises ``exc``.

        When the kernel's run had not ended (``run`` is None), the Host interrupts it and
        waits briefly for it; the cell is ``interrupted`` with no outputs. When it had,
        the cell keeps its outputs and, unless the Host's process was interrupted, its
        own status. Its ``host.bash`` commands are killed either way.
        """
        stopped = isinstance(exc, (KeyboardInterrupt, SystemExit))
        if run is None:
            try:
                kernel.interrupt()  # a signal (or interrupt_request); the reply is awaited below
            except Exception:  # noqa: BLE001 - the kernel may be gone; the record still closes
                pass
        why = (f"The Host's own process was interrupted ({type(exc).__name__})" if stopped
               else f"The Host failed ({type(exc).__name__}: {exc})")
        notice = (f"{why} while this cell ran: the Host asked the kernel to interrupt the "
                  f"cell and did not collect its outputs." if run is None else
                  f"{why} while it recorded this cell's end.")
        try:
            notice = _join(self._settle_commands(cell_id), notice)
        except Exception:  # noqa: BLE001 - killing commands is best effort here
            pass
        status = "interrupted" if run is None or stopped else run.status
        outputs: list[dict[str, Any]] = []
        if run is not None:
            try:
                outputs = [self.redactor.deep(o) for o in run.outputs]
            except Exception:  # noqa: BLE001 - the outputs are what made it fail
                outputs = []
        body = {"cell_id": cell_id, "status": status,
                "execution_count": None if run is None else run.execution_count,
                "outputs": outputs, "duration": duration, "notice": notice}
        for attempt in (body, {**body, "outputs": [], "notice": _join(
                notice, "Its outputs could not be recorded.")}):
            try:
                self._append("cell_finished", attempt)
                break
            except HostKernelError:
                break  # the record refuses appends (foreign events): nothing more to try
            except Exception:  # noqa: BLE001 - e.g. an output the ledger cannot take
                continue
        if run is None:
            try:
                self._await_interrupted(kernel)
            except Exception:  # noqa: BLE001 - the kernel's sockets may be gone
                pass

    @staticmethod
    def _await_interrupted(kernel: KernelGeneration, wait: float = 2.0) -> None:
        """Wait (at most ``wait`` seconds) for the kernel to go idle after an interrupt,
        and take the interrupted request's reply off the shell socket. ipykernel aborts
        every request queued before it finishes an interrupted one (``stop_on_error``), so
        a next cell sent sooner would come back empty."""
        kc = kernel.client
        if kc is None:
            return
        iopub, shell = kc.iopub_channel.socket, kc.shell_channel.socket
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            if not iopub.poll(int(left * 1000) + 1):
                return
            try:
                _, parts = kc.session.feed_identities(iopub.recv_multipart())
                header, parent, content = (json.loads(parts[i]) for i in (1, 2, 4))
            except (ValueError, IndexError):
                continue
            if (header.get("msg_type") == "status"
                    and parent.get("msg_type") == "execute_request"
                    and content.get("execution_state") == "idle"):
                break
        while shell.poll(0):
            shell.recv_multipart()

    def _cell_lineage(self, running: _RunningCell, access: Any) -> dict[str, Any]:
        """Feed the finished cell to lineage: what the tracer saw the kernel's tree do in
        the cell's window, or, untraced, what the kernel's audit hook reported (``access``).
        Returns what the cell's record adds: ``traced`` and any ``lineage_error``."""
        body: dict[str, Any] = {}
        traced: TracedAccess | None = None
        if self._trace is not None:
            try:
                traced = self._trace.for_cell(running.start_ns, time.monotonic_ns(),
                                              since_wall_ns=running.start_wall_ns)
            except SandboxError as exc:  # the generation ended (the kernel died)
                body["lineage_error"] = f"trace: {exc}"
        try:
            if traced is not None:
                body["traced"] = traced.to_record()
                self.lineage.cell_finished(running.cell_id, running.code, traced.access(),
                                           running.io, method=TRACED)
            elif self._trace is None:
                self.lineage.cell_finished(running.cell_id, running.code, access, running.io)
        except Exception as exc:  # noqa: BLE001 - lineage is evidence about data, never acceptance
            body["lineage_error"] = f"{type(exc).__name__}: {exc}"
        return body

    def _source_of(self, path: str) -> str | None:
        """The text of a workspace file a cell runs (``%run script.py``), or None."""
        try:
            _, fh = self.workspace.open_file(path)
        except (HostCallError, OSError):
            return None
        with fh:
            data = fh.read(1 << 20)
        return data.decode("utf-8", "replace")

    def _generation_env(self, cell: _RunningCell) -> dict[str, str]:
        """The environment the Host launched this cell's kernel with: the baseline a
        receipt's "changed" variables are measured against. Built from the Host's own
        values, never from what the kernel sends."""
        return self._launch_env | {"HOST_KERNEL_TOKEN": cell.token,
                                   "HOST_KERNEL_GENERATION": str(cell.generation)}

    def _settle_commands(self, cell_id: str) -> str | None:
        """Kill host.bash commands of this cell still running, and wait for their receipts.

        The Host never returns from a cell while work it started for it runs on unnoticed.
        """
        with self._commands_lock:
            active = self._commands.pop(cell_id, [])
        killed = 0
        for proc, recorded in active:
            if not recorded.is_set() and proc.poll() is None:
                if kill_group(proc):
                    killed += 1
        for _, recorded in active:
            recorded.wait(timeout=10)
        if not killed:
            return None
        return (f"{killed} host.bash command(s) of this cell were still running when it ended; "
                f"the Host killed them and recorded their receipts.")

    def _text(self, cell_id: str, status: str, outputs: list[dict[str, Any]],
              notice: str | None, dropped: int) -> str:
        body = render_outputs(outputs)
        if dropped:
            body += f"\n[{dropped} further characters of output were not kept]\n"
        if not body.strip():
            body = "(no output)\n" if status in ("ok", "error") else ""
        body = cut(body, self.text_limit)
        head = cell_header(cell_id, self.mode.armed)
        tail = f"\n[{notice}]\n" if notice else ""
        return head + body + tail

    def _run(self, kernel: KernelGeneration, code: str, cell_id: str,
             timeout: float | None) -> _Run:
        """Send the cell and collect what it produced, until the kernel's ``idle`` for it.

        Reads the client's IOPub and shell sockets directly, in this thread: each
        message's signature is checked and only the parts this request needs are
        parsed (jupyter_client's blocking getters would add an event-loop turn and
        date parsing to every message).
        """
        kc = kernel.client
        assert kc is not None
        content = {"code": code, "silent": False, "store_history": True,
                   "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
        msg = kc.session.msg("execute_request", content, metadata={"cellId": cell_id})
        run = _Run(kc.session, msg["header"]["msg_id"])
        kc.shell_channel.send(msg)
        iopub = kc.iopub_channel.socket
        collector = _Outputs()
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        interrupted_at: float | None = None
        last_alive_check = now
        while True:
            try:
                now = time.monotonic()
                if deadline is not None and now >= deadline and interrupted_at is None:
                    run.status = "timeout"
                    kernel.interrupt()
                    interrupted_at = now
                if interrupted_at is not None and now - interrupted_at > INTERRUPT_GRACE:
                    run.stuck = True
                    break
                if now - last_alive_check >= LIVENESS_POLL:
                    last_alive_check = now
                    if not kernel.is_alive():
                        run.status = "kernel_died"
                        break
                wait = LIVENESS_POLL
                if deadline is not None and interrupted_at is None:
                    wait = max(0.0, min(wait, deadline - now))
                if not iopub.poll(int(wait * 1000) + 1):
                    continue
                reply = run.receive(iopub)
                if reply is None:
                    continue
                mtype = reply["msg_type"]
                if mtype == "status":
                    if reply["content"].get("execution_state") == "idle":
                        break
                elif mtype == "execute_input":
                    run.execution_count = _count(reply["content"].get("execution_count"))
                elif mtype in _Outputs.KINDS:
                    collector.add(reply)
            except KeyboardInterrupt:
                # Ctrl-C in the Host's own process: interrupt the cell as a timeout would,
                # keep collecting its outputs until the kernel is idle (at most
                # INTERRUPT_GRACE), and let execute() record it, then raise again. A second
                # Ctrl-C stops waiting for the kernel.
                if run.host_interrupted:
                    run.stuck = True
                    break
                run.host_interrupted = True
                run.status = "interrupted"
                kernel.interrupt()
                interrupted_at = time.monotonic()
        run.outputs = collector.final
        run.dropped_chars = collector.dropped
        if run.status != "kernel_died" and any(o["output_type"] == "error" for o in run.outputs):
            if run.status == "ok":
                run.status = "error"
        run.access = self._pending_access.pop(cell_id, None)
        if not run.stuck and run.status != "kernel_died":
            self._drain_shell(run, kc.shell_channel.socket)
        return run

    @staticmethod
    def _drain_shell(run: _Run, shell: Any) -> None:
        """Take the execute_reply off the shell socket so replies never pile up (it came
        before the ``idle``, so it is normally there already)."""
        deadline = time.monotonic() + 1.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not shell.poll(int(left * 1000) + 1):
                return
            if run.receive(shell, content=False) is not None:
                return

    # ------------------------------------------------------------------ the call channel

    def _dispatch(self, name: str, token: str | None, args: Any, emit: Emit) -> Any:
        running = self._running
        kernel = self._kernel
        generation = None if kernel is None else kernel.generation
        refusal: str | None = None
        code = "call_refused"
        if kernel is None or token is None or token != kernel.token:
            if token is not None and token in self._old_tokens:
                code, refusal = "stale_token", ("the call carries the token of an earlier kernel "
                                                "generation; it is refused")
            else:
                code, refusal = "bad_token", "the call carries no valid token for this kernel"
        elif running is None or running.token != token:
            code, refusal = "no_cell", ("no cell is running: the Host attributes every call to "
                                        "the cell it is executing, so calls from threads or "
                                        "timers that outlive their cell are refused")
        elif name not in self._calls:
            code, refusal = "unknown_call", (f"there is no host call named {name!r}; known: "
                                             f"{', '.join(sorted(self._calls))}")
        elif not isinstance(args, dict):
            raise BadArguments("call arguments must be a JSON object")
        if refusal is not None:
            # A bad or stale token says nothing about the running cell: record no cell for it.
            self._record_refusal(generation, None if code.endswith("token") else running,
                                 name, code, refusal)
            raise CallRefused(refusal, code=code)
        assert running is not None
        try:
            return self._calls[name](running, args, emit)
        except HostCallError as exc:
            self._record_refusal(generation, running, name, exc.code, exc.message)
            raise

    def _record_refusal(self, generation: int | None, running: _RunningCell | None, name: str,
                        code: str, reason: str) -> None:
        try:
            self._append("call_refused", {
                "generation": generation, "cell_id": None if running is None else running.cell_id,
                "call": name[:200], "code": code, "reason": reason,
            })
        except HostKernelError:
            pass  # the caller still gets the refusal; audit will show a missing ledger

    # -- who am I

    def _call_ping(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        return {"pong": True, "cell_id": cell.cell_id, "generation": cell.generation}

    def _call_whoami(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        return {"cell_id": cell.cell_id, "generation": cell.generation,
                "session": self.session_id, "workspace": str(self.workdir),
                "mode": {"name": self.mode.name, "armed": self.mode.armed,
                         "signals": list(self.mode.signals)},
                "confinement": None if self.confinement is None else {
                    "status": self.confinement.status, "abi": self.confinement.abi,
                    "network": self.confinement.network,
                    "pid_namespace": self.confinement.pid_namespace}}

    def _call_cell_access(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        # What the kernel's audit hook saw this cell open. The kernel reports it, so
        # it is lineage evidence, never acceptance evidence (docs/trust.md).
        self._pending_access[cell.cell_id] = args.get("access")
        return {"ok": True}

    # -- verification

    def _call_submit_output(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        return self.submit(Submission.from_dict(args), submitting_cell=cell.cell_id,
                           emit=emit).to_dict()

    def reproducer(self) -> Reproducer:
        """The session's reproducer (made on first use): the Host re-runs test evidence
        in a tree and sandbox of its own, never the workspace or the kernel's environment."""
        if self._reproducer is None:
            assert self._runtime_dir is not None and self._private_dir is not None
            assert self.blobs is not None
            # The tests re-run are the agent's code: kept from all the kernel is kept from.
            hidden: list[str | os.PathLike[str]] = [
                self.record_dir, self.workdir, self._private_dir / "tmp",
                *_llm_key_file(self.llm), *self._ledger_secrets(), *self.hide_paths]
            self._reproducer = Reproducer(
                self.blobs, hidden=hidden, overlay=self._private_dir / PRIVATE_DIRS["PIP_TARGET"],
                limits=self.reproduce_limits, confine=self._policy is not None,
                base=self._runtime_dir / "repro")
        return self._reproducer

    def submit(self, submission: Submission, *, submitting_cell: str | None = None,
               emit: Emit | None = None) -> Verdict:
        """Verify a submission against the record and record the verdict.

        Used by ``host.submit_output`` in a cell and by the agent loop's
        ``finalize_response``. The checks read a projection rebuilt from the
        hash-chained events, after the chain and this Host's own event hashes
        are confirmed, never the projection tables on disk.
        """
        self._require_open()
        assert self.ledger is not None and self.blobs is not None
        submission_id = mint_uuid()
        seen: dict[str, str | None] = {}
        try:
            json.dumps(submission.output)
        except (TypeError, ValueError, RecursionError) as exc:
            submission = dataclasses.replace(submission, output=None,
                                             output_error=f"{type(exc).__name__}: {exc}"[:300])
        try:
            trusted = self._trusted_projection()
            try:
                view = RecordView(trusted, self.blobs, self.session_id)
                submit_seq = max(self._appended) + 1
                verdict, seen = verify(submission, mode=self.mode, view=view,
                                       files=LiveFiles(self.workdir, self.record_dir),
                                       submission_id=submission_id, submit_seq=submit_seq,
                                       submitting_cell=submitting_cell,
                                       runs=self.reproducer(), emit=emit,
                                       network=self.network)
            finally:
                trusted.close()
        except RecordError as exc:
            verdict = unreadable_verdict(submission_id, self.mode, exc)
        self._append("submission_verdict", {
            "submission_id": submission_id, "cell_id": submitting_cell,
            "accepted": verdict.accepted, "verdict": verdict.to_dict(),
            "submission": self.redactor.deep(submission.to_dict()), "seen": seen,
        })
        self._verdicts.append((verdict, submitting_cell))
        return verdict

    def verdicts(self, start: int = 0) -> list[tuple[Verdict, str | None]]:
        """Every verdict this Host gave, in order, from the ``start``-th: each with the
        cell that submitted (None for a submission made outside a cell, such as the agent
        loop's ``finalize_response``).

        Held in the Host's memory as it recorded them, so a front that must say whether
        a submission was accepted (the agent loop, the MCP server) asks the Host, not a
        cell's output nor a table on disk.
        """
        return self._verdicts[start:]

    def verdicts_of(self, cell_id: str) -> tuple[Verdict, ...]:
        """The verdicts this Host gave to submissions made in ``cell_id``, in order."""
        return tuple(v for v, cell in self._verdicts if cell == cell_id)

    def _trusted_projection(self) -> SQLiteLedger:
        """Projections rebuilt from events whose chain and hashes this Host vouches for."""
        assert self.ledger is not None
        problems = check_chain(self.ledger, self.session_id)
        if problems:
            raise RecordError(f"the ledger's hash chain is broken ({problems[0]})")
        rows = self.ledger.query("SELECT seq, hash FROM events WHERE session = ?",
                                 (self.session_id,))
        on_disk = {r["seq"]: r["hash"] for r in rows}
        if on_disk != self._appended:
            raise RecordError("the ledger's events for this session are not the ones this Host "
                              "wrote (edited behind its back)")
        return rebuild(self.ledger, self.session_id)

    # -- files

    def _content(self, args: dict[str, Any], key: str) -> bytes:
        if key + "_b64" in args:
            raw = args[key + "_b64"]
            if not isinstance(raw, str):
                raise BadArguments(f"{key} must be str or bytes")
            try:
                return base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                raise BadArguments(f"{key}_b64 is not valid base64") from None
        value = args.get(key)
        if not isinstance(value, str):
            raise BadArguments(f"{key} must be str (UTF-8 text) or bytes, not "
                               f"{type(value).__name__}")
        return value.encode("utf-8", "surrogateescape")

    def _record_write(self, cell: _RunningCell, written: Any, op: str) -> dict[str, Any]:
        cell.io.writes.append(written.path)
        self._append("file_written", {"cell_id": cell.cell_id, "path": written.path,
                                      "sha256": written.sha256, "size": written.size, "op": op})
        return {"path": written.path, "sha256": written.sha256, "size": written.size}

    def _call_write_file(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        data = self._content(args, "content")
        written = self.workspace.write_bytes(args.get("path"), data)
        return self._record_write(cell, written, "write")

    def _call_edit_file(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        old, new = args.get("old"), args.get("new")
        if not isinstance(old, str) or not isinstance(new, str):
            raise BadArguments("edit_file(path, old, new): old and new must both be str")
        if not old:
            raise BadArguments("edit_file: old must be non-empty text that appears exactly once")
        path = args.get("path")
        rel, data = self.workspace.read_bytes(path)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise FileProblem(f"{rel} is not UTF-8 text; edit_file works on text files") from None
        count = text.count(old)
        if count != 1:
            where = "does not appear" if count == 0 else f"appears {count} times"
            raise FileProblem(f"edit_file: the text to replace {where} in {rel}; it must appear "
                              f"exactly once (nothing was changed)")
        written = self.workspace.write_bytes(path, text.replace(old, new, 1).encode("utf-8"))
        return self._record_write(cell, written, "edit")

    def _call_read_file(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        rel, data = self.workspace.read_bytes(args.get("path"))
        cell.io.reads.append(rel)
        if args.get("binary"):
            return {"path": rel, "content_b64": base64.b64encode(data).decode("ascii")}
        try:
            return {"path": rel, "content": data.decode("utf-8")}
        except UnicodeDecodeError:
            raise FileProblem(f"{rel} is not UTF-8 text; use host.read_file(path, binary=True)"
                              ) from None

    # -- commands

    def _call_bash(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        command, timeout, env = args.get("command"), args.get("timeout"), args.get("env")
        if not isinstance(command, str) or not command.strip():
            raise BadArguments("bash(command): command must be a non-empty str")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise BadArguments("bash: timeout must be a positive number of seconds or None")
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise BadArguments("bash: env must map str to str")
        cwd = self.workspace.cwd_for(args.get("cwd"))
        assert self.blobs is not None
        recorded = threading.Event()

        def started(proc: subprocess.Popen[bytes]) -> None:
            with self._commands_lock:
                self._commands.setdefault(cell.cell_id, []).append((proc, recorded))

        kernel = self._kernel
        spawner = None if kernel is None else kernel.sandbox
        ctx = CommandContext(cell.cell_id, cell.generation, self.workspace, self.blobs,
                             self._generation_env(cell), self.redactor, KERNEL_SET_ENV,
                             self._hash_cache, started, spawner, self._trace)
        try:
            body = self.redactor.deep(run_command(command, cwd, dict(env), timeout, ctx, emit))
            self._append("receipt_recorded", body)
            try:
                self.lineage.receipt(cell.cell_id, body)
            except Exception:  # noqa: BLE001 - lineage never blocks a receipt
                pass
        finally:
            recorded.set()
        return body

    # -- artifacts

    def _call_save_artifact(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        path, filename = args.get("path"), args.get("filename")
        if filename is not None and (not isinstance(filename, str) or not filename.strip()
                                     or "/" in filename or "\x00" in filename):
            raise BadArguments("save_artifact: filename must be a plain file name (no '/')")
        assert self.blobs is not None
        # Opened once, beneath the root without following symlinks, checked to be a
        # regular file; the bytes stored and hashed are those of that open file.
        rel, src = self.workspace.open_file(path)
        with src:
            ref = self.blobs.put_stream(src)
        name = filename or PurePosixPath(rel).name
        media = mimetypes.guess_type(name)[0] or "application/octet-stream"
        artifact_id = mint_uuid()
        body = {"artifact_id": artifact_id, "filename": name, "sha256": ref.sha256,
                "size": ref.size, "media_type": media, "cell_id": cell.cell_id,
                "generation": cell.generation, "source_path": rel,
                "lineage": self._lineage_for(cell, rel, self._access_so_far(cell, args))}
        self._append("artifact_saved", body)
        self.lineage.artifact_saved(artifact_id, ref.sha256, ref.size)
        return Artifact.from_dict(body).to_dict()

    def _access_so_far(self, cell: _RunningCell, args: dict[str, Any]) -> tuple[Any, str]:
        """The running cell's accesses up to now, and how they were found: traced by the
        Host when it can, otherwise as the kernel's audit hook reports them."""
        trace = self._trace
        if trace is not None:
            try:
                seen = trace.for_cell(cell.start_ns, None, consume=False,
                                      since_wall_ns=cell.start_wall_ns)
                return seen.access(), TRACED
            except SandboxError:
                pass
        return args.get("access"), OBSERVED

    def _lineage_for(self, cell: _RunningCell, rel: str, access: tuple[Any, str]
                     ) -> dict[str, Any]:
        try:
            lineage = self.lineage.inputs_at_save(cell.cell_id, cell.code, rel, access[0],
                                                  cell.io, method=access[1])
        except Exception as exc:  # noqa: BLE001 - an artifact is saved even if lineage fails
            return {"inputs": [], "truncated": False, "error": f"{type(exc).__name__}: {exc}"}
        if self.llm is not None and lineage["inputs"]:
            lineage = confirm_with_llm(self.llm, cell.code, lineage)
        return lineage

    def _call_lineage(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        artifact_id = args.get("artifact_id")
        if not isinstance(artifact_id, str):
            raise BadArguments("lineage(artifact_id): artifact_id must be a str (the UUID)")
        assert self.ledger is not None
        return build_lineage(self.ledger, artifact_id, session=self.session_id).to_dict()

    def _artifact_row(self, artifact_id: object) -> Any:
        if not isinstance(artifact_id, str):
            raise BadArguments("artifact_id must be a str (the artifact's UUID)")
        rows = self.own_rows("SELECT * FROM artifacts WHERE artifact_id = ? AND session = ?",
                             (artifact_id, self.session_id))
        if not rows:
            raise FileProblem(f"no artifact {artifact_id!r} in this session; host.artifacts() "
                              f"lists them")
        return rows[0]

    def own_rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Rows of this session's projection as the Host can vouch for them: read from the
        ledger file on SQLite (in the record folder, which the kernel cannot reach); on
        PostgreSQL, a database other writers may reach, from this session's events
        replayed and checked against what this Host wrote (:meth:`_trusted_projection`)."""
        assert self.ledger is not None
        if not isinstance(self.ledger, PostgresLedger):
            return list(self.ledger.query(sql, params))
        with self._trusted_projection() as trusted:
            return list(trusted.query(sql, params))

    def _call_load_artifact(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        artifact_id = args.get("artifact_id")
        try:
            row = self._artifact_row(artifact_id)
        except FileProblem:  # not this session's own: one a collected sub-task made?
            row = _subtasks.collected_artifact(self, str(artifact_id))
            if row is None:
                raise
        target = args.get("path") or row["filename"]
        assert self.blobs is not None
        try:
            data = self.blobs.read(row["sha256"])  # read once, and only if it hashes right
        except StorageError as exc:
            raise FileProblem(f"artifact {row['artifact_id']}'s stored bytes no longer match "
                              f"its sha256; the store was altered ({exc.message})",
                              code=exc.code) from None
        written = self.workspace.write_bytes(target, data)
        cell.io.loads.append((row["artifact_id"], written.path, row["sha256"]))
        self._append("artifact_loaded", {"cell_id": cell.cell_id,
                                         "artifact_id": row["artifact_id"], "path": written.path})
        self._append("file_written", {"cell_id": cell.cell_id, "path": written.path,
                                      "sha256": written.sha256, "size": written.size,
                                      "op": "load_artifact"})
        return {"path": written.path, "sha256": written.sha256, "size": written.size}

    def _call_artifacts(self, cell: _RunningCell, args: dict[str, Any], emit: Emit) -> Any:
        rows = self.own_rows("SELECT * FROM artifacts WHERE session = ? ORDER BY seq",
                             (self.session_id,))
        return [Artifact(r["artifact_id"], r["filename"], r["sha256"], r["size"],
                         r["media_type"], r["cell_id"], r["generation"],
                         r["source_path"]).to_dict() for r in rows]



def _count(value: object) -> int | None:
    """A kernel's execution count as the record keeps it: a whole number that fits a
    64-bit column, or None (the kernel says what it likes; every backend stores this)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return None


#: libpq's environment: where the database is, and the credentials that open it. With a
#: PostgreSQL ledger none of it reaches the kernel (docs/trust.md).
_PG_ENV = frozenset({"PGPASSWORD", "PGPASSFILE", "PGSERVICE", "PGSERVICEFILE", "PGSSLKEY",
                     "PGSSLCERT", "PGSSLROOTCERT", "PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER",
                     "PGDATABASE"})


#: An object store's credentials and where to find them. With ``blobs=`` none of it
#: reaches the kernel: it could otherwise delete or overwrite the record's blobs.
_BLOB_ENV = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                       "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE",
                       "AWS_CONFIG_FILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                       "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
                       "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_CONNECTION_STRING",
                       "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY",
                       "AZURE_STORAGE_SAS_TOKEN"})


def _llm_key_names(llm: Any) -> frozenset[str]:
    """The environment variable holding the Host's LLM key: the Host's secret, not the kernel's."""
    config = getattr(llm, "config", None)
    name = getattr(config, "api_key_env", None)
    return frozenset({name}) if isinstance(name, str) and name else frozenset()


def _llm_key_file(llm: Any) -> list[str]:
    """The file holding the Host's LLM key, which confined code must not read."""
    path = getattr(getattr(llm, "config", None), "api_key_file", None)
    return [path] if isinstance(path, str) and path else []


def _bundle_of(data: Any) -> dict[str, Any] | None:
    """A mime bundle as nbformat holds one, or None when ``data`` is not a mapping: each
    value a string (a list of strings joined), JSON kept only under a ``json`` media
    type; entries of any other shape are left out (a kernel can send anything)."""
    if not isinstance(data, dict):
        return None
    bundle: dict[str, Any] = {}
    for mime, value in data.items():
        if not isinstance(mime, str):
            continue
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = "".join(value)
        if isinstance(value, str) or mime.split(";")[0].endswith("json"):
            bundle[mime] = value
    return bundle


def _scrubbed(value: Any) -> Any:
    """``value`` with every string made encodable as UTF-8 (lone surrogates become U+FFFD)."""
    if isinstance(value, str):  # a paired surrogate is one character again, a lone one U+FFFD
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {_scrubbed(k): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrubbed(v) for v in value]
    return value


def _join(first: str | None, second: str) -> str:
    return second if first is None else f"{first} {second}"


class _Run:
    """What one execute_request produced, while it is being collected; and the reader of
    its replies.

    :meth:`receive` takes one message off a kernel socket and returns it only when it
    answers this request and carries a valid signature (the Session's key; a replayed
    signature counts as invalid). It parses the parent header, then the header and
    content of those it keeps, and nothing of the others; dates stay strings.
    """

    def __init__(self, session: Any, msg_id: str) -> None:
        self.status: Status = "ok"
        self.stuck = False
        #: Ctrl-C reached the Host while the cell ran: recorded, then raised again.
        self.host_interrupted = False
        self.execution_count: int | None = None
        self.outputs: list[dict[str, Any]] = []
        self.dropped_chars = 0
        self.access: Any = None
        self._session = session
        self._msg_id = msg_id
        self._signatures: set[bytes] = set()

    def receive(self, socket: Any, *, content: bool = True) -> dict[str, Any] | None:
        """The next message on ``socket`` (which has one ready) if it is for this request:
        ``{"msg_type", "header", "parent_header", "content"}``; else None."""
        try:
            _, parts = self._session.feed_identities(socket.recv_multipart())
            if len(parts) < 5:
                return None
            parent = json.loads(parts[2])
            if not isinstance(parent, dict) or parent.get("msg_id") != self._msg_id:
                return None
            signature = parts[0]
            if self._session.auth is not None:
                if (signature in self._signatures or not hmac.compare_digest(
                        signature, self._session.sign(parts[1:5]))):
                    return None
                self._signatures.add(signature)
            header = json.loads(parts[1])
            body = json.loads(parts[4].decode("utf-8", "replace")) if content else {}
        except ValueError:  # no delimiter, or not JSON: nothing the kernel sent us
            return None
        if not isinstance(header, dict) or not isinstance(body, dict):
            return None
        return {"msg_type": header.get("msg_type"), "header": header, "parent_header": parent,
                "content": body}


class _Outputs:
    """Fold IOPub messages into nbformat v4 outputs, as a notebook frontend would.

    Consecutive stream text of one name is kept as pieces and joined once, when
    :attr:`final` is read, so a cell printing many small chunks costs linear time.
    Outputs already handed out by :attr:`final` are never changed afterwards.
    """

    #: The IOPub message types that make or change outputs.
    KINDS = frozenset({"stream", "display_data", "execute_result", "error", "clear_output",
                       "update_display_data"})

    def __init__(self) -> None:
        self.outputs: list[dict[str, Any]] = []
        #: The display id of each output (None for most), beside ``outputs``.
        self._display_ids: list[str | None] = []
        #: The last output's stream text, in pieces, while more may follow.
        self._pieces: list[str] | None = None
        self.kept_chars = 0
        self.dropped = 0
        self._clear_pending = False

    def _clear(self) -> None:
        self.outputs.clear()
        self._display_ids.clear()
        self._pieces = None

    def _seal(self) -> None:
        if self._pieces is not None:
            self.outputs[-1]["text"] = "".join(self._pieces)
            self._pieces = None

    def add(self, msg: dict[str, Any]) -> None:
        mtype = msg["msg_type"]
        content = msg["content"]
        if mtype == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
            else:
                self._clear()
            return
        if mtype == "update_display_data":
            display_id = (content.get("transient") or {}).get("display_id")
            if display_id is None:
                return
            data = _bundle_of(content.get("data"))
            metadata = content.get("metadata")
            if data is None:
                return  # not a mime bundle (the kernel is not trusted): not kept
            self._seal()
            for i, shown in enumerate(self._display_ids):
                if shown == display_id:
                    self.outputs[i] = {**self.outputs[i], "data": data,
                                       "metadata": metadata if isinstance(metadata, dict)
                                       else {}}
            return
        if self._clear_pending:
            self._clear()
            self._clear_pending = False
        if mtype == "stream":
            text = content.get("text", "")
            name = content.get("name")
            if not isinstance(text, str) or not isinstance(name, str):
                return
            room = RECORD_OUTPUT_LIMIT - self.kept_chars
            if len(text) > room:
                self.dropped += len(text) - max(room, 0)
                text = text[:max(room, 0)]
                if not text:
                    return
            self.kept_chars += len(text)
            last = self.outputs[-1] if self.outputs else None
            if last is not None and last["output_type"] == "stream" and last["name"] == name:
                if self._pieces is None:  # sealed (handed out): go on in a copy
                    self.outputs[-1] = {**last}
                    self._pieces = [last["text"]]
                self._pieces.append(text)
                return
            self._seal()
            self.outputs.append({"output_type": "stream", "name": name, "text": text})
            self._display_ids.append(None)
            self._pieces = [text]
            return
        try:
            out = dict(nbformat.v4.output_from_msg(msg))
        except (KeyError, TypeError, ValueError, nbformat.ValidationError):
            return  # not an output nbformat can hold (the kernel is not trusted): not kept
        if "data" in out:
            data = _bundle_of(out["data"])
            if data is None:
                return
            out["data"] = data
        self._seal()
        self.outputs.append(out)
        display_id = (content.get("transient") or {}).get("display_id")
        self._display_ids.append(display_id if isinstance(display_id, str) else None)

    @property
    def final(self) -> list[dict[str, Any]]:
        self._seal()
        return list(self.outputs)
