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
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["allow_debugger", "skip_debugger"]

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


def main() -> None:
    # As ipykernel_launcher does: the start folder off the path while ipykernel imports
    # (IPython's init_path puts '' back, which is then the session's workspace).
    if sys.path and (sys.path[0] == "" or sys.path[0] == os.getcwd()):
        del sys.path[0]
    skip_debugger()
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
