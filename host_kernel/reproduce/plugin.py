"""The Host's pytest plugin and unittest result: each test's outcome, streamed to the Host.

Loaded by ``boot.py`` inside the reproduction (never by the kernel). Every
event is one JSON line written with ``os.write`` to the report channel (a pipe
the Host reads as the run goes: ``channel.py``) as it happens, so what was
reported cannot be unwritten and a run that dies half way leaves what it did.
Events, in the order a run says them:

- ``hello`` (boot, before any declared code), ``items`` (the collected node
  ids, in chunks), ``collected`` (their count, and how many another plugin's
  ``pytest_collection_modifyitems`` removed), ``deselected``;
- ``collect_error`` / ``collect_skip``: a file that failed to import or
  collect, or skipped at module level (with the reason);
- ``phase``: one test's setup, call or teardown outcome (with the reason of a
  skip); ``subtest``: one subtest's; ``error``: a unittest class or module
  fixture that failed outside any test;
- ``tampered``: the runner's reporting path or hooks are not what they were at
  boot (``integrity.py``), or a report disagrees with the call it was made from;
- ``finished``: the session's end, with pytest's own counts; ``closed`` (boot,
  after the runner returned): its exit status. Nothing may follow it.

A run that collects only (``collect=True``) says ``hello``, ``items``,
``collected``, its collection errors and skips, ``finished`` and ``closed``.
The stdout of the run is never read for the outcome here.
"""

from __future__ import annotations

import json
import os
import sys
import types
import unittest
import unittest.case
import unittest.suite
from typing import Any

import pytest
from _pytest.reports import TestReport
from _pytest.subtests import SubtestReport
from pluggy import PluginManager
from pluggy._callers import _multicall
from pluggy._hooks import HookCaller

from . import integrity
from .scan import HOOKS

__all__ = ["LOST", "Channel", "CollectingRunner", "ReportPlugin", "ReportingRunner"]

#: Bound when this module is imported, before any test code runs: a test that replaces
#: ``os.write`` or ``json.dumps`` later does not change what the report gets.
_write = os.write
_fstat = os.fstat
_exit = os._exit
_dumps = json.dumps
_getframe = sys._getframe
_TestReport = TestReport
_SubtestReport = SubtestReport
_ModuleType = types.ModuleType
_MULTICALL = _multicall
_HOOKCALLER = HookCaller
_HOOKEXEC = PluginManager._hookexec
#: The unittest code allowed to record a success, a skip or an expected failure.
_RUN = unittest.TestCase.run.__code__
_SUITE = unittest.suite.TestSuite
_SKIPPERS = (unittest.case._addSkip.__code__,  # type: ignore[attr-defined]
             _SUITE._createClassOrModuleLevelException.__code__)  # type: ignore[attr-defined]
_XFAIL = unittest.TestCase._addExpectedFailure.__code__  # type: ignore[attr-defined]

#: The exit status of a run whose report channel was closed or replaced under it.
LOST = 86
#: A line longer than a pipe's atomic write could be torn by another writer: texts are cut
#: to keep lines shorter, and node ids are sent in chunks of about this size.
MAX_LINE = 4000


class Channel:
    """The report channel: a descriptor, and the pipe (device, inode) it was at boot.

    Before each write it checks that the descriptor is still that pipe: one closed
    or made to point elsewhere (``dup2`` of ``/dev/null`` over it) ends the run at
    once with :data:`LOST`, since nothing it says from then on reaches the Host.
    No instance attribute can be set (slots): the writer cannot be swapped.
    """

    __slots__ = ("fd", "ident")

    def __init__(self, target: int | str) -> None:
        if isinstance(target, str):  # a file the caller made (the Host's warm-up run)
            self.fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            os.unlink(target)
        else:
            self.fd = target
        info = os.fstat(self.fd)
        self.ident = (info.st_dev, info.st_ino)

    def emit(self, **event: Any) -> None:
        data = (_dumps(event, default=str) + "\n").encode()
        if len(data) > MAX_LINE:
            for key in ("text", "reason"):
                if isinstance(event.get(key), str):
                    event[key] = event[key][-400:]
            data = (_dumps(event, default=str) + "\n").encode()
        try:
            info = _fstat(self.fd)
            same = (info.st_dev, info.st_ino) == self.ident
        except OSError:
            same = False
        if not same:
            _lost()
        while data:
            try:
                data = data[_write(self.fd, data):]
            except OSError:
                _lost()


    def emit_ids(self, ids: list[str]) -> None:
        """``items`` lines of about :data:`MAX_LINE` bytes each."""
        chunk: list[str] = []
        size = 0
        for nodeid in ids:
            if chunk and size + len(nodeid) + 4 > MAX_LINE - 40:
                self.emit(event="items", ids=chunk)
                chunk, size = [], 0
            chunk.append(nodeid)
            size += len(nodeid.encode()) + 4
        if chunk:
            self.emit(event="items", ids=chunk)


