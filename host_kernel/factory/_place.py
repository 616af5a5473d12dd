"""Where the kernel factory lives, and whether it is wanted: its folder, its socket, its
settings read from the environment.

Owns the factory's folder (the user's runtime folder, else a folder of the user's own
beneath /tmp; a folder another user could have made or could enter is refused), the
names of the files in it (keyed by the interpreter and installation, so two
installations never share a factory), and the ``HOST_KERNEL_FACTORY*`` variables.
"""

from __future__ import annotations

import importlib.machinery
import os
import stat
import sys

from .._errors import HostKernelError
from .._version import __version__

# The kernelspec's launching process computes a Place before it asks the zygote: this
# module imports neither pathlib, tempfile nor hashlib (OpenSSL's) for it, which were a
# fifth of that process's start in an installed package. Paths are strings here; the
# Path attributes are made when another process reads them.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - for type checkers and readers
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

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
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def _sha256(data: bytes = b"") -> Any:
    """A sha256 hasher: the interpreter's built-in one (no OpenSSL to load), else
    hashlib's."""
    global _SHA256
    if _SHA256 is None:
        for name in ("_sha2", "_sha256"):  # Python 3.12 and later, then 3.11
            try:
                _SHA256 = __import__(name).sha256
                break
            except ImportError:
                continue
        else:
            import hashlib

            _SHA256 = hashlib.sha256
    return _SHA256(data)


_SHA256: Any = None


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


def identity(folder: str | os.PathLike[str] | None = None) -> dict[str, str]:
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


def _private(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` is a folder of this user's that no one else may enter."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _fingerprint(folder: str | os.PathLike[str] | None = None) -> str:
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
    # The compiled tracer, a top-level module on the import path.
    spec = importlib.machinery.PathFinder.find_spec("_host_kernel_notify")
    if spec is not None and spec.origin:
        files.append(spec.origin)
    stats = _sha256()
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            continue
        stats.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n".encode())
    key = stats.hexdigest()
    remembered = None
    if key not in _CONTENT and folder is not None and _private(folder):
        remembered = os.path.join(folder, f"code-{key[:32]}")
        try:
            with open(remembered, encoding="ascii") as f:
                value = f.read(64).strip()
            if len(value) == 16 and all(c in "0123456789abcdef" for c in value):
                _CONTENT[key] = value
        except (OSError, UnicodeDecodeError):
            pass
    if key not in _CONTENT:
        content = _sha256()
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
            tmp = f"{remembered}.{os.getpid()}.tmp"
            try:
                with open(tmp, "w", encoding="ascii") as f:
                    f.write(_CONTENT[key] + "\n")
                os.replace(tmp, remembered)
            except OSError:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
    return _CONTENT[key]


class Place:
    """The factory's folder and the paths in it, for this user and installation."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        #: The folder, as a string (:attr:`folder` is it as a Path).
        self.path = os.fspath(folder) if folder is not None else _default_folder()
        #: This process's installation, as its factory must match it.
        self.identity = ident = identity(self.path)
        key = _sha256("\0".join(ident.values()).encode()).hexdigest()[:12]
        #: The names of the factory's socket, lock and log in the folder.
        self.socket_name = f"factory-{key}.sock"
        self.lock_name = f"factory-{key}.lock"
        self.log_name = f"factory-{key}.log"

    @property
    def folder(self) -> Path:
        from pathlib import Path

        return Path(self.path)

    @property
    def socket(self) -> Path:
        return self.folder / self.socket_name

    @property
    def lock(self) -> Path:
        return self.folder / self.lock_name

    @property
    def log(self) -> Path:
        return self.folder / self.log_name

    def ensure(self) -> None:
        """Make the folder (mode 0700) if missing, and check it is this user's alone: a
        folder someone else owns or may enter could hold a socket they serve."""
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            st = os.lstat(self.path)
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
    from pathlib import Path

    return Path(_default_folder())


def _default_folder() -> str:
    given = os.environ.get(DIR_ENV)
    if given:
        return given
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return os.path.join(runtime, "host-kernel")
    base = temp_root()
    if len(base) > 64:  # a socket path must fit in 107 bytes
        base = "/tmp"
    return os.path.join(base, f"host-kernel-{os.getuid()}")


def temp_root(probe: Callable[[str], bool] | None = None) -> str:
    """``tempfile.gettempdir()``, which the sandbox's private view hides: from tempfile
    itself once it is imported, else found as it finds it (without importing it and
    the modules it brings), and remembered there for this process.

    Its rule: the first of ``$TMPDIR``, ``$TEMP``, ``$TMP`` (those set), ``/tmp``,
    ``/var/tmp``, ``/usr/tmp`` and the working folder, made absolute, in which a new
    file can be made and written. ``probe`` decides that instead (tests)."""
    module = sys.modules.get("tempfile")
    if module is not None:
        return str(module.gettempdir())
    global _TEMP_ROOT
    if _TEMP_ROOT is not None and probe is None:
        return _TEMP_ROOT
    places = [value for value in (os.environ.get(name) for name in ("TMPDIR", "TEMP", "TMP"))
              if value]
    places += ["/tmp", "/var/tmp", "/usr/tmp"]
    try:
        places.append(os.getcwd())
    except OSError:
        places.append(os.curdir)
    for place in places:
        folder = place if place == os.curdir else os.path.abspath(place)
        if (probe or _writable)(folder):
            if probe is None:
                _TEMP_ROOT = folder
            return folder
    raise FileNotFoundError(f"no usable temporary folder among {places}")


#: What :func:`temp_root` found in this process, before tempfile was imported.
_TEMP_ROOT: str | None = None


def _writable(folder: str) -> bool:
    """Whether a new file can be made in ``folder`` and written (then removed)."""
    for _ in range(100):
        name = os.path.join(folder, f"tmp{os.urandom(6).hex()}")
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        except OSError:
            return False
        try:
            os.write(fd, b"blat")
        except OSError:
            return False
        finally:
            os.close(fd)
            try:
                os.unlink(name)
            except OSError:
                pass
        return True
    return False
