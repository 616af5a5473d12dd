"""The Host: a trusted controller for one ipykernel and its record, as one facade.

Owns construction (the options record, the parts), the public methods and
attributes a front uses, and the lifecycle (unopened → open → closed). The work
is done by parts that each own one job:

- ``_options``: the typed, validated options (:class:`HostOptions`);
- ``_record``: the session's ledger and blob store, appends and the head;
- ``_session``: the session's identity, start, take-up and abandoned sessions;
- ``_generations``: how each kernel is launched, warm or cold, and restarted;
- ``_cells``: ``execute``, the run loop, outputs and the Observation;
- ``_calls`` and ``_handlers``: the call channel and each host call;
- ``_submissions``: verification and verdicts.
"""

from __future__ import annotations

import enum
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ConfinementError, HostKernelError, KernelError
from .._ids import mint_uuid
from .._paths import default_record_dir
from ..modes import TaskMode, resolve_task_mode
from ..sandbox.client import Confinement, probe
from ..store.blobs import FileBlobStore
from ..store.ledger import SQLiteLedger
from ._bash import Redactor
from ._calls import CallContext, Dispatcher
from ._cells import CellRunner
from ._generations import Generations, inside
from ._handlers import HANDLERS
from ._lineage import SessionLineage, read_source
from ._options import HostOptions
from ._record import SessionRecord
from ._rederive import Rederivation, in_own_thread, rederive
from ._server import CallServer, Emit
from ._session import Launch, Session
from ._submissions import Submissions
from ._workspace import HashCache, Workspace

if TYPE_CHECKING:  # in signatures only: verification and PostgreSQL are not the start's
    from .._models import Observation, Verdict
    from ..reproduce import Reproducer
    from ..store.pg import PostgresLedger
    from ..verify import Submission

__all__ = ["Host", "HostState"]


class HostState(enum.Enum):
    UNOPENED = "unopened"  # constructed; no kernel, no record yet
    OPEN = "open"          # a kernel generation is running and cells may execute
    CLOSED = "closed"      # kernel stopped, socket removed, ledger closed; terminal


