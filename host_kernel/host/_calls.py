"""The call channel's dispatcher: who may make a host call, and which handler serves it.

Owns the check every call from the kernel passes before any work (the token is
this generation's, a cell is running and the call carries its token, the call
exists, its arguments are an object), recording each refusal, the table of
handlers, and :class:`CallContext`, the narrow view of the session a handler is
given instead of the whole Host. The handlers themselves live in
host/_handlers.py (files, commands, artifacts, lineage, submissions) and
host/_subtasks.py (skills, sub-tasks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import BadArguments, CallRefused, HostCallError
from ..store.blobs import FileBlobStore
from ..store.ledger import Event, SQLiteLedger
from ._bash import ExecutableCache, Redactor
from ._cells import CellRunner, RunningCell
from ._generations import Generations
from ._lineage import SessionLineage
from ._options import HostOptions
from ._record import SessionRecord
from ._server import Emit
from ._session import Session
from ._workspace import HashCache, Workspace

if TYPE_CHECKING:
    from .._models import Verdict
    from ..store.pg import PostgresLedger

__all__ = ["CallContext", "Dispatcher", "Handler"]


@dataclass(slots=True)
class CallContext:
    """What a host call handler may use: the session's parts, not the Host.

    ``submit`` is the facade's verification entry (host/_submissions.py); ``skills``
    is the catalog ``host.skills`` reads, loaded on first use when not given;
    ``executables`` the PATH lookups and executables' hashes ``host.bash`` remembers.
    """

    workdir: Path
    record_dir: Path
    options: HostOptions
    record: SessionRecord
    session: Session
    generations: Generations
    cells: CellRunner
    workspace: Workspace
    lineage: SessionLineage
    redactor: Redactor
    hash_cache: HashCache
    submit: Callable[..., Verdict]
    skills: Any = None
    executables: ExecutableCache = field(default_factory=ExecutableCache)

    # The names sub-task and skill handlers read (host/_subtasks.py).
    @property
    def session_id(self) -> str:
        return self.record.session_id

    @property
    def ledger(self) -> SQLiteLedger | PostgresLedger:
        return self.record.ledger

    @property
    def blobs(self) -> FileBlobStore:
        return self.record.blobs

    @property
    def delegator(self) -> Any:
        return self.options.delegator

    @property
    def hide_paths(self) -> tuple[str, ...]:
        return self.options.hide_paths

    @property
    def running(self) -> RunningCell | None:
        return self.cells.running

    def append(self, kind: str, body: dict[str, Any]) -> Event:
        return self.record.append(kind, body)

    def own_rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return self.record.own_rows(sql, params)


#: A host call's handler: the context, the cell it is attributed to, its arguments, and
#: a way to stream output into that cell.
Handler = Callable[[CallContext, RunningCell, dict[str, Any], Emit], Any]


class Dispatcher:
    """Checks each call from the kernel and hands it to its handler."""

    def __init__(self, ctx: CallContext, handlers: dict[str, Handler]) -> None:
        self.ctx = ctx
        self.handlers = handlers

    def __call__(self, name: str, token: str | None, args: Any, emit: Emit) -> Any:
        ctx = self.ctx
        running = ctx.cells.running
        kernel = ctx.generations.kernel
        generation = None if kernel is None else kernel.generation
        refusal: str | None = None
        code = "call_refused"
        if kernel is None or token is None or token != kernel.token:
            if token is not None and token in ctx.generations.old_tokens:
                code, refusal = "stale_token", ("the call carries the token of an earlier kernel "
                                                "generation; it is refused")
            else:
                code, refusal = "bad_token", "the call carries no valid token for this kernel"
        elif running is None or running.token != token:
            code, refusal = "no_cell", ("no cell is running: the Host attributes every call to "
                                        "the cell it is executing, so calls from threads or "
                                        "timers that outlive their cell are refused")
        elif name not in self.handlers:
            code, refusal = "unknown_call", (f"there is no host call named {name!r}; known: "
                                             f"{', '.join(sorted(self.handlers))}")
        elif not isinstance(args, dict):
            raise BadArguments("call arguments must be a JSON object")
        if refusal is not None:
            # A bad or stale token says nothing about the running cell: record no cell for it.
            self._record_refusal(generation, None if code.endswith("token") else running,
                                 name, code, refusal)
            raise CallRefused(refusal, code=code)
        if running is None:
            raise CallRefused("no cell is running", code="no_cell")
        try:
            return self.handlers[name](ctx, running, args, emit)
        except HostCallError as exc:
            self._record_refusal(generation, running, name, exc.code, exc.message)
            raise

    def _record_refusal(self, generation: int | None, running: RunningCell | None, name: str,
                        code: str, reason: str) -> None:
        # Once per cause (the code, and the cell when there is one): the first in full, the
        # rest counted and their count recorded when the cell ends (host/_server.py).
        self.ctx.cells.refusals.refused(generation,
                                        None if running is None else running.cell_id,
                                        name, code, reason)
