"""The record viewer: ``host-kernel view``, a local, read-only web page over a record.

It serves one record folder on 127.0.0.1 behind a random token, reads it on
every request only from a projection :func:`~host_kernel.store.verified.open_verified`
built from bytes proved unchanged, and shows sessions, cells with their outputs,
receipts, artifacts with a preview and their lineage, and verdicts with what
changed between them (docs/viewer.md). It never writes the record.

- :mod:`.app`: the Starlette app, its token gate, and the uvicorn server;
- :mod:`.reads`: the verified reads every request goes through;
- :mod:`.sessions`: the sessions list and a session's pages of cells;
- :mod:`.verdicts`: a verdict, what it rests on, and the diff between submissions;
- :mod:`.pages`: outputs, receipts, the artifact page, links, checked blob bytes;
- :mod:`.preview`, :mod:`.graph`, :mod:`.derivation`: an artifact's preview, its
  lineage drawing's links and legend, its slice and re-derivations;
- :mod:`.commands`: the ``view`` subcommand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import ViewerServer, create_app, serve_in_thread

__all__ = ["ViewerServer", "create_app", "serve_in_thread"]


def __getattr__(name: str) -> Any:
    # Imported on first use: every `host-kernel` command loads .commands, and only `view`
    # needs the web stack.
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
