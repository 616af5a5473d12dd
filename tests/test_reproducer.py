"""The Reproducer on its own (no kernel): a tree from the blob store, the Host's run, its report."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_kernel.reproduce import Limits, Reproducer
from host_kernel.reproduce.invocation import parse
from host_kernel.reproduce.runner import Plan
from host_kernel.store.blobs import FileBlobStore

GOOD = {
    "pkg/__init__.py": "",
    "pkg/core.py": "def add(a, b):\n    return a + b\n",
    "tests/test_core.py": "from pkg.core import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
}
BROKEN = dict(GOOD, **{"pkg/core.py": "def add(a, b):\n    return a - b\n"})


@pytest.fixture
def reproducer(tmp_path: Path) -> Iterator[tuple[Reproducer, FileBlobStore]]:
    blobs = FileBlobStore(tmp_path / "record", durable=False)
    r = Reproducer(blobs, hidden=[tmp_path / "record"], limits=Limits(timeout=60),
                   base=tmp_path / "runs")
    yield r, blobs
    r.close()


def _run(reproducer: tuple[Reproducer, FileBlobStore], files: dict[str, str],
         command: str = "python -m pytest -q tests", declared: bool = True,
         clean_env: bool = True) -> dict[str, object]:
    r, blobs = reproducer
    manifest = {p: (blobs.put_bytes(textwrap.dedent(c).encode()).sha256, 0o644)
                for p, c in files.items()}
    env, problems = r.environment()
    assert problems == [] or not clean_env
    plan = Plan(command, parse(command, ".", manifest), manifest,
                declared=frozenset(files) if declared else frozenset())
    return r.run(plan, env)


def test_the_declared_files_pass_and_a_broken_one_fails(reproducer: tuple[Reproducer, FileBlobStore]
                                                        ) -> None:
    good = _run(reproducer, GOOD)
    assert good["outcome"] == "passed" and good["counts"]["passed"] == 1  # type: ignore[index]
    assert good["exit_status"] == 0
    bad = _run(reproducer, BROKEN)
    assert bad["outcome"] == "failed"
    assert "tests/test_core.py::test_add" in bad["failing"]  # type: ignore[operator]


def test_a_hook_built_at_run_time_in_a_declared_conftest_is_caught(
        reproducer: tuple[Reproducer, FileBlobStore]) -> None:
    # No hook name appears in the source, so the static scan cannot see it; the plugin
    # sees the registered implementation and where its code came from.
    conftest = '''
        import pytest

        def _rewrite(item, call):
            report = yield
            report.outcome = "passed"
            return report

        globals()["pytest_runtest_" + "make" + "report"] = pytest.hookimpl(wrapper=True)(_rewrite)
    '''
    result = _run(reproducer, dict(BROKEN, **{"tests/conftest.py": conftest}))
    assert result["outcome"] == "tampered", result
    assert any("makereport" in h for h in result["tampered"])  # type: ignore[union-attr]
    # the same conftest in the baseline (not declared by the agent) is the user's own code
    baseline = _run(reproducer, dict(GOOD, **{"tests/conftest.py": conftest}), declared=False)
    assert baseline["outcome"] == "passed", baseline


def test_a_report_that_disagrees_with_the_runners_exit_status_is_not_a_pass(
        reproducer: tuple[Reproducer, FileBlobStore]) -> None:
    # Test code that finds the Host's reporter in memory and rewrites what it writes.
    sneaky = '''
        import gc

        from pkg.core import add

        for obj in gc.get_objects():
            if type(obj).__name__ == "_Report":
                real = obj.emit
                obj.emit = lambda **e: real(**dict(e, outcome="passed") if e.get("outcome") == "failed" else e)


        def test_add():
            assert add(1, 2) == 3
    '''
    result = _run(reproducer, dict(BROKEN, **{"tests/test_core.py": sneaky}))
    assert result["outcome"] == "failed", result
    assert result["exit_status"] == 1


def test_the_tree_comes_before_the_package_overlay(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    (overlay / "pkg").mkdir(parents=True)
    (overlay / "pkg" / "__init__.py").write_text("")
    (overlay / "pkg" / "core.py").write_text(GOOD["pkg/core.py"])
    blobs = FileBlobStore(tmp_path / "record", durable=False)
    r = Reproducer(blobs, hidden=[tmp_path / "record"], overlay=overlay,
                   limits=Limits(timeout=60), base=tmp_path / "runs")
    try:
        env, problems = r.environment()
        # an unrecorded package in the overlay is tampering in itself…
        assert any("pkg/core.py" in p for p in problems)
        # …and even so the declared (broken) package is the one the tests import
        result = _run((r, blobs), BROKEN, clean_env=False)
        assert result["outcome"] == "failed", result
    finally:
        r.close()


@pytest.mark.parametrize("kwargs", [{"reproduce_timeout": 0}, {"reproduce_timeout": True},
                                    {"reproduce_timeout": "60"}, {"reproduce_memory": -1},
                                    {"reproduce_memory": 1.5}, {"reproduce_memory": False}])
def test_bad_reproduction_limits_are_refused_when_the_host_is_made(tmp_path: Path,
                                                                   kwargs: dict[str, object]
                                                                   ) -> None:
    from host_kernel import Host
    from host_kernel._errors import BadArguments

    with pytest.raises(BadArguments):
        Host(tmp_path, mode="reusable_pipeline", **kwargs)  # type: ignore[arg-type]


def test_a_bytecode_cache_others_may_write_is_not_used(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from host_kernel.reproduce import environment

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    mine = environment.pycache_dir()
    assert mine.parent == tmp_path / "host_kernel" and mine.is_dir()
    mine.chmod(0o777)  # as if planted, or left writable: bytecode from here would run
    assert environment.pycache_dir() != mine
