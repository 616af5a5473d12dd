"""The first code a reproduction runs: load the runner, take its baseline, then the tests.

Run by the Host as ``python -I -B -X pycache_prefix=… -m host_kernel.reproduce.boot
--channel 0 --runner pytest|unittest [--collect] [--root TREE] [--path DIR]…
[--site DIR]… -- ARGS…`` inside the sandbox, in the tree, with the write end
of the Host's report pipe as its standard input. In this order, before any
declared code can run:

1. the report channel moves to a private descriptor (close-on-exec) and
   ``/dev/null`` takes its place on standard input (``channel.py``);
2. the runner, every plugin it will load (pytest's own and the installation's
   ``-p`` plugins) and the Host's reporter are imported, **before** any tree or
   overlay folder goes on the import path, so a declared ``pytest.py``,
   ``_pytest/`` or ``pluggy.py`` cannot stand in for them;
3. the reporting path's baseline is taken (``integrity.take``): what every
   later check compares with, from references bound now;
4. the folders go on the path and the runner runs with the Host's reporter;
   once it returns, a last check and the ``closed`` event with its status.

``--collect`` makes the run a collection run (``pytest --collect-only``, or
unittest's loader alone): it reports the tests it would run, and runs none.
"""

from __future__ import annotations

import os
import sys

# The Host's report pipe is standard input: take it before anything else can.
if __name__ == "__main__" and "--channel" in sys.argv:
    _CHANNEL_FD: int | None = os.dup(int(sys.argv[sys.argv.index("--channel") + 1]))
    _null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(_null, int(sys.argv[sys.argv.index("--channel") + 1]))
    os.close(_null)
else:
    _CHANNEL_FD = None

# The runner, its plugin and the modules they load later, all from the base installation.
import doctest  # noqa: F401
import faulthandler  # noqa: F401
import importlib
import pdb  # noqa: F401, T100
import unittest

import _pytest.capture
import _pytest.config
import _pytest.doctest
import _pytest.main
import _pytest.python
import _pytest.runner
import _pytest.terminal
import _pytest.unittest
import pytest

from host_kernel.reproduce import integrity
from host_kernel.reproduce.plugin import (
    Channel,
    CollectingRunner,
    ReportingRunner,
    ReportPlugin,
)


def _load_plugins(args: list[str]) -> None:
    """Import every plugin pytest will load: its built-in ones, and each ``-p NAME`` of
    the installation's (the Host names them), so their hooks are in the baseline."""
    for name in _pytest.config.default_plugins:
        importlib.import_module(f"_pytest.{name}")
    names = {args[i + 1] for i, a in enumerate(args[:-1]) if a == "-p"
             and not args[i + 1].startswith("no:")}
    if names:
        from importlib import metadata

        for ep in metadata.entry_points(group="pytest11"):
            if ep.name in names:
                importlib.import_module(ep.value.split(":")[0])


def main(argv: list[str]) -> int:
    report, runner, paths, declared, sites = "", "pytest", [], "", []
    collect, root = False, ""
    while argv and argv[0] != "--":
        flag = argv[0]
        if flag == "--collect":
            collect, argv = True, argv[1:]
            continue
        value, argv = argv[1], argv[2:]
        if flag == "--report":
            report = value
        elif flag == "--runner":
            runner = value
        elif flag == "--path":
            paths.append(value)
        elif flag == "--declared":
            declared = value
        elif flag == "--site":
            sites.append(value)
        elif flag == "--root":
            root = value
    args = argv[1:]
    channel = Channel(_CHANNEL_FD if _CHANNEL_FD is not None else report)
    channel.emit(event="hello", runner=runner, collect=collect)
    if runner == "pytest":
        _load_plugins(args)
    ReportingRunner.channel = CollectingRunner.channel = channel
    baseline = integrity.take()  # nothing declared has run yet
    sys.argv[1:] = args  # the report's path is not left for test code to find
    sys.path[:0] = paths
    # The Host-built overlay goes after the standard library and before site-packages:
    # it can add and upgrade distributions, never stand in for a module of the stdlib.
    at = next((i for i, p in enumerate(sys.path) if p.endswith("site-packages")), len(sys.path))
    sys.path[at:at] = sites
    if runner == "unittest":
        program = unittest.main(module=None, argv=["python -m unittest", *args],
                                testRunner=CollectingRunner if collect else ReportingRunner,
                                exit=False)
        status = 0 if program.result.wasSuccessful() else 1
    else:
        plugin = ReportPlugin(channel, declared, root=root)
        status = int(pytest.main([*args, "--collect-only"] if collect else args,
                                 plugins=[plugin]))
    found = baseline.wide()
    if found:
        channel.emit(event="tampered", what=found[:20])
    # The runner's own output goes out now, before any exit handler can add to it.
    sys.stdout.flush()
    sys.stderr.flush()
    channel.emit(event="closed", status=status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
