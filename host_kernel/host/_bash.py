"""Running ``host.bash`` commands in the Host, and the receipt each one leaves.

Owns the process side: ``bash -c`` in its own process group, the kernel's cwd
and environment, output streamed back as it arrives and stored whole (redacted)
in the blob store, the timeout enforced on the whole group, the executable the
first word resolves to, and the workspace files the command changed. It returns
the receipt body; the Host records it. Which files the command changed is
host/_changes.py's to find.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

from .._errors import HostCallError
from ..sandbox.client import ConfinedProcess, Sandbox, SandboxError, popen_confined
from ..store.blobs import RACY_NS, FileBlobStore, Stamp, open_regular, stamp
from ._changes import MAX_CHANGES, Found, after_snapshot, after_trace, before_snapshot
from ._direct import direct_argv
from ._redact import Redactor
from ._workspace import FileStat, HashCache, Workspace, ctime_clock_ns

__all__ = ["CommandContext", "ExecutableCache", "Redactor", "kill_group", "resolve_executable",
           "run_command"]

TAIL_CHARS = 2_000
#: After bash exits, how long to keep reading pipes that a background child holds open.
PIPE_GRACE = 1.0


@dataclass(frozen=True, slots=True)
class CommandContext:
    """What the Host knows about the session when it runs a command."""

    cell_id: str
    generation: int
    workspace: Workspace
    blobs: FileBlobStore
    launch_env: Mapping[str, str]
    redactor: Redactor
    #: Variables ipykernel sets in its own process; not "changed by the user".
    ignore_env: frozenset[str] = frozenset()
    #: The Host's stat-keyed hash cache, shared with lineage.
    hash_cache: HashCache = field(default_factory=dict)
    #: Called with the process once it has started (the Host tracks it per cell).
    on_start: Callable[[Any], None] | None = None
    #: The kernel generation's sandbox: commands start confined, inside it. None: unconfined.
    sandbox: Sandbox | None = None
    #: The generation's tracer (host/_trace.py): a command's changes are those its own
    #: processes made, and its reads are seen. None: untraced.
    trace: Any = None
    #: The session's remembered PATH lookups and executables' hashes (checked at each use).
    executables: ExecutableCache | None = None
    #: Whether confined code reads the same file at a real path as the Host does (the
    #: session's ``Policy.may_read``); None unconfined, where the kernel sees what it sees.
    #: A file it cannot is never looked at for a receipt, hashed or exec'd directly.
    sees: Callable[[str], bool] | None = None


def last_command(command: str, cwd: Path) -> tuple[str, Path]:
    """The last command of an ``&&`` chain, and the directory earlier ``cd X`` steps lead to."""
    segments = [seg.strip() for seg in command.split("&&")]
    here = cwd
    for seg in segments[:-1]:
        words = _words(seg, strict=True)
        if len(words) == 2 and words[0] == "cd":
            here = Path(os.path.realpath(here / os.path.expanduser(words[1])))
    return segments[-1], here


def shadowed_modules(command: str, cwd: Path) -> list[str]:
    """Modules run with ``-m`` that a file or package in the working directory would shadow."""
    words = _words(command)
    found = []
    for i, word in enumerate(words[:-1]):
        if word == "-m":
            top = words[i + 1].split(".")[0]
            if top and ((cwd / f"{top}.py").exists() or (cwd / top).is_dir()):
                found.append(top)
    return found


#: Commands up to this length have their words remembered (an agent repeats its commands).
_WORDS_KEPT = 4096


def _words(command: str, strict: bool = False) -> tuple[str, ...]:
    """The command's words as ``shlex`` splits them (comments honoured); when its quoting
    is broken, plain whitespace splitting, or with ``strict`` an empty tuple."""
    if len(command) <= _WORDS_KEPT:
        return _split_kept(command, strict)
    return _split(command, strict)


def _split(command: str, strict: bool) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(command, comments=True))
    except ValueError:
        return () if strict else tuple(command.split())


_split_kept = lru_cache(maxsize=512)(_split)


def resolve_executable(command: str, cwd: Path, path_env: str,
                       cache: ExecutableCache | CallLookups | None = None) -> str | None:
    """The file the command's first word runs, as bash would find it; None for builtins.

    ``cache`` remembers PATH lookups and checks each remembered one before it is used."""
    words = _words(command)
    while words and "=" in words[0] and not words[0].startswith("="):
        name = words[0].split("=", 1)[0]
        if not name.isidentifier():
            break
        words = words[1:]
    if not words:
        return None
    first = words[0]
    if "/" in first:
        candidate = (cwd / first) if not os.path.isabs(first) else Path(first)
        # Only a file bash could run (as which asks of a PATH entry): the receipt's hash
        # of it must not tell a cell what any other file the Host can read holds.
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)) or (
                isinstance(cache, CallLookups) and not cache.sees(str(candidate))):
            return None
        return str(Path(os.path.realpath(candidate)))
    if first in _BASH_ONLY_BUILTINS:
        return None
    found = (shutil.which(first, path=path_env) if cache is None
             else cache.which(first, path_env))
    if found is None:
        return None
    if not os.path.isabs(found):
        found = str(cwd / found)
    return os.path.realpath(found)


_BASH_ONLY_BUILTINS = frozenset(
    ["cd", "exit", "export", "unset", "set", "source", ".", "alias", "eval", "exec", "return",
     "shift", "trap", "wait", "read", "declare", "local", "readonly", "let", "type", "hash",
     "ulimit", "umask", "builtin", "command"]
)


#: Lookups and hashes one cache holds at most; past it, it starts again empty.
_CACHE_ENTRIES = 1024
#: What a name's stat says about it, as ``shutil.which`` weighs it: which file, its type
#: and permission bits, and its change time (which a chmod or an ACL change moves).
_Mark = tuple[int, int, int, int] | None


def _mark(path: str) -> _Mark:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_mode, st.st_ctime_ns)


class ExecutableCache:
    """PATH lookups and executables' hashes, remembered for one kernel generation and
    checked before every use, so a receipt names the file bash runs now, and its bytes.

    A lookup (``shutil.which`` of a name on a PATH) is kept with the stat of each place
    the name was looked for, in PATH's order, up to the one where it was found (every
    place when it was not): whether something is there, which file, its type and
    permission bits, its change time. Those are everything ``which`` weighs, so a file
    put earlier on PATH, one removed, renamed, replaced, made executable or not, or a
    symlink on the way that now leads elsewhere, makes a remembered lookup stale, and it
    is looked up again. One ``stat`` per place, as ``which`` itself makes, without its
    Python per folder.

    A hash is kept by the file's device, inode, size, modification and change time, all
    taken from the descriptor its bytes were read through (a file swapped in for the
    read is not credited to the name); a process can set a file's modification time
    back, never its change time. Nothing is kept whose change time is within
    :data:`RACY_NS` of the look (a change in the same clock tick would not move it).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation: int | None = None
        #: (name, PATH) -> (the places looked, with their marks; what which returned)
        self._found: dict[tuple[str, str], tuple[tuple[tuple[str, _Mark], ...], str | None]] = {}
        #: real path -> (its stamp, its sha256)
        self._hashes: dict[str, tuple[Stamp, str]] = {}

    def generation(self, generation: int) -> None:
        """A new kernel generation forgets what the last one looked up."""
        with self._lock:
            if generation != self._generation:
                self._generation = generation
                self._found.clear()
                self._hashes.clear()

    def which(self, name: str, path_env: str) -> str | None:
        """``shutil.which(name, path=path_env)``, from memory when every mark still holds."""
        key = (name, path_env)
        with self._lock:
            kept = self._found.get(key)
        if kept is not None and all(_mark(place) == mark for place, mark in kept[0]):
            return kept[1]
        now = time.time_ns()
        looked: list[tuple[str, _Mark]] = []
        seen: set[str] = set()
        for folder in path_env.split(os.pathsep):
            if folder in seen:
                continue
            seen.add(folder)
            place = os.path.join(folder, name)
            looked.append((place, _mark(place)))
        found = shutil.which(name, path=path_env)
        if found is not None:
            looked = looked[:next((i + 1 for i, (place, _) in enumerate(looked)
                                   if place == found), len(looked))]
        # Marked before the lookup; kept only when it still holds after it and no change
        # time is too recent to trust.
        if all(mark is None or mark[3] < now - RACY_NS for _, mark in looked) and all(
                _mark(place) == mark for place, mark in looked):
            with self._lock:
                if len(self._found) >= _CACHE_ENTRIES:
                    self._found.clear()
                self._found[key] = (tuple(looked), found)
        return found

    def sha256(self, path: str) -> str | None:
        """sha256 of the regular file at ``path`` (symlinks followed); None when there is
        none. Read again only when its stamp moved."""
        with self._lock:
            kept = self._hashes.get(path)
        if kept is not None:
            try:
                if stamp(os.stat(path)) == kept[0]:
                    return kept[1]
            except (OSError, ValueError):
                return None
        now = time.time_ns()
        try:
            with open_regular(path, follow_symlinks=True) as f:
                before = stamp(os.fstat(f.fileno()))
                sha = hashlib.file_digest(f, "sha256").hexdigest()
                after = stamp(os.fstat(f.fileno()))
        except (OSError, ValueError, HostCallError):
            return None
        if before == after and after[4] < now - RACY_NS:
            with self._lock:
                if len(self._hashes) >= _CACHE_ENTRIES:
                    self._hashes.clear()
                self._hashes[path] = (after, sha)
        return sha

    def for_call(self, generation: int,
                 sees: Callable[[str], bool] | None = None) -> CallLookups:
        """This cache as one ``host.bash`` call of ``generation`` uses it; ``sees`` as
        :attr:`CommandContext.sees`."""
        self.generation(generation)
        return CallLookups(self, sees)


