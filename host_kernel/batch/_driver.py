"""The driver: submitting a batch's tasks to a Dask cluster and accounting for them.

Owns :func:`run_batch` (check the tasks, make the settings, skip the tasks an earlier
batch or attempt had accepted, register each worker's pool, submit, report each summary
as its task finishes, resubmit a task lost before it started or whose Host found a store
unavailable, account for tasks lost with their workers), :func:`local_cluster` and the
choice of cluster. Dask is imported here only when a batch runs. It does not own what a
worker does with a task (:mod:`._worker`) or the command line (:mod:`.commands`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _ledger
from ._errors import BatchError, SchedulerUnreachable, TaskInvalid, TaskNotStarted
from ._status import _read_json
from ._summary import BatchResult, TaskSummary
from ._tasks import Task, _checked, keep_tasks
from ._worker import (
    MARKER,
    Settings,
    _a_batch,
    _hidden_env,
    _mark,
    _redact,
    notebook_cells,
    run_task,
)

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["DEFAULT_RETRIES", "MAX_REQUEUES", "local_cluster", "run_batch"]

#: Reruns of a task whose worker died, by default.
DEFAULT_RETRIES = 2
#: Times a task that died queued on a worker before it started, or whose Host found a
#: store unavailable, is submitted again (without spending an attempt).
MAX_REQUEUES = 3


def _distributed() -> Any:
    import distributed  # its functions are untyped

    return distributed


@contextlib.contextmanager
def _client(scheduler: Any, workers: int, retries: int, timeout: float) -> Iterator[Any]:
    """The client of the cluster to run on: ``scheduler`` itself (a Client, left open), a
    client of the scheduler at that address, or a LocalCluster of ``workers`` processes
    made here (closed at the end)."""
    dist = _distributed()
    if isinstance(scheduler, dist.Client):
        yield scheduler
        return
    if scheduler is not None:
        try:
            client = dist.Client(str(scheduler), timeout=timeout)
        except TypeError as exc:  # a tls:// address without Dask's TLS configuration
            raise SchedulerUnreachable(
                f"the scheduler at {scheduler} speaks TLS, and no client certificate is "
                f"configured (Dask's distributed.comm.tls.* settings): {exc}") from None
        except (OSError, TimeoutError, ValueError) as exc:
            raise SchedulerUnreachable(f"no Dask scheduler answered at {scheduler}: "
                                       f"{exc}") from None
        with client:
            yield client
        return
    with tempfile.TemporaryDirectory(prefix="hk-dask-") as scratch, \
            local_cluster(workers, retries=retries, local_directory=scratch) as cluster, \
            dist.Client(cluster) as client:
        yield client


def local_cluster(workers: int = 2, *, retries: int = DEFAULT_RETRIES, **kwargs: Any) -> Any:
    """A Dask LocalCluster made as :func:`run_batch` makes its own: ``workers`` processes of
    one thread each, no dashboard, the scheduler's HTTP endpoint on 127.0.0.1 at a free
    port (never 0.0.0.0:8787), Dask's logs silenced below CRITICAL (the batch reports
    what happens itself), each worker sent only the task it runs, and a task whose worker
    died given to another worker at most ``retries`` times. ``kwargs`` go to LocalCluster
    (``env=`` for the workers' environment). For several batches on one cluster: ``with
    local_cluster() as cluster, Client(cluster) as client: run_batch(tasks,
    scheduler=client)``.

    The scheduler's and the workers' scratch folders (Dask's ``dask-scratch-space``) are
    made in ``local_directory`` (default: a temporary folder of its own, removed once the
    cluster is gone), never left in ``$TMPDIR``."""
    import dask

    scratch = kwargs.pop("local_directory", None)
    if scratch is None:
        scratch = tempfile.mkdtemp(prefix="hk-dask-")
        owned = True
    else:
        owned = False

    # Mutual TLS with certificates made for this cluster and held in memory: a kernel on
    # this machine can reach the scheduler's and the workers' ports on loopback, and a
    # Dask client runs any code on the workers, outside every kernel's confinement.
    options: dict[str, Any] = {
        "n_workers": workers, "threads_per_worker": 1, "processes": True,
        "dashboard_address": None, "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"},
        "silence_logs": logging.CRITICAL, "security": _distributed().Security.temporary(),
        **kwargs}
    # Read when the scheduler starts. A worker is sent only the task it runs (saturation
    # 1.0, one thread): none waits queued on a worker, to be lost with it when it dies.
    with dask.config.set({"distributed.scheduler.allowed-failures": retries,
                          "distributed.scheduler.worker-saturation": 1.0,
                          "temporary-directory": str(scratch)}):
        cluster = _cluster_class()(local_directory=str(scratch), **options)
    if owned:
        cluster.scratch = scratch
        weakref.finalize(cluster, shutil.rmtree, scratch, True)  # if it is never closed
    return cluster


@functools.cache
def _cluster_class() -> Any:
    """distributed's LocalCluster, which removes its own scratch folder (``scratch``, when
    :func:`local_cluster` made one) once closed. Made on first use: it imports Dask."""

    class ScratchCluster(_distributed().LocalCluster):  # type: ignore[misc]
        scratch: str | None = None

        def close(self, timeout: float | None = None) -> Any:
            try:
                return super().close(timeout)
            finally:
                if self.scratch is not None and not self.asynchronous:
                    shutil.rmtree(self.scratch, ignore_errors=True)

    return ScratchCluster


def _check_roots(tasks: list[Task], root: Path, records: Path | None,
                 resume: bool = False) -> None:
    """Refuse, before anything is made, workspaces and records folders a batch cannot use:
    a file, one folder for both, a task's folder there already (unless ``resume``: then
    it must be a batch's workspaces folder), or a folder a task copies whole into its
    workspace (it would copy the batch's own folders, its record folders or workspaces,
    into itself)."""
    for what, folder in (("workspaces", root), ("records", records)):
        if folder is not None and folder.exists() and not folder.is_dir():
            raise BatchError(f"the {what} folder {folder} is a file")
        if folder is not None and os.path.realpath(folder) == os.path.realpath(folder.anchor):
            # Each task's kernel is kept from the other tasks' folders; not from all of /.
            raise BatchError(f"the {what} folder cannot be the file system's root")
    if records == root:
        raise BatchError(f"the records folder is the workspaces folder {root}: a task's "
                         f"record would be its own workspace, which its kernel writes")
    if resume and not _a_batch(str(root)):
        raise BatchError(f"{root} is not the workspaces folder of a batch; resume= continues "
                         f"a batch in the folder it ran in")
    taken = [] if resume else [t.name for t in tasks if (root / t.name).exists()]
    if taken:
        raise TaskInvalid(f"{root} holds workspaces of an earlier batch already (task "
                          f"{taken[0]}{' and others' if len(taken) > 1 else ''}); give a "
                          f"new folder")
    roots = {str(root): "workspaces", **({str(records): "records"} if records else {})}
    for task in tasks:
        copied = task.inputs or ((str(Path(task.source).resolve().parent),)
                                 if task.kind == "notebook" else ())
        for source in copied:
            role = roots.get(os.path.realpath(source))
            if role is not None:
                raise TaskInvalid(f"task {task.name} copies {source} into its workspace, and "
                                  f"that is the batch's {role} folder; give the batch a "
                                  f"{role} folder of its own")


def _killed(future: Any) -> bool:
    """Whether the task's future failed because its worker died (not the task itself)."""
    from distributed.scheduler import KilledWorker

    return isinstance(future.exception(), KilledWorker)


def _never_started(task: Task, workspaces: Path) -> bool:
    """Whether no attempt of ``task`` claimed a workspace (as far as this machine sees)."""
    return not any((workspaces / task.name).glob("attempt-*"))


def _numbers(task: Task) -> list[int] | None:
    """The cell numbers of the code cells a notebook task runs (None for an agent task)."""
    return [n for n, _ in notebook_cells(Path(task.source))] if task.kind == "notebook" \
        else None


def _earlier(task: Task, settings: Settings, *, by_records: bool,
             pg: dict[str, list[str]] | None = None
             ) -> tuple[_ledger.Word, _ledger.Earlier] | None:
    """An earlier session of ``task`` its record shows accepted, and its attempt: among
    the attempts this batch's workspaces hold (by their status files; this batch's own
    finished ones left out unless ``by_records``) and, ``by_records``, in its record
    folders."""
    return _ledger.accepted_earlier(
        task, workspaces=settings.workspaces, records=settings.records,
        ledger=settings.ledger, key=settings.ledger_key, numbers=_numbers(task),
        skip_batch=None if by_records else settings.batch, secret=settings.secret,
        pg=pg, by_records=by_records, patience=settings.store_patience)


def _skipped(tasks: list[Task], settings: Settings, resume: bool) -> dict[int, TaskSummary]:
    """The tasks an earlier batch (or an earlier attempt) accepted, by index: found from
    their record folders under ``records`` and, with ``resume``, from the attempts in the
    workspaces folder; each read back from its record, verified."""
    if settings.records is None and not resume:
        return {}
    pg = None
    if settings.ledger is not None and settings.records is not None:
        pg = _ledger.ledger_sessions(settings.ledger, settings.records,
                                     settings.store_patience)
    out: dict[int, TaskSummary] = {}
    for i, task in enumerate(tasks):
        found = _earlier(task, settings, by_records=True, pg=pg)
        if found is not None:
            word, earlier = found
            out[i] = _ledger.summary_of(task, word, earlier,
                                        f"skipped: {{outcome}} in session {word.session}",
                                        skipped=True)
    return out


def _lost(task: Task, exc: BaseException, settings: Settings) -> TaskSummary:
    """The summary of a task whose every attempt died with its worker (or that Dask could
    not run at all): ``accepted`` when the record of one of its attempts says so (the
    worker died after the verdict), else ``error``."""
    from distributed.scheduler import KilledWorker

    workspaces = Path(settings.workspaces)
    folder = workspaces / task.name
    statuses = sorted(folder.glob("attempt-*.json")) if folder.is_dir() else []
    sessions = tuple(s["session"] for p in statuses
                     if isinstance((s := _read_json(p) or {}).get("session"), str))
    attempt = max(len(statuses), 1)
    if sessions:
        with contextlib.suppress(Exception):  # a record that cannot be read: not accepted
            found = _earlier(task, settings, by_records=False)
            if found is not None:
                word, earlier = found
                return _ledger.summary_of(
                    task, word, earlier, f"{{outcome}} in attempt {earlier.attempt} (session "
                    f"{word.session}); its worker died after", skipped=False,
                    abandoned=sessions)
    if isinstance(exc, TaskNotStarted):
        error, cause = exc.message, f"store_unavailable: {exc.message}"
    elif isinstance(exc, KilledWorker) and not statuses:
        error = "its worker died before it started (it was queued there)"
        cause = f"host_died: {error}"
    elif isinstance(exc, KilledWorker):
        error = f"its worker died in each of {attempt} attempts"
        cause = f"host_died: {error}"
    else:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        cause = _ledger.one_line(exc)
    return TaskSummary(task.name, task.kind, "error", attempt, detail="lost", error=error,
                       abandoned=sessions, cause=cause)


def _submit_all(client: Any, checked: list[Task], settings: Settings,
                summaries: list[TaskSummary | None],
                on_result: Callable[[TaskSummary], None] | None) -> None:
    """Run each task whose summary is None on the cluster, filling in its summary as it
    finishes: each worker's pool registered for the batch (removed at the end), a task
    lost before it started resubmitted, one lost with its workers accounted for."""
    from ._plugin import PoolPlugin, plugin_name

    root = Path(settings.workspaces)
    # Named for this batch: another batch on the cluster keeps its own pools.
    plugin = PoolPlugin([str(root)], hide_env=_hidden_env(settings),
                        name=plugin_name(settings.batch))
    client.register_plugin(plugin, name=plugin.name)
    futures: dict[Any, int] = {}
    requeued = [0] * len(checked)

    def submit(i: int) -> Any:
        task = checked[i]
        future = client.submit(run_task, task, settings, pure=False,
                               key=f"host-kernel-{settings.batch}-{i}.{requeued[i]}-{task.name}")
        futures[future] = i
        return future

    try:
        pending = _distributed().as_completed([submit(i) for i in range(len(checked))
                                               if summaries[i] is None])
        for future in pending:
            i = futures[future]
            if future.status == "finished":
                summary = future.result()
            elif requeued[i] < MAX_REQUEUES and (
                    isinstance(future.exception(), TaskNotStarted)
                    or (_killed(future) and _never_started(checked[i], root))):
                # It was waiting on a worker that died, or its Host found a store
                # unavailable (after the store's own retries): no attempt was made, so
                # none is spent (the scheduler counts a dead worker all the same).
                requeued[i] += 1
                pending.add(submit(i))
                future.release()
                continue
            else:
                summary = _lost(checked[i], future.exception() or RuntimeError(
                    future.status), settings)
            future.release()
            summaries[i] = summary
            if on_result is not None:
                on_result(summary)
    finally:
        client.cancel([f for f, i in futures.items() if summaries[i] is None])
        with contextlib.suppress(Exception):  # a closing cluster may not answer
            client.unregister_worker_plugin(plugin.name)


def run_batch(
    tasks: Iterable[Task],
    *,
    scheduler: Client | str | None = None,
    workers: int = 2,
    ledger: str | None = None,
    ledger_key: bytes | None = None,
    blobs: str | None = None,
    llm: Any = None,
    workspaces: str | os.PathLike[str] | None = None,
    records: str | os.PathLike[str] | None = None,
    retries: int = DEFAULT_RETRIES,
    cell_timeout: float | None = None,
    max_steps: int | None = None,
    connect_timeout: float = 10.0,
    on_result: Callable[[TaskSummary], None] | None = None,
    resume: bool = False,
    store_patience: float | None = None,
) -> BatchResult:
    """Run every task as a task of a Dask cluster and return their summaries.

    ``scheduler``: None starts a LocalCluster of ``workers`` processes (one thread each,
    no dashboard) and closes it at the end; an address (``tcp://host:8786``) or a
    :class:`distributed.Client` runs on that cluster's workers. ``ledger`` (a
    ``postgresql://`` URL) puts every session into that PostgreSQL ledger, under
    ``ledger_key`` (default: read or made once, here, with
    :func:`host_kernel.store.pg.ledger_key`, and sent to every task); ``blobs`` (an fsspec
    URL) is where artifacts' bytes are written through. Without them each session's
    record is a record folder: ``records/<name>/attempt-<n>``, or the workspace's own.
    ``llm`` (a :class:`~host_kernel.llm.LLMConfig`, needed for agent tasks) is sent to the
    workers, which make their clients from it (an ``api_key_env`` is read from the
    worker's environment). ``workspaces`` is the folder the tasks' workspaces are made in
    (default: a new folder under the temp folder); every worker must see it at the same
    path. ``retries``: how often a task whose worker died is run again (for the
    LocalCluster made here; another cluster's scheduler keeps its own
    ``distributed.scheduler.allowed-failures``). ``cell_timeout`` bounds each cell,
    ``max_steps`` each agent session. ``store_patience``: how long each notebook task's
    Host waits for a ledger or blob store that is unavailable (``HostOptions``' option;
    None: its default), and how long reading a record back does. ``on_result`` is called with each summary as its
    task finishes, in the order they finish.

    A task is not run again when an earlier session of it was accepted, as its record
    says (read back verified): one whose record folder ``records/<name>/attempt-N`` an
    earlier batch left (a rerun over the same ``records``), or, with ``resume``, one of
    its attempts in ``workspaces`` (the folder of an earlier batch, continued: its tasks'
    folders are used again, each next attempt taking the next number). Its summary says
    ``skipped``, with the accepted session. The others run.

    Raises TaskInvalid before anything starts when a task cannot run (a task that would
    copy the workspaces or records folder into its workspace too), BatchError when the
    workspaces folder cannot be made or is the records folder, and SchedulerUnreachable
    when no scheduler answers at ``scheduler`` within ``connect_timeout`` seconds.
    """
    t0 = time.monotonic()
    checked = _checked(tasks)
    if any(t.kind == "agent" for t in checked) and llm is None:
        raise TaskInvalid("agent tasks need llm= (an LLMConfig: base URL, model, key)")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise BatchError("workers must be a positive number of processes")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise BatchError("retries must be 0 or more")
    if store_patience is not None and (isinstance(store_patience, bool) or not isinstance(
            store_patience, (int, float)) or not 0 <= store_patience < float("inf")):
        raise BatchError("store_patience must be a number of seconds of at least 0")
    if ledger is not None and ledger_key is None:
        from ..store.pg import ledger_key as read_key

        ledger_key = read_key(ledger)
    root = Path(os.path.realpath(workspaces if workspaces is not None
                                 else tempfile.mkdtemp(prefix="hk-batch-")))
    record_root = Path(os.path.realpath(records)) if records is not None else None
    try:
        _check_roots(checked, root, record_root, resume)
    except BatchError:
        if workspaces is None:
            root.rmdir()  # made empty just above: refused, the batch leaves nothing behind
        raise
    made = workspaces is None or not root.exists()
    try:
        _mark(root)
    except OSError as exc:
        raise BatchError(f"cannot make the workspaces folder {root}: "
                         f"{exc.strerror or exc}") from None
    skip = tuple(str(p) for p in (root, record_root) if p is not None)
    batch = uuid.uuid4().hex[:12]
    settings = Settings(str(root), str(record_root) if record_root else None, ledger,
                        ledger_key, blobs, llm, cell_timeout, max_steps, skip, batch,
                        os.urandom(32), store_patience)
    summaries: list[TaskSummary | None] = [None] * len(checked)
    with contextlib.ExitStack() as stack:
        try:
            client = stack.enter_context(_client(scheduler, workers, retries,
                                                 connect_timeout))
        except BaseException:
            if made:  # nothing ran: leave no folder behind (the command names one)
                with contextlib.suppress(OSError):
                    (root / MARKER).unlink()
                    root.rmdir()
            raise
        keep_tasks(root, checked, settings.records, _redact(ledger) if ledger else None)
        for i, summary in _skipped(checked, settings, resume).items():
            summaries[i] = summary
            if on_result is not None:
                on_result(summary)
        count = len(client.scheduler_info().get("workers", {}))
        if any(s is None for s in summaries):
            _submit_all(client, checked, settings, summaries, on_result)
    done = tuple(s for s in summaries if s is not None)
    return BatchResult(done, time.monotonic() - t0, count, str(root),
                       _redact(ledger) if ledger else None)
