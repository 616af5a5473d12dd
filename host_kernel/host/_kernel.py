"""One kernel generation: a real ipykernel started through jupyter_client.

Owns starting, interrupting and stopping the ipykernel process of one
generation, over IPC sockets in a private folder, with the ``host`` extension
loaded before the first cell and the per-generation token in its environment.
It does not run cells; the Host does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager

from .._errors import KernelError
from ..sandbox.client import Sandbox, SandboxError
from ..sandbox.init import SPAWNER_PID

__all__ = ["KernelGeneration", "kernel_env"]

EXTENSION = "host_kernel.kernel.extension"


def kernel_argv(sandbox: Sandbox | None) -> list[str]:
    """The kernel's command line: confined behind the sandbox's init, or bare."""
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
            f"--IPKernelApp.extra_extensions={EXTENSION}"]
    if sandbox is None:
        # parent_handle: ipykernel exits when its parent (this Host) is gone, so a
        # Host killed with SIGKILL leaves no orphan kernel behind. In a sandbox the
        # kernel's parent is init, which goes when the Host's end of its socket closes.
        return argv + [f"--IPKernelApp.parent_handle={os.getpid()}"]
    # The kernel's parent is the sandbox's spawner (pid 1 in its PID namespace), which
    # init writes in place of the placeholder; ipykernel then watches the right parent.
    return sandbox.argv(argv + [f"--IPKernelApp.parent_handle={SPAWNER_PID}"])


class _OwnSpec(KernelSpecManager):  # type: ignore[misc]
    """Always the interpreter running the Host, with our extension: never a stray spec."""

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._argv = argv

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            argv=self._argv,
            display_name="Python 3 (host_kernel)",
            language="python",
            resource_dir="",
            metadata={"debugger": False},
        )


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


class KernelGeneration:
    """The kernel process and client of one generation."""

    def __init__(self, generation: int, token: str, conn_file: Path, cwd: Path,
                 env: dict[str, str], startup_timeout: float,
                 sandbox: Sandbox | None = None) -> None:
        self.generation = generation
        self.token = token
        self.sandbox = sandbox
        #: What init said when it started (PID namespace or why not); empty unconfined.
        self.hello: dict[str, Any] = {}
        self.manager = KernelManager(transport="ipc", connection_file=str(conn_file),
                                     kernel_spec_manager=_OwnSpec(kernel_argv(sandbox)),
                                     kernel_name="host_kernel")
        try:
            if sandbox is None:
                self.manager.start_kernel(cwd=str(cwd), env=env)
            else:
                self.manager.start_kernel(cwd=str(cwd), env=env, pass_fds=sandbox.pass_fds)
                self.hello = sandbox.started()
            self.client: BlockingKernelClient = self.manager.client()
            self.client.start_channels()
            self.client.wait_for_ready(timeout=startup_timeout)
        except (Exception, SandboxError) as exc:
            self.stop()
            raise KernelError(f"the kernel of generation {generation} did not start: {exc}") from exc

    @property
    def pid(self) -> int | None:
        prov: Any = self.manager.provisioner
        proc = getattr(prov, "process", None)
        return None if proc is None else int(proc.pid)

    def is_alive(self) -> bool:
        return bool(self.manager.is_alive())

    def interrupt(self) -> None:
        if self.is_alive():
            self.manager.interrupt_kernel()

    def stop(self) -> None:
        """Stop the kernel now and release its channels and IPC files."""
        client = getattr(self, "client", None)
        if client is not None:
            client.stop_channels()
        try:
            if self.manager.has_kernel:
                self.manager.shutdown_kernel(now=True)
        except Exception:  # already dead or never started: what matters is cleanup below
            pass
        self.manager.cleanup_resources(restart=False)
        if self.sandbox is not None:
            self.sandbox.close()
