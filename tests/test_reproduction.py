"""Verification by reproduction, through real cells: the Host re-runs the cited test command
itself, on the declared bytes alone, and its own run decides.

Every attack below leaves the agent's own receipt at exit 0 while the declared package is
broken (``pkg/core.py`` subtracts, the test asserts ``add(1, 2) == 3``): the submission is
refused with the named code, and the honest variant of the same package is accepted.

Code that must behave differently under the Host's run than under the agent's keys on
``sys.flags.isolated``: the Host runs its interpreter with ``-I``, the agent's ``python``
does not.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from host_kernel import Host
from host_kernel.audit import audit

from _helpers import NO_PLUGIN_AUTOLOAD, run_ok
from _pipeline import SOURCES, TEST_CMD, submit

GOOD = "def add(a, b):\n    return a + b\n"
BAD = "def add(a, b):\n    return a - b\n"
TEST_ADD = "from pkg.core import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
TRIVIAL = "def test_ok():\n    pass\n"
CMD = "python -m pytest -q tests"
#: A runner stand-in that claims success without running anything.
FAKE_RUNNER = "#!/bin/sh\necho '3 passed in 0.01s'\nexit 0\n"
FAKE_PYTEST_MODULE = "import os\nos.write(1, b'5 passed in 0.01s\\n')\nos._exit(0)\n"


def package(core: str = BAD, **extra: str) -> dict[str, str]:
    """The tiny package: ``pkg/core.py`` (broken by default) and its test, plus ``extra``."""
    files = {"pkg/__init__.py": "", "pkg/core.py": core, "tests/test_core.py": TEST_ADD}
    files.update(extra)
    return files


def put(host: Host, files: dict[str, str], save: bool = True) -> None:
    """Write each file through the Host (and save it as an artifact)."""
    lines = []
    for path, content in files.items():
        lines.append(f"host.write_file({path!r}, {content!r})")
        if save:
            lines.append(f"host.save_artifact({path!r})")
    run_ok(host, "\n".join(lines))


class Cell(str):
    """A producing cell's id, with the text its Observation showed."""

    text: str


def run(host: Host, *commands: str, setup: str = "", expect_exit: int | None = 0) -> Cell:
    """Run ``commands`` through host.bash in one cell, after ``setup`` (kernel code, e.g. an
    edited os.environ, undone afterwards); each must exit ``expect_exit``. Returns the cell id."""
    body = "\n".join(f"    _r = host.bash({c!r})\n    print('EXIT', _r.exit_status, {c!r})"
                     for c in commands)
    setup = NO_PLUGIN_AUTOLOAD + ("\n" + setup if setup else "")
    setup_lines = "\n".join("    " + line for line in setup.splitlines())
    code = (f"import os\n_env, _cwd = dict(os.environ), os.getcwd()\ntry:\n{setup_lines}\n"
            f"{body}\nfinally:\n    os.environ.clear()\n    os.environ.update(_env)\n"
            f"    os.chdir(_cwd)")
    obs = host.execute(code, timeout=120)
    assert obs.status == "ok", obs.text
    if expect_exit is not None:
        for command in commands:
            assert f"EXIT {expect_exit} {command}\n" in obs.text, obs.text
    cell = Cell(obs.cell_id)
    cell.text = obs.text
    return cell


@dataclass(repr=False)
class Result:
    accepted: bool
    #: code → message of every failed check.
    failed: dict[str, str]
    verdict: dict[str, Any]
    text: str
    wall: float = 0.0
    sections: list[dict[str, Any]] = field(default_factory=list)

    def refused_with(self, code: str) -> bool:
        return not self.accepted and code in self.failed

    def __repr__(self) -> str:
        runs = [(s.get("outcome"), s.get("counts"), s.get("exit_status")) for s in self.sections]
        return (f"Result(accepted={self.accepted}, failed="
                f"{ {k: v[:300] for k, v in self.failed.items()} }, runs={runs})")


def submit_files(host: Host, declared: list[str] | dict[str, str], command: str, cell: str,
                 entry: str = "pkg/core.py") -> Result:
    """Submit ``declared`` as source_files with one test evidence entry, from a new cell."""
    code = ("from host_kernel import SubmissionRefused\n"
            "try:\n"
            f"    v = host.submit_output({{'summary': 'adds numbers'}}, ['wrote pkg.core.add'], "
            f"task_status='completed', source_files={list(declared)!r}, "
            f"entry_points=[{entry!r}], architecture_summary='pkg.core owns the arithmetic "
            f"and the tests check it.', test_evidence=[{{'command': {command!r}, "
            f"'producing_cell_id': {cell!r}}}])\n"
            "except SubmissionRefused as e:\n"
            "    v = e.verdict\n"
            "print('VERDICT', __import__('json').dumps(v.to_dict()))")
    started = time.monotonic()
    obs = host.execute(code, timeout=300)
    wall = time.monotonic() - started
    line = next(l for o in obs.outputs for l in o.get("text", "").splitlines()
                if l.startswith("VERDICT "))
    verdict = json.loads(line[len("VERDICT "):])
    failed = {c["code"]: c["message"] for c in verdict["checks"] if not c["ok"]}
    shown = "\n".join(l for l in obs.text.splitlines() if not l.startswith("VERDICT "))
    return Result(verdict["accepted"], failed, verdict, shown, wall,
                  list(verdict.get("reproduction") or []))


