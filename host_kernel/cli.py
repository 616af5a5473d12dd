"""The ``host-kernel`` command line: one registry of subcommands over the Host's Python API.

Owns argument parsing, exit codes, the one error style and what the commands
print. It does no work of its own: ``exec`` drives a :class:`~host_kernel.Host`
exactly as an agent would, one ``Host.execute`` per code cell; ``ls`` and
``show`` print what :mod:`host_kernel.browse` reads. It does not own the record,
the kernel or verification.

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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, cast

from ._paths import LEDGER_NAME
from ._version import __version__

__all__ = ["COMMANDS", "Command", "CommandFailed", "UsageError", "add_record_arguments",
           "all_commands", "build_parser", "main", "read_notebook", "record_argument",
           "resolve_record", "writable_record"]

PROG = "host-kernel"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: stdout was closed before everything was printed (``host-kernel ls | head``): 128 + SIGPIPE,
#: what a program killed by SIGPIPE reports.
EXIT_BROKEN_PIPE = 141

#: Observation statuses that count as a failed cell.
FAILED_STATUSES = frozenset({"error", "timeout", "kernel_died"})


class UsageError(Exception):
    """The command was asked for something it cannot do as given; exit code 2."""


class CommandFailed(Exception):
    """The command ran and could not do its work (the Host could not start, a file could not
    be written); exit code 1."""


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
    add_store_arguments(parser)


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ledger URL`` and ``--blobs URL``: where a Host keeps its record beyond the record
    folder (docs/scale.md); ``exec``, ``run``, ``mcp`` and ``batch`` take them."""
    parser.add_argument("--ledger", metavar="URL", default=None,
                        help="keep the ledger in the PostgreSQL database at URL "
                             "(postgresql://user@host:port/db) instead of the record folder's "
                             "SQLite file; the record key is read from $HOST_KERNEL_LEDGER_KEY "
                             "or made once per database under $XDG_CONFIG_HOME/host_kernel")
    parser.add_argument("--blobs", metavar="URL", default=None,
                        help="also write every blob to this fsspec store (s3://bucket/prefix, "
                             "file:///shared/path, …), where audit --ledger finds them")


def check_ledger_url(url: str) -> None:
    """UsageError unless ``url`` is a PostgreSQL URL; the message shows it without its
    password."""
    from .store.pg import is_postgres_url, redact_url

    if not is_postgres_url(url):
        if "://" not in url:  # a key=value string, a URL without its scheme: not shown
            raise UsageError("--ledger takes a postgresql:// URL "
                             "(postgresql://user@host:port/db), not a connection string")
        raise UsageError(f"--ledger takes a postgresql:// URL, not {redact_url(url)!r}")


def store_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Host keywords of :func:`add_store_arguments`' options, checked."""
    ledger, blobs = getattr(args, "ledger", None), getattr(args, "blobs", None)
    if ledger is not None:
        check_ledger_url(ledger)
    if blobs is not None and "://" not in blobs:
        blobs = str(Path(blobs).resolve())  # a plain path: a shared file system
    return {"ledger": ledger, "blobs": blobs}