def _lost() -> None:
    try:
        _write(2, b"host_kernel: the report channel was closed or replaced; the run ends\n")
    finally:
        _exit(LOST)


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    text = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 \
        else str(longrepr or "")
    text = text.removeprefix("Skipped: ")
    wasxfail = getattr(report, "wasxfail", None)
    return (str(wasxfail) if wasxfail else text)[:300]


class ReportPlugin:
    """Registered by ``pytest.main(..., plugins=[ReportPlugin(channel, declared)])``.

    Besides the outcomes it checks, around every test phase, the runner's reporting
    path against the boot baseline (``integrity.py``), every implementation of a hook
    that can change what runs or what is reported (``scan.HOOKS``: only the
    installation's functions and the tree baseline's conftests count as the runner's),
    and each report against the call it was made from (a report made "passed" from a
    call that raised, or changed between being made and being logged, is not the
    runner's).
    """

    def __init__(self, channel: Channel | int | str, declared: str = "", *,
                 root: str = "") -> None:
        self.channel = channel if isinstance(channel, Channel) else Channel(channel)
        self.declared: set[str] = set()
        if declared:
            with open(declared, encoding="utf-8") as f:
                self.declared = set(json.load(f))
        self.baseline = integrity.take()
        self.flagged: set[str] = set()
        self.made: dict[int, tuple[Any, str]] = {}
        self.conftests: set[int] = set()
        #: The tree (the run's root folder): a conftest under it that is not declared is
        #: the baseline's.
        self.root = os.path.realpath(root or os.getcwd())
        self._config: Any = None

    # ------------------------------------------------------------------ checks

    def tamper(self, found: list[str]) -> None:
        new = [f for f in dict.fromkeys(found) if f not in self.flagged]
        if new:
            self.flagged.update(new)
            self.channel.emit(event="tampered", what=new[:20])

    def _check_hooks(self, config: Any) -> list[str]:
        found = []
        manager: Any = config.pluginmanager
        if getattr(manager, "_inner_hookexec", None) is not _MULTICALL:
            found.append("the plugin manager's hook calling (_inner_hookexec) was replaced")
        for name in sorted(HOOKS):
            hook = getattr(manager.hook, name, None)
            if hook is None:
                continue
            call = getattr(hook, "_hookexec", None)
            bound = (getattr(call, "__func__", None), getattr(call, "__self__", None))
            if type(hook) is not _HOOKCALLER or bound[0] is not _HOOKEXEC or \
                    bound[1] is not config.pluginmanager:
                found.append(f"the hook {name} is not called through the plugin manager")
                continue
            for impl in hook.get_hookimpls():
                if self.baseline.trusted(impl.function):
                    continue
                code = getattr(impl.function, "__code__", None)
                where = getattr(code, "co_filename", "?") + (
                    f" line {code.co_firstlineno}" if code is not None else "")
                found.append(f"{name} implemented by {manager.get_name(impl.plugin)!r} "
                             f"({where}), which is not the runner's code as it was loaded")
        return found

    def verify(self, config: Any = None, wide: bool = False, during: bool = False) -> None:
        found = self.baseline.wide() if wide else self.baseline.narrow(during)
        if config is not None:
            found += self._check_hooks(config)
        if found:
            self.tamper(found)

    # ------------------------------------------------------------------ collection

    @pytest.hookimpl(tryfirst=True)
    def pytest_plugin_registered(self, plugin: Any, plugin_name: str, manager: Any) -> None:
        # A conftest of the tree's baseline (not declared) is the user's own code: its hooks
        # are trusted as they are when pytest registers it, the first time only.
        if not isinstance(plugin, _ModuleType) or id(plugin) in self.conftests:
            return
        self.conftests.add(id(plugin))
        path = os.path.realpath(plugin_name) if os.path.isabs(str(plugin_name)) else ""
        inside = os.path.basename(path) == "conftest.py" and path.startswith(self.root + os.sep)
        if inside and os.path.relpath(path, self.root).replace(os.sep, "/") not in self.declared:
            self.baseline.trust_conftest(plugin)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: Any) -> None:
        self.verify(session.config, wide=True)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(self, session: Any, config: Any, items: list[Any]) -> Any:
        before = [item.nodeid for item in items]
        result = yield
        after = [item.nodeid for item in items]
        kept = set(after)
        removed = [n for n in before if n not in kept]
        self.channel.emit_ids(after)
        self.channel.emit(event="collected", count=len(after), before=len(before),
                          after=len(after), removed=removed[:20], removed_count=len(removed))
        return result

    @pytest.hookimpl(tryfirst=True)
    def pytest_deselected(self, items: list[Any]) -> None:
        self.channel.emit(event="deselected", count=len(items),
                          nodeids=[i.nodeid for i in items[:20]])

    @pytest.hookimpl(tryfirst=True)
    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.channel.emit(event="collect_error", nodeid=report.nodeid,
                              text=str(report.longrepr)[-1500:])
        elif report.skipped:
            self.channel.emit(event="collect_skip", nodeid=report.nodeid,
                              reason=_reason(report))

    # ------------------------------------------------------------------ running

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: Any, call: Any) -> Any:
        report = yield
        self.made[id(report)] = (report, str(report.outcome))
        wrong = []
        if report.outcome == "passed" and call.excinfo is not None:
            wrong.append(f"a report made 'passed' from a {call.when} that raised "
                         f"{call.excinfo.typename}")
        if report.when != call.when or report.nodeid != item.nodeid:
            wrong.append("a report made for another test or phase than its call")
        if wrong:
            self.tamper([f"{item.nodeid} ({call.when}): {w}" for w in wrong])
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: Any) -> None:
        self.verify(during=True)
        subtest = type(report) is _SubtestReport
        if not subtest:
            made = self.made.pop(id(report), None)
            if type(report) is not _TestReport or made is None or made[0] is not report:
                self.tamper([(f"{report.nodeid} ({report.when}): a report the runner did not "
                             f"make was logged")])
            elif made[1] != report.outcome:
                self.tamper([(f"{report.nodeid} ({report.when}): its report was changed from "
                             f"{made[1]!r} to {report.outcome!r} after it was made")])
        self.channel.emit(event="subtest" if subtest else "phase", nodeid=report.nodeid,
                          when=report.when, outcome=report.outcome,
                          xfail=hasattr(report, "wasxfail"),
                          text=str(report.longrepr)[-1500:] if report.failed else None,
                          reason=_reason(report) if report.skipped else None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self.verify(self._config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: Any) -> None:
        self._config = session.config

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: Any, exitstatus: Any) -> None:
        self.verify(session.config, wide=True)
        self.channel.emit(event="finished", exitstatus=int(exitstatus),
                          collected=session.testscollected, failed=session.testsfailed)


