"""Whether a recorded session could have written a ``codebase_change`` baseline.

Owns :class:`BaselineHistory`: what the record says of the sessions before this
one in this workspace, and the judgement a new session's ``baseline_recorded``
carries. A baseline is trusted only when no recorded session could have written
it: the tree at the first session of this workspace (its git HEAD, read again
by id with every object checked, or its own snapshot of a plain folder), a git
HEAD that no session wrote anything under ``.git`` for, or a revision the user
named from outside (``Host(baseline=REV)``, decided in host/_session.py).
Anything else is ``trusted: false`` with the reasons, and the verifier refuses
it (``baseline_untrusted``).

It reads the ledger and stats files; it writes nothing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..reproduce.tree import SKIP_DIRS, changed_within, git_dirs, taken
from ..store.ledger import check_chain
from ..store.pg import PostgresLedger

__all__ = ["EARLY_SLACK", "LATE_WRITES", "BaselineHistory"]

#: Seconds after a session's ``session_ended`` during which its processes may still have
#: written (the Host records the end, then kills the kernel's whole sandbox at once).
LATE_WRITES = 2.0
#: Seconds before a session's start a change time may read and still be the session's:
#: file systems stamp with a coarse clock, up to a tick behind the wall clock (the kernel
#: itself starts well after ``session_started`` is recorded, so the window is not wider).
EARLY_SLACK = 0.01


@dataclass
class _Earlier:
    """One earlier session of the record whose workspace overlaps this one."""

    session: str
    workdir: str
    #: (start, end) wall-clock seconds of each stretch its Host held it (end None: open).
    windows: list[tuple[float, float | None]]
    starts: list[dict[str, Any]]
    baseline: dict[str, Any] | None = None


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


class BaselineHistory:
    """What the record says of the sessions before this one in this workspace: whether any
    could have written the baseline a new codebase_change session would take.

    Sessions whose workspace overlaps this one count (a parent folder's session could
    write here). What each wrote is read from its events (``file_written``, a receipt's
    changes and traced writes, a cell's traced writes and audit-hook hints); a cell or
    command that ran untraced, or a session that ran unconfined, could have written
    anything. And since the tracer does not see what a process writes after the last cell
    of its session, the change time of every entry under the repository's folders (or
    the workspace, for a plain folder) is held against each session's lifetime.
    """

    def __init__(self, ledger: Any, me: str, workdir: Path) -> None:
        self.ledger = ledger
        self.me = me
        self.workdir = workdir
        self._found: dict[bool, list[str]] = {}
        here = str(workdir)
        sessions: dict[str, _Earlier] = {}
        open_at: dict[str, float] = {}
        for row in ledger.query(
                "SELECT session, ts, kind, body FROM events WHERE session != ? AND kind IN "
                "('session_started', 'session_resumed', 'session_ended', 'baseline_recorded') "
                "ORDER BY seq", (me,)):
            body = json.loads(row["body"])
            name, ts = row["session"], float(row["ts"])
            if row["kind"] == "session_started":
                if not isinstance(body.get("workdir"), str) or \
                        not _overlaps(body["workdir"], here):
                    continue
                sessions[name] = _Earlier(name, body["workdir"], [], [body])
                open_at[name] = ts
                continue
            earlier = sessions.get(name)
            if earlier is None:
                continue
            if row["kind"] == "session_resumed":
                earlier.starts.append(body)
                open_at[name] = ts
            elif row["kind"] == "session_ended" and name in open_at:
                earlier.windows.append((open_at.pop(name) - EARLY_SLACK, ts + LATE_WRITES))
            elif row["kind"] == "baseline_recorded" and earlier.baseline is None:
                earlier.baseline = body
        for name, ts in open_at.items():  # still open: running, or its Host died
            sessions[name].windows.append((ts - EARLY_SLACK, None))
        #: In the order they started.
        self.sessions = list(sessions.values())

    def first(self) -> _Earlier | None:
        """The first session of this workspace, when no overlapping session came before."""
        if self.sessions and self.sessions[0].workdir == str(self.workdir):
            return self.sessions[0]
        return None

    def first_files_baseline(self) -> dict[str, Any] | None:
        """The first session's own baseline of a plain folder, for a later session to
        reuse when sessions since may have written the workspace."""
        first = self.first()
        body = None if first is None else first.baseline
        if first is None or body is None or body.get("kind") != "files" or \
                not isinstance(body.get("manifest_sha256"), str):
            return None
        if not self._problems(git=False):
            return None  # nothing written since: the workspace as it is now
        keep = ("kind", "manifest_sha256", "files", "bytes")
        return {k: body[k] for k in keep if k in body} | {
            "trusted": True, "chosen_by": "first_session", "first_session": first.session}

    def judge(self, body: dict[str, Any]) -> dict[str, Any]:
        """What to add to a freshly read baseline ``body``: trusted, and how it was chosen."""
        if not self.sessions:
            return {"trusted": True, "chosen_by": "first_session"}
        first = self.first()
        if body.get("kind") == "git" and first is not None:
            was = first.starts[0].get("git_head") or (first.baseline or {}).get("commit")
            if was == body.get("commit"):
                # Read again by its id, every object checked: the first session's tree.
                return {"trusted": True, "chosen_by": "first_session",
                        "first_session": first.session}
        problems = self._problems(git=body.get("kind") == "git")
        if not problems:
            return {"trusted": True, "chosen_by": "untouched"}
        return {"trusted": False, "untrusted": "; ".join(problems[:6])
                + (f" (and {len(problems) - 6} more)" if len(problems) > 6 else "")}

    # ------------------------------------------------------------------ evidence

    def _problems(self, *, git: bool) -> list[str]:
        """Why an earlier session could have written the baseline (empty: none could)."""
        if git not in self._found:
            self._found[git] = self._look(git)
        return self._found[git]

    def _look(self, git: bool) -> list[str]:
        problems: list[str] = []
        names = {e.session for e in self.sessions}
        for earlier in self.sessions:
            for start in earlier.starts:
                confinement = start.get("confinement")
                if not isinstance(confinement, dict) or confinement.get("status") != "landlock":
                    problems.append(f"session {earlier.session[:8]} ran unconfined, so it could "
                                    f"write anything")
                    break
        if isinstance(self.ledger, PostgresLedger):
            broken = [p for n in sorted(names) for p in check_chain(self.ledger, n)]
        else:
            broken = check_chain(self.ledger)
        if broken:
            problems.append(f"the record's chain does not verify ({broken[0]})")
        problems += self._written(names, git)
        if git:
            roots, skip = git_dirs(self.workdir), frozenset[str]()
        else:
            roots, skip = [self.workdir], SKIP_DIRS
        windows = [w for e in self.sessions for w in e.windows]
        changed, truncated = changed_within(roots, windows, skip=skip)
        if truncated:
            problems.append("there are too many files to check their change times")
        for path, ctime in changed[:3]:
            shown = os.path.relpath(path, self.workdir)
            problems.append(f"{shown} changed at {time.strftime('%H:%M:%S', time.localtime(ctime))}"
                            f" while an earlier session ran")
        return problems

    def _written(self, names: set[str], git: bool) -> list[str]:
        """What the earlier sessions' own events say they wrote into the baseline."""
        found: list[str] = []
        workdirs = {e.session: e.workdir for e in self.sessions}

        def ours(session: str, rel: Any) -> str | None:
            if not isinstance(rel, str):
                return None
            path = os.path.normpath(os.path.join(workdirs[session], rel))
            mine = os.path.relpath(path, self.workdir)
            if mine == ".." or mine.startswith("../"):
                return None
            if git:
                return mine if mine == ".git" or mine.startswith(".git/") else None
            return mine if taken(mine) else None

        def note(session: str, how: str, rel: Any) -> None:
            mine = ours(session, rel)
            if mine is not None and len(found) < 20:
                found.append(f"{how} of session {session[:8]} wrote {mine}")

        def traced(session: str, how: str, body: Any, untraced: str | None) -> None:
            if not isinstance(body, dict):
                if untraced is not None and len(found) < 20:
                    found.append(f"{untraced} of session {session[:8]} ran untraced")
                return
            if body.get("error") or body.get("dropped") or any(
                    k.endswith("_truncated") for k in body):
                found.append(f"the tracer's account of {how} of session {session[:8]} is "
                             f"incomplete")
            for key in ("writes", "removes", "between"):
                for rel in body.get(key) or ():
                    note(session, how, rel)
            for pair in body.get("renames") or ():
                for rel in pair if isinstance(pair, list) else ():
                    note(session, how, rel)

        for row in self.ledger.query(
                "SELECT session, kind, body FROM events WHERE kind IN ('file_written', "
                "'receipt_recorded', 'cell_finished') AND session != ? ORDER BY seq",
                (self.me,)):
            session = row["session"]
            if session not in names:
                continue
            body = json.loads(row["body"])
            if row["kind"] == "file_written":
                note(session, "host.write_file", body.get("path"))
            elif row["kind"] == "receipt_recorded":
                for change in body.get("changes") or ():
                    if isinstance(change, dict):
                        note(session, "a command", change.get("path"))
                if not git and body.get("changes_truncated"):
                    found.append(f"a command of session {session[:8]} changed more files "
                                 f"than its receipt lists")
                traced(session, "a command", body.get("traced"), "a command" if git else None)
            else:
                traced(session, "a cell", body.get("traced"), "a cell")
                access = body.get("access")
                if isinstance(access, dict):
                    for rel in [*(access.get("writes") or ()), *(access.get("removes") or ())]:
                        note(session, "a cell", rel)
        return found
