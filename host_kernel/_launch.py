"""The launching side of the user's zygote: a launch asks for a fork, or runs itself.

``python -m host_kernel.control`` (the kernelspec's process) and ``host-kernel exec``
(:func:`console`, the console script) call :func:`launch` before anything heavy is
imported. Where the user's zygote
(host_kernel/control/_zygote.py, which says what is served and why) forks a process for
the launch, this process stays the launch's: it passes signals on, watches its frontend,
and exits with the fork's status. Otherwise :func:`launch` returns None and the caller
runs the launch itself, as before.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # (no stub; the enum-free signal module)
import _socket
import json
import os
import select
import sys

from ._fds import recv_fds, send_fds

# This module is the kernelspec's launching process (and ``exec``'s) before it asks the
# zygote: it imports no more than it needs. typing, socket, signal, array and pathlib (the
# enums, re and collections they bring) were a third of that process's start in an
# installed package; the raw modules do what it needs of them.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - for type checkers and readers
    from pathlib import Path
    from typing import Any

    from .factory._place import Place

__all__ = ["ENTRIES", "console", "launch", "read_line", "socket_path", "startup"]

#: Seconds a launching process waits to connect, then for the fork's answer.
CONNECT_TIMEOUT = 1.0
REPLY_TIMEOUT = 5.0
#: Variables Python reads once, at start (with these, ``PYTHON*``).
STARTUP_VARS = ("LANG", "HOME")
#: Signals the launching process passes on to its relay.
FORWARDED = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP, _signal.SIGQUIT,
             _signal.SIGUSR1, _signal.SIGUSR2)


def startup() -> dict[str, Any]:
    """What this interpreter's start decided, as JSON: two processes that agree on it
    import the same modules the same way."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("PYTHON", "LC_")) or k in STARTUP_VARS}
    # safe_path (-P) decides only sys.path's first entry, which is compared on its own
    # (Zygote._path_refusal).
    flags = {name: getattr(sys.flags, name) for name in dir(sys.flags)
             if not name.startswith("_") and name not in ("count", "index", "n_fields",
                                                          "n_sequence_fields",
                                                          "n_unnamed_fields", "safe_path")}
    from .factory._place import interpreter

    facts = {"python": interpreter(), "flags": flags,
             "xoptions": sorted(sys._xoptions.items()), "warnoptions": sys.warnoptions,
             "env": env}
    out: dict[str, Any] = json.loads(json.dumps(facts, default=str))
    return out


def socket_path(place: Place) -> Path:
    """The zygote's socket: beside the factory's, keyed as it is."""
    from pathlib import Path

    return Path(socket_file(place))


def socket_file(place: Place) -> str:
    """:func:`socket_path` as a string (the launching process's own use)."""
    return os.path.join(place.path, place.socket_name.replace("factory-", "relay-", 1))


def read_line(sock: Any, limit: int = 1 << 20,
              deadline: float | None = None) -> tuple[bytes, list[int]]:
    """One newline-ended message of at most ``4 * limit`` bytes, and the descriptors
    that came with its first part; by ``deadline`` (``time.monotonic``), if given."""
    import time

    data, fds = recv_fds(sock, limit, 4)
    while data and not data.endswith(b"\n"):
        left = None if deadline is None else deadline - time.monotonic()
        if len(data) > 4 * limit or (left is not None and left <= 0):
            for fd in fds:
                os.close(fd)
            raise ValueError("a message too long or too slow")
        if left is not None:
            sock.settimeout(left)
        more = sock.recv(limit)
        if not more:
            break
        data += more
    return data, list(fds)


class _NotServed(Exception):
    pass


#: What a fork may run: the control kernel's relay, or a ``host-kernel`` command.
ENTRIES = ("control", "cli")