# -- unittest ----------------------------------------------------------------------------------


def _caller_is(*codes: Any) -> bool:
    """Whether the function that called our caller is one of ``codes`` (by identity)."""
    return _getframe(2).f_code in codes


class _Result(unittest.TextTestResult):
    """unittest's text result, saying each test's outcome once, when the test stops.

    A success, a skip or an expected failure counts only when unittest's own case
    machinery records it (the caller's code is checked by identity): a patched
    ``addFailure`` that calls ``addSuccess`` is not a pass.
    """

    channel: Channel
    baseline: integrity.Baseline

    def startTest(self, test: Any) -> None:
        super().startTest(test)
        self._test = test
        self._outcome: tuple[str, str | None, str | None, bool] | None = None
        self._sub: tuple[str, str] | None = None
        self._verify()

    def _verify(self) -> None:
        found = self.baseline.narrow()
        if found:
            self.channel.emit(event="tampered", what=found[:20])

    def _text(self, err: Any, test: Any) -> str | None:
        if not err:
            return None
        render = self._exc_info_to_string  # type: ignore[attr-defined]
        return str(render(err, test))[-1500:]

    def _set(self, outcome: str, err: Any = None, reason: str | None = None,
             xfail: bool = False) -> None:
        text = self._text(err, self._test)
        if self._outcome is None or outcome in ("failed", "error"):
            self._outcome = (outcome, text, reason, xfail)

    def _outside(self, test: Any, outcome: str, err: Any = None, reason: str = "") -> None:
        """A class or module fixture's error or skip (reported on a stand-in, no test)."""
        text = self._text(err, test)
        self.channel.emit(event="error", nodeid=str(test.id()), outcome=outcome, text=text,
                          reason=reason or None)

    def addSuccess(self, test: Any) -> None:
        super().addSuccess(test)
        frame = _getframe(1)
        outcome = frame.f_locals.get("outcome") if frame.f_code is _RUN else None
        if outcome is None or not getattr(outcome, "success", False):
            self.channel.emit(event="tampered", what=[
                f"{test.id()}: a success recorded from outside unittest's TestCase.run"])
        self._set("passed")

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._set("failed", err)

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        if test is not getattr(self, "_test", None):
            self._outside(test, "error", err)
        else:
            self._set("error", err)

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        if not _caller_is(*_SKIPPERS):
            self.channel.emit(event="tampered", what=[
                f"{test.id()}: a skip recorded from outside unittest's case machinery"])
        if test is not getattr(self, "_test", None):
            self._outside(test, "skipped", reason=reason)
        else:
            self._set("skipped", reason=str(reason)[:300])

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        super().addExpectedFailure(test, err)
        if not _caller_is(_XFAIL):
            self.channel.emit(event="tampered", what=[
                (f"{test.id()}: an expected failure recorded from outside unittest's "
                f"TestCase.run")])
        self._set("skipped", reason="expected failure", xfail=True)

    def addUnexpectedSuccess(self, test: Any) -> None:
        super().addUnexpectedSuccess(test)
        self._set("failed")  # unittest counts it as a failure of the run

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            outcome = "failed" if failed else "error"
            text = self._text(err, test) or ""
            self._sub = (outcome, text)
            self.channel.emit(event="subtest", nodeid=str(test.id()), when="call",
                              outcome="failed", xfail=False, text=text, reason=None)

    def stopTest(self, test: Any) -> None:
        outcome, text, reason, xfail = self._outcome or (
            *(self._sub or ("error", "no outcome was recorded")), None, False)
        if self._sub is not None and outcome not in ("failed", "error"):
            outcome, text = self._sub  # a subtest failed: so did the test
        self.channel.emit(event="phase", nodeid=str(test.id()), when="call", outcome=outcome,
                          xfail=xfail, text=text, reason=reason)
        self._verify()
        super().stopTest(test)


