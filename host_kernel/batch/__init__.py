"""Many sessions at once: notebooks and agent tasks as the tasks of a Dask cluster.

Owns the batch API: :class:`Task` (what to run), :class:`TaskSummary` (how one
ended), :class:`BatchResult`, :func:`run_batch` (the driver: it submits, reports
each task as it finishes, and accounts for reruns) and :func:`run_task` (what a
worker does with one task). It does not own the Host, the agent loop, the
ledger, the blob store or the command line (``host-kernel batch``,
:mod:`.commands`). docs/scale.md draws the whole picture.

What a worker does with a task, every time it is given one (an **attempt**):

1. looks for an earlier attempt of the task whose session its record shows accepted
   (a worker that died after the verdict): then that summary is returned, and nothing
   runs again;
2. claims the next attempt folder ``<workspaces>/<name>/attempt-<n>`` (an
   exclusive ``mkdir``: a rerun never reuses the folder of an earlier attempt, nor a
   record folder an earlier batch left) and copies the task's inputs into it: the
   fresh workspace;
3. starts a Host there, warm from its worker's :class:`~host_kernel.HostPool`,
   confined as every Host is, writing its record to ``<records>/<name>/attempt-<n>``,
   to the PostgreSQL ledger (``ledger=``) or, by default, to the workspace's own
   record folder, named after the task (``<name>-attempt-<n>-<hash>``); a new session
   each time;
4. runs it: a notebook's non-empty code cells in order through ``Host.execute``,
   stopping at the first that fails (``error``, ``timeout`` or ``kernel_died``);
   an agent task through :func:`~host_kernel.agent.loop.run_agent`;
5. closes the Host and reads the session back from its record through the verified
   reader (:mod:`._ledger`): the summary's outcome, verdicts, artifacts and head are
   the record's word, whatever the worker's Python state held (an exception after an
   accepted verdict leaves the task ``accepted``), and a task not accepted says why in
   one line, its ``cause`` (the refusal code and its message);
6. returns the :class:`TaskSummary` (plain data).

Beside the attempt folder, outside the workspace (where the confined kernel cannot
write), ``attempt-<n>.json`` says ``running`` (with the session id and its record) from
the start and holds the summary once the attempt finished. When a worker dies, the
scheduler gives its tasks to another worker, up to ``retries`` times: the rerun first
reads the dead attempt's session from its record, and returns it when it was accepted;
else it claims the next attempt folder and starts a new session; the dead attempt's
session, half written, is left to the ledger's housekeeping and listed in the
summary's ``abandoned``. A task whose attempt had finished but whose result died with
its worker is not run again: the rerun returns the summary its ``attempt-<n>.json``
holds. A task that only waited on the dead worker (no attempt folder yet), or whose
Host could not start because a store was unavailable (:class:`TaskNotStarted`; the
attempt's folder is removed), is submitted again without spending one.

A batch run again over the same ``records`` folder, or continued in its own workspaces
folder (``resume=True``, ``host-kernel batch --resume DIR``), skips each task an earlier
session of which its record shows accepted (``skipped``) and runs the rest.

Outcomes: ``accepted``; ``ran`` (a notebook that submitted nothing: every code cell ran
``ok``, and no verdict accepted anything); ``failed`` (the work ran and was not
accepted); ``error`` (it could not run: the Host did not start, the provider failed, the
worker died more often than ``retries`` allows, its record could not be read back). A
notebook is accepted when no code cell failed (as above) and every ``host.submit_output``
it made was accepted, at least one; one that submits nothing ``ran`` (as ``host-kernel
exec`` exits 0 for it, the batch does). An agent task is accepted when its session ended
with an accepted completion, which its record holds. ``accepted`` and ``ran`` are done:
a rerun, a resume or another worker does not run them again.

Errors (the tree is drawn in :mod:`._errors`): :class:`BatchError`, the batch cannot run
as asked; :class:`TaskInvalid`, a task that cannot run; :class:`SchedulerUnreachable`, no
Dask scheduler answered; :class:`TaskNotStarted`, what a worker raises to have a task
submitted again.

Layout: this root only re-exports. :mod:`._tasks` (Task, task files, the checks made
before anything starts, the task list kept for ``--resume``), :mod:`._summary`
(TaskSummary, BatchResult), :mod:`._status` (attempt status files), :mod:`._ledger` (the
record's word on a session, and a task's earlier accepted sessions), :mod:`._worker`
(Settings, run_task: one attempt, on a worker), :mod:`._plugin` (each worker's pool; it
imports Dask), :mod:`._driver` (run_batch, local_cluster). ``import host_kernel.batch``
never imports Dask: only running a batch does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._driver import DEFAULT_RETRIES as DEFAULT_RETRIES
from ._driver import MAX_REQUEUES as MAX_REQUEUES
from ._driver import local_cluster, run_batch
from ._errors import BatchError, SchedulerUnreachable, TaskInvalid, TaskNotStarted
from ._status import _signature as _signature  # not the API: for the tests of status files
from ._summary import OUTCOMES as OUTCOMES
from ._summary import ArtifactBrief, BatchResult, TaskSummary, VerdictBrief
from ._tasks import KINDS as KINDS
from ._tasks import Task, load_tasks
from ._worker import FAILED_STATUSES as FAILED_STATUSES
from ._worker import Settings, run_task
from ._worker import _claim as _claim  # not the API: for the tests of status files

if TYPE_CHECKING:
    from ._plugin import PoolPlugin

__all__ = ["ArtifactBrief", "BatchError", "BatchResult", "PoolPlugin", "SchedulerUnreachable",
           "Settings", "Task", "TaskInvalid", "TaskNotStarted", "TaskSummary", "VerdictBrief",
           "load_tasks", "local_cluster", "run_batch", "run_task"]


def __getattr__(name: str) -> Any:
    # PoolPlugin subclasses Dask's WorkerPlugin, so importing it imports Dask: only on use.
    if name == "PoolPlugin":
        from ._plugin import PoolPlugin

        return PoolPlugin
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
