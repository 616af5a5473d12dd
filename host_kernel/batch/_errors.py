"""The batch's errors: what refuses a batch before it starts, or stops it.

Owns the exception tree below; every error carries a stable ``code`` (as every
:class:`~host_kernel.HostKernelError` does) and a message a person can act on. It does not
own the failures of the tasks themselves: those are their outcomes (``failed``, ``error``)
in their :class:`~host_kernel.batch.TaskSummary`, never raised. One error crosses from a
worker to the driver: :class:`TaskNotStarted`, which the driver answers by submitting the
task again.

Errors::

    HostKernelError
    └── BatchError               the batch cannot run as asked (code ``batch_failed``)
        ├── TaskInvalid          a task that cannot run: no such notebook, an empty task,
        │                        an unknown mode, a bad task file (``task_invalid``)
        ├── SchedulerUnreachable no Dask scheduler answered at the address given
        │                        (``scheduler_unreachable``)
        └── TaskNotStarted       an attempt's Host could not start because a store (the
                                 ledger, the blob store) was unavailable; nothing of the
                                 attempt is kept, and the driver submits the task again
                                 without spending an attempt (``store_unavailable``)
"""

from __future__ import annotations

from .._errors import HostKernelError

__all__ = ["BatchError", "SchedulerUnreachable", "TaskInvalid", "TaskNotStarted"]


class BatchError(HostKernelError):
    """The batch cannot run as asked."""

    code = "batch_failed"


class TaskInvalid(BatchError, ValueError):
    """A task that cannot run as given; the message names it."""

    code = "task_invalid"


class SchedulerUnreachable(BatchError):
    """No Dask scheduler answered at the address given."""

    code = "scheduler_unreachable"


class TaskNotStarted(BatchError):
    """An attempt could not start its session: a store was unavailable (the store
    layer's ``store_unavailable``, after its own retries). Raised by
    :func:`~host_kernel.batch.run_task` after it removed the attempt's folder, so that the
    next attempt takes the same number; its message says which task and why."""

    code = "store_unavailable"