def make_executable(host: Host, path: str, content: str) -> None:
    run_ok(host, f"host.write_file({path!r}, {content!r})\nimport os\nos.chmod({path!r}, 0o755)")


# -- 1. the runner replaced before it runs ---------------------------------------------------


def test_a_shell_function_a_path_shim_or_a_fake_interpreter_fools_only_the_agents_run(
        armed_host: Host) -> None:
    ws = armed_host.workdir
    files = package(BAD)
    put(armed_host, files)
    make_executable(armed_host, "fake/python", FAKE_RUNNER)
    shell_function = "python() { echo '3 passed in 0.01s'; }\n"
    run_ok(armed_host, f"host.write_file('fake/bashenv', {shell_function!r})")
    via_bash_env = run(armed_host, CMD,
                       setup=f"os.environ['BASH_ENV'] = {str(ws / 'fake/bashenv')!r}")
    via_path = run(armed_host, CMD,
                   setup=f"os.environ['PATH'] = {str(ws / 'fake')!r} + ':' + os.environ['PATH']")
    absolute = f"{ws}/fake/python -m pytest -q tests"
    via_absolute = run(armed_host, absolute)
    for cell in (via_bash_env, via_path, via_absolute):
        assert "3 passed" in cell.text, cell.text  # the agent's own run says it passed

    results = [submit_files(armed_host, files, CMD, via_bash_env),
               submit_files(armed_host, files, CMD, via_path),
               submit_files(armed_host, files, absolute, via_absolute)]
    for r in results:
        assert r.refused_with("reproduction_failed"), r
        assert "assert -1 == 3" in r.failed["reproduction_failed"]
        assert r.sections[0]["counts"]["failed"] == 1
    # The parse of an absolute fake runner is the Host's own invocation: the same run, cached.
    assert [r.sections[0]["cached"] for r in results] == [False, True, True]
    assert results[2].sections[0]["invocation"]["runner"] == "pytest"
    assert results[2].sections[0]["interpreter"] != f"{ws}/fake/python"

    put(armed_host, {"pkg/core.py": GOOD})
    honest = submit_files(armed_host, files, CMD, via_bash_env)
    assert honest.accepted, honest
    assert honest.sections[0]["counts"]["passed"] == 1


#: (command, expected code). Each exits 0 in the agent's run on the broken package.
SHELL_AND_SELECTION = [
    ("trap 'exit 0' EXIT; python -m pytest -q tests", "runner_unrecognised"),
    ("python -m pytest -q tests || true", "runner_unrecognised"),
    ("python -m pytest -q tests | tail -n 1", "runner_unrecognised"),
    ("hash -p {ws}/fake/python python; python -m pytest -q tests", "runner_unrecognised"),
    ("PYTHONPATH=shadow python -m pytest -q tests/test_trivial.py", "runner_unrecognised"),
    ("env PYTHONPATH=shadow python -m pytest -q tests/test_trivial.py", "runner_unrecognised"),
    ("bash -c 'python -m pytest -q tests || true'", "runner_unrecognised"),
    ("python -c \"print('3 passed')\"", "runner_unrecognised"),
    ("echo '1 passed' && python -m pytest --version", "runner_unrecognised"),
    ("python -m pytest -q tests $(echo --co)", "runner_unrecognised"),
    ("python -m pytest --version", "selection_not_allowed"),
    ("python -m pytest -h", "selection_not_allowed"),
    ("python -m pytest -q --co tests", "selection_not_allowed"),
    ("python -m pytest -q tests --deselect tests/test_core.py::test_add", "selection_not_allowed"),
    ("python -m pytest -q tests -ktrivial", "selection_not_allowed"),
    ("python -m pytest -q tests/test_trivial.py::test_ok", "selection_not_allowed"),
    ("python -m pytest -q --ignore=tests/test_core.py tests", "selection_not_allowed"),
    ("python -m pytest -q -o python_files=test_trivial.py tests", "selection_not_allowed"),
    ("python -m pytest -q extra_tests", "test_path_undeclared"),
    ("python -m pytest -q {ws}/tests/test_trivial.py", "test_path_undeclared"),
]


