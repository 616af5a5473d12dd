"""The per-user kernel factory: standby kernels kept started for every Host of one user.

A Host that has no pool of its own asks the factory for its first kernel
(:class:`FactoryPool`); the first Host that finds none starts one
(``python -m host_kernel.factory``) and starts cold itself. The factory keeps
standbys exactly as :class:`~host_kernel.host._pool.HostPool` does (it is one),
hands each to one session over its socket, and exits when no session has been
attached for ``HOST_KERNEL_FACTORY_IDLE`` seconds. ``HOST_KERNEL_FACTORY=off`` or
``Host(factory=False)`` turns it off (docs/security.md, "The kernel factory").

Modules: ``_place`` (its folder and settings), ``_server`` (the process),
``_client`` (the Host's side), ``_adopt`` (a standby crossing between the two).
"""

from __future__ import annotations

from ._place import FACTORY_ENV, Place, disabled

__all__ = ["FACTORY_ENV", "Place", "disabled"]
