"""Many sessions at once: notebooks and agent tasks as the tasks of a Dask cluster.

Owns the batch API: :class:`Task` (what to run), :class:`TaskSummary` (how one
ended), :class:`BatchResult`, :func:`run_batch` (the driver: it submits, reports
each task as it finishes, and accounts for reruns) and :func:`run_task` (what a
worker does with one task). It does not own the Host, the agent loop, the
ledger, the blob store or the command line (``host-kernel batch``,
:mod:`.commands`). docs/scale.md draws the whole picture.

What a worker does with a task, every time it is given one (an **attempt**):

1. claims the next attempt folder ``<workspaces>/<name>/attempt-<n>`` (an
   exclusive ``mkdir``: a rerun never reuses the folder of an earlier attempt)
   and copies the task's inputs into it: the fresh workspace;
2. starts a Host there, warm from its worker's :class:`~host_kernel.HostPool`,
   confined as every Host is, writing its record to ``<records>/<name>/attempt-<n>``,
   to the PostgreSQL ledger (``ledger=``) or, by default, to the workspace's own
   record folder; a new session each time;
3. runs it: a notebook's non-empty code cells in order through ``Host.execute``,
   stopping at the first that fails (``error``, ``timeout`` or ``kernel_died``);
   an agent task through :func:`~host_kernel.agent.loop.run_agent`;
4. closes the Host and returns a :class:`TaskSummary` (plain data).

Beside the attempt folder, outside the workspace (where the confined kernel cannot
write), ``attempt-<n>.json`` says ``running`` (with the session id) from the start and
holds the summary once the attempt finished. When a worker dies, the scheduler gives
its tasks to another worker, up to ``retries`` times: the rerun claims the next
attempt folder and starts a new session; the dead attempt's session, half written, is
left to the ledger's housekeeping and listed in the summary's ``abandoned``. A task
whose attempt had finished but whose result died with its worker is not run again:
the rerun returns the summary its ``attempt-<n>.json`` holds. A task that only waited
on the dead worker (no attempt folder yet) is submitted again without spending one.

Outcomes: ``accepted``; ``failed`` (the work ran and was not accepted); ``error``
(it could not run: the Host did not start, the provider failed, the worker died more
often than ``retries`` allows). A notebook is accepted when no code cell failed (as
above) and every ``host.submit_output`` it made was accepted; a notebook that submits nothing
is accepted on its cells alone (as ``host-kernel exec`` exits 0). An agent task is
accepted when its session ended with an accepted completion.

Errors::

    HostKernelError
    └── BatchError               the batch cannot run as asked (code ``batch_failed``)
        ├── TaskInvalid          a task that cannot run: no such notebook, an empty task,
        │                        an unknown mode, a bad task file (``task_invalid``)
        └── SchedulerUnreachable no Dask scheduler answered at the address given
                                 (``scheduler_unreachable``)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hmac
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import HostKernelError

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["ArtifactBrief", "BatchError", "BatchResult", "PoolPlugin", "SchedulerUnreachable",
           "Settings", "Task", "TaskInvalid", "TaskSummary", "VerdictBrief", "load_tasks",
           "local_cluster", "run_batch", "run_task"]

KINDS = ("notebook", "agent")
OUTCOMES = ("accepted", "failed", "error")
#: Observation statuses that count as a failed cell (as ``host-kernel exec`` counts them).
FAILED_STATUSES = frozenset({"error", "timeout", "kernel_died"})
#: The name the worker plugin holding each worker's pool is registered under.
POOL_PLUGIN = "host-kernel-pool"
#: Reruns of a task whose worker died, by default.
DEFAULT_RETRIES = 2
#: Times a task that died queued on a worker, before it started, is submitted again.
MAX_REQUEUES = 3


class BatchError(HostKernelError):
    """The batch cannot run as asked."""

    code = "batch_failed"


class TaskInvalid(BatchError, ValueError):
    """A task that cannot run as given; the message names it."""

    code = "task_invalid"


class SchedulerUnreachable(BatchError):
    """No Dask scheduler answered at the address given."""

    code = "scheduler_unreachable"


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Task:
    """One session to run: a notebook (``source`` its path) or an agent task (``source``
    the task's text). ``inputs`` are files and folders copied into the task's fresh
    workspace (for a notebook without inputs: the contents of the notebook's folder);
    ``mode`` arms a task mode; ``name`` names its folders and its row in the results
    (default: the notebook's stem, or ``agent-<n>``; made unique within a batch)."""

    kind: str
    source: str
    inputs: tuple[str, ...] = ()
    mode: str | None = None
    name: str = ""

    @classmethod
    def notebook(cls, path: str | os.PathLike[str], *, inputs: Iterable[str | os.PathLike[str]]
                 = (), mode: str | None = None, name: str = "") -> Task:
        return cls("notebook", os.fspath(path), tuple(os.fspath(p) for p in inputs), mode, name)

    @classmethod
    def agent(cls, text: str, *, inputs: Iterable[str | os.PathLike[str]] = (),
              mode: str | None = None, name: str = "") -> Task:
        return cls("agent", text, tuple(os.fspath(p) for p in inputs), mode, name)


@dataclass(frozen=True, slots=True)
class VerdictBrief:
    """One verdict the Host gave in the session: ``refusals`` are the codes of the
    blocking checks that failed (empty when accepted)."""

    submission_id: str
    accepted: bool
    refusals: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ArtifactBrief:
    """One artifact the session saved; its bytes are in the record's blob store."""

    artifact_id: str
    filename: str
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """How one task ended, in its last attempt.

    ``record`` is where its session's record is: a record folder, or the PostgreSQL
    ledger's URL (without its password) holding ``session_id``; ``head`` the hash of the
    session's last event as its Host wrote it. ``abandoned`` names the
    sessions of earlier attempts whose worker died under them. ``detail`` is one line for
    a person (the cell that failed, the agent's ending, the refusal codes); ``error`` the
    error's text when the outcome is ``error``.
    """

    name: str
    kind: str
    outcome: str
    attempt: int = 1
    session_id: str | None = None
    verdicts: tuple[VerdictBrief, ...] = ()
    artifacts: tuple[ArtifactBrief, ...] = ()
    record: str | None = None
    workspace: str | None = None
    worker: str | None = None
    confinement: str | None = None
    seconds: float = 0.0
    detail: str = ""
    error: str | None = None
    abandoned: tuple[str, ...] = ()
    #: The hash of the last event the session's Host wrote (its chain's head): keep it
    #: where the ledger's writers cannot change it, to hold the record to it later.
    head: str | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome == "accepted"

    @property
    def verdict(self) -> VerdictBrief | None:
        """The deciding verdict: the first refused one, else the last; None without any."""
        refused = [v for v in self.verdicts if not v.accepted]
        return refused[0] if refused else (self.verdicts[-1] if self.verdicts else None)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types; :meth:`from_dict` reads it back."""
        return {"name": self.name, "kind": self.kind, "outcome": self.outcome,
                "attempt": self.attempt, "session_id": self.session_id,
                "verdicts": [{"submission_id": v.submission_id, "accepted": v.accepted,
                              "refusals": list(v.refusals)} for v in self.verdicts],
                "artifacts": [{"artifact_id": a.artifact_id, "filename": a.filename,
                               "sha256": a.sha256, "size": a.size} for a in self.artifacts],
                "record": self.record, "workspace": self.workspace, "worker": self.worker,
                "confinement": self.confinement, "seconds": round(self.seconds, 3),
                "detail": self.detail, "error": self.error, "abandoned": list(self.abandoned),
                "head": self.head}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskSummary:
        return cls(
            name=str(data["name"]), kind=str(data["kind"]), outcome=str(data["outcome"]),
            attempt=int(data.get("attempt", 1)), session_id=data.get("session_id"),
            verdicts=tuple(VerdictBrief(str(v["submission_id"]), bool(v["accepted"]),
                                        tuple(v.get("refusals") or ()))
                           for v in data.get("verdicts") or ()),
            artifacts=tuple(ArtifactBrief(str(a["artifact_id"]), str(a["filename"]),
                                          str(a["sha256"]), int(a["size"]))
                            for a in data.get("artifacts") or ()),
            record=data.get("record"), workspace=data.get("workspace"),
            worker=data.get("worker"), confinement=data.get("confinement"),
            seconds=float(data.get("seconds") or 0.0), detail=str(data.get("detail") or ""),
            error=data.get("error"), abandoned=tuple(data.get("abandoned") or ()),
            head=data.get("head"))


@dataclass(frozen=True, slots=True)
class BatchResult:
    """Every task's summary, in the order the tasks were given."""

    summaries: tuple[TaskSummary, ...]
    seconds: float
    workers: int
    workspaces: str
    ledger: str | None = None

    @property
    def accepted(self) -> bool:
        """Whether every task was accepted."""
        return all(s.accepted for s in self.summaries)

    @property
    def failed(self) -> tuple[TaskSummary, ...]:
        """The tasks not accepted (outcome ``failed`` or ``error``)."""
        return tuple(s for s in self.summaries if not s.accepted)

    @property
    def reruns(self) -> int:
        """Attempts started again because a worker died under them."""
        return sum(s.attempt - 1 for s in self.summaries)

    @property
    def sessions_per_minute(self) -> float:
        return 60.0 * len(self.summaries) / self.seconds if self.seconds > 0 else 0.0

    def counts(self) -> dict[str, int]:
        return {o: sum(s.outcome == o for s in self.summaries) for o in OUTCOMES}

    def to_dict(self) -> dict[str, Any]:
        """The batch's totals (not the summaries), in plain JSON types."""
        return {"tasks": len(self.summaries), **self.counts(), "reruns": self.reruns,
                "seconds": round(self.seconds, 3), "workers": self.workers,
                "sessions_per_minute": round(self.sessions_per_minute, 2),
                "workspaces": self.workspaces, "ledger": self.ledger}


@dataclass(frozen=True, slots=True)
class Settings:
    """What every task of a batch is run with; sent to the workers with each task
    (:func:`run_batch` makes it from its arguments; :func:`run_task` takes it)."""

    workspaces: str
    records: str | None = None
    #: The ledger's URL may carry a password: never in a repr (Dask logs failed tasks').
    ledger: str | None = field(default=None, repr=False)
    ledger_key: bytes | None = field(default=None, repr=False)
    blobs: str | None = None
    llm: Any = None  # a host_kernel.llm.LLMConfig; the client is made on the worker
    cell_timeout: float | None = None
    max_steps: int | None = None
    #: Folders never copied into a workspace (the batch's own roots).
    skip: tuple[str, ...] = ()
    #: The batch's id: a finished attempt's summary is reused only by its own batch.
    batch: str = ""
    #: Signs each finished attempt's status file: a summary is reused (its result lost
    #: with its worker) only when this batch's worker wrote it.
    secret: bytes = field(default=b"", repr=False)


# ----------------------------------------------------------------------------- task files


_TASK_KEYS = frozenset({"kind", "notebook", "task", "inputs", "mode", "name"})


def _task_from(entry: Any, base: Path, where: str) -> Task:
    if not isinstance(entry, dict):
        raise TaskInvalid(f"{where}: a task is a JSON object, not {type(entry).__name__}")
    unknown = sorted(set(entry) - _TASK_KEYS)
    if unknown:
        raise TaskInvalid(f"{where}: unknown key {unknown[0]!r} (a task has "
                          f"{', '.join(sorted(_TASK_KEYS))})")
    if ("notebook" in entry) == ("task" in entry):
        raise TaskInvalid(f"{where}: give \"notebook\" (a path) or \"task\" (an agent's "
                          f"task), one of them")
    kind = "notebook" if "notebook" in entry else "agent"
    if entry.get("kind", kind) != kind:
        raise TaskInvalid(f"{where}: kind {entry['kind']!r} does not match the task given")
    source = entry.get("notebook", entry.get("task"))
    inputs = entry.get("inputs", [])
    if not isinstance(source, str) or not source.strip():
        raise TaskInvalid(f"{where}: {'notebook' if kind == 'notebook' else 'task'} must be "
                          f"a non-empty string")
    if not isinstance(inputs, list) or not all(isinstance(p, str) and p for p in inputs):
        raise TaskInvalid(f"{where}: inputs must be a list of paths")
    for key in ("mode", "name"):
        if entry.get(key) is not None and not isinstance(entry[key], str):
            raise TaskInvalid(f"{where}: {key} must be a string")
    if kind == "notebook":
        source = str(base / source)
    return Task(kind, source, tuple(str(base / p) for p in inputs), entry.get("mode"),
                entry.get("name") or "")


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """The tasks of a task file: a JSON list of task objects, or JSON lines (one object a
    line; blank lines and lines starting with ``#`` are skipped). An object is
    ``{"notebook": PATH}`` or ``{"task": TEXT}``, with optional ``"inputs": [PATH, …]``,
    ``"mode"``, ``"name"`` and ``"kind"``; relative paths are read from the file's folder.
    Raises TaskInvalid naming the line (or entry) at fault."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise TaskInvalid(f"cannot read {file}: {why or exc}") from None
    base = file.resolve().parent
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            entries = json.loads(text)
        except ValueError as exc:
            raise TaskInvalid(f"{file} is not JSON: {exc}") from None
        tasks = [_task_from(e, base, f"{file}: entry {i}") for i, e in enumerate(entries, 1)]
    else:
        tasks = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                entry = json.loads(line)
            except ValueError as exc:
                raise TaskInvalid(f"{file}: line {number} is not JSON: {exc}") from None
            tasks.append(_task_from(entry, base, f"{file}: line {number}"))
    if not tasks:
        raise TaskInvalid(f"{file} holds no task")
    return tasks


def _checked(tasks: Iterable[Task]) -> list[Task]:
    """The tasks, checked, their modes spelled canonically and their names unique."""
    from ..modes import UnknownModeError, normalise_mode_name

    out: list[Task] = []
    taken: set[str] = set()
    agents = 0
    for task in tasks:
        if not isinstance(task, Task):
            raise TaskInvalid(f"not a Task: {task!r}")
        if task.kind not in KINDS:
            raise TaskInvalid(f"task kind must be notebook or agent, not {task.kind!r}")
        if not isinstance(task.source, str) or not task.source.strip():
            raise TaskInvalid(f"an empty {task.kind} task")
        if task.kind == "notebook":
            _check_notebook(Path(task.source))
        else:
            agents += 1
        names: set[str] = set()
        for p in task.inputs:
            if not os.path.lexists(p):
                raise TaskInvalid(f"no such input: {p}")
            name = Path(os.path.abspath(p)).name
            if not name or name in (".", ".."):
                raise TaskInvalid(f"input {p!r} names no file or folder to copy (give the "
                                  f"folder by its own name)")
            if name in names:
                raise TaskInvalid(f"two inputs of one task are named {name!r}; each is copied "
                                  f"into the workspace under its own name")
            names.add(name)
        mode = task.mode
        if mode is not None:
            try:
                mode = normalise_mode_name(mode)
            except UnknownModeError as exc:
                raise TaskInvalid(str(exc)) from None
        stem = task.name or (Path(task.source).stem if task.kind == "notebook"
                             else f"agent-{agents}")
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "task"
        name, n = stem, 1
        while name in taken:
            n += 1
            name = f"{stem}-{n}"
        taken.add(name)
        # Paths are opened on the workers: made absolute here, where they were checked.
        source = os.path.abspath(task.source) if task.kind == "notebook" else task.source
        out.append(Task(task.kind, source, tuple(os.path.abspath(p) for p in task.inputs),
                        mode, name))
    if not out:
        raise TaskInvalid("no tasks to run")
    return out


def _check_notebook(path: Path) -> None:
    nbformat = _nbformat()

    if not path.is_file():
        raise TaskInvalid(f"no such file: {path}" if not path.exists() else
                          f"not a file: {path}")
    try:
        nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds; any is a refusal
        raise TaskInvalid(f"not a notebook: {path}: {str(exc).splitlines()[0][:200]}"
                          ) from None


def _nbformat() -> Any:
    import nbformat  # ships no type hints

    return nbformat


# ----------------------------------------------------------------------------- the worker side


def _plugin_class() -> type:
    """:class:`PoolPlugin`, made on first use: it subclasses Dask's ``WorkerPlugin``, and
    Dask is imported only by a batch, never by ``import host_kernel.batch`` (which the
    command line does to list its commands)."""
    made: type | None = globals().get("PoolPlugin")
    if made is not None:
        return made
    from distributed import WorkerPlugin

    class PoolPlugin(WorkerPlugin):
        """One warm :class:`~host_kernel.HostPool` per Dask worker: made when the plugin is
        registered (or the worker starts), closed when it is removed or the worker closes.
        ``roots`` are the folders the batch's workspaces lie beneath."""

        name = POOL_PLUGIN

        def __init__(self, roots: Iterable[str], size: int = 1) -> None:
            self.roots = tuple(roots)
            self.size = size
            self.pool: Any = None

        def setup(self, worker: Any) -> None:
            from ..host._pool import HostPool

            for root in self.roots:
                Path(root).mkdir(parents=True, exist_ok=True)
            self.pool = HostPool(size=self.size, roots=self.roots).start()

        def teardown(self, worker: Any) -> None:
            if self.pool is not None:
                self.pool.close()
                self.pool = None

    # Pickled by reference: a worker finds it as host_kernel.batch.PoolPlugin.
    PoolPlugin.__module__, PoolPlugin.__qualname__ = __name__, "PoolPlugin"
    globals()["PoolPlugin"] = PoolPlugin
    return PoolPlugin


def __getattr__(name: str) -> Any:
    if name == "PoolPlugin":
        return _plugin_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _worker_pool() -> tuple[Any, str]:
    """This worker's pool (None outside a worker, or without the plugin) and its address."""
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:
        return None, f"local:{os.getpid()}"
    plugin = worker.plugins.get(POOL_PLUGIN)
    return getattr(plugin, "pool", None), str(worker.address)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _signature(secret: bytes, summary: Any) -> str:
    text = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    return hmac.digest(secret, text.encode("utf-8"), "sha256").hex()


def _signed(status: dict[str, Any], secret: bytes) -> bool:
    """Whether a finished status was written by a worker of the batch holding ``secret``."""
    mac = status.get("mac")
    return bool(secret) and isinstance(mac, str) and hmac.compare_digest(
        mac, _signature(secret, status.get("summary")))


def _claim(folder: Path, batch: str, secret: bytes = b""
           ) -> tuple[int, Path, TaskSummary | None, list[str]]:
    """The next attempt of the task whose attempts live in ``folder``: its number, its new
    workspace, the summary of an earlier attempt of ``batch`` that finished (then nothing
    is claimed), and the sessions of earlier attempts that never finished."""
    folder.mkdir(parents=True, exist_ok=True)
    abandoned: list[str] = []
    n = 1
    while True:
        workspace = folder / f"attempt-{n}"
        status = _read_json(folder / f"attempt-{n}.json")
        if status is not None and status.get("state") == "finished" \
                and status.get("batch") == batch and _signed(status, secret):
            return n, workspace, TaskSummary.from_dict(status["summary"]), []
        try:
            workspace.mkdir()
        except FileExistsError:
            if status is not None and isinstance(status.get("session"), str):
                abandoned.append(status["session"])
            n += 1
            continue
        return n, workspace, None, abandoned


def _copy_in(sources: Iterable[str], workspace: Path, skip: tuple[str, ...]) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n == ".ipynb_checkpoints"
                or os.path.realpath(os.path.join(folder, n)) in skip}

    for source in sources:
        src = Path(source)
        target = workspace / src.name
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, target, symlinks=True, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(src, target, follow_symlinks=False)


def _hidden(settings: Settings) -> tuple[str, ...]:
    """What a task's kernel may not even read: every task's workspace and status file but
    its own workspace (granted to it beneath), the records, and Dask's own configuration
    (a cluster's TLS key lives there)."""
    dask_config = Path.home() / ".config" / "dask"
    return tuple(p for p in (settings.workspaces, settings.records,
                             str(dask_config) if dask_config.exists() else None) if p)


def _store_arguments(settings: Settings) -> dict[str, Any]:
    """The ledger and blob store arguments, passed only when the batch was given them."""
    out: dict[str, Any] = {}
    if settings.ledger is not None:
        out.update(ledger=settings.ledger, ledger_key=settings.ledger_key)
    if settings.blobs is not None:
        out["blobs"] = settings.blobs
    return out


def run_task(task: Task, settings: Settings) -> TaskSummary:
    """Run one attempt of ``task`` here (in a Dask worker, with its pool; or in this process)
    and return its summary. Never raises for the task's own failures: they are its
    outcome."""
    t0 = time.monotonic()
    pool, worker = _worker_pool()
    folder = Path(settings.workspaces) / task.name
    attempt, workspace, finished, abandoned = _claim(folder, settings.batch, settings.secret)
    if finished is not None:
        return finished  # the result was lost with its worker, not the session
    status = folder / f"attempt-{attempt}.json"
    record = (str(Path(settings.records) / task.name / f"attempt-{attempt}")
              if settings.records else None)
    base = TaskSummary(task.name, task.kind, "error", attempt, workspace=str(workspace),
                       worker=worker, abandoned=tuple(abandoned))

    session: list[str] = []

    def started(session_id: str) -> None:
        session.append(session_id)
        _write_json(status, {"state": "running", "batch": settings.batch,
                             "session": session_id, "worker": worker,
                             "pid": os.getpid(), "started": dt.datetime.now(
                                 dt.timezone.utc).isoformat(timespec="seconds")})

    try:
        sources = list(task.inputs)
        if task.kind == "notebook":
            nb = Path(task.source)
            sources = [*sources, str(nb)] if sources else [
                str(p) for p in sorted(nb.resolve().parent.iterdir())
                if os.path.realpath(p) not in settings.skip]
        _copy_in(sources, workspace, settings.skip)
        runner = _run_notebook if task.kind == "notebook" else _run_agent
        summary = runner(task, workspace, record, settings, pool, base, started)
    except Exception as exc:  # noqa: BLE001 - whatever stopped it is the task's outcome
        summary = _replace(base, session_id=session[-1] if session else None,
                           error=f"{type(exc).__name__}: {exc}"[:2000], detail="could not run")
    summary = _replace(summary, seconds=round(time.monotonic() - t0, 3))
    if summary.record is None and settings.ledger is not None:
        summary = _replace(summary, record=_redact(settings.ledger))
    body = summary.to_dict()
    _write_json(status, {"state": "finished", "batch": settings.batch, "summary": body,
                         "mac": _signature(settings.secret, body) if settings.secret else None})
    return summary


def _replace(summary: TaskSummary, **changes: Any) -> TaskSummary:
    return dataclasses.replace(summary, **changes)


def _redact(url: str) -> str:
    from ..store.pg import redact_url

    return redact_url(url)


def _run_notebook(task: Task, workspace: Path, record: str | None, settings: Settings,
                  pool: Any, base: TaskSummary, started: Callable[[str], None]) -> TaskSummary:
    from ..host._host import Host

    nb = _nbformat().read(workspace / Path(task.source).name, as_version=4)
    cells = [(i, str(c.source)) for i, c in enumerate(nb.cells, start=1)
             if c.get("cell_type") == "code" and str(c.get("source", "")).strip()]
    host = Host(workspace, mode=task.mode, record_dir=record, front="batch", pool=pool,
                hide_paths=_hidden(settings), **_store_arguments(settings))
    started(host.session_id)
    failed: tuple[int, str] | None = None
    with host:
        for index, code in cells:
            obs = host.execute(code, timeout=settings.cell_timeout)
            if obs.status in FAILED_STATUSES:
                failed = (index, obs.status)
                break
        verdicts = tuple(VerdictBrief(v.submission_id, v.accepted,
                                      tuple(c.code for c in v.failed if not c.advisory))
                         for v, _ in host.verdicts())
        artifacts = _session_artifacts(host)
        confinement = host.confinement.status if host.confinement is not None else None
    refused = [v for v in verdicts if not v.accepted]
    if failed is not None:
        outcome, detail = "failed", f"cell {failed[0]}: {failed[1]}"
    elif refused:
        outcome = "failed"
        detail = "refused: " + ", ".join(dict.fromkeys(c for v in refused for c in v.refusals))
    else:
        outcome = "accepted"
        detail = (f"{len(cells)} cell{'s' * (len(cells) != 1)} ok, {len(verdicts)} "
                  f"submission{'s' * (len(verdicts) != 1)} accepted")
    return _replace(base, outcome=outcome, session_id=host.session_id, verdicts=verdicts,
                    artifacts=artifacts, record=None if settings.ledger else
                    str(host.record_dir), confinement=confinement, detail=detail,
                    head=host.head)


def _session_artifacts(host: Any) -> tuple[ArtifactBrief, ...]:
    """The artifacts the Host's session saved, from its ledger's projection (as the agent
    loop reads them), before the Host closes it."""
    if host.ledger is None:
        return ()
    rows = host.own_rows("SELECT artifact_id, filename, sha256, size FROM artifacts "
                         "WHERE session = ? ORDER BY seq", (host.session_id,))
    return tuple(ArtifactBrief(str(r["artifact_id"]), str(r["filename"]), str(r["sha256"]),
                               int(r["size"])) for r in rows)


def _run_agent(task: Task, workspace: Path, record: str | None, settings: Settings,
               pool: Any, base: TaskSummary, started: Callable[[str], None]) -> TaskSummary:
    from ..agent.loop import DEFAULT_MAX_STEPS, Outcome, run_agent
    from ..llm import LLMClient

    if settings.llm is None:
        raise TaskInvalid("an agent task needs llm= (an LLMConfig)")
    artifacts: list[ArtifactBrief] = []
    confinement: list[str | None] = [None]
    hosts: list[Any] = []

    def progress(event: dict[str, Any]) -> None:
        if event.get("kind") == "artifact":
            d = event.get("data") or {}
            artifacts.append(ArtifactBrief(str(d["artifact_id"]), str(d["filename"]),
                                           str(d["sha256"]), int(d["size"])))

    def on_host(host: Any) -> None:
        hosts.append(host)
        started(host.session_id)
        confinement[0] = host.confinement.status if host.confinement is not None else None

    with LLMClient(settings.llm) as llm:
        result = run_agent(task.source, workdir=workspace, mode=task.mode, llm=llm,
                           record_dir=record, pool=pool, spare=False,
                           max_steps=settings.max_steps or DEFAULT_MAX_STEPS,
                           cell_timeout=settings.cell_timeout, on_progress=progress,
                           on_host=on_host, hide_paths=_hidden(settings),
                           **_store_arguments(settings))
    verdicts = tuple(VerdictBrief(v.submission_id, v.accepted, tuple(v.failed))
                     for v in result.snapshot.verdicts)
    if result.accepted:
        outcome = "accepted"
    else:
        outcome = "error" if result.outcome is Outcome.ERROR else "failed"
    detail = f"{result.outcome.value} after {result.steps} step(s)"
    if result.reason:
        detail += f": {result.reason}"
    return _replace(base, outcome=outcome, session_id=result.session_id, verdicts=verdicts,
                    artifacts=tuple(artifacts), record=None if settings.ledger else
                    str(result.record_dir), confinement=confinement[0], detail=detail[:500],
                    error=detail[:2000] if outcome == "error" else None,
                    head=hosts[-1].head if hosts else None)


# ----------------------------------------------------------------------------- the driver


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
        except (OSError, TimeoutError, ValueError) as exc:
            raise SchedulerUnreachable(f"no Dask scheduler answered at {scheduler}: "
                                       f"{exc}") from None
        with client:
            yield client
        return
    with local_cluster(workers, retries=retries) as cluster, dist.Client(cluster) as client:
        yield client


def local_cluster(workers: int = 2, *, retries: int = DEFAULT_RETRIES, **kwargs: Any) -> Any:
    """A Dask LocalCluster made as :func:`run_batch` makes its own: ``workers`` processes of
    one thread each, no dashboard, the scheduler's HTTP endpoint on 127.0.0.1 at a free
    port (never 0.0.0.0:8787), Dask's logs silenced below CRITICAL (the batch reports
    what happens itself), each worker sent only the task it runs, and a task whose worker
    died given to another worker at most ``retries`` times. ``kwargs`` go to LocalCluster
    (``env=`` for the workers' environment). For several batches on one cluster: ``with
    local_cluster() as cluster, Client(cluster) as client: run_batch(tasks,
    scheduler=client)``."""
    import dask

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
                          "distributed.scheduler.worker-saturation": 1.0}):
        return _distributed().LocalCluster(**options)


