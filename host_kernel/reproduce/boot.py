"""The first code a reproduction runs: load the runner, then the tree, then the tests.

Run by the Host as ``python -I -B -X pycache_prefix=… -m host_kernel.reproduce.boot
--report FILE --runner pytest|unittest [--path DIR]… -- ARGS…`` inside the
sandbox, in the tree. It imports the runner and its own modules **before** any
tree or overlay folder goes on the import path, so a declared ``pytest.py``,
``_pytest/`` or ``pluggy.py`` cannot stand in for them; then it puts the
session's package overlay and (for ``python -m``) the working folder on the
path and hands over to the runner with the Host's reporter attached.
"""

from __future__ import annotations

# The runner, its plugin and the modules they load later, all from the base installation.
import doctest  # noqa: F401
import faulthandler  # noqa: F401
import pdb  # noqa: F401
import sys
import unittest

import _pytest.capture
import _pytest.doctest
import _pytest.main
import _pytest.python
import _pytest.runner
import _pytest.terminal
import _pytest.unittest  # noqa: F401
import pytest

from host_kernel.reproduce.plugin import ReportingRunner, ReportPlugin


def main(argv: list[str]) -> int:
    report, runner, paths, declared, sites = "", "pytest", [], "", []
    while argv and argv[0] != "--":
        flag, value, argv = argv[0], argv[1], argv[2:]
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
    args = argv[1:]
    sys.argv[1:] = args  # the report's path is not left for test code to find
    sys.path[:0] = paths
    # The Host-built overlay goes after the standard library and before site-packages:
    # it can add and upgrade distributions, never stand in for a module of the stdlib.
    at = next((i for i, p in enumerate(sys.path) if p.endswith("site-packages")), len(sys.path))
    sys.path[at:at] = sites
    if runner == "unittest":
        ReportingRunner.report_path = report
        program = unittest.main(module=None, argv=["python -m unittest", *args],
                                testRunner=ReportingRunner, exit=False)
        return 0 if program.result.wasSuccessful() else 1
    return int(pytest.main(args, plugins=[ReportPlugin(report, declared)]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
