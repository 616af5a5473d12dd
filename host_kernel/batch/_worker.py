"""The worker side: one attempt of one task, from claiming its folder to its summary.

Owns :class:`Settings` (what every task of a batch is run with, sent with each task),
:func:`run_task` (what a Dask worker runs: return an earlier attempt its record shows
accepted, or claim the next attempt folder, copy the inputs in, run the notebook or the
agent on a Host from its worker's pool, read the session back from its record for the
summary, write the signed status file; or give the attempt back when a store was
unavailable at the Host's start) and the two runners. It does not own the pool itself (:mod:`._plugin`, which
imports Dask), submitting tasks or accounting for reruns (:mod:`._driver`), the Host or
the agent loop. The attempt protocol is in the package's docstring.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _ledger
from ._errors import TaskInvalid, TaskNotStarted
from ._ledger import FAILED_STATUSES
from ._status import _read_json, _signature, _signed, _write_json
from ._summary import TaskSummary
from ._tasks import Task, read_quietly

if TYPE_CHECKING:  # pragma: no cover
    from ..host._options import HostOptions

__all__ = ["FAILED_STATUSES", "Settings", "notebook_cells", "run_task"]



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
    #: How long a notebook task's Host (and reading a record back) waits for a store that
    #: is unavailable (``HostOptions.store_patience``); None: the Host's default.
    store_patience: float | None = None


#: Marks a batch's workspaces folder. A folder holding it is never copied into a workspace:
#: a later batch run where the notebooks are (``./hk-batch-<time>``, the command's
#: default) would otherwise copy every earlier batch's workspaces into each of its own.
MARKER = ".host-kernel-batch"


def _mark(root: Path) -> None:
    """Mark ``root`` as a batch's workspaces folder (made when missing)."""
    root.mkdir(parents=True, exist_ok=True)
    marker = root / MARKER
    if not marker.exists():
        marker.write_text("The workspaces of host-kernel batches: never copied into a "
                          "task's workspace.\n", encoding="utf-8")


def _a_batch(path: str) -> bool:
    """Whether ``path`` is a batch's workspaces folder (a link is not followed)."""
    return not os.path.islink(path) and os.path.isfile(os.path.join(path, MARKER))


def _claim(folder: Path, batch: str, secret: bytes = b"", records: Path | None = None
           ) -> tuple[int, Path, TaskSummary | None, list[str]]:
    """The next attempt of the task whose attempts live in ``folder``: its number, its new
    workspace, the summary of an earlier attempt of ``batch`` that finished (then nothing
    is claimed), and the sessions of earlier attempts that never finished. A number whose
    record folder under ``records`` (the task's own, ``records/<name>``) holds a session
    already, an earlier batch's, is passed over: a session never shares a record folder."""
    folder.mkdir(parents=True, exist_ok=True)
    abandoned: list[str] = []
    n = 1
    while True:
        workspace = folder / f"attempt-{n}"
        status = _read_json(folder / f"attempt-{n}.json")
        if status is not None and status.get("state") == "finished" \
                and status.get("batch") == batch and _signed(status, secret):
            return n, workspace, TaskSummary.from_dict(status["summary"]), []
        if records is not None and not workspace.exists() and \
                _record_taken(records / f"attempt-{n}"):
            n += 1
            continue
        try:
            workspace.mkdir()
        except FileExistsError:
            if status is not None and isinstance(status.get("session"), str):
                abandoned.append(status["session"])
            n += 1
            continue
        return n, workspace, None, abandoned


def _record_taken(folder: Path) -> bool:
    """Whether the record folder ``folder`` holds events (a damaged ledger counts)."""
    from ..store.base import RecordRefused
    from ..store.sqlite import SQLiteLedger
    from ..store.verified import event_count

    if not (folder / "ledger.sqlite").exists():
        return False
    try:
        with SQLiteLedger.open_readonly(folder / "ledger.sqlite") as ledger:
            return event_count(ledger) > 0
    except RecordRefused as exc:
        return exc.code != "ledger_empty"


