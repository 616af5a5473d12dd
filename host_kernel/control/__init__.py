"""The Jupyter front door: the control kernel, its kernelspec and its CLI commands.

Owns what a Jupyter frontend (JupyterLab, VS Code, nbclient, nbval) needs to
talk to a Host: a kernelspec that launches ``python -m host_kernel.control``
(:mod:`.kernelspec`), the relay that process runs (:mod:`.relay`), and the
``host-kernel install``, ``uninstall`` and ``export`` commands
(:mod:`.commands`). The record, the kernel and verification stay the Host's.
"""

from __future__ import annotations

from importlib import import_module

# Not typing.TYPE_CHECKING: the kernelspec's launching process imports this package.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - for type checkers and readers
    from typing import Any

__all__ = ["DISPLAY_NAME", "KERNEL_NAME", "install", "kernel_json", "uninstall"]


def __getattr__(name: str) -> Any:
    # Lazily: the control kernel's own process (``python -m host_kernel.control``) starts
    # its kernel before anything heavy is imported, and the kernelspec module brings in
    # jupyter_client whole.
    if name not in __all__:
        raise AttributeError(f"module 'host_kernel.control' has no attribute {name!r}")
    value = getattr(import_module(".kernelspec", __name__), name)
    globals()[name] = value
    return value