def test_shell_syntax_selection_and_undeclared_paths_are_refused_before_anything_runs(
        armed_host: Host) -> None:
    ws = armed_host.workdir
    files = package(BAD, **{"tests/test_trivial.py": TRIVIAL})
    put(armed_host, files)
    put(armed_host, {"shadow/pkg/__init__.py": "", "shadow/pkg/core.py": GOOD,
                     "extra_tests/test_extra.py": TRIVIAL}, save=False)
    make_executable(armed_host, "fake/python", FAKE_RUNNER)
    commands = [(c.format(ws=ws), code) for c, code in SHELL_AND_SELECTION]
    cell = run(armed_host, *[c for c, _ in commands])
    wrong = {}
    for command, code in commands:
        r = submit_files(armed_host, files, command, cell)
        if not r.refused_with(code):
            wrong[command] = (code, r.accepted, r.failed)
        elif r.sections:
            wrong[command] = ("ran a reproduction", r.sections)
    assert not wrong, wrong

    put(armed_host, {"pkg/core.py": GOOD})
    redirected = CMD + " 2>&1"
    honest_cell = run(armed_host, CMD, redirected)
    honest = submit_files(armed_host, files, CMD, honest_cell)
    assert honest.accepted, honest
    assert honest.sections[0]["counts"]["passed"] == 2
    # A trailing 2>&1 is the same invocation: accepted, from the cache.
    same = submit_files(armed_host, files, redirected, honest_cell)
    assert same.accepted and same.sections[0]["cached"] is True, same


# -- 2. runner modules shadowed --------------------------------------------------------------


@pytest.mark.parametrize("shadow", [
    {"pytest.py": FAKE_PYTEST_MODULE},
    {"_pytest/__init__.py": FAKE_PYTEST_MODULE},
], ids=["pytest.py", "_pytest-package"])
def test_a_shadowing_runner_module_is_absent_from_the_tree_or_refused_when_declared(
        armed_host: Host, shadow: dict[str, str]) -> None:
    files = package(BAD)
    put(armed_host, files)
    put(armed_host, shadow)
    cell = run(armed_host, CMD)
    assert "5 passed" in cell.text, cell.text
    undeclared = submit_files(armed_host, files, CMD, cell)
    assert undeclared.refused_with("reproduction_failed"), undeclared
    declared = submit_files(armed_host, {**files, **shadow}, CMD, cell)
    assert declared.refused_with("runner_tampered"), declared
    assert next(iter(shadow)) in declared.failed["runner_tampered"]
    assert not declared.sections  # refused before anything ran

    put(armed_host, {"pkg/core.py": GOOD})
    honest = submit_files(armed_host, files, CMD, cell)
    assert honest.accepted, honest


def test_a_sitecustomize_reached_through_pythonpath_is_refused(armed_host: Host) -> None:
    ws = armed_host.workdir
    site = "import os\nos.write(1, b'4 passed in 0.01s\\n')\nos._exit(0)\n"
    files = package(BAD)
    put(armed_host, files)
    put(armed_host, {"sitecustomize.py": site})
    cell = run(armed_host, CMD, setup=f"os.environ['PYTHONPATH'] = {str(ws)!r} + ':' + "
                                      f"os.environ.get('PYTHONPATH', '')")
    undeclared = submit_files(armed_host, files, CMD, cell)
    assert undeclared.refused_with("reproduction_failed"), undeclared
    declared = submit_files(armed_host, {**files, "sitecustomize.py": site}, CMD, cell)
    assert declared.refused_with("runner_tampered"), declared
    inline = "PYTHONPATH=. python -m pytest -q tests"
    inline_cell = run(armed_host, inline)
    in_command = submit_files(armed_host, files, inline, inline_cell)
    assert in_command.refused_with("runner_unrecognised"), in_command

    put(armed_host, {"pkg/core.py": GOOD})
    honest = submit_files(armed_host, files, CMD, cell)
    assert honest.accepted, honest


def test_a_shadow_reached_by_cd_into_its_folder_is_refused(armed_host: Host) -> None:
    # The root conftest.py puts the tree's root on the path (pytest's prepend import mode),
    # so ../tests imports pkg from the root in both runs.
    files = package(BAD, **{"conftest.py": "", "sub/README.txt": "scratch folder\n"})
    put(armed_host, files)
    put(armed_host, {"sub/pytest.py": FAKE_PYTEST_MODULE})
    command = "cd sub && python -m pytest -q ../tests"
    cell = run(armed_host, command)
    undeclared = submit_files(armed_host, files, command, cell)
    assert undeclared.refused_with("reproduction_failed"), undeclared
    assert undeclared.sections[0]["invocation"]["cwd"] == "sub"
    declared = submit_files(armed_host, {**files, "sub/pytest.py": FAKE_PYTEST_MODULE}, command,
                            cell)
    assert declared.refused_with("runner_tampered"), declared
    assert "sub/pytest.py" in declared.failed["runner_tampered"]

    put(armed_host, {"pkg/core.py": GOOD})
    honest = submit_files(armed_host, files, command, cell)
    assert honest.accepted, honest


