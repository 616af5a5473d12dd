"""What ``host-kernel ls`` and ``host-kernel show`` read from a record, and how they print it.

Owns listing a record's sessions, cells, receipts, artifacts and submission
verdicts; why a session went wrong, in one line (:func:`session_cause`: a failed
cell's refusal code and message, a refused verdict's first failed check, a Host that
died), which ``ls`` shows and ``host-kernel batch`` reports; finding any of their
ids by a unique prefix; and the two ways of
printing them: tables for a person (rich; plain text, no colour, when stdout is
not a terminal) and JSON with stable keys for a program (docs/cli.md lists
them). Every function here reads a ledger that
:func:`~host_kernel.store.verified.open_verified` handed back, the projection
rebuilt from checked events, so a value shown is one the events produce.

It does not find the record (:func:`host_kernel.cli.resolve_record` does), open
or check it, or write anything to it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from .store.ledger import Ledger

__all__ = ["ID_KINDS", "LIST_KINDS", "Cause", "Match", "UnknownId", "find_id", "item",
           "list_rows", "print_item", "print_json", "print_rows", "printable", "printable_json",
           "session_cause", "session_id"]

#: What ``ls`` lists, each with the key column its rows are named by.
LIST_KINDS = {"sessions": "session", "cells": "cell_id", "receipts": "receipt_id",
              "artifacts": "artifact_id", "verdicts": "submission_id"}

#: The kinds of id ``show`` finds: kind -> (projection table, id column, what ``ls`` calls it).
ID_KINDS = {
    "session": ("sessions", "session", "sessions"),
    "cell": ("cells", "cell_id", "cells"),
    "receipt": ("receipts", "receipt_id", "receipts"),
    "artifact": ("artifacts", "artifact_id", "artifacts"),
    "verdict": ("submissions", "submission_id", "verdicts"),
}

#: How many candidates an ambiguous prefix names before "and N more".
MAX_CANDIDATES = 20


class UnknownId(LookupError):
    """No id, or more than one, of the kinds asked for starts with the prefix given.

    ``candidates`` holds ``(kind, id)`` for an ambiguous prefix (all of them, in
    order); it is empty when nothing matched.
    """

    def __init__(self, message: str, candidates: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.candidates = tuple(candidates)

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class Match:
    """An id found in the record: its kind (``session``, ``cell``, ``receipt``,
    ``artifact`` or ``verdict``) and the whole id."""

    kind: str
    id: str


# --------------------------------------------------------------------------- finding ids


def find_id(ledger: Ledger, prefix: str, kinds: Sequence[str] = tuple(ID_KINDS)) -> Match:
    """The one id of ``kinds`` that is ``prefix`` or starts with it (case-sensitive).

    An id equal to ``prefix`` wins over longer ids that start with it. Raises
    :class:`UnknownId` when none matches, or when several do (listing them).
    """
    names = " or ".join(kinds) if len(kinds) <= 2 else \
        ", ".join(kinds[:-1]) + f" or {kinds[-1]}"
    if not prefix:
        raise UnknownId(f"an empty string names no {names} id")
    exact: list[Match] = []
    found: list[Match] = []
    for kind in kinds:
        table, column, _ = ID_KINDS[kind]
        for row in ledger.query(f"SELECT {column} FROM {table} WHERE substr({column}, 1, ?) = ? "
                                f"ORDER BY {column}", (len(prefix), prefix)):
            match = Match(kind, str(row[0]))
            found.append(match)
            if match.id == prefix:
                exact.append(match)
    if len(exact) == 1:
        return exact[0]
    if len(found) == 1:
        return found[0]
    if not found:
        raise UnknownId(f"no {names} id in the record starts with {prefix!r}")
    shown = "".join(f"\n  {m.kind} {m.id}" for m in found[:MAX_CANDIDATES])
    more = f"\n  and {len(found) - MAX_CANDIDATES} more" if len(found) > MAX_CANDIDATES else ""
    raise UnknownId(f"{prefix!r} is ambiguous: {len(found)} ids start with it:{shown}{more}",
                    [(m.kind, m.id) for m in found])


def session_id(ledger: Ledger, prefix: str) -> str:
    """The whole id of the one session whose id starts with ``prefix`` (UnknownId if none,
    or several)."""
    return find_id(ledger, prefix, ("session",)).id


# --------------------------------------------------------------------------- causes

#: The longest cause message kept (one line; the record has the whole text).
CAUSE_LENGTH = 300
#: How a HostKernelError reads in a cell's error output: ``[code] message``.
_CODED = re.compile(r"^\[([a-z][a-z0-9_]*)\] (.*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Cause:
    """Why a session went wrong, as the record says: ``code`` (a refusal code, a failed
    check's code, an exception's name, or a cell's status: ``timeout``, ``kernel_died``,
    ``interrupted``, ``host_died``) and its ``message``; ``cell_id`` the cell it happened
    in (None for a Host that died between cells); ``call`` the host call refused there,
    when the cell failed on a refusal. ``str()`` is the one line ``ls`` and ``batch``
    print: ``storage_error: the record's disk is full (…) (host.save_artifact)``."""

    code: str
    message: str
    cell_id: str | None = None
    call: str | None = None

    def __str__(self) -> str:
        text = f"{self.code}: {self.message}" + (f" (host.{self.call})" if self.call else "")
        return printable(text)


