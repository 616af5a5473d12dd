"""Who a session is, and how it begins: start, take up (resume), close abandoned ones.

Owns the session's identity as the record tells it (its mode and request, which
a resumed session takes from its own ``session_started``), the
``session_started`` and ``session_resumed`` events, taking up a session whose
Host ended or died, closing the record's sessions whose Host died, and the
record's sessions lock that makes the last two exclusive between Hosts. It does
not start kernels (host/_generations.py) or run cells (host/_cells.py).

It records the notebook file the session runs (``HostOptions.notebook``: its path and
sha256), and the ``codebase_change`` baseline before any kernel of the
session starts, with whether it is trusted (host/_baseline.py judges that): a
revision the user named from outside (``Host(baseline=REV)``) is read then, or
the Host stops. Every session records the HEAD it started on (``git_head``), so
a later one can tell whether it moved.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _version
from .._errors import BadArguments, RecordError
from .._procs import pid_alive
from ..modes import TaskMode
from ..reproduce import record_baseline
from ..reproduce.tree import BaselineError, head_commit, read_revision
from ..store.ledger import check_chain, rebuild
from ..store.pg import PostgresLedger
from ._baseline import BaselineHistory
from ._record import SessionRecord

__all__ = ["SESSIONS_LOCK_WAIT", "Launch", "Session", "Survey"]

#: Seconds a Host waits for the record's sessions lock before it gives up.
SESSIONS_LOCK_WAIT = 30.0


@dataclass(frozen=True, slots=True)
class Launch:
    """What the session's start events say of how its kernels are launched."""

    front: str
    confinement: dict[str, Any] | None
    kernel_env: list[str]


@dataclass(frozen=True, slots=True)
class Survey:
    """What a session's start read of its workspace before any kernel of it started."""

    #: The ``baseline_recorded`` body (``codebase_change``), else None.
    baseline: dict[str, Any] | None
    #: ``session_started``'s ``notebook``, else None.
    notebook: dict[str, Any] | None
    #: The commit checked out (``git_head``), else None.
    head: str | None


