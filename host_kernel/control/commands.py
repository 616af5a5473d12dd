"""``host-kernel install``, ``uninstall`` and ``export``: the Jupyter front door's commands.

Owns their arguments, messages and exit codes (see :mod:`host_kernel.cli` for
the registry and the shared exit-code rules). The work is done by
:mod:`.kernelspec` and :mod:`host_kernel.export`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import cast

from ..cli import (
    EXIT_OK,
    Command,
    CommandFailed,
    UsageError,
    add_record_arguments,
    record_argument,
    writable_record,
)

__all__ = ["COMMANDS"]

#: jupyter_client's rule for a kernel's name (it is a folder's name).
_KERNEL_NAME = re.compile(r"[a-z0-9._-]+", re.IGNORECASE)


def _install_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true",
                       help="install into this Python's prefix (a virtual environment's)")
    where.add_argument("--prefix", metavar="P", default=None,
                       help="install under P/share/jupyter/kernels")
    parser.add_argument("--name", default=None, help="the kernelspec's name (default: host_kernel)")
    parser.add_argument("--display-name", default=None, help="the name frontends show")
    parser.add_argument("--mode", default=None,
                        help="arm a task mode in every session of this kernelspec "
                             "(analysis_run, reusable_pipeline, codebase_change)")
    parser.add_argument("--record", metavar="DIR", default=None,
                        help="one record folder for every session (default: "
                             "$HOST_KERNEL_RECORD, else the notebook folder's own record "
                             "outside it, under $XDG_STATE_HOME/host_kernel/records)")
    parser.add_argument("--no-network", action="store_true",
                        help="sessions of this kernelspec may not open TCP connections")
    parser.add_argument("--require-confinement", action="store_true",
                        help="sessions refuse to start where Landlock is unavailable")


def _install_run(args: argparse.Namespace) -> int:
    from ..modes import UnknownModeError, normalise_mode_name
    from .kernelspec import KERNEL_NAME, install

    mode = None
    if args.mode is not None:
        try:
            mode = normalise_mode_name(args.mode)
        except UnknownModeError as exc:
            raise UsageError(str(exc)) from None
    prefix = sys.prefix if args.sys_prefix else args.prefix
    name = args.name or KERNEL_NAME
    if not _KERNEL_NAME.fullmatch(name):  # checked before jupyter_client makes a temp folder
        raise UsageError(f"--name {name!r}: a kernelspec's name is ASCII letters, digits, "
                         f"'.', '_' and '-' only")
    writable_record(args.record)  # a file there is refused now, not at the first session
    try:
        path = install(name, user=args.user, prefix=prefix, mode=mode, record=args.record,
                       display_name=args.display_name, network=not args.no_network,
                       require_confinement=args.require_confinement)
    except ValueError as exc:  # jupyter_client's message for a bad kernel name
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise CommandFailed(f"cannot write the kernelspec: {exc}") from None
    print(f"installed kernelspec {name} in {path}")
    return EXIT_OK


INSTALL = Command(
    name="install",
    help="install the control kernel as a Jupyter kernelspec (JupyterLab, VS Code, nbclient)",
    description=("Write a kernelspec whose kernel is a Host relaying to a real ipykernel: every "
                 "cell gets a Host-minted id and goes into the record. Without --user, "
                 "--sys-prefix or --prefix it installs system-wide."),
    add_arguments=_install_arguments,
    run=_install_run,
)


def _uninstall_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=None, help="the kernelspec's name (default: host_kernel)")


def _uninstall_run(args: argparse.Namespace) -> int:
    from .kernelspec import KERNEL_NAME, uninstall

    name = args.name or KERNEL_NAME
    try:
        path = uninstall(name)
    except KeyError:
        raise UsageError(f"no kernelspec named {name!r} is installed") from None
    print(f"removed kernelspec {name} from {path}")
    return EXIT_OK


UNINSTALL = Command(
    name="uninstall",
    help="remove the control kernel's kernelspec",
    add_arguments=_uninstall_arguments,
    run=_uninstall_run,
)


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    add_record_arguments(parser, positional=True)
    parser.add_argument("-o", "--output", metavar="OUT.ipynb", default=None,
                        help="write the notebook here (default: print it)")
    parser.add_argument("--session", metavar="ID", default=None,
                        help="the session to export, or a prefix only its id starts with "
                             "(default: the latest one started; `host-kernel ls` lists them)")


def _export_run(args: argparse.Namespace) -> int:
    import nbformat

    from ..export import UnknownSession, export_notebook

    # A missing record, or one that fails open_verified, raises RecordError: main() prints
    # "host-kernel export: error: [CODE] message" and exits 1.
    try:
        nb = export_notebook(record_argument(args), args.session)
    except UnknownSession as exc:
        raise UsageError(exc.message) from None
    text = cast(Callable[..., str], nbformat.writes)(nb)  # nbformat ships no type hints
    if args.output is None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return EXIT_OK
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    print(f"exported {len(nb.cells)} cells of session {nb.metadata['host_kernel']['session']} "
          f"to {args.output}", file=sys.stderr)
    return EXIT_OK


EXPORT = Command(
    name="export",
    help="export a session of a record as an nbformat 4.5 notebook with Host cell ids",
    description=("Write the session's cells as a notebook: cell ids are the Host-minted ids; "
                 "cell metadata holds generation, status, receipts, artifacts and the "
                 "frontend's cell id; notebook metadata the session, mode and submission "
                 "verdicts. Reads the record verified: a broken chain, or stored projections that "
                 "disagree with the events, is refused (exit 1); an unknown --session is exit 2."),
    add_arguments=_export_arguments,
    run=_export_run,
)

#: Loaded by host_kernel.cli through COMMAND_MODULES.
COMMANDS: list[Command] = [INSTALL, UNINSTALL, EXPORT]