def _one_line(text: Any) -> str:
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    first = lines[0] if lines else ""
    return first if len(first) <= CAUSE_LENGTH else first[:CAUSE_LENGTH - 1] + "…"


def _cell_cause(ledger: Ledger, session: str, cell_id: str, status: str,
                outputs: str | None, seq_finished: int | None) -> Cause:
    if status == "error":
        errors = [o for o in json.loads(outputs or "[]")
                  if isinstance(o, dict) and o.get("output_type") == "error"]
        if not errors:
            return Cause("error", "the cell raised an error", cell_id)
        name, value = str(errors[-1].get("ename") or "Error"), str(errors[-1].get("evalue") or "")
        coded = _CODED.match(value.strip())
        if coded is None:
            return Cause(_one_line(name), _one_line(value) or "(no message)", cell_id)
        code, message = coded.group(1), coded.group(2)
        refused = ledger.query("SELECT call FROM refusals WHERE session = ? AND cell_id = ? "
                               "AND code = ? AND call IS NOT NULL ORDER BY seq DESC LIMIT 1",
                               (session, cell_id, code))
        return Cause(code, _one_line(message), cell_id,
                     str(refused[0][0]) if refused else None)
    body = _event_body(ledger, "SELECT body FROM events WHERE seq = ?", (seq_finished,)) \
        if seq_finished is not None else {}
    if status == "host_died":
        by = body.get("recovered_by")
        return Cause("host_died", "the session's Host died while the cell ran" + (
            f"; session {by} closed it" if isinstance(by, str) and by != "resume" else ""),
            cell_id)
    notice = _one_line(body.get("notice"))
    return Cause(status, notice or f"the cell ended {status}", cell_id)


def _verdict_cause(body_text: str, cell_id: str | None) -> Cause:
    body = json.loads(body_text or "{}")
    checks = ((body.get("verdict") or {}).get("checks") or []) if isinstance(body, dict) else []
    for check in checks:
        if isinstance(check, dict) and not check.get("ok") and not check.get("advisory"):
            return Cause(_one_line(check.get("code")) or "check_failed",
                         _one_line(check.get("message")) or "(no message)", cell_id)
    return Cause("submission_refused", "the submission was refused", cell_id)


