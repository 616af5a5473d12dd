"""One thread that makes every call on a Host, so the caller's thread stays free.

The agent loop and the MCP server both drive a :class:`~host_kernel.Host`
through a :class:`HostThread`. Two reasons: the Host's kernel channels are
used from a single thread for the whole session, and the caller's main
thread stays able to take Ctrl-C while a cell runs. On an interrupt the
caller asks :meth:`HostThread.interrupt_kernel`, the kernel stops the cell,
and the Host records it as usual, so the record stays whole.

It owns no Host state; it only runs callables in order and hands back their
results or exceptions.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["HostThread"]

T = TypeVar("T")

_STOP = object()


def _close_thread_loops() -> None:
    """Close the event loops jupyter_client made for this thread (kept in context variables).

    On the main thread they live as long as the process; on this thread they
    would be left open when it ends, and their sockets leak.
    """
    for value in contextvars.copy_context().values():
        if isinstance(value, asyncio.AbstractEventLoop) and not value.is_closed() \
                and not value.is_running():
            value.close()
    asyncio.set_event_loop(None)


class HostThread:
    """A daemon thread running submitted callables one at a time, in order."""

    def __init__(self, name: str = "host") -> None:
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is _STOP:
                    return
                future, fn = job
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)
        finally:
            _close_thread_loops()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((future, fn))
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the Host thread and wait for it (Ctrl-C interrupts the wait)."""
        return self.submit(fn).result()

    @staticmethod
    def interrupt_kernel(pid: int | None) -> bool:
        """Send SIGINT to a kernel's process group, as a notebook's interrupt button does.

        ``pid`` leads the group (jupyter_client starts kernels in a session of their
        own); confined, it is the sandbox's launcher, which passes interrupts by.
        """
        if pid is None:
            return False
        try:
            os.killpg(pid, signal.SIGINT)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGINT)
            except (ProcessLookupError, PermissionError):
                return False
        return True

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the queued calls, then end the thread (waits up to ``timeout``)."""
        self._jobs.put(_STOP)
        self._thread.join(timeout)
