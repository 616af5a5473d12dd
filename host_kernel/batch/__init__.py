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

Errors (the tree is drawn in :mod:`._errors`): :class:`BatchError`, the batch cannot run
as asked; :class:`TaskInvalid`, a task that cannot run; :class:`SchedulerUnreachable`, no
Dask scheduler answered.

Layout: this root only re-exports. :mod:`._tasks` (Task, task files, the checks made
before anything starts), :mod:`._summary` (TaskSummary, BatchResult), :mod:`._worker`
(Settings, run_task: one attempt, on a worker), :mod:`._plugin` (each worker's pool; it
imports Dask), :mod:`._driver` (run_batch, local_cluster). ``import host_kernel.batch``
never imports Dask: only running a batch does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._driver import DEFAULT_RETRIES as DEFAULT_RETRIES
from ._driver import MAX_REQUEUES as MAX_REQUEUES
from ._driver import local_cluster, run_batch
from ._errors import BatchError, SchedulerUnreachable, TaskInvalid
from ._summary import OUTCOMES as OUTCOMES
from ._summary import ArtifactBrief, BatchResult, TaskSummary, VerdictBrief
from ._tasks import KINDS as KINDS
from ._tasks import Task, load_tasks
from ._worker import FAILED_STATUSES as FAILED_STATUSES
from ._worker import Settings, run_task

# Not the public API: importable here for the tests that check a status file's signature.
from ._worker import _claim as _claim
from ._worker import _signature as _signature

if TYPE_CHECKING:
    from ._plugin import PoolPlugin

__all__ = ["ArtifactBrief", "BatchError", "BatchResult", "PoolPlugin", "SchedulerUnreachable",
           "Settings", "Task", "TaskInvalid", "TaskSummary", "VerdictBrief", "load_tasks",
           "local_cluster", "run_batch", "run_task"]


def __getattr__(name: str) -> Any:
    # PoolPlugin subclasses Dask's WorkerPlugin, so importing it imports Dask: only on use.
    if name == "PoolPlugin":
        from ._plugin import PoolPlugin

        return PoolPlugin
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
