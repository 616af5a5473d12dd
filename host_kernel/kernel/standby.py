"""``python -m host_kernel.kernel.standby -f FILE …``: a kernel started before its session.

A pool (host_kernel/host/_pool.py) starts these ahead of time. Each imports
ipykernel's stack (most of a kernel's start-up), says so by creating
``standby-ready`` beside its connection file, and waits on its standard input
for one line: the session's orders, with the session's Landlock ruleset (built
by the Host, sent over the socket that is this process's standard input). Then,
in this order and while it is still the process's only thread:

1. it narrows itself to the session's Landlock ruleset. Rulesets stack: the
   pool's domain, entered at ``execve``, stays, and the session's is added on
   top, so the kernel may touch only what both allow;
2. it takes the session's environment, working folder and import path;
3. it starts ``IPKernelApp`` with the rest of its command line, exactly as
   ``ipykernel_launcher`` would.

No code from the session runs before step 3, so no untrusted code ever runs
in the pool's broader domain. Landlock applies to the calling thread only
(until ``LANDLOCK_RESTRICT_SELF_TSYNC``), which is why nothing here may start
a thread before step 1: every thread ipykernel starts (heartbeat, IOPub,
control, ZeroMQ's I/O) inherits the narrowed domain. The standby checks that it
is alone, and refuses to go on otherwise.

End of input before the orders means the pool let this standby go: it exits.
"""

from __future__ import annotations

import json
import os
import sys

READY = "standby-ready"
#: What a standby imports while it waits: most of what a kernel's start imports.
PRELOAD = (
    "ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.zmqshell", "ipykernel.iostream",
    "ipykernel.heartbeat", "ipykernel.comm", "ipykernel.control", "ipykernel.shellchannel",
    "ipykernel.eventloops", "ipykernel.displayhook", "IPython.core.interactiveshell",
    "IPython.core.history", "IPython.core.completer", "IPython.core.magics",
    "IPython.core.profiledir",
    "jupyter_client.session", "zmq", "tornado.ioloop", "asyncio",
    "host_kernel.kernel.extension", "host_kernel.kernel.capture",
    # What the kernel's start imports after the orders, found by comparing a standby's
    # modules with a started kernel's: each import then searches the session's path
    # (stat after stat, under the tracer), about a third of a warm start.
    "pdb", "IPython.core.debugger", "IPython.core.completerlib", "IPython.core.logger",
    "IPython.core.oinspect", "IPython.extensions.storemagic", "IPython.utils.wildcard",
    "ipykernel.debugger", "faulthandler", "sqlite3", "unicodedata", "tornado.gen",
    "tornado.locks", "tornado.queues", "tornado.platform.asyncio",
    "importlib.resources.readers", "host_kernel.sandbox.landlock",
)


class StandbyError(RuntimeError):
    """The standby cannot be handed out safely."""


def preload() -> None:
    import importlib

    from .launch import skip_debugger

    skip_debugger()  # as a cold kernel starts: no debugger, no debugpy (a fifth of the imports)
    for name in PRELOAD:
        importlib.import_module(name)  # a failure here would fail the kernel's start anyway


def threads() -> int:
    """How many threads this process has, as the OS counts them (C threads included)."""
    return len(os.listdir("/proc/self/task"))


def read_orders(fd: int = 0) -> tuple[dict[str, object], list[int]] | None:
    """One line of JSON from the socket ``fd``, and the descriptors sent with it; None at
    end of input (the pool let this standby go)."""
    import socket

    sock = socket.socket(fileno=os.dup(fd))
    try:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
        while data and not data.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    if not data.endswith(b"\n"):
        for extra in fds:
            os.close(extra)
        return None
    orders: dict[str, object] = json.loads(data)
    return orders, fds


def narrow(orders: dict[str, object], fds: list[int]) -> None:
    """Enter the session's Landlock domain (stacked on the pool's): the ruleset the Host
    built and sent with the orders."""
    if not orders.get("ruleset"):
        return
    if len(fds) != 1:
        raise StandbyError("the orders name a ruleset but carry none")
    if threads() != 1:
        raise StandbyError(f"{threads()} threads before narrowing; Landlock would leave all but "
                           f"this one in the pool's domain")
    from host_kernel.sandbox.landlock import restrict_self

    try:
        restrict_self(fds[0])
    finally:
        os.close(fds[0])


def adopt(orders: dict[str, object], started_path: list[str]) -> None:
    """The session's environment, folder and import path, as a fresh start would have them."""
    import tempfile

    env = orders["env"]
    assert isinstance(env, dict)
    old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(str(orders["cwd"]))
    # PYTHONPATH is read once, at the interpreter's start: put the session's own entries
    # (its package overlay) where they would have been, ahead of the standard library.
    new = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in old]
    at = sys.path.index(started_path[0]) if started_path and started_path[0] in sys.path else 0
    sys.path[at:at] = new
    tempfile.tempdir = None  # $TMPDIR is the session's now
    user_site(env)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def user_site(env: dict[str, str]) -> list[str]:
    """Add the user's site folder (its ``.pth`` files, then ``usercustomize``) as a fresh
    start with this environment would have: the standby started with ``-s``, so none of
    it ran in the pool's domain (host_kernel/host/_kernel.py ``standby_argv``). Called
    once narrowed. The folders go where :mod:`site` puts them, ahead of the interpreter's
    site-packages. Returns the folders added."""
    import site

    from host_kernel._paths import user_site as wanted

    folder = wanted(env)
    if folder is None or not os.path.isdir(folder):
        return []
    site.ENABLE_USER_SITE = True
    site.USER_SITE, site.USER_BASE = folder, None  # the session's, not the pool's
    before = set(sys.path)
    site.addsitedir(folder)
    # What it appended (the folder, then its .pth files' folders) moves up; what a .pth
    # put elsewhere itself stays where it put it, as in a fresh start.
    tail = len(sys.path)
    while tail and sys.path[tail - 1] not in before:
        tail -= 1
    added = sys.path[tail:]
    del sys.path[tail:]
    # site.main adds a virtual environment's own site-packages first, then the user's,
    # then the rest (the base interpreter's, or the system's outside a venv).
    own = sys.prefix if sys.prefix != sys.base_prefix else None
    system = set(site.getsitepackages([p for p in site.PREFIXES if p != own]))
    at = next((i for i, p in enumerate(sys.path) if p in system), len(sys.path))
    sys.path[at:at] = added
    try:
        import usercustomize  # noqa: F401 - run as site.main would
    except ImportError as exc:
        if exc.name != "usercustomize":
            raise
    return added


def _ready_marker(argv: list[str]) -> str | None:
    if "-f" in argv and argv.index("-f") + 1 < len(argv):
        return os.path.join(os.path.dirname(argv[argv.index("-f") + 1]), READY)
    return None


def main() -> int:
    # As ipykernel_launcher does: the start folder off the path while we import (IPython's
    # init_path puts '' back, which is then the session's workspace).
    if sys.path and (sys.path[0] == "" or sys.path[0] == os.getcwd()):
        del sys.path[0]
    started_path = list(sys.path)
    preload()
    marker = _ready_marker(sys.argv)
    if marker is not None:
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT, 0o600))
        except OSError:
            pass  # only a hint for the pool
    got = read_orders()
    if got is None:
        return 0
    orders, fds = got
    try:
        narrow(orders, fds)
        adopt(orders, started_path)
    except Exception as exc:  # noqa: BLE001 - say why on stderr; the Host sees the kernel die
        sys.stderr.write(f"host_kernel standby: cannot take the session: {exc}\n")
        return 70
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()
    return 0


if __name__ == "__main__":
    sys.exit(main())