def test_files_dropped_into_the_package_overlay_are_environment_tampering(
        armed_host: Host) -> None:
    files = package(BAD)
    put(armed_host, files)
    plant = ("import os\n_site = os.environ['PIP_TARGET']\n"
             "def plant(rel, text):\n"
             "    path = os.path.join(_site, rel)\n"
             "    os.makedirs(os.path.dirname(path), exist_ok=True)\n"
             "    open(path, 'w').write(text)\n"
             "def unplant(rel):\n    os.remove(os.path.join(_site, rel))\n")
    run_ok(armed_host, plant)
    # A sitecustomize in the overlay (on the kernel's PYTHONPATH) fakes the agent's own run.
    site = "import os\nos.write(1, b'7 passed\\n')\nos._exit(0)\n"
    run_ok(armed_host, f"plant('sitecustomize.py', {site!r})")
    cell = run(armed_host, CMD)
    assert "7 passed" in cell.text, cell.text
    tampered = submit_files(armed_host, files, CMD, cell)
    assert tampered.refused_with("environment_tampered"), tampered
    assert "sitecustomize.py" in tampered.failed["environment_tampered"]
    assert not tampered.sections
    run_ok(armed_host, "unplant('sitecustomize.py')")
    for rel, text in [("evil.pth", "import os; os.environ['X'] = '1'\n"),
                      ("pytest.py", FAKE_PYTEST_MODULE),
                      ("pkg/core.py", GOOD),
                      ("stray.pyc", "bytecode without its source")]:
        run_ok(armed_host, f"plant({rel!r}, {text!r})")
        try:
            r = submit_files(armed_host, files, CMD, cell)
            assert r.refused_with("environment_tampered"), (rel, r)
            assert os.path.basename(rel) in r.failed["environment_tampered"], rel
        finally:
            run_ok(armed_host, f"unplant({rel!r})")
    # Once the overlay is clean again the run is reproduced, and the broken package fails.
    clean = submit_files(armed_host, files, CMD, cell)
    assert clean.refused_with("reproduction_failed"), clean
    assert "environment_tampered" not in clean.failed

    put(armed_host, {"pkg/core.py": GOOD})
    honest = submit_files(armed_host, files, CMD, cell)
    assert honest.accepted, honest


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _forged_distribution(files: dict[str, bytes], name: str = "pkg", version: str = "9.9") -> str:
    """Kernel code writing ``files`` into the overlay with a dist-info whose RECORD vouches
    for them (no pip involved)."""
    info = f"{name}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\n"
                                          f"Version: {version}\n\n".encode()}
    rows = [f"{rel},sha256={_record_hash(data)},{len(data)}" for rel, data in files.items()]
    rows.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(rows) + "\n").encode()
    return ("import os\n_site = os.environ['PIP_TARGET']\n"
            f"for rel, data in {files!r}.items():\n"
            "    path = os.path.join(_site, rel)\n"
            "    os.makedirs(os.path.dirname(path), exist_ok=True)\n"
            "    open(path, 'wb').write(data)\n")


def test_a_copy_of_the_package_in_the_overlay_does_not_stand_in_for_the_declared_one(
        armed_host: Host) -> None:
    """``python -m pytest`` puts its folder before PYTHONPATH (the overlay): the declared
    ``pkg`` must be the one the Host's run imports, not a same-named copy in the overlay."""
    files = package(GOOD)
    put(armed_host, files)
    cell = run(armed_host, CMD)
    run_ok(armed_host, _forged_distribution({"pkg/__init__.py": b"", "pkg/core.py": GOOD.encode()}))
    put(armed_host, {"pkg/core.py": BAD})
    r = submit_files(armed_host, files, CMD, cell)
    # The Host installs pkg==9.9 itself (it cannot: no index serves it) and never imports the
    # kernel's copy, so the declared, broken pkg fails: refused, naming what was missing.
    assert r.refused_with("reproduction_failed") or r.refused_with("environment_tampered") \
        or r.refused_with("environment_unavailable"), r


# -- 4. tests deselected ---------------------------------------------------------------------


def test_citing_only_a_trivial_test_file_leaves_the_failing_one_out_and_is_refused(
        armed_host: Host) -> None:
    """A trivial test file is the path-shaped way to deselect: every declared test file must
    be under a cited path. Declaring only the trivial test (and not the failing one) leaves
    the failing test out of the tree, and the package's tests are then what a reviewer sees."""
    files = package(BAD, **{"tests/test_trivial.py": TRIVIAL})
    put(armed_host, files)
    command = "python -m pytest -q tests/test_trivial.py"
    cell = run(armed_host, command)
    r = submit_files(armed_host, files, command, cell)
    assert r.refused_with("selection_not_allowed"), r
    assert "tests/test_core.py" in r.failed["selection_not_allowed"]
    assert r.sections == []  # refused before anything ran

    # Citing the folder runs the failing test too (the agent's own run fails: exit 1);
    # with the code fixed, the folder's evidence is accepted.
    run(armed_host, CMD, expect_exit=1)
    put(armed_host, {"pkg/core.py": GOOD})
    honest = submit_files(armed_host, files, CMD, run(armed_host, CMD))
    assert honest.accepted, honest
    assert honest.sections[0]["counts"]["passed"] == 2


CONFIGS = [
    ("pytest.ini", "[pytest]\naddopts = --deselect tests/test_core.py::test_add\n"),
    ("pyproject.toml", "[tool.pytest.ini_options]\naddopts = \"-k trivial\"\n"),
    ("setup.cfg", "[tool:pytest]\npython_functions = test_ok\n"),
]


