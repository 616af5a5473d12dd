"""The commands that turn lineage into a program and prove it: ``slice`` and ``rederive``.

Owns their arguments, what they print and their exit codes, and ``audit --rederive``'s
part (:func:`rederive_all`). The slice is computed by :mod:`host_kernel.lineage.slice`
from the verified record; re-derivation runs it in a fresh confined Host over a fresh
workspace (:mod:`host_kernel.host._rederive`). Nothing here writes the record it reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .common import (
    EXIT_OK,
    Command,
    CommandFailed,
    UsageError,
    add_record_arguments,
    full_id,
    print_line,
    record_argument,
)

__all__ = ["REDERIVE", "SLICE", "rederive_all"]


@contextmanager
def _opened(record: Any) -> Iterator[tuple[Any, Any]]:
    """The verified ledger of a record folder and its blob store."""
    from ..store.blobs import FileBlobStore
    from ..store.verified import open_verified

    if not isinstance(record, Path):
        raise UsageError("slice and rederive read a record folder (not --ledger)")
    with open_verified(record) as trusted:
        yield trusted, FileBlobStore(record, durable=False)


def _start_host(workspace: Path, record: Path, hide: tuple[str, ...] = ()) -> Any:
    from ..host._host import fresh_host

    return fresh_host(workspace, record, hide)


def _console(line: str) -> None:
    from ..browse import printable

    print(printable(line), file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- slice


def _slice_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact_id", metavar="ARTIFACT_ID", help="the artifact's UUID")
    add_record_arguments(parser, positional=False, workdir=True)
    parser.add_argument("-o", "--output", metavar="FILE", default=None,
                        help="write the slice here (default: standard output)")
    parser.add_argument("--notebook", action="store_true",
                        help="write a notebook (.ipynb) instead of a Python script")
    parser.add_argument("--json", action="store_true",
                        help="print the slice (cells, inputs) as JSON")


def _slice_run(args: argparse.Namespace) -> int:
    from .._errors import FileProblem
    from ..browse import printable_json
    from ..lineage.slice import compute_slice

    with _opened(record_argument(args)) as (ledger, _):
        try:
            sliced = compute_slice(ledger, full_id(ledger, args.artifact_id, "artifact"))
        except FileProblem as exc:
            raise UsageError(exc.message) from None
    if args.json:
        text = printable_json(sliced.to_dict(), ascii_only=True) + "\n"
    elif args.notebook:
        text = json.dumps(sliced.to_notebook(), indent=1) + "\n"
    else:
        text = sliced.to_script()
    if args.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CommandFailed(f"cannot write {args.output}: {exc.strerror}") from None
        _console(f"wrote the slice of {args.artifact_id} to {args.output}: "
                 f"{len(sliced.cells)} of {sliced.session_cells} cells, "
                 f"{len(sliced.inputs)} inputs")
    return EXIT_OK


SLICE = Command(
    name="slice",
    help="write the smallest program (cells, %%run scripts, host.bash commands) that makes "
         "an artifact, as a script or notebook",
    add_arguments=_slice_arguments,
    run=_slice_run,
)


# ---------------------------------------------------------------------- rederive


def _rederive_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact_id", metavar="ARTIFACT_ID", help="the artifact's UUID")
    add_record_arguments(parser, positional=False, workdir=True)
    _options(parser)
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minimal", action="store_true",
                        help="also re-run once per input without it, and report the inputs "
                             "the artifact does not need (not_needed)")
    parser.add_argument("--tolerance", metavar="X", type=_tolerance, default=None,
                        help="tables (CSV, parquet) whose numbers agree within X (absolute or "
                             "relative) count as reproduced")
    parser.add_argument("--timeout", metavar="S", type=float, default=600.0,
                        help="most seconds one cell of the slice may run (default 600)")


def _tolerance(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a number, e.g. 1e-9") from None
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError("expected a finite number >= 0")
    return number


def _one(ledger: Any, blobs: Any, artifact_id: str, args: argparse.Namespace,
         progress: Callable[[str], None]) -> Any:
    from ..host._rederive import rederive

    return rederive(ledger, blobs, artifact_id, _start_host, minimal=args.minimal,
                    tolerance=args.tolerance, timeout=args.timeout, progress=progress,
                    hide=[blobs.root] if hasattr(blobs, "root") else [])


def _print(result: Any) -> None:
    from ..browse import printable

    print_line(printable(result.line()))
    comparison = result.comparison or {}
    if result.outcome == "differs" and comparison.get("diff"):
        print_line(printable(comparison["diff"], lines=True))


def _rederive_run(args: argparse.Namespace) -> int:
    from .._errors import FileProblem
    from ..browse import printable_json

    with _opened(record_argument(args)) as (ledger, blobs):
        try:
            artifact = full_id(ledger, args.artifact_id, "artifact")
            result = _one(ledger, blobs, artifact, args,
                          (lambda _l: None) if args.json else _console)
        except FileProblem as exc:
            raise UsageError(exc.message) from None
    if args.json:
        print_line(printable_json(result.to_dict(), ascii_only=True))
    else:
        _print(result)
    if result.outcome != "reproduced":
        raise CommandFailed(f"[{result.outcome}] artifact {args.artifact_id}")
    return EXIT_OK


REDERIVE = Command(
    name="rederive",
    help="run an artifact's slice in a fresh confined kernel on its recorded inputs and say "
         "whether it makes the same bytes",
    description=(
        "Compute the artifact's slice from the record, make a fresh workspace holding only "
        "the recorded bytes of its inputs (checked by sha256), run the slice there in a fresh "
        "confined kernel, and compare what it writes with the artifact: reproduced, differs "
        "(with a short diff and a hint), failed, or lineage_incomplete (the slice read a file "
        "the lineage does not name). Exit 0 only when reproduced."),
    add_arguments=_rederive_arguments,
    run=_rederive_run,
)


def rederive_all(record: Any, args: argparse.Namespace,
                 progress: Callable[[str], None] | None = None) -> list[Any]:
    """``audit --rederive``: every artifact of the record folder, in the order saved."""
    with _opened(record) as (ledger, blobs):
        ids = [r["artifact_id"] for r in ledger.query(
            "SELECT artifact_id FROM artifacts ORDER BY seq")]
        results = []
        for n, artifact_id in enumerate(ids, 1):
            if progress is not None:
                progress(f"re-deriving artifact {n}/{len(ids)}: {artifact_id}")
            results.append(_one(ledger, blobs, artifact_id, args, progress or (lambda _l: None)))
    return results


COMMANDS = [SLICE, REDERIVE]
