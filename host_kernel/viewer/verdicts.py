"""What the viewer shows of a verdict: its checks, what they rest on, and what changed.

Owns the verdict page (failed checks first, each with its message kept whole;
passed checks by the rule they hold, :data:`~host_kernel.verify.checks.CHECKS`,
with the code small beside it), the links from a verdict to what it checked
(each declared source file to the artifact whose bytes the Host verified, each
test evidence entry to its cell, its receipt and the reproduction the Host ran,
each reproduction to the tree of files it ran on), the diff of the declared
files between a submission and the one before it in the same session (from the
bytes the blob store keeps for each, re-hashed when read), and the small card a
session page shows for each submission.

It reads a verified ledger and the record's blobs; it renders no HTML (the
templates do, autoescaped, and a diff is handed on as lines of text) and writes
nothing. Every value from the record is untrusted text.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from ..store.ledger import Ledger
from ..verify.checks import CHECKS, RETIRED
from .pages import (
    BlobSource,
    BlobUnavailable,
    NotFound,
    blob_bytes,
    cell_link,
    seconds,
    strip_ansi,
    yes_no,
)

__all__ = ["DIFF_BYTES", "rule", "verdict_card", "verdict_page"]

#: Files larger than this are not diffed (their sha256s are compared only).
DIFF_BYTES = 1 << 20
#: Diff lines shown at most per file.
DIFF_LINES = 2000


def rule(code: str) -> str:
    """The rule a check code holds, as docs/verification.md names it."""
    return CHECKS.get(code) or RETIRED.get(code) or code


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _checks(verdict: dict[str, Any]) -> list[dict[str, Any]]:
    checks = [c for c in _list(verdict.get("checks")) if isinstance(c, dict)]
    checks.sort(key=lambda c: (bool(c.get("ok")), bool(c.get("advisory"))))
    return [{"code": str(c.get("code")), "ok": bool(c.get("ok")),
             "advisory": bool(c.get("advisory")), "rule": rule(str(c.get("code"))),
             "message": strip_ansi(str(c.get("message", "")))} for c in checks]


def verdict_card(submission_id: str, accepted: bool, body: dict[str, Any]) -> dict[str, Any]:
    """A submission as the session page shows it under its cell: its badge, and each failed
    check with its whole message (pytest's output keeps its lines)."""
    checks = _checks(_dict(body.get("verdict")))
    return {"id": submission_id, "accepted": accepted, "call": "submit",
            "failed": [c for c in checks if not c["ok"]],
            "passed": sum(1 for c in checks if c["ok"])}


# --------------------------------------------------------------------------- what it rests on


def _declared_paths(submission: dict[str, Any]) -> list[str]:
    paths = []
    for entry in _list(submission.get("source_files")):
        path = entry.get("path") if isinstance(entry, dict) else entry
        if isinstance(path, str) and path not in paths:
            paths.append(path)
    return paths


def _artifact_for(ledger: Ledger, session: str, path: str, sha: str | None
                  ) -> dict[str, Any] | None:
    """This session's artifact whose bytes are ``sha``: saved from ``path`` if one was."""
    if not sha:
        return None
    rows = ledger.query("SELECT artifact_id, filename, source_path FROM artifacts WHERE "
                        "session = ? AND sha256 = ? ORDER BY (source_path = ?) DESC, seq DESC "
                        "LIMIT 1", (session, sha, path))
    if not rows:
        return None
    return {"id": rows[0]["artifact_id"], "filename": rows[0]["filename"],
            "source_path": rows[0]["source_path"]}


def _files(ledger: Ledger, session: str, submission: dict[str, Any],
           seen: dict[str, Any]) -> list[dict[str, Any]]:
    """Each declared source file: the sha256 the Host read and the artifact holding it."""
    out = []
    for path in _declared_paths(submission):
        sha = seen.get(path)
        sha = sha if isinstance(sha, str) and len(sha) == 64 else None
        out.append({"path": path, "sha256": sha, "short": (sha or "")[:12],
                    "artifact": _artifact_for(ledger, session, path, sha)})
    return out


def _evidence(ledger: Ledger, session: str, submission: dict[str, Any],
              sections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each test evidence entry: its command, the cell it names (linked when the session
    ran it), that cell's receipt for exactly that command, and the Host's reproduction."""
    out: list[dict[str, Any]] = []
    for entry in _list(submission.get("test_evidence")):
        if not isinstance(entry, dict):
            out.append({"command": json.dumps(entry, ensure_ascii=False)[:300], "cell": None,
                        "cell_link": None, "receipt": None, "reproduction": None})
            continue
        command = str(entry.get("command", ""))
        cell = entry.get("producing_cell_id")
        cell = cell if isinstance(cell, str) else None
        receipt: dict[str, Any] | None = None
        link: str | None = None
        if cell is not None and ledger.query("SELECT 1 FROM cells WHERE session = ? AND "
                                             "cell_id = ?", (session, cell)):
            link = cell_link(ledger, session, cell)
            rows = ledger.query("SELECT receipt_id, exit_status FROM receipts WHERE session = ? "
                                "AND cell_id = ? AND command = ? ORDER BY seq LIMIT 1",
                                (session, cell, command))
            if rows:
                receipt = {"id": rows[0]["receipt_id"], "exit_status": rows[0]["exit_status"]}
        reproduction = next((s["anchor"] for s in sections if s["command"] == command), None)
        out.append({"command": command, "cell": cell, "cell_link": link, "receipt": receipt,
                    "reproduction": reproduction})
    return out


def _reproduction(r: dict[str, Any], index: int) -> dict[str, Any]:
    invocation = _dict(r.get("invocation"))
    counts = _dict(r.get("counts"))
    shown = {"runner", "command", "outcome", "counts", "duration", "output_tail",
             "invocation", "failing", "failures", "tree_digest", "tree_files"}
    duration = r.get("duration")
    digest = r.get("tree_digest")
    return {
        "anchor": f"reproduction-{index + 1}", "command": str(r.get("command", "")),
        "runner": invocation.get("runner"), "outcome": r.get("outcome"),
        "passed": r.get("outcome") == "passed", "kind": r.get("kind"),
        "counts": [(k, v) for k, v in counts.items() if v],
        "duration": seconds(duration if isinstance(duration, (int, float)) else None),
        "failing": [str(t) for t in _list(r.get("failing"))],
        "failures": [strip_ansi(str(t)) for t in _list(r.get("failures"))],
        "output_tail": strip_ansi(str(r.get("output_tail") or "")),
        "tree_digest": digest if isinstance(digest, str) else None,
        "tree_files": r.get("tree_files") if isinstance(r.get("tree_files"), int) else None,
        "details": [(k, yes_no(v)) for k, v in sorted(r.items()) if k not in shown],
    }


# --------------------------------------------------------------------------- what changed


def _lines(data: bytes) -> list[str] | None:
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def _file_diff(blobs: BlobSource, path: str, old: str | None, new: str | None
               ) -> dict[str, Any]:
    """How one declared file differs between two submissions, from the kept bytes."""
    item: dict[str, Any] = {"path": path, "old": old, "new": new, "lines": [], "note": None}
    if old == new:
        item["change"] = "unchanged"
        return item
    item["change"] = "added" if old is None else ("removed" if new is None else "changed")
    texts: list[list[str]] = []
    for sha, which in ((old, "earlier"), (new, "later")):
        if sha is None:
            texts.append([])
            continue
        try:
            data = blob_bytes(blobs, sha, DIFF_BYTES)
        except BlobUnavailable as exc:
            item["note"] = (f"the bytes of the {which} version (sha256 {sha[:12]}…) are not "
                            f"kept in the record's blob store, so no diff can be shown: {exc}")
            return item
        if data is None:
            item["note"] = f"the {which} version is larger than {DIFF_BYTES >> 20} MiB: not diffed"
            return item
        lines = _lines(data)
        if lines is None:
            item["note"] = "not text (not UTF-8): only the sha256s differ"
            return item
        texts.append(lines)
    diff = list(difflib.unified_diff(texts[0], texts[1], f"a/{path}", f"b/{path}", n=3))
    for line in diff[:DIFF_LINES]:
        kind = ("head" if line.startswith(("---", "+++")) else "hunk" if line.startswith("@@")
                else "add" if line.startswith("+") else "del" if line.startswith("-")
                else "ctx")
        item["lines"].append((kind, line.rstrip("\n")))
    if len(diff) > DIFF_LINES:
        item["note"] = f"diff cut at {DIFF_LINES} lines of {len(diff)}"
    return item


def _changes(ledger: Ledger, blobs: BlobSource, session: str, seq: int,
             submission: dict[str, Any], seen: dict[str, Any]) -> dict[str, Any] | None:
    """The declared files' diff against the previous submission of the session, if any."""
    rows = ledger.query("SELECT submission_id, accepted, body FROM submissions WHERE "
                        "session = ? AND seq < ? ORDER BY seq DESC LIMIT 1", (session, seq))
    if not rows:
        return None
    body = _load(rows[0]["body"])
    before_sub = _dict(body.get("submission"))
    before_seen = _dict(body.get("seen"))

    def sha(seen_map: dict[str, Any], path: str) -> str | None:
        value = seen_map.get(path)
        return value if isinstance(value, str) and len(value) == 64 else None

    old_paths = _declared_paths(before_sub)
    new_paths = _declared_paths(submission)
    files = []
    for path in old_paths + [p for p in new_paths if p not in old_paths]:
        old = sha(before_seen, path) if path in old_paths else None
        new = sha(seen, path) if path in new_paths else None
        files.append(_file_diff(blobs, path, old, new))
    files.sort(key=lambda f: f["change"] == "unchanged")
    return {"id": rows[0]["submission_id"], "accepted": bool(rows[0]["accepted"]),
            "files": files, "changed": sum(1 for f in files if f["change"] != "unchanged")}


def _load(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return _dict(value)


# --------------------------------------------------------------------------- the page


def verdict_page(ledger: Ledger, blobs: BlobSource, submission_id: str) -> dict[str, Any]:
    """A submission's verdict: failed checks first (blocking, then advisory), then the passed
    ones by their rule; the reproduction of its test evidence with the tree it ran on; what
    was submitted, linked to what the Host verified; and what changed since the session's
    previous submission."""
    rows = ledger.query("SELECT * FROM submissions WHERE submission_id = ?", (submission_id,))
    if not rows:
        raise NotFound(f"no submission {submission_id!r} in this record")
    row = rows[0]
    session = row["session"]
    body = _load(row["body"])
    verdict = _dict(body.get("verdict"))
    submission = _dict(body.get("submission"))
    seen = _dict(body.get("seen"))
    checks = _checks(verdict)
    sections = [_reproduction(r, i) for i, r in
                enumerate(r for r in _list(verdict.get("reproduction")) if isinstance(r, dict))]
    files = _files(ledger, session, submission, seen)
    later = ledger.query("SELECT submission_id, accepted FROM submissions WHERE session = ? "
                         "AND seq > ? ORDER BY seq LIMIT 1", (session, row["seq"]))
    entry_points = [str(e) for e in _list(submission.get("entry_points"))]
    by_path = {f["path"]: f for f in files}
    return {
        "id": submission_id, "accepted": bool(row["accepted"]),
        "mode": verdict.get("mode"), "armed": bool(verdict.get("armed")),
        "session": session, "cell": row["cell_id"],
        "cell_link": cell_link(ledger, session, row["cell_id"]) if row["cell_id"] else None,
        "checks": checks,
        "failed": sum(1 for c in checks if not c["ok"] and not c["advisory"]),
        "reproduction": sections,
        "bullets": [str(b) for b in _list(submission.get("completion_bullets"))],
        "task_status": submission.get("task_status"),
        "output": json.dumps(submission.get("output"), indent=2, ensure_ascii=False),
        "source_files": files,
        "entry_points": [{"path": p, "file": by_path.get(p)} for p in entry_points],
        "architecture_summary": submission.get("architecture_summary")
        if isinstance(submission.get("architecture_summary"), str) else None,
        "test_evidence": _evidence(ledger, session, submission, sections),
        "declared": [(k, json.dumps(submission[k], indent=2, ensure_ascii=False))
                     for k in ("output_schema", "output_error", "intended_changes",
                               "regenerates", "rederive")
                     if submission.get(k) is not None],
        "changes": _changes(ledger, blobs, session, row["seq"], submission, seen),
        "later": {"id": later[0]["submission_id"], "accepted": bool(later[0]["accepted"])}
        if later else None,
    }