def _copy_in(sources: Iterable[str], workspace: Path, skip: tuple[str, ...]) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n == ".ipynb_checkpoints"
                or os.path.realpath(os.path.join(folder, n)) in skip
                or _a_batch(os.path.join(folder, n))}

    for source in sources:
        src = Path(source)
        target = workspace / src.name
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, target, symlinks=True, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(src, target, follow_symlinks=False)


def _copy_notebook(notebook: Path, workspace: Path) -> None:
    """The notebook's own content into the workspace, under the name it was given (a link
    to it, even a relative one, is followed here, where it points where it should)."""
    target = workspace / notebook.name
    with contextlib.suppress(FileNotFoundError):
        target.unlink()  # never written through a link an input put there
    shutil.copy2(notebook, target)


def _hidden(settings: Settings) -> tuple[str, ...]:
    """What a task's kernel may not even read: every task's workspace and status file but
    its own workspace (granted to it beneath), the records, Dask's own configuration (a
    cluster's TLS key lives there) and the file holding the batch's LLM key."""
    dask_config = Path.home() / ".config" / "dask"
    key_file = getattr(settings.llm, "api_key_file", None)
    return tuple(p for p in (settings.workspaces, settings.records,
                             str(dask_config) if dask_config.exists() else None,
                             key_file if isinstance(key_file, str) else None) if p)


def _hidden_env(settings: Settings) -> tuple[str, ...]:
    """The variable holding the batch's LLM key. An agent's Host hides it itself (it is
    given the model); a notebook's Host is not, and a notebook is a task's code too."""
    name = getattr(settings.llm, "api_key_env", None)
    return (name,) if isinstance(name, str) and name else ()


def _store_arguments(settings: Settings) -> dict[str, Any]:
    """The ledger and blob store arguments, passed only when the batch was given them."""
    out: dict[str, Any] = {}
    if settings.ledger is not None:
        out.update(ledger=settings.ledger, ledger_key=settings.ledger_key)
    if settings.blobs is not None:
        out["blobs"] = settings.blobs
    return out


def _host_options(settings: Settings, pool: Any) -> HostOptions:
    """How a notebook task's Host runs: the batch's one options record (its pool, what
    each task's kernel is kept from, the shared stores)."""
    from ..host._options import HostOptions

    options = HostOptions(front="batch", pool=pool, hide_paths=_hidden(settings),
                          hide_env=_hidden_env(settings), **_store_arguments(settings))
    if settings.store_patience is None:
        return options
    return dataclasses.replace(options, store_patience=settings.store_patience)


@dataclass(slots=True)
class _Attempt:
    """What the runners tell :func:`run_task` of an attempt as it goes."""

    session: str | None = None
    record: str | None = None
    #: The session's Host started: from here on, the session is in the ledger.
    opened: bool = False


def notebook_cells(path: Path) -> list[tuple[int, str]]:
    """The code cells a notebook task runs: ``(cell number, code)`` of each non-empty one."""
    nb = read_quietly(path)
    return [(i, str(c.source)) for i, c in enumerate(nb.cells, start=1)
            if c.get("cell_type") == "code" and str(c.get("source", "")).strip()]


