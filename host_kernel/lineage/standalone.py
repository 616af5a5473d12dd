"""A stand-in ``host`` for a slice run as a plain script, outside a host-kernel kernel.

A slice written by ``host-kernel slice -o make_figure.py`` keeps its cells' calls to
``host`` (``host.bash``, ``host.write_file``, ``host.save_artifact``). In a
host-kernel kernel they go to the Host, which records them; run as a script
(``python make_figure.py``, or ``ipython`` when it uses ``%run``), the script takes
this stand-in, which does the same work locally and records nothing: a command runs
in a shell and its exit status is returned, a saved artifact is just its file's path
and sha256. Nothing here is evidence; it only lets the program run.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["host"]


@dataclass(frozen=True)
class LocalResult:
    command: str
    exit_status: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class LocalArtifact:
    path: str
    sha256: str
    artifact_id: str = "(not recorded: run outside a host-kernel kernel)"


class _LocalHost:
    """The subset of the kernel's ``host`` a slice's cells call, done locally."""

    def bash(self, command: str, timeout: float | None = None, **_: Any) -> LocalResult:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                              timeout=timeout, check=False)
        return LocalResult(command, done.returncode, done.stdout, done.stderr)

    def write_file(self, path: str, content: str | bytes, **_: Any) -> str:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")
        return str(target)

    def read_file(self, path: str, **_: Any) -> str:
        return Path(path).read_text(encoding="utf-8")

    def save_artifact(self, path: str, *_: Any, **__: Any) -> LocalArtifact:
        return LocalArtifact(str(path), hashlib.sha256(Path(path).read_bytes()).hexdigest())

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"host.{name} needs a host-kernel kernel: run this slice with "
                             f"`host-kernel exec` (write it with --notebook)")


host = _LocalHost()