def test_a_config_that_deselects_is_tampering_when_declared_and_absent_when_not(
        armed_host: Host) -> None:
    files = package(BAD, **{"tests/test_trivial.py": TRIVIAL})
    put(armed_host, files)
    for name, text in CONFIGS:
        put(armed_host, {name: text})
        cell = run(armed_host, CMD)
        declared = submit_files(armed_host, {**files, name: text}, CMD, cell)
        assert declared.refused_with("runner_tampered"), (name, text, declared)
        assert name in declared.failed["runner_tampered"]
        undeclared = submit_files(armed_host, files, CMD, cell)
        assert undeclared.refused_with("reproduction_failed"), (name, text, undeclared)
        run_ok(armed_host, f"import os\nos.remove({name!r})")

    # A declared config that only registers markers is the tree's own, and is used.
    ini = "[pytest]\nmarkers =\n    slow: a slow test\n"
    put(armed_host, {"pkg/core.py": GOOD, "pytest.ini": ini})
    cell = run(armed_host, CMD)
    honest = submit_files(armed_host, {**files, "pytest.ini": ini}, CMD, cell)
    assert honest.accepted, honest
    argv = honest.sections[0]["argv"]
    assert argv[argv.index("-c") + 1].endswith("/tree/pytest.ini")


CONFTESTS = {
    "drops failing tests": (
        "def pytest_collection_modifyitems(config, items):\n"
        "    items[:] = [i for i in items if 'add' not in i.name]\n"),
    "rewrites outcomes": (
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    report = outcome.get_result()\n"
        "    report.outcome = 'passed'\n"),
    "reports a pass": (
        "def pytest_report_teststatus(report, config):\n"
        "    if report.when == 'call':\n        return 'passed', '.', 'PASSED'\n"),
    "ignores the file": "collect_ignore = ['test_core.py']\n",
    "loads a plugin": "pytest_plugins = ['tests.helper_plugin']\n",
    "reaches the plugin manager": (
        "def pytest_configure(config):\n"
        "    config.pluginmanager.set_blocked('python')\n"),
    "imports the runner's internals": "from _pytest.runner import CallInfo\n",
}


def test_a_conftest_that_reaches_into_the_runner_is_tampering(armed_host: Host) -> None:
    files = package(BAD, **{"tests/test_trivial.py": TRIVIAL})
    put(armed_host, files)
    # The receipt: a conftest that rewrites outcomes makes the agent's own run pass.
    put(armed_host, {"tests/conftest.py": CONFTESTS["rewrites outcomes"]})
    cell = run(armed_host, CMD)
    wrong = {}
    for what, conftest in CONFTESTS.items():
        put(armed_host, {"tests/conftest.py": conftest})
        r = submit_files(armed_host, {**files, "tests/conftest.py": conftest}, CMD, cell)
        if not r.refused_with("runner_tampered") or r.sections:
            wrong[what] = (r.accepted, r.failed)
    assert not wrong, wrong

    # Undeclared, the conftest is not in the tree, and the Host's run fails.
    put(armed_host, {"tests/conftest.py": CONFTESTS["rewrites outcomes"]})
    undeclared = submit_files(armed_host, files, CMD, cell)
    assert undeclared.refused_with("reproduction_failed"), undeclared

    # A conftest with a plain fixture is fine.
    fixture = ("import pytest\n\n\n@pytest.fixture\ndef numbers():\n    return (1, 2)\n")
    uses = ("from pkg.core import add\n\n\ndef test_add(numbers):\n"
            "    assert add(*numbers) == 3\n")
    put(armed_host, {"pkg/core.py": GOOD, "tests/conftest.py": fixture,
                     "tests/test_core.py": uses})
    honest_cell = run(armed_host, CMD)
    honest = submit_files(armed_host, {**files, "tests/conftest.py": fixture,
                                       "tests/test_core.py": uses}, CMD, honest_cell)
    assert honest.accepted, honest
    assert honest.sections[0]["counts"]["passed"] == 2


def test_test_code_that_patches_the_hosts_reporter_does_not_turn_a_failure_into_a_pass(
        armed_host: Host) -> None:
    """A test module with no hook, no runner import and no plugin manager (nothing the static
    reading names) finds the Host's report writer with ``gc`` and turns 'failed' into
    'passed'. pytest itself still counts the failure: its exit status is 1, and the Host,
    which records that status, must not accept a run its own runner says failed."""
    patcher = TEST_ADD + (
        "\nimport gc\n\nfor _o in gc.get_objects():\n"
        "    if type(_o).__name__ == '_Report':\n"
        "        def _emit(_real=_o.emit, **event):\n"
        "            if event.get('outcome') == 'failed':\n"
        "                event['outcome'] = 'passed'\n"
        "            _real(**event)\n"
        "        _o.emit = _emit\n")
    files = package(GOOD, **{"tests/test_core.py": patcher})
    put(armed_host, files)
    cell = run(armed_host, CMD)
    put(armed_host, {"pkg/core.py": BAD})
    r = submit_files(armed_host, files, CMD, cell)
    section = r.sections[0] if r.sections else {}
    assert not r.accepted, (section.get("outcome"), section.get("counts"),
                            section.get("exit_status"))


