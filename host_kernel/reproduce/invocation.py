"""A cited test command, parsed into the structured invocation the Host will run itself.

Owns :func:`parse`: from the command string an agent ran (``python -m pytest
tests -q``, ``pytest tests/test_x.py``, ``python -m unittest discover -s
tests``) to an :class:`Invocation` (runner, test paths relative to the tree,
harmless flags, working folder). It never runs anything and never reads the
workspace: paths are checked against the set of files the reproduction tree
will hold.

It refuses, with a stable code and a sentence to act on:

- ``runner_unrecognised``: not one of the forms above (a shell operator, a
  variable assignment, an unknown flag, a runner we do not reproduce);
- ``selection_not_allowed``: a flag or node id that chooses which tests run
  (``-k``, ``-m``, ``--deselect``, ``--lf``, ``--co``, ``-p``, ``--ignore``,
  ``path::test``…) or that runs none (``--version``, ``-h``);
- ``test_path_undeclared``: a test path that is not a declared file or a
  folder holding declared files.

The interpreter, environment and plugins are the Host's choice
(``runner.py``); only the paths and a few display flags come from the agent.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import PurePosixPath

__all__ = ["Invocation", "InvocationRefused", "parse"]

#: pytest flags that change only what is shown (value-less).
PYTEST_SHOW = frozenset({
    "-q", "--quiet", "-v", "--verbose", "-vv", "-vvv", "-qq", "-s", "-l", "--showlocals",
    "--no-header", "--no-summary", "-x", "--exitfirst", "--strict-markers", "--strict",
    "--disable-warnings", "--disable-pytest-warnings", "-ra", "-rA", "-rf", "-rs", "-rx",
    "-rfE", "-rxXs", "--capture=no", "--capture=fd", "--capture=sys", "--capture=tee-sys",
    "--full-trace", "--runxfail", "--no-fold-skipped",
})
#: pytest flags that take a value and change only what is shown or how failures stop.
PYTEST_SHOW_VALUE = frozenset({
    "--tb", "--color", "--durations", "--durations-min", "-r", "--maxfail", "-W",
    "--pythonwarnings", "--import-mode", "--capture", "--verbosity", "--code-highlight",
})
#: pytest flags that choose which tests run, or run none.
PYTEST_SELECT = frozenset({
    "-k", "-m", "--deselect", "--lf", "--last-failed", "--ff", "--failed-first", "--nf",
    "--new-first", "--sw", "--stepwise", "--sw-skip", "--stepwise-skip", "--co",
    "--collect-only", "--collectonly", "--ignore", "--ignore-glob", "-p", "--pyargs",
    "-c", "--config-file", "--rootdir", "--confcutdir", "--noconftest", "-o",
    "--override-ini", "--version", "-V", "-h", "--help", "--fixtures", "--funcargs",
    "--fixtures-per-test", "--markers", "--trace-config", "--debug", "--lfnf",
    "--last-failed-no-failures", "--cache-show", "--cache-clear", "--setup-only",
    "--setup-plan", "--setup-show", "--doctest-modules", "--doctest-glob", "--pdb",
    "--trace", "--keep-duplicates", "--continue-on-collection-errors", "-n",
    "--numprocesses", "--basetemp",
})
UNITTEST_SHOW = frozenset({"-v", "--verbose", "-q", "--quiet", "-b", "--buffer", "-f",
                           "--failfast", "-c", "--catch", "--locals", "--durations"})
UNITTEST_SELECT = frozenset({"-k", "-h", "--help"})
PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
#: Python options that change nothing the reproduction depends on.
PYTHON_HARMLESS = frozenset({"-B", "-u", "-b", "-bb", "-q"})
#: Shell text that makes a command more than one plain command.
SHELL_OPERATOR = re.compile(r"[|;&<>`$()\n]")


class InvocationRefused(ValueError):
    """The command cannot be reproduced as it is; ``code`` says which rule it broke."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Invocation:
    """What the Host will run: a runner, paths inside the tree, flags it allows."""

    runner: str  # "pytest" or "unittest"
    #: The folder the command ran in, relative to the tree root ("." for the root).
    cwd: str
    #: Arguments passed to the runner, paths made relative to ``cwd`` as the agent wrote them.
    args: tuple[str, ...]
    #: The tree-relative test paths the command names (empty: the runner's default).
    paths: tuple[str, ...] = ()
    #: ``python -m`` puts the working folder first on the import path; ``pytest`` does not.
    cwd_on_path: bool = True

    def to_dict(self) -> dict[str, object]:
        return {"runner": self.runner, "cwd": self.cwd, "args": list(self.args),
                "paths": list(self.paths), "cwd_on_path": self.cwd_on_path}


