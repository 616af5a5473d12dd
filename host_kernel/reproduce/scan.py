"""Declared code that reaches into the test runner instead of being tested by it.

Owns :func:`runner_hooks`: a static reading (``ast``, never running anything) of
the files the agent declared, for what lets test code decide its own outcome
inside the runner's process:

- pytest hooks that make, rewrite or drop reports, or choose what runs
  (``pytest_runtest_makereport``, ``pytest_report_teststatus``,
  ``pytest_runtest_logreport``, ``pytest_runtest_call``,
  ``pytest_collection_modifyitems``, ``pytest_ignore_collect``…);
- imports of the runner's internals (``_pytest``, ``pluggy``) or of host_kernel
  (the Host's own reporter), and the plugin manager (``.pluginmanager``);
- ``pytest_plugins``, ``collect_ignore`` and ``collect_ignore_glob`` in a
  conftest (more code, or fewer tests, by a side door);
- a top-level module that shadows the runner or the standard library
  (``pytest.py``, ``sitecustomize.py``, ``doctest.py``) where the reproduction
  puts folders on the import path;
- a declared pytest config file (``pytest.ini``, ``tox.ini``, ``setup.cfg``,
  ``pyproject.toml``) that sets which files, classes or functions are tests.

It is a reading, not a proof: code determined to hide what it does from a
reader can (``exec`` of a built string). The reproduction's outcome is still
the runner's; this check names the ways in that a reviewer would want to see.

It also owns :func:`native_code`: whether a declared file is something a loader
runs without any reading of it, by name (``.so``, ``.pyd``, ``.dylib``, ``.dll``,
``.pth``, ``.egg``, ``.whl``, ``.pyz``) or by content whatever its name (an ELF,
Mach-O or PE image; an archive holding modules, which ``zipimport`` imports):
none of it may be in a reproduction tree (``native_code_declared``). Data in
binary formats (images, arrays, archives of data) is not code and stays.
"""

from __future__ import annotations

import ast
import re
import sys
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from typing import BinaryIO

__all__ = ["native_code", "runner_hooks"]

HOOKS = frozenset({
    "pytest_runtest_makereport", "pytest_report_teststatus", "pytest_runtest_logreport",
    "pytest_runtest_protocol", "pytest_runtest_call", "pytest_runtest_setup",
    "pytest_runtest_teardown", "pytest_pyfunc_call", "pytest_collection_modifyitems",
    "pytest_collection", "pytest_ignore_collect", "pytest_collect_file",
    "pytest_pycollect_makeitem", "pytest_pycollect_makemodule", "pytest_make_collect_report",
    "pytest_collectreport", "pytest_runtestloop", "pytest_sessionfinish", "pytest_deselected",
    "pytest_exception_interact", "pytest_runtest_logfinish", "pytest_runtest_logstart",
    "pytest_itemcollected", "pytest_cmdline_main",
    "pytest_load_initial_conftests", "pytest_plugin_registered",
})
INTERNALS = ("_pytest", "pluggy", "host_kernel")
CONFTEST_NAMES = frozenset({"pytest_plugins", "collect_ignore", "collect_ignore_glob"})
RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "iniconfig", "py", "host_kernel",
                            "sitecustomize", "usercustomize"})
CONFIG_FILES = frozenset({"pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"})
#: Names a loader runs or maps without reading them as source.
NATIVE_NAME = re.compile(r"\.(so(\.\d+)*|pyd|dylib|dll|pth|egg|whl|pyz)$", re.IGNORECASE)
#: Leading bytes of executable images.
MAGIC = ((b"\x7fELF", "an ELF image (a shared library or program)"),
         (b"\xfe\xed\xfa\xce", "a Mach-O image"), (b"\xce\xfa\xed\xfe", "a Mach-O image"),
         (b"\xfe\xed\xfa\xcf", "a Mach-O image"), (b"\xcf\xfa\xed\xfe", "a Mach-O image"),
         (b"\xca\xfe\xba\xbe", "a Mach-O universal image (or a Java class)"),
         (b"\xbe\xba\xfe\xca", "a Mach-O universal image"))
#: Members of an archive that make it importable code (zipimport, an egg).
ARCHIVE_CODE = re.compile(r"(\.(py|pyc|pyo|pyw|so|pyd|dylib|dll|pth)$)|(^|/)EGG-INFO/",
                          re.IGNORECASE)
