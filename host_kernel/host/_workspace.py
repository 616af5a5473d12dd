"""The workspace: resolving paths that cell code names, reading and hashing files, and
writing files atomically.

Owns the rule of where the kernel's file API may reach: a relative path that
resolves (symlinks followed) inside the workspace root and outside the record
folder. A file is read or hashed by opening the resolved path once, folder by
folder from the root with no symlink followed (a folder swapped for a symlink
after resolving is refused, ``symlink_refused``), never blocking, and only when
it is a regular file (a FIFO, device or socket is refused, ``not_regular_file``);
the bytes hashed are the bytes used. It does not decide what gets recorded; the
Host does.
"""

from __future__ import annotations

import ctypes
import hashlib
import operator
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path, PurePosixPath

from .._errors import BadArguments, FileProblem, HostCallError, PathRefused, StorageError
from ..store.blobs import open_beneath, open_regular

__all__ = ["SETTLED_NS", "SKIPPED_FOLDERS", "OpenStamps", "Workspace", "WrittenFile",
           "birth_ns", "cached_hash", "cached_sha256", "changed_since", "ctime_clock_ns",
           "file_sha256",
           "settled", "snapshot", "stat_key"]

MAX_PATH_CHARS = 4096


def _real_folder(path: str) -> str | None:
    """The folder ``path`` names, every symlink on the way resolved, as ``realpath``
    would give it: one ``O_PATH`` open in the Host and the name /proc gives that
    descriptor (a ``realpath`` is an ``lstat`` per part). None when it is no folder now,
    or /proc does not say."""
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    finally:
        os.close(fd)
    return real if real.startswith("/") and not real.endswith(" (deleted)") else None


@dataclass(frozen=True, slots=True)
class WrittenFile:
    path: str
    sha256: str
    size: int


