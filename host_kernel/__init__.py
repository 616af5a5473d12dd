"""host_kernel: a Jupyter kernel driven by a Host that records and verifies.

The public surface is re-exported here, lazily: the kernel side imports this
package too, and must not pay for the Host's imports (jupyter_client's manager,
nbformat, SQLite) at every kernel start.
"""

from __future__ import annotations

from importlib import import_module

from ._version import __version__

# Not typing.TYPE_CHECKING: importing typing costs the sandbox's init process (which
# imports this package on every kernel start) more than the rest of its start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - for type checkers and readers
    from typing import Any

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
    from .audit import AuditReport, audit
    from .host._host import Host, HostState
    from .host._pool import HostPool
    from .lineage.graph import Lineage
    from .modes import TaskMode, resolve_task_mode

_WHERE = {
    "BadArguments": "._errors",
    "CallRefused": "._errors",
    "FileProblem": "._errors",
    "HostCallError": "._errors",
    "HostKernelError": "._errors",
    "KernelError": "._errors",
    "PathRefused": "._errors",
    "RecordError": "._errors",
    "StorageError": "._errors",
    "SubmissionRefused": "._errors",
    "Artifact": "._models",
    "Check": "._models",
    "FileChange": "._models",
    "FileRecord": "._models",
    "Observation": "._models",
    "Receipt": "._models",
    "Verdict": "._models",
    "AuditReport": ".audit",
    "audit": ".audit",
    "Host": ".host._host",
    "HostState": ".host._host",
    "HostPool": ".host._pool",
    "Lineage": ".lineage.graph",
    "TaskMode": ".modes",
    "resolve_task_mode": ".modes",
}

__all__ = sorted([*_WHERE, "__version__"])


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'host_kernel' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