def _words(command: str) -> list[str]:
    """The command's words, after an optional ``cd DIR &&`` and a trailing ``2>&1``."""
    text = command.strip()
    text = re.sub(r"\s+2>&1\s*$", "", text)
    if SHELL_OPERATOR.sub("", text.replace("&&", "")) != text.replace("&&", ""):
        raise InvocationRefused("runner_unrecognised", _one_command(command))
    parts = [p.strip() for p in text.split("&&")]
    try:
        split = [shlex.split(p, comments=False) for p in parts]
    except ValueError as exc:
        raise InvocationRefused("runner_unrecognised", f"{command!r} cannot be split into "
                                                       f"words ({exc})") from None
    if any(not words for words in split):
        raise InvocationRefused("runner_unrecognised", _one_command(command))
    for words in split[:-1]:
        if len(words) != 2 or words[0] != "cd":
            raise InvocationRefused("runner_unrecognised", _one_command(command))
    return [w for words in split[:-1] for w in words] + split[-1]


def _one_command(command: str) -> str:
    return (f"{command!r} is not one plain test command; the Host reproduces 'python -m "
            f"pytest [paths] [-q|-v|-x|--tb=…]', 'pytest …' or 'python -m unittest …', "
            f"optionally after 'cd DIR &&', with no pipes, ';', '||', redirections, "
            f"variables or substitutions")


def _inside(rel: str) -> str | None:
    pure = PurePosixPath(os.path.normpath(rel))
    if pure.is_absolute() or (pure.parts and pure.parts[0] == ".."):
        return None
    return pure.as_posix()


def parse(command: str, cwd: str, files: Collection[str]) -> Invocation:
    """The invocation ``command`` stands for, run in ``cwd`` (tree-relative) over ``files``.

    ``files`` are the tree's file paths (tree-relative, POSIX). Raises
    :class:`InvocationRefused`.
    """
    if not isinstance(command, str) or not command.strip():
        raise InvocationRefused("runner_unrecognised", "the test command is empty")
    words = _words(command)
    here = _inside(cwd)
    if here is None:
        raise InvocationRefused("runner_unrecognised", f"the command ran in {cwd!r}, outside "
                                                       f"the workspace")
    while len(words) >= 2 and words[0] == "cd":
        moved = _inside(os.path.join(here, words[1]))
        if moved is None or os.path.isabs(words[1]):
            raise InvocationRefused("runner_unrecognised", f"'cd {words[1]}' leaves the "
                                                           f"workspace")
        here, words = moved, words[2:]
    if not words:
        raise InvocationRefused("runner_unrecognised", _one_command(command))
    if "=" in words[0] and words[0].split("=", 1)[0].isidentifier() or words[0] == "env":
        raise InvocationRefused("runner_unrecognised", f"{command!r} sets environment "
                                                       f"variables; the Host runs the tests "
                                                       f"in an environment it builds, so run "
                                                       f"the plain command")
    first = os.path.basename(words[0])
    if first in ("pytest", "py.test"):
        runner, rest, cwd_on_path = "pytest", words[1:], False
    elif PYTHON.fullmatch(first):
        rest = words[1:]
        while rest and rest[0] in PYTHON_HARMLESS:
            rest = rest[1:]
        if len(rest) < 2 or rest[0] != "-m" or rest[1] not in ("pytest", "unittest"):
            raise InvocationRefused("runner_unrecognised", f"{command!r} does not run "
                                                           f"'-m pytest' or '-m unittest'; "
                                                           f"{_one_command(command)}")
        runner, rest, cwd_on_path = rest[1], rest[2:], True
    else:
        raise InvocationRefused("runner_unrecognised", f"{first!r} is not a test runner the "
                                                       f"Host reproduces; "
                                                       f"{_one_command(command)}")
    known = set(files)
    folders = {p.rsplit("/", i)[0] for p in known for i in range(1, p.count("/") + 1)}
    if here != "." and here not in folders:
        raise InvocationRefused("test_path_undeclared", f"the command runs in {here!r}, which "
                                                        f"holds no declared file")
    if runner == "pytest":
        args, paths = _pytest_args(rest, here, known, folders)
    else:
        args, paths = _unittest_args(rest, here, known, folders)
    return Invocation(runner, here, tuple(args), tuple(paths), cwd_on_path)