class Workspace:
    """A root folder and the record folder that must stay out of reach inside it."""

    def __init__(self, root: str | Path, record_dir: str | Path) -> None:
        self.root = Path(os.path.realpath(root))
        self.record = Path(os.path.realpath(record_dir))
        #: What the tracer saw at the opens of the reads shaped last (host/_trace.py).
        self.stamps = OpenStamps()

    # -- resolving

    def resolve(self, path: object, *, what: str = "path") -> Path:
        """The real absolute path for a workspace-relative ``path``, or PathRefused."""
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            raise BadArguments(f"{what} must be a str (a workspace-relative path), "
                               f"not {type(path).__name__}")
        if not path or "\x00" in path or len(path) > MAX_PATH_CHARS:
            raise BadArguments(f"{what} must be a non-empty path without NUL bytes, "
                               f"at most {MAX_PATH_CHARS} characters")
        pure = PurePosixPath(path)
        if pure.is_absolute() or os.path.isabs(path):
            raise PathRefused(f"{path!r} is absolute; give a path relative to the workspace "
                              f"({self.root})")
        if ".." in pure.parts:
            raise PathRefused(f"{path!r} contains '..'; paths must stay inside the workspace")
        real = Path(os.path.realpath(self.root / pure))
        if not self.contains(real):
            raise PathRefused(f"{path!r} resolves to {real}, outside the workspace (a symlink "
                              f"leads out)")
        if self.in_record(real):
            raise PathRefused(f"{path!r} is inside the record folder, which cell code may "
                              f"not touch")
        return real

    def contains(self, real: Path) -> bool:
        return real == self.root or self.root in real.parents

    def in_record(self, real: Path) -> bool:
        return real == self.record or self.record in real.parents

    def relative(self, real: Path) -> str:
        return real.relative_to(self.root).as_posix()

    def cwd_for(self, cwd: object) -> Path:
        """The absolute cwd a command runs in: the kernel's cwd, which must be in the workspace."""
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise BadArguments("cwd must be an absolute path string")
        real_s = _real_folder(cwd)
        if real_s is not None:
            root, record = str(self.root), str(self.record)
            if (real_s == root or real_s.startswith(root + "/")) and not (
                    real_s == record or real_s.startswith(record + "/")):
                return Path(real_s)
        # Outside, in the record, missing or not a folder: said as each is found.
        real = Path(os.path.realpath(cwd))
        if not self.contains(real):
            raise PathRefused(f"the kernel's working directory {cwd} is outside the workspace "
                              f"({self.root}); os.chdir back into it first")
        if self.in_record(real):
            raise PathRefused("the kernel's working directory is inside the record folder")
        if not real.is_dir():
            raise FileProblem(f"the working directory {cwd} does not exist")
        return real

    # -- reading and writing

    def open_file(self, path: object, *, what: str = "path") -> tuple[str, BufferedReader]:
        """(workspace-relative path, the open file) for a regular file cell code names.

        Resolved by :meth:`resolve`, then opened once from the root without
        following a symlink (:func:`~host_kernel.store.blobs.open_beneath`) and
        without blocking. Refuses with FileProblem (``file_problem``: missing or a
        directory; ``not_regular_file``: a FIFO, device or socket) or PathRefused
        (``symlink_refused``: a folder on the way was swapped for a symlink).
        Read and hash the returned file: it is the one that was checked.
        """
        real = self.resolve(path, what=what)
        if real == self.root or real.is_dir():
            raise FileProblem(f"{path!r} is a directory, not a file")
        rel = self.relative(real)
        try:
            return rel, open_beneath(self.root, rel, label=repr(path))
        except FileNotFoundError:
            raise FileProblem(f"{path!r} does not exist in the workspace") from None
        except HostCallError:
            raise
        except OSError as exc:
            raise FileProblem(f"cannot read {path!r}: {exc.strerror}") from None

    def read_bytes(self, path: object) -> tuple[str, bytes]:
        """(workspace-relative path, its bytes), read through :meth:`open_file`."""
        rel, f = self.open_file(path)
        try:
            with f:
                return rel, f.read()
        except OSError as exc:
            raise FileProblem(f"cannot read {path!r}: {exc.strerror}") from None

    def write_bytes(self, path: object, data: bytes) -> WrittenFile:
        """Write atomically: a temp file in the target folder, fsync, rename."""
        return self.write_stream(path, (data,))

    def write_stream(self, path: object, chunks: Iterable[bytes]) -> WrittenFile:
        """Write ``chunks`` to ``path`` atomically (a temp file in the target folder,
        fsync, rename), hashing as they are written, so a caller streaming a large body
        never holds it. A stream that fails part way leaves nothing behind."""
        real = self.resolve(path)
        if real == self.root or real.is_dir():
            raise FileProblem(f"{path!r} is a directory; give a file path")
        parent = real.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise FileProblem(f"a parent of {path!r} exists and is not a directory") from None
        except OSError as exc:
            raise StorageError(f"cannot create the folder for {path!r}: {exc.strerror}") from None
        # mkdir may have followed a symlink planted between the checks: look again.
        if not self.contains(Path(os.path.realpath(parent))):
            raise PathRefused(f"{path!r}: its folder leads outside the workspace")
        try:
            mode = stat.S_IMODE(real.stat().st_mode)
        except OSError:
            mode = 0o644
        digest = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{real.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, real)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            if isinstance(exc, OSError):
                raise StorageError(f"cannot write {path!r}: {exc.strerror}; nothing was "
                                   f"changed") from None
            raise
        return WrittenFile(self.relative(real), digest.hexdigest(), size)


def _open_for_hash(path: Path, follow_symlinks: bool, root: Path | None) -> BufferedReader:
    if root is None:
        return open_regular(path, follow_symlinks=follow_symlinks)
    root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(path))
    if real != root and root not in real.parents:
        raise PathRefused(f"{path} resolves outside {root}")
    return open_beneath(root, real.relative_to(root).as_posix())


def file_sha256(path: Path, *, follow_symlinks: bool = True,
                root: Path | None = None) -> str | None:
    """sha256 of a regular file's bytes; None when it is missing or is not a regular file.

    Never blocks: a FIFO, device or socket gives None without being read. With
    ``root`` (a real path), ``path`` must resolve inside it and is opened from
    it with no symlink followed (:func:`~host_kernel.store.blobs.open_beneath`);
    without, ``follow_symlinks`` says whether a symlink at the last component is
    followed (an executable on PATH often is one).
    """
    try:
        with _open_for_hash(path, follow_symlinks, root) as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except (OSError, HostCallError):
        return None


#: (size, mtime_ns, ctime_ns, inode): what must all stay equal for a cached hash to hold.
#: ctime cannot be set by a process (os.utime changes it too), so restoring a file's
#: mtime after changing its bytes does not fool the cache, once the file has settled
#: (:func:`settled`).
FileStat = tuple[int, int, int, int]
#: path → (its stat key, its sha256, the wall-clock ns just before that key was taken).
#: Only a settled file's hash is put in (:func:`settled`).
HashCache = dict[str, tuple[FileStat, str, int]]

