"""Code declarations: source_files, entry_points and architecture_summary.

Owns the checks of what an armed ``reusable_pipeline`` or ``codebase_change``
submission declares about its code: each source file is inside the
workspace, a regular file, not bytecode, and saved as an artifact; each entry
point is a source file that compiles (never run); the summary is a paragraph.
It hands the test evidence to evidence.py.
"""

from __future__ import annotations

from typing import Any

from ..modes import CODE_DECLARATIONS
from .checks import _Checks
from .evidence import _check_evidence
from .submission import MAX_ENTRIES, Submission, _norm


def _entries(value: Any, key: str) -> list[tuple[str, str | None]] | None:
    """Normalise source_files / entry_points to (path, declared sha256) pairs."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or len(value) > MAX_ENTRIES:
        return None
    out: list[tuple[str, str | None]] = []
    for item in value:
        if isinstance(item, str):
            out.append((item, None))
        elif isinstance(item, dict) and isinstance(item.get(key), str):
            sha = item.get("sha256")
            out.append((item[key], sha if isinstance(sha, str) else None))
        else:
            return None
    return out


def _check_declarations(sub: Submission, c: _Checks) -> None:
    view, files = c.view, c.files
    missing = [n for n in CODE_DECLARATIONS if getattr(sub, n) in (None, [], "", {})]
    if missing:
        c.fail("declarations_missing", f"missing {', '.join(missing)}: pass them as keyword "
                                       f"arguments of host.submit_output")
    sources = _entries(sub.source_files, "path") if sub.source_files is not None else []
    if sources is None:
        c.fail("source_outside", "source_files must be a list of workspace-relative paths or "
                                 "{'path': …, 'sha256': …} objects")
        sources = []
    source_paths: set[str] = set()
    for path, declared in sources:
        rel = _norm(path)
        if rel is None or not files.inside(rel):
            c.fail("source_outside", f"source file {path!r} is not a path inside the workspace")
            continue
        source_paths.add(rel)
        current = files.sha256(rel)
        refused = files.refused.get(rel)
        if refused is not None and refused.code == "symlink_refused":
            c.fail("source_outside", f"source file {refused.message}")
            continue
        if refused is not None:
            c.fail("source_not_regular_file", f"source file {refused.message}; declare the "
                                              f"files that hold the code")
            continue
        if current is None:
            c.fail("source_missing", f"source file {rel!r} does not exist")
            continue
        if declared is not None and declared != current:
            c.fail("source_hash_mismatch", f"{rel!r}: declared sha256 {declared[:12]}… is not "
                                           f"the file's current {current[:12]}…")
        if rel.endswith((".pyc", ".pyo")) or "__pycache__" in rel.split("/"):
            c.fail("source_bytecode", f"{rel!r} is compiled bytecode; declare the .py source "
                                      f"it comes from (bytecode is never reproduced)")
            continue
        if current not in view.artifact_shas:
            c.fail("source_not_saved", f"{rel!r}'s current bytes were never saved as an "
                                       f"artifact of this session; call "
                                       f"host.save_artifact({rel!r}) after its last change")
        else:
            c.sources[rel] = current
    entries = _entries(sub.entry_points, "path") if sub.entry_points is not None else []
    for path, _ in entries or []:
        rel = _norm(path)
        if rel is None or rel not in source_paths:
            c.fail("entry_point_not_source", f"entry point {path!r} is not one of the "
                                             f"declared source_files")
            continue
        if rel.endswith(".py"):
            data = files.source(rel)
            if data is None:
                continue  # already reported as source_missing
            try:
                compile(data, rel, "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                line = getattr(exc, "lineno", None)
                c.fail("entry_point_syntax", f"entry point {rel!r} does not compile"
                                             f"{f' (line {line})' if line else ''}: "
                                             f"{getattr(exc, 'msg', exc)}")
    if entries is None:
        c.fail("entry_point_not_source", "entry_points must be a list of paths")
    summary = sub.architecture_summary
    if summary is not None and (not isinstance(summary, str) or len(summary.split()) < 5):
        c.fail("architecture_summary", "architecture_summary must be a paragraph (at least a "
                                       "sentence) saying what each module owns")
    _check_evidence(sub, c, source_paths)
    for code in ("source_outside", "source_missing", "source_not_regular_file",
                 "source_hash_mismatch", "source_not_saved", "source_bytecode",
                 "entry_point_not_source", "entry_point_syntax", "architecture_summary",
                 "declarations_missing"):
        if c.passed(code):
            c.ok(code)