class Session:
    """One session of a record: its mode and request, and the events that open it."""

    def __init__(self, record: SessionRecord, workdir: Path, mode: TaskMode,
                 request: str | None, baseline: str | None = None) -> None:
        self.record = record
        self.workdir = workdir
        self.mode = mode
        self.request = request
        #: The revision the user named as the codebase_change baseline (HostOptions.baseline).
        self.baseline = baseline

    @property
    def mode_body(self) -> dict[str, Any]:
        return {"name": self.mode.name, "armed": self.mode.armed,
                "signals": list(self.mode.signals)}

    def adopt_started(self, started: dict[str, Any]) -> None:
        """Take the mode and request a session was started with (a session taken up)."""
        mode = started.get("mode") or {}
        self.mode = TaskMode(str(mode.get("name")), bool(mode.get("armed")),
                             tuple(mode.get("signals", ())))
        self.request = started.get("request")

    # ------------------------------------------------------------------ beginning

    def survey(self) -> Survey:
        """What the session's start reads before any kernel of it starts: the workspace's
        baseline (``codebase_change``), notebook and HEAD, read while no code of the
        session runs. A PostgreSQL ledger's session is claimed first. (A session whose
        start reads nothing of the record is surveyed before the record opens: Host's
        ``_orders_first``.)"""
        ledger = self.record.opened[0]
        if isinstance(ledger, PostgresLedger):
            # Held while this Host lives: another Host then knows the session is not
            # abandoned (the server lets the lock go when this process dies).
            ledger.claim(self.record.session_id)
        # Before anything is recorded and any kernel starts: a revision the user named that
        # cannot be read stops the Host here.
        baseline = self._baseline()
        notebook = self._notebook()
        head = baseline.get("commit") if baseline is not None else head_commit(self.workdir)
        return Survey(baseline, notebook, head if isinstance(head, str) else None)

    def begin(self, launch: Launch, survey: Survey | None = None) -> None:
        """Record the session's start (and, for ``codebase_change``, its baseline), then
        close the record's abandoned sessions. ``survey``: :meth:`survey`, taken before
        the first kernel was handed its orders (taken now without it). The caller starts
        (or finishes starting) the first generation."""
        record = self.record
        if survey is None:
            survey = self.survey()
        baseline, notebook, head = survey.baseline, survey.notebook, survey.head
        record.append("session_started", {
            "workdir": str(self.workdir), "record_dir": str(record.record_dir),
            "mode": self.mode_body, "request": self.request,
            "host_version": _version.__version__, "front": launch.front, "pid": os.getpid(),
            "host": socket.gethostname(), "confinement": launch.confinement,
            "kernel_env": launch.kernel_env, **record.stores_named(),
            **({"git_head": head} if head is not None else {}),
            **({"notebook": notebook} if notebook is not None else {}),
        })
        if baseline is not None:
            # Before any cell runs: the bytes the change applies to, read before any kernel
            # of the session started and kept where the kernel cannot reach (the workspace,
            # .git included, is writable to it).
            record.append("baseline_recorded", baseline)
        self.close_abandoned(strict=False)

    def _notebook(self) -> dict[str, Any] | None:
        """``session_started``'s ``notebook``: the path of the notebook file the session runs
        (``HostOptions.notebook``; workspace-relative when it lies inside the workspace,
        else absolute) and the sha256 of its bytes now; None when it runs none."""
        given = self.record._options.notebook  # the options the record was opened with
        if given is None:
            return None
        path = Path(os.path.realpath(given))
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as exc:
            raise BadArguments(f"notebook {given}: cannot read it: "
                               f"{exc.strerror or exc}") from None
        try:
            shown = path.relative_to(self.workdir).as_posix()
        except ValueError:
            shown = str(path)
        return {"path": shown, "sha256": digest}

    def _baseline(self) -> dict[str, Any] | None:
        """The ``baseline_recorded`` body of an armed codebase_change session, with whether
        it is trusted and why (None for other modes)."""
        if not (self.mode.enforced and self.mode.name == "codebase_change"):
            if self.baseline is not None:
                raise BadArguments("baseline= names the revision a codebase_change is judged "
                                   "against; arm mode='codebase_change' with it")
            return None
        blobs = self.record.blobs
        if self.baseline is not None:
            try:
                named = read_revision(self.workdir, blobs, self.baseline)
            except BaselineError as exc:
                raise BaselineError(f"baseline {self.baseline!r}: {exc.message}",
                                    code=exc.code) from None
            return named | {"trusted": True, "chosen_by": "user", "revision": self.baseline}
        history = BaselineHistory(self.record.ledger, self.record.session_id, self.workdir)
        reused = history.first_files_baseline() if head_commit(self.workdir) is None else None
        if reused is not None:
            return reused
        body = record_baseline(self.workdir, blobs)
        if body.get("kind") == "unavailable":
            return body
        return body | history.judge(body)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the record's lock on session ownership (taking a session up, closing an
        abandoned one), so two Hosts never both decide a session is theirs to change."""
        record = self.record
        if record.lock_depth:
            record.lock_depth += 1
            try:
                yield
            finally:
                record.lock_depth -= 1
            return
        if record.is_postgres:
            # Sessions are held one by one (PostgresLedger.claim): no record-wide lock.
            yield
            return
        path = record.record_dir / "sessions.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise RecordError(f"cannot open the record's lock {path}: "
                              f"{exc.strerror or exc}") from None
        try:
            deadline = time.monotonic() + SESSIONS_LOCK_WAIT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RecordError(f"another Host has held the record's lock {path} "
                                          f"for {SESSIONS_LOCK_WAIT:g} s") from None
                    time.sleep(0.05)
            record.lock_depth = 1
            try:
                yield
            finally:
                record.lock_depth = 0
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ taking up

    def take_up(self, session: str, launch: Launch) -> int:
        """Continue ``session`` of this record; returns how many generations it ran.

        The chain must verify; the session must have been started from this workspace
        and must not be running (its Host process gone, or its session ended). A session
        whose Host died is first closed as the record closes any abandoned one (its
        running cells finished ``host_died``), then a ``session_resumed`` event reopens
        it, and the caller starts the next generation with reason ``resume``. Nothing
        earlier is rewritten: memory of the earlier generations is gone, and the record
        says so.
        """
        with self.lock():
            record = self.record
            ledger = record.ledger
            pg = ledger if isinstance(ledger, PostgresLedger) else None
            if pg is not None and not pg.try_claim(session):
                # Held first, then read: no other Host can close it between the two.
                raise RecordError(f"session {session} is still running (its Host is "
                                  f"connected to the ledger); it can be resumed once it ends",
                                  code="session_running")
            problems = check_chain(ledger, session)
            if problems:
                raise RecordError(f"cannot resume session {session}: the record's chain is "
                                  f"broken ({problems[0]}); `host-kernel audit "
                                  f"{record.record_dir}`")
            # On PostgreSQL the session's events are read replayed and checked (its MACs
            # too): any writer of the database could have changed the rows a plain query
            # returns.
            source: Any = rebuild(ledger, session) if pg is not None else ledger
            try:
                generations = self._take_up_from(session, source, pg is not None, launch)
            finally:
                if source is not ledger:
                    source.close()
            self.close_abandoned(strict=True)
        return generations

    def _take_up_from(self, session: str, source: Any, on_pg: bool, launch: Launch) -> int:
        record = self.record
        rows = source.query("SELECT seq, hash, kind, body FROM events WHERE session = ? "
                            "ORDER BY seq", (session,))
        if not rows or rows[0]["kind"] != "session_started":
            raise RecordError(f"no session {session} in the record {record.record_dir}",
                              code="unknown_session")
        started = json.loads(rows[0]["body"])
        if started.get("workdir") != str(self.workdir):
            raise RecordError(f"session {session} ran in {started.get('workdir')}, not in "
                              f"{self.workdir}; resume it from its own workspace",
                              code="unknown_session")
        last_start = started
        ended: str | None = None  # how the session last ended, None while it runs
        generation = 0
        for row in rows:
            if row["kind"] in ("session_started", "session_resumed"):
                last_start, ended = json.loads(row["body"]), None
            elif row["kind"] == "session_ended":
                ended = "host_died" if json.loads(row["body"]).get("reason") == "host_died" \
                    else "ended"
            elif row["kind"] == "generation_started":
                generation = max(generation, int(json.loads(row["body"])["generation"]))
        pid = last_start.get("pid")
        if not on_pg and ended is None and (last_start.get("host") != socket.gethostname()
                                            or not isinstance(pid, int) or pid_alive(pid)):
            raise RecordError(f"session {session} is still running (Host process {pid} on "
                              f"{last_start.get('host')}); it can be resumed once it ends",
                              code="session_running")
        record.appended = {r["seq"]: r["hash"] for r in rows}
        self.adopt_started(started)
        previous = ended or "host_died"
        if ended is None:
            for cell in source.query("SELECT cell_id FROM cells WHERE session = ? AND "
                                     "status = 'running'", (session,)):
                record.append("cell_finished", {
                    "cell_id": cell["cell_id"], "status": "host_died", "outputs": [],
                    "execution_count": None, "recovered_by": "resume"})
            record.append("session_ended", {"reason": "host_died", "recovered_by": "resume"})
        record.append("session_resumed", {
            "previous": previous, "host_version": _version.__version__, "front": launch.front,
            "pid": os.getpid(), "host": socket.gethostname(),
            "confinement": launch.confinement, "kernel_env": launch.kernel_env,
        })
        return generation

    # ------------------------------------------------------------------ housekeeping

    def close_abandoned(self, *, strict: bool) -> None:
        """Close, once, the sessions of this record whose Host died (housekeeping: when
        the record's lock cannot be had, it is left for the next Host unless ``strict``)."""
        try:
            with self.lock():
                self._close_abandoned_locked()
        except RecordError:
            if strict:
                raise

    def _close_abandoned_locked(self) -> None:
        """Sessions whose Host died (killed, crashed) are closed in the record, once.

        Their cells left running are finished as ``host_died``; nothing else is changed.
        A session whose Host process is still alive on this machine is left alone.
        """
        ledger = self.record.ledger
        me_session = self.record.session_id
        if isinstance(ledger, PostgresLedger):
            self._close_abandoned_pg(ledger)
            return
        me = socket.gethostname()
        latest: dict[str, dict[str, Any]] = {}  # the Host process that holds each session
        for row in ledger.query(
                "SELECT e.session, e.body FROM events e JOIN sessions s ON s.session = e.session "
                "WHERE e.kind IN ('session_started', 'session_resumed') AND s.ended IS NULL "
                "AND e.session != ? ORDER BY e.seq", (me_session,)):
            latest[row["session"]] = json.loads(row["body"])
        for session, body in latest.items():
            pid = body.get("pid")
            if body.get("host") != me or not isinstance(pid, int) or pid_alive(pid):
                continue
            for cell in ledger.query("SELECT cell_id FROM cells WHERE session = ? AND "
                                     "status = 'running'", (session,)):
                ledger.append(session, "cell_finished", {
                    "cell_id": cell["cell_id"], "status": "host_died", "outputs": [],
                    "execution_count": None, "recovered_by": me_session})
            ledger.append(session, "session_ended", {
                "reason": "host_died", "recovered_by": me_session})

    def _close_abandoned_pg(self, ledger: PostgresLedger) -> None:
        """The PostgreSQL ledger's sessions whose Host is gone (no connection holds their
        lock, on any machine) are closed as on SQLite, then let go."""
        me_session = self.record.session_id
        for row in ledger.query("SELECT session FROM sessions WHERE ended IS NULL AND "
                                "session != ? ORDER BY started", (me_session,)):
            session = row["session"]
            if not ledger.try_claim(session):
                continue  # its Host is alive (or another Host is closing it right now)
            try:
                # What to close is read from the session's checked events, never from the
                # stored tables (any writer of the database could have changed those).
                try:
                    trusted = rebuild(ledger, session)
                except RecordError:
                    continue  # a session that fails its checks is audit's to report
                with trusted:
                    ended = trusted.query("SELECT ended FROM sessions WHERE session = ?",
                                          (session,))
                    running = [r["cell_id"] for r in trusted.query(
                        "SELECT cell_id FROM cells WHERE session = ? AND status = 'running'",
                        (session,))]
                if not ended or ended[0]["ended"] is not None:
                    continue  # ended already (or no session_started): nothing to close
                for cell_id in running:
                    ledger.append(session, "cell_finished", {
                        "cell_id": cell_id, "status": "host_died", "outputs": [],
                        "execution_count": None, "recovered_by": me_session})
                ledger.append(session, "session_ended", {
                    "reason": "host_died", "recovered_by": me_session})
            finally:
                ledger.release(session)