def _killed(future: Any) -> bool:
    """Whether the task's future failed because its worker died (not the task itself)."""
    from distributed.scheduler import KilledWorker

    return isinstance(future.exception(), KilledWorker)


def _never_started(task: Task, workspaces: Path) -> bool:
    """Whether no attempt of ``task`` claimed a workspace (as far as this machine sees)."""
    return not any((workspaces / task.name).glob("attempt-*"))


def _lost(task: Task, exc: BaseException, workspaces: Path) -> TaskSummary:
    """The summary of a task whose every attempt died with its worker (or that Dask could
    not run at all)."""
    from distributed.scheduler import KilledWorker

    folder = workspaces / task.name
    statuses = sorted(folder.glob("attempt-*.json")) if folder.is_dir() else []
    sessions = tuple(s["session"] for p in statuses
                     if isinstance((s := _read_json(p) or {}).get("session"), str))
    attempt = max(len(statuses), 1)
    if isinstance(exc, KilledWorker) and not statuses:
        error = "its worker died before it started (it was queued there)"
    elif isinstance(exc, KilledWorker):
        error = f"its worker died in each of {attempt} attempts"
    else:
        error = f"{type(exc).__name__}: {exc}"[:2000]
    return TaskSummary(task.name, task.kind, "error", attempt, detail="lost", error=error,
                       abandoned=sessions)


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
    ``max_steps`` each agent session. ``on_result`` is called with each summary as its
    task finishes, in the order they finish.

    Raises TaskInvalid before anything starts when a task cannot run, and
    SchedulerUnreachable when no scheduler answers at ``scheduler`` within
    ``connect_timeout`` seconds.
    """
    t0 = time.monotonic()
    checked = _checked(tasks)
    if any(t.kind == "agent" for t in checked) and llm is None:
        raise TaskInvalid("agent tasks need llm= (an LLMConfig: base URL, model, key)")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise BatchError("workers must be a positive number of processes")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise BatchError("retries must be 0 or more")
    if ledger is not None and ledger_key is None:
        from ..store.pg import ledger_key as read_key

        ledger_key = read_key(ledger)
    root = Path(os.path.realpath(workspaces if workspaces is not None
                                 else tempfile.mkdtemp(prefix="hk-batch-")))
    root.mkdir(parents=True, exist_ok=True)
    taken = [t.name for t in checked if (root / t.name).exists()]
    if taken:
        raise TaskInvalid(f"{root} holds workspaces of an earlier batch already (task "
                          f"{taken[0]}{' and others' if len(taken) > 1 else ''}); give a "
                          f"new folder")
    record_root = Path(os.path.realpath(records)) if records is not None else None
    skip = tuple(str(p) for p in (root, record_root) if p is not None)
    batch = uuid.uuid4().hex[:12]
    settings = Settings(str(root), str(record_root) if record_root else None, ledger,
                        ledger_key, blobs, llm, cell_timeout, max_steps, skip, batch,
                        os.urandom(32))
    summaries: list[TaskSummary | None] = [None] * len(checked)
    with _client(scheduler, workers, retries, connect_timeout) as client:
        client.register_plugin(_plugin_class()([str(root)]), name=POOL_PLUGIN)
        futures: dict[Any, int] = {}
        requeued = [0] * len(checked)
        count = len(client.scheduler_info().get("workers", {}))

        def submit(i: int) -> Any:
            task = checked[i]
            future = client.submit(run_task, task, settings, pure=False,
                                   key=f"host-kernel-{batch}-{i}.{requeued[i]}-{task.name}")
            futures[future] = i
            return future

        try:
            pending = _distributed().as_completed([submit(i) for i in range(len(checked))])
            for future in pending:
                i = futures[future]
                if future.status == "finished":
                    summary = future.result()
                elif _killed(future) and _never_started(checked[i], root) \
                        and requeued[i] < MAX_REQUEUES:
                    # It was waiting on a worker that died: no attempt was made, so none
                    # is spent (the scheduler counts it as a failure all the same).
                    requeued[i] += 1
                    pending.add(submit(i))
                    future.release()
                    continue
                else:
                    summary = _lost(checked[i], future.exception() or RuntimeError(
                        future.status), root)
                future.release()
                summaries[i] = summary
                if on_result is not None:
                    on_result(summary)
        finally:
            client.cancel([f for f, i in futures.items() if summaries[i] is None])
            with contextlib.suppress(Exception):  # a closing cluster may not answer
                client.unregister_worker_plugin(POOL_PLUGIN)
    done = tuple(s for s in summaries if s is not None)
    return BatchResult(done, time.monotonic() - t0, count, str(root),
                       _redact(ledger) if ledger else None)
