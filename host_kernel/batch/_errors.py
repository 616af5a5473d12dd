"""The batch's errors: what refuses a batch before it starts, or stops it.

Owns the exception tree below; every error carries a stable ``code`` (as every
:class:`~host_kernel.HostKernelError` does) and a message a person can act on. It does not
own the failures of the tasks themselves: those are their outcomes (``failed``, ``error``)
in their :class:`~host_kernel.batch.TaskSummary`, never raised.

Errors::

    HostKernelError
    └── BatchError               the batch cannot run as asked (code ``batch_failed``)
        ├── TaskInvalid          a task that cannot run: no such notebook, an empty task,
        │                        an unknown mode, a bad task file (``task_invalid``)
        └── SchedulerUnreachable no Dask scheduler answered at the address given
                                 (``scheduler_unreachable``)
"""

from __future__ import annotations

from .._errors import HostKernelError

__all__ = ["BatchError", "SchedulerUnreachable", "TaskInvalid"]


class BatchError(HostKernelError):
    """The batch cannot run as asked."""

    code = "batch_failed"


class TaskInvalid(BatchError, ValueError):
    """A task that cannot run as given; the message names it."""

    code = "task_invalid"


class SchedulerUnreachable(BatchError):
    """No Dask scheduler answered at the address given."""

    code = "scheduler_unreachable"
