"""Descriptors passed over a Unix socket, with the raw ``_socket`` module only.

Owns the two helpers every process of ours that hands descriptors to another uses
without ``socket.py`` (whose enums cost the sandbox's init and the kernelspec's
launching process more than the rest of their start): sandbox init and its Host side
(host_kernel/sandbox/init.py), the launching process and the relay zygote
(host_kernel/_launch.py). ``socket.recv_fds`` also drops its ``flags`` in 3.11.
"""

from __future__ import annotations

import _socket
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - for type checkers and readers
    from typing import Any

__all__ = ["recv_fds", "send_fds"]

#: Bytes of a C int, as SCM_RIGHTS carries each descriptor.
_INT = 4


def send_fds(sock: Any, data: bytes, fds: list[int]) -> None:
    """``data`` and the descriptors ``fds`` in one message."""
    packed = b"".join(fd.to_bytes(_INT, sys.byteorder, signed=True) for fd in fds)
    sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, packed)])


def recv_fds(sock: Any, size: int, most: int, flags: int = 0) -> tuple[bytes, list[int]]:
    """Up to ``size`` bytes and up to ``most`` descriptors that came with them; any
    beyond the first ``most`` are closed, never leaked."""
    data, ancdata, _, _ = sock.recvmsg(size, _socket.CMSG_SPACE(most * _INT), flags)
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i:i + _INT], sys.byteorder, signed=True)
                    for i in range(0, len(payload) - _INT + 1, _INT)]
    for fd in fds[most:]:
        os.close(fd)
    return data, fds[:most]