def _ids(suite: Any) -> list[str]:
    found: list[str] = []
    stack = [iter([suite])]
    while stack:
        for test in stack[-1]:
            if isinstance(test, unittest.TestSuite):
                stack.append(iter(test))
                break
            found.append(str(test.id()))
        else:
            stack.pop()
    return found


def _announce(channel: Channel, test: Any) -> int:
    ids = _ids(test)
    channel.emit_ids(ids)
    channel.emit(event="collected", count=len(ids), before=len(ids), after=len(ids),
                 removed=[], removed_count=0)
    return len(ids)


class ReportingRunner(unittest.TextTestRunner):
    """``unittest.main(testRunner=…)``: the suite's tests, then each test's outcome."""

    channel: Channel | None = None
    report_path = ""

    def run(self, test: Any) -> Any:
        channel = type(self).channel or Channel(type(self).report_path)
        baseline = integrity.take()
        _announce(channel, test)
        self.resultclass = type("Result", (_Result,), {"channel": channel,
                                                       "baseline": baseline})
        result = super().run(test)
        found = baseline.wide()
        if found:
            channel.emit(event="tampered", what=found[:20])
        channel.emit(event="finished", exitstatus=0 if result.wasSuccessful() else 1,
                     collected=result.testsRun, failed=len(result.failures) + len(result.errors))
        return result


class CollectingRunner(unittest.TextTestRunner):
    """``unittest.main(testRunner=…)`` for the collection run: the suite's tests, none run."""

    channel: Channel | None = None

    def run(self, test: Any) -> Any:
        channel = type(self).channel
        if channel is None:
            raise RuntimeError("the collecting runner has no channel")
        count = _announce(channel, test)
        channel.emit(event="finished", exitstatus=0, collected=count, failed=0)
        return unittest.TestResult()
