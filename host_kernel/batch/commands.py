"""``host-kernel batch``: many notebooks and agent tasks, each a session, on a Dask cluster.

Owns the command's arguments (``--resume BATCH_DIR`` among them), its progress display (a
bar on a terminal; when not on one, whole lines only: one per update, never a bar or a
carriage return; JSON lines with ``--json``), the results table (a task not accepted
says why in one line, its cause) and the exit code (0 every task accepted, or ran when it
submits nothing; 1 one failed or the batch could not run; 2 usage; 130 Ctrl-C). The work is :func:`host_kernel.batch.run_batch`; Dask is imported only when
the command runs, so ``host-kernel --help`` works without it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..cli import (
    EXIT_FAILED,
    EXIT_OK,
    Command,
    CommandFailed,
    UsageError,
    add_store_arguments,
    read_notebook,
    store_options,
    writable_record,
)

if TYPE_CHECKING:
    from . import BatchResult, Task, TaskSummary

__all__ = ["BATCH", "COMMANDS"]


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", metavar="NOTEBOOK", nargs="*",
                        help="a notebook (*.ipynb), or a folder whose notebooks all run; each "
                             "is one task")
    parser.add_argument("--tasks", metavar="FILE", default=None,
                        help="a task file: JSON lines (or a JSON list) of {\"notebook\": PATH} "
                             "and {\"task\": TEXT} objects, with optional \"inputs\", "
                             "\"mode\", \"name\" (docs/scale.md)")
    parser.add_argument("--workers", metavar="N", type=int, default=None,
                        help="worker processes of the local Dask cluster (default 2)")
    parser.add_argument("--scheduler", metavar="ADDRESS", default=None,
                        help="run on the Dask cluster whose scheduler is at ADDRESS "
                             "(tcp://host:8786) instead of a local one")
    parser.add_argument("--connect-timeout", metavar="S", type=float, default=10.0,
                        help="seconds to wait for --scheduler to answer (default 10)")
    parser.add_argument("--workspaces", metavar="DIR", default=None,
                        help="where each task's workspace is made, DIR/NAME/attempt-N "
                             "(default: ./hk-batch-<time>); every worker must see it")
    parser.add_argument("--records", metavar="DIR", default=None,
                        help="record folders, DIR/NAME/attempt-N (default: each workspace's "
                             "own, under $XDG_STATE_HOME/host_kernel/records/); a task an "
                             "earlier batch's record there shows accepted is skipped")
    parser.add_argument("--resume", metavar="BATCH_DIR", default=None,
                        help="continue the batch whose workspaces folder is BATCH_DIR: its "
                             "own tasks, records and folders; tasks it had accepted are "
                             "skipped, the others run as their next attempt")
    add_store_arguments(parser)
    parser.add_argument("--mode", metavar="M", default=None,
                        help="arm a task mode for every task that names none")
    parser.add_argument("--retries", metavar="N", type=int, default=None,
                        help="times a task whose worker died is run again, each time as a "
                             "new session (default 2; the local cluster only)")
    parser.add_argument("--timeout", metavar="S", type=float, default=None,
                        help="seconds each cell may run before the Host interrupts it")
    parser.add_argument("--base-url", metavar="URL", default=None,
                        help="agent tasks: an OpenAI-compatible endpoint, up to /v1")
    parser.add_argument("--model", metavar="NAME", default=None,
                        help="agent tasks: the model to ask")
    key = parser.add_mutually_exclusive_group()
    key.add_argument("--api-key-env", metavar="VAR", default=None,
                     help="agent tasks: environment variable holding the API key (read on "
                          "each worker)")
    key.add_argument("--api-key-file", metavar="PATH", default=None,
                     help="agent tasks: a file holding the API key (read on each worker)")
    parser.add_argument("--max-steps", metavar="N", type=int, default=None,
                        help="agent tasks: most model turns per session (default 30)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON line per finished task, then one for the batch")


def _notebooks(value: str) -> list[Path]:
    path = Path(value)
    if path.is_dir():
        found = sorted(p for p in path.glob("*.ipynb") if p.is_file())
        if not found:
            raise UsageError(f"no notebooks (*.ipynb) in {path}")
        return found
    return [path]


def _resumed(args: argparse.Namespace) -> tuple[list[Task], str | None]:
    """``--resume BATCH_DIR``: the tasks and records folder that batch kept; the command's
    own tasks, workspaces and records are not given with it, and its ledger is given
    again (its password was never kept)."""
    from ._errors import TaskInvalid
    from ._tasks import kept_tasks

    if args.sources or args.tasks is not None or args.workspaces is not None \
            or args.mode is not None:
        raise UsageError("--resume runs the tasks, in the folders, that batch was given: give "
                         "no notebooks, --tasks, --workspaces or --mode with it")
    try:
        tasks, records, ledger = kept_tasks(args.resume)
    except TaskInvalid as exc:
        raise UsageError(f"--resume: {exc.message}") from None
    if args.records is not None and (records is None or os.path.realpath(args.records)
                                     != os.path.realpath(records)):
        where = records or "each workspace's own record folder"
        raise UsageError(f"--resume: that batch kept its records in {where}; give no other "
                         f"--records")
    if ledger is not None and args.ledger is None:
        raise UsageError(f"--resume: that batch wrote to the ledger {ledger}; give it again "
                         f"with --ledger (its password is not kept)")
    if args.ledger is not None:
        from ..store.pg import redact_url

        if ledger is None or redact_url(args.ledger) != ledger:
            raise UsageError(f"--resume: that batch wrote to "
                             f"{'the ledger ' + ledger if ledger else 'record folders'}, "
                             f"not to --ledger {redact_url(args.ledger)}")
    for task in tasks:
        if task.kind == "notebook":
            read_notebook(Path(task.source))
    return tasks, records


def _tasks(args: argparse.Namespace) -> list[Task]:
    from . import Task, TaskInvalid, load_tasks

    mode = None
    if args.mode is not None:
        from ..modes import UnknownModeError, normalise_mode_name

        try:
            mode = normalise_mode_name(args.mode)
        except UnknownModeError as exc:
            raise UsageError(str(exc)) from None
    tasks: list[Task] = []
    for source in args.sources:
        for path in _notebooks(source):
            read_notebook(path)  # no such file, not a notebook: usage errors, as for exec
            tasks.append(Task.notebook(path, mode=mode))
    if args.tasks is not None:
        try:
            listed = load_tasks(args.tasks)
        except TaskInvalid as exc:
            raise UsageError(f"--tasks: {exc.message}") from None
        for task in listed:
            if task.kind == "notebook":
                read_notebook(Path(task.source))
            tasks.append(task if task.mode is not None or mode is None else
                         Task(task.kind, task.source, task.inputs, mode, task.name))
    if not tasks:
        raise UsageError("give notebooks, folders of notebooks, or --tasks FILE")
    return tasks


def _llm(args: argparse.Namespace, tasks: list[Task]) -> Any:
    if not any(t.kind == "agent" for t in tasks):
        return None
    if args.base_url is None or args.model is None:
        raise UsageError("agent tasks need --base-url and --model")
    if args.api_key_env and args.scheduler is None and not os.environ.get(args.api_key_env):
        # The local workers inherit this environment; remote ones read their own.
        raise UsageError(f"--api-key-env {args.api_key_env}: that variable is not set")
    from ..llm import LLMConfig, LLMConfigError

    try:
        return LLMConfig(args.base_url, args.model, api_key_env=args.api_key_env,
                         api_key_file=args.api_key_file)
    except LLMConfigError as exc:
        raise UsageError(str(exc)) from None


def _records(value: str | None) -> Path | None:
    """``--records``: a folder (made when missing), never a file."""
    if value is None:
        return None
    from ..store.ledger import RecordRefused

    if Path(value).exists() and not Path(value).is_dir():
        raise RecordRefused(f"--records {value} is a file, not a folder of record folders",
                            code="record_missing")
    return writable_record(value)


def _checked_numbers(args: argparse.Namespace) -> None:
    if args.workers is not None and args.scheduler is not None:
        raise UsageError("--workers sizes the local cluster; with --scheduler the cluster's "
                         "own workers run the tasks")
    if args.retries is not None and args.scheduler is not None:
        raise UsageError("--retries sets the local cluster's reruns; with --scheduler the "
                         "cluster's own distributed.scheduler.allowed-failures decides")
    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be at least 1")
    if args.retries is not None and args.retries < 0:
        raise UsageError("--retries must be 0 or more")
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError("--timeout must be a positive number of seconds")
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError("--max-steps must be at least 1")
    if not args.connect_timeout > 0:
        raise UsageError("--connect-timeout must be a positive number of seconds")
    store_options(args)  # a --ledger that is no postgresql:// URL is a usage error


#: The detail of a task accepted as expected, left off its progress line.
_ROUTINE = re.compile(r"^(\d+ cells? ok, (\d+ submissions? accepted|no submission)|accepted "
                      r"after \d+ step\(s\))$")


def _why(s: TaskSummary) -> str:
    """One line: what happened and, for a task not accepted, why (its cause)."""
    from ..browse import printable

    if s.cause and s.cause not in s.detail:
        return printable(f"{s.detail}: {s.cause}" if s.detail else s.cause)
    return printable(s.detail or s.error or "")


def _line(done: int, total: int, s: TaskSummary) -> str:
    if s.skipped:
        return f"[{done}/{total}] {s.name} ({s.kind}): {_why(s)}"
    rerun = f", attempt {s.attempt}" if s.attempt > 1 else ""
    why = f": {_why(s)}" if not s.ok or not _ROUTINE.match(s.detail) else ""
    return f"[{done}/{total}] {s.name} ({s.kind}): {s.outcome}{rerun}, {s.seconds:.1f} s{why}"


class _Progress:
    """What is shown as tasks finish: a rich bar on a terminal; anywhere else one whole line
    per update (per task), written and flushed at once, nothing rewritten in place; one
    JSON line per task with ``--json``."""

    def __init__(self, total: int, as_json: bool, out: TextIO) -> None:
        self.total, self.as_json, self.out = total, as_json, out
        self.done = 0
        self.bar: Any = None
        if not as_json and out.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[failed]} failed"),
                                TimeElapsedColumn(), console=Console(file=out),
                                transient=True)
            self.task = self.bar.add_task("batch", total=total, failed=0)
            self.failed = 0
            self.bar.start()

    def __call__(self, summary: TaskSummary) -> None:
        self.done += 1
        if self.as_json:
            self.out.write(json.dumps({"type": "task", **summary.to_dict()}) + "\n")
            self.out.flush()
        elif self.bar is not None:
            self.failed += not summary.ok
            self.bar.console.print(_line(self.done, self.total, summary), markup=False,
                                   highlight=False)
            self.bar.update(self.task, advance=1, failed=self.failed)
        else:
            self.out.write(_line(self.done, self.total, summary) + "\n")
            self.out.flush()

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _table(result: BatchResult, out: TextIO) -> None:
    """The results, one row a task. On a terminal: short session ids, no record column
    (the summary line says where the records are); piped: every field whole, one line a
    row."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    terminal = out.isatty()
    headers = ["task", "kind", "outcome", "attempt", "seconds", "session", "artifacts",
               "detail"] + ([] if terminal else ["record"])
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header in headers:
        table.add_column(header, no_wrap=header != "detail" or not terminal)
    for s in result.summaries:
        session = s.session_id or "-"
        row = [s.name, s.kind, s.outcome, str(s.attempt), f"{s.seconds:.1f}",
               session[:8] if terminal else session, str(len(s.artifacts)),
               _why(s)] + ([] if terminal else [s.record or "-"])
        table.add_row(*(Text(x) for x in row))
    console = Console(file=out, highlight=False, markup=False, emoji=False,
                      width=None if terminal else 1000, soft_wrap=not terminal)
    with console.capture() as captured:
        console.print(table)
    out.write("\n".join(line.rstrip() for line in captured.get().splitlines()) + "\n")