def session_cause(ledger: Ledger, session: str, *, after_accepted: bool = True
                  ) -> Cause | None:
    """The first thing that went wrong in ``session``, read from the (verified) record:
    a cell that did not end ``ok`` (its error's refusal code and message, or its
    exception; its timeout, death or interruption notice), or a refused verdict (its
    first failed blocking check), whichever the record holds first; else a Host that
    died (``session_ended`` ``host_died``); None when nothing went wrong.

    ``after_accepted`` (the default, as ``ls`` shows it) looks only past the session's
    last accepted verdict: an agent's failed cells before its accepted completion are how
    it worked, not why it failed.
    """
    since = 0
    if after_accepted:
        since = int(ledger.query("SELECT coalesce(max(seq), 0) FROM submissions WHERE "
                                 "session = ? AND accepted", (session,))[0][0])
    cells = ledger.query("SELECT cell_id, status, outputs, seq_finished FROM cells WHERE "
                         "session = ? AND status NOT IN ('ok', 'running') AND seq_finished > ? "
                         "ORDER BY seq_finished LIMIT 1", (session, since))
    verdicts = ledger.query("SELECT cell_id, body, seq FROM submissions WHERE session = ? AND "
                            "NOT accepted AND seq > ? ORDER BY seq LIMIT 1", (session, since))
    if verdicts and (not cells or int(verdicts[0]["seq"]) < int(cells[0]["seq_finished"])):
        return _verdict_cause(verdicts[0]["body"], verdicts[0]["cell_id"])
    if cells:
        c = cells[0]
        return _cell_cause(ledger, session, str(c["cell_id"]), str(c["status"]), c["outputs"],
                           c["seq_finished"])
    died = ledger.query("SELECT body FROM events WHERE session = ? AND kind = 'session_ended' "
                        "AND seq > ? ORDER BY seq DESC LIMIT 1", (session, since))
    if died:
        body = json.loads(died[0][0] or "{}")
        if isinstance(body, dict) and body.get("reason") == "host_died":
            by = body.get("recovered_by")
            return Cause("host_died", "the session's Host died" + (
                f"; session {by} closed it" if isinstance(by, str) and by != "resume" else ""))
    return None


# --------------------------------------------------------------------------- rows


_SESSIONS = """
SELECT s.session, s.started, s.ended,
       json_extract(e.body, '$.reason') AS end_reason, s.front, s.mode, s.armed,
       json_extract(b.body, '$.confinement.status') AS confinement,
       json_extract(b.body, '$.confinement.network') AS network,
       (SELECT count(*) FROM generations g WHERE g.session = s.session) AS generations,
       (SELECT count(*) FROM cells c WHERE c.session = s.session) AS cells,
       (SELECT count(*) FROM cells c WHERE c.session = s.session
            AND c.status = 'running') AS running,
       (SELECT count(*) FROM receipts r WHERE r.session = s.session) AS receipts,
       (SELECT count(*) FROM artifacts a WHERE a.session = s.session) AS artifacts,
       (SELECT count(*) FROM submissions v WHERE v.session = s.session) AS submissions,
       (SELECT count(*) FROM submissions v WHERE v.session = s.session
            AND v.accepted) AS accepted
FROM sessions s
JOIN events b ON b.session = s.session AND b.kind = 'session_started'
LEFT JOIN events e ON e.seq = (SELECT max(seq) FROM events x WHERE x.session = s.session
                               AND x.kind = 'session_ended')
"""

_CELLS = """
SELECT c.cell_id, c.session, c.generation, c.status, c.started, c.ended,
       c.ended - c.started AS duration, c.execution_count,
       coalesce(json_extract(e.body, '$.silent'), 0) AS silent,
       (SELECT count(*) FROM receipts r WHERE r.cell_id = c.cell_id
            AND r.session = c.session) AS receipts,
       (SELECT count(*) FROM artifacts a WHERE a.cell_id = c.cell_id
            AND a.session = c.session) AS artifacts,
       c.code
FROM cells c JOIN events e ON e.seq = c.seq_started
"""

_RECEIPTS = """
SELECT receipt_id, session, cell_id, generation, command, exit_status, ended FROM receipts
"""

_ARTIFACTS = """
SELECT artifact_id, session, cell_id, generation, filename, size, sha256, media_type,
       source_path, ts AS saved FROM artifacts
"""

_VERDICTS = """
SELECT v.submission_id, v.session, v.cell_id, v.accepted, v.body, e.ts AS decided
FROM submissions v JOIN events e ON e.seq = v.seq
"""

_ORDER = {"sessions": "ORDER BY b.seq", "cells": "ORDER BY c.seq_started",
          "receipts": "ORDER BY seq", "artifacts": "ORDER BY seq", "verdicts": "ORDER BY v.seq"}
_SQL = {"sessions": _SESSIONS, "cells": _CELLS, "receipts": _RECEIPTS, "artifacts": _ARTIFACTS,
        "verdicts": _VERDICTS}
_SESSION_COLUMN = {"sessions": "s.session", "cells": "c.session", "receipts": "session",
                   "artifacts": "session", "verdicts": "v.session"}


