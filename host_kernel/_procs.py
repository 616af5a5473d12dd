"""Small facts about processes, shared by the Host and the blob store, and the listening
socket the per-user servers (the kernel factory, the relay zygote) put in place."""

from __future__ import annotations

import os
import secrets
import socket

__all__ = ["listen_at", "pid_alive"]


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this machine (it may be a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, and belongs to someone else
    return True


def listen_at(path: str, kind: int, backlog: int) -> socket.socket:
    """A Unix socket of ``kind`` listening at ``path`` (mode 0600), which appears there
    only once it listens: it is bound under a name of its own in the same folder, then
    renamed onto ``path`` (replacing a dead server's). A client never finds the path
    bound but refusing, and so never takes a live server for a dead one."""
    listener = socket.socket(socket.AF_UNIX, kind)
    # Short: a Unix socket's path has room for about 107 bytes, and ``path`` may use most.
    staging = os.path.join(os.path.dirname(path), f".{os.getpid():x}-{secrets.token_hex(3)}")
    try:
        try:
            os.unlink(staging)
        except FileNotFoundError:
            pass
        listener.bind(staging)
        os.chmod(staging, 0o600)
        listener.listen(backlog)
        os.rename(staging, path)
    except BaseException:
        listener.close()
        try:
            os.unlink(staging)
        except FileNotFoundError:
            pass
        raise
    return listener
