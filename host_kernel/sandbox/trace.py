"""File access observed at the OS level: a seccomp filter and its supervisor.

Owns the two halves of tracing, both below the kernel's reach:

* :func:`install_filter`, run by each confined child between Landlock and
  ``execve`` (host_kernel/sandbox/init.py): a seccomp-BPF filter that hands
  the file system calls that move bytes (``open``, ``openat``, ``openat2``,
  ``creat``, ``execve``, ``execveat``, ``rename*``, ``link*``, ``unlink*``,
  ``truncate``) to a *user-space supervisor* and lets every other call run at
  full speed. It returns the filter's listener descriptor, which the child
  passes to init before it execs. The filter is inherited by every thread and
  process the child starts (multiprocessing workers, ``subprocess``, a shell's
  pipeline) and can never be removed. ``io_uring_setup`` (which could open
  files without a system call) fails with ``ENOSYS``; a system call made
  through another architecture's entry (``int 0x80``, x32) fails likewise.
* :class:`Supervisor`, run inside init (trusted, outside the Landlock domain):
  reads each notification, reads the path from the caller's memory through
  ``/proc/PID/mem``, resolves a relative path against the caller's working
  folder (or the ``dirfd`` it passed) *while the caller is stopped in the
  call*, keeps the access when it falls under one of the session's roots, and
  lets the call continue. Each access is stamped with ``CLOCK_MONOTONIC`` when
  it is seen; since the caller waits until then, an access made by a cell is
  always stamped before that cell's reply reaches the Host. For a ``host.bash``
  command (any source but the kernel's) it also records, at the first call that
  may change a path (open for writing, ``O_TRUNC``/``O_CREAT``, ``creat``,
  ``truncate``, either end of a rename, both ends of a link, a removal), the
  path's *before-state*: whether it existed, its type, size, times and inode,
  and for a regular file of at most :data:`HASH_LIMIT` bytes (one name only),
  the sha256 of its bytes, read by init while the caller is still stopped.
  With ``stamp_reads`` (init asks for it), each read (``open`` for reading,
  ``execve``) is also *stamped* with the file's stat key as the call would find
  it (size, modification and change time, inode; symlinks followed): the Host
  then knows which bytes the read found without looking at the file again
  (host/_trace.py, docs/lineage.md "Hashes").

Why seccomp user notification rather than ptrace or fanotify (measured,
docs/lineage.md): a notification costs one ``ioctl`` to receive and one to
answer, with no ``waitpid``/register traffic and no second stop at the
call's exit; children are covered by inheritance, with no attach race; and if
the supervisor dies every traced call fails (``ENOSYS``) instead of running
unseen. Unprivileged fanotify hides the pid of the process that made an
access, so it cannot tell the kernel from a ``host.bash`` command.

A notification's arguments are read while the caller waits, but another
thread of the caller could rewrite the path between that read and the
kernel's own (seccomp_unotify(2)): the observation is then the path shown,
not the path opened. docs/lineage.md lists this among the limits.

The common call, an open for reading, is served in C when the compiled module
``_host_kernel_notify`` (host_kernel/sandbox/_notify.c, built by ``pip install``)
is there: it does what :meth:`Supervisor.serve` does for such a call, on the
Supervisor's own state, and hands every other call back unanswered. Without it,
or with ``HK_TRACE_SUPERVISOR=python`` in init's environment (the Host strips
``HOST_KERNEL_*`` names from the kernel's, which init inherits), everything is
served here; :attr:`Supervisor.implementation` says which.

Kept import-light (it is on init's path): ``ctypes``, ``fcntl``, ``struct``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import stat
import struct
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["HASH_BUDGET", "HASH_LIMIT", "NATIVE_ABI", "SUPERVISOR_ENV", "Supervisor",
           "install_filter", "native", "unavailable"]

#: ``python`` in init's environment: serve every call in Python, even where the compiled
#: module is installed (a test runs both). Not ``HOST_KERNEL_*``: the Host strips those.
SUPERVISOR_ENV = "HK_TRACE_SUPERVISOR"
#: The protocol this module speaks with ``_host_kernel_notify`` (its ``ABI``).
NATIVE_ABI = 1

# Access kinds, as recorded: (t_ns, source, kind, path[, path2]); with stamps, a READ or
# EXEC is (t_ns, source, kind, path, stamp), stamp (size, mtime_ns, ctime_ns, inode) or None.
READ, WRITE, READ_WRITE, EXEC, RENAME, LINK, REMOVE = "r", "w", "rw", "x", "mv", "ln", "rm"
#: Kinds that may change a path: each path's first one per command records its before-state.
_MODIFYING = frozenset([WRITE, READ_WRITE, RENAME, LINK, REMOVE])
#: A regular file up to this size is hashed at its first modifying call (about 55 ms for
#: 64 MiB here, the caller waiting; docs/receipts.md); a larger one is recorded unhashed.
HASH_LIMIT = 64 << 20
#: Bytes hashed for one command, at most; past it, before-states are recorded unhashed.
HASH_BUDGET = 1 << 30
#: Before-state types: missing, regular file, folder, symlink, other, unknown (unreadable,
#: or changed while it was hashed).
MISSING, FILE, FOLDER, SYMLINK, OTHER, UNKNOWN = "-", "f", "d", "l", "o", "?"

_SECCOMP_SET_MODE_FILTER = 1
_FLAG_NEW_LISTENER = 1 << 3
_RET_ALLOW = 0x7FFF0000
_RET_USER_NOTIF = 0x7FC00000
_RET_ERRNO = 0x00050000
_PR_SET_NO_NEW_PRIVS = 38
_USER_NOTIF_FLAG_CONTINUE = 1
# _IOWR('!', 0, struct seccomp_notif) and friends (uapi/linux/seccomp.h).
_NOTIF_RECV = 0xC0502100
_NOTIF_SEND = 0xC0182101
_NOTIF_ID_VALID = 0x40082102
_NOTIF_SET_FLAGS = 0x40082104
#: Linux 6.6+: wake the supervisor, and then the caller, on the waking CPU (no cross-CPU
#: wake-up per call; measured in docs/lineage.md).
_FD_SYNC_WAKE_UP = 1
_NOTIF_SIZE = 80
_ZEROS = bytes(_NOTIF_SIZE)
_AT_FDCWD = -100
#: The shared counter's layout (one unsigned 64-bit integer).
_COUNT = struct.Struct("<Q")
_AT_REMOVEDIR = 0x200
_O_ACCMODE, _O_WRONLY, _O_RDWR, _O_CREAT, _O_TRUNC = 3, 1, 2, 0o100, 0o1000
_O_PATH = 0o10000000
_HASH_FLAGS = (os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)

# (audit arch, seccomp syscall number, {name: number}) per machine.
_X86_64 = (0xC000003E, 317, {
    "open": 2, "creat": 85, "openat": 257, "openat2": 437, "execve": 59, "execveat": 322,
    "rename": 82, "renameat": 264, "renameat2": 316, "link": 86, "linkat": 265,
    "unlink": 87, "unlinkat": 263, "rmdir": 84, "truncate": 76, "chdir": 80, "fchdir": 81,
    "io_uring_setup": 425, "open_by_handle_at": 304})
_AARCH64 = (0xC00000B7, 277, {
    "openat": 56, "openat2": 437, "execve": 221, "execveat": 281, "renameat": 38,
    "renameat2": 276, "linkat": 37, "unlinkat": 35, "truncate": 45, "chdir": 49,
    "fchdir": 50, "io_uring_setup": 425, "open_by_handle_at": 265})
_ARCH = {"x86_64": _X86_64, "aarch64": _AARCH64}.get(platform.machine())
#: Calls that would open files unseen: refused (ENOSYS, as if the kernel lacked them).
_REFUSED = ("io_uring_setup", "open_by_handle_at")


def unavailable() -> str | None:
    """Why tracing cannot work here, or None when it can."""
    if os.environ.get("HOST_KERNEL_FAKE_NO_TRACE") == "1":
        return "tracing switched off by HOST_KERNEL_FAKE_NO_TRACE=1 (a test switch)"
    if _ARCH is None:
        return f"OS-level tracing knows x86_64 and aarch64 only; this is {platform.machine()}"
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail") as fh:
            actions = fh.read().split()
    except OSError as exc:
        return f"this kernel has no seccomp ({exc})"
    if "user_notif" not in actions:
        return f"this Linux kernel ({os.uname().release}) lacks seccomp user notification"
    return None


def _program() -> bytes:
    """The BPF filter: other architectures and x32 refused, file calls notified."""
    assert _ARCH is not None
    audit_arch, _, numbers = _ARCH
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    notify = [n for name, n in numbers.items() if name not in _REFUSED]
    refused = [numbers[name] for name in _REFUSED]
    enosys = _RET_ERRNO | errno.ENOSYS
    prog: list[tuple[int, int, int, int]] = [
        (ld, 0, 0, 4),                    # arch
        (jeq, 1, 0, audit_arch),
        (ret, 0, 0, enosys),
        (ld, 0, 0, 0),                    # nr
    ]
    if audit_arch == _X86_64[0]:
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, enosys)]  # the x32 ABI
    # Each test jumps to the matching return at the end: notified calls to the
    # second to last instruction, refused ones to the third, others fall through.
    tests = notify + refused
    for i, nr in enumerate(tests):
        left = len(tests) - i - 1  # tests after this one
        if nr in refused:
            prog.append((jeq, left + 2, 0, nr))
        else:
            prog.append((jeq, left + 1, 0, nr))
    prog += [(ret, 0, 0, _RET_ALLOW), (ret, 0, 0, _RET_USER_NOTIF), (ret, 0, 0, enosys)]
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


_libc = ctypes.CDLL(None, use_errno=True)


def install_filter() -> int:
    """Install the filter on the calling (single-threaded) process; return its listener."""
    if _ARCH is None:
        raise OSError(errno.ENOSYS, "no seccomp numbers for this machine")
    code = _program()
    buf = ctypes.create_string_buffer(code, len(code))
    prog = struct.pack("<HxxxxxxQ", len(code) // 8, ctypes.addressof(buf))
    fprog = ctypes.create_string_buffer(prog, len(prog))
    _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    fd = _libc.syscall(_ARCH[1], _SECCOMP_SET_MODE_FILTER, _FLAG_NEW_LISTENER, fprog)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {os.strerror(err)}")
    return int(fd)


def native() -> Callable[[Any, int], Any] | None:
    """The compiled fast path's ``serve`` (``_host_kernel_notify``), or None: not built, of
    another ABI, or switched off by :data:`SUPERVISOR_ENV`.

    init runs with ``-I -S``: the folder an install puts the module in (the site-packages
    of this interpreter's virtual environment, or of its installation) is not on its path,
    so it is looked for there too, and taken off the path again once imported."""
    if os.environ.get(SUPERVISOR_ENV) == "python":
        return None
    try:
        import _host_kernel_notify as module  # type: ignore[import-not-found]
    except ImportError:
        module = None
        venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
        for prefix in (venv, sys.exec_prefix):
            where = os.path.join(prefix, sys.platlibdir,
                                 f"python{sys.version_info[0]}.{sys.version_info[1]}",
                                 "site-packages")
            if prefix == venv and not os.path.exists(os.path.join(venv, "pyvenv.cfg")):
                continue
            if where in sys.path or not os.path.isdir(where):
                continue
            sys.path.append(where)
            try:
                import _host_kernel_notify as module
                break
            except ImportError:
                continue
            finally:
                sys.path.remove(where)
        if module is None:
            return None
    if getattr(module, "ABI", None) != NATIVE_ABI:
        return None
    serve: Callable[[Any, int], Any] = module.serve
    return serve


class Supervisor:
    """Serves the listeners of one sandbox and keeps what they saw under ``roots``.

    ``accesses`` holds ``(t_ns, source, kind, path[, path2])`` tuples until
    :meth:`take`; ``source`` is the one given to :meth:`add` for the listener
    (0 for the kernel's tree, a command's pid for a ``host.bash`` command).
    The same access seen again before a collection is kept once more, with the
    latest time it was seen (so it falls in the right cell's window); at most
    ``limit`` distinct accesses are held, and past it ``dropped`` counts the rest.
    With ``stamp_reads``, a READ or EXEC tuple ends with its *stamp*: the file's
    ``(size, mtime_ns, ctime_ns, inode)`` from a ``stat`` taken while the caller
    waits, just before its open runs (None when there is nothing to stat); a read
    seen again carries the stamp of its latest sighting.
    ``counter``, a shared 8-byte buffer (the Host maps the same memory), counts every
    access kept or dropped so far: the Host skips asking when nothing new was seen.

    ``before`` holds, until :meth:`take_before`, one before-state per (command, real
    path): ``(seq, source, path, type, size, mtime_ns, ctime_ns, inode, sha256)``,
    taken at the command's first call that may change the path, with symlinks followed
    as that call follows them; ``seq`` orders them. ``type`` is one of :data:`MISSING`,
    :data:`FILE`, :data:`FOLDER`, :data:`SYMLINK`, :data:`OTHER`, :data:`UNKNOWN`;
    ``sha256`` is None unless a regular file with one name, of at most
    :data:`HASH_LIMIT` bytes (and within the command's :data:`HASH_BUDGET`), was hashed
    unchanged. A command's paths are remembered until its listener is removed, so a
    later collection never holds a second "first" state. The kernel's tree (source 0)
    gets none.
    """

    def __init__(self, roots: list[str], limit: int = 200_000, counter: Any = None,
                 resolve: tuple[str, ...] | list[str] = (), *,
                 stamp_reads: bool = False, compiled: bool = True) -> None:
        """``compiled``: serve opens for reading through :func:`native` when it is there."""
        self.stamp_reads = stamp_reads
        self._native = native() if compiled else None
        #: "c" when the compiled module serves opens for reading, else "python".
        self.implementation = "python" if self._native is None else "c"
        self.roots = tuple(r.rstrip("/") + "/" for r in roots if r)
        #: Folders outside the roots where a path may lead into them: those confined code
        #: can write (a symlink planted there) and /proc (``/proc/self/cwd/data.csv``). A
        #: path under one is resolved, as the caller would resolve it, before it is judged.
        self.resolve = tuple(r.rstrip("/") + "/" for r in [*resolve, "/proc"] if r)
        self.counter = counter
        self.seen = 0
        #: (source, kind, path[, path2]) -> its entry in ``accesses``, and its latest
        #: sighting since (the whole tuple: time, key[, stamp]).
        self._index: dict[tuple[Any, ...], int] = {}
        self._last: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._tid = 0  # the caller of the notification being read
        self.sources: dict[int, int] = {}  # listener fd -> source
        self.accesses: list[tuple[Any, ...]] = []
        self.dropped = 0
        self.limit = limit
        self._mem: dict[int, int] = {}  # tid -> /proc/tid/mem descriptor
        #: tid -> its working folder, read once and kept until some thread changes folder.
        self._cwd: dict[int, str] = {}
        #: Threads whose chdir was let through but may not have happened yet: while any
        #: is here, nothing is cached (another thread could read the old folder and keep
        #: it). A thread leaves when its next call is seen, which its chdir came before.
        self._moving: set[int] = set()
        assert _ARCH is not None
        self._names = {n: name for name, n in _ARCH[2].items()}
        self._buf = bytearray(_NOTIF_SIZE)
        self.before: list[tuple[Any, ...]] = []
        self._seq = 0
        #: source -> real paths whose before-state is taken; names known to be real paths
        #: (a name that led through a symlink is resolved again at each call).
        self._done: dict[int, set[str]] = {}
        self._named: dict[int, set[str]] = {}
        self._hashed: dict[int, int] = {}  # source -> bytes hashed so far
        self._chunk: bytearray | None = None
        self._unpack = struct.Struct("<QIIiIQ6Q").unpack_from
        self._resp = struct.Struct("<QqiI").pack

    def keep_under(self, roots: list[str], resolve: list[str]) -> None:
        """The session's folders, once a standby sandbox is handed out (none before)."""
        self.roots = tuple(r.rstrip("/") + "/" for r in roots if r)
        self.resolve = tuple(r.rstrip("/") + "/" for r in [*resolve, "/proc"] if r)

    def add(self, listener: int, source: int) -> None:
        self.sources[listener] = source
        try:
            fcntl.ioctl(listener, _NOTIF_SET_FLAGS, _FD_SYNC_WAKE_UP)  # by value
        except OSError:
            pass  # before Linux 6.6: slower, as correct

    def remove(self, listener: int) -> None:
        source = self.sources.pop(listener, None)
        if source is not None:
            os.close(listener)
            if source not in self.sources.values():
                for seen in (self._done, self._named, self._hashed):
                    seen.pop(source, None)

    def close(self) -> None:
        for fd in list(self.sources):
            self.remove(fd)
        for fd in self._mem.values():
            os.close(fd)
        self._mem.clear()

    def take(self) -> tuple[list[tuple[Any, ...]], int]:
        """Everything seen since the last take, and how many were dropped."""
        out, dropped = self.accesses, self.dropped
        out += self._last.values()
        self.accesses, self.dropped = [], 0
        self._index.clear()
        self._last.clear()
        return out, dropped

    def take_before(self) -> list[tuple[Any, ...]]:
        """The before-states recorded since the last take (see the class docstring)."""
        out, self.before = self.before, []
        return out

    def serve(self, listener: int) -> bool:
        """Handle one notification on ``listener``; False when it has no more callers."""
        if self._native is not None:
            # An open for reading is served there; any other call comes back unanswered.
            got = self._native(self, listener)
            if got is True or got is False:
                return bool(got)
            nid, tid, nr, a0, a1, a2, a3, a4 = got
        else:
            buf = self._buf
            buf[:] = _ZEROS
            try:
                fcntl.ioctl(listener, _NOTIF_RECV, buf, True)
            except OSError as exc:
                # ENOENT: the caller went away before it was read; EINTR: try again later.
                return exc.errno in (errno.ENOENT, errno.EINTR)
            nid, tid, _, nr, _, _, a0, a1, a2, a3, a4, _ = self._unpack(buf)
        try:
            self._note(self.sources.get(listener, -1), tid, self._names.get(nr), a0, a1, a2,
                       a3, a4)
        except OSError:
            pass  # memory unreadable (the caller died): nothing to keep
        finally:
            try:
                fcntl.ioctl(listener, _NOTIF_SEND, self._resp(nid, 0, 0,
                                                              _USER_NOTIF_FLAG_CONTINUE))
            except OSError:
                pass  # it was killed meanwhile
        return True

    # -- reading the call

    def _note(self, source: int, tid: int, name: str | None, a0: int, a1: int, a2: int,
              a3: int, a4: int) -> None:
        self._tid = tid
        if self._moving:
            self._moving.discard(tid)
        if name in ("openat", "openat2"):
            path = self._path(tid, a0, a1)
            flags = a2 if name == "openat" else self._u64(tid, a2)
            self._keep(source, _open_kind(flags), path)
        elif name == "open":
            self._keep(source, _open_kind(a1), self._path(tid, _AT_FDCWD, a0))
        elif name == "creat":
            self._keep(source, WRITE, self._path(tid, _AT_FDCWD, a0))
        elif name == "execve":
            self._keep(source, EXEC, self._path(tid, _AT_FDCWD, a0))
            self._forget(tid)
        elif name == "execveat":
            self._keep(source, EXEC, self._path(tid, a0, a1))
            self._forget(tid)
        elif name in ("rename", "link"):
            self._keep(source, RENAME if name == "rename" else LINK,
                       self._path(tid, _AT_FDCWD, a0), self._path(tid, _AT_FDCWD, a1))
        elif name in ("renameat", "renameat2", "linkat"):
            self._keep(source, LINK if name == "linkat" else RENAME,
                       self._path(tid, a0, a1), self._path(tid, a2, a3))
        elif name in ("unlink", "rmdir"):
            self._keep(source, REMOVE, self._path(tid, _AT_FDCWD, a0))
        elif name == "unlinkat":
            self._keep(source, REMOVE, self._path(tid, a0, a1))
        elif name == "truncate":
            self._keep(source, WRITE, self._path(tid, _AT_FDCWD, a0))
        elif name in ("chdir", "fchdir"):
            self._cwd.clear()
            self._moving.add(tid)

    def _resolved(self, path: str, follow: bool) -> str:
        """``path`` with its symlinks followed as the caller would follow them: all of
        them for an open, all but the last for a rename, link or remove (which act on
        the name itself)."""
        if path.startswith(("/proc/self/", "/proc/thread-self/")):
            path = f"/proc/{self._tid}/" + path.split("/", 3)[3]
        try:
            if follow:
                return os.path.realpath(path)
            head, _, name = path.rpartition("/")
            return os.path.realpath(head or "/").rstrip("/") + "/" + name
        except (OSError, ValueError):
            return path

    def _keep(self, source: int, kind: str, path: str | None, path2: str | None = None) -> None:
        if path is None:
            return
        if path.startswith(self.resolve):
            path = self._resolved(path, kind in (READ, WRITE, READ_WRITE, EXEC))
        if path2 is not None and path2.startswith(self.resolve):
            path2 = self._resolved(path2, False)
        if not path.startswith(self.roots) and not (
                path2 is not None and path2.startswith(self.roots)):
            return
        if source and kind in _MODIFYING:
            # Before the call runs (its caller waits): the state it may change.
            self._before(source, path, kind in (WRITE, READ_WRITE))
            if path2 is not None:
                self._before(source, path2, False)
        key = (source, kind, path) if path2 is None else (source, kind, path, path2)
        if self.stamp_reads and kind in (READ, EXEC):
            entry: tuple[Any, ...] = (time.monotonic_ns(), *key, _stamp(path))
        else:
            entry = (time.monotonic_ns(), *key)
        if key in self._index:
            # Seen before this collection: keep the first and the latest only (a cell
            # that reads one file a million times holds two entries, not a million).
            self._last[key] = entry
        elif len(self.accesses) >= self.limit:
            self.dropped += 1
        else:
            self._index[key] = len(self.accesses)
            self.accesses.append(entry)
        self.bump()

    def _before(self, source: int, path: str, follow: bool) -> None:
        """Record ``path``'s before-state for ``source`` unless its first is recorded."""
        named = self._named.setdefault(source, set())
        if path in named:
            return
        real = self._resolved(path, follow)
        if real == path and len(named) < self.limit:
            named.add(path)
        if not real.startswith(self.roots):
            return
        done = self._done.setdefault(source, set())
        if real in done:
            return
        if len(self.before) >= self.limit or len(done) >= self.limit:
            self.dropped += 1  # the Host then walks, and a file with no state backs nothing
            return
        done.add(real)
        self._seq += 1
        self.before.append((self._seq, source, real, *self._state(source, real)))

    def _state(self, source: int, path: str) -> tuple[Any, ...]:
        """(type, size, mtime_ns, ctime_ns, inode, sha256 or None) of ``path`` now."""
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return (MISSING, 0, 0, 0, 0, None)
        except (OSError, ValueError):
            return (UNKNOWN, 0, 0, 0, 0, None)
        mode = st.st_mode
        kind = (FILE if stat.S_ISREG(mode) else FOLDER if stat.S_ISDIR(mode)
                else SYMLINK if stat.S_ISLNK(mode) else OTHER)
        sha = None
        if kind == FILE and st.st_nlink == 1 and st.st_size <= HASH_LIMIT and (
                self._hashed.get(source, 0) + st.st_size <= HASH_BUDGET):
            # One name only: bytes written through another name (a hard link made before
            # the command, never seen) could change while they are read.
            try:
                sha = self._hash(path, st)
            except OSError:
                kind = UNKNOWN
            self._hashed[source] = self._hashed.get(source, 0) + st.st_size
        return (kind, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, sha)

    def _hash(self, path: str, st: os.stat_result) -> str:
        """sha256 of the regular file ``st`` describes, read through a descriptor of its
        own (no symlink followed, never blocking); OSError when it is not that file or
        changed while read."""
        import hashlib  # only a command that writes pays for the import

        if self._chunk is None:
            self._chunk = bytearray(1 << 20)
        view = memoryview(self._chunk)
        fd = os.open(path, _HASH_FLAGS)
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (
                    st.st_dev, st.st_ino):
                raise OSError(errno.ESTALE, "replaced")
            digest = hashlib.sha256()
            left = HASH_LIMIT + 1
            while left > 0:
                got = os.readv(fd, [view[:min(left, len(view))]])
                if not got:
                    break
                digest.update(view[:got])
                left -= got
            now = os.fstat(fd)
        finally:
            os.close(fd)
        if left <= 0 or (now.st_size, now.st_mtime_ns, now.st_ctime_ns) != (
                st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            raise OSError(errno.ESTALE, "changed while read")
        return digest.hexdigest()

    def bump(self) -> None:
        """Say in the shared counter that there is something new to collect."""
        self.seen += 1
        if self.counter is not None:
            _COUNT.pack_into(self.counter, 0, self.seen)

    def _mem_fd(self, tid: int) -> int:
        fd = self._mem.get(tid)
        if fd is None:
            if len(self._mem) > 256:
                for old in list(self._mem)[:128]:
                    os.close(self._mem.pop(old))
            fd = self._mem[tid] = os.open(f"/proc/{tid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        return fd

    def _forget(self, tid: int) -> None:
        self._cwd.pop(tid, None)
        fd = self._mem.pop(tid, None)
        if fd is not None:
            os.close(fd)

    def _read(self, tid: int, addr: int, size: int) -> bytes:
        for attempt in (0, 1):
            try:
                data = os.pread(self._mem_fd(tid), size, addr)
            except OSError:
                data = b""
            if data or attempt:
                return data
            self._forget(tid)  # a stale descriptor (exec, or a reused tid): open again
        return b""

    def _u64(self, tid: int, addr: int) -> int:
        data = self._read(tid, addr, 8)
        return struct.unpack("<Q", data)[0] if len(data) == 8 else 0

    def _path(self, tid: int, dirfd: int, addr: int) -> str | None:
        if not addr:
            return None
        size = 4096 - addr % 4096
        data = self._read(tid, addr, size)
        end = data.find(b"\0")
        if end < 0 and len(data) == size:
            data += self._read(tid, addr + size, 4096)
            end = data.find(b"\0")
        if end < 0:
            return None
        raw = os.fsdecode(data[:end])
        if raw[:1] != "/":
            dirfd &= 0xFFFFFFFF
            try:
                if dirfd == _AT_FDCWD & 0xFFFFFFFF:
                    base = self._cwd.get(tid)
                    if base is None:
                        base = os.readlink(f"/proc/{tid}/cwd")
                        if not self._moving:
                            self._cwd[tid] = base
                else:
                    base = os.readlink(f"/proc/{tid}/fd/{dirfd}")
            except OSError:
                return None
            raw = base + "/" + raw
        if "/.." in raw and not raw.startswith("/proc/"):
            # ".." after a symlink leads from the symlink's target, as the kernel goes:
            # resolve the folders rather than cancel names on paper.
            head, _, name = raw.rpartition("/")
            if name in (".", ".."):
                return os.path.realpath(raw)
            return os.path.realpath(head or "/").rstrip("/") + "/" + name
        if "/." in raw or "//" in raw:
            raw = os.path.normpath(raw)
        return raw


def _stamp(path: str) -> tuple[int, int, int, int] | None:
    """The stat key of the file an open of ``path`` would find now (symlinks followed, as
    the open follows them), or None when there is none (the open will fail or create it)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _open_kind(flags: int) -> str:
    if flags & _O_PATH:
        return READ  # no bytes move through it; the other flags are ignored (open(2))
    mode = flags & _O_ACCMODE
    if mode == _O_WRONLY:
        return WRITE
    if mode == _O_RDWR:
        return WRITE if flags & _O_TRUNC else READ_WRITE
    if flags & _O_TRUNC:
        return WRITE
    # Read-only, creating the file if missing: a write when its change time says so.
    return READ_WRITE if flags & _O_CREAT else READ
