"""The sandbox's own world, as its init builds it: namespaces, a private view, limits.

Runs inside the sandbox's init (host_kernel/sandbox/init.py), trusted and before
any confined code, so it imports as little as init does. It owns the mechanism;
what to cover, keep and bound is decided on the Host's side
(``policy.view_of``, ``limits.KernelLimits``):

- :func:`unshare`, :func:`mount_proc`: the user, mount, PID and network
  namespaces, the user mapped to itself, and a ``/proc`` of the sandbox's own;
- :class:`View`: in the sandbox's mount namespace, each *mask* folder is covered
  with an empty tmpfs, and each *keep* path beneath one is bound back at its own
  path from the tree the mask covers (reached through a descriptor opened before
  covering it). Bind mounts keep inodes, so Landlock rules, which name inodes,
  mean the same inside and out. More paths can be bound later (a standby handed
  to its session).
- :func:`loopback_up`: ``lo`` up in a fresh network namespace (one ``ioctl``).
- :func:`drop_capabilities`: no capability for anything init starts.
- :class:`Limits`: joins the sandbox's cgroups and sets its rlimits in the
  launcher, caps the PID namespace where no pids cgroup does, and watches for a
  limit reached (:meth:`Limits.check`), so init can end the generation and say why.
"""

from __future__ import annotations

import ctypes
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = (
    2, 4, 8, 0x1000, 0x4000, 0x40000)
_MNT_DETACH = 2
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_EINVAL = 22
#: Capabilities kept: those over files alone (CAP_CHOWN, CAP_DAC_OVERRIDE,
#: CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID), which in the sandbox's user namespace act
#: only on files its own user owns anyway (other owners are unmapped there), so that cells
#: keep the file semantics they had. Every other one goes.
_FILE_CAPS = frozenset({0, 1, 2, 3, 4})
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 1
#: PIDs a PID namespace reserves below once its counter wraps (kernel/pid.c RESERVED_PIDS).
_RESERVED_PIDS = 300

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _depth(path: str) -> int:
    return path.rstrip("/").count("/")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def unshare(net: bool) -> str | None:
    """A user, mount and PID namespace for our children (and a network one when ``net``),
    the user mapped to itself. Returns why there is no network namespace, if ``net``
    and the kernel refused one."""
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID
    why = None
    if net and _libc.unshare(flags | _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        why = f"unshare(CLONE_NEWNET): {os.strerror(err)}"
        net = False
    if not net:
        _check(_libc.unshare(flags), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    return why


def mount_proc() -> None:
    _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    _check(_libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None),
           "mount proc")


class View:
    """The sandbox's private mount view: masks covered, keeps bound back.

    Layers are the folders covered (``mask``) and the paths bound back (``keep``);
    what a path shows is decided by the deepest layer holding it.
    """

    def __init__(self) -> None:
        #: (path, "mask" | "keep"), in the order applied.
        self.layers: list[tuple[str, str]] = []
        #: mask → descriptor (O_PATH) of the tree it covers, for binding back from it.
        self._sources: dict[str, int] = {}
        #: Masks not applied (inside another mask); applied if a keep exposes them.
        self._waiting: dict[str, str] = {}

    @property
    def masked(self) -> list[str]:
        return [p for p, kind in self.layers if kind == "mask"]

    def _nearest(self, path: str) -> tuple[str, str] | None:
        best: tuple[str, str] | None = None
        for layer in self.layers:
            if _under(path, layer[0]) and (best is None or _depth(layer[0]) >= _depth(best[0])):
                best = layer
        return best

    def add(self, masks: list[tuple[str, str]], keeps: list[str]) -> None:
        """Cover ``masks`` (``(folder, tmpfs options)``) and bind ``keeps`` back,
        shallowest first. Raises OSError; :meth:`undo` then takes the view down."""
        self._waiting.update({m: o for m, o in masks if m not in self._sources})
        items = [(p, 0, o) for p, o in self._waiting.items()] + [(k, 1, "") for k in keeps]
        for path, kind, options in sorted(items, key=lambda i: (_depth(i[0]), i[1])):
            near = self._nearest(path)
            if kind == 0:
                if near is not None and near[1] == "mask":
                    continue  # already covered by a fresh folder above it
                del self._waiting[path]
                if os.path.isdir(path):
                    self._cover(path, options)
            elif near is not None and near[1] == "mask" and near[0] != path:
                self._bind_back(path, near[0])

    def _cover(self, path: str, options: str) -> None:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _check(_libc.mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                               options.encode()), f"mount tmpfs on {path}")
        except OSError:
            os.close(fd)
            raise
        self._sources[path] = fd
        self.layers.append((path, "mask"))

    def _bind_back(self, path: str, mask: str) -> None:
        rel = path[len(mask.rstrip("/")) + 1:]
        source = f"/proc/self/fd/{self._sources[mask]}/{rel}"
        if not os.path.exists(source):
            return  # gone since the Host listed it: nothing to show
        at = mask.rstrip("/")
        parts = rel.split("/")
        for part in parts[:-1]:  # mount points in the fresh tmpfs, which only init writes
            at += "/" + part
            if not os.path.isdir(at):
                os.mkdir(at, 0o755)
        if os.path.isdir(source):
            if not os.path.isdir(path):
                os.mkdir(path, 0o755)
        elif not os.path.exists(path):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        _check(_libc.mount(source.encode(), path.encode(), None, _MS_BIND | _MS_REC, None),
               f"bind {path}")
        self.layers.append((path, "keep"))

    def undo(self) -> None:
        """Take every layer down (a view half built is no view)."""
        for path, _ in reversed(self.layers):
            _libc.umount2(path.encode(), _MNT_DETACH)
        self.layers.clear()
        for fd in self._sources.values():
            os.close(fd)
        self._sources.clear()


