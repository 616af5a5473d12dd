"""The command lines and environment a kernel is started with, and where its runtime
folders go: what starting a standby needs before jupyter_client is imported.

Owns :func:`pinned` (run a module of this installation), :func:`kernel_argv` and
:func:`standby_argv` (a kernel's and a standby's command line, behind the sandbox's
init or bare), :func:`kernel_env` and :func:`short_tempdir`. Imports nothing beyond
the standard library and the sandbox's init constants, so a process can start a
kernel before its heavy imports (host/_pool.py; control/_run.py ``early_kernel``).
host/_kernel.py starts and drives kernels with them through jupyter_client.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..sandbox.init import SPAWNER_PID

if TYPE_CHECKING:
    from ..sandbox.client import Sandbox

__all__ = ["EXTENSION", "LAUNCHER", "kernel_argv", "kernel_env", "pinned", "short_tempdir",
           "standby_argv"]

#: The extension every kernel loads before its first cell: the ``host`` object.
EXTENSION = "host_kernel.kernel.extension"
#: ipykernel's launcher less the debugger's imports (no front of ours offers it).
LAUNCHER = "host_kernel.kernel.launch"
#: This installation's ``host_kernel`` package, imported by name from its own folder.
_ROOT = str(Path(__file__).resolve().parents[2])


def pinned(module: str) -> list[str]:
    """``python -c …``: run ``MODULE.main()`` of *this* installation's host_kernel.

    Not ``-m MODULE``: that finds ``host_kernel`` on the kernel's path, where the
    session's own folders come first (the workspace for ``-m``, the package overlay
    through ``PYTHONPATH``), so a ``host_kernel/`` a cell left there would stand in for
    ours and the next kernel would not start (tests/test_confinement.py). Our folder is
    first only while the package itself imports (its ``__init__`` imports nothing
    else), then the path is as it was, and every ``host_kernel.…`` import after
    resolves through the package found here. (Not ``-P``: IPython then leaves the
    workspace off the kernel's path, and a cell could not import its own modules.)
    """
    code = (f"import sys;sys.path.insert(0,{_ROOT!r});import host_kernel;del sys.path[0];"
            f"from {module} import main;sys.exit(main())")
    return [sys.executable, "-c", code]


def kernel_argv(sandbox: Sandbox | None) -> list[str]:
    """The kernel's command line: confined behind the sandbox's init, or bare.

    Tuned for a cell path the Host records itself (docs/record.md, "What a cell
    commits"): IPython's history lives in an in-memory database, so a cell costs the
    kernel no file write, no fsync and no thread (``In``, ``Out``, ``_i``/``_iN``,
    ``%history`` and a frontend's ``history_request`` still work, for this kernel's
    cells; nothing is kept across kernels, the record is the history), and
    ipykernel's half-millisecond pause before each ``execute_reply`` is dropped (the
    Host waits for the iopub ``idle`` status, which follows every output), and the kernel
    starts without importing the debugger (:mod:`host_kernel.kernel.launch`).
    """
    argv = [*pinned(LAUNCHER), "-f", "{connection_file}",
            f"--IPKernelApp.extra_extensions={EXTENSION}",
            "--HistoryManager.hist_file=:memory:", "--Kernel._execute_sleep=0"]
    if sandbox is None:
        # parent_handle: ipykernel exits when its parent (this Host) is gone, so a
        # Host killed with SIGKILL leaves no orphan kernel behind. In a sandbox the
        # kernel's parent is init, which goes when the Host's end of its socket closes.
        return argv + [f"--IPKernelApp.parent_handle={os.getpid()}"]
    # The kernel's parent is the sandbox's spawner (pid 1 in its PID namespace), which
    # init writes in place of the placeholder; ipykernel then watches the right parent.
    return sandbox.argv(argv + [f"--IPKernelApp.parent_handle={SPAWNER_PID}"])


#: Unix socket paths are limited to 107 bytes; the kernel's IPC sockets and the call
#: socket live in runtime folders whose own path must leave room for their names.
MAX_RUNTIME_BASE = 64


def short_tempdir() -> str | None:
    """Where runtime folders go: the temp folder, unless its path is too long for
    sockets; then /tmp (for ``tempfile.mkdtemp(dir=…)``: None means the temp folder)."""
    base = tempfile.gettempdir()
    if len(base) <= MAX_RUNTIME_BASE or not os.access("/tmp", os.W_OK):
        return None
    return "/tmp"


def standby_argv(sandbox: Sandbox | None) -> list[str]:
    """A standby kernel's command line: the kernel's, started by host_kernel.kernel.standby.

    With ``-s``: a standby starts in the pool's broad domain, which may write where a
    session could plant a ``.pth`` or ``usercustomize`` in the user's site folder (a
    workspace at ``$HOME``). Python runs those at start-up, before any narrowing, so
    the standby leaves the user site off until it has narrowed to the session, then
    adds it as a fresh start would have (:func:`host_kernel.kernel.standby.user_site`).
    """
    argv = kernel_argv(sandbox)
    at = argv.index(pinned(LAUNCHER)[-1])
    argv[at] = pinned("host_kernel.kernel.standby")[-1]
    if argv[at - 1] != "-c" or argv[at - 2] != sys.executable:
        raise RuntimeError(f"unexpected kernel command line: {argv!r}")
    argv.insert(at - 1, "-s")
    return argv


def kernel_env(base: dict[str, str]) -> dict[str, str]:
    """The kernel's environment: its interpreter's bin folder first on PATH, as activated."""
    env = dict(base)
    bindir = os.path.dirname(sys.executable)
    parts = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    if not parts or parts[0] != bindir:
        parts = [bindir] + [p for p in parts if p != bindir]
    env["PATH"] = os.pathsep.join(parts)
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return env
