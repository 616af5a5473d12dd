"""The control kernel's relay, run in this process: the launch's arguments read, the
session's kernel started early, the relay served until the session ends.

Called by ``python -m host_kernel.control`` when no relay zygote serves the launch, and
by the zygote's child when one does (host_kernel/control/_zygote.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..modes import UnknownModeError, normalise_mode_name

if TYPE_CHECKING:
    from ..host._pool import HostPool
    from ..host._relay_support import RelayHost, ResumeState

#: Set to ``off`` to start every kernel cold (no standby started ahead of its session).
WARM_ENV = "HOST_KERNEL_WARM"


def early_kernel(workdir: Path) -> HostPool | None:
    """Start the session's kernel now, as a standby, before the relay imports the Host.

    The control kernel's start is serial otherwise: the relay's imports (most of the
    Host: about 0.85 s here), then the kernel's (ipykernel's stack: about 0.6 s). A
    one-shot pool (host/_pool.py, ``refill=False``) starts a standby confined to the
    workspace while this process goes on importing; the Host then takes it and
    narrows it to the session's ruleset before anything of the session runs, exactly
    as a pool's standby (docs/security.md, "Warm starts"). A session the standby cannot
    serve starts cold and its record says why. ``HOST_KERNEL_WARM=off`` turns it off.

    When the user's kernel factory is running, none of this: the Host takes its kernel
    from the factory. When it is not, it is started now, for the sessions after this
    one (a restart through the kernelspec is the next).
    """
    if os.environ.get(WARM_ENV, "").lower() in ("off", "0", "no", "false"):
        return None
    from ..factory import Place, disabled

    factory = None if disabled() else Place()
    if factory is not None and factory.socket.exists():
        return None  # the user's kernel factory serves the Host (host_kernel/factory)
    from .._errors import HostKernelError
    from ..host._pool import HostPool

    try:
        pool = HostPool(size=1, roots=[workdir], refill=False).start()
    except (HostKernelError, OSError):
        pool = None  # the Host starts its kernel cold, as without a pool
    if factory is not None:
        from ..factory._client import spawn
        from ..factory._place import FactoryUnavailable

        try:  # for the sessions after this one (a restart is the next)
            factory.ensure()
            spawn(factory)
        except (FactoryUnavailable, OSError):
            pass  # those start as this one does
    return pool


def run(argv: list[str] | None = None) -> int:
    """Read the launch's arguments, and serve the relay until the session ends."""
    parser = argparse.ArgumentParser(prog="python -m host_kernel.control",
                                     description="The host_kernel control kernel (launched by "
                                                 "a Jupyter frontend from its kernelspec).")
    parser.add_argument("-f", dest="connection_file", required=True,
                        help="the connection file the frontend wrote")
    parser.add_argument("--record", default=None, help="the record folder")
    parser.add_argument("--mode", default=None, help="arm a task mode")
    parser.add_argument("--no-network", action="store_true",
                        help="deny the kernel and its commands TCP connect and bind")
    parser.add_argument("--require-confinement", action="store_true",
                        help="refuse to start where Landlock confinement is unavailable")
    args = parser.parse_args(argv)
    try:
        with open(args.connection_file) as f:
            connection = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"host_kernel: cannot read the connection file: {exc}", file=sys.stderr)
        return 2
    mode = args.mode or os.environ.get("HOST_KERNEL_MODE") or None
    try:
        mode = None if mode is None else normalise_mode_name(mode)
    except UnknownModeError as exc:
        print(f"host_kernel: {exc}", file=sys.stderr)
        return 2
    workdir = Path.cwd()
    pool = early_kernel(workdir)
    # Only now the Host's modules, while the standby imports ipykernel beside us.
    from .._paths import default_record_dir
    from ..host._relay_support import RelayHost
    from .relay import Relay

    record = Path(args.record or os.environ.get("HOST_KERNEL_RECORD")
                  or default_record_dir(workdir)).resolve()

    def make_host(resume: ResumeState | None) -> RelayHost:
        return RelayHost(workdir, mode=mode, record_dir=record, resume=resume,
                         network=not args.no_network,
                         require_confinement=args.require_confinement, pool=pool)

    def let_go() -> None:
        if pool is not None:
            pool.close()  # a standby the session could not use stops here

    return Relay(connection, args.connection_file, record, make_host, let_go).serve()
