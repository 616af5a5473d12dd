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
2 usage error, 130 interrupted (Ctrl-C). A record that cannot be found or that
fails its checks (a :class:`~host_kernel.RecordError`) is exit 1 with one line
on stderr, ``error: [CODE] message``, never a traceback.

Commands that read a record find it with :func:`resolve_record`: ``--record``
(a record folder or a workspace) when given, else the workspace's record (see
:mod:`host_kernel._paths`); they read it only through
:func:`~host_kernel.store.verified.open_verified` or, for ``audit``, read-only.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, cast

from ._paths import LEDGER_NAME
from ._version import __version__

__all__ = ["COMMANDS", "Command", "UsageError", "build_parser", "main", "resolve_record"]

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
    parser.add_argument("notebook", metavar="NOTEBOOK.ipynb", nargs="+",
                        help="the notebook whose code cells are run, in order; several run "
                             "one after another, each in a session of its own, the later "
                             "ones started warm from a pool")
    parser.add_argument("--mode", metavar="M", default=None,
                        help="arm a task mode (analysis_run, reusable_pipeline, "
                             "codebase_change); default: none armed")
    parser.add_argument("--workdir", metavar="DIR", default=None,
                        help="the workspace the kernel runs in and host.write_file writes to "
                             "(default: the notebook's folder)")
    parser.add_argument("--record", metavar="DIR", default=None,
                        help="the record folder: ledger and artifact store (default: the "
                             "workspace's record folder, outside it, under "
                             "$XDG_STATE_HOME/host_kernel/records/)")
    parser.add_argument("--timeout", metavar="S", type=float, default=None,
                        help="seconds each cell may run before the Host interrupts it "
                             "(default: no limit)")
    parser.add_argument("--stop-on-error", action="store_true",
                        help="stop at the first cell whose status is error, timeout or "
                             "kernel_died")
    parser.add_argument("--no-network", action="store_true",
                        help="deny the kernel and its host.bash commands TCP connect and bind")
    parser.add_argument("--require-confinement", action="store_true",
                        help="refuse to run where Landlock confinement is unavailable "
                             "(exit 1) instead of running unconfined")


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


def _exec_options(args: argparse.Namespace, notebook: Path
                  ) -> tuple[Path, Path, Path | None, str | None]:
    from .modes import UnknownModeError, normalise_mode_name

    workdir = Path(args.workdir) if args.workdir else notebook.resolve().parent
    if not workdir.is_dir():
        raise UsageError(f"--workdir {workdir} is not a directory")
    record = Path(args.record) if args.record else None
    if record is not None and record.exists() and not record.is_dir():
        from .store.ledger import RecordRefused

        raise RecordRefused(f"--record {record} is a file, not a record folder",
                            code="record_missing")
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
    batch = [(Path(nb), *_exec_options(args, Path(nb))) for nb in args.notebook]
    if len(batch) == 1:
        return _exec_one(args, *batch[0][1:])
    from .host._pool import HostPool

    # Each notebook is a session of its own; all but the first start from a standby
    # kernel the pool started while the one before ran.
    failed = 0
    roots = sorted({str(workdir.resolve()) for _, workdir, *_ in batch})
    with HostPool(size=1, roots=roots) as pool:
        for n, (notebook, workdir, nb_path, record, mode) in enumerate(batch, start=1):
            _print(f"### notebook {n}/{len(batch)}: {notebook}")
            if _exec_one(args, workdir, nb_path, record, mode, pool=pool) != EXIT_OK:
                failed += 1
    _print(f"### {_plural(len(batch), 'notebook')} run, {failed} failed")
    return EXIT_FAILED if failed else EXIT_OK


def _exec_one(args: argparse.Namespace, workdir: Path, notebook: Path, record: Path | None,
              mode: str | None, pool: Any = None) -> int:
    nb = _read_notebook(notebook)
    cells = [(i, c) for i, c in enumerate(nb.cells, start=1)
             if c.get("cell_type") == "code" and str(c.get("source", "")).strip()]

    from ._errors import HostKernelError
    from .host._host import Host

    ran = 0
    failures: dict[str, int] = {}
    stopped_at: int | None = None
    host = Host(workdir, mode=mode, record_dir=record, front="cli",
                network=not args.no_network, require_confinement=args.require_confinement,
                pool=pool)
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
    head = _final_head(host)
    if head is not None:
        _print(f"head: {head}")
    return EXIT_FAILED if errors else EXIT_OK


def _final_head(host: Any) -> str | None:
    """The chain head the Host left: its own ``head`` when it has one, else the last event
    its ledger wrote or checked, else the record's last event read back (which, with
    several Hosts on one record, may be another's)."""
    head = getattr(host, "head", None)
    if isinstance(head, str):
        return head
    from ._errors import RecordError
    from .store.ledger import SQLiteLedger

    ledger = getattr(host, "ledger", None)
    if isinstance(ledger, SQLiteLedger) and ledger.known_head is not None:
        return ledger.known_head.hash
    try:
        with SQLiteLedger.open_readonly(Path(host.record_dir) / LEDGER_NAME) as ledger:
            last = ledger.head()
    except RecordError:
        return None
    return None if last is None else last.hash


