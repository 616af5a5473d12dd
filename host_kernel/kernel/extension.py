"""The IPython extension that puts ``host`` into the kernel's namespace.

Loaded at kernel start-up by ``--IPKernelApp.extra_extensions`` (the documented
way; no class swapping), before the first cell. In a session the Host does
not trace at the OS level, it also installs the audit-hook capture and reports
each cell's file accesses to the Host through IPython's ``pre_run_cell`` /
``post_run_cell`` events. Outside a Host it does nothing.
"""

from __future__ import annotations

import os
from typing import Any

from .client import HostClient
from .launch import allow_debugger

__all__ = ["load_ipython_extension"]


CONFINED_NOTE = (
    "host_kernel: this kernel is confined by the operating system (Landlock). Cell code and "
    "host.bash commands may write only inside the workspace and $TMPDIR (a private temp "
    "folder); the record, the interpreter and the rest of the machine are read-only or hidden. "
    "Use host.write_file for workspace files, and `pip install` lands in the session's own "
    "package folder. See docs/security.md.")


def _explain_confinement(shell: Any, etype: type[BaseException], value: BaseException,
                         tb: Any, tb_offset: int | None = None) -> Any:
    """Show a PermissionError as usual, with a note saying why it happened here."""
    if CONFINED_NOTE not in getattr(value, "__notes__", ()):
        value.add_note(CONFINED_NOTE)
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    return None


def load_ipython_extension(ip: Any) -> None:
    allow_debugger()  # the kernel is built without it; a cell may import debugpy again
    client = HostClient.from_env()
    if client is None:
        return
    ip.push({"host": client})
    if os.environ.get("HOST_KERNEL_CONFINED") == "1":
        ip.set_custom_exc((PermissionError,), _explain_confinement)
    workspace = os.environ.get("HOST_KERNEL_WORKSPACE")
    if not workspace or os.environ.get("HOST_KERNEL_TRACED") == "1":
        return  # no workspace to watch, or the Host traces file access itself
    from .capture import Capture

    capture = Capture(os.path.realpath(workspace), ignore=[])
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