class CallLookups:
    """One call's PATH lookups and hashes: each lookup made once, through the
    generation's :class:`ExecutableCache` (the receipt's executable, the line exec'd
    without bash and the file the confined child execs are found by one lookup).

    A file the confined kernel cannot see (``sees``) is not found: the Host looks in its
    own view, which holds the temp root, the records and other sessions, and a receipt
    must not tell a cell what is there (its hash, its real path, that it exists)."""

    __slots__ = ("_cache", "_found", "_sees")

    def __init__(self, cache: ExecutableCache,
                 sees: Callable[[str], bool] | None = None) -> None:
        self._cache = cache
        self._found: dict[tuple[str, str], str | None] = {}
        self._sees = sees

    def sees(self, path: str) -> bool:
        """Whether the kernel reads the file at ``path`` (resolved here) as the Host does."""
        return self._sees is None or self._sees(os.path.realpath(path))

    def which(self, name: str, path_env: str) -> str | None:
        key = (name, path_env)
        if key not in self._found:
            found = self._cache.which(name, path_env)
            self._found[key] = found if found is None or self.sees(found) else None
        return self._found[key]

    def sha256(self, path: str) -> str | None:
        return self._cache.sha256(path)


#: sha256 of no bytes: the digest of an empty output.
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class _Stream:
    """One output pipe: decode for streaming, redact, and spool to a temp file hashing.

    The spool is made when the first bytes come: most commands leave one stream empty,
    and an empty one is the empty blob, with no file made or removed for it."""

    def __init__(self, name: str, ctx: CommandContext) -> None:
        self.name = name
        self.redactor = ctx.redactor
        self.blobs = ctx.blobs
        self.tmp: str | None = None
        self.file: BinaryIO | None = None
        self.hasher = hashlib.sha256()
        self.size = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.tail = ""

    def feed(self, data: bytes) -> tuple[bytes, str]:
        """``data`` redacted, and its text to stream; :meth:`spool` then keeps the bytes.
        Two steps, so the text reaches the cell before the disk is touched: the spool's
        file is made at the first bytes, and a file system busy flushing (another
        process's ``fsync``) can hold that for a second or more."""
        data = self.redactor.data(data)
        text = self.decoder.decode(data)
        self.tail = (self.tail + text)[-TAIL_CHARS:]
        return data, text

    def spool(self, data: bytes) -> None:
        if self.file is None:
            fd, self.tmp = tempfile.mkstemp(dir=self.blobs.tmp,
                                            prefix=self.blobs.temp_prefix(self.name))
            self.file = os.fdopen(fd, "wb")
        self.file.write(data)
        self.hasher.update(data)
        self.size += len(data)

    def finish(self, blobs: FileBlobStore) -> str:
        """The stream's blob digest, its spool committed (an empty stream's blob is the
        caller's to make sure of: :func:`_empty_blob`)."""
        tail = self.decoder.decode(b"", final=True)
        self.tail = (self.tail + tail)[-TAIL_CHARS:]
        if self.file is None or self.tmp is None:
            return _EMPTY_SHA256
        self.file.close()
        digest = self.hasher.hexdigest()
        if blobs.stored(digest):
            os.unlink(self.tmp)
        else:
            # Same commit path as any blob: the spool already holds the bytes.
            blobs._commit(self.tmp, digest, self.size)
        return digest


