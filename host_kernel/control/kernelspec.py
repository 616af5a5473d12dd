"""The control kernel's kernelspec: writing, installing and removing it.

Owns ``kernel.json`` for the control kernel: its argv runs
``python -P -m host_kernel.control -f {connection_file}`` with the interpreter
that installed it (so the kernel always has this package), optionally with
``--mode`` (an armed task mode) and ``--record`` (the record folder) baked in.
Installation goes through jupyter_client's ``KernelSpecManager``, so
``jupyter kernelspec list`` shows it. It does not run the kernel.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

__all__ = ["DISPLAY_NAME", "KERNEL_NAME", "install", "kernel_json", "uninstall"]

KERNEL_NAME = "host_kernel"
DISPLAY_NAME = "Python 3 (host_kernel)"


def kernel_json(*, mode: str | None = None, record: str | None = None,
                display_name: str | None = None, network: bool = True,
                require_confinement: bool = False) -> dict[str, Any]:
    """The kernelspec's contents, launching the control kernel with this interpreter."""
    # -P: the notebook's folder (the workspace, which its kernels write) stays off the
    # relay's path, so no package a cell left there is imported by this Host process.
    argv = [sys.executable, "-P", "-m", "host_kernel.control", "-f", "{connection_file}"]
    if mode:
        argv += ["--mode", mode]
    if not network:
        argv += ["--no-network"]
    if require_confinement:
        argv += ["--require-confinement"]
    if record:
        argv += ["--record", str(Path(record).resolve())]
    name = display_name or (DISPLAY_NAME if not mode else f"Python 3 (host_kernel, {mode})")
    return {
        "argv": argv,
        "display_name": name,
        "language": "python",
        # The frontend sends interrupt_request on the control channel; the relay records
        # it and passes it on. (A signal would reach the relay, which forwards it too.)
        "interrupt_mode": "message",
        "metadata": {"debugger": False, "host_kernel": {
            "mode": mode, "record": record, "network": network,
            "require_confinement": require_confinement}},
    }


def install(name: str = KERNEL_NAME, *, user: bool = False, prefix: str | None = None,
            mode: str | None = None, record: str | None = None,
            display_name: str | None = None, network: bool = True,
            require_confinement: bool = False) -> str:
    """Install the kernelspec; returns the folder it was written to.

    ``user`` installs for this user; ``prefix`` under ``PREFIX/share/jupyter``
    (``sys.prefix`` for ``--sys-prefix``); neither: the system-wide location.
    """
    with tempfile.TemporaryDirectory(prefix="host-kernel-spec-") as tmp:
        spec = Path(tmp) / name
        spec.mkdir()
        (spec / "kernel.json").write_text(json.dumps(
            kernel_json(mode=mode, record=record, display_name=display_name, network=network,
                        require_confinement=require_confinement), indent=1) + "\n")
        _copy_logos(spec)
        return str(KernelSpecManager().install_kernel_spec(str(spec), name, user=user,
                                                           prefix=prefix))


def uninstall(name: str = KERNEL_NAME) -> str:
    """Remove the kernelspec; returns the folder removed. Raises KeyError if none."""
    try:
        return str(KernelSpecManager().remove_kernel_spec(name))
    except (KeyError, NoSuchKernel):
        raise KeyError(name) from None


def _copy_logos(spec: Path) -> None:
    """ipykernel's logos, so launchers show a Python icon."""
    try:
        import ipykernel
    except ImportError:  # pragma: no cover - ipykernel is a dependency
        return
    resources = Path(ipykernel.__file__).parent / "resources"
    for logo in resources.glob("logo-*.png"):
        shutil.copy(logo, spec / logo.name)
