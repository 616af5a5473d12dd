"""A simple command run the way bash would run it, without starting bash first.

``bash -c 'pytest -q'`` parses the line, finds ``pytest`` on PATH and replaces itself
with it: the command runs in bash's process, with bash's environment. Bash's own start
(its binary, and under a UTF-8 locale some 25 locale files, each a traced call) is the
only thing in between, about 2 ms of a ``host.bash`` call here. For a line that is
one plain command (GNU make's rule for running a recipe line without a shell), the
Host asks for that exec itself: :func:`direct_argv` says when a line is plain, and the
argv and environment bash would have exec'd it with.

A line is plain when its words hold only letters, digits and ``_ . / , : + @ % -``
(and ``=`` after the first word), separated by spaces or tabs (only those: Python's
other whitespace, U+00A0 say, is part of a word to bash): nothing bash would
expand, quote, redirect, glob or treat as a keyword. Its first word names no bash
builtin or keyword (``true`` and ``false`` without arguments excepted: the programs
do exactly what the builtins do) and is found, as bash would find it, as a file that
starts ``#!`` or is an ELF binary (bash runs any other executable file as a script of
its own). The environment is the call's with what bash's start does to it: ``PS1``
and ``PS2`` dropped (a shell that is not interactive unsets them), ``PWD`` kept when
it names the working folder, otherwise the folder's physical path, ``OLDPWD`` dropped
unless it names a folder, ``SHLVL`` ``0`` when unset, and ``_`` the path the command
was found at. Anything else goes through bash as before: a variable bash sets or reads
for itself (``BASH_ENV``, an exported function, ``IFS``, ``PS4``, ``OPTIND``, ...), a
``SHLVL`` bash would warn about or reset, no PATH or a relative entry in it.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping

from .._errors import HostKernelError
from ..store.blobs import open_regular

__all__ = ["direct_argv"]

#: A plain line: words of characters bash neither expands, quotes, globs nor redirects,
#: separated by what bash separates words with on one line, spaces and tabs (not the
#: other characters Python's ``str.split`` takes for whitespace, such as U+00A0).
_PLAIN_LINE = re.compile(r"[ \t]*[A-Za-z0-9_./,:+@%=-]+(?:[ \t]+[A-Za-z0-9_./,:+@%=-]+)*[ \t]*")
_BLANKS = re.compile(r"[ \t]+")
#: Bash 5's builtins and reserved words: a line starting with one runs in bash.
_BASH_WORDS = frozenset(
    ". : [ alias bg bind break builtin caller cd command compgen complete compopt "
    "continue declare dirs disown echo enable eval exec exit export false fc fg getopts "
    "hash help history jobs kill let local logout mapfile popd printf pushd pwd read "
    "readarray readonly return set shift shopt source suspend test times trap true type "
    "typeset ulimit umask unalias unset wait "
    "if then else elif fi case esac for select while until do done in function time "
    "{ } ! [[ ]] coproc".split())
#: Builtins whose program does exactly the same, given no arguments.
_SAME_WITHOUT_ARGS = frozenset(["true", "false"])
#: Variables bash reads or sets for itself (with every ``BASH*`` name): when one is in
#: the environment, the line goes through bash.
_SHELL_ENV = frozenset(
    "IFS OPTERR OPTIND OPTARG PS3 PS4 PPID RANDOM SRANDOM SECONDS LINENO UID EUID GROUPS "
    "FUNCNAME DIRSTACK PIPESTATUS HISTCMD EPOCHREALTIME EPOCHSECONDS ENV SHELLOPTS "
    "POSIXLY_CORRECT COMP_WORDBREAKS HOSTTYPE MACHTYPE OSTYPE".split())
#: Unset by a shell that is not interactive.
_DROPPED = ("PS1", "PS2")
_SHLVL = re.compile(r"[0-9]{1,3}")


def direct_argv(command: str, cwd: str, env: Mapping[str, str],
                which: Callable[[str, str], str | None] | None = None,
                sees: Callable[[str], bool] | None = None
                ) -> tuple[list[str], dict[str, str]] | None:
    """The argv and environment bash would exec ``command`` with, or None when the line
    is not one plain command (module docstring) and must go through bash. ``which`` is
    the PATH lookup to use (the Host's remembered one); ``shutil.which`` by default.
    ``sees``: whether the confined kernel sees a path as the Host does; a file it does
    not is left to bash in its own view (the Host neither opens nor names it)."""
    if not _PLAIN_LINE.fullmatch(command):
        return None
    words = _BLANKS.split(command.strip(" \t"))
    first = words[0]
    if "=" in first:
        return None
    if first in _BASH_WORDS and not (first in _SAME_WITHOUT_ARGS and len(words) == 1):
        return None
    if any(name in _SHELL_ENV or name.startswith("BASH") for name in env):
        return None
    level = env.get("SHLVL")
    if level is not None and not (_SHLVL.fullmatch(level) and int(level) < 999):
        return None
    path = env.get("PATH")
    if path is None:
        return None  # bash then searches a PATH of its own, "." among it
    found = _found(first, cwd, path, which)
    if found is None or (sees is not None and not sees(os.path.join(cwd, found))) \
            or not _runs_without_bash(found, cwd):
        return None
    out = {name: value for name, value in env.items() if name not in _DROPPED}
    out["PWD"] = _pwd(env.get("PWD"), cwd)
    old = env.get("OLDPWD")
    if old is not None and not (os.path.isabs(old) and os.path.isdir(old)):
        out.pop("OLDPWD")
    out["SHLVL"] = "0" if level is None else str(int(level))
    out["_"] = found
    return words, out


def _found(first: str, cwd: str, path: str,
           which: Callable[[str, str], str | None] | None) -> str | None:
    """The path bash would exec for ``first``: as typed when it holds a slash, else the
    first executable file of that name along PATH. None when PATH has a relative (or
    empty) entry, which bash reads from the command's folder, not the Host's."""
    if "/" in first:
        # Not executable: bash says why.
        return first if os.access(os.path.join(cwd, first), os.X_OK) else None
    folders = path.split(os.pathsep)
    if not all(os.path.isabs(folder) for folder in folders):
        return None
    return which(first, path) if which is not None else shutil.which(first, path=path)


def _runs_without_bash(found: str, cwd: str) -> bool:
    """Whether ``execve`` runs the file: a regular file (nothing else is opened) that
    starts ``#!`` or with ELF's magic."""
    try:
        with open_regular(os.path.join(cwd, found), follow_symlinks=True) as f:
            head = f.read(4)
    except (OSError, HostKernelError):
        return False
    return head[:2] == b"#!" or head == b"\x7fELF"


def _pwd(given: str | None, cwd: str) -> str:
    """``PWD`` as bash sets it: the inherited value when it is absolute and names the
    working folder, otherwise the folder's physical path."""
    if given and os.path.isabs(given):
        try:
            if os.path.samefile(given, cwd):
                return given
        except OSError:
            pass
    return os.path.realpath(cwd)
