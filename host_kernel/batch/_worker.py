"""The worker side: one attempt of one task, from claiming its folder to its summary.

Owns :class:`Settings` (what every task of a batch is run with, sent with each task),
:func:`run_task` (what a Dask worker runs: claim the next attempt folder, copy the inputs
in, run the notebook or the agent on a Host from its worker's pool, write the signed
status file) and the two runners. It does not own the pool itself (:mod:`._plugin`, which
imports Dask), submitting tasks or accounting for reruns (:mod:`._driver`), the Host or
the agent loop. The attempt protocol is in the package's docstring.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hmac
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._errors import TaskInvalid
from ._summary import ArtifactBrief, TaskSummary, VerdictBrief
from ._tasks import Task, _nbformat

if TYPE_CHECKING:  # pragma: no cover
    from ..host._options import HostOptions

__all__ = ["FAILED_STATUSES", "Settings", "run_task"]

#: Observation statuses that count as a failed cell (as ``host-kernel exec`` counts them).
FAILED_STATUSES = frozenset({"error", "timeout", "kernel_died"})


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

    return HostOptions(front="batch", pool=pool, hide_paths=_hidden(settings),
                       hide_env=_hidden_env(settings), **_store_arguments(settings))


def run_task(task: Task, settings: Settings) -> TaskSummary:
    """Run one attempt of ``task`` here (in a Dask worker, with its pool; or in this process)
    and return its summary. Never raises for the task's own failures: they are its
    outcome."""
    t0 = time.monotonic()
    from ._plugin import plugin_name, worker_pool  # imports Dask: a worker has it

    pool, worker = worker_pool(plugin_name(settings.batch))
    folder = Path(settings.workspaces) / task.name
    _mark(Path(settings.workspaces))
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
            # The folder of the notebook itself (as `exec` runs it), less the notebook:
            # copied below under the name it was given, whatever link leads to it.
            sources = sources or [str(p) for p in sorted(nb.resolve().parent.iterdir())
                                  if p.name != nb.name and not _a_batch(str(p))
                                  and os.path.realpath(p) not in settings.skip]
        _copy_in(sources, workspace, settings.skip)
        if task.kind == "notebook":
            _copy_notebook(Path(task.source), workspace)
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
    host = Host(workspace, mode=task.mode, record_dir=record,
                options=_host_options(settings, pool))
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