def launch(argv: list[str], entry: str = "control") -> int | None:
    """Run this launch (the control kernel's relay; with ``entry="cli"``, the
    ``host-kernel`` command ``argv``) in a process the zygote forks: its exit status;
    None when it is not served (the caller runs it itself)."""
    from .factory._place import FactoryUnavailable, Place, disabled

    if disabled() or not hasattr(os, "pidfd_open"):
        return None  # turned off, or not Linux (5.3 or later): no pidfds to pin a fork by
    try:
        place = Place()
        place.ensure()
    except FactoryUnavailable:
        return None
    path = socket_file(place)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        _start(place)  # for the next launch (a restart is the next)
        return None
    what = "relay" if entry == "control" else "command"
    try:
        return _served(sock, argv, entry)
    except _NotServed as why:
        sys.stderr.write(f"host_kernel: {what} run here, not forked ({why})\n")
        return None
    except (OSError, ValueError) as exc:  # a zygote that died or answered nonsense
        sys.stderr.write(f"host_kernel: {what} run here, not forked ({exc})\n")
        return None
    finally:
        sock.close()


def _served(sock: Any, argv: list[str], entry: str) -> int:
    request = {"entry": entry, "argv": argv, "argv0": sys.argv[0] if sys.argv else "",
               "cwd": os.getcwd(), "env": dict(os.environ), "umask": _umask(),
               "path": sys.path, "executable": sys.executable, "startup": startup()}
    sock.settimeout(REPLY_TIMEOUT)
    send_fds(sock, json.dumps(request).encode() + b"\n", [0, 1, 2])
    data, fds = read_line(sock)
    reply = json.loads(data)
    if not isinstance(reply, dict) or "pid" not in reply or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise _NotServed(reply.get("refused") if isinstance(reply, dict) else "no answer")
    relay = fds[0]  # a pidfd: signals reach this relay, never a recycled pid
    sock.sendall(b"go\n")  # from here on the relay is this kernel's; no turning back

    def forward(signum: int, _frame: object) -> None:
        try:
            _signal.pidfd_send_signal(relay, signum)
        except OSError:
            pass  # already gone

    for signum in FORWARDED:
        _signal.signal(signum, forward)
    code = _wait(sock, relay, forward)
    os.close(relay)
    if not isinstance(code, int):
        code = 1
    if code < 0:  # killed by a signal: end the same way
        for signum in FORWARDED:
            _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _wait(sock: Any, relay: int, forward: Any) -> object:
    """The relay's exit status, as the zygote reports it (None if it cannot). Meanwhile,
    as ipykernel and a launched relay do: when the frontend that launched this process
    (``JPY_PARENT_PID``, this process's parent) is gone, the relay is asked to stop."""
    named = os.environ.get("JPY_PARENT_PID", "")
    parent = int(named) if named.isdigit() and int(named) == os.getppid() else 0
    sock.settimeout(None)
    while True:
        ready, _, _ = select.select([sock], [], [], 1.0)
        if ready:
            try:
                data, _ = read_line(sock)
                return json.loads(data)["exit"] if data else _ended(relay)
            except (OSError, ValueError, KeyError, TypeError):
                return _ended(relay)
        if parent and os.getppid() != parent:
            forward(_signal.SIGTERM, None)
            parent = 0


def _ended(relay: int) -> int:
    """The zygote is gone before it said how the relay ended: wait for the relay itself
    (its status is the zygote's to know: 1)."""
    select.select([relay], [], [])
    return 1


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _start(place: Any) -> None:
    """Start the zygote in the background (it detaches; of two started at once, the second
    finds the lock taken and exits)."""
    import subprocess
    import threading

    from .host._kernel import pinned

    argv = pinned("host_kernel.control._zygote")
    argv.insert(1, "-P")  # as the kernelspec's launch: no start folder on the path
    try:
        with open(socket_file(place)[:-len(".sock")] + ".log", "ab") as log:
            proc = subprocess.Popen([*argv, "--folder", place.path],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/",
                                    start_new_session=True, close_fds=True)
    except OSError:
        return  # the next launch runs its own relay too
    # It forks and its first process exits at once: reap that one, off this launch's path.
    threading.Thread(target=proc.wait, daemon=True, name="host-kernel-zygote-start").start()


def console() -> int:
    """The ``host-kernel`` console script (and ``python -m host_kernel``): ``exec`` forked
    by the user's zygote where one serves, before the command line is even imported;
    anything else, or a launch not served, runs here (host_kernel/cli.py)."""
    words = sys.argv[1:]
    if words[:1] == ["exec"]:
        code = launch(words, entry="cli")
        if code is not None:
            return code
    from .cli import main

    return main()