def drop_capabilities() -> str | None:
    """Take every capability but the file ones (:data:`_FILE_CAPS`) out of the bounding set
    (and empty the ambient set), so that no process init starts holds one after its
    ``execve``, root in the sandbox's user namespace or not; init keeps its own (it mounts
    into the view when a standby is handed out).

    Without this, a kernel is root in its network namespace: with ``CAP_NET_RAW`` it
    could write raw frames on slirp4netns's tap device addressed to 127.0.0.1, which
    slirp4netns would deliver to the machine's loopback (``--disable-host-loopback`` only
    stops its gateway alias). Returns why not, if the set could not be emptied.
    """
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(last + 1):
        if cap in _FILE_CAPS:
            continue
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err != _EINVAL:  # (a capability this kernel does not know)
                return f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(err)}"
    return None


def loopback_up() -> None:
    """Bring ``lo`` up in this (fresh) network namespace."""
    import _socket

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        ifreq = ctypes.create_string_buffer(b"lo", 40)  # struct ifreq: name, then flags
        _check(_libc.ioctl(sock.fileno(), _SIOCGIFFLAGS, ifreq), "SIOCGIFFLAGS lo")
        flags = int.from_bytes(ifreq.raw[16:18], "little") | _IFF_UP
        ctypes.memmove(ctypes.addressof(ifreq) + 16, flags.to_bytes(2, "little"), 2)
        _check(_libc.ioctl(sock.fileno(), _SIOCSIFFLAGS, ifreq), "SIOCSIFFLAGS lo")
    finally:
        sock.close()


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, 4096).decode(errors="replace")
    finally:
        os.close(fd)


def _field(text: str, name: str) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


