"""``host-kernel exec``: a notebook's code cells through one Host, printed as an agent sees them.

Owns the command's arguments, what it prints (each Observation under a
header line, a summary line, the chain head) and its exit code. Several
notebooks run one after another, each a session of its own, the later ones
started warm from a :class:`~host_kernel.HostPool`. The work is the Host's:
one ``Host.execute`` per non-empty code cell; it does not own the record,
the kernel or verification.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from .._paths import LEDGER_NAME
from .common import (
    EXIT_FAILED,
    EXIT_OK,
    PROG,
    CodeCell,
    Command,
    CommandFailed,
    UsageError,
    add_store_arguments,
    code_cells,
    plural,
    print_line,
    store_options,
    writable_record,
)

__all__ = ["EXEC", "FAILED_STATUSES"]

#: Observation statuses that count as a failed cell.
FAILED_STATUSES = frozenset({"error", "timeout", "kernel_died"})


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
    parser.add_argument("--baseline", metavar="REV", default=None,
                        help="with --mode codebase_change: the git revision the change is "
                             "judged against (a commit you reviewed), read before the kernel "
                             "starts; default: the Host's choice, refused when an earlier "
                             "session could have written it")
    parser.add_argument("--other-workspace", action="store_true",
                        help="let --record name a record whose sessions ran in another "
                             "workspace, and add this session of WORKDIR to it (refused "
                             "without this flag, naming the record's workspace)")
    add_store_arguments(parser)


def _exec_options(args: argparse.Namespace, notebook: Path
                  ) -> tuple[Path, list[CodeCell], Path | None, str | None]:
    from ..modes import UnknownModeError, normalise_mode_name

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
    if args.baseline is not None and mode != "codebase_change":
        raise UsageError("--baseline names the revision a codebase_change is judged against; "
                         "give it with --mode codebase_change")
    # Every notebook is read and checked before any runs: a bad one is a usage error at once.
    cells = code_cells(notebook)
    record = writable_record(args.record)
    if record is not None and args.ledger is None and not args.other_workspace:
        _same_workspace(record, workdir)
    _writable(workdir)
    return workdir, cells, record, mode


def _writable(workdir: Path) -> None:
    """CommandFailed (exit 1) unless a file can be made in ``workdir``: the kernel runs there
    and ``host.write_file`` writes there. Made and removed, not ``os.access``, which says
    yes to root on a read-only file system and no to a folder a Landlock rule allows."""
    import os
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=".host-kernel-write-check-", dir=workdir)
    except OSError as exc:
        raise CommandFailed(f"the workspace {workdir} is not writable "
                            f"({exc.strerror or exc}): the kernel runs there and "
                            f"host.write_file writes there; give a writable --workdir"
                            ) from None
    os.close(fd)
    os.unlink(probe)


def _same_workspace(record: Path, workdir: Path) -> None:
    """UsageError when the record folder ``record`` holds sessions that ran in another
    workspace than ``workdir`` (``--other-workspace`` allows it). A record that cannot be
    read is left to the Host, which refuses it with its own code."""
    import os

    from .._errors import RecordError
    from ..store.ledger import SQLiteLedger

    if not (record / LEDGER_NAME).is_file():
        return
    try:
        with SQLiteLedger.open_readonly(record / LEDGER_NAME) as ledger:
            rows = ledger.query("SELECT DISTINCT workdir FROM sessions WHERE workdir IS NOT "
                                "NULL ORDER BY workdir")
    except (RecordError, OSError, ValueError):
        return
    here = os.path.realpath(workdir)
    others = [str(r["workdir"]) for r in rows if str(r["workdir"]) != here]
    if others:
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        raise UsageError(f"--record {record} is the record of the workspace {others[0]}"
                         f"{more}, not of {here}; give --other-workspace to add a session "
                         f"of {here} to it, or leave --record out for this workspace's own "
                         f"record")


def _exec_run(args: argparse.Namespace) -> int:
    batch = [(Path(nb), *_exec_options(args, Path(nb))) for nb in args.notebook]
    if len(batch) == 1:
        return _exec_one(args, *batch[0])
    from ..host._pool import HostPool

    # Each notebook is a session of its own; all but the first start from a standby
    # kernel the pool started while the one before ran.
    failed = 0
    roots = sorted({str(workdir.resolve()) for _, workdir, *_ in batch})
    with HostPool(size=1, roots=roots) as pool:
        for n, (notebook, workdir, cells, record, mode) in enumerate(batch, start=1):
            print_line(f"### notebook {n}/{len(batch)}: {notebook}")
            try:
                code = _exec_one(args, notebook, workdir, cells, record, mode, pool=pool)
            except CommandFailed as exc:
                print_line(f"{PROG} exec: error: {exc}", sys.stderr)
                code = EXIT_FAILED
            if code != EXIT_OK:
                failed += 1
    print_line(f"### {plural(len(batch), 'notebook')} run, {failed} failed")
    return EXIT_FAILED if failed else EXIT_OK


def _exec_one(args: argparse.Namespace, notebook: Path, workdir: Path,
              cells: list[CodeCell], record: Path | None, mode: str | None,
              pool: Any = None) -> int:
    from .._errors import HostKernelError, RecordError
    from ..host._host import Host

    ran = 0
    failures: dict[str, int] = {}
    stopped_at: int | None = None
    host = Host(workdir, mode=mode, record_dir=record, front="cli",
                network=not args.no_network, require_confinement=args.require_confinement,
                pool=pool, notebook=str(notebook), **store_options(args),
                **({"baseline": args.baseline} if args.baseline is not None else {}))
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
    running: tuple[int, int] | None = None  # (cell number, position) of the cell running
    interrupted: tuple[int, int] | None = None
    try:
        for n, cell in enumerate(cells, start=1):
            index = cell.number
            running = (index, n)
            obs = host.execute(cell.source, timeout=args.timeout)
            running = None
            ran += 1
            print_line(f"--- cell {index} ({n}/{len(cells)} code): {obs.status}, "
                       f"generation {obs.generation}, {obs.duration:.3f} s, id {obs.cell_id}")
            print_line(obs.text)
            if obs.status in FAILED_STATUSES:
                failures[obs.status] = failures.get(obs.status, 0) + 1
                if args.stop_on_error:
                    stopped_at = index
                    break
    except KeyboardInterrupt:
        # Ctrl-C: the Host has recorded the running cell `interrupted`. Say which, and
        # where the record is, then main() says `interrupted` and exits 130.
        interrupted = running
        if interrupted is not None:
            _print_interrupted(host, *interrupted, len(cells))
        else:
            raise
    finally:
        # Also on Ctrl-C (the running cell is recorded `interrupted`) and on a closed stdout.
        host.close()
    errors = sum(failures.values())
    detail = ""
    if failures:
        detail = " (" + ", ".join(f"{k} {v}" for k, v in sorted(failures.items())) + ")"
    stopped = f", stopped at cell {stopped_at}" if stopped_at is not None else ""
    if interrupted is not None:
        stopped = f", interrupted at cell {interrupted[0]}"
    where = f"{host.record_dir}" if host.ledger_url is None else \
        f"session {host.session_id} in --ledger {_redact(host.ledger_url)}"
    print_line(f"=== {plural(ran, 'cell')} run, {plural(errors, 'error')}{detail}{stopped}, "
               f"{time.monotonic() - t0:.1f} s; record: {where}")
    head = _final_head(host)
    if head is not None:
        print_line(f"head: {head}")
    if interrupted is not None:
        raise KeyboardInterrupt
    return EXIT_FAILED if errors else EXIT_OK


def _print_interrupted(host: Any, index: int, n: int, total: int) -> None:
    """The header line and outputs of the cell Ctrl-C stopped, as the record holds them
    (the Host finished it ``interrupted`` before it re-raised the interruption)."""
    import json

    from ..browse import printable

    ledger = getattr(host, "ledger", None)
    rows = [] if ledger is None else ledger.query(
        "SELECT cell_id, status, generation, started, ended, outputs FROM cells WHERE "
        "session = ? ORDER BY seq_started DESC LIMIT 1", (host.session_id,))
    if not rows:
        print_line(f"--- cell {index} ({n}/{total} code): interrupted")
        return
    row = rows[0]
    took = f", {row['ended'] - row['started']:.3f} s" \
        if row["ended"] is not None and row["started"] is not None else ""
    print_line(f"--- cell {index} ({n}/{total} code): {row['status']}, generation "
               f"{row['generation']}{took}, id {row['cell_id']}")
    text = []
    for out in json.loads(row["outputs"] or "[]"):
        if not isinstance(out, dict):
            continue
        if out.get("output_type") == "stream":
            value = out.get("text", "")
            text.append("".join(value) if isinstance(value, list) else str(value))
        elif out.get("output_type") == "error":
            text.append(f"{out.get('ename', '')}: {out.get('evalue', '')}\n")
    print_line(printable("".join(text) or "(no output)", lines=True))


def _redact(url: str) -> str:
    from ..store.pg import redact_url

    return redact_url(url)


def _final_head(host: Any) -> str | None:
    """The chain head the Host left: its own ``head`` when it has one, else the last event
    its ledger wrote or checked, else the record's last event read back (which, with
    several Hosts on one record, may be another's)."""
    head = getattr(host, "head", None)
    if isinstance(head, str):
        return head
    from .._errors import RecordError
    from ..store.ledger import SQLiteLedger

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