def _declared_path(word: str, here: str, known: set[str], folders: set[str]) -> str:
    rel = _inside(os.path.join(here, word))
    if rel is None or os.path.isabs(word):
        raise InvocationRefused("test_path_undeclared", f"test path {word!r} is outside the "
                                                        f"workspace")
    if rel != "." and rel not in known and rel not in folders:
        raise InvocationRefused("test_path_undeclared", f"test path {word!r} is not a "
                                                        f"declared file nor a folder of "
                                                        f"declared files; add it to "
                                                        f"source_files (and save it)")
    return rel


def _pytest_args(rest: list[str], here: str, known: set[str],
                 folders: set[str]) -> tuple[list[str], list[str]]:
    args: list[str] = []
    paths: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        name = word.split("=", 1)[0]
        if word.startswith("-") and word != "-":
            short_value = len(word) > 2 and not word.startswith("--")
            head = word[:2] if short_value else name
            if name in PYTEST_SELECT or head in PYTEST_SELECT:
                raise InvocationRefused("selection_not_allowed", f"{word!r} chooses which "
                                                                 f"tests run (or runs none); "
                                                                 f"every test in the declared "
                                                                 f"test paths must run")
            if word in PYTEST_SHOW:
                args.append(word)
            elif name in PYTEST_SHOW_VALUE and "=" in word:
                args.append(word)
            elif word in PYTEST_SHOW_VALUE and i + 1 < len(rest):
                args += [word, rest[i + 1]]
                i += 1
            elif head in PYTEST_SHOW_VALUE and short_value:
                args.append(word)  # -rfE, -Werror
            else:
                raise InvocationRefused("runner_unrecognised", f"pytest flag {word!r} is not "
                                                               f"one the Host reproduces "
                                                               f"(display flags, -x and "
                                                               f"--maxfail are)")
        else:
            if "::" in word:
                raise InvocationRefused("selection_not_allowed", f"{word!r} names single "
                                                                 f"tests; cite the test file "
                                                                 f"or folder so every test "
                                                                 f"runs")
            paths.append(_declared_path(word, here, known, folders))
            args.append(word)
        i += 1
    return args, paths


def _unittest_args(rest: list[str], here: str, known: set[str],
                   folders: set[str]) -> tuple[list[str], list[str]]:
    args: list[str] = []
    paths: list[str] = []
    words = list(rest)
    discover = bool(words) and words[0] == "discover"
    if discover:
        args.append(words.pop(0))
    i = 0
    while i < len(words):
        word = words[i]
        if word in UNITTEST_SELECT or word.startswith("-k"):
            raise InvocationRefused("selection_not_allowed", f"{word!r} chooses which tests "
                                                             f"run (or runs none)")
        if discover and word in ("-s", "--start-directory", "-t", "--top-level-directory",
                                 "-p", "--pattern") and i + 1 < len(words):
            value = words[i + 1]
            if word in ("-p", "--pattern"):
                if value not in ("test*.py", "test_*.py", "*_test.py"):
                    raise InvocationRefused("selection_not_allowed", f"pattern {value!r} "
                                                                     f"chooses which test "
                                                                     f"files run")
            else:
                paths.append(_declared_path(value, here, known, folders))
            args += [word, value]
            i += 2
            continue
        if word in UNITTEST_SHOW:
            args.append(word)
        elif word.startswith("-"):
            raise InvocationRefused("runner_unrecognised", f"unittest flag {word!r} is not "
                                                           f"one the Host reproduces")
        elif discover:
            paths.append(_declared_path(word, here, known, folders))
            args.append(word)
        else:
            args.append(word)
            paths.append(_unittest_target(word, here, known, folders))
        i += 1
    return args, paths


def _unittest_target(word: str, here: str, known: set[str], folders: set[str]) -> str:
    """A module name or file path given to ``python -m unittest``; a class or method
    (``tests.test_x.TestA``) selects single tests."""
    if word.endswith(".py") or "/" in word:
        return _declared_path(word, here, known, folders)
    dotted = word.replace(".", "/")
    for candidate in (dotted + ".py", dotted):
        rel = _inside(os.path.join(here, candidate))
        if rel is not None and (rel in known or rel in folders):
            return rel
    parent = word.rsplit(".", 1)[0].replace(".", "/") + ".py"
    if _inside(os.path.join(here, parent)) in known:
        raise InvocationRefused("selection_not_allowed", f"{word!r} names a single test class "
                                                         f"or method; cite the module")
    raise InvocationRefused("test_path_undeclared", f"test module {word!r} is not a declared "
                                                    f"file; add it to source_files")
