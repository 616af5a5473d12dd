"""A Host's options: one frozen, typed record, validated where it is built.

Owns every keyword a :class:`~host_kernel.host._host.Host` takes beyond its
workspace, mode, request and record folder: their defaults (documented on each
field), their checks (a wrong type or value is :class:`BadArguments` with a
sentence saying what is wanted), and what follows from them (which environment
variables are the Host's own secrets, the bounds of a reproduction). It does not
own what a session does with them.

``Host(workdir, network=False)`` builds one; a front that starts many Hosts (the
agent loop, the batch, the MCP server) builds one ``HostOptions`` and passes it
as ``Host(workdir, options=opts)``, with keywords on top where they differ.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from .._errors import BadArguments
from ..reproduce import Limits
from ..reproduce.runner import DEFAULT_MEMORY
from ..sandbox.limits import KernelLimits
from ..store.pg import is_postgres_url
from ..store.retry import DEFAULT_PATIENCE
from ._keep import DEFAULT_INPUT_BUDGET
from ._pool import HostPool
from ._render import DEFAULT_TEXT_LIMIT

__all__ = ["BLOB_ENV", "PG_ENV", "HostOptions"]

#: libpq's environment: where the database is, and the credentials that open it. With a
#: PostgreSQL ledger none of it reaches the kernel (docs/trust.md).
PG_ENV = frozenset({"PGPASSWORD", "PGPASSFILE", "PGSERVICE", "PGSERVICEFILE", "PGSSLKEY",
                    "PGSSLCERT", "PGSSLROOTCERT", "PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER",
                    "PGDATABASE"})

#: An object store's credentials and where to find them. With ``blobs=`` none of it
#: reaches the kernel: it could otherwise delete or overwrite the record's blobs.
BLOB_ENV = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                      "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE",
                      "AWS_CONFIG_FILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                      "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
                      "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_CONNECTION_STRING",
                      "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY",
                      "AZURE_STORAGE_SAS_TOKEN"})


#: The least each kernel limit may be set to: below these an ipykernel cannot start.
MIN_MEMORY = 256 * 2**20
MIN_PROCESSES = 64
MIN_OPEN_FILES = 256


def _paths(value: Any) -> tuple[str, ...]:
    return tuple(str(p) for p in value)


@dataclass(frozen=True, slots=True)
class HostOptions:
    """How a Host runs its session. Every field has the default a scientist wants.

    Built with keywords (``HostOptions(network=False)``) and checked at once; derive
    one from another with :meth:`with_changes`. Objects the Host uses but does not
    own (``llm``, ``pool``, ``delegator``, ``skills``) are held by reference.
    """

    #: Most characters of cell output an Observation's ``text`` shows (head and tail kept).
    text_limit: int = DEFAULT_TEXT_LIMIT
    #: Seconds to wait for a kernel to start and answer.
    startup_timeout: float = 60.0
    #: Environment variable names whose values are redacted from everything recorded.
    secret_names: tuple[str, ...] = ()
    #: Which front started the Host (``api``, ``cli``, ``jupyter``, ``agent``, ``mcp``),
    #: as the record's ``session_started`` says.
    front: str = "api"
    #: An optional LLM client (host_kernel.llm) that may narrow lineage; its key is
    #: never in the kernel's environment.
    llm: Any = None
    #: False denies the kernel and its commands TCP (Landlock ABI 4+).
    network: bool = True
    #: Refuse to start where the operating system cannot confine the kernel.
    require_confinement: bool = False
    #: Folders outside the workspace the confined kernel may read.
    read_paths: tuple[str, ...] = ()
    #: Folders the confined kernel may not even read (a sub-task's parent workspace,
    #: all of it but the folder the sub-task works in).
    hide_paths: tuple[str, ...] = ()
    #: Environment variable names kept from the kernel, beyond the Host's own secrets.
    hide_env: tuple[str, ...] = ()
    #: Seconds a reproduction of test evidence may run (None: the reproducer's default).
    reproduce_timeout: float | None = None
    #: Bytes of memory a reproduction may use (None: unbounded).
    reproduce_memory: int | None = DEFAULT_MEMORY
    #: Trace file access at the OS level (docs/lineage.md); False leaves lineage to the
    #: in-kernel audit hook, and the record says so.
    trace: bool = True
    #: Where the first kernel comes from when it is warm (host/_pool.py).
    pool: HostPool | None = None
    #: With no ``pool``, take the first kernel from the user's kernel factory (started on
    #: first use; host_kernel/factory); False, or ``HOST_KERNEL_FACTORY=off``: never.
    factory: bool = True
    #: Keep the next generation's kernel started, so a restart is a swap.
    spare: bool = False
    #: The id of a session of this record to take up again instead of starting one.
    resume: str | None = None
    #: Starts and collects sub-tasks for host.delegate/host.collect (an agent session's
    #: host_kernel.agent.delegation.Delegator); None: delegation is refused.
    delegator: Any = None
    #: The skills catalog host.skills reads (host_kernel.skills.Catalog); loaded from the
    #: three collections on first use when None.
    skills: Any = None
    #: A PostgreSQL ledger's URL (docs/scale.md); None: SQLite in the record folder.
    ledger: str | None = None
    #: The bytes of a PostgreSQL ledger's record key (else found by the ledger's id).
    ledger_key: bytes | None = None
    #: Where artifacts' blobs are written through to (an fsspec URL); None: local only.
    blobs: str | None = None
    #: Seconds each operation on a PostgreSQL ledger or a remote blob store waits for the
    #: store while it is unavailable (refused or dropped connections, a restart, 5xx,
    #: throttling), retrying with backoff; the session pauses meanwhile. Past it the
    #: operation fails with ``store_unavailable``. 0: no wait (docs/scale.md, "When a
    #: store is unavailable").
    store_patience: float = DEFAULT_PATIENCE
    #: ``codebase_change``: the git revision (commit id, branch, tag, ``HEAD~1``) the change
    #: is judged against, named by the user from outside the session and read before any
    #: kernel starts. None: the Host's own choice, trusted only when no recorded session
    #: could have written it (docs/verification.md, "baseline_untrusted").
    baseline: str | None = None
    #: Bytes of memory one kernel generation may use, all its processes together (a
    #: cgroup of its own where the system delegates one, else each process's address
    #: space); None: three quarters of the machine's memory. Reaching it ends the
    #: generation, and the record and the next Observation say so (docs/security.md).
    memory_limit: int | None = None
    #: Processes and threads of one generation, all together; None: 4096, or an eighth of
    #: the machine's ``pid_max`` where that is more. Reaching it ends the generation.
    process_limit: int | None = None
    #: Open files of each process of a generation; None: 65536 (at most the system's hard
    #: limit when the Host may not raise it).
    open_files: int | None = None
    #: Bytes of input files the session keeps in the record's blob store (each distinct
    #: content once), so the record alone can re-derive what was made from them; past it,
    #: inputs are kept by hash only, and each cell's record says which (docs/record.md,
    #: "Inputs kept"). 0 keeps none.
    input_budget: int = DEFAULT_INPUT_BUDGET
    #: The notebook file the session runs (``host-kernel exec``, a batch's notebook task):
    #: ``session_started`` records its path (workspace-relative when inside it) and the
    #: sha256 of its bytes, so an export can put its markdown cells back (docs/record.md).
    #: None: the session runs no notebook file (an agent, the API, a Jupyter frontend).
    notebook: str | None = None
    #: Derived in __post_init__: every environment variable name kept from the kernel.
    hidden_env: frozenset[str] = field(default=frozenset(), init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.network, bool):
            raise BadArguments("network must be True or False")
        if self.ledger is not None and not is_postgres_url(self.ledger):
            raise BadArguments("ledger must be a postgresql:// URL, or None for the SQLite "
                               "ledger in the record folder")
        if self.ledger_key is not None and (not isinstance(self.ledger_key, bytes)
                                            or self.ledger is None):
            raise BadArguments("ledger_key must be the bytes of a PostgreSQL ledger's record "
                               "key, given with ledger=")
        if self.blobs is not None and not isinstance(self.blobs, str):
            raise BadArguments("blobs must be an fsspec URL (s3://bucket/prefix, "
                               "file:///shared/path) or None")
        patience = self.store_patience
        if isinstance(patience, bool) or not isinstance(patience, (int, float)) or \
                not patience >= 0 or patience == float("inf"):
            raise BadArguments("store_patience must be a number of seconds of at least 0 (0: "
                               "a store that is unavailable is not waited for)")
        timeout, memory = self.reproduce_timeout, self.reproduce_memory
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise BadArguments("reproduce_timeout must be a positive number of seconds or None")
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int)
                                   or memory <= 0):
            raise BadArguments("reproduce_memory must be a positive number of bytes or None")
        for name, least, what in (("memory_limit", MIN_MEMORY, "bytes"),
                                  ("process_limit", MIN_PROCESSES, "processes"),
                                  ("open_files", MIN_OPEN_FILES, "files")):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < least):
                raise BadArguments(f"{name} must be a number of {what} of at least {least}, "
                                   f"or None for the machine's default")
        budget = self.input_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise BadArguments("input_budget must be a number of bytes of at least 0 (0 keeps "
                               "no input file's bytes)")
        if not isinstance(self.trace, bool):
            raise BadArguments("trace must be True or False")
        if self.pool is not None and not isinstance(self.pool, HostPool):
            raise BadArguments("pool must be a HostPool or None")
        if not isinstance(self.factory, bool):
            raise BadArguments("factory must be True or False")
        if not isinstance(self.spare, bool):
            raise BadArguments("spare must be True or False")
        if self.resume is not None and (not isinstance(self.resume, str) or not self.resume):
            raise BadArguments("resume must be the id of a session in the record, or None")
        if self.baseline is not None and (
                not isinstance(self.baseline, str) or not self.baseline.strip()
                or self.baseline.startswith("-") or len(self.baseline) > 256
                or any(ch in self.baseline for ch in "\0\n\r")):
            raise BadArguments("baseline must be a git revision of the workspace's repository "
                               "(a commit id, branch, tag or HEAD~N), or None")
        if self.baseline is not None and self.resume is not None:
            raise BadArguments("baseline with resume: a session's baseline is chosen when it "
                               "starts, and a resumed session keeps its own")
        if self.notebook is not None:
            if not isinstance(self.notebook, (str, os.PathLike)) or not os.fspath(
                    self.notebook):
                raise BadArguments("notebook must be the path of the notebook file the "
                                   "session runs, or None")
            object.__setattr__(self, "notebook", os.fspath(self.notebook))
        # Paths may be given as any os.PathLike; the record keeps strings.
        object.__setattr__(self, "read_paths", _paths(self.read_paths))
        object.__setattr__(self, "hide_paths", _paths(self.hide_paths))
        object.__setattr__(self, "hidden_env", frozenset(self.hide_env) | llm_key_names(
            self.llm) | (PG_ENV if self.ledger is not None else frozenset()) | (
            BLOB_ENV if self.blobs is not None else frozenset()))

    @classmethod
    def build(cls, options: HostOptions | None, changes: dict[str, Any]) -> HostOptions:
        """``options`` (or the defaults) with ``changes`` on top; an unknown name is a
        TypeError that names it, as a misspelt keyword argument is."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(cls) if f.init})
        if unknown:
            raise TypeError(f"Host() got unexpected keyword argument(s): {', '.join(unknown)}")
        if options is None:
            return cls(**changes)
        if not isinstance(options, cls):
            raise BadArguments("options must be a HostOptions")
        return options.with_changes(**changes) if changes else options

    def with_changes(self, **changes: Any) -> HostOptions:
        """A copy with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)

    @property
    def kernel_limits(self) -> KernelLimits:
        """Bounds of each kernel generation (docs/security.md), the machine's defaults
        where no option names one."""
        default = KernelLimits.defaults()
        return KernelLimits(self.memory_limit or default.memory,
                            self.process_limit or default.processes,
                            self.open_files or default.open_files)

    @property
    def reproduce_limits(self) -> Limits:
        """Bounds of each reproduction of test evidence (docs/verification.md)."""
        return Limits(self.reproduce_timeout, self.reproduce_memory)

    def llm_key_file(self) -> list[str]:
        """The file holding the Host's LLM key, which confined code must not read."""
        path = getattr(getattr(self.llm, "config", None), "api_key_file", None)
        return [path] if isinstance(path, str) and path else []


def llm_key_names(llm: Any) -> frozenset[str]:
    """The environment variable holding the Host's LLM key: the Host's secret, not the kernel's."""
    config = getattr(llm, "config", None)
    name = getattr(config, "api_key_env", None)
    return frozenset({name}) if isinstance(name, str) and name else frozenset()

