"""Each Dask worker's warm Host pool: :class:`PoolPlugin`, and how a task finds it.

Owns the worker plugin that holds one :class:`~host_kernel.HostPool` per worker, the
name each batch registers it under (:func:`plugin_name`: one per batch, so that two
batches on one cluster neither replace nor remove each other's pools) and
:func:`worker_pool`, which a task calls to find its batch's pool. It imports Dask at its
top, so only a running batch imports it (:func:`~host_kernel.batch.run_batch` on the
driver, :func:`~host_kernel.batch.run_task` on a worker), never ``import
host_kernel.batch``, which the command line does to list its commands. It does not own
what a task does with the pool (:mod:`._worker`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from distributed import Worker, WorkerPlugin, get_worker

__all__ = ["POOL_PLUGIN", "PoolPlugin", "plugin_name", "worker_pool"]

#: The name a pool plugin is registered under; a batch's adds its id (:func:`plugin_name`).
POOL_PLUGIN = "host-kernel-pool"


def plugin_name(batch: str) -> str:
    """The name the pool plugin of the batch ``batch`` (its id) is registered under."""
    return f"{POOL_PLUGIN}-{batch}"


class PoolPlugin(WorkerPlugin):
    """One warm :class:`~host_kernel.HostPool` per Dask worker: made when the plugin is
    registered (or the worker starts), closed when it is removed or the worker closes.
    ``roots`` are the folders the batch's workspaces lie beneath; ``hide_env`` the
    variables its kernels must never hold (the batch's LLM key's); ``name`` is the name it
    is registered under (Dask's default when registered without one)."""

    def __init__(self, roots: Iterable[str], size: int = 1, *,
                 hide_env: Iterable[str] = (), name: str = POOL_PLUGIN) -> None:
        self.roots = tuple(roots)
        self.size = size
        self.hide_env = tuple(hide_env)
        self.name = name
        self.pool: Any = None

    def setup(self, worker: Worker) -> None:
        from ..host._pool import HostPool

        for root in self.roots:
            Path(root).mkdir(parents=True, exist_ok=True)
        self.pool = HostPool(size=self.size, roots=self.roots, hide_env=self.hide_env).start()

    def teardown(self, worker: Worker) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def worker_pool(name: str) -> tuple[Any, str]:
    """This worker's pool registered as ``name`` (None outside a worker, or without the
    plugin) and the worker's address."""
    try:
        worker = get_worker()
    except ValueError:
        return None, f"local:{os.getpid()}"
    plugin = worker.plugins.get(name)
    return getattr(plugin, "pool", None), str(worker.address)
