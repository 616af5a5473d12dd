"""The exception tree of host_kernel, shared by the Host and the kernel side.

Every refusal carries a stable ``code`` and a sentence that a person or a model
can act on. The tree::

    HostKernelError
    ├── HostCallError           a call from the kernel that the Host refused
    │   ├── CallRefused         no cell running, stale token, unknown call
    │   ├── BadArguments        wrong types, missing or malformed arguments (TypeError too)
    │   ├── PathRefused         a path outside the workspace or into the record
    │   ├── FileProblem         missing file, directory given, edit ambiguity
    │   └── StorageError        the record or blob store could not be written
    ├── SubmissionRefused       submit_output checks failed (carries the Verdict)
    ├── RecordError             the record cannot be read or is inconsistent
    │   ├── RecordRefused       a reader or writer will not use the record as it is (store/base.py)
    │   ├── ForeignEventError   events behind the Host's back stop its next append (store/base.py)
    │   └── StoreUnavailable    the ledger did not answer within the Host's store_patience
    └── KernelError             the kernel could not be started or reached
        └── ConfinementError    confinement required but unavailable, or impossible as asked

Some refusals share a class and differ by code: ``FileProblem`` with
``not_regular_file`` (a FIFO, device, socket or directory where a regular file
must be; refused without reading it), ``PathRefused`` with ``symlink_refused``
(a symlink where a file, or a folder on the way, must be), and ``StorageError``
with ``blob_missing``, ``blob_altered``, ``not_regular_file`` or
``symlink_refused`` (a blob in the store that cannot be used as it is), or
``store_unavailable`` (a remote blob store that did not answer within the Host's
``store_patience``: the same code as :class:`StoreUnavailable`, so that whoever decides
to try again later, a batch, tests one code for either store).
"""

from __future__ import annotations

# Not typing.TYPE_CHECKING: the kernelspec's launching process imports this module, and
# typing (with the re, enum and collections it brings) was a tenth of its start.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - for type checkers and readers
    from typing import Any

__all__ = [
    "BadArguments",
    "CallRefused",
    "ConfinementError",
    "FileProblem",
    "HostCallError",
    "HostKernelError",
    "KernelError",
    "PathRefused",
    "RecordError",
    "StorageError",
    "StoreUnavailable",
    "SubmissionRefused",
    "error_for_code",
]


class HostKernelError(Exception):
    """Base class of every error host_kernel raises on purpose."""

    code: str = "host_kernel_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def to_dict(self) -> dict[str, str]:
        return {"type": type(self).__name__, "code": self.code, "message": self.message}


class HostCallError(HostKernelError):
    """A call made by cell code through ``host`` that the Host did not carry out."""

    code = "call_failed"


class CallRefused(HostCallError):
    """The call arrived outside any cell, with an old token, or names no known call."""

    code = "call_refused"


class BadArguments(HostCallError, TypeError):
    """Arguments of the wrong type, missing, or out of bounds (also a ``TypeError``)."""

    code = "bad_arguments"


class PathRefused(HostCallError):
    """A path that leads outside the workspace, or into the record folder."""

    code = "path_refused"


class FileProblem(HostCallError):
    """The file is missing, is a directory, or an edit did not match exactly once."""

    code = "file_problem"


class StorageError(HostCallError):
    """The Host could not store what it was asked to (disk full, I/O error)."""

    code = "storage_error"


class SubmissionRefused(HostKernelError):
    """``submit_output`` was refused; ``verdict`` holds every check."""

    code = "submission_refused"

    def __init__(self, message: str, verdict: Any = None) -> None:
        super().__init__(message)
        self.verdict = verdict


class RecordError(HostKernelError):
    """The record could not be read, or it is not what it claims to be."""

    code = "record_error"


class StoreUnavailable(RecordError):
    """A store of the record (the ledger) could not be reached, or could not answer, for
    longer than the Host waits (``store_patience``; docs/scale.md, "When a store is
    unavailable"): nothing was appended by the operation that raised it. Unlike a refusal
    (wrong password, a missing table), trying again later may succeed."""

    code = "store_unavailable"


class KernelError(HostKernelError):
    """The kernel could not be started, reached, or restarted."""

    code = "kernel_error"


class ConfinementError(KernelError):
    """Confinement was required and is not available, or the session cannot be confined
    as asked (a record folder inside the workspace)."""

    code = "confinement_unavailable"


_BY_TYPE: dict[str, type[HostKernelError]] = {
    cls.__name__: cls
    for cls in (
        HostKernelError,
        HostCallError,
        CallRefused,
        BadArguments,
        PathRefused,
        FileProblem,
        StorageError,
        RecordError,
        StoreUnavailable,
        KernelError,
        ConfinementError,
    )
}


def error_for_code(type_name: str, code: str, message: str) -> HostKernelError:
    """Rebuild an error sent over the wire (kernel side) from its type name and code."""
    cls = _BY_TYPE.get(type_name, HostCallError)
    return cls(message, code=code)