def run_task(task: Task, settings: Settings) -> TaskSummary:
    """Run one attempt of ``task`` here (in a Dask worker, with its pool; or in this process)
    and return its summary, read back from the session's record once the attempt ended.
    Never raises for the task's own failures: they are its outcome. An earlier attempt
    whose session was accepted (its worker died after) is not run again: its summary is
    returned. Raises :class:`TaskNotStarted` when the Host could not start because a
    store was unavailable, after removing the attempt's folder."""
    t0 = time.monotonic()
    from ._plugin import plugin_name, worker_pool  # imports Dask: a worker has it

    pool, worker = worker_pool(plugin_name(settings.batch))
    folder = Path(settings.workspaces) / task.name
    _mark(Path(settings.workspaces))
    numbers = ([n for n, _ in notebook_cells(Path(task.source))]
               if task.kind == "notebook" else None)
    try:
        found = _ledger.accepted_earlier(task, workspaces=settings.workspaces,
                                         records=settings.records, ledger=settings.ledger,
                                         key=settings.ledger_key, numbers=numbers,
                                         skip_batch=settings.batch, secret=settings.secret,
                                         patience=settings.store_patience)
    except Exception as exc:
        if _ledger.unavailable(exc):
            raise TaskNotStarted(f"task {task.name}: its earlier attempts could not be read, "
                                 f"the ledger was unavailable ({_ledger.one_line(exc)})"
                                 ) from None
        raise
    if found is not None:
        word, earlier = found
        return _ledger.summary_of(task, word, earlier, f"{{outcome}} in attempt "
                                  f"{earlier.attempt} (session {word.session}); not run again",
                                  skipped=False)
    records = Path(settings.records) / task.name if settings.records else None
    attempt, workspace, finished, abandoned = _claim(folder, settings.batch, settings.secret,
                                                     records)
    if finished is not None:
        return finished  # the result was lost with its worker, not the session
    status = folder / f"attempt-{attempt}.json"
    record = str(records / f"attempt-{attempt}") if records is not None else \
        str(_ledger.attempt_record(task.name, workspace))
    base = TaskSummary(task.name, task.kind, "error", attempt, workspace=str(workspace),
                       worker=worker, abandoned=tuple(abandoned))
    state = _Attempt()

    def started(session_id: str, record_dir: str) -> None:
        state.session, state.record = session_id, record_dir
        _write_json(status, {"state": "running", "batch": settings.batch,
                             "session": session_id, "record": record_dir, "worker": worker,
                             "pid": os.getpid(), "started": dt.datetime.now(
                                 dt.UTC).isoformat(timespec="seconds")})

    ran: TaskSummary | None = None
    failure: str | None = None
    try:
        sources = list(task.inputs)
        if task.kind == "notebook":
            nb = Path(task.source)
            # The folder of the notebook itself (as `exec` runs it), less the notebook:
            # copied below under the name it was given, whatever link leads to it.
            sources = sources or [str(p) for p in sorted(nb.resolve().parent.iterdir())
                                  if p.name != nb.name and not _a_batch(str(p))
                                  and os.path.realpath(p) not in settings.skip]
        _copy_in(sources, workspace, settings.skip)
        if task.kind == "notebook":
            _copy_notebook(Path(task.source), workspace)
        runner = _run_notebook if task.kind == "notebook" else _run_agent
        ran = runner(task, workspace, record, settings, pool, base, started, state)
    except Exception as exc:  # noqa: BLE001 - whatever stopped it is the task's outcome
        if not state.opened and _ledger.unavailable(exc):
            _release(workspace, status)
            raise TaskNotStarted(f"task {task.name}: its Host could not start, a store was "
                                 f"unavailable ({_ledger.one_line(exc)})") from None
        failure = _ledger.one_line(exc)
        base = _replace(base, error=f"{type(exc).__name__}: {exc}"[:2000])
    summary = _read_back(task, settings, base, state, ran, failure, numbers)
    summary = _replace(summary, seconds=round(time.monotonic() - t0, 3))
    if summary.record is None and settings.ledger is not None:
        summary = _replace(summary, record=_redact(settings.ledger))
    body = summary.to_dict()
    _write_json(status, {"state": "finished", "batch": settings.batch, "summary": body,
                         "mac": _signature(settings.secret, body) if settings.secret else None})
    return summary


