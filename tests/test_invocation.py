"""The cited test command, parsed into what the Host will run (no shell, no workspace)."""

from __future__ import annotations

import pytest

from host_kernel.reproduce.invocation import InvocationRefused, parse
from host_kernel.reproduce.runner import read_report
from host_kernel.reproduce.scan import runner_hooks

FILES = {"pkg/__init__.py", "pkg/core.py", "tests/test_core.py", "tests/unit/test_more.py",
         "data/values.csv"}


@pytest.mark.parametrize("command, cwd, runner, paths, on_path", [
    ("python -m pytest -q tests", ".", "pytest", ("tests",), True),
    ("python3.11 -B -m pytest tests/test_core.py -x --tb=short", ".", "pytest",
     ("tests/test_core.py",), True),
    ("pytest -v tests/unit", ".", "pytest", ("tests/unit",), False),
    ("cd tests && python -m pytest -q . 2>&1", ".", "pytest", ("tests",), True),
    ("python -m pytest", "tests", "pytest", (), True),
    ("python -m unittest discover -s tests -v", ".", "unittest", ("tests",), True),
    ("python -m unittest tests.test_core", ".", "unittest", ("tests/test_core.py",), True),
    ("/usr/bin/python3 -m pytest -q tests", ".", "pytest", ("tests",), True),
])
def test_plain_runner_commands_parse(command: str, cwd: str, runner: str,
                                     paths: tuple[str, ...], on_path: bool) -> None:
    inv = parse(command, cwd, FILES)
    assert (inv.runner, inv.paths, inv.cwd_on_path) == (runner, paths, on_path)


@pytest.mark.parametrize("command, code", [
    ("python -m pytest -q tests || true", "runner_unrecognised"),
    ("python -m pytest -q tests; true", "runner_unrecognised"),
    ("python -m pytest -q tests | tee log", "runner_unrecognised"),
    ("echo $(false) && python -m pytest tests", "runner_unrecognised"),
    ("echo '1 passed' && python -m pytest --version", "runner_unrecognised"),
    ("trap 'exit 0' EXIT && python -m pytest tests", "runner_unrecognised"),
    ("PYTHONPATH=. python -m pytest tests", "runner_unrecognised"),
    ("env PATH=/x python -m pytest tests", "runner_unrecognised"),
    ("python -c 'print(1)'", "runner_unrecognised"),
    ("bash run_tests.sh", "runner_unrecognised"),
    ("python -m pytest -n 4 tests", "selection_not_allowed"),
    ("python -m pytest --frobnicate tests", "runner_unrecognised"),
    ("python -m pytest --version", "selection_not_allowed"),
    ("python -m pytest -h", "selection_not_allowed"),
    ("python -m pytest --co -q tests", "selection_not_allowed"),
    ("python -m pytest -k add tests", "selection_not_allowed"),
    ("python -m pytest -kadd tests", "selection_not_allowed"),
    ("python -m pytest -m fast tests", "selection_not_allowed"),
    ("python -m pytest --deselect tests/test_core.py::test_add tests", "selection_not_allowed"),
    ("python -m pytest --lf tests", "selection_not_allowed"),
    ("python -m pytest -p no:randomly tests", "selection_not_allowed"),
    ("python -m pytest -o addopts= tests", "selection_not_allowed"),
    ("python -m pytest -c other.ini tests", "selection_not_allowed"),
    ("python -m pytest --ignore=tests/unit tests", "selection_not_allowed"),
    ("python -m pytest tests/test_core.py::test_add", "selection_not_allowed"),
    ("python -m unittest -k add", "selection_not_allowed"),
    ("python -m unittest discover -s tests -p 'test_core*.py'", "selection_not_allowed"),
    ("python -m pytest -q failing", "test_path_undeclared"),
    ("python -m pytest -q /etc", "test_path_undeclared"),
    ("python -m pytest -q ../elsewhere", "test_path_undeclared"),
    ("cd .. && python -m pytest tests", "runner_unrecognised"),
])
def test_commands_the_host_will_not_reproduce(command: str, code: str) -> None:
    with pytest.raises(InvocationRefused) as info:
        parse(command, ".", FILES)
    assert info.value.code == code, info.value.message


