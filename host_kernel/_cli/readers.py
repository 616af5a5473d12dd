"""The commands that read a record: ``audit``, ``ls``, ``show``, ``lineage`` and ``receipt``.

Owns their arguments, what they print and their exit codes. Each finds its
record with :func:`~.common.record_argument` (a record folder, a workspace,
or a PostgreSQL ledger with ``--ledger``); ``ls``, ``show``, ``lineage`` and
``receipt`` read it verified (a record that fails its checks is refused),
``audit`` re-checks it read-only. The reading is done by
:mod:`host_kernel.audit`, :mod:`host_kernel.browse` and
:mod:`host_kernel.lineage`; nothing here writes a record.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import (
    EXIT_OK,
    Command,
    CommandFailed,
    UsageError,
    add_record_arguments,
    check_ledger_url,
    print_line,
    record_argument,
    resolved_id,
)

__all__ = ["AUDIT", "LINEAGE", "LS", "RECEIPT", "SHOW"]


def _stderr(line: str) -> None:
    from ..browse import printable

    print(printable(line), file=sys.stderr, flush=True)


def _rederive_options(parser: argparse.ArgumentParser) -> None:
    from .derive import _options

    group = parser.add_argument_group("with --rederive")
    _options(group)  # type: ignore[arg-type]


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
    parser.add_argument("--rederive", action="store_true",
                        help="also re-derive every artifact from its slice in a fresh confined "
                             "kernel (docs/lineage.md) and fail unless each is reproduced")
    _rederive_options(parser)
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
    from ..audit import audit, audit_ledger, print_progress
    from ..browse import printable, printable_json

    progress = print_progress if not args.json else lambda *a: None
    if args.ledger is not None:
        if args.record is not None or args.record_option is not None:
            raise UsageError("give a record folder or --ledger URL, not both")
        if args.expect_head is not None or args.reproduce or args.rederive:
            raise UsageError("--expect-head, --reproduce and --rederive work on a record "
                             "folder, not with --ledger")
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
    rederived: list[Any] = []
    if args.rederive and not any(f.fatal for f in report.findings):
        from .derive import rederive_all

        rederived = rederive_all(record_argument(args), args, None if args.json else _stderr)
    if args.json:
        body = report.to_dict()
        if args.rederive:
            body["rederivations"] = [r.to_dict() for r in rederived]
        print_line(printable_json(body, ascii_only=True))
    elif report.sessions is not None:  # a ledger: its own findings, then each session's line
        for finding in report.findings:
            if finding.session is None:
                print_line(printable(str(finding), lines=True))
        for session in report.sessions:  # its first problem quotes the record too
            print_line(printable(session.line()))
        print_line(report.summary())
    else:
        for finding in report.findings:  # a finding quotes the record: paths, commands
            print_line(printable(str(finding), lines=True))
        for result in rederived:
            print_line(printable(result.line()))
        if report.head is not None:
            print_line(f"head: {report.head}")
        print_line(report.summary())
    fatal = [f for f in report.findings if f.fatal]
    if fatal and report.sessions is not None and fatal[0].session is not None:
        counts = report.counts()  # the first session that is not sound, and how many are not
        first, problem = next((s, s.problem) for s in report.sessions
                              if s.problem is not None)
        place = f" event {problem.session_seq} (seq {problem.seq})" \
            if problem.session_seq is not None and problem.seq is not None else ""
        raise CommandFailed(printable(
            f"[{problem.code}] session {first.session}{place}: {problem.message} "
            f"({counts['damaged']} sessions damaged, {counts['not_checked']} not checked, "
            f"{counts['sound']} sound)"))
    unproven = [r for r in rederived if r.outcome != "reproduced"]
    if not fatal and unproven:
        more = f" (and {len(unproven) - 1} more)" if len(unproven) > 1 else ""
        raise CommandFailed(printable(f"[{unproven[0].outcome}] artifact "
                                      f"{unproven[0].artifact_id}: {unproven[0].detail}{more}"))
    if fatal:  # the findings above say it all; stderr gets the one line every command gives
        more = f" (and {len(fatal) - 1} more failures)" if len(fatal) > 1 else ""
        raise CommandFailed(printable(f"[{fatal[0].code}] {fatal[0].where}: "
                                      f"{fatal[0].message}{more}"))
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
    parser.add_argument("artifact_id", metavar="ARTIFACT_ID",
                        help="the artifact's UUID, or a prefix no other artifact id starts "
                             "with")
    add_record_arguments(parser, positional=False, workdir=True)
    parser.add_argument("--format", choices=("text", "mermaid", "dot", "prov-json", "json",
                                             "in-toto"),
                        default="text", help="output format (default: text); in-toto is a "
                                             "Statement v1 with the direct inputs as materials")
    parser.add_argument("--depth", metavar="N", type=_depth, default=None,
                        help="derivation steps up from the artifact: 1 is its direct inputs, "
                             "'all' (the default) the whole chain through session-made files")


def _depth(value: str) -> int | None:
    if value == "all":
        return None
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a number of steps >= 1, or 'all'") from None
    if number < 1:
        raise argparse.ArgumentTypeError("expected a number of steps >= 1, or 'all'")
    return number


def _lineage_run(args: argparse.Namespace) -> int:
    from .._errors import FileProblem
    from ..browse import printable, printable_json
    from ..lineage.graph import record_lineage

    record = record_argument(args)
    artifact = resolved_id(record, args.artifact_id, "artifact")
    if args.format == "in-toto":
        from ..lineage.graph import record_artifact_statement

        try:
            statement = record_artifact_statement(record, artifact)
        except FileProblem as exc:
            raise UsageError(exc.message) from None
        print_line(printable_json(statement, ascii_only=True))
        return EXIT_OK
    try:
        graph = record_lineage(record, artifact).depth(args.depth)
    except FileProblem as exc:
        raise UsageError(exc.message) from None
    # Names, paths and commands in the graph come from the record: each is printed with
    # its control characters escaped (a name stays on its line), and so is the rest.
    renderers: dict[str, Callable[[], str]] = {
        "text": lambda: graph.to_text(escape=printable),
        "mermaid": lambda: printable(graph.to_mermaid(), lines=True),
        "dot": lambda: printable(graph.to_dot(), lines=True),
        "prov-json": lambda: printable_json(graph.to_prov(), ascii_only=True) + "\n",
        "json": lambda: printable_json(graph.to_dict(), ascii_only=True) + "\n"}
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
    parser.add_argument("receipt_id", metavar="RECEIPT_ID",
                        help="the receipt's UUID, or a prefix no other receipt id starts with")
    add_record_arguments(parser, positional=False, workdir=True)


def _receipt_run(args: argparse.Namespace) -> int:
    from .._errors import FileProblem
    from ..browse import printable_json
    from ..lineage.graph import record_receipt_statement

    record = record_argument(args)
    try:
        statement = record_receipt_statement(record, resolved_id(record, args.receipt_id,
                                                                 "receipt"))
    except FileProblem as exc:
        raise UsageError(exc.message) from None
    print_line(printable_json(statement, ascii_only=True))
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
    from .. import browse
    from ..store.ledger import collector_paused
    from ..store.verified import open_verified

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
        "generations, cells, receipts, artifacts, verdicts, and the cause of a session that "
        "went wrong, in one line: a failed cell's refusal code and message, a refused "
        "verdict's first failed check, a Host that died). --session ID lists that "
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
    from .. import browse
    from ..store.ledger import collector_paused
    from ..store.verified import open_verified

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
