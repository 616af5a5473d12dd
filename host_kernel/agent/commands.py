"""The agent's subcommands: ``host-kernel run``, ``host-kernel trace`` and ``host-kernel mcp``.

Owns their arguments, what they print and their exit codes (0 success, 1 the
work ran and did not succeed, 2 usage, 130 Ctrl-C, as for every command; errors
are raised as :class:`~host_kernel.cli.UsageError` or
:class:`~host_kernel.cli.CommandFailed` and printed by :func:`host_kernel.cli.main`).
The work is done by :func:`host_kernel.agent.loop.run_agent`, the event
projection (:mod:`host_kernel.agent.projection`) and :mod:`host_kernel.mcp_server`;
heavy imports wait until a command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..cli import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Command,
    CommandFailed,
    UsageError,
    add_store_arguments,
    store_options,
    writable_record,
)

__all__ = ["COMMANDS", "MCP", "RUN", "TRACE"]


def _err(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    sys.stderr.flush()


def _mode(value: str | None) -> str | None:
    if value is None:
        return None
    from ..modes import UnknownModeError, normalise_mode_name

    try:
        return normalise_mode_name(value)
    except UnknownModeError as exc:
        raise UsageError(str(exc)) from None


def _workdir(value: str | None) -> Path:
    path = Path(value) if value else Path.cwd()
    if not path.is_dir():
        raise UsageError(f"--workdir {path} is not a directory")
    return path


# ---------------------------------------------------------------------------- run


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task", metavar="TASK", nargs="?", default=None,
                        help="what the agent is asked to do (with --resume: an optional "
                             "follow-up)")
    parser.add_argument("--resume", metavar="SESSION", default=None,
                        help="continue this session of the record (its id, or a unique "
                             "prefix): conversation rebuilt from its events, a new kernel "
                             "generation, the system prompt reconciled with SYSTEM.md files")
    parser.add_argument("--mode", metavar="M", default=None,
                        help="arm a task mode (analysis_run, reusable_pipeline, codebase_change);"
                             " default: detected from TASK, advisory only")
    parser.add_argument("--workdir", metavar="DIR", default=None,
                        help="the workspace (default: the current directory)")
    parser.add_argument("--record", metavar="DIR", default=None,
                        help="the record folder (default: the workspace's record folder, "
                             "outside it, under $XDG_STATE_HOME/host_kernel/records/)")
    parser.add_argument("--base-url", metavar="URL", required=True,
                        help="an OpenAI-compatible endpoint, up to /v1 "
                             "(e.g. http://127.0.0.1:8000/v1)")
    parser.add_argument("--model", metavar="NAME", required=True, help="the model to ask")
    key = parser.add_mutually_exclusive_group()
    key.add_argument("--api-key-env", metavar="VAR", default=None,
                     help="environment variable holding the API key (default: send none)")
    key.add_argument("--api-key-file", metavar="PATH", default=None,
                     help="a file holding the API key, read at each call: the key is then "
                          "never in the Host's start-time environment (docs/security.md)")
    parser.add_argument("--max-steps", metavar="N", type=int, default=None,
                        help="most model turns (default: 30)")
    parser.add_argument("--token-budget", metavar="N", type=int, default=None,
                        help="context budget in tokens; history is compacted near it "
                             "(default: 100000)")
    parser.add_argument("--max-tokens", metavar="N", type=int, default=None,
                        help="most tokens per reply (default: the server's)")
    parser.add_argument("--temperature", metavar="T", type=float, default=None)
    parser.add_argument("--stream", action="store_true", help="stream replies (SSE)")
    parser.add_argument("--cell-timeout", metavar="S", type=float, default=None,
                        help="seconds a cell may run before the Host interrupts it")
    parser.add_argument("--price-in", metavar="USD", type=float, default=None,
                        help="USD per million prompt tokens, for a cost estimate")
    parser.add_argument("--price-out", metavar="USD", type=float, default=None,
                        help="USD per million completion tokens")
    parser.add_argument("--budget-usd", metavar="USD", type=float, default=None,
                        help="stop the run once the priced spend (provider-reported or from "
                             "--price-in/--price-out) passes this many dollars")
    parser.add_argument("--system-style", choices=("separate", "single"), default=None,
                        help="send the system blocks as separate leading system messages "
                             "(the default for a new session) or joined into one (for chat "
                             "templates that take one); a resume keeps the session's own")
    parser.add_argument("--max-subtasks", metavar="N", type=int, default=None,
                        help="sub-tasks (host.delegate) that may run at once (default: one "
                             "per CPU core, at most 4)")
    parser.add_argument("--subtask-depth", metavar="N", type=int, default=None,
                        help="levels of sub-tasks allowed below this session (default 1; "
                             "0 refuses host.delegate)")
    parser.add_argument("--subtask-timeout", metavar="S", type=float, default=None,
                        help="a sub-task's wall-clock limit in seconds (default 900)")
    parser.add_argument("--baseline", metavar="REV", default=None,
                        help="with --mode codebase_change: the git revision the change is "
                             "judged against (a commit you reviewed), read before the kernel "
                             "starts")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_store_arguments(parser)


def _run_run(args: argparse.Namespace) -> int:
    from ..llm import LLMClient, LLMConfig, LLMConfigError
    from .delegation import DelegationConfig
    from .events import progress_line
    from .loop import (
        DEFAULT_MAX_STEPS,
        DEFAULT_TOKEN_BUDGET,
        Outcome,
        Prices,
        run_agent,
    )

    workdir = _workdir(args.workdir)
    mode = _mode(args.mode)
    writable_record(args.record)
    if args.task is None and args.resume is None:
        raise UsageError("give a TASK, or --resume SESSION to continue one")
    if args.task is not None and not args.task.strip():
        raise UsageError("TASK is empty")
    if args.resume is not None and mode is not None:
        raise UsageError("--mode with --resume: a resumed session keeps its own mode")
    if args.baseline is not None and (mode != "codebase_change" or args.resume is not None):
        raise UsageError("--baseline names the revision a new codebase_change session is "
                         "judged against; give it with --mode codebase_change")
    if args.budget_usd is not None and not args.budget_usd >= 0:
        raise UsageError("--budget-usd must be a number of dollars, 0 or more")
    bounds: dict[str, Any] = {}
    if args.max_subtasks is not None:
        if args.max_subtasks < 1:
            raise UsageError("--max-subtasks must be at least 1")
        bounds["max_concurrent"] = args.max_subtasks
    if args.subtask_depth is not None:
        if args.subtask_depth < 0:
            raise UsageError("--subtask-depth must be 0 or more")
        bounds["max_depth"] = args.subtask_depth
    if args.subtask_timeout is not None:
        if not args.subtask_timeout > 0:
            raise UsageError("--subtask-timeout must be a positive number of seconds")
        bounds["timeout"] = args.subtask_timeout
    resume = None if args.resume is None else _session_of(args.resume, workdir, args.record)
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError("--max-steps must be at least 1")
    if args.token_budget is not None and args.token_budget < 1:
        raise UsageError("--token-budget must be positive")
    if args.api_key_env and not os.environ.get(args.api_key_env):
        raise UsageError(f"--api-key-env {args.api_key_env}: that variable is not set")
    if (args.price_in is None) != (args.price_out is None):
        raise UsageError("give both --price-in and --price-out, or neither")
    try:
        config = LLMConfig(args.base_url, args.model, api_key_env=args.api_key_env,
                           api_key_file=args.api_key_file)
    except LLMConfigError as exc:
        raise UsageError(str(exc)) from None
    prices = None if args.price_in is None else Prices(args.price_in, args.price_out)

    def progress(record: dict[str, Any]) -> None:
        line = progress_line(record)
        if line is not None and not args.quiet:
            _err(f"[host-kernel run] {line}")

    from .._errors import HostKernelError

    store = store_options(args)
    if args.baseline is not None:
        import inspect

        if "baseline" not in inspect.signature(run_agent).parameters:
            raise UsageError("--baseline: this agent loop cannot pass a baseline to its Host")
        store["baseline"] = args.baseline
    with LLMClient(config) as llm:
        try:
            result = run_agent(
                args.task, workdir=workdir, mode=mode, llm=llm,
                max_steps=args.max_steps or DEFAULT_MAX_STEPS, record_dir=args.record,
                token_budget=args.token_budget or DEFAULT_TOKEN_BUDGET, on_progress=progress,
                stream=args.stream, max_tokens=args.max_tokens, temperature=args.temperature,
                cell_timeout=args.cell_timeout, prices=prices, resume=resume,
                budget_usd=args.budget_usd, system_style=args.system_style,
                delegation=DelegationConfig(**bounds), **store)
        except HostKernelError as exc:
            what = "the session could not be resumed" if resume else "the Host could not start"
            raise CommandFailed(f"{what}: {exc}") from None
        except ValueError as exc:  # a SYSTEM.md that cannot be used, an accepted session
            raise UsageError(str(exc)) from None
    out = sys.stdout
    if result.verdict is not None:
        out.write(result.verdict.explain() + "\n")
    else:
        out.write("No submission was verified in this session.\n")
    tail = f" ({result.reason})" if result.reason else ""
    out.write(f"outcome: {result.outcome.value} after {result.steps} step(s){tail}\n"
              f"session: {result.session_id} (host-kernel run --resume {result.session_id} "
              f"continues it)\nrecord: {result.record_dir}\nevents: {result.events_path}\n")
    out.flush()
    if result.outcome is Outcome.INTERRUPTED:
        return EXIT_INTERRUPTED
    return EXIT_OK if result.accepted else EXIT_FAILED


def _session_of(value: str, workdir: Path, record: str | None) -> str:
    """The agent session a --resume names: a full id or a unique prefix, in the record."""
    from .._paths import default_record_dir
    from .events import EVENTS_FILE, sessions_in

    folder = Path(record) if record else default_record_dir(workdir)
    events = folder / EVENTS_FILE
    if not events.is_file():
        raise UsageError(f"--resume {value}: no agent session was run with this record "
                         f"({events} does not exist)")
    found = [s for s in sessions_in(events) if s.startswith(value)]
    if not found:
        raise UsageError(f"--resume {value}: no such session in {events}; "
                         f"`host-kernel trace --list` lists them")
    if len(found) > 1 and value not in found:
        raise UsageError(f"--resume {value} is ambiguous: {', '.join(found)}")
    return value if value in found else found[0]


RUN = Command(
    name="run",
    help="run the reference agent on a task against an OpenAI-compatible model server",
    description=(
        "Start a Host in WORKDIR and let a model work on TASK: its python cells run through "
        "the Host, and it finishes with the finalize_response tool (or host.submit_output), "
        "which the Host verifies against its record. Progress goes to stderr; the verdict "
        "and the record's location to stdout. --resume SESSION continues an earlier session "
        "of the same record in a new kernel generation. Exit 0 only when the session ends "
        "with an accepted completion; 1 otherwise (a step limit, a budget stop, an error); "
        "130 on Ctrl-C (the running cell is interrupted and recorded)."),
    add_arguments=_run_arguments,
    run=_run_run,
)


# ---------------------------------------------------------------------------- trace


def _trace_arguments(parser: argparse.ArgumentParser) -> None:
    what = "a record folder, a workspace whose record is found, or an agent-events.ndjson file"
    parser.add_argument("record", metavar="RECORD", nargs="?", default=None,
                        help=f"{what} (default: the current directory's record)")
    parser.add_argument("--record", metavar="DIR", dest="record_option", default=None,
                        help=f"{what}; the same as RECORD")
    parser.add_argument("--session", metavar="ID", default=None,
                        help="the session to show (default: the last one in the log)")
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    parser.add_argument("--list", action="store_true", help="list the sessions in the log")
    parser.add_argument("--at", metavar="N", type=int, default=None,
                        help="print the system prompt as it was at event N (its seq) of the "
                             "session: each block, in order, with the entry it came from")


def _events_file(value: str) -> Path:
    from .._paths import LEGACY_RECORD_NAME, default_record_dir
    from .events import EVENTS_FILE

    path = Path(value)
    if path.is_file():
        return path
    # A record folder, a workspace (its record at the default place), or an old
    # workspace holding its record inside.
    for folder in (path, default_record_dir(path), path / LEGACY_RECORD_NAME):
        if (folder / EVENTS_FILE).is_file():
            return folder / EVENTS_FILE
    from ..store.ledger import RecordRefused

    raise RecordRefused(f"no agent record at {value}: no {EVENTS_FILE} there, in its default "
                        f"record folder, or in {path / LEGACY_RECORD_NAME} (is it a record of "
                        f"`host-kernel run`?)", code="record_missing")


def _trace_run(args: argparse.Namespace) -> int:
    from .events import sessions_in
    from .projection import replay

    if args.record is not None and args.record_option is not None \
            and args.record != args.record_option:
        raise UsageError(f"two records given ({args.record} and --record "
                         f"{args.record_option}); give one")
    path = _events_file(args.record or args.record_option or str(Path.cwd()))
    sessions = sessions_in(path)
    if not sessions:
        from ..store.ledger import RecordRefused

        raise RecordRefused(f"{path}: no agent session in it (is it an agent-events.ndjson "
                            f"of `host-kernel run`?)", code="record_missing")
    if args.list:
        for sid in sessions:
            sys.stdout.write(sid + "\n")
        return EXIT_OK
    if args.session is not None and args.session not in sessions:
        raise UsageError(f"no session {args.session} in {path}; --list shows them")
    if args.at is not None:
        return _prompt_at(path, args.session or sessions[-1], args.at, args.json)
    snapshot = replay(path, args.session)
    if args.json:
        sys.stdout.write(json.dumps(snapshot.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(snapshot.render())
    return EXIT_OK


def _prompt_at(path: Path, session: str, at: int, as_json: bool) -> int:
    from .events import read_records
    from .sysprompt import entries_from_records

    if at < 1:
        raise UsageError("--at must be an event number (a seq), 1 or more")
    records = [r for r in read_records(path) if r is not None and r.get("session") == session]
    last = max((r["seq"] for r in records if isinstance(r.get("seq"), int)), default=0)
    if at > last:
        raise UsageError(f"--at {at}: session {session} has {last} events")
    # The same walk as sysprompt.effective, keeping where each block came from.
    blocks: list[dict[str, Any]] = []
    for entry in entries_from_records(records, session, upto=at):
        if entry.op == "replace":
            blocks.clear()
        blocks.append({"text": entry.text, "source": entry.source, "seq": entry.seq,
                       "op": entry.op})
    if as_json:
        sys.stdout.write(json.dumps({"session": session, "at": at, "blocks": blocks},
                                    indent=2, ensure_ascii=False) + "\n")
        return EXIT_OK
    if not blocks:
        sys.stdout.write(f"no system prompt yet at event {at} of session {session}\n")
        return EXIT_OK
    for i, block in enumerate(blocks, 1):
        sys.stdout.write(f"=== system block {i} of {len(blocks)} ({block['op']} at event "
                         f"{block['seq']}, from {block['source'] or '?'}) ===\n{block['text']}\n")
    return EXIT_OK


TRACE = Command(
    name="trace",
    help="show the projection of an agent session's event log (costs, tokens, cells, verdicts)",
    add_arguments=_trace_arguments,
    run=_trace_run,
)


# ---------------------------------------------------------------------------- mcp


def _mcp_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", metavar="DIR", default=None,
                        help="the workspace (default: the current directory)")
    parser.add_argument("--mode", metavar="M", default=None,
                        help="arm a task mode for the session's submissions")
    parser.add_argument("--record", metavar="DIR", default=None,
                        help="the record folder (default: the workspace's record folder, "
                             "outside it, under $XDG_STATE_HOME/host_kernel/records/)")
    add_store_arguments(parser)


def _mcp_run(args: argparse.Namespace) -> int:
    workdir = _workdir(args.workdir)
    mode = _mode(args.mode)
    writable_record(args.record)
    stores = store_options(args)
    from ..mcp_server import serve

    return serve(workdir, mode=mode, record_dir=args.record, **stores)


MCP = Command(
    name="mcp",
    help="serve a Host over MCP (stdio): cells, files, commands, artifacts, submissions",
    description=(
        "Start a Host in WORKDIR and serve it to an MCP client over stdin/stdout. Every tool "
        "runs as a cell, so the record attributes it. Only protocol messages go to stdout; "
        "the kernel's and the server's own output go to stderr."),
    add_arguments=_mcp_arguments,
    run=_mcp_run,
)

#: Loaded by :func:`host_kernel.cli.all_commands`.
COMMANDS: list[Command] = [RUN, TRACE, MCP]