def _summary_line(result: BatchResult, records: str | None) -> str:
    counts = result.counts()
    reruns = (f"; {_plural(result.reruns, 'rerun')} after a worker died"
              if result.reruns else "")
    skipped = (f"; {len(result.skipped)} skipped (done earlier)" if result.skipped else "")
    ran = f"{counts['ran']} ran (no submission), " if counts["ran"] else ""
    where = (f"ledger {result.ledger}" if result.ledger else
             f"records in {records}" if records else "each workspace's own record")
    return (f"=== {_plural(len(result.summaries), 'task')} on "
            f"{_plural(result.workers, 'worker')}: {counts['accepted']} accepted, "
            f"{ran}{counts['failed']} failed, {_plural(counts['error'], 'error')}{skipped}{reruns}; "
            f"{result.seconds:.1f} s ({result.sessions_per_minute:.1f} sessions/min)\n"
            f"workspaces: {result.workspaces}; {where}")


def _run(args: argparse.Namespace) -> int:
    import datetime as dt

    _checked_numbers(args)
    kept: str | None = None
    if args.resume is not None:
        tasks, kept = _resumed(args)
    else:
        tasks = _tasks(args)
    llm = _llm(args, tasks)
    records = _records(args.records if args.resume is None else kept)
    try:
        import distributed  # noqa: F401 - only whether it can be imported
    except ImportError:
        raise CommandFailed("host-kernel batch needs Dask, which is not installed: install "
                            "host-kernel with its scale extra, pip install 'host-kernel[scale]'") from None
    from . import BatchError, SchedulerUnreachable, run_batch

    workspaces = args.resume or args.workspaces or (
        f"hk-batch-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    out = sys.stdout
    progress = _Progress(len(tasks), args.json, out)
    try:
        result = run_batch(
            tasks, scheduler=args.scheduler, workers=args.workers or 2, **store_options(args),
            llm=llm, workspaces=workspaces, records=records,
            retries=2 if args.retries is None else args.retries, cell_timeout=args.timeout,
            max_steps=args.max_steps, connect_timeout=args.connect_timeout,
            on_result=progress, resume=args.resume is not None)
    except SchedulerUnreachable as exc:
        raise CommandFailed(exc.message) from None
    except BatchError as exc:  # a task, or a folder, the batch cannot use: found before it ran
        raise UsageError(exc.message) from None
    finally:
        progress.stop()
    if args.json:
        out.write(json.dumps({"type": "batch", **result.to_dict()}) + "\n")
    else:
        _table(result, out)
        out.write(_summary_line(result, None if records is None else str(records)) + "\n")
    out.flush()
    return EXIT_OK if result.ok else EXIT_FAILED


BATCH = Command(
    name="batch",
    help="run many notebooks and agent tasks, each a confined session, on a Dask cluster",
    description=(
        "Run each notebook (or each task of --tasks FILE) as a task of a Dask cluster: a "
        "local one of --workers processes, or the one whose scheduler is at --scheduler. "
        "Each task gets a fresh workspace (its inputs copied in) and a new session of a "
        "confined Host started warm from its worker's pool; a task whose worker died runs "
        "again, as a new session, up to --retries times, unless its record shows it "
        "accepted. A task an earlier batch's record (in --records, or in --resume "
        "BATCH_DIR) shows accepted is skipped. Progress as tasks finish (whole lines when "
        "not on a terminal, JSON lines with --json), then a results table giving each "
        "failure's cause. Exit 0 when every task was accepted (or, a notebook that submits "
        "nothing, ran: outcome `ran`), 1 when one was not (or the "
        "cluster could not be reached), 2 for usage errors."),
    add_arguments=_arguments,
    run=_run,
)

#: Loaded by :func:`host_kernel.cli.all_commands`.
COMMANDS: list[Command] = [BATCH]
