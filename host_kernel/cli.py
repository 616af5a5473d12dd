"""The ``host-kernel`` command line: one registry of subcommands over the Host's Python API.

Owns the registry, argument parsing, the one error style and :func:`main`,
the command line (the console script, host_kernel/_launch.py ``console``, hands ``exec`` to
the user's zygote first). It does no work of its own: ``exec`` drives a
:class:`~host_kernel.Host` exactly as an agent would, one ``Host.execute``
per code cell; ``ls`` and ``show`` print what :mod:`host_kernel.browse`
reads. It does not own the record, the kernel or verification. The commands
of this module's registry live in :mod:`host_kernel._cli` (``exec``; the
record readers), with what every command shares (:mod:`host_kernel._cli.common`,
re-exported here for the commands of other parts, which import it from this
module).

Adding a subcommand is one :class:`Command` value appended to :data:`COMMANDS`:
its name, a one-line help, a function that adds its arguments to a parser, and
a function that runs it and returns the exit code. A run function signals the
caller's mistake (a missing file, a bad flag value, an unknown id) by raising
:class:`UsageError` (exit 2), and work that could not be done by raising
:class:`CommandFailed` (exit 1); :func:`main` prints either as one line on
stderr, ``host-kernel CMD: error: message``.

Exit codes, for every command: 0 success; 1 the work ran and something failed,
or the record could not be found or fails its checks (a
:class:`~host_kernel.RecordError`, printed ``host-kernel CMD: error: [CODE]
message``); 2 usage (argparse's own errors print the subcommand's usage line
first); 130 interrupted (Ctrl-C); 141 stdout closed early (``| head``), with
nothing more printed. Never a traceback for any of these.

Commands that read a record find it with :func:`resolve_record`: ``RECORD`` or
``--record`` (a record folder or a workspace) when given, else the record of
``--workdir`` or of the current directory (see :mod:`host_kernel._paths`); they
read it only through :func:`~host_kernel.store.verified.open_verified` or, for
``audit``, read-only.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import ClassVar, NoReturn

from ._cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    Command,
    CommandFailed,
    UsageError,
    add_record_arguments,
    add_store_arguments,
    check_ledger_url,
    print_line,
    read_notebook,
    record_argument,
    resolve_record,
    store_options,
    writable_record,
)
from ._cli.derive import REDERIVE, SLICE
from ._cli.exec import EXEC
from ._cli.readers import AUDIT, LINEAGE, LS, RECEIPT, SHOW
from ._version import __version__

__all__ = ["COMMANDS", "COMMAND_MODULES", "EXIT_BROKEN_PIPE", "EXIT_FAILED",
           "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "PROG", "Command", "CommandFailed",
           "UsageError", "add_record_arguments", "add_store_arguments", "all_commands",
           "build_parser", "check_ledger_url", "main", "read_notebook", "record_argument",
           "resolve_record", "store_options", "writable_record"]

#: Every subcommand, in the order ``--help`` lists them. Commands that live with the
#: part they drive are added from the modules named in :data:`COMMAND_MODULES`.
COMMANDS: list[Command] = [EXEC, AUDIT, LS, SHOW, LINEAGE, SLICE, REDERIVE, RECEIPT]

#: Modules that each define ``COMMANDS: list[Command]`` (the kernelspec front, the
#: agent loop, the MCP server, the record viewer, batch); loaded when the parser is built,
#: unless the command asked for is one of :data:`COMMANDS` (see :func:`main`).
COMMAND_MODULES = ("host_kernel.control.commands", "host_kernel.agent.commands",
                   "host_kernel.viewer.commands", "host_kernel.batch.commands")


def all_commands() -> list[Command]:
    from importlib import import_module

    found = list(COMMANDS)
    for name in COMMAND_MODULES:
        try:
            module = import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue  # that part is not built in this version
            raise
        found.extend(module.COMMANDS)
    return found


# ---------------------------------------------------------------------- entry point


class _Parser(argparse.ArgumentParser):
    """A subcommand's parser: argparse's, except that a missing positional argument whose
    value was given but starts with ``-`` (an id ``-8a12``, which argparse takes for an
    option it does not know) gets a hint to give it after ``--``."""

    #: The arguments being parsed (set by :func:`_parse`): where such a value is looked for.
    argv: ClassVar[list[str]] = []

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required") and \
                self._get_positional_actions():
            known = set(self._option_string_actions)
            words = self.argv[:self.argv.index("--")] if "--" in self.argv else self.argv
            dashed = [w for w in words if w.startswith("-") and len(w) > 1 and w not in known
                      and not any(k.startswith(w.split("=", 1)[0]) for k in known
                                  if k.startswith("--") and w.startswith("--"))]
            if dashed:
                message += (f" (a value that starts with '-' goes after '--': "
                            f"{self.prog} -- {dashed[0]})")
        super().error(message)


def build_parser(commands: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A Jupyter kernel driven by a Host that keeps a tamper-evident record: "
                    "nothing is accepted that the Host's own record does not back.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in all_commands() if commands is None else commands:
        p = sub.add_parser(command.name, help=command.help,
                           description=command.description or command.help)
        command.add_arguments(p)
        p.set_defaults(_run=command.run, _parser=p)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that arguments a subcommand does not know are
    reported by that subcommand's parser (its usage line, ``host-kernel CMD: error:``),
    not by the top-level one, which is where argparse sends them."""
    _Parser.argv = argv
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub: argparse.ArgumentParser | None = getattr(args, "_parser", None)
        before_command = (args.command in argv and extras[0] in argv
                          and argv.index(extras[0]) < argv.index(args.command))
        (parser if sub is None or before_command else sub).error(
            f"unrecognized arguments: {' '.join(extras)}")
    return args


