"""What a confined process may touch: the paths, rights and switches of one session.

Owns the decision, not the enforcement: the Host builds a :class:`Policy` for a
session (workspace, private folder, record, network), the sandbox's init process
turns it into a Landlock ruleset (host_kernel/sandbox/landlock.py), and the
session's start event records it rule by rule.

Reads are broad (scientists read data from anywhere) **except** the places that
would let confined code reach past its session: the record folders, the temp
root where every Host keeps its runtime folder (connection files hold the HMAC
keys of other kernels), Jupyter's runtime folder (the connection files of the
user's ordinary, unconfined kernels) and ``$XDG_RUNTIME_DIR``. Landlock cannot
deny a sub-folder of a granted tree, so "everything but X" is granted as the
siblings of X and of each of its ancestors (:func:`readable_roots`).
Writes are narrow: the workspace, the session's private folder, and the shared
memory and terminal devices programs expect.

It also decides the sandbox's **private view** (:func:`view_of`): which folders
the sandbox's init covers with a fresh, empty tmpfs in its own mount namespace
(the places every session on the machine shares: ``/tmp``, ``/var/tmp``,
``/dev/shm``, the temp root, Jupyter's and the user's runtime folders, the
records' home), and which of the session's own paths beneath them it binds
back at their own paths; what other sessions keep there is then absent, not
merely unreadable.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

__all__ = ["Policy", "hidden_paths", "readable_roots", "uncovered", "view_of"]

#: Device files any program may open for reading and writing.
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                "/dev/tty", "/dev/ptmx")
#: Shared folders that need writes for ordinary programs (POSIX semaphores, ptys).
SHARED_WRITABLE = ("/dev/shm", "/dev/pts")
#: Folders every sandbox sees fresh (a tmpfs of its own), whatever its rules.
FRESH = ("/tmp", "/var/tmp", "/dev/shm")
#: The tmpfs options of a fresh folder: /dev/shm is written (POSIX shared memory,
#: semaphores); the others only hold the mount points of the paths bound back.
_SHM_OPTIONS = "mode=1777"
_FOLDER_OPTIONS = "mode=0755,size=16m"


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def hidden_paths(records: Iterable[str | os.PathLike[str]] = ()) -> list[str]:
    """Folders confined code may not even read: records, runtime folders, temp roots."""
    out = [_real(p) for p in records]
    out.append(_real(tempfile.gettempdir()))
    out += ["/tmp", "/var/tmp"]
    try:
        from jupyter_core.paths import jupyter_runtime_dir
        out.append(_real(jupyter_runtime_dir()))
    except Exception:  # noqa: BLE001 - jupyter_core missing or misconfigured: nothing to hide
        pass
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        out.append(_real(runtime))
    from .._paths import records_home
    out.append(_real(records_home()))
    seen: list[str] = []
    for p in out:
        if p != "/" and p not in seen:
            seen.append(p)
    return seen


def readable_roots(hidden: Sequence[str], root: str = "/") -> list[str]:
    """The largest folders under ``root`` that contain none of ``hidden``.

    A folder holding a hidden path is split into its entries, recursively, so the
    result grants everything except the hidden folders themselves.
    """
    hidden_set = {h.rstrip("/") or "/" for h in hidden}
    if root in hidden_set:
        return []
    prefix = root.rstrip("/") + "/"
    if not any(h.startswith(prefix) for h in hidden_set):
        return [root]
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return []
    out: list[str] = []
    for name in entries:
        child = prefix + name
        if os.path.islink(child):
            # A symlink's target is granted (or not) on its own; granting the
            # link would grant wherever it points, including a hidden folder.
            target = _real(child)
            if not any(target == h or target.startswith(h.rstrip("/") + "/") or
                       h.startswith(target.rstrip("/") + "/") for h in hidden_set):
                out.append(child)
            continue
        out += readable_roots(sorted(hidden_set), child)
    return out


@dataclass(frozen=True)
class Policy:
    """The rights of every process confined for one session (kernel and commands alike)."""

    workspace: str
    #: Folders beneath which confined code may write (the workspace first).
    writable: tuple[str, ...]
    #: Folders and files confined code may read and execute.
    readable: tuple[str, ...]
    #: Single files confined code may read (e.g. its connection file).
    readable_files: tuple[str, ...] = ()
    #: Folders confined code may not read at all (recorded; enforced by omission).
    hidden: tuple[str, ...] = ()
    network: bool = True
    #: Where the interpreter is installed (recorded, and checked to be read-only).
    interpreter: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def for_session(cls, workspace: str | os.PathLike[str], private: str | os.PathLike[str],
                    records: Sequence[str | os.PathLike[str]], *, network: bool = True,
                    extra_read: Sequence[str | os.PathLike[str]] = (),
                    extra_write: Sequence[str | os.PathLike[str]] = ()) -> Policy:
        ws = _real(workspace)
        hidden = hidden_paths(records)
        readable = readable_roots(hidden)
        # The interpreter, and host_kernel itself: the sandbox's init imports it unconfined,
        # so a copy that confined code could change would be an escape (reported below).
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        from .._paths import user_site

        # The user's site folder too, where a fresh interpreter would run its .pth files
        # (whether or not it exists yet: a session that may create it is reported).
        site = user_site(os.environ)
        interpreter = sorted({_real(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                 os.path.dirname(_real(sys.executable)),
                                                 package, *([site] if site else []))})
        # The interpreter and its packages must be readable even when they live in a
        # hidden tree (a venv under /tmp, as CI makes one).
        extras = [p for p in interpreter if os.path.isdir(p)] + [
            p for p in sys.path if p and os.path.isdir(p)]
        for extra in [_real(p) for p in extras + list(extra_read)]:
            # Never re-grant a hidden folder, or a folder holding one, through the back door.
            if not any(h == extra or h.startswith(extra.rstrip("/") + "/") for h in hidden):
                readable.append(extra)
        writable = [ws, _real(private)] + [_real(p) for p in extra_write]
        return cls(workspace=ws, writable=tuple(dict.fromkeys(writable)),
                   readable=tuple(dict.fromkeys(readable)), hidden=tuple(hidden),
                   network=network, interpreter=tuple(interpreter))

    @classmethod
    def for_pool(cls, roots: Sequence[str | os.PathLike[str]], folder: str | os.PathLike[str],
                 *, network: bool = True) -> Policy:
        """The broad domain a pool's standby kernel starts in (host_kernel/host/_pool.py).

        Reads as any session's; writes beneath ``roots`` (where the workspaces the pool
        serves live) and the standby's own ``folder``. Only trusted code runs in it: the
        session's ruleset is stacked on top before the kernel runs anything of the session's.
        """
        return cls.for_session(folder, folder, (), network=network, extra_write=roots)

    def to_dict(self) -> dict[str, Any]:
        """Its fields, as JSON carries them (:meth:`from_dict` reads them back)."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Policy:
        values: dict[str, Any] = {f.name: tuple(data[f.name]) if isinstance(data[f.name], list)
                                  else data[f.name] for f in fields(cls)}
        return cls(**values)

    def with_generation(self, folder: str | os.PathLike[str],
                        connection_file: str | os.PathLike[str]) -> Policy:
        """This policy plus one kernel generation's own socket folder."""
        return Policy(self.workspace, self.writable + (_real(folder),), self.readable,
                      self.readable_files + (_real(connection_file),), self.hidden,
                      self.network, self.interpreter)

    @cached_property
    def _masks(self) -> tuple[str, ...]:
        return tuple(m for m, _ in view_of(self)[0])

    def may_read(self, path: str) -> bool:
        """Whether confined code reads the file at ``path`` (a real path) that the Host
        reads there: a folder of the policy holds it, and no folder the private view
        replaces with a fresh one (its own /tmp, the records' home) lies between them."""
        if path in self.readable_files:
            return True
        grants = [r for r in (*self.writable, *self.readable) if _under(path, r)]
        if not grants:
            return False
        deepest = max(grants, key=len)  # bound back at its own path when under a mask
        return not any(_under(path, m) and not _under(deepest, m) for m in self._masks)

    def _writable_covers(self, path: str) -> bool:
        """Whether a writable folder is ``path`` or lies above it."""
        return any(path == w or path.startswith(w.rstrip("/") + "/") for w in self.writable)

    def interpreter_writable(self) -> list[str]:
        """Parts of the interpreter's installation that a writable folder covers."""
        return [inst for inst in self.interpreter if self._writable_covers(inst)]

    def host_path_writable(self) -> list[str]:
        """Folders on this (the Host's) process's import path that a writable folder
        covers: ``sys.path`` as it is now, ``''`` being the working folder (a script run
        from the workspace, ``python -c``, ``python -m``). A module a cell leaves in one
        would be imported by the Host's own process the first time it imports that name
        (the kernelspec's relay runs with ``-P`` so that its folder is not one)."""
        out = []
        for entry in sys.path:
            if entry and not os.path.isdir(entry):
                continue  # a zip, or a finder's marker (an editable install's)
            try:
                where = _real(entry or os.getcwd())
            except OSError:  # the working folder is gone: nothing is imported from it
                continue
            if self._writable_covers(where):
                out.append(where)
        return list(dict.fromkeys(out))


