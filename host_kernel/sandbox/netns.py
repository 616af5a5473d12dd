"""A sandbox's network on the Host's side: user-mode networking into its own namespace.

Every sandbox gets a network namespace of its own (made by its launcher,
host_kernel/sandbox/world.py; ``lo`` up inside). With ``network=False`` that is
all: loopback, and only the sandbox's own. With ``network=True`` the Host
attaches **slirp4netns** to it (:class:`Outbound`): a tap device inside, and a
user-mode TCP/IP stack outside that opens ordinary sockets on the sandbox's
behalf, with ``--disable-host-loopback`` so that nothing on the machine's own
127.0.0.1 (another session's Host, a database, a scheduler) can be reached.
Unix sockets named by path are not network: the kernel's ZeroMQ channels and
the call socket work across namespaces.

Why slirp4netns rather than pasta: Debian's package is a small, stable C
program whose one job this is, with the switches this needs spelled out
(``--disable-host-loopback``, ``--ready-fd`` to know when the tap is up,
``--exit-fd`` to end it with the sandbox even if the Host is killed, and its own
``--enable-sandbox``/``--enable-seccomp`` confinement of itself); Debian 12's
passt is an early snapshot whose loopback mapping is on by default and whose
flags have changed since.

Owns whether outbound networking is possible here (:func:`outbound_unavailable`),
the switch that turns the new isolation off for a comparison
(:func:`isolation_off`), and the resolver a sandbox is given when the machine's
names one on its own loopback (:func:`resolv_for`).
"""

from __future__ import annotations

import ipaddress
import os
import select
import shutil
import subprocess
import threading

__all__ = ["ISOLATION_ENV", "Outbound", "isolation_off", "outbound_unavailable",
           "resolv_for"]

#: ``HOST_KERNEL_ISOLATION=off``: no network namespace and no private view (a switch for
#: comparisons and diagnosis, docs/security.md); the record and first Observation say so.
ISOLATION_ENV = "HOST_KERNEL_ISOLATION"
SLIRP = "slirp4netns"
#: slirp4netns's resolver, inside the sandbox (it forwards to the machine's).
SLIRP_DNS = "10.0.2.3"
#: Seconds to wait for slirp4netns to have the tap device up.
READY_TIMEOUT = 10.0

_FOUND: tuple[str | None, str | None] | None = None
#: slirp4netns processes closed but not yet reaped (reaped by the next :func:`reap`).
_CLOSED: list[subprocess.Popen[bytes]] = []
_LOCK = threading.Lock()


def isolation_off() -> str | None:
    """Why the new isolation is off, or None (it is on)."""
    if os.environ.get(ISOLATION_ENV, "").lower() in ("off", "0", "no", "false"):
        return f"switched off by {ISOLATION_ENV}=off"
    return None


def _slirp() -> tuple[str | None, str | None]:
    """(the slirp4netns executable, why it cannot serve), looked up once per process."""
    global _FOUND
    if _FOUND is None:
        path = shutil.which(SLIRP, path=os.environ.get("PATH", os.defpath) + ":/usr/bin")
        if path is None:
            _FOUND = (None, "slirp4netns is not installed (Debian: apt-get install slirp4netns)")
        elif not os.path.exists("/dev/net/tun"):
            _FOUND = (None, "/dev/net/tun is missing, so slirp4netns cannot make a tap device")
        else:
            _FOUND = (path, None)
    return _FOUND


def outbound_unavailable() -> str | None:
    """Why a sandbox cannot have outbound traffic of its own here, or None."""
    return _slirp()[1]


def resolv_for(text: str) -> str | None:
    """The resolv.conf a sandbox with slirp4netns needs, or None when the machine's serves:
    a name server on the machine's loopback (systemd-resolved's 127.0.0.53, a local
    dnsmasq) is not there in the sandbox's namespace; slirp4netns's own forwards to it."""
    servers = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            servers.append(parts[1])
    try:
        loopback = [s for s in servers if ipaddress.ip_address(s.split("%")[0]).is_loopback]
    except ValueError:
        return None
    if not loopback:
        return None
    kept = [line for line in text.splitlines() if not line.startswith("nameserver")]
    return "\n".join([f"nameserver {SLIRP_DNS}", *kept]) + "\n"


def machine_resolv() -> str | None:
    try:
        with open("/etc/resolv.conf") as f:
            return resolv_for(f.read())
    except OSError:
        return None


class Outbound:
    """slirp4netns serving the network namespace of the process ``pid`` (a launcher).

    It runs in a session of its own (a Ctrl-C to the Host is not for it) and ends when
    the Host's end of its exit pipe closes: at :meth:`close`, or with the Host.
    """

    def __init__(self, pid: int) -> None:
        path, why = _slirp()
        if path is None:
            raise OSError(why)
        ready_r, ready_w = os.pipe()
        exit_r, self._exit_w = os.pipe()
        os.set_inheritable(ready_w, True)
        os.set_inheritable(exit_r, True)
        self._ready = ready_r
        try:
            self.proc = subprocess.Popen(
                [path, "--configure", "--mtu=65520", "--disable-host-loopback",
                 "--enable-sandbox", "--enable-seccomp", f"--ready-fd={ready_w}",
                 f"--exit-fd={exit_r}", str(pid), "tap0"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, pass_fds=(ready_w, exit_r), start_new_session=True)
        except OSError:
            os.close(ready_r)
            os.close(self._exit_w)
            raise
        finally:
            os.close(ready_w)
            os.close(exit_r)
        #: None once the tap device is up; else why it is not (after :meth:`wait`).
        self.error: str | None = "not ready yet"

    def wait(self, timeout: float = READY_TIMEOUT) -> str | None:
        """Wait until the tap device is up; None then, else why not."""
        if self._ready < 0:
            return self.error
        ready, _, _ = select.select([self._ready], [], [], timeout)
        data = os.read(self._ready, 1) if ready else b""
        os.close(self._ready)
        self._ready = -1
        if data == b"1":
            self.error = None
        elif ready:
            code = self.proc.poll()
            self.error = f"slirp4netns stopped before the network was up (exit {code})"
        else:
            self.error = f"slirp4netns did not have the network up within {timeout:g} s"
        return self.error

    def close(self) -> None:
        """End it now, and reap it: the sandbox it served is ending. (Its exit pipe closing
        would end it too, a few milliseconds later: that is for a Host that was killed.)"""
        if self._exit_w >= 0:
            os.close(self._exit_w)
            self._exit_w = -1
        if self._ready >= 0:
            os.close(self._ready)
            self._ready = -1
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with _LOCK:  # (a process SIGKILLed and not gone in 5 s: reaped later)
                if self.proc not in _CLOSED:
                    _CLOSED.append(self.proc)


def reap(timeout: float = 0.0) -> None:
    """Reap the slirp4netns processes closed so far, waiting up to ``timeout`` for each."""
    with _LOCK:
        procs = list(_CLOSED)
    done = []
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if timeout:
                proc.kill()
                proc.wait()
            else:
                continue
        done.append(proc)
    with _LOCK:
        _CLOSED[:] = [p for p in _CLOSED if p not in done]
