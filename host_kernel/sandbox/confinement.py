"""What a session's record says about confinement, and whether it is possible here.

Owns :func:`probe` (is Landlock here, which ABI, or why not; is the private
world of host_kernel/sandbox/world.py possible: the isolation switch, the
user-mode network) and :class:`Confinement` (the session's record of it, the
sentence its first Observation carries when confinement is weaker than usual,
and what ``require_confinement=True`` refuses). It starts nothing: the sandbox
itself is host_kernel/sandbox/client.py's.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from .landlock import abi_version
from .netns import isolation_off, outbound_unavailable
from .policy import Policy, rules_for_record

__all__ = ["Confinement", "probe"]


@dataclass(frozen=True)
class Confinement:
    """What the session's record says about confinement."""

    #: "landlock" when enforced, "none" when not.
    status: str
    abi: int = 0
    reason: str | None = None
    network: bool = True
    pid_namespace: bool | None = None
    pid_namespace_reason: str | None = None
    rules: list[dict[str, Any]] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    interpreter_writable: list[str] = field(default_factory=list)
    #: Folders on the Host's own import path that confined code can write.
    host_path_writable: list[str] = field(default_factory=list)
    #: Whether the kernel has a network namespace of its own (None: known at its start).
    network_namespace: bool | None = None
    network_namespace_reason: str | None = None
    #: Whether it has a private view (its own /tmp, /dev/shm, runtime folders).
    private_view: bool | None = None
    private_view_reason: str | None = None
    #: Why a kernel that may use the network has no outbound traffic (slirp4netns failed).
    outbound_failed: str | None = None

    @property
    def active(self) -> bool:
        return self.status == "landlock"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "abi": self.abi, "reason": self.reason,
                "network": self.network, "pid_namespace": self.pid_namespace,
                "pid_namespace_reason": self.pid_namespace_reason, "rules": self.rules,
                "hidden": self.hidden, "interpreter_writable": self.interpreter_writable,
                "host_path_writable": self.host_path_writable,
                "network_namespace": self.network_namespace,
                "network_namespace_reason": self.network_namespace_reason,
                "private_view": self.private_view,
                "private_view_reason": self.private_view_reason,
                "outbound_failed": self.outbound_failed}

    def missing(self) -> str | None:
        """Why the session lacks a part of its private world (a network namespace, a
        private view), or None: what ``require_confinement=True`` refuses."""
        parts = [f"no network namespace ({self.network_namespace_reason})"
                 if self.network_namespace is False else "",
                 f"no private view ({self.private_view_reason})"
                 if self.private_view is False else ""]
        return "; ".join(p for p in parts if p) or None

    def notice(self) -> str | None:
        """The sentence the first Observation carries when confinement is weaker than usual."""
        if not self.active:
            return (f"confinement: none ({self.reason}). Cell code and host.bash commands run "
                    f"with this user's full rights; the record is protected only by protocol.")
        parts = []
        if self.pid_namespace is False:
            parts.append(f"no PID namespace ({self.pid_namespace_reason}): /proc still shows "
                         f"the Host's processes")
        if self.interpreter_writable:
            parts.append("the interpreter is installed inside the workspace, so confined code "
                         "can change it: " + ", ".join(self.interpreter_writable))
        if self.host_path_writable:
            parts.append("the Host's own process imports from a folder confined code can "
                         "write (" + ", ".join(self.host_path_writable) + "), so a module a "
                         "cell leaves there could run in the Host: start it from outside the "
                         "workspace, or with python -P")
        if self.network_namespace is False:
            parts.append(f"no network namespace of its own ({self.network_namespace_reason}): "
                         f"cell code shares the machine's network, so it can reach every "
                         f"service on 127.0.0.1 (other sessions' Hosts, databases, schedulers)")
        if self.outbound_failed:
            parts.append(f"no outbound network ({self.outbound_failed}), though the session "
                         f"may use the network")
        if self.private_view is False:
            parts.append(f"no private /tmp, /dev/shm or runtime folders "
                         f"({self.private_view_reason}): other sessions' sockets and files "
                         f"there are unreadable but visible, and their sockets can be "
                         f"connected to")
        if not parts:
            return None
        return "confinement: landlock, but " + "; ".join(parts) + "."


def probe(policy: Policy | None, *, network: bool = True) -> Confinement:
    """Whether confinement is possible here, and the rules ``policy`` would apply."""
    abi = abi_version()
    if abi < 1:
        if os.environ.get("HOST_KERNEL_FAKE_NO_LANDLOCK") == "1":
            reason = "Landlock switched off by HOST_KERNEL_FAKE_NO_LANDLOCK=1 (a test switch)"
        elif sys.platform != "linux":
            reason = f"Landlock is Linux-only; this is {sys.platform}"
        else:
            reason = (f"this Linux kernel ({os.uname().release}) has no usable Landlock "
                      f"(needs 5.13+ with landlock in the LSM list)")
        return Confinement("none", 0, reason, network)
    if policy is None:
        return Confinement("landlock", abi, None, network)
    if not network and abi < 4:
        reason = f"network=False needs Landlock ABI 4, this kernel has {abi}"
        return Confinement("none", abi, reason, network)
    off = isolation_off()
    net_off = off or (outbound_unavailable() if network else None)
    return Confinement("landlock", abi, None, network, rules=rules_for_record(policy, abi),
                       hidden=list(policy.hidden),
                       interpreter_writable=policy.interpreter_writable(),
                       host_path_writable=policy.host_path_writable(),
                       network_namespace=False if net_off else None,
                       network_namespace_reason=net_off,
                       private_view=False if off else None, private_view_reason=off)