# -- 5. tests ran on other bytes -------------------------------------------------------------


def test_a_stale_pycache_passes_the_agents_run_but_not_the_hosts(armed_host: Host) -> None:
    files = package(GOOD)
    put(armed_host, files)
    # Bytecode of the good source that Python never checks against the source again.
    run_ok(armed_host, "import py_compile, sys\n"
                       "py_compile.compile('pkg/core.py', cfile='pkg/__pycache__/core.'"
                       " + sys.implementation.cache_tag + '.pyc', "
                       "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)")
    put(armed_host, {"pkg/core.py": BAD})
    cell = run(armed_host, CMD)
    r = submit_files(armed_host, files, CMD, cell)
    assert r.refused_with("reproduction_failed"), r
    pyc = run_ok(armed_host, "import glob\nprint(glob.glob('pkg/__pycache__/*.pyc')[0])")
    pyc = pyc.split()[-1]
    run_ok(armed_host, f"host.save_artifact({pyc!r})")
    as_source = submit_files(armed_host, [*files, pyc], CMD, cell)
    assert as_source.refused_with("source_bytecode"), as_source

    put(armed_host, {"pkg/core.py": GOOD})
    honest = submit_files(armed_host, files, CMD, cell)
    assert honest.accepted, honest


def test_a_good_copy_under_tests_shadowing_the_package_is_not_in_the_tree(
        armed_host: Host) -> None:
    files = package(BAD)
    put(armed_host, files)
    put(armed_host, {"tests/pkg/__init__.py": "", "tests/pkg/core.py": GOOD}, save=False)
    cell = run(armed_host, CMD)
    r = submit_files(armed_host, files, CMD, cell)
    assert r.refused_with("reproduction_failed"), r

    put(armed_host, {"pkg/core.py": GOOD})
    honest = submit_files(armed_host, files, CMD, cell)
    assert honest.accepted, honest


def test_a_source_broken_after_the_passing_run_is_caught(armed_host: Host) -> None:
    files = package(GOOD)
    put(armed_host, files)
    cell = run(armed_host, CMD)
    put(armed_host, {"pkg/core.py": BAD})
    r = submit_files(armed_host, files, CMD, cell)
    assert r.refused_with("reproduction_failed"), r
    assert "exit_nonzero" not in r.failed and "receipt_missing" not in r.failed


def test_an_undeclared_imported_module_is_missing_from_the_tree(armed_host: Host) -> None:
    helper = "def offset():\n    return 0\n"
    core = "from pkg.helper import offset\n\n\ndef add(a, b):\n    return a + b + offset()\n"
    files = package(core)
    put(armed_host, {**files, "pkg/helper.py": helper})
    cell = run(armed_host, CMD)
    undeclared = submit_files(armed_host, files, CMD, cell)
    assert undeclared.refused_with("reproduction_failed"), undeclared
    assert "pkg.helper" in undeclared.failed["reproduction_failed"]
    assert "may be undeclared" in undeclared.failed["reproduction_failed"]
    declared = submit_files(armed_host, {**files, "pkg/helper.py": helper}, CMD, cell)
    assert declared.accepted, declared


def test_a_changed_undeclared_module_is_the_version_the_host_never_sees(armed_host: Host) -> None:
    """The helper is changed after the run to make a broken core pass: not declared, so not in
    the tree; declared, its saved bytes are the ones run."""
    core = "from pkg.helper import offset\n\n\ndef add(a, b):\n    return a - b + offset(b)\n"
    helper_fix = "def offset(b):\n    return 2 * b\n"
    helper_saved = "def offset(b):\n    return 0\n"
    files = package(core)
    put(armed_host, {**files, "pkg/helper.py": helper_saved})
    put(armed_host, {"pkg/helper.py": helper_fix}, save=False)
    cell = run(armed_host, CMD)
    declared = submit_files(armed_host, {**files, "pkg/helper.py": helper_fix}, CMD, cell)
    assert declared.refused_with("source_not_saved"), declared
    undeclared = submit_files(armed_host, files, CMD, cell)
    assert undeclared.refused_with("reproduction_failed"), undeclared


# -- 7. test data ----------------------------------------------------------------------------


def test_tests_that_read_a_data_file_pass_only_when_it_is_declared(armed_host: Host) -> None:
    test = ("from pathlib import Path\n\nfrom pkg.core import add\n\n"
            "DATA = Path(__file__).resolve().parent.parent / 'data' / 'values.csv'\n\n\n"
            "def test_rows_add_up():\n"
            "    for line in DATA.read_text().splitlines():\n"
            "        a, b, total = map(int, line.split(','))\n"
            "        assert add(a, b) == total\n")
    files = package(GOOD, **{"tests/test_core.py": test, "data/values.csv": "1,2,3\n4,5,9\n"})
    put(armed_host, files)
    cell = run(armed_host, CMD)
    without = [p for p in files if p != "data/values.csv"]
    undeclared = submit_files(armed_host, without, CMD, cell)
    assert undeclared.refused_with("reproduction_failed"), undeclared
    assert "values.csv" in undeclared.failed["reproduction_failed"]
    declared = submit_files(armed_host, files, CMD, cell)
    assert declared.accepted, declared


