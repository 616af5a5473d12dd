"""The Host's side of OS-level tracing: who touched which workspace file, and when.

Owns :class:`TraceLog`, one per kernel generation: it collects the accesses
the sandbox's init traced (host_kernel/sandbox/trace.py), maps each path into
the workspace, and hands them out by owner: a cell takes the kernel tree's
accesses stamped between its start and its end (those stamped before its start
happened between cells and are kept apart as such), a ``host.bash`` command
takes those of its own process tree. :class:`TracedAccess` is what one owner
did, in the shape the lineage tracker reads (``reads``, ``writes``,
``renames``, ``removes``), with the *stamp* of each read: the file's stat key
as init saw it at the open (``stamps``). A cell's stamps are handed to the
input keeper and lineage through the workspace's
:class:`~host_kernel.host._workspace.OpenStamps`, so a file whose stamp is the
key the Host hashed it under is not looked at again.

It decides nothing about trust or acceptance; it is lineage evidence made on
the trusted side (docs/lineage.md).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..sandbox.client import Sandbox
from ..sandbox.trace import EXEC, LINK, READ, READ_WRITE, REMOVE, RENAME, WRITE
from ._workspace import FileStat, Workspace, ctime_clock_ns

__all__ = ["GONE", "KERNEL", "LINK", "MAYBE", "MOVED_IN", "RENAME", "SLACK_NS", "Before",
           "TraceLog", "TracedAccess", "WROTE", "now_ns"]

#: The source of the kernel's own process tree (cells, their subprocesses and workers).
KERNEL = 0
#: Most accesses held waiting for their owner; beyond it the oldest are dropped and counted.
MAX_PENDING = 2_000_000
#: Most paths of each kind kept in one owner's record entry.
MAX_LISTED = 10_000
#: Another owner's write counts as made during a command when the tracer stamped it no
#: earlier than this before the command started (monotonic).
SLACK_NS = 20_000_000

#: How an owner may have changed a path (:attr:`TracedAccess.changed`).
WROTE, MOVED_IN, GONE, MAYBE = "w", "to", "from", "rw"
_WRITE_KINDS = frozenset([WRITE, READ_WRITE, RENAME, LINK, REMOVE])


@dataclass(frozen=True, slots=True)
class Before:
    """A path's state at a command's first call that might change it, as the supervisor
    saw it while the caller waited (host_kernel/sandbox/trace.py)."""

    #: Orders the states the supervisor took (smaller: earlier).
    seq: int
    #: trace.MISSING, FILE, FOLDER, SYMLINK, OTHER or UNKNOWN.
    kind: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    #: sha256 of a regular file's bytes; None when not hashed (over the bound, more than
    #: one name, past the command's budget) or not a regular file.
    sha256: str | None


@dataclass
class TracedAccess:
    """What one owner (a cell, or a command) was seen to do to workspace files."""

    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    renames: list[tuple[str, str]] = field(default_factory=list)
    removes: list[str] = field(default_factory=list)
    #: Accesses of the kernel's tree between the previous cell's end and this one's start.
    between: list[str] = field(default_factory=list)
    dropped: int = 0
    #: Why some process of the generation went untraced (init said), if one did.
    error: str | None = None
    #: Every workspace path, as named (bytecode not mapped to its source), that this owner
    #: may have changed, with how: WROTE (opened for writing, truncated), MOVED_IN (renamed
    #: or hard-linked to), GONE (removed, or renamed away), MAYBE (opened for reading and
    #: writing, or hard-linked from: its change time decides). The receipt's changes.
    changed: dict[str, set[str]] = field(default_factory=dict)
    #: Renames and hard links within the workspace, as named: (kind, from, to).
    moves: list[tuple[str, str, str]] = field(default_factory=list)
    #: Paths other owners opened for writing, renamed or removed while this one ran.
    others: list[str] = field(default_factory=list)
    #: A command's before-states, by workspace path (symlinks resolved as its calls
    #: resolved them): what each path was at the command's first call that might change it.
    before: dict[str, Before] = field(default_factory=dict)
    #: Read path -> its stamp: the stat key init took at its latest open for reading (a
    #: plain read or an exec, symlinks followed), for the reads this owner did not also
    #: write, rename or remove (a bytecode read, counted as its source's, has none).
    stamps: dict[str, FileStat] = field(default_factory=dict)

    def access(self) -> dict[str, Any]:
        """The shape the lineage tracker reads (host/_lineage.py)."""
        return {"reads": self.reads, "writes": self.writes,
                "renames": [list(r) for r in self.renames], "removes": self.removes}

    def touched(self) -> set[str]:
        """Every path this owner wrote, removed, or renamed from or to."""
        out = set(self.writes) | set(self.removes)
        for a, b in self.renames:
            out.add(a)
            out.add(b)
        return out

    def to_record(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for key in ("reads", "writes", "removes", "between"):
            values = getattr(self, key)
            if values:
                body[key] = values[:MAX_LISTED]
                if len(values) > MAX_LISTED:
                    body[f"{key}_truncated"] = len(values)
        if self.renames:
            body["renames"] = [list(r) for r in self.renames[:MAX_LISTED]]
        if self.dropped:
            body["dropped"] = self.dropped
        if self.error:
            body["error"] = self.error
        return body


class TraceLog:
    """The accesses init traced for one generation, waiting for their owners."""

    def __init__(self, sandbox: Sandbox, workspace: Workspace) -> None:
        self.sandbox = sandbox
        self.workspace = workspace
        # Both are real paths already (Workspace resolves them), as init's are.
        self._root = str(workspace.root) + "/"
        self._record = str(workspace.record) + "/"
        self._pending: list[tuple[Any, ...]] = []
        #: source → workspace path → its first before-state (a command's own).
        self._before: dict[int, dict[str, Before]] = {}
        self._lock = threading.Lock()
        self.dropped = 0
        #: Why some process of the generation went untraced (init says), if it did.
        self.error: str | None = None

    @staticmethod
    def roots(workspace: Workspace) -> list[str]:
        """The folders init keeps accesses under: the workspace (a real path)."""
        return [str(workspace.root)]

    def _pull(self) -> None:
        accesses, dropped, error, before = self.sandbox.collect_trace()
        self.dropped += dropped
        for seq, source, path, *state in before:
            rel = self._inside(path)
            if rel is None:
                continue
            mine = self._before.setdefault(source, {})
            if rel not in mine or mine[rel].seq > seq:
                mine[rel] = Before(seq, *state)
        if error and self.error is None:
            self.error = error
        self._pending.extend(accesses)
        if len(self._pending) > MAX_PENDING:
            cut = len(self._pending) - MAX_PENDING
            self.dropped += cut
            del self._pending[:cut]

    def for_cell(self, start_ns: int, end_ns: int | None = None, *,
                 consume: bool = True, since_ctime_ns: int | None = None) -> TracedAccess:
        """The kernel tree's accesses up to ``end_ns`` (now when None); those before
        ``start_ns`` are reported as ``between``. ``consume=False`` leaves them for the
        cell's own end (a ``save_artifact`` in the middle of the cell)."""
        with self._lock:
            self._pull()
            pending = self._pending
            if end_ns is None:
                mine = [a for a in pending if a[1] == KERNEL]
            else:
                mine = [a for a in pending if a[1] == KERNEL and a[0] <= end_ns]
            # Most often every access is the kernel's and in the window: nothing is left.
            left = ([] if len(mine) == len(pending) else
                    [a for a in pending if not (a[1] == KERNEL and (end_ns is None
                                                                    or a[0] <= end_ns))])
            if consume:
                self._pending = left
            dropped = self.dropped
            if consume:
                self.dropped = 0
        before = [a for a in mine if a[0] < start_ns]
        during = [a for a in mine if a[0] >= start_ns] if before else mine
        out = self._shape(during, since_ctime_ns)
        out.between = list(dict.fromkeys(
            rel for a in before for rel in map(self._relative, _paths(a)) if rel is not None))
        out.dropped = dropped
        out.error = self.error
        self.workspace.stamps.put(out.reads, out.stamps)
        return out

    def for_command(self, pid: int, since_ctime_ns: int | None = None,
                    since_ns: int | None = None) -> TracedAccess:
        """The accesses of the command whose process is ``pid`` (in the sandbox), taken.

        ``dropped`` counts every access dropped since the last cell ended (some may be
        this command's); ``others`` lists what other owners wrote from ``since_ns``
        (monotonic, less the slack) on, left in place for them.
        """
        with self._lock:
            self._pull()
            mine = [a for a in self._pending if a[1] == pid]
            self._pending = [a for a in self._pending if a[1] != pid]
            before = self._before.pop(pid, {})
            dropped = self.dropped
            others: dict[str, None] = {}
            if since_ns is not None:
                for a in self._pending:
                    if a[2] in _WRITE_KINDS and a[0] >= since_ns - SLACK_NS:
                        for path in _paths(a):
                            rel = self._inside(path)
                            if rel is not None:
                                others[rel] = None
        out = self._shape(mine, since_ctime_ns)
        out.dropped = dropped
        out.error = self.error
        out.others = list(others)
        out.before = before
        return out

    def _inside(self, path: str) -> str | None:
        """The workspace-relative path as named; None outside it or inside the record."""
        if (path + "/").startswith(self._record) or not path.startswith(self._root):
            return None  # outside the workspace, or the record (never an input)
        return path[len(self._root):] or None

    def _relative(self, path: str) -> str | None:
        rel = self._inside(path)
        return _source_of_bytecode(rel) if rel else None

    def _shape(self, accesses: list[tuple[Any, ...]], since_ctime_ns: int | None) -> TracedAccess:
        reads: dict[str, None] = {}
        writes: dict[str, None] = {}
        removes: dict[str, None] = {}
        renames: list[tuple[str, str]] = []
        maybe_written: dict[str, None] = {}
        changed: dict[str, set[str]] = {}
        moves: list[tuple[str, str, str]] = []
        stamps: dict[str, FileStat] = {}

        def note(path: str | None, how: str) -> str | None:
            raw = None if path is None else self._inside(path)
            if raw is not None:
                changed.setdefault(raw, set()).add(how)
            return raw

        inside, root, cut = self._inside, self._root, len(self._root)
        record, record_path = self._record, self._record[:-1]
        for access in sorted(accesses, key=_at):
            kind = access[2]
            path = access[3]
            if kind == READ:
                # The common access, inline: what _relative and the branches below do for it.
                if (not path.startswith(root) or path.startswith(record)
                        or path == record_path or len(path) == cut):
                    continue
                rel = path[cut:]
                if "__pycache__/" in path:
                    rel = _source_of_bytecode(rel)
                    reads[rel] = None
                    if len(access) > 4:
                        stamps.pop(rel, None)  # a bytecode read's stamp is not its source's
                    continue
                reads[rel] = None
                if len(access) > 4:
                    # The latest sighting's stamp (sorted by time).
                    stamp = access[4]
                    if stamp is not None:
                        stamps[rel] = stamp
                    else:
                        stamps.pop(rel, None)
                continue
            raw = inside(path)
            rel = _source_of_bytecode(raw) if raw else None
            if kind == WRITE:
                note(access[3], WROTE)
            elif kind == READ_WRITE:
                note(access[3], MAYBE)
            elif kind == REMOVE:
                note(access[3], GONE)
            elif kind in (RENAME, LINK):
                # A hard link's source shares its bytes with the new name from now on.
                src = note(access[3], GONE if kind == RENAME else MAYBE)
                dst = note(access[4], MOVED_IN)
                if src is not None and dst is not None:
                    moves.append((kind, src, dst))
            if kind in (READ, EXEC, READ_WRITE):
                if rel is not None:
                    reads[rel] = None
                    if kind == READ_WRITE:
                        maybe_written[rel] = None
                    elif len(access) > 4:
                        # The latest sighting's stamp (sorted by time), only for a read of
                        # the file itself: a bytecode read's stamp is not its source's.
                        stamp = access[4]
                        if stamp is not None and "__pycache__/" not in access[3]:
                            stamps[rel] = stamp
                        else:
                            stamps.pop(rel, None)
            elif kind == WRITE:
                if rel is not None and not _bytecode(access[3]):
                    writes[rel] = None
            elif kind == REMOVE:
                if rel is not None:
                    removes[rel] = None
            elif kind in (RENAME, LINK):
                dst = self._relative(access[4])
                if kind == LINK:
                    if rel is not None:
                        reads[rel] = None
                        if dst is None:
                            # Linked out of the workspace: writes through the other name
                            # change this file unseen, so its modification time decides.
                            maybe_written[rel] = None
                    if dst is not None:
                        writes[dst] = None
                elif rel is not None and dst is not None:
                    renames.append((rel, dst))
                    writes[dst] = None  # written by this owner, as the audit hook counts it
                elif dst is not None:
                    writes[dst] = None  # moved in from outside the workspace
                elif rel is not None:
                    removes[rel] = None  # moved out of it
        for rel in maybe_written:
            if rel not in writes and self._changed_since(rel, since_ctime_ns):
                writes[rel] = None
        if stamps and changed:
            # A file this owner may have changed: its bytes at the end are not the stamp's.
            for raw in changed:
                stamps.pop(_source_of_bytecode(raw), None)
                stamps.pop(raw, None)
        return TracedAccess(list(reads), list(writes), renames, list(removes),
                            changed=changed, moves=moves, stamps=stamps)

    def _changed_since(self, rel: str, since_ctime_ns: int | None) -> bool:
        if since_ctime_ns is None:
            return False
        try:
            st = os.stat(self.workspace.root / rel, follow_symlinks=False)
        except OSError:
            return False
        # The change time, not the modification time: a process can set the latter back
        # (os.utime) but never the former.
        return st.st_ctime_ns >= since_ctime_ns


def _at(access: tuple[Any, ...]) -> int:
    """When an access was stamped (monotonic ns): the order accesses are shaped in."""
    return access[0]  # type: ignore[no-any-return]


def _paths(access: tuple[Any, ...]) -> tuple[str, ...]:
    """The path (or the two paths of a rename or link) of a traced access."""
    return access[3:5] if access[2] in (RENAME, LINK) else access[3:4]


def _bytecode(path: str) -> bool:
    return "/__pycache__/" in path


def _source_of_bytecode(rel: str) -> str:
    """``pkg/__pycache__/mod.cpython-311.pyc`` → ``pkg/mod.py``: importing a module whose
    bytecode is cached reads only the cache, but the bytes that flowed are the source's."""
    head, sep, name = rel.rpartition("__pycache__/")
    if not sep or not name.endswith(".pyc"):
        return rel
    stem = name[:-4].split(".", 1)[0]
    return f"{head}{stem}.py"


def now_ns() -> tuple[int, int]:
    """(monotonic, change-time clock) nanoseconds: a cell's start as the tracer and the
    file system see it."""
    return time.monotonic_ns(), ctime_clock_ns()