def _release(workspace: Path, status: Path) -> None:
    """Give an attempt's number back: its workspace and status file removed (no session of
    it reached the ledger), so that the task's next attempt takes the same number."""
    shutil.rmtree(workspace, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        status.unlink()


def _read_back(task: Task, settings: Settings, base: TaskSummary, state: _Attempt,
               ran: TaskSummary | None, failure: str | None,
               numbers: list[int] | None) -> TaskSummary:
    """The attempt's summary as its session's record says: outcome, verdicts, artifacts and
    head read back from the checked events, the runner's own view used only for what the
    record does not hold (an agent loop's ending, the worker, the time)."""
    if state.session is None:  # no session: the Host was never made
        return _replace(base, detail="could not run", cause=failure)
    try:
        word = _ledger.read_word(state.session, folder=state.record, ledger=settings.ledger,
                                 key=settings.ledger_key, patience=settings.store_patience)
    except Exception as exc:  # noqa: BLE001 - a record that cannot be read back is the outcome
        why = _ledger.one_line(exc)
        return _replace(base, session_id=state.session, detail="its record could not be "
                        "read back", cause=why, error=f"{base.error}; then: {why}"
                        if base.error else why)
    if word is None:
        return _replace(base, session_id=state.session, detail="could not run",
                        cause=failure or "record_missing: the session left no event in the "
                        "record", record=state.record if settings.ledger is None else None)
    outcome, detail, cause = _ledger.decide(task.kind, word, ran=ran, failure=failure,
                                            numbers=numbers)
    made = ran or base
    return _replace(made, outcome=outcome, session_id=word.session, verdicts=word.verdicts,
                    artifacts=word.artifacts, head=word.head, detail=detail[:500],
                    cause=cause, confinement=word.confinement or made.confinement,
                    record=None if settings.ledger else word.record,
                    error=(made.error or failure or cause) if outcome == "error" else None)


def _replace(summary: TaskSummary, **changes: Any) -> TaskSummary:
    return dataclasses.replace(summary, **changes)


def _redact(url: str) -> str:
    from ..store.pg import redact_url

    return redact_url(url)


def _run_notebook(task: Task, workspace: Path, record: str | None, settings: Settings,
                  pool: Any, base: TaskSummary, started: Callable[[str, str], None],
                  state: _Attempt) -> TaskSummary:
    from ..host._host import Host

    cells = notebook_cells(workspace / Path(task.source).name)
    host = Host(workspace, mode=task.mode, record_dir=record,
                options=_host_options(settings, pool),
                notebook=str(workspace / Path(task.source).name))
    started(host.session_id, str(host.record_dir))
    with host:
        state.opened = True
        for _, code in cells:
            obs = host.execute(code, timeout=settings.cell_timeout)
            if obs.status in FAILED_STATUSES:
                break
        confinement = host.confinement.status if host.confinement is not None else None
    return _replace(base, session_id=host.session_id, confinement=confinement)


def _run_agent(task: Task, workspace: Path, record: str | None, settings: Settings,
               pool: Any, base: TaskSummary, started: Callable[[str, str], None],
               state: _Attempt) -> TaskSummary:
    from ..agent.loop import DEFAULT_MAX_STEPS, Outcome, run_agent
    from ..llm import LLMClient

    if settings.llm is None:
        raise TaskInvalid("an agent task needs llm= (an LLMConfig)")
    confinement: list[str | None] = [None]

    def on_host(host: Any) -> None:
        started(host.session_id, str(host.record_dir))
        state.opened = True
        confinement[0] = host.confinement.status if host.confinement is not None else None

    with LLMClient(settings.llm) as llm:
        result = run_agent(task.source, workdir=workspace, mode=task.mode, llm=llm,
                           record_dir=record, pool=pool, spare=False,
                           max_steps=settings.max_steps or DEFAULT_MAX_STEPS,
                           cell_timeout=settings.cell_timeout, on_host=on_host,
                           hide_paths=_hidden(settings), **_store_arguments(settings))
    if result.accepted:
        outcome = "accepted"
    else:
        outcome = "error" if result.outcome is Outcome.ERROR else "failed"
    detail = f"{result.outcome.value} after {result.steps} step(s)"
    if result.reason:
        detail += f": {result.reason}"
    return _replace(base, outcome=outcome, session_id=result.session_id,
                    confinement=confinement[0], detail=detail[:500],
                    error=detail[:2000] if outcome == "error" else None)
