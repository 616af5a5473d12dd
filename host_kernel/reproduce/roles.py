"""Which files are tests or test configuration, and which of them a test command reads.

Owns two readings of paths (and, for a config file, its bytes), both static:

- :func:`test_role`: a file's part in a test run: ``test`` (a file pytest or
  unittest collects by default name), ``conftest``, ``config`` (a file pytest
  reads its settings from), ``support`` (anything else under a ``tests`` or
  ``test`` folder: helpers, data, ``__init__.py``), or None for the code under
  test;
- :func:`read_by`: whether a parsed :class:`~host_kernel.reproduce.invocation.Invocation`
  collects or reads a given workspace file when it runs *in the workspace*:
  a test file under its paths, a ``conftest.py`` pytest loads on the way to
  them, or a pytest config at or above its folder or its paths.

It decides nothing: the reproduction (``test_undeclared``) and the regression
runs (``regression.py``) use it.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from .invocation import Invocation
from .scan import CONFIG_FILES

__all__ = ["is_pytest_config", "is_test_file", "read_by", "test_role"]

#: Folder names whose files belong to the test suite (helpers, data, packages of tests).
TEST_FOLDERS = frozenset({"tests", "test"})
#: The section that makes each shared config file a pytest config (pytest.ini needs none).
CONFIG_SECTIONS = {"pyproject.toml": b"[tool.pytest", "tox.ini": b"[pytest]",
                   "setup.cfg": b"[tool:pytest]"}


def is_test_file(rel: str) -> bool:
    """Named as pytest and unittest find tests by default: ``test*.py``, ``*_test.py``."""
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(".py") and (name.startswith("test") or name.endswith("_test.py"))


def is_pytest_config(rel: str, data: bytes | None) -> bool:
    """A file pytest takes its settings from (``data`` None: unknown, so it may be)."""
    name = rel.rsplit("/", 1)[-1]
    if name not in CONFIG_FILES:
        return False
    section = CONFIG_SECTIONS.get(name)
    return section is None or data is None or section in data


def test_role(rel: str) -> str | None:
    """``test``, ``conftest``, ``config``, ``support`` or None (see the module's text)."""
    pure = PurePosixPath(rel)
    if is_test_file(rel):
        return "test"
    if pure.name == "conftest.py":
        return "conftest"
    if pure.name in CONFIG_FILES:
        return "config"
    if any(part in TEST_FOLDERS for part in pure.parts[:-1]):
        return "support"
    return None


def _within(rel: str, folder: str) -> bool:
    return folder == "." or rel == folder or rel.startswith(folder.rstrip("/") + "/")


def _folder(rel: str) -> str:
    return rel.rsplit("/", 1)[0] if "/" in rel else "."


def read_by(inv: Invocation, rel: str, data: bytes | None = None) -> str | None:
    """Why the command ``inv`` collects or reads ``rel`` in the workspace, or None.

    ``data``: the file's bytes when it is a config file (to see whether it holds a
    pytest section). Paths are workspace-relative, as the invocation's are.
    """
    roots = list(inv.paths) or [inv.cwd]
    under = any(_within(rel, root) for root in roots)
    if inv.runner == "unittest":
        if rel in inv.paths or under and PurePosixPath(rel).name.startswith("test") \
                and rel.endswith(".py"):
            return "a test module the command runs"
        return None
    if rel in inv.paths or under and is_test_file(rel):
        return "a test file under the command's paths"
    folder = _folder(rel)
    # pytest reads conftest.py files from the root down to each path, and in every
    # folder it collects; its config is searched for from the paths' folders upwards.
    above = any(_within(root, folder) for root in [*roots, inv.cwd])
    if PurePosixPath(rel).name == "conftest.py" and (under or above):
        return "a conftest.py pytest loads for the command's paths"
    if above and is_pytest_config(rel, data):
        return "a pytest configuration the command reads"
    return None
