"""A generation's bounds on the Host's side: their defaults, and the cgroups that hold them.

Owns :class:`KernelLimits` (memory, processes and open files of one sandbox, with
defaults taken from this machine), where this system lets the Host make cgroups
(:func:`cgroup_homes`: a cgroup v2 folder delegated to it, or a writable cgroup v1
hierarchy), and :class:`Cgroups` (one sandbox's cgroup folders: made, limited,
read for a limit reached, removed). The sandbox's init enforces the rest and
watches (host_kernel/sandbox/world.py ``Limits``).

Where no cgroup can be made, the bounds fall back to rlimits, each recorded with
what enforces it: memory as ``RLIMIT_AS`` of each process (a cell then gets
``MemoryError``; the generation is not ended), processes as the PID namespace's
own ``pid_max`` (Linux 6.14+) and ``RLIMIT_NPROC`` (which binds only a user that
is not root outside), open files as ``RLIMIT_NOFILE`` always.
"""

from __future__ import annotations

import errno
import itertools
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_OPEN_FILES", "MIN_PROCESSES", "Cgroups", "KernelLimits", "cgroup_homes",
           "default_memory", "default_processes"]

#: Open files of each process of a generation, unless raised.
DEFAULT_OPEN_FILES = 65536
#: The fewest processes (and threads) a generation gets by default.
MIN_PROCESSES = 4096
#: A folder the user delegated to the Host (cgroup v2), when its own cgroup is not one.
CGROUP_ENV = "HOST_KERNEL_CGROUP"
#: ``HOST_KERNEL_FAKE_NO_CGROUP=1``: make no cgroup, as where none is delegated (a switch
#: for tests and for trying the rlimit fallback on a machine that has cgroups).
NO_CGROUP_ENV = "HOST_KERNEL_FAKE_NO_CGROUP"


