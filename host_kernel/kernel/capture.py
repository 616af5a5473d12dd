"""Per-cell file access capture inside the kernel, through a PEP 578 audit hook.

This module owns one thing: noticing which workspace files the kernel process
opens for reading or writing, removes, renames, and which programs it launches,
while a cell runs, and handing that back as a :class:`CellAccess` value.

It does not own what happens next. It does not hash files, decide lineage,
talk to the Host, or judge whether an access was allowed: it runs inside the
untrusted kernel, so what it reports is a *candidate* list that the Host
checks against the files it can see (``host_kernel.lineage.flow`` carries the
reads forward across cells). Nothing here can refuse an operation either: the
hook never raises, because a raising audit hook aborts the user's operation.

What is seen, and how:

* ``open`` (``open()``, ``io.open``, ``pathlib``, ``os.open``, ``io.open_code``):
  the mode string decides read or write; when it is ``None`` (``os.open``) the
  flags decide (``O_WRONLY``/``O_RDWR``/``O_CREAT``/``O_TRUNC``/``O_APPEND``
  write, ``O_RDONLY``/``O_RDWR`` read). An open is counted when it is
  *attempted*: one that then fails (a missing file) is still listed, and the
  Host drops paths it cannot hash. Integer file descriptors are ignored.
* ``os.rename`` (also raised by ``os.replace``, ``Path.rename``,
  ``shutil.move``): the target is a write; the pair is a rename when both ends
  are recorded; a source moved out of view is a remove.
* ``os.remove`` (``os.unlink``, ``Path.unlink``), ``os.rmdir``,
  ``shutil.rmtree`` (the folder itself, once), ``os.truncate`` (a write),
  ``os.link`` / ``os.symlink`` (the new name is a write).
* ``subprocess.Popen``, ``os.system``, ``os.exec``, ``os.posix_spawn``,
  ``os.spawn``, ``os.startfile``: the program launched (``Popen``'s
  executable, which is ``/bin/sh`` for ``shell=True``; the first word of an
  ``os.system`` command; the path given to the others).

Limits, on purpose:

* Attribution is per process, not per thread: while a cell is being captured,
  every thread's accesses are attributed to that cell, including threads a
  previous cell started. Between ``end()`` and the next ``begin()`` nothing is
  recorded.
* Paths given relative to a directory descriptor (``dir_fd=``) are skipped
  for removes and renames, and misread as cwd-relative for ``os.open``; this
  is why ``shutil.rmtree`` is reported as one removal of its folder.
* ``os.spawn*`` on POSIX forks first and execs in the child, where this
  process's capture cannot see it, so it is not listed; ``os.fork`` alone is
  not a launch.
* A read-only ``os.open`` (which may be a folder, as ``shutil.rmtree`` does)
  is kept only if the path is a regular file when the cell ends.
* Interpreter files are ignored: anything under ``__pycache__`` or ending in
  ``.pyc``, and anything under ``sys.prefix``/``base_prefix``/``exec_prefix``
  or a site-packages folder, unless that interpreter folder contains the
  workspace (then it is not an interpreter folder for our purposes; a virtual
  environment *inside* the workspace is still ignored).
* Paths are normalised lexically against the current directory (kept in a
  cache that every ``os.chdir`` clears); symlinks are resolved only for paths
  that fall outside the workspace, to catch absolute paths reached through a
  symlinked folder. A symlink inside the workspace is recorded by the name
  that was opened.
* Each list is bounded (``max_paths``, 10,000 by default); past the bound the
  list stops growing and ``truncated`` is set. The bound counts names as
  first seen, before ``end()`` normalises the rare ones with ``.``/``..``.

Cost: every audited event in the process pays one frozenset test; an
``open`` of a workspace file during a cell pays a few dict and string
operations (about 1 µs on a slow shared CPU: a cell opening and reading
10,000 small text files measured about 1.11-1.17x its untraced time, where a
no-op Python audit hook alone costs about 1.05x).
"""

from __future__ import annotations

import contextlib
import os
import site
import stat
import sys
from _thread import get_ident
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CAPTURED_EVENTS", "Capture", "CellAccess"]

#: Audit events the hook looks at; every other event returns after one
#: frozenset membership test. Names are those of CPython 3.11's audit table.
CAPTURED_EVENTS: frozenset[str] = frozenset(
    {
        "open",
        "os.rename",
        "os.remove",
        "os.rmdir",
        "os.truncate",
        "os.link",
        "os.symlink",
        "shutil.rmtree",
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.startfile",
        "os.chdir",
    }
)