def test_the_report_is_judged_test_by_test() -> None:
    lines = [
        '{"event": "collected", "before": 3, "after": 3, "removed_count": 0}',
        '{"event": "phase", "nodeid": "a", "when": "setup", "outcome": "passed"}',
        '{"event": "phase", "nodeid": "a", "when": "call", "outcome": "passed"}',
        '{"event": "phase", "nodeid": "b", "when": "setup", "outcome": "passed"}',
        '{"event": "phase", "nodeid": "b", "when": "teardown", "outcome": "passed"}',
        '{"event": "phase", "nodeid": "c", "when": "setup", "outcome": "skipped"}',
        '{"event": "finished", "exitstatus": 0}',
    ]
    # b was set up and torn down but never called: a report with its call dropped
    result = read_report("\n".join(lines).encode())
    assert result["outcome"] == "failed"
    assert result["counts"]["errors"] == 1 and result["counts"]["skipped"] == 1
    honest = [line for line in lines if '"b"' not in line]
    honest[0] = honest[0].replace('"before": 3', '"before": 2')
    assert read_report("\n".join(honest).encode())["outcome"] == "passed"
    # a forged "passed" line after the real "failed" one changes nothing
    forged = honest[:-1] + [
        '{"event": "phase", "nodeid": "a", "when": "call", "outcome": "failed"}',
        '{"event": "phase", "nodeid": "a", "when": "call", "outcome": "passed"}',
        honest[-1]]
    assert read_report("\n".join(forged).encode())["outcome"] == "failed"
    # no "finished" line: the run ended early
    assert read_report("\n".join(honest[:-1]).encode())["outcome"] == "incomplete"
    assert read_report(b"")["outcome"] == "incomplete"


def test_the_scan_names_each_way_into_the_runner() -> None:
    files = {
        "tests/conftest.py": b"import pytest\n@pytest.hookimpl(wrapper=True)\n"
                             b"def pytest_runtest_makereport(item, call):\n    return (yield)\n"
                             b"collect_ignore = ['test_bad.py']\n",
        "tests/test_x.py": b"from _pytest import runner\n",
        "pytest.py": b"print('5 passed')\n",
        "pytest.ini": b"[pytest]\naddopts = --deselect tests/test_x.py::test_a\n",
        "pkg/core.py": b"def add(a, b):\n    return a + b\n",
    }
    found = "\n".join(runner_hooks(files, {"."}))
    assert "pytest_runtest_makereport" in found
    assert "collect_ignore" in found
    assert "_pytest" in found
    assert "pytest.py" in found
    assert "addopts" in found
    assert "pkg/core.py" not in found
    assert runner_hooks({"pkg/core.py": files["pkg/core.py"],
                         "tests/test_core.py": b"from pkg.core import add\n"
                                               b"def test_add():\n    assert add(1, 2) == 3\n"},
                        {"."}) == []


def test_every_declared_test_file_must_be_under_a_cited_path() -> None:
    from host_kernel.reproduce import _uncited_tests

    sources = {p: "0" * 64 for p in FILES | {"tests/test_trivial.py", "pkg/util_test.py"}}
    one_file = parse("python -m pytest -q tests/test_trivial.py", ".", sources)
    assert _uncited_tests(sources, [one_file]) == ["pkg/util_test.py", "tests/test_core.py",
                                                   "tests/unit/test_more.py"]
    folder = parse("python -m pytest -q tests", ".", sources)
    assert _uncited_tests(sources, [folder]) == ["pkg/util_test.py"]
    everything = parse("python -m pytest -q", ".", sources)
    assert _uncited_tests(sources, [everything]) == []
    assert _uncited_tests(sources, [folder, parse("pytest pkg", ".", sources)]) == []