class Limits:
    """One sandbox's bounds, from its setup's ``limits``; what enforces each is recorded.

    Made in the launcher (before its namespaces: joining a cgroup and raising a hard
    rlimit need the Host's own rights), capped again in init's PID namespace, and
    watched by init's loop.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.memory_dir: str | None = spec.get("memory_cgroup")
        self.pids_dir: str | None = spec.get("pids_cgroup")
        #: Whether the memory cgroup is a cgroup v2 one (its events file, its group kill).
        self.v2 = bool(spec.get("memory_v2"))
        #: What the hello reports: each limit, its value and what enforces it.
        self.report: dict[str, Any] = {}
        #: Descriptors init polls: an OOM eventfd (cgroup v1) or memory.events (v2).
        self.fds: list[int] = []
        self._baseline_pids = 0
        self._poll_pri = False

    def enter(self) -> None:
        """In the launcher: join the cgroups, set the rlimits every process inherits."""
        import resource

        memory, processes, files = (self.spec.get(k) for k in ("memory", "processes",
                                                                 "open_files"))
        for folder in dict.fromkeys(d for d in (self.memory_dir, self.pids_dir) if d):
            _write(folder + "/cgroup.procs", "0")
        if memory and self.memory_dir:
            by = "cgroup v2 (memory.max)" if self.v2 else "cgroup v1 (memory.limit_in_bytes)"
            self.report["memory"] = {"max": memory, "by": by}
            self._watch_memory()
        elif memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            self.report["memory"] = {"max": memory, "by": "RLIMIT_AS (each process)"}
        if processes and self.pids_dir:
            self._baseline_pids = _field(_read(self.pids_dir + "/pids.events"), "max")
            self.report["processes"] = {"max": processes, "by": "pids cgroup (pids.max)"}
        elif processes:
            self.report["processes"] = {"max": processes, "by": "none (no pids cgroup, "
                                        "no user namespace)"}
        if files:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
            except (ValueError, OSError):  # above the hard limit, without the right to raise it
                files = hard if hard != resource.RLIM_INFINITY else files
                resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
            self.report["open_files"] = {"max": files, "by": "RLIMIT_NOFILE"}

    def _watch_memory(self) -> None:
        folder = self.memory_dir
        if folder is None:
            return
        if self.v2:
            fd = os.open(folder + "/memory.events", os.O_RDONLY | os.O_CLOEXEC)
            os.read(fd, 4096)  # armed: poll reports the next change (POLLPRI)
            self._poll_pri = True
        else:
            fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            control = os.open(folder + "/memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
            try:
                _write(folder + "/cgroup.event_control", f"{fd} {control}")
            finally:
                os.close(control)
        self.fds.append(fd)

    @property
    def poll_mask(self) -> int:
        """The events to poll :attr:`fds` for."""
        import select

        return select.POLLPRI | select.POLLERR if self._poll_pri else select.POLLIN

    def cap_namespace(self) -> None:
        """In init, PID 1 of a fresh user and PID namespace: where no pids cgroup bounds
        the processes, the namespace's own ``pid_max`` (Linux 6.14+) does, root or not,
        and ``RLIMIT_NPROC``, which counts per user namespace (so this sandbox's alone)
        but binds only a user that is not root outside (kernel/fork.c skips INIT_USER).

        Set here, not in the launcher: an RLIMIT_NPROC set before the user namespace
        was made would also cap the user's processes on the whole machine.
        """
        import resource

        processes = self.spec.get("processes")
        if not processes or self.pids_dir:
            return
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
        by = "RLIMIT_NPROC (not binding root)" if os.geteuid() == 0 else "RLIMIT_NPROC"
        try:
            _write("/proc/sys/kernel/pid_max", str(int(processes) + _RESERVED_PIDS))
            by = "the PID namespace's pid_max, and " + by
        except OSError:
            pass  # an older kernel: RLIMIT_NPROC alone (recorded)
        self.report["processes"] = {"max": processes, "by": by}

    def check(self) -> str | None:
        """"memory" or "processes" once that limit was reached, else None."""
        if self.memory_dir:
            text = _read(self.memory_dir + ("/memory.events" if self.v2 else
                                            "/memory.oom_control"))
            if _field(text, "oom_kill") or (self.v2 and _field(text, "oom_group_kill")):
                return "memory"
        processes = self.spec.get("processes")
        if self.pids_dir:
            if _field(_read(self.pids_dir + "/pids.events"), "max") > self._baseline_pids:
                return "processes"
        elif processes and os.getpid() == 1:
            # No cgroup: a fork bomb fills the namespace's pids; count what /proc shows.
            count = sum(1 for name in os.listdir("/proc") if name.isdigit())
            if count >= int(processes):
                return "processes"
        return None


def enter_limits(setup: dict[str, Any], hello: dict[str, Any]) -> Any:
    """In the launcher, before the namespaces: the cgroups joined, the rlimits set."""
    if not setup.get("limits"):
        return None
    limits = Limits(setup["limits"])
    try:
        limits.enter()
    except OSError as exc:
        hello["limits_error"] = str(exc)
    return limits


def inside(setup: dict[str, Any], hello: dict[str, Any], limits: Any) -> Any:
    """In init, PID 1 with ``/proc`` its own: the private view, ``lo`` up, the namespace's
    process cap. Returns the view (None without one; the hello says why)."""
    view = None
    if setup.get("view"):
        view = View()
        masks, keeps = setup["view"]
        try:
            view.add([tuple(m) for m in masks], list(keeps))
            resolv = setup.get("resolv")
            if resolv and "/tmp" in view.masked:
                _resolv(view, resolv)
            os.chdir(os.getcwd())  # the working folder as the view shows it
        except OSError as exc:
            view.undo()
            view = None
            hello["view_reason"] = str(exc)
    if hello.get("network_namespace"):
        try:
            loopback_up()
        except OSError as exc:
            hello["network_reason"] = f"lo is down: {exc}"
    if limits is not None:
        limits.cap_namespace()
    return view


def _resolv(view: Any, text: str) -> None:
    """The name servers a user-mode network reaches, over /etc/resolv.conf (the machine's
    names a resolver on its own loopback, which the sandbox's namespace does not have)."""
    path = "/tmp/.host-kernel-resolv.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    _check(_libc.mount(path.encode(), b"/etc/resolv.conf", None, _MS_BIND, None),
           "bind /etc/resolv.conf")

