"""The ``host-kernel`` command line: one registry of subcommands over the Host's Python API.

Owns argument parsing, exit codes and what the commands print. It does no work
of its own: ``exec`` drives a :class:`~host_kernel.Host` exactly as an agent
would, one ``Host.execute`` per code cell. It does not own the record, the
kernel or verification.

Adding a subcommand is one :class:`Command` value appended to :data:`COMMANDS`:
its name, a one-line help, a function that adds its arguments to a parser, and
a function that runs it and returns the exit code. A run function signals a
usage problem (a missing file, a bad flag value) by raising :class:`UsageError`,
which :func:`main` turns into a message on stderr and exit code 2.

Exit codes, for every command: 0 success, 1 the work ran and something failed,
2 usage error, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, cast

from ._version import __version__

__all__ = ["COMMANDS", "Command", "UsageError", "build_parser", "main"]

PROG = "host-kernel"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: Observation statuses that count as a failed cell.
FAILED_STATUSES = frozenset({"error", "timeout", "kernel_died"})


class UsageError(Exception):
    """The command was asked for something it cannot do as given; exit code 2."""


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: ``host-kernel NAME ...``."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None


# ---------------------------------------------------------------------- exec


def _exec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebook", metavar="NOTEBOOK.ipynb",
                        help="the notebook whose code cells are run, in order")
    parser.add_argument("--mode", metavar="M", default=None,
                        help="arm a task mode (analysis_run, reusable_pipeline, "
                             "codebase_change); default: none armed")
    parser.add_argument("--workdir", metavar="DIR", default=None,
                        help="the workspace the kernel runs in and host.write_file writes to "
                             "(default: the notebook's folder)")
    parser.add_argument("--record", metavar="DIR", default=None,
                        help="the record folder: ledger and artifact store "
                             "(default: WORKDIR/.host_kernel)")
    parser.add_argument("--timeout", metavar="S", type=float, default=None,
                        help="seconds each cell may run before the Host interrupts it "
                             "(default: no limit)")
    parser.add_argument("--stop-on-error", action="store_true",
                        help="stop at the first cell whose status is error, timeout or "
                             "kernel_died")


def _read_notebook(path: Path) -> Any:
    import nbformat

    if not path.exists():
        raise UsageError(f"no such file: {path}")
    if not path.is_file():
        raise UsageError(f"not a file: {path}")
    read = cast(Callable[..., Any], nbformat.read)  # nbformat ships no type hints
    try:
        return read(path, as_version=4)
    except UnicodeDecodeError:
        raise UsageError(f"not a notebook: {path} is not UTF-8 text") from None
    except nbformat.reader.NotJSONError:
        raise UsageError(f"not a notebook: {path} is not JSON") from None
    except (nbformat.ValidationError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"not a notebook: {path}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def _exec_options(args: argparse.Namespace) -> tuple[Path, Path, Path | None, str | None]:
    from .modes import UnknownModeError, normalise_mode_name

    notebook = Path(args.notebook)
    workdir = Path(args.workdir) if args.workdir else notebook.resolve().parent
    if not workdir.is_dir():
        raise UsageError(f"--workdir {workdir} is not a directory")
    record = Path(args.record) if args.record else None
    mode: str | None = None
    if args.mode is not None:
        try:
            mode = normalise_mode_name(args.mode)
        except UnknownModeError as exc:
            raise UsageError(str(exc)) from None
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError("--timeout must be a positive number of seconds")
    return workdir, notebook, record, mode


def _print(text: str, stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    out.write(text if text.endswith("\n") else text + "\n")
    out.flush()


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _exec_run(args: argparse.Namespace) -> int:
    workdir, notebook, record, mode = _exec_options(args)
    nb = _read_notebook(notebook)
    cells = [(i, c) for i, c in enumerate(nb.cells, start=1)
             if c.get("cell_type") == "code" and str(c.get("source", "")).strip()]

    from ._errors import HostKernelError
    from .host._host import Host

    ran = 0
    failures: dict[str, int] = {}
    stopped_at: int | None = None
    host = Host(workdir, mode=mode, record_dir=record, front="cli")
    t0 = time.monotonic()
    try:
        host.start()
    except HostKernelError as exc:
        _print(f"{PROG} exec: the Host could not start: {exc}", sys.stderr)
        return EXIT_FAILED
    try:
        for n, (index, cell) in enumerate(cells, start=1):
            obs = host.execute(str(cell.source), timeout=args.timeout)
            ran += 1
            _print(f"--- cell {index} ({n}/{len(cells)} code): {obs.status}, "
                   f"generation {obs.generation}, {obs.duration:.3f} s, id {obs.cell_id}")
            _print(obs.text)
            if obs.status in FAILED_STATUSES:
                failures[obs.status] = failures.get(obs.status, 0) + 1
                if args.stop_on_error:
                    stopped_at = index
                    break
    finally:
        host.close()
    errors = sum(failures.values())
    detail = ""
    if failures:
        detail = " (" + ", ".join(f"{k} {v}" for k, v in sorted(failures.items())) + ")"
    stopped = f", stopped at cell {stopped_at}" if stopped_at is not None else ""
    _print(f"=== {_plural(ran, 'cell')} run, {_plural(errors, 'error')}{detail}{stopped}, "
           f"{time.monotonic() - t0:.1f} s; record: {host.record_dir}")
    return EXIT_FAILED if errors else EXIT_OK


EXEC = Command(
    name="exec",
    help="run a notebook's code cells through one Host, printing what an agent sees",
    description=(
        "Start one Host (and its kernel) in WORKDIR, run every non-empty code cell of the "
        "notebook through Host.execute in order, print each Observation's text under a "
        "header line, and end with a summary line. Markdown and raw cells are skipped. "
        "Exit 0 when no cell failed, 1 when one did (status error, timeout or "
        "kernel_died) or the Host could not start, 2 for usage errors."),
    add_arguments=_exec_arguments,
    run=_exec_run,
)

# ---------------------------------------------------------------------- audit


def _record_dir(value: str) -> Path:
    from ._errors import RecordError
    from .export import record_folder

    try:
        return record_folder(value)
    except RecordError as exc:
        raise UsageError(exc.message) from None


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("record", help="the record folder (or a workdir holding .host_kernel)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--strict", action="store_true",
                        help="treat lineage drift (an input file changed since) as a failure")


def _audit_run(args: argparse.Namespace) -> int:
    import json

    from .audit import audit, print_progress

    report = audit(_record_dir(args.record), strict=args.strict,
                   progress=print_progress if not args.json else lambda *a: None)
    if args.json:
        _print(json.dumps(report.to_dict(), indent=2))
    else:
        for finding in report.findings:
            _print(str(finding))
        _print(report.summary())
    return EXIT_OK if report.clean else EXIT_FAILED


AUDIT = Command(
    name="audit",
    help="re-check a record offline: chain, blobs, receipts, lineage drift, submissions",
    add_arguments=_audit_arguments,
    run=_audit_run,
)


# ---------------------------------------------------------------------- lineage, receipt


def _lineage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact_id", help="the artifact's UUID")
    parser.add_argument("--record", required=True, help="the record folder")
    parser.add_argument("--format", choices=("text", "mermaid", "dot", "prov-json", "json"),
                        default="text", help="output format (default: text)")


def _lineage_run(args: argparse.Namespace) -> int:
    import json

    from ._errors import FileProblem
    from .lineage.graph import build_lineage
    from .store.ledger import SQLiteLedger

    with SQLiteLedger(_record_dir(args.record) / "ledger.sqlite") as ledger:
        try:
            graph = build_lineage(ledger, args.artifact_id)
        except FileProblem as exc:
            raise UsageError(exc.message) from None
    renderers: dict[str, Callable[[], str]] = {
        "text": graph.to_text, "mermaid": graph.to_mermaid, "dot": graph.to_dot,
        "prov-json": lambda: json.dumps(graph.to_prov(), indent=2) + "\n",
        "json": lambda: json.dumps(graph.to_dict(), indent=2) + "\n"}
    sys.stdout.write(renderers[args.format]())
    return EXIT_OK


LINEAGE = Command(
    name="lineage",
    help="show an artifact's lineage as text, Mermaid, Graphviz DOT or W3C PROV-JSON",
    add_arguments=_lineage_arguments,
    run=_lineage_run,
)


def _receipt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("receipt_id", help="the receipt's UUID")
    parser.add_argument("--record", required=True, help="the record folder")


def _receipt_run(args: argparse.Namespace) -> int:
    import json

    from ._errors import FileProblem
    from .lineage.graph import receipt_statement
    from .store.ledger import SQLiteLedger

    with SQLiteLedger(_record_dir(args.record) / "ledger.sqlite") as ledger:
        try:
            statement = receipt_statement(ledger, args.receipt_id)
        except FileProblem as exc:
            raise UsageError(exc.message) from None
    _print(json.dumps(statement, indent=2))
    return EXIT_OK


RECEIPT = Command(
    name="receipt",
    help="export a host.bash receipt as an in-toto Statement v1 (link predicate)",
    add_arguments=_receipt_arguments,
    run=_receipt_run,
)


#: Every subcommand, in the order ``--help`` lists them. Commands that live with the
#: part they drive are added from the modules named in :data:`COMMAND_MODULES`.
COMMANDS: list[Command] = [EXEC, AUDIT, LINEAGE, RECEIPT]

#: Modules that each define ``COMMANDS: list[Command]`` (the kernelspec front, the
#: agent loop, the MCP server); loaded when the parser is built.
COMMAND_MODULES = ("host_kernel.control.commands", "host_kernel.agent.commands")


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


def build_parser(commands: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A Jupyter kernel driven by a Host that keeps a tamper-evident record: "
                    "nothing is accepted that the Host's own record does not back.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in all_commands() if commands is None else commands:
        p = sub.add_parser(command.name, help=command.help,
                           description=command.description or command.help)
        command.add_arguments(p)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``host-kernel`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or argparse's own usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:  # cell output may hold characters the terminal cannot show
        reconfigure(errors="backslashreplace")
    try:
        return run(args)
    except UsageError as exc:
        _print(f"{PROG} {args.command}: error: {exc}", sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        _print(f"{PROG} {args.command}: interrupted", sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