class Host:
    """A trusted controller for one ipykernel and its record.

    ``Host(workdir, mode=None, request=None, record_dir=None, **options)``: ``mode``
    arms a task mode; without it, ``request`` (the task text) is classified and the
    mode is only detected. Every other keyword is a field of :class:`HostOptions`
    (or pass ``options=HostOptions(...)``, with keywords on top). Use as a context
    manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(self, workdir: str | os.PathLike[str], mode: str | None = None,
                 request: str | None = None, record_dir: str | os.PathLike[str] | None = None,
                 *, options: HostOptions | None = None, **changes: Any) -> None:
        root = Path(workdir)
        if not root.is_dir():
            raise KernelError(f"workdir {workdir} is not a directory")
        self.workdir = Path(os.path.realpath(root))
        self.record_dir = Path(os.path.realpath(record_dir or default_record_dir(self.workdir)))
        self.options = opts = HostOptions.build(options, changes)
        self.state = HostState.UNOPENED
        self.workspace = Workspace(self.workdir, self.record_dir)
        self.redactor = Redactor(opts.secret_names)
        hashes: HashCache = {}
        self.lineage = SessionLineage(self.workspace, hashes,
                                      source_of=functools.partial(read_source, self.workspace))
        self.record = SessionRecord(self.record_dir, opts.resume or mint_uuid(), opts)
        self.session = Session(self.record, self.workdir, resolve_task_mode(request, mode),
                               request, opts.baseline)
        self.generations = Generations(self.workdir, opts, self.workspace, self.record.append,
                                       self.lineage.new_generation)
        self.cells = CellRunner(self.record, self.session, self.generations, self.lineage,
                                self.redactor, opts.text_limit)
        self.submissions = Submissions(self.workdir, opts, self.record, self.session,
                                       self.generations, self.redactor)
        self.calls = Dispatcher(CallContext(
            self.workdir, self.record_dir, opts, self.record, self.session, self.generations,
            self.cells, self.workspace, self.lineage, self.redactor, hashes,
            self.submissions.submit, opts.skills), HANDLERS)
        self.submissions.rederiver = self._rederive_for_submission
        self._server: CallServer | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Host:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Host:
        """Open the record, start the call server and the first kernel generation."""
        if self.state is not HostState.UNOPENED:
            raise KernelError(f"the Host is {self.state.value}; it can be started once")
        opts = self.options
        confinement = probe(None, network=opts.network)
        if not confinement.active and opts.require_confinement:
            raise ConfinementError(f"confinement is required but not available: "
                                   f"{confinement.reason}")
        if confinement.active and inside(self.record_dir, self.workdir):
            raise ConfinementError(
                f"the record folder {self.record_dir} is inside the workspace {self.workdir}; "
                f"confined code may write anywhere in the workspace, so the record must live "
                f"outside it (leave record_dir unset for {default_record_dir(self.workdir)})")
        self.record_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.record_dir, 0o700)
        if self._orders_first():
            self._start_orders_first(confinement)
            return self
        self.record.open()
        shared = self.record.local_blob_folder()
        if confinement.active and shared is not None and (
                inside(shared, self.workdir) or inside(self.workdir, shared)):
            self.record.close()
            raise ConfinementError(
                f"the blob store's folder {shared} and the workspace {self.workdir} overlap; "
                f"confined code may read and write anywhere in the workspace, and the store "
                f"holds other sessions' artifacts, so it must live outside it")
        self.record.blobs.sweep()
        try:
            self._prepare(confinement)
            self._begin_session()
        except BaseException:
            self._teardown()
            raise
        self.state = HostState.OPEN
        return self

    def _orders_first(self) -> bool:
        """Whether the first kernel can have its orders before the record is opened: the
        launch's policy and the start's survey need nothing of the record when the ledger
        is the record folder's SQLite file, the blobs its own store, the session new and
        not an armed ``codebase_change`` (whose baseline is read into the record). Then the
        record opens while the kernel initialises, not before (:meth:`_start_orders_first`).
        A class that starts a session otherwise (its own :meth:`_begin_session`) says
        itself when it may (the relay's RelayHost: a session it does not continue)."""
        return (type(self)._begin_session is Host._begin_session
                and self._record_not_needed_to_start())

    def _record_not_needed_to_start(self) -> bool:
        opts = self.options
        mode = self.session.mode
        return (opts.ledger is None and opts.blobs is None and opts.resume is None
                and not (mode.enforced and mode.name == "codebase_change"))

    def _start_orders_first(self, confinement: Confinement) -> None:
        """:meth:`start` for :meth:`_orders_first`: the launch prepared, the workspace
        surveyed and the standby (if any) handed its orders, then the record opened and
        the session's start recorded while the kernel initialises; the call server starts
        only after that, as always."""
        def open_record() -> None:
            self.record.open()
            self.record.blobs.sweep()

        try:
            self._prepare(confinement)
            self._new_session(open_record)
        except BaseException:
            self._teardown()
            raise
        self.state = HostState.OPEN

    def _prepare(self, confinement: Confinement) -> None:
        """How the session's kernels launch: the files they may not read, the policy, the
        environment (learnt by the redactor)."""
        hidden = [str(self.record_dir), *self.record.secret_files(), *self.options.hide_paths]
        self.generations.prepare(confinement, hidden, self.session_id, self._socket_path,
                                 self._listen)
        self.redactor.learn(self.generations.launch_env)

    def _socket_path(self, runtime_dir: Path) -> str:
        return str(runtime_dir / "host.sock")

    def _listen(self) -> None:
        """Start the call server (the generations do, before their first kernel)."""
        runtime_dir = self.generations.runtime_dir
        if self._server is None and runtime_dir is not None:
            self._server = CallServer(self._socket_path(runtime_dir), self.calls,
                                      refusals=self.cells.refusals)

    def _launch(self) -> Launch:
        confinement = self.generations.confinement
        return Launch(self.options.front, None if confinement is None else confinement.to_dict(),
                      sorted(self.generations.launch_env))

    def _begin_session(self) -> None:
        """Record the session's start (or take up ``resume``) and start its first kernel
        generation. The relay front overrides this to continue a session across its own
        restart (host_kernel/host/_relay_support.py)."""
        if self.options.resume is not None:
            self.generations.prior = self.session.take_up(self.options.resume, self._launch())
            self.generations.start("resume")
            return
        self._new_session()

    def _new_session(self, open_record: Callable[[], None] | None = None) -> None:
        """What the start reads of the workspace is read first; then a standby gets its
        orders and starts while the record is opened (``open_record``, when it is not open
        yet) and the start recorded; the call server starts after (generations.start)."""
        survey = self.session.survey()
        self.generations.hand_orders()
        if open_record is not None:
            open_record()
        self.session.begin(self._launch(), survey)
        self.generations.start("start")

    def close(self) -> str | None:
        """Stop the kernel, the call server and the ledger. Safe to call twice.

        Returns the chain's head as this Host last wrote it (:attr:`head`).
        """
        if self.state is HostState.CLOSED:
            return self.head
        if self.options.delegator is not None:
            # Sub-tasks end with the session that started them (each closes its record).
            self.options.delegator.shutdown()
        if self.state is HostState.OPEN and self.ledger is not None:
            self.cells.refusals.flush()  # counts of refusals since the last cell ended
            try:
                self.record.append("session_ended", {"generation": self.generation})
            except HostKernelError:
                pass
        self._teardown()
        self.state = HostState.CLOSED
        return self.head

    def _teardown(self) -> None:
        self.generations.teardown()
        if self._server is not None:
            self._server.close()
            self._server = None
        self.generations.remove_runtime()
        self.generations.closed = True
        self.record.close()

    def _require_open(self) -> None:
        if self.state is not HostState.OPEN:
            raise KernelError(f"the Host is {self.state.value}; use it inside `with Host(...)`"
                              " or call start() first")

    # ------------------------------------------------------------------ what a front reads

    @property
    def session_id(self) -> str:
        return self.record.session_id

    @property
    def mode(self) -> TaskMode:
        """The session's task mode: armed, detected, or the default."""
        return self.session.mode

    @property
    def request(self) -> str | None:
        return self.session.request

    @property
    def ledger(self) -> SQLiteLedger | PostgresLedger | None:
        return self.record.opened[0]

    @property
    def blobs(self) -> FileBlobStore | None:
        return self.record.opened[1]

    @property
    def ledger_url(self) -> str | None:
        """The PostgreSQL ledger's URL (docs/scale.md); None: SQLite in the record folder."""
        return self.options.ledger

    @property
    def delegator(self) -> Any:
        return self.options.delegator

    @property
    def confinement(self) -> Confinement | None:
        """What the record says about confinement; decided at start()."""
        return self.generations.confinement

    @property
    def tracing(self) -> dict[str, Any]:
        """What the record says about tracing: {"status": "seccomp"} or why not."""
        return self.generations.tracing

    @property
    def generation(self) -> int:
        return self.generations.generation

    @property
    def kernel_pid(self) -> int | None:
        """The pid of the process jupyter_client started for this generation: the kernel
        itself when unconfined; confined, the sandbox's launcher, which leads the
        kernel's process group (signal the group to reach the kernel) and exits with it."""
        kernel = self.generations.kernel
        return None if kernel is None else kernel.pid

    @property
    def head(self) -> str | None:
        """The hash of the last event this Host wrote or verified: an anchor to keep
        elsewhere and hand to ``host-kernel audit --expect-head``."""
        return self.record.head

    # ------------------------------------------------------------------ what a front does

    def execute(self, code: str, timeout: float | None = None, *,
                frontend_cell_id: str | None = None) -> Observation:
        """Run one cell in the kernel and return what the Host saw."""
        self._require_open()
        return self.cells.execute(code, timeout, frontend_cell_id=frontend_cell_id)

    def restart(self, reason: str = "requested") -> int:
        """Start a fresh kernel: a new generation with a new token. Returns its number."""
        self._require_open()
        with self.cells.exec_lock:
            self.generations.start(reason)
        return self.generation

    def submit(self, submission: Submission, *, submitting_cell: str | None = None,
               emit: Emit | None = None) -> Verdict:
        """Verify a submission against the record and record the verdict.

        Used by ``host.submit_output`` in a cell and by the agent loop's
        ``finalize_response``. The checks read a projection rebuilt from the
        hash-chained events, after the chain and this Host's own event hashes
        are confirmed, never the projection tables on disk.
        """
        self._require_open()
        return self.submissions.submit(submission, submitting_cell=submitting_cell, emit=emit)

    def verdicts(self, start: int = 0) -> list[tuple[Verdict, str | None]]:
        """Every verdict this Host gave, in order, from the ``start``-th: each with the
        cell that submitted (None for a submission made outside a cell, such as the agent
        loop's ``finalize_response``).

        Held in the Host's memory as it recorded them, so a front that must say whether
        a submission was accepted (the agent loop, the MCP server) asks the Host, not a
        cell's output nor a table on disk.
        """
        return self.submissions.verdicts(start)

    def verdicts_of(self, cell_id: str) -> tuple[Verdict, ...]:
        """The verdicts this Host gave to submissions made in ``cell_id``, in order."""
        return self.submissions.verdicts_of(cell_id)

    def reproducer(self) -> Reproducer:
        """The session's reproducer (made on first use)."""
        return self.submissions.reproducer()

    def own_rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Rows of this session's projection as the Host can vouch for them."""
        return self.record.own_rows(sql, params)

    def rederive(self, artifact_id: str, *, minimal: bool = False,
                 tolerance: float | None = None, timeout: float | None = 600,
                 progress: Callable[[str], None] | None = None) -> Rederivation:
        """Run the artifact's slice in a fresh confined kernel over a fresh workspace that
        holds only its recorded input bytes, and compare what it writes with the artifact
        (docs/lineage.md, "Re-derivation"). The outcome is recorded in this session's record
        (``artifact_rederived``)."""
        self._require_open()
        trusted = self.record.trusted_projection()  # this session's events, as written
        try:
            result = rederive(trusted, self.record.blobs, artifact_id, fresh_host,
                              minimal=minimal, tolerance=tolerance, timeout=timeout,
                              progress=progress, hide=self._first_run())
        finally:
            trusted.close()
        self.record.append("artifact_rederived", result.record_body())
        return result


    def _first_run(self) -> list[str | Path]:
        """Where this session's kernel keeps state a re-derivation must not see."""
        private = self.generations.private_dir
        return [self.workdir, self.record_dir, *([private] if private is not None else [])]

    def _rederive_for_submission(self, artifact_id: str,
                                 progress: Callable[[str], None]) -> Rederivation:
        """``submit_output(rederive=True)``: the verdict records the outcome itself."""
        def run() -> Rederivation:
            trusted = self.record.trusted_projection()
            try:
                return rederive(trusted, self.record.blobs, artifact_id, fresh_host,
                                progress=progress, hide=self._first_run())
            finally:
                trusted.close()

        result: Rederivation = in_own_thread(run)
        return result


def fresh_host(workspace: Path, record: Path, hide: tuple[str, ...] = ()) -> Host:
    """The Host a re-derivation runs a slice in: defaults, its own record, and confined or
    not at all: unconfined, the session's code could read the bytes it is meant to remake
    from wherever the first run left them (and a reviewer's machine would run it bare)."""
    return Host(workspace, record_dir=record, require_confinement=True, hide_paths=hide)
