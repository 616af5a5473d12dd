"""The IPython extension that puts ``host`` into the kernel's namespace.

Loaded at kernel start-up by ``--IPKernelApp.extra_extensions`` (the documented
way; no class swapping), before the first cell. It also installs the audit-hook
capture and reports each cell's file accesses to the Host through IPython's
``pre_run_cell`` / ``post_run_cell`` events. Outside a Host it does nothing.
"""

from __future__ import annotations

import os
from typing import Any

from .client import HostClient

__all__ = ["load_ipython_extension"]


def load_ipython_extension(ip: Any) -> None:
    client = HostClient.from_env()
    if client is None:
        return
    ip.push({"host": client})
    workspace = os.environ.get("HOST_KERNEL_WORKSPACE")
    if not workspace:
        return
    from .capture import Capture

    ignore = [p for p in (os.environ.get("HOST_KERNEL_RECORD"),) if p]
    capture = Capture(os.path.realpath(workspace), ignore=ignore)
    capture.install()
    client._capture = capture

    def before(info: Any) -> None:
        capture.begin("cell")

    def after(result: Any) -> None:
        access = capture.end()
        if access.reads or access.writes or access.removes or access.renames \
                or access.subprocesses:
            client._report_access(access.to_dict())

    ip.events.register("pre_run_cell", before)
    ip.events.register("post_run_cell", after)