def _quiet_stdout() -> None:
    """Point stdout at /dev/null once the reader has gone, so that the interpreter's last
    flush finds nowhere to fail (the recipe of Python's docs, "Note on SIGPIPE")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Run ``host-kernel`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    command: str | None = None
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(_commands_for(words))
        try:
            args = _parse(parser, words)
        except SystemExit as exc:  # --help, --version, or argparse's own usage error
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        run: Callable[[argparse.Namespace], int] | None = getattr(args, "_run", None)
        if run is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        command = args.command
        reconfigure = getattr(sys.stdout, "reconfigure", None)
        if reconfigure is not None:  # cell output may hold characters the terminal cannot show
            reconfigure(errors="backslashreplace")
        return _run(run, args)
    except KeyboardInterrupt:
        print_line(f"{PROG}{'' if command is None else ' ' + command}: interrupted", sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout closed early: nothing more to say, and no one to say it to
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


def _commands_for(argv: Sequence[str]) -> list[Command] | None:
    """The commands the parser for ``argv`` needs: the one of :data:`COMMANDS` that
    ``argv`` starts with, alone, else None (all of them). A short command (``exec`` of one
    notebook) then neither imports the other parts' command modules and what they import
    (the batch driver, the viewer's web browser) nor builds the other commands' parsers;
    its own parser, usage line and errors are the same, since no option of the top-level
    parser comes before the command word."""
    for command in COMMANDS:
        if argv and argv[0] == command.name:
            return [command]
    return None


def _run(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    from ._errors import HostKernelError

    def error(message: object) -> None:
        print_line(f"{PROG} {args.command}: error: {message}", sys.stderr)

    try:
        return run(args)
    except UsageError as exc:
        error(exc)
        return EXIT_USAGE
    except CommandFailed as exc:
        error(exc)
        return EXIT_FAILED
    except HostKernelError as exc:  # a RecordError above all: no record, or one that fails its
        error(exc)                  # checks. str() is "[CODE] message"; never a traceback.
        return EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
