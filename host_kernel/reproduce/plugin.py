"""The Host's pytest plugin and unittest result: each test's outcome, to a Host-owned file.

Loaded by ``boot.py`` inside the reproduction (never by the kernel). Every
event is one JSON line appended with ``os.write`` as it happens, so a run that
dies half way leaves what it did, and a summary written by anyone else than
the runner's own hooks has nothing to stand on: the Host counts test by test
(``runner.read_report``). Events:

- ``collected``: how many items collection produced, before and after every
  other plugin's ``pytest_collection_modifyitems`` (this wrapper runs first and
  last), and ``deselected`` counts;
- ``collect_error``: a file that failed to import or collect;
- ``phase``: one test's setup, call or teardown outcome;
- ``finished``: the session's end, with pytest's own counts.

The stdout of the run is never read for the outcome.
"""

from __future__ import annotations

import json
import os
import sys
import unittest
from typing import Any

import pytest

from .scan import HOOKS

__all__ = ["ReportPlugin", "ReportingRunner"]


#: Bound when this module is imported, before any test code runs: a test that replaces
#: ``os.write`` or ``json.dumps`` later does not change what the report gets.
_write = os.write
_dumps = json.dumps


class _Report:
    """Opened once, then its name removed: the Host reads it through a descriptor it
    opened before the run, and test code finds no path to rewrite."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        os.unlink(path)

    def emit(self, **event: Any) -> None:
        _write(self.fd, (_dumps(event, default=str) + "\n").encode())


class ReportPlugin:
    """Registered by ``pytest.main(..., plugins=[ReportPlugin(path, declared)])``.

    Besides the outcomes, it looks at every implementation of a hook that can
    change what runs or what is reported (``scan.HOOKS``) once collection is done
    and again at the end: one whose code comes from a file the agent declared, or
    from no file of the base installation or the tree's baseline (code built with
    ``exec``), is reported as ``tampered``. That catches hooks a static reading
    misses (``globals()["pytest_runtest_" + "makereport"] = …``).
    """

    def __init__(self, path: str, declared: str = "") -> None:
        self.report = _Report(path)
        self.declared: set[str] = set()
        if declared:
            with open(declared, encoding="utf-8") as f:
                self.declared = set(json.load(f))
        self.trusted = tuple(os.path.realpath(p) + os.sep for p in {
            sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.__file__)})
        self.flagged: set[str] = set()

    def _check_hooks(self, config: Any) -> None:
        tree = os.path.realpath(str(config.rootpath)) + os.sep
        found = []
        for name in sorted(HOOKS):
            hook = getattr(config.pluginmanager.hook, name, None)
            if hook is None:
                continue
            for impl in hook.get_hookimpls():
                if impl.plugin is self:
                    continue
                code = getattr(impl.function, "__code__", None)
                file = getattr(code, "co_filename", "") or ""
                real = os.path.realpath(file) if file and not file.startswith("<") else ""
                if real.startswith(tree):
                    rel = real[len(tree):].replace(os.sep, "/")
                    if rel not in self.declared:
                        continue  # the baseline's own conftest: the user's code
                elif real.startswith(self.trusted):
                    continue  # the runner, its plugins, the standard library
                where = f"{file or '?'}" + (f" line {code.co_firstlineno}" if code else "")
                found.append(f"{name} implemented in {where}")
        new = [f for f in found if f not in self.flagged]
        if new:
            self.flagged.update(new)
            self.report.emit(event="tampered", hooks=new[:20])

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: Any) -> None:
        self._check_hooks(session.config)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(self, session: Any, config: Any, items: list[Any]) -> Any:
        before = [item.nodeid for item in items]
        result = yield
        after = {item.nodeid for item in items}
        removed = [n for n in before if n not in after]
        self.report.emit(event="collected", before=len(before), after=len(after),
                         removed=removed[:20], removed_count=len(removed))
        return result

    @pytest.hookimpl(tryfirst=True)
    def pytest_deselected(self, items: list[Any]) -> None:
        self.report.emit(event="deselected", count=len(items),
                         nodeids=[i.nodeid for i in items[:20]])

    @pytest.hookimpl(tryfirst=True)
    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.report.emit(event="collect_error", nodeid=report.nodeid,
                             text=str(report.longrepr)[-2000:])

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: Any) -> None:
        self.report.emit(event="phase", nodeid=report.nodeid, when=report.when,
                         outcome=report.outcome, xfail=hasattr(report, "wasxfail"),
                         text=str(report.longrepr)[-1500:] if report.failed else None)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: Any, exitstatus: Any) -> None:
        self._check_hooks(session.config)
        self.report.emit(event="finished", exitstatus=int(exitstatus),
                         collected=session.testscollected, failed=session.testsfailed)


class _Result(unittest.TextTestResult):
    report: _Report

    def _phase(self, test: Any, outcome: str, err: Any = None, xfail: bool = False) -> None:
        text = self._exc_info_to_string(err, test)[-1500:] if err else None  # type: ignore[attr-defined]
        self.report.emit(event="phase", nodeid=test.id(), when="call", outcome=outcome,
                         xfail=xfail, text=text)

    def addSuccess(self, test: Any) -> None:
        super().addSuccess(test)
        self._phase(test, "passed")

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._phase(test, "failed", err)

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        self._phase(test, "error", err)

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self._phase(test, "skipped")

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._phase(test, "skipped", xfail=True)

    def addUnexpectedSuccess(self, test: Any) -> None:
        super().addUnexpectedSuccess(test)
        self._phase(test, "failed")  # unittest counts it as a failure of the run

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            self._phase(test, "failed" if failed else "error", err)


class ReportingRunner(unittest.TextTestRunner):
    """``unittest.main(testRunner=…)``: the suite's size, then each test's outcome."""

    report_path = ""

    def run(self, test: Any) -> Any:
        report = _Report(type(self).report_path)
        report.emit(event="collected", before=test.countTestCases(),
                    after=test.countTestCases(), removed=[], removed_count=0)
        self.resultclass = type("Result", (_Result,), {"report": report})
        result = super().run(test)
        report.emit(event="finished", exitstatus=0 if result.wasSuccessful() else 1,
                    collected=result.testsRun, failed=len(result.failures) + len(result.errors))
        return result
