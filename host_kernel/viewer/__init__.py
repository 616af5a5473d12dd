"""The record viewer: ``host-kernel view``, a local, read-only web page over a record.

It serves one record folder on 127.0.0.1 behind a random token, reads it only
through :func:`~host_kernel.store.verified.open_verified` on every request,
and shows sessions, cells with their outputs, receipts, artifacts with their
lineage, and verdicts (docs/viewer.md). It never writes the record.

- :mod:`.app`: the Starlette app, its token gate, and the uvicorn server;
- :mod:`.pages`: what each page shows, read from the verified projection;
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