def read_notebook(path: Path) -> Any:
    """The notebook at ``path``, read and validated; UsageError ``not a notebook: …`` when it
    is not one (not JSON, no ``nbformat`` version, a version nbformat cannot read, or a
    notebook that fails nbformat's schema: a code cell without ``source``, ``cells`` that is
    not a list), ``no such file``, ``not a file`` or ``cannot read`` for a missing or
    unreadable path. Public for the commands of other modules (``host-kernel batch``), which
    check their notebooks as ``exec`` does."""
    import json

    import nbformat

    if not path.exists():
        raise UsageError(f"no such file: {path}")
    if not path.is_file():
        raise UsageError(f"not a file: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"not a notebook: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        raw = json.loads(text)
    except ValueError:
        raise UsageError(f"not a notebook: {path} is not JSON") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("nbformat"), int):
        raise UsageError(f"not a notebook: {path} names no nbformat version") from None
    reads = cast(Callable[..., Any], nbformat.reads)  # nbformat ships no type hints
    try:
        nb = reads(text, as_version=4)
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                        for p in getattr(exc, "absolute_path", ())).lstrip(".")
        message = getattr(exc, "message", None) or str(exc).splitlines()[0]
        raise UsageError(f"not a notebook: {path}: {where + ': ' if where else ''}"
                         f"{message}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"not a notebook: {path}: {exc}") from None
    return nb


def writable_record(value: str | None) -> Path | None:
    """A ``--record`` a command will write to: None when not given. A path that exists and
    is not a folder is refused (RecordRefused ``record_missing``, exit 1) before anything
    starts."""
    if value is None:
        return None
    from .store.ledger import RecordRefused

    record = Path(value)
    if record.exists() and not record.is_dir():
        raise RecordRefused(f"--record {record} is a file, not a record folder",
                            code="record_missing")
    for above in record.absolute().parents:
        if above.exists():
            if not above.is_dir():
                raise RecordRefused(f"--record {record} lies inside {above}, which is a file",
                                    code="record_missing")
            break
    return record


def _exec_options(args: argparse.Namespace, notebook: Path
                  ) -> tuple[Path, Any, Path | None, str | None]:
    from .modes import UnknownModeError, normalise_mode_name

    workdir = Path(args.workdir) if args.workdir else notebook.resolve().parent
    if not workdir.is_dir():
        raise UsageError(f"--workdir {workdir} is not a directory")
    mode: str | None = None
    if args.mode is not None:
        try:
            mode = normalise_mode_name(args.mode)
        except UnknownModeError as exc:
            raise UsageError(str(exc)) from None
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError("--timeout must be a positive number of seconds")
    # Every notebook is read and checked before any runs: a bad one is a usage error at once.
    nb = read_notebook(notebook)
    return workdir, nb, writable_record(args.record), mode


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
        for n, (notebook, workdir, nb, record, mode) in enumerate(batch, start=1):
            _print(f"### notebook {n}/{len(batch)}: {notebook}")
            try:
                code = _exec_one(args, workdir, nb, record, mode, pool=pool)
            except CommandFailed as exc:
                _print(f"{PROG} exec: error: {exc}", sys.stderr)
                code = EXIT_FAILED
            if code != EXIT_OK:
                failed += 1
    _print(f"### {_plural(len(batch), 'notebook')} run, {failed} failed")
    return EXIT_FAILED if failed else EXIT_OK


def _exec_one(args: argparse.Namespace, workdir: Path, nb: Any, record: Path | None,
              mode: str | None, pool: Any = None) -> int:
    cells = [(i, c) for i, c in enumerate(nb.cells, start=1)
             if c.get("cell_type") == "code" and str(c.get("source", "")).strip()]

    from ._errors import HostKernelError, RecordError
    from .host._host import Host

    ran = 0
    failures: dict[str, int] = {}
    stopped_at: int | None = None
    host = Host(workdir, mode=mode, record_dir=record, front="cli",
                network=not args.no_network, require_confinement=args.require_confinement,
                pool=pool, **store_options(args))
    t0 = time.monotonic()
    try:
        host.start()
    except RecordError:
        raise  # the record folder holds no usable ledger: main prints its code
    except HostKernelError as exc:
        raise CommandFailed(f"the Host could not start: {exc}") from None
    except OSError as exc:
        raise CommandFailed(f"the Host could not start: {exc.strerror or exc}: "
                            f"{exc.filename or ''}".rstrip(": ")) from None
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
        # Also on Ctrl-C (the running cell is recorded `interrupted`) and on a closed stdout.
        host.close()
    errors = sum(failures.values())
    detail = ""
    if failures:
        detail = " (" + ", ".join(f"{k} {v}" for k, v in sorted(failures.items())) + ")"
    stopped = f", stopped at cell {stopped_at}" if stopped_at is not None else ""
    where = f"{host.record_dir}" if host.ledger_url is None else \
        f"session {host.session_id} in --ledger {_redact(host.ledger_url)}"
    _print(f"=== {_plural(ran, 'cell')} run, {_plural(errors, 'error')}{detail}{stopped}, "
           f"{time.monotonic() - t0:.1f} s; record: {where}")
    head = _final_head(host)
    if head is not None:
        _print(f"head: {head}")
    return EXIT_FAILED if errors else EXIT_OK


def _redact(url: str) -> str:
    from .store.pg import redact_url

    return redact_url(url)


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

# ---------------------------------------------------------------------- finding the record


def resolve_record(record: str | None, workdir: str | None = None) -> Path:
    """The record folder a reading command works on.

    ``record`` (a record folder, or a workspace) when given; else the record of
    ``workdir`` (default: the current directory), found with
    :func:`host_kernel._paths.find_record`. Raises RecordRefused
    (``record_missing``) when there is none: :func:`main` prints it as
    ``host-kernel CMD: error: [record_missing] …`` and exits 1.
    """
    from .store.verified import record_folder

    return record_folder(record if record is not None else (workdir or Path.cwd()))


def add_record_arguments(parser: argparse.ArgumentParser, *, positional: bool,
                         workdir: bool = False, ledger: bool = True) -> None:
    """The record options every reading command takes: ``RECORD`` (when ``positional``)
    and ``--record DIR``, which mean the same (give one); ``--workdir DIR`` too when
    ``workdir`` (for commands whose positional argument is an id); ``--ledger URL``
    (a PostgreSQL ledger instead of a record folder) unless not ``ledger``."""
    what = "a record folder, or a workspace whose record is found"
    default = "the record of --workdir, else of the current directory" if workdir else \
        "the current directory's record"
    if positional:
        parser.add_argument("record", nargs="?", default=None, metavar="RECORD",
                            help=f"{what} (default: {default})")
    parser.add_argument("--record", metavar="DIR", default=None,
                        dest="record_option" if positional else "record",
                        help=f"{what}; the same as RECORD" if positional else
                        f"{what} (default: {default})")
    if workdir:
        parser.add_argument("--workdir", metavar="DIR", default=None,
                            help="the workspace whose record is read when --record is not "
                                 "given (default: the current directory)")
    if ledger:
        parser.add_argument("--ledger", metavar="URL", default=None,
                            help="read the PostgreSQL ledger at URL (postgresql://…) instead "
                                 "of a record folder: every session in it, verified")


def record_argument(args: argparse.Namespace) -> Any:
    """The record named by the arguments :func:`add_record_arguments` added: a record
    folder (a Path), or with ``--ledger`` a :class:`~host_kernel.store.verified.LedgerRecord`
    that the readers open the same way."""
    record: str | None = getattr(args, "record", None)
    option: str | None = getattr(args, "record_option", None)
    if record is not None and option is not None and record != option:
        raise UsageError(f"two records given ({record} and --record {option}); give one")
    url: str | None = getattr(args, "ledger", None)
    if url is not None:
        from .store.verified import LedgerRecord

        if record is not None or option is not None:
            raise UsageError("give a record folder or --ledger URL, not both")
        check_ledger_url(url)
        return LedgerRecord(url)
    return resolve_record(record if record is not None else option,
                          getattr(args, "workdir", None))


# ---------------------------------------------------------------------- audit


def _expect_head(value: str) -> str:
    text = value.strip().lower()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise argparse.ArgumentTypeError("expected the 64 hex digits of an event hash")
    return text


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    add_record_arguments(parser, positional=True, ledger=False)
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
    group = parser.add_argument_group("a PostgreSQL ledger (docs/scale.md)")
    group.add_argument("--ledger", metavar="URL", default=None,
                       help="audit the PostgreSQL ledger at URL (postgresql://…) instead of a "
                            "record folder: every session in it, or those --session or --since "
                            "select; its record key is read from $HOST_KERNEL_LEDGER_KEY or "
                            "the key file its writers made")
    group.add_argument("--session", metavar="ID", action="append", default=None,
                       help="with --ledger: audit this session (an id or a unique prefix); "
                            "give it again for more")
    group.add_argument("--since", metavar="WHEN", type=_since, default=None,
                       help="with --ledger: only sessions started at or after WHEN (an ISO "
                            "date or time, e.g. 2026-12-01 or 2026-12-01T18:00, UTC unless it "
                            "says otherwise; or a Unix time)")
    group.add_argument("--blobs", metavar="URL", default=None,
                       help="with --ledger: the blob store to check blobs in (an fsspec URL); "
                            "default: the store the sessions recorded, then their record "
                            "folders on this machine")
    group.add_argument("--expect-heads", metavar="FILE", default=None,
                       help="with --ledger: JSON lines naming sessions and the hash their "
                            "last event had when kept (a `batch --json` output: session_id, "
                            "head); fail (head_mismatch) where a session is gone or ends "
                            "elsewhere")
    group.add_argument("--without-key", action="store_true",
                       help="with --ledger: audit without the record key (chains only, "
                            "macs_unchecked); without this a missing key is a failure")


def _since(value: str) -> float:
    import datetime as dt
    import math

    try:
        number = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"not a time: {value}")
        return number
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError("expected an ISO date or time, or a Unix time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _kept_heads(path: str | None) -> dict[str, str] | None:
    """``{session: head}`` from a file of JSON lines (``batch --json``'s output, or any
    lines with ``session_id`` and ``head``); lines without both are skipped."""
    import json

    if path is None:
        return None
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--expect-heads: cannot read {path}: {exc}") from None
    heads: dict[str, str] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise UsageError(f"--expect-heads: line {n} of {path} is not JSON") from None
        if isinstance(item, dict) and isinstance(item.get("session_id"), str) \
                and isinstance(item.get("head"), str):
            heads[item["session_id"]] = item["head"]
    if not heads:
        raise UsageError(f"--expect-heads: {path} names no session with its head")
    return heads


def _audit_run(args: argparse.Namespace) -> int:
    import json

    from .audit import audit, audit_ledger, print_progress

    progress = print_progress if not args.json else lambda *a: None
    if args.ledger is not None:
        if args.record is not None or args.record_option is not None:
            raise UsageError("give a record folder or --ledger URL, not both")
        if args.expect_head is not None or args.reproduce:
            raise UsageError("--expect-head and --reproduce work on a record folder, not "
                             "with --ledger")
        check_ledger_url(args.ledger)
        report = audit_ledger(args.ledger, sessions=args.session, since=args.since,
                              blobs=args.blobs, strict=args.strict, progress=progress,
                              without_key=args.without_key,
                              expect_heads=_kept_heads(args.expect_heads))
    else:
        if args.session is not None or args.since is not None or args.blobs is not None \
                or args.expect_heads is not None or args.without_key:
            raise UsageError("--session, --since, --blobs, --expect-heads and --without-key "
                             "go with --ledger URL")
        report = audit(record_argument(args), strict=args.strict,
                       expect_head=args.expect_head, reproduce=args.reproduce,
                       progress=progress)
    if args.json:
        _print(json.dumps(report.to_dict(), indent=2))
    else:
        for finding in report.findings:
            _print(str(finding))
        if report.head is not None:
            _print(f"head: {report.head}")
        _print(report.summary())
    fatal = [f for f in report.findings if f.fatal]
    if fatal:  # the findings above say it all; stderr gets the one line every command gives
        more = f" (and {len(fatal) - 1} more failures)" if len(fatal) > 1 else ""
        raise CommandFailed(f"[{fatal[0].code}] {fatal[0].where}: {fatal[0].message}{more}")
    return EXIT_OK


AUDIT = Command(
    name="audit",
    help="re-check a record offline: chain, MACs, projections, blobs, receipts, lineage drift, "
         "submissions",
    description=(
        "Re-check a record read-only, without a kernel: the ledger file, the hash chain, each "
        "event's MAC (when record.key can be read), the stored projection against the events, "
        "every blob, every receipt's output digests, lineage drift, and every accepted "
        "submission re-verified (with --reproduce, its tests re-run). One line per finding, "
        "the chain head, and a summary. Exit 0 when clean, 1 when a failure was found "
        "(the findings say which) or there is no record."),
    add_arguments=_audit_arguments,
    run=_audit_run,
)


# ---------------------------------------------------------------------- lineage, receipt


def _lineage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact_id", metavar="ARTIFACT_ID", help="the artifact's UUID")
    add_record_arguments(parser, positional=False, workdir=True)
    parser.add_argument("--format", choices=("text", "mermaid", "dot", "prov-json", "json"),
                        default="text", help="output format (default: text)")


def _lineage_run(args: argparse.Namespace) -> int:
    import json

    from ._errors import FileProblem
    from .lineage.graph import record_lineage

    record = record_argument(args)
    try:
        graph = record_lineage(record, args.artifact_id)
    except FileProblem as exc:
        raise UsageError(exc.message) from None
    renderers: dict[str, Callable[[], str]] = {
        "text": graph.to_text, "mermaid": graph.to_mermaid, "dot": graph.to_dot,
        "prov-json": lambda: json.dumps(graph.to_prov(), indent=2) + "\n",
        "json": lambda: json.dumps(graph.to_dict(), indent=2) + "\n"}
    sys.stdout.write(renderers[args.format]())
    sys.stdout.flush()
    return EXIT_OK


LINEAGE = Command(
    name="lineage",
    help="show an artifact's lineage as text, Mermaid, Graphviz DOT or W3C PROV-JSON",
    add_arguments=_lineage_arguments,
    run=_lineage_run,
)


def _receipt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("receipt_id", metavar="RECEIPT_ID", help="the receipt's UUID")
    add_record_arguments(parser, positional=False, workdir=True)


def _receipt_run(args: argparse.Namespace) -> int:
    import json

    from ._errors import FileProblem
    from .lineage.graph import record_receipt_statement

    record = record_argument(args)
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


# ---------------------------------------------------------------------- ls, show


def _ls_arguments(parser: argparse.ArgumentParser) -> None:
    add_record_arguments(parser, positional=True)
    parser.add_argument("--session", metavar="ID", default=None,
                        help="only this session's rows (a unique prefix of its id will do); "
                             "without a kind flag, its cells")
    kind = parser.add_mutually_exclusive_group()
    for name in ("sessions", "cells", "receipts", "artifacts", "verdicts"):
        kind.add_argument(f"--{name}", dest="kind", action="store_const", const=name,
                          help=f"list {name}" + (" (the default without --session)"
                                                 if name == "sessions" else ""))
    parser.add_argument("--json", action="store_true",
                        help="print JSON: {record, kind, session, rows}")


def _ls_run(args: argparse.Namespace) -> int:
    from . import browse
    from .store.ledger import collector_paused
    from .store.verified import open_verified

    record = record_argument(args)
    kind = args.kind or ("cells" if args.session is not None else "sessions")
    with collector_paused(), open_verified(record) as trusted:
        try:
            session = None if args.session is None else browse.session_id(trusted, args.session)
        except browse.UnknownId as exc:
            raise UsageError(f"--session: {exc}") from None
        rows = browse.list_rows(trusted, kind, session)
    if args.json:
        browse.print_json({"record": str(record), "kind": kind, "session": session,
                           "rows": rows})
    else:
        browse.print_rows(kind, rows, str(record), session)
    return EXIT_OK


LS = Command(
    name="ls",
    help="list a record's sessions, or the cells, receipts, artifacts or verdicts in it",
    description=(
        "List what a record holds, read verified (a record that fails its checks is refused, "
        "exit 1). Without flags: one row per session (started, ended, mode, confinement, "
        "generations, cells, receipts, artifacts, verdicts). --session ID lists that "
        "session's cells; --cells, --receipts, --artifacts or --verdicts lists rows of that "
        "kind, of every session or of --session's. A table on a terminal, plain text when "
        "piped, JSON with --json."),
    add_arguments=_ls_arguments,
    run=_ls_run,
)


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID",
                        help="a session, cell, receipt, artifact or verdict (submission) id, or "
                             "a prefix of it that no other id of the record starts with")
    add_record_arguments(parser, positional=False, workdir=True)
    parser.add_argument("--json", action="store_true",
                        help="print JSON: {record, kind, id, item, related}")


