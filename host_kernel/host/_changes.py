"""Which workspace files a ``host.bash`` command changed, and what the Host knew of them
before it ran.

Owns the ``changes`` of a receipt and its workspace manifest, found one of three ways
(docs/receipts.md, "Changes"):

* ``traced``: the tracer saw every process of the command, and nothing was dropped.
  Only the paths the command opened for writing, renamed, linked or removed are
  looked at (a stat each, a hash for those that changed): nothing is walked or
  hashed before the command, so its cost does not grow with the workspace.
* ``traced_walk``: tracing was on but its account cannot be taken alone (a path the
  command wrote is a symlink now or is gone, a folder on its way is a symlink, an
  access was dropped, a process went untraced): the workspace is walked once after
  the command for every file whose change time is at or after its start.
* ``snapshot``: no tracing (``Host(trace=False)``, no confinement, or the tracer had
  already failed): the workspace is stat'ed before and after and compared.

Traced, ``created`` and ``modified`` rest on the command's *before-states*: the tracer's
supervisor recorded, at the command's first call that might change each path and while
its caller waited, whether the path existed and (a regular file up to
``trace.HASH_LIMIT``) the sha256 of its bytes. The manifest holds, for each changed
file, the sha256 of the bytes it had then; untraced, the bytes the Host's stat-keyed hash
cache (shared with lineage) held for it as it was when the command started.

A ``modified`` file whose earlier bytes the Host does not know and whose size did not
change (too large to hash, more than one name, no before-state, or another owner changed
it or a folder above it meanwhile) is listed in ``unproven``: its bytes may be what they
were. It decides nothing about trust; the verifier reads the manifest and ``unproven``
(neither a ``modified`` file with its earlier bytes nor an unproven one is work).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any

from ..sandbox.trace import FILE, MISSING, OTHER
from ._trace import GONE, MAYBE, MOVED_IN, RENAME, WROTE, Before, TracedAccess
from ._workspace import (
    SKIPPED_FOLDERS,
    FileStat,
    HashCache,
    Workspace,
    birth_ns,
    cached_sha256,
    changed_since,
    snapshot,
    stat_key,
)

__all__ = ["MAX_CHANGES", "Found", "WALK_LIMIT", "after_snapshot", "after_trace",
           "before_snapshot"]

#: At most this many changes are listed in one receipt.
MAX_CHANGES = 200
#: Files a ``snapshot`` takes before and after a command, at most.
SNAPSHOT_LIMIT = 20_000
#: Files a ``traced_walk`` looks at, at most.
WALK_LIMIT = 200_000
#: Files under a folder renamed into place that are listed one by one, at most.
FOLDER_LIMIT = 20_000


@dataclass
class Found:
    """What a command changed, and how that was found."""

    method: str
    changes: list[dict[str, Any]] = field(default_factory=list)
    truncated: bool = False
    #: path → sha256 of the bytes a changed file had when the command started, where known.
    manifest: dict[str, str] = field(default_factory=dict)
    #: Why the trace was not taken alone (``traced_walk``).
    reason: str | None = None
    #: Changes made meanwhile by other owners (cell code, another command), not listed.
    by_others: list[str] = field(default_factory=list)
    #: Listed ``modified`` files whose bytes may equal those they had before: their
    #: earlier bytes are unknown and their size did not change (or is unknown).
    unproven: list[str] = field(default_factory=list)
    #: Most entries listed (a walk gathers them all first, then sorts and cuts).
    limit: int = MAX_CHANGES


def _entry(rel: str, change: str, sha: str | None, size: int | None) -> dict[str, Any]:
    return {"path": rel, "change": change, "sha256": sha, "size": size}


Prior = tuple[FileStat, str, int]


def _known_before(cache: HashCache, rel: str, start_ns: int) -> Prior | None:
    """The cache's hash of ``rel`` if the Host took it before the command started: the
    bytes the file had when the Host last looked, the newest it knows from before."""
    hit = cache.get(rel)
    if hit is not None and hit[2] < start_ns:
        return hit
    return None


# ------------------------------------------------------------------ snapshot (untraced)


def before_snapshot(ws: Workspace) -> tuple[dict[str, FileStat], bool]:
    """Stat keys of the workspace before an untraced command (nothing hashed)."""
    return snapshot(ws.root, ws.record, SNAPSHOT_LIMIT)


def after_snapshot(ws: Workspace, before: dict[str, FileStat], truncated: bool,
                   cache: HashCache) -> Found:
    """Compare the workspace with ``before``; hash only the files whose stat key changed."""
    after, trunc_after = snapshot(ws.root, ws.record, SNAPSHOT_LIMIT)
    found = Found("snapshot", truncated=truncated or trunc_after)
    for rel in sorted(set(before) | set(after)):
        was, now = before.get(rel), after.get(rel)
        if was == now:
            continue
        if len(found.changes) >= MAX_CHANGES:
            found.truncated = True
            break
        if was is not None:
            hit = cache.get(rel)  # read before hashing the new bytes replaces it
            if hit is not None and hit[0] == was:
                found.manifest[rel] = hit[1]
        if now is None:
            found.changes.append(_entry(rel, "deleted", None, None))
        else:
            sha = cached_sha256(ws.root, rel, cache, now)
            found.changes.append(_entry(rel, "created" if was is None else "modified",
                                        sha, now[0]))
            if was is not None and rel not in found.manifest and was[0] == now[0]:
                # Touched, or rewritten to the same size: its earlier bytes are unknown.
                found.unproven.append(rel)
    return found


# ------------------------------------------------------------------ traced


class _Ambiguous(Exception):
    """The trace alone cannot say what changed; walk instead."""


def after_trace(ws: Workspace, seen: TracedAccess | None, cache: HashCache,
                start_ns: int, problem: str | None = None) -> Found:
    """The command's changes from what the tracer saw it do (``seen``; None when the
    tracer failed), or from a walk when that cannot be taken alone. ``start_ns`` is the
    change-time clock (:func:`~._trace.ctime_clock_ns`) read just before the command
    started: a file changed since has a change time at or after it."""
    if seen is not None and problem is None:
        if seen.error:
            problem = f"a process went untraced: {seen.error}"
        elif seen.dropped:
            problem = f"the tracer dropped {seen.dropped} accesses"
    if seen is None:
        problem = problem or "the tracer did not answer"
    if seen is not None and problem is None:
        try:
            return _from_trace(ws, seen, cache, start_ns)
        except _Ambiguous as exc:
            return _walk(ws, seen, cache, start_ns, str(exc), keep_all=False)
    return _walk(ws, seen, cache, start_ns, problem or "no trace", keep_all=True)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _candidates(ws: Workspace, seen: TracedAccess) -> dict[str, set[str]]:
    """The paths the command may have changed; a folder renamed into place stands for
    every file now under it (and the same name under where it came from)."""
    root = str(ws.root)
    out = {rel: set(how) for rel, how in seen.changed.items()}
    # A before-state is kept under the path as the call resolved it: one under a name the
    # command never used is a file it reached through a symlink, and may have changed by
    # that other name (written through a link later renamed away and replaced, say).
    for rel in seen.before:
        out.setdefault(rel, {MAYBE})
    origins = {dst: src for kind, src, dst in seen.moves if kind == RENAME}
    for rel, how in list(out.items()):
        st = _lstat(os.path.join(root, rel))
        if MOVED_IN not in how or st is None or not stat.S_ISDIR(st.st_mode):
            continue
        listed, cut = snapshot(ws.root / rel, ws.record, FOLDER_LIMIT)
        if cut:
            raise _Ambiguous(f"over {FOLDER_LIMIT} files in the folder renamed to {rel}")
        origin = origins.get(rel)
        for sub in listed:
            out.setdefault(f"{rel}/{sub}", set()).add(MOVED_IN)
            if origin is not None:
                out.setdefault(f"{origin}/{sub}", set()).add(GONE)
    return out


def _skipped(rel: str) -> bool:
    """Under ``.git`` or ``__pycache__``: never listed as a change (as a snapshot skips them)."""
    return any(part in SKIPPED_FOLDERS for part in rel.split("/")[:-1])


def _moved_on(ws: Workspace, rel: str, seen: TracedAccess,
              candidates: dict[str, set[str]]) -> bool:
    """Whether a written file that is gone now was moved to a name that holds a regular
    file, its only name, that nothing removed (a temporary file renamed into place, as
    ``sed -i``, Python's bytecode writer or git do). A symlink written through and then
    removed or renamed is never that: renaming moves the link itself, and a hard link
    made through it shares the target's inode with the target's own name."""
    for kind, src, dst in seen.moves:
        if src != rel or GONE in candidates.get(dst, ()):
            continue
        st = _lstat(os.path.join(str(ws.root), dst))
        if st is not None and stat.S_ISREG(st.st_mode) and (kind == RENAME
                                                            or st.st_nlink == 1):
            return True
    return False


#: What a path was when the command first touched it, when a before-state cannot say.
NEW, UNKNOWN = "new", "unknown"


def _origin(seen: TracedAccess | None, rel: str, others: set[str]) -> Before | str:
    """``rel``'s state when the command started: its own before-state, :data:`NEW` (it
    was not there: missing at the command's first call on it, or a folder above it was
    missing or a file when the command first changed that folder), or :data:`UNKNOWN`.

    The earliest before-state among ``rel`` and the folders above it decides: a path's
    state at the command's first call on it is its state at the start only if nothing
    moved a folder above it before that. A folder that existed and was moved or removed
    first leaves ``rel``'s state unknown (its files were not listed), and so does any
    change another owner was seen making to ``rel`` or a folder above it meanwhile.
    """
    parts = rel.split("/")
    chain = ["/".join(parts[:n]) for n in range(len(parts), 0, -1)]
    if seen is None or any(p in others for p in chain):
        return UNKNOWN
    first: tuple[str, Before] | None = None
    for path in chain:
        state = seen.before.get(path)
        if state is not None and (first is None or state.seq < first[1].seq):
            first = (path, state)
    if first is None:
        return UNKNOWN
    path, state = first
    if path != rel:
        return NEW if state.kind in (MISSING, FILE, OTHER) else UNKNOWN
    if state.kind == MISSING:
        return NEW
    return state if state.kind != "?" else UNKNOWN


def _before_sha(state: Before, rel: str, cache: HashCache) -> str | None:
    """The sha256 of the bytes ``state`` describes: the supervisor's, or the Host's cache
    when it holds exactly that file (same size, times and inode)."""
    if state.sha256 is not None:
        return state.sha256
    hit = cache.get(rel)
    if hit is not None and hit[0] == (state.size, state.mtime_ns, state.ctime_ns,
                                      state.inode):
        return hit[1]
    return None


def _judge(found: Found, rel: str, origin: Before | str, key: FileStat, sha: str,
           cache: HashCache, guess: bool) -> None:
    """List a present regular file that changed, by what it was before (``guess``: the
    label for an unknown origin)."""
    if isinstance(origin, str):
        if origin == NEW:
            _add(found, _entry(rel, "created", sha, key[0]))
        else:
            _add(found, _entry(rel, "modified" if guess else "created", sha, key[0]),
                 unproven=True)
        return
    if origin.kind != FILE:
        # A folder, symlink or other file was there: the regular file is new by this name.
        _add(found, _entry(rel, "created", sha, key[0]))
        return
    before = _before_sha(origin, rel, cache)
    _add(found, _entry(rel, "modified", sha, key[0]), before,
         unproven=before is None and origin.size == key[0])


def _unchanged(origin: Before | str, key: FileStat) -> bool:
    """The file is the one the before-state saw, untouched (its change time included)."""
    return isinstance(origin, Before) and origin.kind == FILE and (
        origin.size, origin.mtime_ns, origin.ctime_ns, origin.inode) == key


def _from_trace(ws: Workspace, seen: TracedAccess, cache: HashCache,
                start_ns: int) -> Found:
    root = str(ws.root)
    found = Found("traced")
    candidates = _candidates(ws, seen)
    others = set(seen.others)
    old = start_ns
    for rel in sorted(candidates):
        how = candidates[rel]
        path = os.path.join(root, rel)
        parent = os.path.dirname(path)
        if os.path.realpath(parent) != parent:
            raise _Ambiguous(f"a folder on the way to {rel} is a symlink")
        st = _lstat(path)
        if st is not None and stat.S_ISLNK(st.st_mode) and how & {WROTE, MAYBE}:
            raise _Ambiguous(f"{rel} is a symlink")
        if st is not None and stat.S_ISDIR(st.st_mode):
            continue  # a folder: what changed in it is listed by its files
        origin = _origin(seen, rel, others)
        if st is None or not stat.S_ISREG(st.st_mode):
            if how & {WROTE, MOVED_IN, MAYBE} and not _moved_on(ws, rel, seen, candidates):
                # Written, then gone: a temporary file, or a symlink written through and
                # removed. Only a walk tells the two apart.
                raise _Ambiguous(f"{rel} was written and is gone")
            if _skipped(rel) or any(c.startswith(rel + "/") for c in candidates):
                continue  # a folder, emptied and removed
            _gone(found, rel, origin, how, cache, start_ns, _lstat(parent), old)
            continue
        if _skipped(rel) or MOVED_IN not in how and st.st_ctime_ns < old:
            continue  # not changed since before the command started
        key = stat_key(st)
        prior = _known_before(cache, rel, start_ns)
        if _unchanged(origin, key) or prior is not None and prior[0] == key:
            continue
        sha = cached_sha256(ws.root, rel, cache, key)
        if sha is None:
            raise _Ambiguous(f"{rel} changed while it was hashed")
        _judge(found, rel, origin, key, sha, cache, _existed(path, how, prior, old))
    found.by_others = _by_others(ws, seen.others, set(candidates), old)
    return found


def _gone(found: Found, rel: str, origin: Before | str, how: set[str] | None,
          cache: HashCache, start_ns: int, folder: os.stat_result | None, old: int) -> None:
    """List a path that is no longer a regular file: ``deleted`` when a regular file was
    there when the command started."""
    if isinstance(origin, Before):
        if origin.kind == FILE:
            _add(found, _entry(rel, "deleted", None, None), _before_sha(origin, rel, cache))
        return
    if origin == NEW:
        return  # made by the command and removed: a temporary file
    prior = _known_before(cache, rel, start_ns)
    if prior is None and (how is not None and how & {WROTE, MOVED_IN, MAYBE}
                          or folder is not None and folder.st_ctime_ns < old):
        return  # moved on, or its folder's entries did not change: not removed
    _add(found, _entry(rel, "deleted", None, None), None if prior is None else prior[1])


def _existed(path: str, how: set[str] | None, prior: Prior | None,
             old: int) -> bool:
    """A guess, for the label of a file whose state before the command is unknown: the
    Host had hashed it; or its inode is older than the command and no rename brought it
    here; or its folder's entries did not change (nothing was created in it)."""
    if prior is not None:
        return True
    if how is not None and MOVED_IN not in how:
        born = birth_ns(path)
        if born is not None:
            return born < old
    folder = _lstat(os.path.dirname(path))
    return folder is not None and folder.st_ctime_ns < old