def uncovered(broad: Policy, narrow: Policy) -> list[str]:
    """The rules of ``narrow`` that ``broad`` does not grant in full.

    Landlock domains stack by intersection: a kernel in ``broad`` that then enters
    ``narrow`` keeps ``narrow``'s rights only where ``broad`` grants them too. A right
    on a path comes from a rule on it or on any folder above it.
    """
    from .landlock import _DIR_ONLY

    wide: dict[str, int] = {}
    for above, rights in ruleset_spec(broad):
        wide[above.rstrip("/") or "/"] = wide.get(above.rstrip("/") or "/", 0) | rights
    out = []
    for path, access in ruleset_spec(narrow):
        key = path.rstrip("/") or "/"
        if access & ~wide.get(key, 0) == 0:
            continue  # the same rule, or a wider one, on the same path
        if not os.path.exists(path):
            continue  # a rule on a missing path is not added (landlock.Ruleset.allow)
        if not os.path.isdir(path):
            access &= ~_DIR_ONLY
        granted = 0
        at = key
        while True:  # the rights of every rule on this path or a folder above it
            granted |= wide.get(at, 0)
            if at == "/":
                break
            at = os.path.dirname(at)
        if access & ~granted:
            out.append(path)
    return out


def ruleset_spec(policy: Policy) -> list[tuple[str, int]]:
    """``(path, Landlock rights)`` for every rule of ``policy``, in the order init adds them.

    Plain data, so the sandbox's init process needs no import but ``landlock``.
    """
    from . import landlock as ll

    spec = [(p, ll.FS_READ) for p in policy.readable]
    spec += [(p, ll.READ_FILE) for p in policy.readable_files]
    spec += [(p, ll.FS_WRITE) for p in policy.writable + SHARED_WRITABLE]
    spec += [(p, ll.READ_FILE | ll.WRITE_FILE | ll.IOCTL_DEV) for p in DEVICE_FILES]
    return spec


