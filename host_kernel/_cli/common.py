"""What every ``host-kernel`` command uses: the Command record, its errors, exit codes, options.

Owns :class:`Command` (one subcommand's name, help and two functions),
:class:`UsageError` (exit 2) and :class:`CommandFailed` (exit 1), the exit
codes, the shared options and their checks (``--ledger`` and ``--blobs``;
``RECORD``, ``--record`` and ``--workdir`` for a reading command, a writable
``--record`` for a writing one), finding the record a reading command works
on, reading a notebook as ``exec`` and ``batch`` do, and the one way a
command prints a line. :mod:`host_kernel.cli` re-exports all of it for the
commands of other parts; this module imports no command, and not
:mod:`host_kernel.cli`. It does not parse argv or print errors: ``main``
does.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, cast

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE",
           "PROG", "Command", "CommandFailed", "UsageError", "add_record_arguments",
           "add_store_arguments", "check_ledger_url", "full_id", "plural", "print_line", "quiet_nbformat",
           "read_notebook", "record_argument", "resolve_record", "resolved_id", "store_options", "writable_record"]

PROG = "host-kernel"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: stdout was closed before everything was printed (``host-kernel ls | head``): 128 + SIGPIPE,
#: what a program killed by SIGPIPE reports.
EXIT_BROKEN_PIPE = 141


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


# ---------------------------------------------------------------------- the store options


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
    from ..store.pg import is_postgres_url, redact_url

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
        with quiet_nbformat():
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


@contextlib.contextmanager
def quiet_nbformat() -> Iterator[None]:
    """nbformat's reading and validating without its warnings: a cell without an ``id``
    (nbformat < 4.5 had none) is given one quietly, as nbformat itself does, instead of a
    ``MissingIDFieldWarning`` with a site-packages path on the user's terminal; and no
    other of nbformat's own warnings reaches it either."""
    import warnings

    from nbformat.warnings import DuplicateCellId, MissingIDFieldWarning

    with warnings.catch_warnings():
        for category in (MissingIDFieldWarning, DuplicateCellId):
            warnings.simplefilter("ignore", category)
        yield


def writable_record(value: str | None) -> Path | None:
    """A ``--record`` a command will write to: None when not given. A path that exists and
    is not a folder is refused (RecordRefused ``record_missing``, exit 1) before anything
    starts."""
    if value is None:
        return None
    from ..store.ledger import RecordRefused

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


# ---------------------------------------------------------------------- printing


def print_line(text: str, stream: TextIO | None = None) -> None:
    """Write ``text`` as one line (a newline added unless it ends in one) to ``stream``
    (default: stdout), flushed."""
    out = stream or sys.stdout
    out.write(text if text.endswith("\n") else text + "\n")
    out.flush()


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# ---------------------------------------------------------------------- finding the record


def resolve_record(record: str | None, workdir: str | None = None) -> Path:
    """The record folder a reading command works on.

    ``record`` (a record folder, or a workspace) when given; else the record of
    ``workdir`` (default: the current directory), found with
    :func:`host_kernel._paths.find_record`. Raises RecordRefused
    (``record_missing``) when there is none: :func:`host_kernel.cli.main` prints it as
    ``host-kernel CMD: error: [record_missing] …`` and exits 1.
    """
    from ..store.verified import record_folder

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


def full_id(ledger: Any, prefix: str, kind: str) -> str:
    """The whole id of the one ``kind`` (``artifact``, ``receipt``, …) of the verified
    ``ledger`` that is ``prefix`` or starts with it, as ``show`` finds ids; UsageError
    ``no artifact id in the record starts with 'x'``, or for an ambiguous prefix one that
    lists the ids that start with it."""
    from ..browse import UnknownId, find_id

    try:
        return find_id(ledger, prefix, (kind,)).id
    except UnknownId as exc:
        raise UsageError(str(exc)) from None


def resolved_id(record: Any, prefix: str, kind: str) -> str:
    """:func:`full_id` in the record ``record`` (a record folder or a LedgerRecord), read
    verified (a record that fails its checks raises its RecordRefused)."""
    from ..store.ledger import collector_paused
    from ..store.verified import open_verified

    with collector_paused(), open_verified(record) as trusted:
        return full_id(trusted, prefix, kind)


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
        from ..store.verified import LedgerRecord

        if record is not None or option is not None:
            raise UsageError("give a record folder or --ledger URL, not both")
        check_ledger_url(url)
        return LedgerRecord(url)
    return resolve_record(record if record is not None else option,
                          getattr(args, "workdir", None))
