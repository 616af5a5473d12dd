"""The ledger's word on a task: what its session's checked events say, read back.

Owns :class:`Word` (one session as the verified reader rebuilds it: its cells' statuses,
its verdicts, artifacts and head, how it ended, and the first thing that went wrong),
reading it (:func:`read_word` for one session, :func:`words_in_folder` for every session
of a record folder), deciding a task's outcome from it (:func:`decide`), and finding a
task's earlier sessions (the attempts a dead worker left, the attempt folders and record
folders an earlier batch left) and whether one was accepted (:func:`accepted_earlier`).

Every value here comes from :func:`~host_kernel.store.verified.open_verified` (a record
folder) or :func:`~host_kernel.store.verified.open_verified_ledger` (the PostgreSQL
ledger): the chain, the MACs and the projection checked, the projection rebuilt from the
events alone. Never from a Host's memory, and never from a status file: a status file
only names a session, and the ledger says how it went (and that it ran in that task's
workspace). It runs nothing and writes nothing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ._status import _read_json, _signed
from ._summary import ArtifactBrief, TaskSummary, VerdictBrief

__all__ = ["DONE", "Earlier", "Word", "accepted_earlier", "attempt_record", "decide", "ledger_sessions",
           "one_line", "patiently", "read_word", "unavailable", "words_in_folder"]

T = TypeVar("T")

#: Cell statuses that fail a notebook (as ``host-kernel exec`` counts them). An
#: ``interrupted`` or ``host_died`` cell is the Host's failure, not the notebook's.
FAILED_STATUSES = frozenset({"error", "timeout", "kernel_died"})
#: Outcomes of a task that is done: not run again by a rerun, a resume or another worker.
DONE = frozenset({"accepted", "ran"})
#: Refusal codes of a record that is missing or empty: no session of it to read.
_NOTHING = frozenset({"record_missing", "ledger_empty"})


@dataclass(frozen=True, slots=True)
class Word:
    """One session as its checked events say. ``record`` is the record folder, or the
    ledger's URL without its password; ``cells`` each cell's status in order; ``ended``
    None while open, ``closed`` (its Host closed it) or ``host_died`` (a later Host did);
    ``cause`` the first thing that went wrong after its last accepted verdict
    (:func:`host_kernel.browse.session_cause`), as one line."""

    session: str
    record: str
    workdir: str | None
    record_dir: str | None
    confinement: str | None
    cells: tuple[str, ...]
    verdicts: tuple[VerdictBrief, ...]
    artifacts: tuple[ArtifactBrief, ...]
    head: str | None
    ended: str | None
    cause: str | None

    @property
    def failed_cell(self) -> int | None:
        """The position (0-based) of the first cell that failed, or None."""
        return next((i for i, s in enumerate(self.cells) if s in FAILED_STATUSES), None)


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it came from) says a store was unavailable (the store
    layer's ``store_unavailable``): trying again later may succeed."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if getattr(current, "code", None) == "store_unavailable":
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def patiently(read: Callable[[], T], patience: float | None) -> T:
    """``read()``, tried again with backoff while it fails because a store is unavailable,
    for up to ``patience`` seconds (None: the Host's default ``store_patience``); then its
    error is raised. Reading the ledger back is how a task's outcome is known: a server
    restarting as a task ends must not make its summary an error."""
    if patience is None:
        from ..store.retry import DEFAULT_PATIENCE

        patience = DEFAULT_PATIENCE
    start, delay = time.monotonic(), 0.25
    while True:
        try:
            return read()
        except Exception as exc:
            if not unavailable(exc) or time.monotonic() - start + delay > patience:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def one_line(exc: BaseException) -> str:
    """An exception as a cause: ``code: message`` for a host_kernel error (or any error
    carrying a ``code``), else ``TypeName: text``; one line."""
    code = getattr(exc, "code", None)
    message = getattr(exc, "message", None)
    text = (f"{code}: {message if isinstance(message, str) else exc}" if isinstance(code, str)
            else f"{type(exc).__name__}: {exc}")
    from ..browse import CAUSE_LENGTH, printable

    first = next((line.strip() for line in text.splitlines() if line.strip()), text)
    return printable(first if len(first) <= CAUSE_LENGTH else first[:CAUSE_LENGTH - 1] + "…")


def _body(trusted: Any, sql: str, params: Sequence[Any]) -> dict[str, Any]:
    rows = trusted.query(sql, params)
    body = json.loads(rows[0][0]) if rows and rows[0][0] is not None else {}
    return body if isinstance(body, dict) else {}


def _word(trusted: Any, session: str, record: str) -> Word | None:
    from ..browse import session_cause

    rows = trusted.query("SELECT workdir, ended FROM sessions WHERE session = ?", (session,))
    if not rows:
        return None
    started = _body(trusted, "SELECT body FROM events WHERE session = ? AND kind = "
                             "'session_started' ORDER BY seq LIMIT 1", (session,))
    ended: str | None = None
    if rows[0]["ended"] is not None:
        last = _body(trusted, "SELECT body FROM events WHERE session = ? AND kind = "
                              "'session_ended' ORDER BY seq DESC LIMIT 1", (session,))
        ended = "host_died" if last.get("reason") == "host_died" else "closed"
    verdicts = []
    for row in trusted.query("SELECT submission_id, accepted, body FROM submissions WHERE "
                             "session = ? ORDER BY seq", (session,)):
        checks = (json.loads(row["body"] or "{}").get("verdict") or {}).get("checks") or []
        verdicts.append(VerdictBrief(str(row["submission_id"]), bool(row["accepted"]), tuple(
            str(c.get("code")) for c in checks
            if isinstance(c, dict) and not c.get("ok") and not c.get("advisory"))))
    artifacts = tuple(ArtifactBrief(str(r["artifact_id"]), str(r["filename"]),
                                    str(r["sha256"]), int(r["size"]))
                      for r in trusted.query("SELECT artifact_id, filename, sha256, size FROM "
                                             "artifacts WHERE session = ? ORDER BY seq",
                                             (session,)))
    head = trusted.query("SELECT hash FROM events WHERE session = ? ORDER BY seq DESC LIMIT 1",
                         (session,))
    cause = session_cause(trusted, session)
    confinement = started.get("confinement")
    return Word(
        session=session, record=record, workdir=rows[0]["workdir"],
        record_dir=started.get("record_dir") if isinstance(started.get("record_dir"), str)
        else None,
        confinement=confinement.get("status") if isinstance(confinement, dict) else None,
        cells=tuple(str(r[0]) for r in trusted.query(
            "SELECT status FROM cells WHERE session = ? ORDER BY seq_started", (session,))),
        verdicts=tuple(verdicts), artifacts=artifacts, head=str(head[0][0]) if head else None,
        ended=ended, cause=None if cause is None else str(cause))


def read_word(session: str, *, folder: str | None = None, ledger: str | None = None,
              key: bytes | None = None, patience: float | None = None) -> Word | None:
    """``session`` as the verified reader rebuilds it, from the record folder ``folder`` or
    the PostgreSQL ledger at ``ledger`` (under ``key``); None when the record holds no
    such session (or nothing at all). A ledger that is unavailable is waited for, up to
    ``patience`` seconds (:func:`patiently`). Raises RecordRefused when the record fails
    its checks (a broken chain, a forged event, drift), and StoreUnavailable when the
    ledger stayed away."""
    return patiently(lambda: _read_word(session, folder, ledger, key), patience)


def _read_word(session: str, folder: str | None, ledger: str | None,
               key: bytes | None) -> Word | None:
    from ..store.base import RecordRefused
    from ..store.pgwire import redact_url
    from ..store.sqlite import collector_paused
    from ..store.verified import open_verified, open_verified_ledger

    with collector_paused():
        try:
            if ledger is not None:
                trusted = open_verified_ledger(ledger, session, key=key)
            elif folder is not None:
                trusted = open_verified(Path(folder))
            else:
                return None
        except RecordRefused as exc:
            if exc.code in _NOTHING:
                return None
            raise
        with trusted:
            return _word(trusted, session, redact_url(ledger) if ledger else str(folder))


def words_in_folder(folder: str | os.PathLike[str]) -> list[Word]:
    """Every session of the record folder ``folder``, verified (none when it holds no
    record). Raises RecordRefused when the record fails its checks."""
    from ..store.base import RecordRefused
    from ..store.sqlite import collector_paused
    from ..store.verified import open_verified

    with collector_paused():
        try:
            trusted = open_verified(Path(folder))
        except RecordRefused as exc:
            if exc.code in _NOTHING:
                return []
            raise
        with trusted:
            sessions = [str(r[0]) for r in trusted.query(
                "SELECT session FROM sessions ORDER BY started")]
            return [w for s in sessions if (w := _word(trusted, s, str(folder))) is not None]


def ledger_sessions(ledger: str, under: str, patience: float | None = None
                    ) -> dict[str, list[str]]:
    """The sessions of the PostgreSQL ledger at ``ledger`` whose record folder lies under
    ``under``, by record folder: where to look for a task's earlier attempts when its
    record folders hold no ledger of their own. Only a lead: each session found is read
    back verified before anything is concluded from it."""
    return patiently(lambda: _ledger_sessions(ledger, under), patience)


def _ledger_sessions(ledger: str, under: str) -> dict[str, list[str]]:
    from ..store.pg import PostgresLedger

    root = os.path.realpath(under).rstrip("/") + "/"
    found: dict[str, list[str]] = {}
    with PostgresLedger.open_readonly(ledger) as stored:
        if not stored.has_table("events"):
            return found
        for row in stored.query("SELECT session, body FROM events WHERE kind = "
                                "'session_started' ORDER BY seq"):
            try:
                where = json.loads(row[1]).get("record_dir")
            except (ValueError, AttributeError):
                continue
            if isinstance(where, str) and where.startswith(root):
                found.setdefault(where, []).append(str(row[0]))
    return found


def decide(kind: str, word: Word, *, ran: TaskSummary | None, failure: str | None,
           numbers: Sequence[int] | None) -> tuple[str, str, str | None]:
    """A task's ``(outcome, detail, cause)`` from its session's word.

    ``ran``: what the runner made of the attempt when it finished (None when it raised,
    ``failure`` saying why, or when the ledger alone is asked: both None). ``numbers``:
    the notebook's cell number of each code cell it runs, in order.

    A notebook is ``failed`` when a cell failed or a verdict was refused; else
    ``accepted`` when the session holds an accepted verdict (whatever happened to the
    worker afterwards); else ``ran`` (it submitted nothing) when its run finished or,
    asked from the ledger alone, when its Host closed it after every code cell ran
    ``ok``; else ``error``. An agent task is
    ``accepted`` when its session's last verdict is accepted and the loop did not end
    otherwise; else the loop's own outcome, or ``error`` when it never ended.
    """
    refused = [v for v in word.verdicts if not v.accepted]
    accepted = [v for v in word.verdicts if v.accepted]
    last_ok = bool(word.verdicts) and word.verdicts[-1].accepted
    after = f"; then the attempt failed: {failure}" if failure else ""
    if kind == "agent":
        if ran is not None and ran.outcome != "accepted":
            last = word.cause if word.verdicts and not last_ok else None
            return ran.outcome, ran.detail, last or ran.detail or word.cause
        if last_ok:
            return "accepted", (ran.detail if ran is not None else
                                f"accepted in session {word.session}{after}"), None
        if ran is not None:
            return "error", ran.detail, ("record_mismatch: the agent loop reported an "
                                         "accepted completion its session's record does "
                                         "not hold")
        return "error", "could not run", failure or word.cause or "the session never ended"
    failed = word.failed_cell
    if failed is not None:
        number = numbers[failed] if numbers is not None and failed < len(numbers) else failed + 1
        return "failed", f"cell {number}: {word.cells[failed]}", word.cause
    if refused:
        codes = ", ".join(dict.fromkeys(c for v in refused for c in v.refusals))
        return "failed", f"refused: {codes}", word.cause or f"submission_refused: {codes}"
    cells = len(word.cells)
    if accepted:
        detail = (f"{cells} cell{'s' * (cells != 1)} ok, {len(accepted)} "
                  f"submission{'s' * (len(accepted) != 1)} accepted")
        return "accepted", detail + after, None
    if ran is not None or (failure is None and word.ended == "closed" and numbers is not None
                           and cells == len(numbers) and all(s == "ok" for s in word.cells)):
        # Every code cell ran ok and nothing was submitted: no verdict to call accepted.
        return "ran", f"{cells} cell{'s' * (cells != 1)} ok, no submission" + after, None
    return "error", "could not run", failure or word.cause or (
        "the session never ended" if word.ended is None else
        "the session ended before every cell ran")


@dataclass(frozen=True, slots=True)
class Earlier:
    """A session an earlier attempt of a task left: its number, its workspace (None when
    found by its record folder alone) and where its record is."""

    attempt: int
    session: str
    workspace: str | None
    folder: str | None


def _number(name: str) -> int | None:
    tail = name.removeprefix("attempt-").removesuffix(".json")
    return int(tail) if name.startswith("attempt-") and tail.isdigit() else None


def attempt_record(name: str, workspace: Path) -> Path:
    """The record folder of the attempt whose workspace is ``workspace``, of the task
    ``name``, when the batch names no records folder: the workspace's default record
    folder (under ``$XDG_STATE_HOME/host_kernel/records/``), named after the task too,
    ``NAME-attempt-N-HASH``, not ``attempt-N-HASH`` as every task's would be."""
    from .._paths import default_record_dir

    default = default_record_dir(workspace)
    return default.with_name(f"{name}-{default.name}")


def _from_statuses(folder: Path, records: str | None, name: str, skip_batch: str | None,
                   secret: bytes) -> list[Earlier]:
    found: list[Earlier] = []
    for path in sorted(folder.glob("attempt-*.json")) if folder.is_dir() else []:
        n = _number(path.name)
        status = _read_json(path) or {}
        if n is None:
            continue
        if status.get("state") == "finished" and skip_batch is not None \
                and status.get("batch") == skip_batch and _signed(status, secret):
            continue  # its own batch reuses that summary as it is
        summary = status.get("summary")
        session = status.get("session") or (
            summary.get("session_id") if isinstance(summary, dict) else None)
        if not isinstance(session, str):
            continue
        workspace = folder / f"attempt-{n}"
        record = status.get("record")
        if not isinstance(record, str):
            record = str(Path(records) / name / f"attempt-{n}") if records else \
                str(attempt_record(name, workspace))
        found.append(Earlier(n, session, str(workspace), record))
    return found


def _from_records(records: str, name: str, pg: Mapping[str, list[str]] | None,
                  ) -> list[Earlier]:
    found: list[Earlier] = []
    folder = Path(records) / name
    for record in sorted(folder.glob("attempt-*")) if folder.is_dir() else []:
        n = _number(record.name)
        if n is None or not record.is_dir():
            continue
        where = os.path.realpath(record)
        for session in (pg or {}).get(where, []):
            found.append(Earlier(n, session, None, where))
        if pg is None:
            found.append(Earlier(n, "", None, where))  # every session of the folder
    return found


def accepted_earlier(task: Any, *, workspaces: str, records: str | None, ledger: str | None,
                     key: bytes | None, numbers: Sequence[int] | None,
                     skip_batch: str | None = None, secret: bytes = b"",
                     pg: Mapping[str, list[str]] | None = None, by_records: bool = False,
                     patience: float | None = None) -> tuple[Word, Earlier] | None:
    """The first earlier session of ``task`` that its record says was accepted, and the
    attempt it came from; None when there is none.

    Looked for in the status files of ``workspaces/<name>/`` (each names its attempt's
    session; the ledger must say the session ran in that attempt's workspace) and, with
    ``by_records``, in the record folders ``records/<name>/attempt-*`` (every session of
    each; on the PostgreSQL ledger, the sessions ``pg`` lists for each folder, as
    :func:`ledger_sessions` found them). ``skip_batch``: the finished attempts that batch
    signed are left out (it reuses their summaries). A session is accepted when
    :func:`decide` says so from its record alone. A record that fails its checks is
    passed over: its task runs again. A ledger that is unavailable is waited for up to
    ``patience`` seconds, then its StoreUnavailable raised.
    """
    from ..store.base import RecordRefused

    candidates = _from_statuses(Path(workspaces) / task.name, records, task.name,
                                skip_batch, secret)
    if by_records and records is not None:
        candidates += _from_records(records, task.name, pg if ledger is not None else None)
    seen: set[str] = set()
    for earlier in candidates:
        try:
            if earlier.session == "":
                words = words_in_folder(earlier.folder or "")
            else:
                word = read_word(earlier.session, folder=earlier.folder, ledger=ledger, key=key,
                                 patience=patience)
                words = [] if word is None else [word]
        except RecordRefused:
            continue
        for word in words:
            if word.session in seen:
                continue
            seen.add(word.session)
            if earlier.workspace is not None and word.workdir != os.path.realpath(
                    earlier.workspace):
                continue  # a status naming a session that ran elsewhere proves nothing
            outcome, _, _ = decide(task.kind, word, ran=None, failure=None, numbers=numbers)
            if outcome in DONE:
                return word, earlier
    return None


def summary_of(task: Any, word: Word, earlier: Earlier, detail: str, *,
               skipped: bool, abandoned: Iterable[str] = ()) -> TaskSummary:
    """The summary of a task found done in ``word`` (an earlier session of it):
    ``accepted``, or ``ran`` for a notebook that ran whole and submitted nothing (``{outcome}``
    in ``detail`` says which)."""
    outcome = "accepted" if any(v.accepted for v in word.verdicts) else "ran"
    detail = detail.replace("{outcome}", outcome)
    return TaskSummary(task.name, task.kind, outcome, earlier.attempt,
                       session_id=word.session, verdicts=word.verdicts,
                       artifacts=word.artifacts, record=word.record,
                       workspace=earlier.workspace, confinement=word.confinement,
                       detail=detail, head=word.head, skipped=skipped,
                       abandoned=tuple(a for a in abandoned if a != word.session))
