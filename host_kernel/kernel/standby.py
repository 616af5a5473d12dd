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

Before the orders it also does the part of ``IPKernelApp``'s start that depends on
nothing of the session's (:func:`ahead`): it parses its own command line (the
pool's, fixed when it started), makes the IPython profile folder inside its own
folder, where the session's private folder will be, and fills the caches the
first cell would fill. None of it reads the session's input, runs code from a
session or starts a thread.

End of input before the orders means the pool let this standby go: it exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from copy import deepcopy
from typing import Any

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
    "importlib.resources.readers", "importlib.readers", "host_kernel.sandbox.landlock",
    "hashlib",  # a cell's code name is a hash of its text (IPython.core.compilerop)
    # What adding the user site imports once narrowed (not sysconfig: it reads the
    # environment as it imports, which must then be the session's).
    "host_kernel._paths",
)


#: Where a session's IPython folder lies inside a standby's folder: the session's private
#: folder (host_kernel/host/_pool.py ``Standby.private``), then its ``IPYTHONDIR``
#: (host_kernel/host/_generations.py ``PRIVATE_DIRS``).
IPYTHON_DIR = os.path.join("s", "ipython")


class StandbyError(RuntimeError):
    """The standby cannot be handed out safely."""


def preload() -> None:
    import importlib

    from .launch import no_interface_scan, skip_debugger, unbounded_iopub

    skip_debugger()  # as a cold kernel starts: no debugger, no debugpy (a fifth of the imports)
    for name in PRELOAD:
        importlib.import_module(name)  # a failure here would fail the kernel's start anyway
    unbounded_iopub()  # as a cold kernel starts
    no_interface_scan()  # as a cold kernel starts


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
    try:  # as site.main does: a broken usercustomize is said, and the start goes on
        try:
            import usercustomize  # type: ignore[import-not-found]  # noqa: F401
        except ImportError as exc:
            if exc.name != "usercustomize":
                raise
    except Exception as exc:  # noqa: BLE001 - the user's own code, as a fresh start treats it
        sys.stderr.write("Error in usercustomize; set PYTHONVERBOSE for traceback:\n"
                         f"{exc.__class__.__name__}: {exc}\n")
    return added


def _folder(argv: list[str]) -> str | None:
    """The standby's folder: its connection file's."""
    if "-f" in argv and argv.index("-f") + 1 < len(argv):
        return os.path.dirname(argv[argv.index("-f") + 1])
    return None


#: ``IPKernelApp``'s command line parsed ahead: (argv, config, extra args).
Parsed = tuple[list[str], Any, list[str]]


def parse_ahead(argv: list[str]) -> Parsed:
    """Parse ``argv`` as ``IPKernelApp.parse_command_line`` would, without an application
    to apply it to: building the parser from every configurable class is most of that
    call's time (traitlets ``Application.parse_command_line``). The command line is the
    pool's own; the result reads no environment and no file."""
    from ipykernel import kernelapp

    kind: Any = kernelapp.IPKernelApp
    app = kind()  # not the instance the kernel runs: only its parser is used
    if argv and argv[0] in (app.subcommands or {}):
        raise ValueError(f"{argv[0]} is a subcommand")  # parsed by IPKernelApp itself
    flags, aliases = app.flatten_flags()
    classes = list(app._classes_with_config_traits())
    loader = app._create_loader(argv, aliases, flags, classes=classes)
    return list(argv), loader.load_config(), list(loader.extra_args)


def apply_parsed(app: Any, parsed: Parsed) -> None:
    """What ``parse_command_line`` does with its result, for ``parsed``: the application's
    ``argv``, ``cli_config`` (applied) and ``extra_args``."""
    argv, config, extra = parsed
    app.argv = list(argv)
    app.cli_config = deepcopy(config)
    app.update_config(app.cli_config)
    app.extra_args = list(extra)


def make_profile(folder: str) -> None:
    """The session's IPython profile folder (``profile_default`` and its sub-folders),
    made as IPython makes it at the kernel's start (it then finds it made): in the
    standby's own folder, with nothing of the session's in it yet."""
    from IPython.core import profiledir

    profiles: Any = profiledir.ProfileDir
    home = os.path.join(folder, IPYTHON_DIR)
    os.makedirs(home, exist_ok=True)  # as the Host makes it (host/_generations.py _build_env)
    profiles.create_profile_dir_by_name(home, "default")


def warm() -> None:
    """Fill the caches the first cell would fill, running no cell: IPython splits a cell
    into tokens with patterns ``tokenize`` compiles at its first use (2 to 6 ms), then
    parses and compiles it (a constant cell here; the patterns do not depend on it).
    Nothing of the session's is touched: no shell exists yet."""
    import ast

    from IPython.core import inputtransformer2

    kind: Any = inputtransformer2.TransformerManager
    code = kind().transform_cell("x = 1\n")
    compile(ast.parse(code), "<warm>", "exec")


def ahead(argv: list[str]) -> Parsed | None:
    """The kernel's start-up work that needs nothing of the session (before the orders);
    None when the command line is left for the kernel to parse."""
    with contextlib.suppress(Exception):
        warm()  # only time saved; the first cell does it otherwise
    folder = _folder(argv)
    if folder is not None:
        # On failure IPython makes what is missing at the kernel's start, as in a cold start.
        with contextlib.suppress(Exception):
            make_profile(folder)
    if any(a in ("-h", "--help", "--help-all", "--version", "-V", "help") for a in argv):
        return None  # IPython's own handling of these
    try:
        return parse_ahead(argv)
    except Exception:  # noqa: BLE001 - the kernel parses it, and says what is wrong
        return None


def launch(parsed: Parsed | None) -> None:
    """``ipykernel_launcher``'s ``launch_new_instance``, with the command line parsed
    ahead (the same ``argv`` it would parse)."""
    from ipykernel import kernelapp

    app: Any = kernelapp.IPKernelApp.instance()
    if parsed is not None and parsed[0] == sys.argv[1:]:
        app.parse_command_line = lambda argv=None: apply_parsed(app, parsed)
    try:
        app.initialize()
    finally:
        app.__dict__.pop("parse_command_line", None)
    app.start()


def main() -> int:
    # As ipykernel_launcher does: the start folder off the path while we import (IPython's
    # init_path puts '' back, which is then the session's workspace).
    if sys.path and (sys.path[0] == "" or sys.path[0] == os.getcwd()):
        del sys.path[0]
    started_path = list(sys.path)
    preload()
    parsed = ahead(sys.argv[1:])
    folder = _folder(sys.argv)
    if folder is not None:
        try:
            os.close(os.open(os.path.join(folder, READY), os.O_WRONLY | os.O_CREAT, 0o600))
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
    launch(parsed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
