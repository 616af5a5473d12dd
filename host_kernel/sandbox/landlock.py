"""Linux Landlock through its three system calls, with ctypes and nothing else.

Owns the kernel ABI: the syscall numbers, the structures, the access bits and
which ABI version brought each, building a ruleset from paths and enforcing it
on the calling thread. It knows nothing of workspaces or records; the policy
(host_kernel/sandbox/policy.py) decides which paths get which rights.

We call the syscalls directly rather than depend on a binding: the surface is
three calls and two structures, and the available Python bindings either lag
the ABI (no network or scope rights) or pull in a compiler.

Landlock is unprivileged and stackable: a process can only ever add
restrictions, every child inherits them across fork and exec, and a sandboxed
process cannot ptrace or (ABI 6+) signal a process outside its own domain.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

__all__ = [
    "FS_READ",
    "FS_WRITE",
    "LandlockError",
    "Ruleset",
    "abi_version",
    "fs_rights",
    "restrict_self",
]

# x86_64 and aarch64 (asm-generic) share these numbers since Linux 5.13.
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38

# File-system rights (uapi/linux/landlock.h), with the ABI that introduced each.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13       # ABI 2
TRUNCATE = 1 << 14    # ABI 3
IOCTL_DEV = 1 << 15   # ABI 5

#: Network rights (ABI 4): TCP bind and connect.
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1

#: Scopes (ABI 6): abstract Unix sockets and signals stay inside the domain.
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1,
              5: (1 << 16) - 1}

#: What "read" means in a rule: list directories, read and execute files.
FS_READ = EXECUTE | READ_FILE | READ_DIR
#: What "write" means in a rule: everything but making device nodes.
FS_WRITE = (FS_READ | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK
            | MAKE_FIFO | MAKE_SYM | REFER | TRUNCATE)
#: Rights that only make sense on a directory; a rule on a file must not carry them.
_DIR_ONLY = READ_DIR | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK \
    | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM | REFER


class LandlockError(OSError):
    """Landlock is missing, or a call to it failed."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc: ctypes.CDLL | None = None


def _syscall() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fn = _libc.syscall
    fn.restype = ctypes.c_long
    return fn


def _attr_size(abi: int) -> int:
    # Older kernels reject a structure larger than the one they know.
    if abi >= 6:
        return ctypes.sizeof(_RulesetAttr)
    if abi >= 4:
        return 16
    return 8


def abi_version() -> int:
    """The running kernel's Landlock ABI version; 0 when Landlock cannot be used here.

    ``HOST_KERNEL_FAKE_NO_LANDLOCK=1`` makes this return 0: a switch for tests and
    for trying the unconfined path on a machine that has Landlock (docs/security.md).
    """
    if os.environ.get("HOST_KERNEL_FAKE_NO_LANDLOCK") == "1":
        return 0
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "aarch64"):
        return 0
    try:
        version = _syscall()(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                             ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return int(version) if version > 0 else 0


def fs_rights(abi: int) -> int:
    """Every file-system right this ABI can handle (and so deny)."""
    return _FS_BY_ABI.get(min(abi, 5), 0)


class Ruleset:
    """A Landlock ruleset under construction: an fd the kernel holds until enforced."""

    def __init__(self, abi: int, *, network: bool = True, scoped: bool = True) -> None:
        if abi < 1:
            raise LandlockError(errno.EOPNOTSUPP, "Landlock is not available on this system")
        self.abi = abi
        self.handled_fs = fs_rights(abi)
        self.handled_net = (NET_BIND_TCP | NET_CONNECT_TCP) if (abi >= 4 and not network) else 0
        self.scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if (abi >= 6 and scoped) else 0
        attr = _RulesetAttr(self.handled_fs, self.handled_net, self.scoped)
        fd = _syscall()(_SYS_CREATE_RULESET, ctypes.byref(attr),
                        ctypes.c_size_t(_attr_size(abi)), ctypes.c_uint32(0))
        if fd < 0:
            err = ctypes.get_errno()
            raise LandlockError(err, f"landlock_create_ruleset: {os.strerror(err)}")
        self.fd = int(fd)

    def allow(self, path: str, access: int) -> bool:
        """Grant ``access`` beneath ``path``. Returns False when the path does not exist."""
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            if not os.path.isdir(path):
                access &= ~_DIR_ONLY
            access &= self.handled_fs
            if not access:
                return False
            attr = _PathBeneathAttr(access, pfd)
            rc = _syscall()(_SYS_ADD_RULE, ctypes.c_int(self.fd), ctypes.c_int(_RULE_PATH_BENEATH),
                            ctypes.byref(attr), ctypes.c_uint32(0))
            if rc < 0:
                err = ctypes.get_errno()
                raise LandlockError(err, f"landlock_add_rule({path}): {os.strerror(err)}")
        finally:
            os.close(pfd)
        return True


def restrict_self(ruleset_fd: int) -> None:
    """Enforce the ruleset on the calling thread, for good (after no_new_privs)."""
    libc = ctypes.CDLL(None, use_errno=True) if _libc is None else _libc
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise LandlockError(err, f"prctl(NO_NEW_PRIVS): {os.strerror(err)}")
    rc = _syscall()(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset_fd), ctypes.c_uint32(0))
    if rc < 0:
        err = ctypes.get_errno()
        raise LandlockError(err, f"landlock_restrict_self: {os.strerror(err)}")
