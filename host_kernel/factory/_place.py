"""Where the kernel factory lives, and whether it is wanted: its folder, its socket, its
settings read from the environment.

Owns the factory's folder (the user's runtime folder, else a folder of the user's own
beneath /tmp; a folder another user could have made or could enter is refused), the
names of the files in it (keyed by the interpreter and installation, so two
installations never share a factory), and the ``HOST_KERNEL_FACTORY*`` variables.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import stat
import sys
import tempfile
from pathlib import Path

from .._errors import HostKernelError
from .._version import __version__

__all__ = ["FactoryUnavailable", "Place", "disabled", "idle_seconds", "size"]

#: ``off`` (or 0, no, false): never use a kernel factory, never start one.
FACTORY_ENV = "HOST_KERNEL_FACTORY"
#: The folder the factory's socket, lock and log live in (default: see :func:`folder`).
DIR_ENV = "HOST_KERNEL_FACTORY_DIR"
#: Seconds the factory waits with no session attached before it exits (default 300).
IDLE_ENV = "HOST_KERNEL_FACTORY_IDLE"
#: How many standby kernels the factory keeps started (default 2).
SIZE_ENV = "HOST_KERNEL_FACTORY_SIZE"

DEFAULT_IDLE = 300.0
DEFAULT_SIZE = 2
#: This installation's package folder (its code is what a factory must share with a Host).
ROOT = str(Path(__file__).resolve().parents[2])


class FactoryUnavailable(HostKernelError):
    """The factory cannot be used here (its folder is unsafe, or it is turned off)."""


def disabled() -> str | None:
    """Why the factory is not to be used, from the environment; None when it is."""
    value = os.environ.get(FACTORY_ENV, "").strip().lower()
    if value in ("off", "0", "no", "false"):
        return f"{FACTORY_ENV}={os.environ[FACTORY_ENV]} turns the kernel factory off"
    return None


def idle_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get(IDLE_ENV, DEFAULT_IDLE)))
    except ValueError:
        return DEFAULT_IDLE


def size() -> int:
    try:
        return max(1, int(os.environ.get(SIZE_ENV, DEFAULT_SIZE)))
    except ValueError:
        return DEFAULT_SIZE


def identity(folder: Path | None = None) -> dict[str, str]:
    """What a Host and its factory must share: the interpreter, and the package's code as
    it is now, by content (an edited or upgraded package is another factory's: a standby
    started from older code would run it; the same code checked out and installed, as a
    test run from a checkout and the kernelspec it installed have it, is the same). With
    the factory's ``folder``, the content's hash is remembered there for the next process
    (:func:`_fingerprint`)."""
    return {"python": interpreter(), "version": __version__, "code": _fingerprint(folder)}


def interpreter() -> str:
    """This interpreter, named so that the names one installation has for it agree: its
    folder resolved, then the file it runs (``venv/bin/python`` and ``venv/bin/python3``,
    the console scripts' shebang, are one; two virtual environments over one base
    interpreter are two, since their folders differ)."""
    real = os.path.realpath(sys.executable)
    return os.path.join(os.path.realpath(os.path.dirname(sys.executable)),
                        os.path.basename(real))


#: The package's files' stat fingerprint → their content's hash, for this process.
_CONTENT: dict[str, str] = {}


def _private(folder: Path) -> bool:
    """Whether ``folder`` is a folder of this user's that no one else may enter."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _fingerprint(folder: Path | None = None) -> str:
    """The package's files (and the compiled tracer's), hashed by content; computed once
    per process for as long as their names, sizes and change times stay (about 5 ms once,
    1 ms after). With the factory's ``folder`` (private to the user), once per such
    stat fingerprint at all: each launch of the kernelspec or ``exec`` asks for it, and
    reading every file would be a fifth of the launch's own cost (a changed file has
    another size or change time, which the file system sets, so another fingerprint)."""
    files = []
    top = os.path.join(ROOT, "host_kernel")
    for where, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        files += [os.path.join(where, n) for n in sorted(names) if n.endswith((".py", ".so"))]
    spec = importlib.util.find_spec("_host_kernel_notify")  # the compiled tracer, top level
    if spec is not None and spec.origin:
        files.append(spec.origin)
    stats = hashlib.sha256()
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            continue
        stats.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n".encode())
    key = stats.hexdigest()
    remembered = None
    if key not in _CONTENT and folder is not None and _private(folder):
        remembered = folder / f"code-{key[:32]}"
        try:
            with open(remembered, encoding="ascii") as f:
                value = f.read(64).strip()
            if len(value) == 16 and all(c in "0123456789abcdef" for c in value):
                _CONTENT[key] = value
        except (OSError, UnicodeDecodeError):
            pass
    if key not in _CONTENT:
        content = hashlib.sha256()
        for path in files:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            name = os.path.relpath(path, top) if path.startswith(top) else os.path.basename(path)
            content.update(f"{name}\0{len(data)}\0".encode() + data)
        _CONTENT[key] = content.hexdigest()[:16]
        if remembered is not None:
            tmp = remembered.with_name(f"{remembered.name}.{os.getpid()}.tmp")
            try:
                with open(tmp, "w", encoding="ascii") as f:
                    f.write(_CONTENT[key] + "\n")
                os.replace(tmp, remembered)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
    return _CONTENT[key]


class Place:
    """The factory's folder and the paths in it, for this user and installation."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder if folder is not None else default_folder()
        #: This process's installation, as its factory must match it.
        self.identity = ident = identity(self.folder)
        key = hashlib.sha256("\0".join(ident.values()).encode()).hexdigest()[:12]
        self.socket = self.folder / f"factory-{key}.sock"
        self.lock = self.folder / f"factory-{key}.lock"
        self.log = self.folder / f"factory-{key}.log"

    def ensure(self) -> None:
        """Make the folder (mode 0700) if missing, and check it is this user's alone: a
        folder someone else owns or may enter could hold a socket they serve."""
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(self.folder)
        except OSError as exc:
            raise FactoryUnavailable(f"cannot make the factory's folder {self.folder}: "
                                     f"{exc.strerror}") from exc
        if not stat.S_ISDIR(st.st_mode):
            raise FactoryUnavailable(f"{self.folder} is not a folder (a symlink?)")
        if st.st_uid != os.getuid():
            raise FactoryUnavailable(f"{self.folder} belongs to another user")
        if st.st_mode & 0o077:
            raise FactoryUnavailable(f"{self.folder} may be entered by other users "
                                     f"(mode {stat.S_IMODE(st.st_mode):o})")


def default_folder() -> Path:
    """``$HOST_KERNEL_FACTORY_DIR``, else ``$XDG_RUNTIME_DIR/host-kernel``, else
    ``/tmp/host-kernel-<uid>``. Every one of these lies beneath a folder the sandbox's
    private view covers (the user's runtime folder, the temp root), so no confined
    kernel sees the socket (host_kernel/sandbox/policy.py ``view_of``)."""
    given = os.environ.get(DIR_ENV)
    if given:
        return Path(given)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / "host-kernel"
    base = tempfile.gettempdir()
    if len(base) > 64:  # a socket path must fit in 107 bytes
        base = "/tmp"
    return Path(base) / f"host-kernel-{os.getuid()}"