CONFIG_KEYS = re.compile(r"^\s*(python_files|python_classes|python_functions|norecursedirs|"
                         r"addopts|testpaths|collect_ignore|required_plugins|pytest_plugins)\s*=",
                         re.MULTILINE)


def runner_hooks(files: Mapping[str, bytes], import_roots: Iterable[str]) -> list[str]:
    """Sentences naming each way in, by file and line; empty when there is none.

    ``files``: the declared files' bytes by tree-relative path. ``import_roots``:
    the tree folders the reproduction puts on the import path (for shadowing).
    """
    found: list[str] = []
    roots = {r.strip("/") or "." for r in import_roots}
    shadowable = RUNNER_MODULES | set(sys.stdlib_module_names)
    for rel, data in sorted(files.items()):
        pure = PurePosixPath(rel)
        parent = pure.parent.as_posix()
        if pure.name == "__init__.py" and len(pure.parts) >= 2:
            top, top_parent = pure.parts[-2], pure.parent.parent.as_posix()  # a package
        elif pure.suffix == ".py":
            top, top_parent = pure.stem, parent
        else:
            top, top_parent = None, parent
        if top and top in shadowable and top_parent in roots:
            found.append(f"{rel}: a module named {top!r} on the reproduction's import path "
                         f"would stand in for the runner's or Python's own")
        if pure.name in CONFIG_FILES:
            text = data.decode("utf-8", "replace")
            if pure.name in ("pytest.ini", ".pytest.ini") or "pytest" in text:
                for m in CONFIG_KEYS.finditer(text):
                    line = text.count("\n", 0, m.start()) + 1
                    found.append(f"{rel} line {line}: sets {m.group(1)}, which decides what "
                                 f"the runner collects or runs")
            continue
        if pure.suffix != ".py":
            continue
        try:
            tree = ast.parse(data, rel)
        except (SyntaxError, ValueError):
            continue  # the runner reports it as a collection error
        found += _scan(rel, tree, pure.name == "conftest.py")
    return found


def _scan(rel: str, tree: ast.AST, conftest: bool) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        where = f"{rel} line {getattr(node, 'lineno', '?')}"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in HOOKS:
            found.append(f"{where}: defines the hook {node.name}, which can change what the "
                         f"runner collects, runs or reports")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in INTERNALS:
                    found.append(f"{where}: imports {alias.name}, the runner's internals")
        elif isinstance(node, ast.ImportFrom):
            if node.module and node.module.split(".")[0] in INTERNALS and node.level == 0:
                found.append(f"{where}: imports from {node.module}, the runner's internals")
        elif isinstance(node, ast.Attribute) and node.attr in ("pluginmanager", "_hookimpls",
                                                                "hook"):
            if node.attr != "hook" or isinstance(node.value, ast.Attribute):
                found.append(f"{where}: reaches the runner's plugin manager ({node.attr})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.split(".")[0] in INTERNALS:
            found.append(f"{where}: names {node.value!r}, the runner's internals")
        elif conftest and isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in CONFTEST_NAMES:
                    found.append(f"{where}: sets {target.id}, which changes what the runner "
                                 f"loads or collects")
    return found


def native_code(rel: str, src: BinaryIO) -> str | None:
    """What makes the declared file ``rel`` (its bytes readable from ``src``) code that a
    loader runs unread, or None for source and data."""
    name = PurePosixPath(rel).name
    m = NATIVE_NAME.search(name)
    if m:
        return f"{rel}: a {m.group(0)} file, which the loader runs or maps as it is"
    head = src.read(4096)
    for magic, what in MAGIC:
        if head.startswith(magic):
            return f"{rel}: {what}, whatever its name says"
    if head[:2] == b"MZ" and len(head) >= 0x40:
        offset = int.from_bytes(head[0x3c:0x40], "little")
        if offset + 4 <= len(head):
            pe = head[offset:offset + 4]
        else:
            src.seek(offset)
            pe = src.read(4)
        if pe == b"PE\0\0":
            return f"{rel}: a PE image (a Windows program or DLL), whatever its name says"
    try:
        src.seek(0)
        if not zipfile.is_zipfile(src):
            return None
        src.seek(0)
        with zipfile.ZipFile(src) as archive:
            code = [n for n in archive.namelist() if ARCHIVE_CODE.search(n)]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError):
        return None
    if code:
        return (f"{rel}: an archive of modules ({', '.join(code[:3])}), which zipimport "
                f"imports without any reading of the declared files")
    return None
