"""What outlives one relay process: the restart marker and the runtime-folder sentinel.

A frontend restarts a kernelspec kernel by ending the process it launched (the
relay) and launching another with the same connection file. Owns the two
things that bridge that gap: the **marker** a relay leaves in the record folder
when asked to restart, which the next relay takes to continue the same session
(its contents and checks are :class:`~host_kernel.host._relay_support.ResumeState`'s);
and the **sentinel**, a tiny process beside the relay that removes the Host's
runtime folder when the relay ends, even by SIGKILL (nbval kills its kernels).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ..host._relay_support import ResumeState

__all__ = ["MARKER_TTL", "leave_marker", "marker_path", "start_sentinel", "take_marker"]

#: A marker older than this is ignored: no relay came to continue the session.
MARKER_TTL = 120.0

#: The sentinel: blocks until the relay's end of its stdin pipe closes, however the
#: relay ended, then removes the folder.
_SENTINEL = ("import shutil, sys\n"
             "sys.stdin.buffer.read()\n"
             "shutil.rmtree(sys.argv[1], ignore_errors=True)\n")


def marker_path(record_dir: Path, connection_file: str, key: bytes) -> Path:
    """Where a relay leaves its session for the relay the frontend starts after a restart.

    Keyed by the connection file and its key, which a restart keeps, inside the
    record folder, which cell code cannot write.
    """
    tag = hashlib.sha256(os.path.realpath(connection_file).encode() + b"\0" + key).hexdigest()
    return record_dir / "relay" / f"{tag[:32]}.json"


def leave_marker(path: Path, state: ResumeState) -> None:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({**state.to_dict(), "written": time.time()}, f)


def take_marker(path: Path) -> ResumeState | None:
    """Read and remove a fresh marker; None when there is none (or only a stale one)."""
    try:
        data = json.loads(path.read_text())
        path.unlink()
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or time.time() - float(data.get("written", 0)) > MARKER_TTL:
        return None
    try:
        return ResumeState.from_dict(data)
    except (KeyError, TypeError, ValueError):
        return None


def start_sentinel(folder: Path) -> subprocess.Popen[bytes]:
    """Start the sentinel for ``folder``; close its stdin (or die) to set it off."""
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", _SENTINEL, str(folder)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