def _show_run(args: argparse.Namespace) -> int:
    from . import browse
    from .store.ledger import collector_paused
    from .store.verified import open_verified

    record = record_argument(args)
    with collector_paused(), open_verified(record) as trusted:
        try:
            match = browse.find_id(trusted, args.id)
        except browse.UnknownId as exc:
            raise UsageError(str(exc)) from None
        found, related = browse.item(trusted, match)
    if args.json:
        browse.print_json({"record": str(record), "kind": match.kind, "id": match.id,
                           "item": found, "related": related})
    else:
        browse.print_item(match, found, related)
    return EXIT_OK


SHOW = Command(
    name="show",
    help="show one session, cell, receipt, artifact or verdict of a record, by id or prefix",
    description=(
        "Find ID among the record's session, cell, receipt, artifact and verdict ids (a "
        "unique prefix will do; an ambiguous one lists the candidates, exit 2) and show it, "
        "read verified: its fields, then what belongs to it (a session's generations, cells, "
        "receipts, artifacts, verdicts; a cell's code, outputs, receipts, artifacts, writes, "
        "refusals). JSON with --json."),
    add_arguments=_show_arguments,
    run=_show_run,
)


#: Every subcommand, in the order ``--help`` lists them. Commands that live with the
#: part they drive are added from the modules named in :data:`COMMAND_MODULES`.
COMMANDS: list[Command] = [EXEC, AUDIT, LS, SHOW, LINEAGE, RECEIPT]

#: Modules that each define ``COMMANDS: list[Command]`` (the kernelspec front, the
#: agent loop, the MCP server, the record viewer); loaded when the parser is built.
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
        p.set_defaults(_run=command.run, _parser=p)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that arguments a subcommand does not know are
    reported by that subcommand's parser (its usage line, ``host-kernel CMD: error:``),
    not by the top-level one, which is where argparse sends them."""
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
    try:
        parser = build_parser()
        try:
            args = _parse(parser, list(sys.argv[1:] if argv is None else argv))
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
        _print(f"{PROG}{'' if command is None else ' ' + command}: interrupted", sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout closed early: nothing more to say, and no one to say it to
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


def _run(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    from ._errors import HostKernelError

    def error(message: object) -> None:
        _print(f"{PROG} {args.command}: error: {message}", sys.stderr)

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
