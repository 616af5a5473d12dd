"""host_kernel: a Jupyter kernel driven by a Host that records and verifies.

The public surface is re-exported here; everything else is private.
"""

from ._errors import (
    BadArguments,
    CallRefused,
    FileProblem,
    HostCallError,
    HostKernelError,
    KernelError,
    PathRefused,
    RecordError,
    StorageError,
    SubmissionRefused,
)
from ._models import Artifact, Check, FileChange, FileRecord, Observation, Receipt, Verdict
from ._version import __version__
from .host._host import Host, HostState
from .modes import TaskMode, resolve_task_mode

__all__ = [
    "Artifact",
    "BadArguments",
    "CallRefused",
    "Check",
    "FileChange",
    "FileProblem",
    "FileRecord",
    "Host",
    "HostCallError",
    "HostKernelError",
    "HostState",
    "KernelError",
    "Observation",
    "PathRefused",
    "Receipt",
    "RecordError",
    "StorageError",
    "SubmissionRefused",
    "TaskMode",
    "Verdict",
    "__version__",
    "resolve_task_mode",
]