def _first_line(code: str | None) -> str:
    for line in (code or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _row(kind: str, raw: Any) -> dict[str, Any]:
    row = dict(raw)
    if kind == "sessions":
        row["armed"] = bool(row["armed"])
        row["network"] = None if row["network"] is None else bool(row["network"])
    elif kind == "cells":
        row["silent"] = bool(row["silent"])
        row["first_line"] = _first_line(row.pop("code"))
    elif kind == "verdicts":
        body = json.loads(row.pop("body"))
        verdict = body.get("verdict") or {}
        checks = verdict.get("checks") or []
        row["accepted"] = bool(row["accepted"])
        decided = row.pop("decided")
        row.update({
            "mode": verdict.get("mode"), "armed": verdict.get("armed"),
            "failed": [c.get("code") for c in checks if not c.get("ok")
                       and not c.get("advisory")],
            "advice": [c.get("code") for c in checks if not c.get("ok") and c.get("advisory")],
            "decided": decided})
    return row


def list_rows(ledger: Ledger, kind: str, session: str | None = None,
              where: str = "", params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """The rows of one kind (a key of :data:`LIST_KINDS`), in record order; only those of
    ``session`` (a whole id) when given. Keys as docs/cli.md lists them."""
    clauses = [where] if where else []
    args = list(params)
    if session is not None:
        clauses.append(f"{_SESSION_COLUMN[kind]} = ?")
        args.append(session)
    sql = _SQL[kind] + (" WHERE " + " AND ".join(clauses) if clauses else "") + " " + _ORDER[kind]
    rows = [_row(kind, r) for r in ledger.query(sql, args)]
    if kind == "sessions":
        for row in rows:
            cause = session_cause(ledger, row["session"])
            row["cause"] = None if cause is None else str(cause)
    return rows


# --------------------------------------------------------------------------- one item


def _event_body(ledger: Ledger, sql: str, params: Sequence[Any]) -> dict[str, Any]:
    rows = ledger.query(sql, params)
    if not rows or rows[0][0] is None:
        return {}
    body = json.loads(rows[0][0])
    return body if isinstance(body, dict) else {}


def item(ledger: Ledger, match: Match) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """What ``show`` prints for ``match``: the item (its ``ls`` row and the details only
    ``show`` gives) and the related rows, by kind of row."""
    if match.kind == "session":
        return _session_item(ledger, match.id)
    if match.kind == "cell":
        return _cell_item(ledger, match.id)
    if match.kind == "receipt":
        [row] = list_rows(ledger, "receipts", where="receipt_id = ?", params=(match.id,))
        body = _event_body(ledger, "SELECT body FROM receipts WHERE receipt_id = ?", (match.id,))
        return {**row, "receipt": body}, {}
    if match.kind == "artifact":
        [row] = list_rows(ledger, "artifacts", where="artifact_id = ?", params=(match.id,))
        lineage = ledger.query("SELECT lineage FROM artifacts WHERE artifact_id = ?",
                               (match.id,))[0][0]
        loads = [dict(r) for r in ledger.query(
            "SELECT l.session, l.cell_id, l.path, e.ts FROM loads l JOIN events e "
            "ON e.seq = l.seq WHERE l.artifact_id = ? ORDER BY l.seq", (match.id,))]
        return {**row, "lineage": None if lineage is None else json.loads(lineage)}, \
            {"loads": loads}
    [row] = list_rows(ledger, "verdicts", where="v.submission_id = ?", params=(match.id,))
    body = _event_body(ledger, "SELECT body FROM submissions WHERE submission_id = ?",
                       (match.id,))
    verdict = body.get("verdict") or {}
    return {**row, "checks": verdict.get("checks") or [],
            "reproduction": verdict.get("reproduction") or [],
            "submission": body.get("submission") or {}}, {}


def _session_item(ledger: Ledger, sid: str
                  ) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    [row] = list_rows(ledger, "sessions", sid)
    started = _event_body(ledger, "SELECT body FROM events WHERE session = ? AND "
                                  "kind = 'session_started'", (sid,))
    meta = ledger.query("SELECT workdir, request, host_version FROM sessions WHERE session = ?",
                        (sid,))[0]
    details = {"workdir": meta["workdir"], "request": meta["request"],
               "host_version": meta["host_version"], "pid": started.get("pid"),
               "host": started.get("host"),
               "confinement_detail": started.get("confinement")}
    generations = [dict(r) for r in ledger.query(
        "SELECT generation, started, reason FROM generations WHERE session = ? "
        "ORDER BY generation", (sid,))]
    return {**row, **details}, {
        "generations": generations,
        "cells": list_rows(ledger, "cells", sid),
        "receipts": list_rows(ledger, "receipts", sid),
        "artifacts": list_rows(ledger, "artifacts", sid),
        "verdicts": list_rows(ledger, "verdicts", sid),
    }


def _cell_item(ledger: Ledger, cell_id: str
               ) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    [row] = list_rows(ledger, "cells", where="c.cell_id = ?", params=(cell_id,))
    stored = ledger.query("SELECT code, outputs, frontend_cell_id, seq_finished FROM cells "
                          "WHERE cell_id = ?", (cell_id,))[0]
    finished = _event_body(ledger, "SELECT body FROM events WHERE seq = ?",
                           (stored["seq_finished"],))
    outputs = json.loads(stored["outputs"] or "[]")
    sid = row["session"]
    on_cell = "cell_id = ? AND session = ?"
    return {**row, "code": stored["code"], "outputs": outputs,
            "notice": finished.get("notice"), "output_cut": finished.get("output_cut"),
            "frontend_cell_id": stored["frontend_cell_id"]}, {
        "receipts": list_rows(ledger, "receipts", where=on_cell, params=(cell_id, sid)),
        "artifacts": list_rows(ledger, "artifacts", where=on_cell, params=(cell_id, sid)),
        "writes": [dict(r) for r in ledger.query(
            f"SELECT path, op, sha256, size, ts FROM writes WHERE {on_cell} ORDER BY seq",
            (cell_id, sid))],
        "refusals": [dict(r) for r in ledger.query(
            f"SELECT call, code, reason FROM refusals WHERE {on_cell} ORDER BY seq",
            (cell_id, sid))],
        "verdicts": list_rows(ledger, "verdicts", where="v.cell_id = ? AND v.session = ?",
                              params=(cell_id, sid)),
    }


# --------------------------------------------------------------------------- printing


def print_json(value: Any, out: TextIO | None = None) -> None:
    stream = out or sys.stdout
    stream.write(printable_json(value) + "\n")
    stream.flush()


#: Which columns each kind's table shows, and their headers (JSON has every key).
_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "sessions": (("session", "session"), ("started", "started"), ("ended", "ended"),
                 ("mode", "mode"), ("confinement", "confinement"),
                 ("generations", "gens"), ("cells", "cells"), ("receipts", "receipts"),
                 ("artifacts", "artifacts"), ("submissions", "verdicts"), ("cause", "cause")),
    "cells": (("cell_id", "cell"), ("session", "session"), ("generation", "gen"),
              ("status", "status"), ("started", "started"), ("duration", "seconds"),
              ("receipts", "receipts"), ("artifacts", "artifacts"), ("first_line", "code")),
    "receipts": (("receipt_id", "receipt"), ("cell_id", "cell"), ("generation", "gen"),
                 ("exit_status", "exit"), ("ended", "ended"), ("command", "command")),
    "artifacts": (("artifact_id", "artifact"), ("cell_id", "cell"), ("filename", "filename"),
                  ("size", "bytes"), ("sha256", "sha256"), ("saved", "saved")),
    "verdicts": (("submission_id", "verdict"), ("cell_id", "cell"), ("accepted", "accepted"),
                 ("mode", "mode"), ("failed", "failed checks"), ("decided", "decided")),
    "generations": (("generation", "gen"), ("started", "started"), ("reason", "reason")),
    "writes": (("path", "path"), ("op", "op"), ("size", "bytes"), ("sha256", "sha256")),
    "refusals": (("call", "call"), ("code", "code"), ("reason", "reason")),
    "loads": (("session", "session"), ("cell_id", "cell"), ("path", "path"), ("ts", "loaded")),
}

_TIME_KEYS = frozenset({"started", "ended", "saved", "decided", "ts"})
_SHORT_KEYS = frozenset({"sha256"})
#: One line already, and bounded (:data:`CAUSE_LENGTH`): shown whole, never cut.
_WHOLE_KEYS = frozenset({"cause"})
_LONG = 60

# --------------------------------------------------------------------------- terminal text

#: Characters a record's text may hold that are never written raw to a terminal: C0
#: controls (ESC, CR, BEL, …), DEL, C1 controls (CSI …), and the marks that reorder or
#: break lines (bidirectional embeddings, overrides and isolates; line and paragraph
#: separators). Newline and tab are among them unless the text is shown as lines.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_UNPRINTABLE_IN_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
#: What JSON leaves raw of those (it escapes C0 itself).
_UNPRINTABLE_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return {9: "\\t", 10: "\\n", 13: "\\r"}.get(code) or (
        f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` as the CLI prints anything a record holds: every control character
    shown as its escape (``\\x1b``, ``\\r``, ``\\u202e``), nothing else changed, so a
    file name, command or output can move no cursor, ring no bell, rewrite no line and
    set no terminal title. With ``lines`` (text shown as several lines: code, output)
    newlines and tabs stay; otherwise they are escaped too, so a name stays one line."""
    return (_UNPRINTABLE_IN_LINES if lines else _UNPRINTABLE).sub(_escape, text)


def printable_json(value: Any, indent: int | None = 2, *, ascii_only: bool = False) -> str:
    """``value`` as JSON that is safe on a terminal, and still the same JSON: what
    :func:`printable` escapes is written as ``\\uXXXX`` (with ``ascii_only``, every
    character past ASCII too)."""
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    return _UNPRINTABLE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _safe(text: str) -> str:
    return printable(text, lines=True)


def _when(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return dt.datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")


def _cell_text(key: str, value: Any, row: dict[str, Any], *, full: bool = False) -> str:
    """How one value reads in a table (``full``: in show's list of fields, nothing cut)."""
    if key in _TIME_KEYS:
        if key == "ended" and "end_reason" in row:
            if value is None:
                return "open"
            return _when(value) + (f" ({row['end_reason']})" if row["end_reason"] else "")
        return _when(value)
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "duration" and isinstance(value, (int, float)):
        return f"{value:.3f}"
    if key == "confinement":
        return str(value) + (", no network" if row.get("network") is False else "")
    if key == "mode" and "armed" in row:
        return f"{value} (armed)" if row["armed"] else str(value)
    if key == "submissions" and "accepted" in row:
        return f"{value} ({row['accepted']} accepted)" if value else "0"
    if isinstance(value, list):
        return ", ".join(printable(str(v)) for v in value) or "-"
    text = printable(str(value), lines=full)
    if full:
        return text
    if key in _SHORT_KEYS:
        return text[:12] + "…"
    if key in _WHOLE_KEYS:
        return text
    return text if len(text) <= _LONG else text[:_LONG - 1] + "…"


class _Printer:
    """Renders with rich, then writes the text with each line's trailing blanks cut (rich
    pads every cell to its column's width), so piped output has no ragged tails."""

    def __init__(self, out: TextIO | None = None) -> None:
        from rich.console import Console

        self.out = out or sys.stdout
        terminal = self.out.isatty()
        # Piped, a table is as wide as it needs: a row stays one line for grep and cut.
        self.console = Console(file=self.out, highlight=False, markup=False, emoji=False,
                               width=None if terminal else 1000, soft_wrap=not terminal)
        self.parts: list[Any] = []

    def __call__(self, renderable: Any) -> None:
        self.parts.append(renderable)

    def flush(self) -> None:
        with self.console.capture() as captured:
            for part in self.parts:
                self.console.print(part)
        text = "\n".join(line.rstrip() for line in captured.get().splitlines())
        self.out.write(text + "\n")
        self.out.flush()


def _table(kind: str, rows: Sequence[dict[str, Any]], title: str | None = None) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False)
    for _, header in _COLUMNS[kind]:
        table.add_column(header, no_wrap=True)
    for row in rows:
        table.add_row(*(Text(_cell_text(key, row.get(key), row)) for key, _ in _COLUMNS[kind]))
    return table


def print_rows(kind: str, rows: Sequence[dict[str, Any]], record: str,
               session: str | None = None, out: TextIO | None = None) -> None:
    """``ls`` for a person: one table, or a line saying there is nothing to list."""
    printer = _Printer(out)
    where = f"session {session}" if session else "the record"
    if not rows:
        printer(f"no {kind} in {where} ({record})")
    else:
        printer(_table(kind, rows))
        printer(f"{len(rows)} {kind if len(rows) != 1 else kind[:-1]} in {where} ({record})")
    printer.flush()


def _pairs(item: dict[str, Any], keys: Sequence[str]) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False, show_edge=False)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key in keys:
        if key in item:
            table.add_row(Text(key), Text(_cell_text(key, item[key], item, full=True)))
    return table


_ITEM_KEYS = {
    "session": ("session", "started", "ended", "end_reason", "front", "mode", "confinement",
                "workdir", "request", "host_version", "host", "pid", "generations", "cells",
                "running", "receipts", "artifacts", "submissions", "cause"),
    "cell": ("cell_id", "session", "generation", "status", "started", "ended", "duration",
             "execution_count", "frontend_cell_id", "silent", "notice"),
    "receipt": ("receipt_id", "session", "cell_id", "generation", "command", "exit_status",
                "ended"),
    "artifact": ("artifact_id", "session", "cell_id", "generation", "filename", "size",
                 "sha256", "media_type", "source_path", "saved"),
    "verdict": ("submission_id", "session", "cell_id", "accepted", "mode", "armed", "failed",
                "advice", "decided"),
}

_RECEIPT_KEYS = ("cwd", "executable", "executable_sha256", "signal", "timed_out", "started",
                 "duration", "stdout_sha256", "stdout_size", "stderr_sha256", "stderr_size",
                 "changes_found_by")


def print_item(match: Match, found: dict[str, Any], related: dict[str, list[dict[str, Any]]],
               out: TextIO | None = None) -> None:
    """``show`` for a person: the item's fields, then what belongs to it."""
    from rich.text import Text

    printer = _Printer(out)
    printer(Text(f"{match.kind} {match.id}", style="bold"))
    if match.kind != "receipt":
        printer(_pairs(found, _ITEM_KEYS[match.kind]))
    if match.kind == "cell":
        printer(Text("code", style="bold"))
        printer(Text(_safe(found.get("code") or "")))
        from .host._render import render_outputs, strip_ansi

        text = strip_ansi(render_outputs(found.get("outputs") or []))
        if text.strip():
            printer(Text("outputs", style="bold"))
            printer(Text(_safe(text.rstrip("\n"))))
        if isinstance(found.get("output_cut"), dict):  # what the cell's budget left out
            from .host._render import cut_notice

            printer(Text(printable(cut_notice(found["output_cut"]))))
    elif match.kind == "receipt":
        receipt = found.get("receipt") or {}
        printer(_pairs({**receipt, **found}, _ITEM_KEYS["receipt"] + _RECEIPT_KEYS))
        changes = receipt.get("changes") or []
        if changes:
            printer(Text("changes", style="bold"))
            for change in changes:
                printer(Text(_safe(f"  {change.get('change')} {change.get('path')}")))
        from .host._render import strip_ansi

        for stream in ("stdout_tail", "stderr_tail"):
            if receipt.get(stream):  # colours dropped, as a cell's outputs' are: no raw \x1b[
                printer(Text(stream, style="bold"))
                printer(Text(_safe(strip_ansi(str(receipt[stream])).rstrip("\n"))))
    elif match.kind == "artifact":
        inputs = (found.get("lineage") or {}).get("inputs") or []
        if inputs:
            printer(Text("lineage inputs", style="bold"))
            for inp in inputs:
                source = inp.get("path") or inp.get("artifact_id") or inp.get("key")
                printer(Text(_safe(f"  {source}  {inp.get('method') or ''}")))
    elif match.kind == "verdict":
        printer(Text("checks", style="bold"))
        for check in found.get("checks") or []:
            mark = "ok" if check.get("ok") else ("advice" if check.get("advisory") else "FAIL")
            printer(Text(_safe(f"  {mark:6} {check.get('code')}: "
                                     f"{check.get('message') or ''}")))
    for kind, rows in related.items():
        if rows:
            printer(_table(kind, rows, title=f"{kind} ({len(rows)})"))
    printer.flush()