EXEC = Command(
    name="exec",
    help="run a notebook's code cells through one Host, printing what an agent sees",
    description=(
        "Start one Host (and its kernel) in WORKDIR, run every non-empty code cell of the "
        "notebook through Host.execute in order, print each Observation's text under a "
        "header line, and end with a summary line. Markdown and raw cells are skipped. "
        "Several notebooks run one after another, each in a session of its own (kernels "
        "for the later ones start from a warm pool), and a last line counts the failed. "
        "Exit 0 when no cell failed, 1 when one did (status error, timeout or "
        "kernel_died) or the Host could not start, 2 for usage errors. The last line, "
        "`head: HASH`, is the hash of the record's last event: keep it, and "
        "`host-kernel audit --expect-head HASH` proves later that nothing was appended, "
        "removed or rewritten since."),
    add_arguments=_exec_arguments,
    run=_exec_run,
)

# ---------------------------------------------------------------------- audit


def resolve_record(record: str | None, workdir: str | None = None) -> Path:
    """The record folder a reading command works on.

    ``record`` (a record folder, or a workspace) when given; else the record of
    ``workdir`` (default: the current directory), found with
    :func:`host_kernel._paths.find_record`. Raises RecordRefused
    (``record_missing``) when there is none: :func:`main` prints it as
    ``error: …`` and exits 1.
    """
    from .store.verified import record_folder

    return record_folder(record if record is not None else (workdir or Path.cwd()))


def _expect_head(value: str) -> str:
    text = value.strip().lower()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise argparse.ArgumentTypeError("expected the 64 hex digits of an event hash")
    return text


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("record", nargs="?", default=None, metavar="RECORD",
                        help="a record folder, or a workspace whose record is found (default: "
                             "the current directory's record)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--strict", action="store_true",
                        help="treat lineage drift (an input file changed since) as a failure")
    parser.add_argument("--expect-head", metavar="HASH", type=_expect_head, default=None,
                        help="fail (head_mismatch) unless the record's last event has this hash, "
                             "as printed by `host-kernel exec` or returned by the Host")
    parser.add_argument("--reproduce", action="store_true",
                        help="re-run every accepted submission's test evidence from the record "
                             "(declared files and baseline from the blob store), confined, and "
                             "fail (reproduction_differs) when an outcome differs")


def _audit_run(args: argparse.Namespace) -> int:
    import json

    from .audit import audit, print_progress

    report = audit(resolve_record(args.record), strict=args.strict,
                   expect_head=args.expect_head, reproduce=args.reproduce,
                   progress=print_progress if not args.json else lambda *a: None)
    if args.json:
        _print(json.dumps(report.to_dict(), indent=2))
    else:
        for finding in report.findings:
            _print(str(finding))
        if report.head is not None:
            _print(f"head: {report.head}")
        _print(report.summary())
    return EXIT_OK if report.clean else EXIT_FAILED


AUDIT = Command(
    name="audit",
    help="re-check a record offline: chain, MACs, projections, blobs, receipts, lineage drift, "
         "submissions",
    description=(
        "Re-check a record read-only, without a kernel: the ledger file, the hash chain, each "
        "event's MAC (when record.key can be read), the stored projection against the events, "
        "every blob, every receipt's output digests, lineage drift, and every accepted "
        "submission re-verified (with --reproduce, its tests re-run). One line per finding, "
        "the chain head, and a summary. Exit 0 "
        "when clean, 1 when a failure was found or there is no record."),
    add_arguments=_audit_arguments,
    run=_audit_run,
)


# ---------------------------------------------------------------------- lineage, receipt


def _record_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--record", metavar="DIR", default=None,
                        help="the record folder, or a workspace (default: the record of "
                             "--workdir)")
    parser.add_argument("--workdir", metavar="DIR", default=None,
                        help="the workspace whose record is read when --record is not given "
                             "(default: the current directory)")


def _lineage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact_id", help="the artifact's UUID")
    _record_arguments(parser)
    parser.add_argument("--format", choices=("text", "mermaid", "dot", "prov-json", "json"),
                        default="text", help="output format (default: text)")


def _lineage_run(args: argparse.Namespace) -> int:
    import json

    from ._errors import FileProblem
    from .lineage.graph import record_lineage

    record = resolve_record(args.record, args.workdir)
    try:
        graph = record_lineage(record, args.artifact_id)
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
    _record_arguments(parser)


def _receipt_run(args: argparse.Namespace) -> int:
    import json

    from ._errors import FileProblem
    from .lineage.graph import record_receipt_statement

    record = resolve_record(args.record, args.workdir)
    try:
        statement = record_receipt_statement(record, args.receipt_id)
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
    from ._errors import RecordError

    try:
        return run(args)
    except UsageError as exc:
        _print(f"{PROG} {args.command}: error: {exc}", sys.stderr)
        return EXIT_USAGE
    except RecordError as exc:  # no record, or one that fails its checks: refuse, no traceback
        _print(f"error: {exc}", sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        _print(f"{PROG} {args.command}: interrupted", sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