# -- 8. time and memory ----------------------------------------------------------------------


def _processes_with(marker: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_a_run_past_the_time_limit_is_stopped_with_everything_it_started(workdir: Path) -> None:
    limit = 3
    test = ("import subprocess, sys, time\n\nfrom pkg.core import add\n\n\n"
            "def test_add():\n"
            "    if sys.flags.isolated:  # only under the Host's run\n"
            "        subprocess.Popen(['sleep', '3007'])\n"
            "        time.sleep(30)\n"
            "    assert add(1, 2) == 3\n")
    with Host(workdir, mode="reusable_pipeline", reproduce_timeout=limit) as h:
        files = package(GOOD, **{"tests/test_core.py": test})
        put(h, files)
        cell = run(h, CMD)
        r = submit_files(h, files, CMD, cell)
        assert r.refused_with("reproduction_timeout"), r
        section = r.sections[0]
        assert section["outcome"] == "timeout"
        assert section["limits"]["timeout"] == limit
        assert section["duration"] < limit + 2
        assert r.wall < limit + 15
        assert f"{limit} s limit" in r.failed["reproduction_timeout"]
        assert not _processes_with(b"sleep\x003007"), "the run's child outlived the timeout"
        assert h.execute("1 + 1").status == "ok"


def test_a_run_that_allocates_without_bound_is_stopped_and_the_host_lives(workdir: Path) -> None:
    test = ("import sys\n\nfrom pkg.core import add\n\n\n"
            "def test_add():\n"
            "    if sys.flags.isolated:  # only under the Host's run\n"
            "        hoard = []\n"
            "        while True:\n"
            "            hoard.append(bytearray(50 * 2**20))\n"
            "    assert add(1, 2) == 3\n")
    with Host(workdir, mode="reusable_pipeline", reproduce_memory=512 * 2**20) as h:
        files = package(GOOD, **{"tests/test_core.py": test})
        put(h, files)
        cell = run(h, CMD)
        r = submit_files(h, files, CMD, cell)
        assert not r.accepted, r
        assert {"reproduction_failed", "reproduction_error"} & set(r.failed), r.failed
        assert r.sections[0]["limits"]["memory"] == 512 * 2**20
        assert h.execute("1 + 1").status == "ok"
        # The same bound lets an ordinary suite run.
        put(h, {"tests/test_core.py": TEST_ADD})
        honest = submit_files(h, files, CMD, cell)
        assert honest.accepted, honest


# -- 9. codebase_change ----------------------------------------------------------------------

MODULES = 30


def _write_codebase(root: Path) -> None:
    (root / "pkg").mkdir()
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    for i in range(MODULES):
        (root / "pkg" / f"mod{i:02d}.py").write_text(f"def value():\n    return {i}\n")
        (root / "tests" / f"test_mod{i:02d}.py").write_text(
            f"from pkg.mod{i:02d} import value\n\n\ndef test_value(base):\n"
            f"    assert value() == base + {i}\n")
    (root / "tests" / "conftest.py").write_text(
        "import pytest\n\n\n@pytest.fixture\ndef base():\n    return 0\n")
    (root / "README.md").write_text("A codebase of small modules.\n")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t",
                    "-c", "init.defaultBranch=main", *args], cwd=root, check=True,
                   capture_output=True)


@pytest.fixture
def git_codebase(workdir: Path) -> Path:
    _write_codebase(workdir)
    _git(workdir, "init", "-q")
    _git(workdir, "add", "-A")
    _git(workdir, "commit", "-q", "-m", "baseline")
    return workdir


def _change_one_module(h: Host) -> Result:
    run_ok(h, "host.edit_file('pkg/mod07.py', 'return 7', 'return 3 + 4')\n"
              "host.save_artifact('pkg/mod07.py')")
    cell = run(h, CMD)
    return submit_files(h, ["pkg/mod07.py"], CMD, cell, entry="pkg/mod07.py")


def test_a_change_in_a_git_repository_is_reproduced_on_head_plus_the_declared_file(
        git_codebase: Path) -> None:
    with Host(git_codebase, mode="codebase_change") as h:
        r = _change_one_module(h)
        assert r.accepted, r
        section = r.sections[0]
        assert section["counts"]["passed"] == MODULES
        assert section["counts"]["collected"] == MODULES
        # The modules and their tests, conftest.py, pkg/__init__.py and README.md.
        assert section["tree_files"] == MODULES * 2 + 3
        baseline = h.ledger.query("SELECT body FROM events WHERE kind = 'baseline_recorded'")
        assert json.loads(baseline[0]["body"])["kind"] == "git"

        # A breaking edit "fixed" by also editing an undeclared test: the test edit is not in
        # the tree, which holds HEAD's test.
        run_ok(h, "host.edit_file('pkg/mod07.py', 'return 3 + 4', 'return 8')\n"
                  "host.save_artifact('pkg/mod07.py')\n"
                  "host.edit_file('tests/test_mod07.py', 'base + 7', 'base + 8')")
        cell = run(h, CMD)
        broken = submit_files(h, ["pkg/mod07.py"], CMD, cell, entry="pkg/mod07.py")
        assert broken.refused_with("reproduction_failed"), broken
        assert broken.sections[0]["failing"] == ["tests/test_mod07.py::test_value"]