def _empty_blob(blobs: FileBlobStore) -> None:
    """The empty blob, stored once: what an empty output's digest names."""
    if not blobs.stored(_EMPTY_SHA256):
        blobs.put_bytes(b"")


def _env_changes(env: Mapping[str, str], launch: Mapping[str, str],
                 ignore: frozenset[str]) -> list[str]:
    names = set(env) | set(launch)
    return sorted(n for n in names if n not in ignore and env.get(n) != launch.get(n))


def run_command(command: str, cwd: Path, env: dict[str, str], timeout: float | None,
                ctx: CommandContext, emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run ``bash -c command``; stream its output through ``emit``; return the receipt body."""
    ws = ctx.workspace
    ctx.redactor.learn(env)
    path_env = env.get("PATH", "")
    known = (ExecutableCache() if ctx.executables is None else ctx.executables).for_call(
        ctx.generation, ctx.sees)
    executable = resolve_executable(command, cwd, path_env, known)
    exe_sha = None if not executable else known.sha256(executable)
    # Traced: the command's changes come from what the tracer sees it do, so nothing is
    # walked or hashed before it runs. Untraced (or the tracer already failed): stat the
    # workspace now and compare after.
    traced_run = (ctx.trace is not None and ctx.sandbox is not None
                  and ctx.trace.error is None)
    before = None if traced_run else before_snapshot(ws)
    # The last command of an && chain is the one whose result counts (the verifier's
    # rule); judge its executable and its module shadowing where it really runs.
    last, last_cwd = last_command(command, cwd)
    last_exe = executable if (last, last_cwd) == (command, cwd) else resolve_executable(
        last, last_cwd, path_env, known)
    shadowed = shadowed_modules(last, last_cwd)
    # One plain command is exec'd as bash would exec it, without bash's own start.
    direct = direct_argv(command, str(cwd), env, known.which, known.sees)
    argv, run_env = direct if direct is not None else (["bash", "-c", command], env)
    # The file the confined child execs: the lookup this call already made (direct), or
    # bash's on the command's PATH, through the same checked cache.
    file = run_env["_"] if direct is not None else known.which(
        "bash", run_env.get("PATH", os.defpath))

    started = time.time()
    started_ns = ctime_clock_ns()
    started_mono_ns = time.monotonic_ns()
    t0 = time.monotonic()
    proc: Any
    if ctx.sandbox is not None:
        try:
            proc = popen_confined(ctx.sandbox, argv, cwd=str(cwd), env=run_env, file=file)
        except SandboxError as exc:
            raise HostCallError(f"the command could not start: {exc}; the kernel generation "
                                f"that asked for it has ended", code="sandbox_stopped") from None
    else:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=run_env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
    if ctx.on_start is not None:
        ctx.on_start(proc)
    listening = True
    streams = {proc.stdout: _Stream("stdout", ctx), proc.stderr: _Stream("stderr", ctx)}
    timed_out = False
    deadline = None if timeout is None else t0 + timeout
    exited_at: float | None = None
    try:
        with selectors.DefaultSelector() as sel:
            for pipe in streams:
                assert pipe is not None
                os.set_blocking(pipe.fileno(), False)
                sel.register(pipe, selectors.EVENT_READ)
            while sel.get_map():
                now = time.monotonic()
                if deadline is not None and now >= deadline and not timed_out:
                    timed_out = True
                    kill_group(proc)
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > PIPE_GRACE:
                    break  # a background child holds the pipe; do not wait for it
                wait = 0.1 if deadline is None else max(0.0, min(0.1, deadline - now))
                for key, _ in sel.select(wait):
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    stream = streams[key.fileobj]
                    kept, text = stream.feed(data)
                    if text and listening:
                        try:
                            emit({"stream": stream.name, "text": text})
                        except OSError:
                            # The cell stopped listening (interrupted); keep recording.
                            listening = False
                    stream.spool(kept)
    except BaseException:
        kill_group(proc)  # no receipt can be made (a spool could not be written)
        raise
    try:
        returncode = proc.wait(timeout=None if timed_out else (
            None if deadline is None else max(0.1, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
        returncode = proc.wait()
    if timed_out:
        kill_group(proc)
    for pipe in streams:
        assert pipe is not None
        pipe.close()
    ended = time.time()
    duration = time.monotonic() - t0
    out, err = streams.values()
    out_sha, err_sha = out.finish(ctx.blobs), err.finish(ctx.blobs)
    if _EMPTY_SHA256 in (out_sha, err_sha):
        _empty_blob(ctx.blobs)
    found, traced = _find_changes(ctx, proc, before, started_ns, started_mono_ns)
    manifest_ref = ctx.blobs.put_bytes(
        json.dumps(found.manifest, sort_keys=True, separators=(",", ":")).encode("utf-8"))
    launch_path = ctx.launch_env.get("PATH", "")
    in_ws = any(exe is not None and ws.contains(Path(exe)) for exe in (executable, last_exe))
    return {
        "receipt_id": str(uuid.uuid4()),
        "cell_id": ctx.cell_id,
        "generation": ctx.generation,
        "command": command,
        "cwd": str(cwd),
        "executable": executable,
        "executable_sha256": exe_sha,
        "executable_in_workspace": in_ws,
        "path_env": path_env,
        "path_differs": path_env != launch_path,
        "env_changed": _env_changes(env, ctx.launch_env, ctx.ignore_env),
        "started": started,
        "ended": ended,
        "duration": duration,
        "exit_status": returncode if returncode >= 0 else None,
        "signal": -returncode if returncode < 0 else None,
        "timed_out": timed_out,
        "stdout_sha256": out_sha,
        "stdout_size": out.size,
        "stderr_sha256": err_sha,
        "stderr_size": err.size,
        "stdout_tail": out.tail,
        "stderr_tail": err.tail,
        "changes": found.changes[:MAX_CHANGES],
        "changes_truncated": found.truncated or len(found.changes) > MAX_CHANGES,
        "changes_found_by": found.method,
        "changes_unproven": found.unproven,
        "workspace_manifest_sha256": manifest_ref.sha256,
        "workspace_manifest_files": len(found.manifest),
        "workspace_manifest_scope": "changes",
        "shadowed_modules": shadowed,
        "via": "bash" if direct is None else "exec",
    } | ({"start_error": proc.error} if getattr(proc, "error", None) else {}) | (
        {} if traced is None else {"traced": traced})


def _find_changes(ctx: CommandContext, proc: Any,
                  before: tuple[dict[str, FileStat], bool] | None, started_ns: int,
                  started_mono_ns: int) -> tuple[Found, dict[str, Any] | None]:
    """The command's changes, and the receipt's ``traced`` entry (None: untraced)."""
    ws = ctx.workspace
    trace = ctx.trace
    pid = proc.pid if isinstance(proc, ConfinedProcess) else None
    seen = None
    problem = None
    if trace is not None and pid:
        try:
            seen = trace.for_command(pid, since_ctime_ns=started_ns, since_ns=started_mono_ns)
        except SandboxError as exc:
            problem = f"the tracer did not answer: {exc}"
    if before is not None:
        # Untraced, or the tracer had already failed: every change is kept.
        found = after_snapshot(ws, before[0], before[1], ctx.hash_cache)
        return found, None if seen is None else seen.to_record()
    if not pid and problem is None:
        return Found("traced"), None  # it never started (start_error): nothing ran
    found = after_trace(ws, seen, ctx.hash_cache, started_ns, problem)
    if seen is None:
        return found, None if problem is None else {"error": problem}
    record = seen.to_record()
    if found.reason is not None:
        record["fallback"] = found.reason
    if found.by_others:
        record["changes_by_others"] = found.by_others
    return found, record


def kill_group(proc: Any) -> bool:
    """SIGKILL a command's process group, confined or not. False when it was already gone."""
    if isinstance(proc, ConfinedProcess):
        if proc.poll() is not None:
            return False
        proc.kill_group(signal.SIGKILL)
        return True
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True



