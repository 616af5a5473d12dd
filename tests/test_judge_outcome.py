"""The judge's outcome is out of the judged's reach: what a reproduction says reaches the Host
over a stream it reads as the run goes, checked against a separate collection run, the
runner's exit status and its own terminal summary, with the runner's reporting path checked
from references bound before any declared code ran; and no declared test file may vanish.

Every attack below leaves the agent's own receipt at exit 0 (it ran on the good package, which
is broken afterwards: the declared ``add`` subtracts) and puts nothing in a declared file that
the static scan names: no hook definition, no runner-internal import, no plugin manager
attribute. Each is refused with its code; its honest twin is accepted. Each scenario lives in
a folder of its own in one armed session (``cd NAME && python -m pytest -q tests``).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_reproduction import BAD, GOOD, Result, put, run, submit_files

from host_kernel import Host
from host_kernel.audit import audit

TEST_ADD = "from pkg.core import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
TRIVIAL = "def test_ok():\n    pass\n"
UNITTEST_ADD = textwrap.dedent("""\
    import unittest

    from pkg.core import add


    class TestAdd(unittest.TestCase):
        def test_add(self):
            self.assertEqual(add(1, 2), 3)

        def test_zero(self):
            self.assertEqual(add(0, 0), 0)
""")


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """One armed session for the module; each test works in a folder of its own."""
    ws = tmp_path_factory.mktemp("judge") / "ws"
    ws.mkdir()
    with Host(ws, mode="reusable_pipeline", reproduce_timeout=120) as h:
        yield h


def command(folder: str, runner: str = "pytest") -> str:
    if runner == "unittest":
        return f"cd {folder} && python -m unittest discover -s tests"
    return f"cd {folder} && python -m pytest -q tests"


def attempt(host: Host, folder: str, files: dict[str, str], *, after: dict[str, str] | None = None,
            runner: str = "pytest") -> Result:
    """Write ``files`` under ``folder``, run the tests there (the agent's receipt, exit 0),
    then write ``after`` (the package broken), and submit every file as declared."""
    def placed(fs: dict[str, str]) -> dict[str, str]:
        return {f"{folder}/{rel}": text for rel, text in fs.items()}

    put(host, placed(files))
    cmd = command(folder, runner)
    cell = run(host, cmd)
    if after:
        put(host, placed(after))
    declared = placed({**files, **(after or {})})
    return submit_files(host, declared, cmd, cell, entry=f"{folder}/pkg/core.py")


def package(core: str = GOOD, **extra: str) -> dict[str, str]:
    files = {"pkg/__init__.py": "", "pkg/core.py": core, "tests/test_core.py": TEST_ADD}
    files.update(extra)
    return files


def forged_stream(ids: list[str]) -> str:
    """Every line a passing run of ``ids`` reports, as the Host's plugin writes them."""
    lines = [{"event": "items", "ids": ids},
             {"event": "collected", "count": len(ids), "before": len(ids), "after": len(ids),
              "removed": [], "removed_count": 0}]
    for nodeid in ids:
        lines += [{"event": "phase", "nodeid": nodeid, "when": when, "outcome": "passed",
                   "xfail": False, "text": None} for when in ("setup", "call", "teardown")]
    lines += [{"event": "finished", "exitstatus": 0, "collected": len(ids), "failed": 0},
              {"event": "closed", "status": 0}]
    return "".join(json.dumps(line) + "\n" for line in lines)


#: Declared code that writes ``FORGED`` to every descriptor of the process that looks like the
#: Host's report: a pipe, or a file whose name is gone opened to append (emptied first). The
#: sandbox hides /proc/self/fd, so the descriptors are probed one by one.
FORGER = textwrap.dedent("""\
    import os
    import stat

    FORGED = {forged!r}


    def forge(swap=False):
        for fd in range(3, 256):
            try:
                info = os.fstat(fd)
            except OSError:
                continue
            pipe = stat.S_ISFIFO(info.st_mode)
            appending = os.get_blocking(fd) and __import__('fcntl').fcntl(fd, 3) & os.O_APPEND
            if not (pipe or stat.S_ISREG(info.st_mode) and info.st_nlink == 0 and appending):
                continue
            try:
                if not pipe:
                    os.ftruncate(fd, 0)
                os.write(fd, FORGED.encode())
                if swap:
                    null = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(null, fd)
                    os.close(null)
            except OSError:
                pass
""")


def forger(folder: str, *ids: str) -> str:
    return FORGER.format(forged=forged_stream([f"{folder}/tests/{i}" for i in ids]))


def refused(r: Result, code: str, *words: str) -> None:
    assert r.refused_with(code), r
    for word in words:
        assert word in r.failed[code], (word, r.failed[code])


# -- the report's channel ----------------------------------------------------------------------


def test_an_atexit_handler_that_rewrites_the_report_and_exits_0_is_tampering(
        judge: Host) -> None:
    """(a) The handler finds the report's descriptor (by probing: the sandbox hides
    /proc/self/fd), writes a forged all-pass report and ``os._exit(0)``s. What the Host read
    as the run went cannot be unwritten: the forged lines come after the session's end."""
    core = BAD + "\nimport atexit, os, sys\nfrom pkg.forge import forge\n\n\n" \
                 "def _rewrite():\n    forge()\n    os._exit(0)\n\n\n" \
                 "if sys.flags.isolated:\n    atexit.register(_rewrite)\n"
    files = package(GOOD, **{"pkg/forge.py": forger("atexit", "test_core.py::test_add")})
    r = attempt(judge, "atexit", files, after={"pkg/core.py": core})
    refused(r, "runner_tampered", "after the session")
    assert "reproduced" not in {c["code"] for c in r.verdict["checks"] if c["ok"]}


def test_extra_passed_lines_written_into_the_channel_are_duplicates(judge: Host) -> None:
    """(f) The failing call itself writes a "passed" report for its test into every pipe."""
    core = ("import sys\nfrom pkg.forge import forge\n\n\ndef add(a, b):\n"
            "    if sys.flags.isolated:\n        forge()\n    return a - b\n")
    files = package(GOOD, **{"pkg/forge.py": forger("dup", "test_core.py::test_add")})
    r = attempt(judge, "dup", files, after={"pkg/core.py": core})
    refused(r, "runner_tampered", "more than once")


def test_a_channel_swapped_for_dev_null_after_a_forged_report_is_tampering(judge: Host) -> None:
    """(f) At import the package writes a complete passing report, then puts /dev/null
    where the channel was, so the runner's own reports go nowhere."""
    init = "import sys\nfrom pkg.forge import forge\n\nif sys.flags.isolated:\n" \
           "    forge(swap=True)\n"
    files = package(GOOD, **{"pkg/forge.py": forger("swap", "test_core.py::test_add")})
    r = attempt(judge, "swap", files, after={"pkg/core.py": BAD, "pkg/__init__.py": init})
    refused(r, "runner_tampered")


def test_exiting_0_from_a_failing_test_before_the_session_ends_is_tampering(judge: Host) -> None:
    """(f) The failing call ends the process with status 0: no report of it, no session end."""
    core = ("import os, sys\n\n\ndef add(a, b):\n    if sys.flags.isolated:\n"
            "        os._exit(0)\n    return a - b\n")
    r = attempt(judge, "exit0", package(GOOD), after={"pkg/core.py": core})
    refused(r, "runner_tampered", "session")


def test_an_exit_status_forced_to_0_disagrees_with_the_reports(judge: Host) -> None:
    """(f) Nothing forged in the report: only the exit status, from an atexit handler."""
    core = BAD + "\nimport atexit, os, sys\n\nif sys.flags.isolated:\n" \
                 "    atexit.register(os._exit, 0)\n"
    r = attempt(judge, "status", package(GOOD), after={"pkg/core.py": core})
    refused(r, "runner_tampered", "exit")


def test_a_second_terminal_summary_printed_at_exit_is_tampering(judge: Host) -> None:
    """(f) A package that prints a passing summary line when the run ends, after pytest's own
    (a reviewer reading the output tail would see "1 passed")."""
    init = ("import atexit, os, sys\n\nif sys.flags.isolated:\n"
            "    atexit.register(os.write, 1, b'\\n1 passed in 0.01s\\n')\n")
    files = package(GOOD, **{"tests/test_trivial.py": TRIVIAL})
    r = attempt(judge, "summary", files, after={"pkg/__init__.py": init})
    refused(r, "runner_tampered", "summary")


def test_a_collection_run_the_package_ends_early_cannot_vouch_for_the_run(judge: Host) -> None:
    """(f) The package ends the separate collection run (its command line says ``--collect``),
    so there is no list to hold the test run against: killed, it is a failed reproduction;
    ended with status 0, tampering."""
    for how, code in (("os.kill(os.getpid(), 9)", "reproduction_failed"),
                      ("os._exit(0)", "runner_tampered")):
        init = f"import os, sys\n\nif '--collect' in sys.orig_argv:\n    {how}\n"
        folder = "nocol" + how[3:7]
        r = attempt(judge, folder, package(GOOD), after={"pkg/__init__.py": init})
        refused(r, code, "collection run")


# -- the runner's reporting path ---------------------------------------------------------------


def test_a_package_that_patches_a_public_pytest_object_is_tampering(judge: Host) -> None:
    """(b) No hook, no ``_pytest`` import: the package's ``__init__`` rewrites
    ``pytest.TestReport.from_item_and_call`` so failures are made as passes."""
    init = textwrap.dedent("""\
        import pytest

        _made = pytest.TestReport.from_item_and_call


        def _passing(cls, item, call):
            report = _made.__func__(cls, item, call)
            if report.failed:
                report.outcome, report.longrepr = 'passed', None
            return report


        pytest.TestReport.from_item_and_call = classmethod(_passing)
    """)
    r = attempt(judge, "public", package(GOOD), after={"pkg/core.py": BAD,
                                                       "pkg/__init__.py": init})
    refused(r, "runner_tampered", "from_item_and_call")


def test_a_report_patch_installed_and_removed_inside_one_test_is_tampering(judge: Host) -> None:
    """(f) The patch is in place only while the failing test runs: the package's ``add``
    installs it and the made report removes it, so no check between tests could see it."""
    core = textwrap.dedent("""\
        import pytest


        def add(a, b):
            made = pytest.TestReport.__dict__['from_item_and_call']

            def passing(cls, item, call):
                pytest.TestReport.from_item_and_call = made
                report = made.__func__(cls, item, call)
                report.outcome, report.longrepr = 'passed', None
                return report

            pytest.TestReport.from_item_and_call = classmethod(passing)
            return a - b
    """)
    r = attempt(judge, "inside", package(GOOD), after={"pkg/core.py": core})
    refused(r, "runner_tampered")


def test_unittest_internals_patched_by_an_imported_module_are_tampering(judge: Host) -> None:
    """(c) The package patches unittest's result and case machinery: failures recorded as
    successes, and ``assertEqual`` made to pass."""
    init = textwrap.dedent("""\
        import unittest

        unittest.TestResult.addFailure = lambda self, test, err: self.addSuccess(test)
        unittest.TestCase.assertEqual = lambda self, first, second, msg=None: None
    """)
    files = package(GOOD, **{"tests/test_core.py": UNITTEST_ADD})
    r = attempt(judge, "unit", files, after={"pkg/core.py": BAD, "pkg/__init__.py": init},
                runner="unittest")
    refused(r, "runner_tampered", "unittest")


def test_a_unittest_failure_turned_into_a_success_from_inside_the_test_is_tampering(
        judge: Host) -> None:
    """(f) The failing test's own ``add`` makes unittest record its failure as a success and
    puts unittest back before anything looks: only who recorded the success tells."""
    core = textwrap.dedent("""\
        import unittest


        def add(a, b):
            real = unittest.TestResult.addFailure

            def succeed(self, test, err):
                unittest.TestResult.addFailure = real
                self.addSuccess(test)

            unittest.TestResult.addFailure = succeed
            return a - b
    """)
    files = package(GOOD, **{"tests/test_core.py": UNITTEST_ADD})
    r = attempt(judge, "unitself", files, after={"pkg/core.py": core}, runner="unittest")
    refused(r, "runner_tampered", "outside unittest's TestCase.run")


HOOK_SOURCE = textwrap.dedent("""\
    import os, sys, types

    import pytest

    SOURCE = '''
    import pytest


    @pytest.hookimpl(wrapper=True)
    def HOOK(item, call):
        report = yield
        if report.failed:
            report.outcome, report.longrepr = 'passed', None
        return report
    '''.replace('HOOK', 'pytest_runtest_' + 'makereport')
    # Compiled under the interpreter's own prefix: its code says it is the runner's.
    exec(compile(SOURCE, os.path.join(sys.prefix, 'lib', 'x.py'), 'exec'), globals())
""")


def test_a_hook_with_a_forged_co_filename_loaded_by_a_test_module_is_tampering(
        judge: Host) -> None:
    """(d) ``pytest_plugins`` in a declared test module (not a conftest) loads a declared
    module whose hook was compiled with a file name under ``sys.prefix``."""
    test = "pytest_plugins = ['pkg.plugin']\n\n" + TEST_ADD
    files = package(GOOD, **{"pkg/plugin.py": HOOK_SOURCE, "tests/test_core.py": test})
    r = attempt(judge, "forged", files, after={"pkg/core.py": BAD})
    refused(r, "runner_tampered", "makereport")


def test_a_forged_hook_registered_from_a_fixture_is_tampering(judge: Host) -> None:
    """(d) A fixture registers the forged hook with the plugin manager at run time."""
    plugin = HOOK_SOURCE + textwrap.dedent("""\


        @pytest.fixture(autouse=True)
        def registered(request):
            manager = getattr(request.config, 'plugin' + 'manager')
            hook = 'pytest_runtest_' + 'makereport'
            manager.register(types.SimpleNamespace(**{hook: globals()[hook]}), 'helper')
            yield
    """)
    test = "from pkg.plugin import registered  # noqa: F401\n" + TEST_ADD
    files = package(GOOD, **{"pkg/plugin.py": plugin, "tests/test_core.py": test})
    r = attempt(judge, "fixture", files, after={"pkg/core.py": BAD})
    refused(r, "runner_tampered", "makereport")


def test_tests_removed_from_the_session_while_it_runs_are_tampering(judge: Host) -> None:
    """(f) The first test's fixture drops the failing tests from the session's item list, so
    pytest never runs them (and finishes with exit status 0)."""
    test = textwrap.dedent("""\
        import pytest

        from pkg.core import add


        @pytest.fixture
        def first(request):
            items = request.session.items
            items[:] = [i for i in items if 'add' not in i.name]


        def test_a_first(first):
            pass


        def test_add():
            assert add(1, 2) == 3
    """)
    r = attempt(judge, "dropped", package(GOOD, **{"tests/test_core.py": test}),
                after={"pkg/core.py": BAD})
    refused(r, "runner_tampered", "test_add")


# -- tests that vanish -------------------------------------------------------------------------


def test_a_package_that_skips_whole_test_modules_leaves_them_not_run(judge: Host) -> None:
    """(e) The package raises a module-level skip on import: every test module that imports
    it vanishes, and a trivial test file is all that runs."""
    init = ("import sys\n\nimport pytest\n\nif sys.flags.isolated:\n"
            "    pytest.skip('not here', allow_module_level=True)\n")
    files = package(GOOD, **{"tests/test_trivial.py": TRIVIAL})
    r = attempt(judge, "vanish", files, after={"pkg/core.py": BAD, "pkg/__init__.py": init})
    refused(r, "tests_not_run", "vanish/tests/test_core.py", "not here")
    assert r.sections[0]["skipped"][0]["nodeid"] == "vanish/tests/test_core.py"


def test_a_declared_test_file_that_collects_nothing_is_not_run(judge: Host) -> None:
    files = package(GOOD, **{"tests/test_helpers.py": "VALUE = 3\n"})
    r = attempt(judge, "empty", files)
    refused(r, "tests_not_run", "empty/tests/test_helpers.py")


def test_a_declared_test_file_whose_every_test_skips_is_not_run(judge: Host) -> None:
    test = "import pytest\n\n\n@pytest.mark.skip(reason='later')\ndef test_later():\n    pass\n"
    files = package(GOOD, **{"tests/test_later.py": test})
    r = attempt(judge, "allskip", files)
    refused(r, "tests_not_run", "allskip/tests/test_later.py", "later")


def test_a_declared_test_file_that_errors_at_collection_is_not_run(judge: Host) -> None:
    r = attempt(judge, "colerr", package(GOOD),
                after={"tests/test_broken.py": "import not_a_module_here\n"})
    assert r.refused_with("reproduction_failed"), r
    refused(r, "tests_not_run", "colerr/tests/test_broken.py")


# -- honest twins ------------------------------------------------------------------------------


def test_a_platform_skip_beside_passing_tests_is_accepted_and_listed(judge: Host) -> None:
    test = TEST_ADD + textwrap.dedent("""\


        import sys

        import pytest


        @pytest.mark.skipif(sys.platform.startswith('linux'), reason='not on Linux')
        def test_elsewhere():
            pass
    """)
    r = attempt(judge, "platform", package(GOOD, **{"tests/test_core.py": test}))
    assert r.accepted, r
    section = r.sections[0]
    assert section["counts"]["passed"] == 1 and section["counts"]["skipped"] == 1
    assert section["skipped"] == [{"nodeid": "platform/tests/test_core.py::test_elsewhere",
                                   "reason": "not on Linux"}]
    assert section["collection"]["collected"] == 2


def test_a_package_with_several_test_files_is_accepted(judge: Host) -> None:
    more = {f"tests/test_more{i}.py": f"from pkg.core import add\n\n\ndef test_{i}():\n"
                                      f"    assert add({i}, 1) == {i + 1}\n" for i in range(3)}
    printing = ("def test_prints():\n    print('1 passed in 0.01s is what I say')\n")
    r = attempt(judge, "several", package(GOOD, **more, **{"tests/test_print.py": printing}))
    assert r.accepted, r
    assert r.sections[0]["counts"]["passed"] == 5
    assert r.sections[0]["summary"].startswith("5 passed")


def test_a_unittest_suite_with_subtests_is_accepted(judge: Host) -> None:
    test = UNITTEST_ADD + textwrap.dedent("""\

        class TestMany(unittest.TestCase):
            def test_each(self):
                for i in range(3):
                    with self.subTest(i=i):
                        self.assertEqual(add(i, 0), i)

            @unittest.skipIf(True, 'not today')
            def test_skipped(self):
                pass
    """)
    r = attempt(judge, "suite", package(GOOD, **{"tests/test_core.py": test}),
                runner="unittest")
    assert r.accepted, r
    section = r.sections[0]
    assert section["counts"]["passed"] == 3 and section["counts"]["skipped"] == 1
    assert section["summary"].startswith("Ran 4 tests")
    broken = attempt(judge, "suite2", package(GOOD, **{"tests/test_core.py": test}),
                     after={"pkg/core.py": BAD}, runner="unittest")
    assert broken.refused_with("reproduction_failed"), broken


def test_an_accepted_record_passes_audit_reproduce(workdir: Path) -> None:
    with Host(workdir, mode="reusable_pipeline") as h:
        r = attempt(h, "audited", package(GOOD, **{"tests/test_trivial.py": TRIVIAL}))
        assert r.accepted, r
        record = h.record_dir
    again = audit(record, reproduce=True)
    assert again.clean, [str(f) for f in again.findings]
    assert again.reproduced == 1