def test_a_change_in_a_plain_folder_is_reproduced_on_its_files_at_start(workdir: Path) -> None:
    _write_codebase(workdir)
    with Host(workdir, mode="codebase_change") as h:
        r = _change_one_module(h)
        assert r.accepted, r
        assert r.sections[0]["counts"]["passed"] == MODULES
        baseline = h.ledger.query("SELECT body FROM events WHERE kind = 'baseline_recorded'")
        assert json.loads(baseline[0]["body"])["kind"] == "files"


# -- 10. audit -------------------------------------------------------------------------------


def test_audit_re_runs_an_accepted_submission_and_catches_an_altered_source_blob(
        fresh: Host) -> None:
    accepted, _, text = submit(fresh)
    assert accepted, text
    record = fresh.record_dir
    # the test file: declared and saved, but not claimed in output, so only the
    # reproduction reads its blob
    sha = hashlib.sha256(SOURCES["tests/test_core.py"].encode()).hexdigest()
    fresh.close()

    plain = audit(record)
    assert plain.clean, [str(f) for f in plain.findings]
    again = audit(record, reproduce=True)
    assert again.clean, [str(f) for f in again.findings]
    assert again.reproduced >= 1
    cli = [sys.executable, "-m", "host_kernel", "audit", str(record), "--reproduce"]
    ran = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "test commands re-run" in ran.stdout

    blob = record / "blobs" / "sha256" / sha[:2] / sha
    os.chmod(blob, 0o644)
    blob.write_text("def test_add():\n    pass\n")
    altered = audit(record, reproduce=True)
    assert not altered.clean
    fatal = {f.code for f in altered.findings if f.fatal}
    # the store's own check sees the blob, and the re-run cannot rebuild the declared tree
    assert {"blob_altered", "submission_unbacked"} <= fatal, [str(f) for f in altered.findings]
    assert any("reproduction_error" in f.message for f in altered.findings
               if f.code == "submission_unbacked")
    ran = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1, ran.stdout + ran.stderr


# -- 11. caching -----------------------------------------------------------------------------


def test_the_same_submission_twice_is_reproduced_once(honest: Host) -> None:
    cell = honest._evidence_cell  # type: ignore[attr-defined]
    first = submit_files(honest, list(SOURCES), TEST_CMD, cell)
    second = submit_files(honest, list(SOURCES), TEST_CMD, cell)
    assert first.accepted and second.accepted, (first, second)
    assert second.sections[0]["cached"] is True
    assert second.sections[0]["tree_digest"] == first.sections[0]["tree_digest"]
    assert second.sections[0]["counts"] == first.sections[0]["counts"]


def test_a_changed_declared_file_is_reproduced_again(armed_host: Host) -> None:
    files = package(GOOD)
    put(armed_host, files)
    cell = run(armed_host, CMD)
    first = submit_files(armed_host, files, CMD, cell)
    put(armed_host, {"pkg/core.py": "def add(a, b):\n    return b + a\n"})
    second = submit_files(armed_host, files, CMD, cell)
    assert first.accepted and second.accepted, (first, second)
    assert second.sections[0]["cached"] is False
    assert second.sections[0]["tree_digest"] != first.sections[0]["tree_digest"]


# -- 12. unittest ----------------------------------------------------------------------------


def test_unittest_discovery_is_reproduced(armed_host: Host) -> None:
    test = ("import unittest\n\nfrom pkg.core import add\n\n\n"
            "class TestAdd(unittest.TestCase):\n"
            "    def test_add(self):\n        self.assertEqual(add(1, 2), 3)\n\n"
            "    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\n")
    files = package(GOOD, **{"tests/test_core.py": test})
    put(armed_host, files)
    command = "python -m unittest discover -s tests"
    selecting = ["python -m unittest discover -s tests -k zero",
                 "python -m unittest tests.test_core.TestAdd"]
    cell = run(armed_host, command, *selecting)
    honest = submit_files(armed_host, files, command, cell)
    assert honest.accepted, honest
    assert honest.sections[0]["invocation"]["runner"] == "unittest"
    assert honest.sections[0]["counts"]["passed"] == 2
    for sel in selecting:
        r = submit_files(armed_host, files, sel, cell)
        assert r.refused_with("selection_not_allowed"), (sel, r)

    put(armed_host, {"pkg/core.py": BAD})
    broken = submit_files(armed_host, files, command, cell)
    assert broken.refused_with("reproduction_failed"), broken
    assert broken.sections[0]["counts"]["failed"] == 1