_LAUNCH_EVENTS = frozenset({"os.exec", "os.posix_spawn", "os.spawn", "os.startfile"})
_WRITE_FLAGS = os.O_CREAT | os.O_TRUNC | os.O_APPEND
_ACCMODE = os.O_RDONLY | os.O_WRONLY | os.O_RDWR
_NO_DIR_FD = (None, -1)
_SEP = os.sep
_DEFAULT_MAX_PATHS = 10_000
# in "\n"-joined names: a ".", ".." or empty segment, or a bytecode cache
_SUSPECT_MARKERS = ("./", "//", ".\n", "__pycache__", ".pyc\n")
_REALPATH_CACHE_MAX = 4_096


@dataclass(frozen=True, slots=True)
class CellAccess:
    """What one cell did to files and processes, as seen by the audit hook.

    Workspace paths are relative and use ``/``; paths under an extra root are
    absolute. Each tuple is in first-seen order, without duplicates.
    """

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    removes: tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    subprocesses: tuple[str, ...] = ()
    truncated: bool = False

    def to_dict(self) -> dict[str, object]:
        """Serialise to plain JSON-ready types (lists, not tuples)."""
        return {
            "reads": list(self.reads),
            "writes": list(self.writes),
            "removes": list(self.removes),
            "renames": [[src, dst] for src, dst in self.renames],
            "subprocesses": list(self.subprocesses),
            "truncated": self.truncated,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CellAccess:
        """Rebuild from :meth:`to_dict` output; raises ``ValueError`` on a bad shape."""
        try:
            renames = tuple((str(src), str(dst)) for src, dst in data.get("renames", ()))
            return cls(
                reads=_str_tuple(data.get("reads", ())),
                writes=_str_tuple(data.get("writes", ())),
                removes=_str_tuple(data.get("removes", ())),
                renames=renames,
                subprocesses=_str_tuple(data.get("subprocesses", ())),
                truncated=bool(data.get("truncated", False)),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a CellAccess dict: {exc}") from exc


def _str_tuple(items: Any) -> tuple[str, ...]:
    if isinstance(items, (str, bytes)):
        raise TypeError("expected a list of strings, got a single string")
    return tuple(str(item) for item in items)


class _CellState:
    """Mutable accumulator for the cell being captured (never leaves this module)."""

    __slots__ = (
        "limit",
        "maybe_dirs",
        "reads",
        "removes",
        "renames",
        "subprocesses",
        "truncated",
        "writes",
    )

    def __init__(self, limit: int) -> None:
        # dicts keep first-seen order and dedupe in one C-level operation
        self.reads: dict[str, None] = {}
        self.writes: dict[str, None] = {}
        self.removes: dict[str, None] = {}
        self.renames: dict[tuple[str, str], None] = {}
        self.subprocesses: dict[str, None] = {}
        # paths first read through a read-only os.open, which may be
        # folders; end() keeps them only if they are regular files
        self.maybe_dirs: set[str] = set()
        self.truncated = False
        self.limit = limit

    def add(self, bucket: dict[Any, None], item: Any) -> None:
        if item in bucket:
            return
        if len(bucket) >= self.limit:
            self.truncated = True
            return
        bucket[item] = None


class Capture:
    """Attribute file accesses in this process to the cell being run.

    Life cycle: ``install()`` once (audit hooks cannot be removed), then
    ``begin(cell_key)`` / ``end()`` around each cell; ``peek()`` reads the
    open cell so far without ending it. Capture never raises into
    the kernel's cell loop: ``begin()`` while a cell is open discards that
    cell's capture and starts the new one, and ``end()`` with no open cell
    returns an empty :class:`CellAccess`.
    """

    def __init__(
        self,
        workspace: str,
        *,
        ignore: Sequence[str] = (),
        extra_roots: Sequence[str] = (),
        max_paths: int = _DEFAULT_MAX_PATHS,
    ) -> None:
        if not os.path.isabs(workspace):
            raise ValueError(f"workspace must be an absolute path, got {workspace!r}")
        if max_paths < 1:
            raise ValueError(f"max_paths must be at least 1, got {max_paths}")
        self._workspace = os.path.realpath(workspace)
        self._ws_prefix = _prefix(self._workspace)
        self._extra_prefixes = tuple(
            dict.fromkeys(
                _prefix(form) for root in extra_roots for form in _forms(root, "extra_roots")
            )
        )
        ignored = [_prefix(form) for folder in ignore for form in _forms(folder, "ignore")]
        ignored.extend(self._interpreter_prefixes())
        self._ignore_prefixes = tuple(dict.fromkeys(ignored))
        # the ignored folders that matter on the fast path (usually one or none)
        self._ws_ignore = tuple(p for p in self._ignore_prefixes if p.startswith(self._ws_prefix))
        self._max_paths = max_paths
        self._state: _CellState | None = None
        self._cell_key: str | None = None
        self._installed = False
        # threads currently inside the slow path; guards against re-entry
        self._busy: set[int] = set()
        # the current directory with a trailing separator; cleared by os.chdir
        self._cwd: tuple[str, str | None] | None = None
        # the same, relative to the workspace, for the fast path; None when
        # outside the workspace or not known yet (then _cwd is None too)
        self._cwd_rel: str | None = None
        self._chdir_thread: int | None = None
        self._real_dirs: dict[str, str] = {}
        self._hook = self._make_hook()

    # -- life cycle -----------------------------------------------------------

    @property
    def workspace(self) -> str:
        return self._workspace

    @property
    def installed(self) -> bool:
        return self._installed

    @property
    def active_cell(self) -> str | None:
        """The key given to ``begin()`` for the cell being captured, if any."""
        return self._cell_key

    def install(self) -> None:
        """Add the audit hook to this process; later calls do nothing."""
        if self._installed:
            return
        sys.addaudithook(self._hook)
        self._installed = True

    def begin(self, cell_key: str) -> None:
        """Start attributing accesses to ``cell_key`` (installs the hook if needed)."""
        self.install()
        self._cwd = None
        self._cwd_rel = None
        self._chdir_thread = None
        self._cell_key = cell_key
        self._state = _CellState(self._max_paths)

    def peek(self) -> CellAccess:
        """What the open cell has done so far, without ending it (for a save mid-cell)."""
        return self._access(self._state)

    def end(self) -> CellAccess:
        """Stop capturing and return what the cell did."""
        state = self._state
        self._state = None
        self._cell_key = None
        return self._access(state)

    def _access(self, state: _CellState | None) -> CellAccess:
        if state is None:
            return CellAccess()
        # list() of a dict is one C call under the GIL, so a late hook in
        # another thread cannot break the iteration
        reads = self._finalise(list(state.reads))
        maybe_dirs = set(state.maybe_dirs)
        if maybe_dirs:
            reads = [p for p in reads if p not in maybe_dirs or self._is_regular_file(p)]
        return CellAccess(
            reads=tuple(reads),
            writes=tuple(self._finalise(list(state.writes))),
            removes=tuple(state.removes),
            renames=tuple(state.renames),
            subprocesses=tuple(state.subprocesses),
            truncated=state.truncated,
        )

    def _finalise(self, keys: list[str]) -> list[str]:
        """Normalise names the fast path took as they came; drop bytecode caches.

        One substring search over all names finds whether any needs work, so
        the usual cell pays a few microseconds here, not a pass per name.
        """
        if not keys:
            return keys
        joined = "\n" + "\n".join(keys) + "\n"
        if not any(marker in joined for marker in _SUSPECT_MARKERS):
            return keys
        clean: dict[str, None] = {}
        for key in keys:
            if key.startswith(_SEP):
                # an extra root's absolute name, set by the slow path
                clean[key] = None
                continue
            normal = self._classify(os.path.normpath(self._ws_prefix + key))
            if normal is not None:
                clean[normal] = None
        return list(clean)

    # -- the hook -------------------------------------------------------------

    def _make_hook(self) -> Callable[[str, tuple[Any, ...]], None]:
        """Build the audit hook as a closure, so the hot path reads locals.

        The fast path handles the common case, ``open`` of a ``str`` path with
        a mode string, relative to a current directory inside the workspace
        or absolute under it, with a handful of cheap operations: it takes
        the path as it comes, and ``end()`` normalises the few names that
        need it (``.``/``..``/empty segments) and drops bytecode caches, in
        one pass over all names. Nothing on the fast path is audited, so it
        cannot re-enter. Everything else goes through ``_slow_event``, which
        holds the re-entry guard and normalises at once.
        """
        capture = self
        events = CAPTURED_EVENTS
        ws_prefix = self._ws_prefix
        ws_len = len(ws_prefix)
        ws_ignore_rel = tuple(p[ws_len:] for p in self._ws_ignore)
        slow = self._slow_event
        posix = _SEP == "/"
        limit = self._max_paths

        def hook(event: str, args: tuple[Any, ...]) -> None:
            if event not in events:
                return
            try:
                state = capture._state
                if event == "open":
                    if state is None:
                        return
                    try:
                        path, mode, _flags = args
                        # mode is a str for open()/io.open()/open_code, None for
                        # os.open; a bytes path or a descriptor raises below
                        # and is left to the slow path
                        if mode is not None and posix:
                            rel: str | None = None
                            if path[0] != "/":
                                cwd_rel = capture._cwd_rel
                                if cwd_rel is not None:
                                    rel = cwd_rel + path
                                elif capture._cwd is None:
                                    cwd_rel = capture._fill_cwd()[1]
                                    if cwd_rel is not None:
                                        rel = cwd_rel + path
                            elif path.startswith(ws_prefix):
                                rel = path[ws_len:]
                                if not rel or rel[0] == "/":
                                    rel = None
                            if rel is not None and not (
                                ws_ignore_rel and (rel + "/").startswith(ws_ignore_rel)
                            ):
                                if mode == "r" or mode == "rb" or mode == "rt":
                                    bucket = state.reads
                                    if rel not in bucket:
                                        if len(bucket) < limit:
                                            bucket[rel] = None
                                        else:
                                            state.truncated = True
                                    return
                                if "r" in mode or "+" in mode:
                                    bucket = state.reads
                                    if rel not in bucket:
                                        if len(bucket) < limit:
                                            bucket[rel] = None
                                        else:
                                            state.truncated = True
                                if "w" in mode or "a" in mode or "x" in mode or "+" in mode:
                                    bucket = state.writes
                                    if rel not in bucket:
                                        if len(bucket) < limit:
                                            bucket[rel] = None
                                        else:
                                            state.truncated = True
                                return
                    except Exception:  # noqa: BLE001, S110 - the slow path handles odd arguments
                        pass
                elif event == "os.chdir":
                    capture._cwd = None
                    capture._cwd_rel = None
                    capture._chdir_thread = get_ident()
                    return
                if state is not None:
                    slow(state, event, args)
            except Exception:  # noqa: BLE001 - a raising hook would abort the user's call
                return

        return hook

    def _fill_cwd(self) -> tuple[str, str | None]:
        """Cache the current directory: (prefix, prefix relative to the workspace or None)."""
        prefix = _prefix(os.getcwd())
        cwd: tuple[str, str | None]
        if prefix.startswith(self._ws_prefix):
            cwd = (prefix, prefix[len(self._ws_prefix) :])
        else:
            cwd = (prefix, None)
        # a chdir announced by another thread may not have happened yet, so
        # only the thread that announced it may fill the cache
        ident = get_ident()
        if self._chdir_thread is None or self._chdir_thread == ident:
            self._cwd = cwd
            self._cwd_rel = cwd[1]
            self._chdir_thread = None
        return cwd

    def _slow_event(self, state: _CellState, event: str, args: tuple[Any, ...]) -> None:
        ident = get_ident()
        busy = self._busy
        if ident in busy:
            return
        busy.add(ident)
        try:
            self._record(state, event, args)
        except Exception:  # noqa: BLE001 - a raising hook would abort the user's call
            return
        finally:
            busy.discard(ident)

    def _record(self, state: _CellState, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            self._record_open(state, args)
        elif event == "os.rename":
            if args[2] not in _NO_DIR_FD or args[3] not in _NO_DIR_FD:
                return
            src = self._key(args[0])
            dst = self._key(args[1])
            if dst is not None:
                state.add(state.writes, dst)
                if src is not None:
                    state.add(state.renames, (src, dst))
            elif src is not None:
                state.add(state.removes, src)
        elif event in ("os.remove", "os.rmdir", "shutil.rmtree"):
            if args[1] not in _NO_DIR_FD:
                return
            key = self._key(args[0])
            if key is not None:
                state.add(state.removes, key)
        elif event == "os.truncate":
            key = self._key(args[0])
            if key is not None:
                state.add(state.writes, key)
        elif event in ("os.link", "os.symlink"):
            key = self._key(args[1])
            if key is not None:
                state.add(state.writes, key)
        elif event == "subprocess.Popen":
            program = args[0] if args[0] is not None else _first(args[1])
            if program is not None:
                state.add(state.subprocesses, os.fsdecode(program))
        elif event == "os.system":
            words = os.fsdecode(args[0]).split()
            if words:
                state.add(state.subprocesses, words[0])
        elif event in _LAUNCH_EVENTS:
            path = args[1] if event == "os.spawn" else args[0]
            state.add(state.subprocesses, os.fsdecode(path))

    def _record_open(self, state: _CellState, args: tuple[Any, ...]) -> None:
        path, mode, flags = args
        if isinstance(mode, str):
            write = "w" in mode or "a" in mode or "x" in mode or "+" in mode
            read = "r" in mode or "+" in mode
            via_os_open = False
        else:
            access = flags & _ACCMODE
            write = access != os.O_RDONLY or bool(flags & _WRITE_FLAGS)
            read = access != os.O_WRONLY
            via_os_open = True
        key = self._key(path)
        if key is None:
            return
        if read:
            if via_os_open and not write and key not in state.reads:
                state.maybe_dirs.add(key)
            state.add(state.reads, key)
        if write:
            state.add(state.writes, key)

    # -- paths ----------------------------------------------------------------

    def _key(self, path: Any) -> str | None:
        """The recorded name for ``path``, or ``None`` when it is not recorded."""
        if type(path) is not str:
            if isinstance(path, int):
                return None
            path = os.fsdecode(os.fspath(path))
        if not path:
            return None
        if not os.path.isabs(path):
            path = (self._cwd or self._fill_cwd())[0] + path
        path = os.path.normpath(path)
        key = self._classify(path)
        if key is None and not path.startswith(self._ignore_prefixes):
            # interpreter imports are the bulk of outside opens: they skip this
            real = self._realpath(path)
            if real != path:
                key = self._classify(real)
        return key

    def _classify(self, path: str) -> str | None:
        if path.startswith(self._ws_prefix):
            if self._ignored(path):
                return None
            rel = path[len(self._ws_prefix) :]
            return rel if _SEP == "/" else rel.replace(_SEP, "/")
        if self._extra_prefixes and path.startswith(self._extra_prefixes):
            return None if self._ignored(path) else path
        return None

    def _ignored(self, path: str) -> bool:
        if path.endswith(".pyc") or "__pycache__" in path:
            return True
        return (path + _SEP).startswith(self._ignore_prefixes)

    def _realpath(self, path: str) -> str:
        folder, _, name = path.rpartition(_SEP)
        cache = self._real_dirs
        real = cache.get(folder)
        if real is None:
            if len(cache) >= _REALPATH_CACHE_MAX:
                cache.clear()
            real = _prefix(os.path.realpath(folder or _SEP))
            cache[folder] = real
        return real + name

    def _is_regular_file(self, key: str) -> bool:
        path = key if os.path.isabs(key) else os.path.join(self._workspace, key)
        try:
            return stat.S_ISREG(os.stat(path).st_mode)
        except OSError:
            return False

    def _interpreter_prefixes(self) -> list[str]:
        """Interpreter folders to ignore: those that do not contain the workspace."""
        folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        # embedded interpreters may lack these
        with contextlib.suppress(Exception):
            folders.update(site.getsitepackages())
            folders.add(site.getusersitepackages())
        prefixes: list[str] = []
        for folder in sorted(f for f in folders if f):
            for form in (os.path.normpath(folder), os.path.realpath(folder)):
                prefix = _prefix(form)
                if not self._ws_prefix.startswith(prefix):
                    prefixes.append(prefix)
        return prefixes


def _forms(folder: str, what: str) -> tuple[str, str]:
    """The folder as given (normalised) and with symlinks resolved."""
    if not os.path.isabs(folder):
        raise ValueError(f"{what} entries must be absolute paths, got {folder!r}")
    return os.path.normpath(folder), os.path.realpath(folder)


def _prefix(folder: str) -> str:
    """The folder with exactly one trailing separator (``/`` stays ``/``)."""
    return folder.rstrip(_SEP) + _SEP


def _first(argv: Any) -> Any:
    if isinstance(argv, (str, bytes)):
        return argv
    try:
        return argv[0]
    except (IndexError, TypeError, KeyError):
        return None
