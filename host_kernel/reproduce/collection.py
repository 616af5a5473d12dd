"""Which declared test files a run must show passing, and which file each test comes from.

Owns :func:`expected_files` and :func:`file_of`, both read from the Host's own
data (the invocation it parsed, the declared paths, the tree's manifest),
never from what the run says about itself:

- a test file is one the cited runner collects by default: ``test_*.py`` and
  ``*_test.py`` for pytest (and any file the command names), the discovery
  pattern (``test*.py`` by default) for unittest, under the folders it searches
  (pytest skips ``norecursedirs``; unittest's discovery enters packages only);
- a pytest node id names its file before ``::``; a unittest test id is dotted
  from the discovery's top-level folder (or the working folder), and the
  loader's stand-ins for a module that failed to import or skipped at module
  level (``unittest.loader._FailedTest.NAME``, ``…ModuleSkipped.NAME``) name
  the module.

The Host launches the collection run itself (``runner.py``, the same path as
the test run, with ``--collect``); this module says what its list must cover.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Collection
from pathlib import PurePosixPath

from .invocation import Invocation

__all__ = ["expected_files", "file_of"]

PYTEST_FILES = ("test_*.py", "*_test.py")
#: pytest's default ``norecursedirs``: folders it never enters unless named.
NORECURSE = ("*.egg", ".*", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}")
#: The unittest loader's stand-ins for a module it could not load as tests.
LOADER_STANDINS = ("unittest.loader._FailedTest.", "unittest.loader.ModuleSkipped.",
                   "unittest.loader.ModuleImportFailure.", "unittest.loader.LoadTestsFailure.")


def _join(here: str, rel: str) -> str:
    joined = os.path.normpath(os.path.join(here, rel)).replace(os.sep, "/")
    return "." if joined in ("", ".") else joined


def _under(rel: str, root: str) -> bool:
    return root == "." or rel == root or rel.startswith(root.rstrip("/") + "/")


def _discovery(inv: Invocation) -> tuple[str, str, str] | None:
    """unittest discovery's (start folder, pattern, top-level folder), tree-relative;
    None when the command names modules instead."""
    args = list(inv.args)
    if args and args[0] != "discover" and any(not a.startswith("-") for a in args):
        return None
    words = [a for a in args if a != "discover"]
    start, pattern, top = ".", "test*.py", None
    positional: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-s", "--start-directory") and i + 1 < len(words):
            start, i = words[i + 1], i + 2
        elif word in ("-p", "--pattern") and i + 1 < len(words):
            pattern, i = words[i + 1], i + 2
        elif word in ("-t", "--top-level-directory") and i + 1 < len(words):
            top, i = words[i + 1], i + 2
        else:
            if not word.startswith("-"):
                positional.append(word)
            i += 1
    if positional:
        start = positional[0]
    if len(positional) > 1:
        pattern = positional[1]
    if len(positional) > 2:
        top = positional[2]
    start_rel = _join(inv.cwd, start)
    return start_rel, pattern, _join(inv.cwd, top) if top else start_rel


def expected_files(inv: Invocation, declared: Collection[str],
                   manifest: Collection[str]) -> list[str]:
    """The declared test files the cited command runs: each must yield a passing test."""
    found: set[str] = set()
    if inv.runner == "unittest":
        found |= _unittest_files(inv, declared, set(manifest))
    else:
        roots = list(inv.paths) or [inv.cwd]
        for rel in declared:
            path = PurePosixPath(rel)
            if rel in inv.paths and rel.endswith(".py"):
                found.add(rel)  # named on the command line: collected whatever its name
                continue
            if not any(fnmatch.fnmatch(path.name, p) for p in PYTEST_FILES):
                continue
            for root in roots:
                if not _under(rel, root):
                    continue
                inside = path.parts[len(PurePosixPath(root).parts) if root != "." else 0:-1]
                if not any(fnmatch.fnmatch(part, pattern) for part in inside
                           for pattern in NORECURSE):
                    found.add(rel)
    return sorted(found)


def _unittest_files(inv: Invocation, declared: Collection[str], manifest: set[str]) -> set[str]:
    discovery = _discovery(inv)
    if discovery is None:
        return {p for p in inv.paths if p in declared and p.endswith(".py")}
    start, pattern, _ = discovery
    found = set()
    for rel in declared:
        path = PurePosixPath(rel)
        if not _under(rel, start) or not fnmatch.fnmatch(path.name, pattern):
            continue
        # Discovery enters a folder below the start only when it is a package.
        parts = path.parts[len(PurePosixPath(start).parts) if start != "." else 0:-1]
        base = PurePosixPath(start) if start != "." else PurePosixPath()
        ok = True
        for part in parts:
            base = base / part
            if f"{base.as_posix()}/__init__.py" not in manifest:
                ok = False
                break
        if ok:
            found.add(rel)
    return found


def file_of(inv: Invocation, manifest: Collection[str]) -> Callable[[str], str | None]:
    """A function from a test's id (node id, unittest id, collection report id) to the
    tree file it comes from, or None."""
    files = set(manifest)
    if inv.runner != "unittest":
        def pytest_file(nodeid: str) -> str | None:
            head = nodeid.split("::", 1)[0]
            return head if head in files else None
        return pytest_file

    discovery = _discovery(inv)
    roots = list(dict.fromkeys(([discovery[2]] if discovery else []) + [inv.cwd]))

    def module_file(dotted: str) -> str | None:
        for root in roots:
            base = "" if root == "." else root + "/"
            stem = base + dotted.replace(".", "/")
            for candidate in (stem + ".py", stem + "/__init__.py"):
                if candidate in files:
                    return candidate
        return None

    def unittest_file(test_id: str) -> str | None:
        for prefix in LOADER_STANDINS:
            if test_id.startswith(prefix):
                return module_file(test_id[len(prefix):])
        if test_id.endswith(")") and " (" in test_id:  # setUpClass (mod.Class)
            test_id = test_id[test_id.rindex(" (") + 2:-1] + ".x"
        parts = test_id.split(".")
        for end in range(len(parts) - 1, 0, -1):
            found = module_file(".".join(parts[:end]))
            if found is not None:
                return found
        return None

    return unittest_file