def rules_for_record(policy: Policy, abi: int) -> list[dict[str, Any]]:
    """Every rule the ruleset of ``policy`` applies, as plain data for the start event."""
    rules: list[dict[str, Any]] = [{"path": p, "access": "read"} for p in policy.readable
                                   if os.path.exists(p)]
    rules += [{"path": p, "access": "read_file"} for p in policy.readable_files]
    rules += [{"path": p, "access": "write"} for p in policy.writable]
    rules += [{"path": p, "access": "write"} for p in SHARED_WRITABLE if os.path.exists(p)]
    rules += [{"path": p, "access": "device"} for p in DEVICE_FILES if os.path.exists(p)]
    return rules


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def view_of(policy: Policy, keep: Sequence[str | os.PathLike[str]] = ()
            ) -> tuple[list[tuple[str, str]], list[str]]:
    """The private view of a sandbox confined by ``policy``: ``(masks, keeps)``.

    ``masks`` are ``(folder, tmpfs options)``: each folder is covered with an empty
    tmpfs in the sandbox's mount namespace (the fresh folders, the temp root, the
    runtime folders of Jupyter and of the user, the records' home: where every
    session keeps its sockets, connection files and records). ``keeps`` are the
    paths beneath a mask that the sandbox needs as they are (the workspace, the
    private and generation folders, the interpreter when it lives under the temp
    root; ``keep``: the session's runtime folder with its call socket, and its own
    hidden files, which stay there and unreadable, so a cell that tries is told it is
    confined); init binds each back at its own path, so every path in the ruleset
    means what it meant.

    A path that *is* a mask is not bound back (a pool's standby may write beneath the
    temp root: it gets a fresh one), and a mask that holds no path is simply empty.
    """
    masks: dict[str, str] = {}
    runtime = [p for p in (os.environ.get("XDG_RUNTIME_DIR", ""), f"/run/user/{os.getuid()}")
               if p and os.path.isabs(p)]
    from .._paths import records_home

    for folder in (*FRESH, tempfile.gettempdir(), *_jupyter_runtime(), *runtime,
                   str(records_home())):
        real = _real(folder)
        if real != "/" and os.path.isdir(real) and real not in masks:
            masks[real] = _SHM_OPTIONS if real == _real("/dev/shm") else _FOLDER_OPTIONS
    wanted = [*policy.writable, *policy.readable, *policy.readable_files,
              *(_real(p) for p in keep)]
    keeps = [p for p in dict.fromkeys(wanted)
             if p not in masks and any(_under(p, m) for m in masks) and os.path.exists(p)]
    return sorted(masks.items()), keeps


def _jupyter_runtime() -> list[str]:
    try:
        from jupyter_core.paths import jupyter_runtime_dir
        return [jupyter_runtime_dir()]
    except Exception:  # noqa: BLE001 - jupyter_core missing or misconfigured: nothing to cover
        return []