def machine_memory() -> int:
    """Bytes of physical memory on this machine."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 8 * 1024**3


def default_memory() -> int:
    """Three quarters of the machine's memory: the Host and the rest of the machine keep
    the last quarter whatever one generation does."""
    return machine_memory() // 4 * 3


def default_processes() -> int:
    """4096 processes and threads, or an eighth of the machine's ``pid_max`` where that is
    more (it grows with the CPUs): eight runaway generations cannot use up the machine's."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            pid_max = int(f.read())
    except (OSError, ValueError):
        pid_max = 32768
    return max(MIN_PROCESSES, pid_max // 8)


@dataclass(frozen=True, slots=True)
class KernelLimits:
    """What one generation (the kernel and every process it or ``host.bash`` starts) may
    use. Each is a positive int; :meth:`defaults` gives this machine's."""

    #: Bytes of memory, all processes together (a cgroup), else each process's address space.
    memory: int
    #: Processes and threads, all together.
    processes: int
    #: Open files of each process.
    open_files: int

    @classmethod
    def defaults(cls) -> KernelLimits:
        return cls(default_memory(), default_processes(), DEFAULT_OPEN_FILES)

    def to_dict(self) -> dict[str, int]:
        return {"memory": self.memory, "processes": self.processes,
                "open_files": self.open_files}


# ---------------------------------------------------------------------- where cgroups go


def _mounts() -> list[tuple[str, str, str, str]]:
    """(root, mount point, fstype, super options) of every cgroup mount."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                    out.append((fields[3], fields[4], tail[0], tail[2]))
    except OSError:
        pass
    return out


def _own() -> dict[str, str]:
    """This process's cgroup per v1 controller, and "" for cgroup v2."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) == 3:
                    for name in parts[1].split(",") if parts[1] else [""]:
                        out[name] = parts[2]
    except OSError:
        pass
    return out


def _inside_mount(mount: str, root: str, path: str) -> str:
    rel = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
    return os.path.normpath(os.path.join(mount, "" if rel == "." else rel))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _v2_home(controller: str, mounts: list[tuple[str, str, str, str]],
             own: dict[str, str]) -> tuple[str | None, str]:
    unified = [(r, m) for r, m, kind, _ in mounts if kind == "cgroup2"]
    if not unified:
        return None, "no cgroup v2"
    root, mount = unified[0]
    folder = os.environ.get(CGROUP_ENV) or _inside_mount(mount, root, own.get("", "/"))
    if controller not in _read(os.path.join(folder, "cgroup.controllers")).split():
        return None, f"cgroup v2 at {folder} has no {controller} controller"
    if controller not in _read(os.path.join(folder, "cgroup.subtree_control")).split():
        try:  # refused while the folder holds processes (the Host's own), unless it is the root
            with open(os.path.join(folder, "cgroup.subtree_control"), "w") as f:
                f.write(f"+{controller}")
        except OSError as exc:
            return None, (f"cgroup v2 at {folder} does not delegate {controller} to its "
                          f"children ({exc.strerror}); name a delegated folder in {CGROUP_ENV}")
    if not os.access(folder, os.W_OK):
        return None, f"cgroup v2 at {folder} is not writable by the Host"
    return folder, ""


def _v1_home(controller: str, mounts: list[tuple[str, str, str, str]],
             own: dict[str, str]) -> tuple[str | None, str]:
    for root, mount, kind, options in mounts:
        if kind == "cgroup" and controller in options.split(","):
            folder = _inside_mount(mount, root, own.get(controller, "/"))
            if os.path.isdir(folder) and os.access(folder, os.W_OK):
                return folder, ""
            return None, f"cgroup v1 {controller} at {folder} is not writable by the Host"
    return None, f"no cgroup v1 {controller} hierarchy"


_HOMES: tuple[dict[str, tuple[str, bool]], dict[str, str]] | None = None
_HOMES_LOCK = threading.Lock()


def cgroup_homes() -> tuple[dict[str, tuple[str, bool]], dict[str, str]]:
    """Where this Host may make cgroups: ``({controller: (folder, v2)}, {controller: why
    not})`` for ``memory`` and ``pids``; cgroup v2 is preferred (its OOM kills the whole
    group). Looked up once per process."""
    global _HOMES
    if os.environ.get(NO_CGROUP_ENV) == "1":
        off = f"switched off by {NO_CGROUP_ENV}=1 (a test switch)"
        return {}, {"memory": off, "pids": off}
    with _HOMES_LOCK:
        if _HOMES is None:
            mounts, own = _mounts(), _own()
            homes: dict[str, tuple[str, bool]] = {}
            why: dict[str, str] = {}
            for controller in ("memory", "pids"):
                folder, v2_why = _v2_home(controller, mounts, own)
                if folder is not None:
                    homes[controller] = (folder, True)
                    continue
                folder, v1_why = _v1_home(controller, mounts, own)
                if folder is not None:
                    homes[controller] = (folder, False)
                else:
                    why[controller] = f"{v2_why}; {v1_why}"
            _HOMES = (homes, why)
        return _HOMES


# ---------------------------------------------------------------------- one sandbox's


_COUNTER = itertools.count(1)
#: A sandbox's cgroup folder is named ``host-kernel-<the Host's pid>-<n>-<random>``.
_PREFIX = "host-kernel-"
#: Folders whose processes had not all gone when their sandbox was released.
_LEFTOVER: list[str] = []
_LEFTOVER_LOCK = threading.Lock()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _field(text: str, name: str) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


class Cgroups:
    """The cgroup folders of one sandbox, made where :func:`cgroup_homes` allows.

    The launcher joins them before its namespaces (every process of the sandbox is then
    inside); the Host removes them once the sandbox has ended (:meth:`remove`).
    """

    def __init__(self, limits: KernelLimits) -> None:
        self.limits = limits
        #: controller → (folder, v2)
        self.folders: dict[str, tuple[str, bool]] = {}
        homes, why = cgroup_homes()
        #: controller → why it is not a cgroup here (recorded).
        self.why: dict[str, str] = dict(why)
        sweep()
        for home, _ in dict.fromkeys(homes.values()):
            _sweep_dead(home)
        name = f"{_PREFIX}{os.getpid()}-{next(_COUNTER)}-{secrets.token_hex(3)}"
        for controller, (home, v2) in homes.items():
            folder = os.path.join(home, name)
            try:
                if not os.path.isdir(folder):  # v2: one folder for both controllers
                    os.mkdir(folder, 0o755)
                self._limit(controller, folder, v2)
            except OSError as exc:
                self.why[controller] = f"cannot make a cgroup in {home}: {exc.strerror}"
                _rmdir(folder)
                continue
            self.folders[controller] = (folder, v2)

    @classmethod
    def adopted(cls, limits: KernelLimits, folders: dict[str, Any],
                why: dict[str, str]) -> Cgroups:
        """The cgroups another process made for a sandbox handed to this one."""
        self = cls.__new__(cls)
        self.limits = limits
        self.folders = {c: (str(f[0]), bool(f[1])) for c, f in folders.items()}
        self.why = dict(why)
        return self

    def _limit(self, controller: str, folder: str, v2: bool) -> None:
        if controller == "pids":
            _write(os.path.join(folder, "pids.max"), str(self.limits.processes))
            return
        memory = str(self.limits.memory)
        if v2:
            _write(os.path.join(folder, "memory.max"), memory)
            _write(os.path.join(folder, "memory.oom.group"), "1")  # the generation ends whole
            optional = [("memory.swap.max", "0")]
        else:
            _write(os.path.join(folder, "memory.limit_in_bytes"), memory)
            optional = [("memory.memsw.limit_in_bytes", memory)]
        for name, value in optional:  # swap counts too, where the system accounts it
            try:
                _write(os.path.join(folder, name), value)
            except OSError:
                pass

    def spec(self) -> dict[str, Any]:
        """What the sandbox's init gets: the limits, and the folders it joins."""
        memory, pids = self.folders.get("memory"), self.folders.get("pids")
        return {**self.limits.to_dict(),
                "memory_cgroup": memory[0] if memory else None,
                "memory_v2": bool(memory and memory[1]),
                "pids_cgroup": pids[0] if pids else None}

    def reached(self) -> str | None:
        """"memory" once the OOM killer acted in the sandbox, "processes" once a fork was
        refused at its limit; None otherwise."""
        memory = self.folders.get("memory")
        if memory is not None:
            folder, v2 = memory
            text = _read(os.path.join(folder, "memory.events" if v2 else "memory.oom_control"))
            if _field(text, "oom_kill") or _field(text, "oom_group_kill"):
                return "memory"
        pids = self.folders.get("pids")
        if pids is not None and _field(_read(os.path.join(pids[0], "pids.events")), "max"):
            return "processes"
        return None

    def remove(self, wait: float = 0.0) -> bool:
        """Remove the folders once the sandbox's processes are gone, waiting up to
        ``wait`` seconds; a folder still busy then is removed by a later call or
        :func:`sweep`. True once all are gone."""
        folders = list(dict.fromkeys(f for f, _ in self.folders.values()))
        deadline = time.monotonic() + wait
        busy = [f for f in folders if not _rmdir(f)]
        while busy and time.monotonic() < deadline:
            time.sleep(0.005)  # the processes were killed; they are being reaped
            busy = [f for f in busy if not _rmdir(f)]
        self.folders = {c: v for c, v in self.folders.items() if v[0] in busy}
        if busy:
            with _LEFTOVER_LOCK:
                _LEFTOVER.extend(f for f in busy if f not in _LEFTOVER)
        return not busy


def _rmdir(folder: str) -> bool:
    """True once ``folder`` is gone."""
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        return True
    except OSError as exc:  # busy: its processes are still going; else not ours to retry
        return exc.errno not in (errno.EBUSY, errno.ENOTEMPTY)
    return True


def _sweep_dead(home: str) -> None:
    """Remove the empty cgroup folders that Hosts no longer running left in ``home`` (a Host
    killed with SIGKILL cannot remove its own). A folder still holding a process is never
    removed (the kernel refuses), so a pid since reused does no harm."""
    try:
        names = [n for n in os.listdir(home) if n.startswith(_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            _rmdir(os.path.join(home, name))
        except OSError:
            pass  # alive, and someone else's


def sweep() -> None:
    """Remove the cgroup folders of sandboxes that have ended since they were released."""
    with _LEFTOVER_LOCK:
        _LEFTOVER[:] = [f for f in _LEFTOVER if not _rmdir(f)]
