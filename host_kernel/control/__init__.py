"""The Jupyter front door: the control kernel, its kernelspec and its CLI commands.

Owns what a Jupyter frontend (JupyterLab, VS Code, nbclient, nbval) needs to
talk to a Host: a kernelspec that launches ``python -m host_kernel.control``
(:mod:`.kernelspec`), the relay that process runs (:mod:`.relay`), and the
``host-kernel install``, ``uninstall`` and ``export`` commands
(:mod:`.commands`). The record, the kernel and verification stay the Host's.
"""

from __future__ import annotations

from .kernelspec import DISPLAY_NAME, KERNEL_NAME, install, kernel_json, uninstall

__all__ = ["DISPLAY_NAME", "KERNEL_NAME", "install", "kernel_json", "uninstall"]