#: How long (ns) after a file's change time a stat key must have been taken for a hash
#: under it to be remembered: the coarsest clock we expect a workspace's file system to
#: stamp change times with (a jiffy of 1 to 10 ms, a 4 ms tick), with room to spare.
#: A change time is read from that clock, so a rewrite in the same tick as the key's
#: change time (same size, the modification time put back with ``os.utime``) leaves the
#: key as it was; any change made after this long gets a change time of its own, which
#: no process can set back, and the cached key no longer matches.
SETTLED_NS = 50_000_000


#: Linux's coarse wall clock (``CLOCK_REALTIME_COARSE``, which Python's time module does
#: not name): the one file systems stamp change times with.
_CLOCK_REALTIME_COARSE = 5


def ctime_clock_ns() -> int:
    """The wall clock as the file system reads it for change times (the coarse one, up
    to a tick behind ``time.time_ns()``): a file changed after this reading has a change
    time at or after it, and one whose change time is earlier was last changed before.
    A change made in the same tick just before the reading may be stamped at it too: a
    comparison against it can take a file changed up to one tick (4 ms here) early for
    one changed after, never the other way round."""
    return time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)


def settled(ctime_ns: int, taken_ns: int) -> bool:
    """Whether a file whose change time was ``ctime_ns`` had settled by ``taken_ns`` (the
    wall clock read *before* the stat that gave that change time): only then may a hash
    taken under its key be remembered, since a later change moves the change time.

    A hash of a file not settled is still good for the answer it was taken for; it is
    just not cached (the next look hashes again). A change time in the future (a clock
    stepped back, a remote file system) is not settled either."""
    return taken_ns - ctime_ns >= SETTLED_NS


#: Files up to this size are hashed from one read.
_SMALL = 1 << 20


def stat_key(st: os.stat_result) -> FileStat:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class OpenStamps:
    """The stamps of the reads the tracer's log shaped last: each read file's stat key as
    the sandbox's init saw it at the open (host/_trace.py puts them), for the Host's own
    code that is handed those reads next (the input keeper, lineage).

    A stamp equal to the key a cached hash was taken under means the read found those
    very bytes: that hash is the read's, and nothing is looked at. A stamp is only ever
    compared with a cached key, never put in the cache, and every cached key is settled
    (:func:`settled`): the file held the hashed bytes under that key from the end of the
    clock tick of its change time on. Only a read made within that tick (the stamp is a
    stat init takes just before the open) may have found other bytes under the same key,
    the in-tick limit docs/lineage.md states for every stamp.
    The stamps are handed over with the list of reads they were taken for, and
    :meth:`for_reads` gives them only to a caller holding that list's own items (the same
    objects, first, in order): a caller with other reads (the kernel's audit hook's, a
    command's, a stale cell's) gets none and looks at the files itself.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reads: list[str] = []
        self._stamps: dict[str, FileStat] = {}

    def put(self, reads: list[str], stamps: dict[str, FileStat]) -> None:
        with self._lock:
            self._reads, self._stamps = reads, stamps

    def for_reads(self, reads: Sequence[object]) -> dict[str, FileStat]:
        """The stamps put with ``reads``' first items (the very objects); else none."""
        with self._lock:
            mine, stamps = self._reads, self._stamps
        if not stamps or len(reads) < len(mine) or not all(
                map(operator.is_, mine, reads)):
            return {}
        return stamps


def cached_sha256(root: Path, rel: str, cache: HashCache,
                  known: FileStat | None = None) -> str | None:
    """sha256 of a workspace file, re-hashed only when its stat key changed
    (:func:`cached_hash`, without the key)."""
    found = cached_hash(root, rel, cache, known)
    return None if found is None else found[1]


