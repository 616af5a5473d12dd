"""What every ``host-kernel`` command uses: the Command record, its errors, exit codes, options.

Owns :class:`Command` (one subcommand's name, help and two functions),
:class:`UsageError` (exit 2) and :class:`CommandFailed` (exit 1), the exit
codes, the shared options and their checks (``--ledger`` and ``--blobs``;
``RECORD``, ``--record`` and ``--workdir`` for a reading command, a writable
``--record`` for a writing one), finding the record a reading command works
on, reading a notebook as ``exec`` and ``batch`` do (:func:`read_notebook`,
nbformat's reading and validation; :func:`code_cells`, exec's, which reads a
plain nbformat 4 notebook without importing nbformat), and the one way a
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
           "PROG", "CodeCell", "Command", "CommandFailed", "UsageError", "add_record_arguments",
           "add_store_arguments", "check_ledger_url", "code_cells", "full_id", "plural",
           "print_line", "quiet_nbformat", "read_notebook", "record_argument", "resolve_record",
           "resolved_id", "store_options", "writable_record"]

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
    text, _ = _notebook_json(path)
    return _nbformat_read(path, text)


@dataclass(frozen=True, slots=True)
class CodeCell:
    """One non-empty code cell of a notebook, as ``exec`` runs it."""

    #: Its place among all the notebook's cells, markdown and raw ones included, from 1.
    number: int
    #: Its source, one string (a list of lines in the file is joined, as nbformat does).
    source: str


def code_cells(path: Path) -> list[CodeCell]:
    """The non-empty code cells of the notebook at ``path``, in order: what ``exec`` runs.

    A plain nbformat 4 notebook (4.0 to 4.5: the top-level keys, each cell's keys and their
    types as the schema has them, each output an object of a known ``output_type``) is
    read with :mod:`json` alone: nbformat, its validator and jsonschema cost a short
    ``exec`` more than its first cell. What is inside the notebook's and the cells'
    ``metadata``, an output's fields and a cell's attachments, which ``exec`` neither
    reads nor writes, is not checked there. Anything else (another version, a key or type
    the schema does not allow, a duplicate cell id) is read by :func:`read_notebook`,
    which upgrades what nbformat can upgrade and refuses, with the same UsageErrors, what
    it cannot."""
    text, raw = _notebook_json(path)
    cells = _plain_v4_cells(raw)
    if cells is None:
        cells = [(str(c.get("cell_type")), str(c.get("source", "")))
                 for c in _nbformat_read(path, text).cells]
    return [CodeCell(n, source) for n, (kind, source) in enumerate(cells, start=1)
            if kind == "code" and source.strip()]


def _notebook_json(path: Path) -> tuple[str, dict[str, Any]]:
    """The text of the notebook file at ``path`` and its JSON, an object that names an
    nbformat version; the UsageErrors of :func:`read_notebook` for anything less."""
    import json

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
    if not isinstance(raw.get("nbformat_minor", 0), int):  # nbformat fails an assert on it
        raise UsageError(f"not a notebook: {path}: nbformat_minor is "
                         f"{raw['nbformat_minor']!r}, not a whole number")
    return text, raw


def _nbformat_read(path: Path, text: str) -> Any:
    """``text``, the notebook at ``path``, read by nbformat as version 4 and validated."""
    import nbformat

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


#: The keys nbformat 4's schema requires of a notebook, and allows (no others).
_NOTEBOOK_KEYS = frozenset({"nbformat", "nbformat_minor", "metadata", "cells"})
#: The keys each cell type must have (``id`` too from 4.5), and the ones it may have.
_CELL_KEYS = {
    "code": (frozenset({"cell_type", "metadata", "source", "outputs", "execution_count"}),
             frozenset({"id", "cell_type", "metadata", "source", "outputs",
                        "execution_count"})),
    "markdown": (frozenset({"cell_type", "metadata", "source"}),
                 frozenset({"id", "cell_type", "metadata", "source", "attachments"})),
    "raw": (frozenset({"cell_type", "metadata", "source"}),
            frozenset({"id", "cell_type", "metadata", "source", "attachments"})),
}
_OUTPUT_TYPES = frozenset({"execute_result", "display_data", "stream", "error"})
#: The newest minor version of nbformat 4 this reader knows (cell ids: 4.5).
_NEWEST_MINOR = 5
_ID_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def _plain_v4_cells(raw: dict[str, Any]) -> list[tuple[str, str]] | None:
    """Each cell's type and source (a list of lines joined) when ``raw`` is a plain
    nbformat 4 notebook (see :func:`code_cells`), else None: nbformat must read it."""
    minor = raw.get("nbformat_minor")
    if raw["nbformat"] != 4 or type(minor) is not int or not 0 <= minor <= _NEWEST_MINOR \
            or raw.keys() != _NOTEBOOK_KEYS or type(raw["metadata"]) is not dict \
            or type(raw["cells"]) is not list:
        return None
    ids: set[str] = set()
    cells = []
    for cell in raw["cells"]:
        if type(cell) is not dict or cell.get("cell_type") not in _CELL_KEYS:
            return None
        kind = cell["cell_type"]
        required, allowed = _CELL_KEYS[kind]
        keys = cell.keys()
        if not required <= keys or not keys <= allowed or type(cell["metadata"]) is not dict:
            return None
        if minor >= 5:  # a cell id: required, 1 to 64 of [a-zA-Z0-9-_], unique
            cid = cell.get("id")
            if type(cid) is not str or not 0 < len(cid) <= 64 or cid in ids \
                    or not _ID_CHARACTERS.issuperset(cid):
                return None
            ids.add(cid)
        elif "id" in cell:
            return None
        source = cell["source"]
        if type(source) is list and all(type(line) is str for line in source):
            source = "".join(source)
        if type(source) is not str or type(cell.get("attachments", {})) is not dict:
            return None
        if kind == "code":
            count, outputs = cell["execution_count"], cell["outputs"]
            if not (count is None or (type(count) is int and count >= 0)) \
                    or type(outputs) is not list \
                    or not all(type(out) is dict and out.get("output_type") in _OUTPUT_TYPES
                               for out in outputs):
                return None
        cells.append((kind, source))
    return cells


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