def _add(found: Found, entry: dict[str, Any], before: str | None = None, *,
         unproven: bool = False) -> None:
    if len(found.changes) >= found.limit:
        found.truncated = True
        return
    found.changes.append(entry)
    if before is not None and entry["change"] != "created":
        found.manifest[entry["path"]] = before
    if unproven:
        found.unproven.append(entry["path"])


def _by_others(ws: Workspace, others: list[str], mine: set[str], old: int) -> list[str]:
    out = []
    for rel in others:
        if rel in mine or _skipped(rel):
            continue
        st = _lstat(os.path.join(str(ws.root), rel))
        if st is None or st.st_ctime_ns >= old:
            out.append(rel)
    return out[:MAX_CHANGES]


def _walk(ws: Workspace, seen: TracedAccess | None, cache: HashCache, start_ns: int,
          reason: str, *, keep_all: bool) -> Found:
    """Every file whose change time is at or after the command's start, plus the
    deletions the tracer saw. With ``keep_all`` false, a file only another owner was
    seen writing is theirs; a file nobody was seen writing is the command's. A file with
    no before-state of its own or of a folder above it is unproven."""
    old = start_ns
    found = Found("traced_walk", reason=reason)
    changed, found.truncated = changed_since(ws.root, ws.record, old, WALK_LIMIT)
    mine: dict[str, set[str]] = {} if seen is None else seen.changed
    seen_others = set() if seen is None else set(seen.others)
    others = set() if keep_all else seen_others - set(mine)
    judged = Found("traced_walk", limit=2 * WALK_LIMIT)
    for rel in sorted(changed):
        key = changed[rel]
        if rel in others:
            found.by_others.append(rel)
            continue
        origin = _origin(seen, rel, seen_others)
        prior = _known_before(cache, rel, start_ns)
        if _unchanged(origin, key) or prior is not None and prior[0] == key:
            continue
        sha = cached_sha256(ws.root, rel, cache, key)
        if sha is None:
            _add(judged, _entry(rel, "modified", None, key[0]), unproven=True)
            continue
        _judge(judged, rel, origin, key, sha, cache,
               _existed(os.path.join(str(ws.root), rel), mine.get(rel), prior, old))
    listed = {c["path"] for c in judged.changes}
    for rel in sorted(mine):
        if rel in listed or _skipped(rel):
            continue
        st = _lstat(os.path.join(str(ws.root), rel))
        if st is not None and stat.S_ISREG(st.st_mode) or st is not None and stat.S_ISDIR(
                st.st_mode) or any(c.startswith(rel + "/") for c in mine):
            continue  # a file the walk judged, or a folder
        _gone(judged, rel, _origin(seen, rel, seen_others), mine[rel], cache, start_ns,
              None, old)
    # Sorted by path, at most MAX_CHANGES, as a traced list.
    order = sorted(range(len(judged.changes)), key=lambda n: judged.changes[n]["path"])
    unproven = set(judged.unproven)
    for n in order:
        entry = judged.changes[n]
        _add(found, entry, judged.manifest.get(entry["path"]),
             unproven=entry["path"] in unproven)
    found.by_others = sorted(found.by_others)[:MAX_CHANGES]
    return found