def cached_hash(root: Path, rel: str, cache: HashCache,
                known: FileStat | None = None) -> tuple[FileStat, str] | None:
    """(the stat key, the sha256) of a workspace file, re-hashed only when its stat key
    changed; None when it is missing, not a regular file, or leads out of ``root``.

    ``known`` is a stat key the caller just took (a snapshot's); when the cache
    holds a hash for exactly that key, nothing is opened. Otherwise the file is
    opened once, inside ``root`` with no symlink followed and never blocking
    (None for anything but a regular file inside ``root``), its key is taken
    from the open descriptor and the hash from the same descriptor's bytes; it
    is cached only if the key did not change while it was read and the file had
    settled before it (:func:`settled`). The key returned is the one the bytes
    were hashed under (its size, theirs), cached or not; for a file that changed while
    it was read, the key after (so it matches no stamp taken before the read).
    """
    hit = cache.get(rel)
    if hit is not None:
        if known is None:
            # The warm path: one stat. A key equal to the cached one is the same file
            # (inode, size, change time): even reached through a swapped folder, the
            # bytes are those that were hashed.
            try:
                known = stat_key(os.stat(os.path.join(root, rel), follow_symlinks=False))
            except OSError:
                return None
        if hit[0] == known:
            return hit[0], hit[1]
    try:
        # Most paths have no symlink on their way: opened as named, with none followed.
        f = open_beneath(root, rel)
    except PathRefused:
        f = None  # a symlink (or ".."): resolved, and hashed at its target if that is inside
    except (OSError, HostCallError):
        return None
    if f is None:
        try:
            f = _open_for_hash(Path(os.path.join(root, rel)), False, root)
        except (OSError, HostCallError):
            return None
    with f:
        try:
            taken = time.time_ns()
            key = stat_key(os.fstat(f.fileno()))
            if hit is not None and hit[0] == key:
                return hit[0], hit[1]
            # A small file in one read (file_digest allocates a 256 KiB buffer per call).
            sha = (hashlib.sha256(f.read()).hexdigest() if key[0] <= _SMALL
                   else hashlib.file_digest(f, "sha256").hexdigest())
            after = stat_key(os.fstat(f.fileno()))
            if after == key and settled(key[2], taken):
                cache[rel] = (key, sha, taken)
        except OSError:
            return None
    # Changed while it was read: the key after, which matches no stamp taken before.
    return after, sha


_libc = ctypes.CDLL(None, use_errno=True)
_statx = getattr(_libc, "statx", None)
_STATX_BTIME = 0x800
_AT_SYMLINK_NOFOLLOW = 0x100


def birth_ns(path: str) -> int | None:
    """When the file at ``path`` (not followed) was created, in wall-clock ns; None where
    the file system or the C library does not say (statx(2), ``STATX_BTIME``)."""
    if _statx is None:
        return None
    buf = ctypes.create_string_buffer(256)
    if _statx(-100, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, _STATX_BTIME, buf) != 0:
        return None
    if not int.from_bytes(buf.raw[0:4], "little") & _STATX_BTIME:
        return None
    sec = int.from_bytes(buf.raw[80:88], "little", signed=True)
    return sec * 1_000_000_000 + int.from_bytes(buf.raw[88:92], "little")


#: Folders a workspace walk never enters, and whose files are never a command's change.
SKIPPED_FOLDERS = (".git", "__pycache__")


def _walk(root: Path, skip: Path) -> Iterator[os.DirEntry[str]]:
    """Every regular file under root (symlinks not followed), outside ``skip`` and
    :data:`SKIPPED_FOLDERS`."""

    def walk(folder: str) -> Iterator[os.DirEntry[str]]:
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.path == str(skip) or entry.name in SKIPPED_FOLDERS:
                    continue
                yield from walk(entry.path)
            elif entry.is_file(follow_symlinks=False):
                yield entry

    yield from walk(str(root))


def snapshot(root: Path, skip: Path, limit: int = 20_000) -> tuple[dict[str, FileStat], bool]:
    """(relative path → its stat key) for regular files under root, and a truncated flag."""
    found: dict[str, FileStat] = {}
    prefix = len(str(root)) + 1
    for entry in _walk(root, skip):
        if len(found) >= limit:
            return found, True
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        found[entry.path[prefix:].replace(os.sep, "/")] = stat_key(st)
    return found, False


def changed_since(root: Path, skip: Path, since_ns: int,
                  limit: int = 200_000) -> tuple[dict[str, FileStat], bool]:
    """The regular files under root whose change time (which no process can set back) is
    at or after ``since_ns`` (wall clock), with a flag when the walk stopped at ``limit``
    files; what :func:`snapshot` skips is skipped."""
    found: dict[str, FileStat] = {}
    prefix = len(str(root)) + 1
    for seen, entry in enumerate(_walk(root, skip)):
        if seen >= limit:
            return found, True
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_ctime_ns >= since_ns:
            found[entry.path[prefix:].replace(os.sep, "/")] = stat_key(st)
    return found, False
