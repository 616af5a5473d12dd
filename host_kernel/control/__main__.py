"""``python -m host_kernel.control -f CONNECTION_FILE``: the control kernel's process.

Owns reading the launch arguments and environment into a relay: the record
folder (``--record``, else ``HOST_KERNEL_RECORD``, else the workspace's default
record folder outside it, host_kernel/_paths.py), the task mode (``--mode``,
else ``HOST_KERNEL_MODE``, else none armed), confinement (``--no-network``,
``--require-confinement``) and the workspace (the working directory the frontend
started the kernel in).
"""

from __future__ import annotations

import os
import sys

from .._launch import launch

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """The kernelspec's process: its relay forked ready-imported by the user's relay zygote
    where one serves (host_kernel/control/_zygote.py), else run here."""
    args = sys.argv[1:] if argv is None else argv
    code = launch(args)
    if code is not None:
        return code
    from ._run import run  # only now: a forked launch never needs it here

    return run(args)


if __name__ == "__main__":
    code = main()
    # The session is closed or handed over, every channel shut and the sentinel done: all
    # that is left is the interpreter's own teardown (0.1 s of module cleanup here), which a
    # frontend restarting the kernel would wait out before it launches the next one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
