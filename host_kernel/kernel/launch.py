"""``python -m host_kernel.kernel.launch -f FILE …``: ipykernel's launcher, without the debugger.

Every kernel a Host starts cold runs this in place of ``ipykernel_launcher`` (a
standby runs :mod:`.standby`, which does the same before its imports). No front of
ours offers the debugger (docs/jupyter.md: the kernelspec says ``debugger: false``
and the relay takes it out of ``kernel_info_reply``), yet ipykernel imports
``debugpy`` while it builds its kernel, to learn whether one could be offered: a
fifth of a kernel's imports, paid by every session for nothing.

:func:`skip_debugger` refuses the imports of ``debugpy`` while the kernel is built,
so ipykernel finds none and starts without it (``_is_debugpy_available`` false);
:func:`allow_debugger`, called by our extension once the kernel exists, takes the
refusal back, so a cell may still ``import debugpy`` as anywhere else. Nothing in
this module decides anything: it only saves the kernel work.

:func:`unbounded_iopub` takes ZeroMQ's default limit of 1,000 queued messages off the
kernel's IOPub socket: past it a publisher drops messages silently, and a Host reading
late (a loaded machine) lost outputs and even a cell's ``idle`` status, and waited on.
What the Host keeps of a cell's outputs is bounded by its own budget.

:func:`no_interface_scan` keeps the kernel from listing the machine's network
interfaces while it reads its connection file: jupyter_client works out the default
address (``localhost()``, which imports ``psutil`` and asks it for every interface)
even when the file names the address, as every connection file of ours does. That was
a quarter of a warm kernel's start after its orders.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["allow_debugger", "no_interface_scan", "skip_debugger", "unbounded_iopub"]

#: The top-level packages a kernel does not import while it starts.
SKIPPED = frozenset({"debugpy", "_pydevd_bundle", "pydevd"})


class _SkipAtStart(importlib.abc.MetaPathFinder):
    """Answers "no such module" for :data:`SKIPPED`, until taken out of ``sys.meta_path``.
    Known by this attribute, not its class: run with ``-m``, this module is ``__main__``
    as well as itself, and each has a class of its own."""

    host_kernel_skip_at_start = True

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname.partition(".")[0] in SKIPPED:
            raise ModuleNotFoundError(f"No module named {fullname!r} (while the kernel starts)",
                                      name=fullname)
        return None


def skip_debugger() -> None:
    """Refuse ``debugpy``'s imports from now until :func:`allow_debugger`."""
    if not any(getattr(f, "host_kernel_skip_at_start", False) for f in sys.meta_path):
        sys.meta_path.insert(0, _SkipAtStart())


def allow_debugger() -> None:
    """Take back :func:`skip_debugger`: later imports of ``debugpy`` work as usual."""
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not getattr(f, "host_kernel_skip_at_start", False)]


def unbounded_iopub() -> None:
    """Have ``IPKernelApp`` make its IOPub socket (and the sockets made after it in its
    context) with no send limit, before it binds it: an option set after a subscriber
    connected would not reach that subscriber's queue."""
    import zmq
    from ipykernel import kernelapp

    app: Any = kernelapp.IPKernelApp
    made = app.init_iopub
    if getattr(made, "host_kernel_unbounded", False):
        return

    def init_iopub(self: Any, context: Any) -> None:
        context.setsockopt(zmq.SNDHWM, 0)
        made(self, context)

    init_iopub.host_kernel_unbounded = True  # type: ignore[attr-defined]
    app.init_iopub = init_iopub


def no_interface_scan() -> None:
    """Have ``IPKernelApp`` read a connection file that names its address without first
    working out the default one (``info.get("ip", self._ip_default())`` in
    jupyter_client's ``load_connection_info`` computes it either way). A file without an
    address still gets the default, computed as before."""
    from ipykernel import kernelapp

    app: Any = kernelapp.IPKernelApp
    load = app.load_connection_info
    if getattr(load, "host_kernel_no_scan", False):
        return

    def load_connection_info(self: Any, info: Any) -> None:
        if not isinstance(info, dict) or not isinstance(info.get("ip"), str):
            load(self, info)
            return
        named = info["ip"]
        self.__dict__["_ip_default"] = lambda: named  # read once, by load below
        try:
            load(self, info)
        finally:
            self.__dict__.pop("_ip_default", None)

    load_connection_info.host_kernel_no_scan = True  # type: ignore[attr-defined]
    load_connection_info.__wrapped__ = load  # type: ignore[attr-defined]
    app.load_connection_info = load_connection_info


def main() -> None:
    # As ipykernel_launcher does: the start folder off the path while ipykernel imports
    # (IPython's init_path puts '' back, which is then the session's workspace).
    if sys.path and (sys.path[0] == "" or sys.path[0] == os.getcwd()):
        del sys.path[0]
    skip_debugger()
    unbounded_iopub()
    no_interface_scan()
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
