"""Sub-tasks: child agent sessions that ``host.delegate`` starts and ``host.collect`` reads.

Owns running children: each sub-task is a whole agent session, run by the
function the :class:`SubtaskRunner` was given (:func:`~host_kernel.agent.loop.run_agent`;
this module never imports the loop, which builds a runner for each session),
with its own Host, kernel and record, in a thread of this process, on the
folder the parent's Host prepared (:mod:`host_kernel.host._subtasks`). It
bounds them:

* **concurrency**: at most :attr:`DelegationConfig.max_concurrent` children
  of one session run at once; more wait their turn (``queued``);
* **depth**: a child is itself allowed to delegate only while its depth is
  below :attr:`DelegationConfig.max_depth`;
* **time**: each child has a wall-clock limit; a watchdog cuts a child that
  passes it (its loop is cancelled before its next model call, its kernel
  interrupted, then killed if it does not stop), and a ``collect`` whose
  timeout ends cuts the child too. Either way the parent gets a clear
  failure (outcome ``timeout``), never a hang.

It decides nothing about acceptance: the child's own Host verifies the
child's submission; the parent's Host reads the verdict from the child's
verified record.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

__all__ = ["CLOSE_WAIT", "KILL_AFTER", "DelegationConfig", "RunChild", "SubtaskRunner",
           "default_concurrency"]

#: Seconds between the interrupt of a cut child's kernel and its kill.
KILL_AFTER: Final[float] = 3.0
#: Seconds a cut child may take to close its session before the parent stops waiting.
CLOSE_WAIT: Final[float] = 60.0

#: What runs one child session: :func:`~host_kernel.agent.loop.run_agent`'s signature. Of
#: what it returns (an AgentResult) the runner reads ``accepted``, ``outcome``, ``reason``,
#: ``session_id`` and ``snapshot``.
RunChild = Callable[..., Any]


def default_concurrency() -> int:
    """Children that may run at once by default: one per CPU core, between 1 and 4."""
    return max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class DelegationConfig:
    """The bounds of delegation for one session (and, one level down, its children)."""

    max_concurrent: int = field(default_factory=default_concurrency)
    #: How many levels of sub-tasks below the top session may exist (1: children only).
    max_depth: int = 1
    #: This session's depth: 0 for the top session, 1 for its children, ...
    depth: int = 0
    #: A child's wall-clock limit in seconds, unless host.delegate(timeout=...) says less.
    timeout: float = 900.0
    max_steps: int = 20
    cell_timeout: float | None = None
    #: Most sub-tasks one session may start in all (each costs model calls and a kernel).
    max_total: int = 32

    def __post_init__(self) -> None:
        if self.max_concurrent < 1 or self.max_depth < 0 or self.depth < 0:
            raise ValueError("max_concurrent must be at least 1; max_depth and depth at least 0")
        if self.timeout <= 0 or self.max_steps < 1 or self.max_total < 1:
            raise ValueError("timeout must be positive, max_steps and max_total at least 1")


@dataclass
class _Child:
    handle: str
    task: str
    timeout: float
    done: threading.Event = field(default_factory=threading.Event)
    cancel: threading.Event = field(default_factory=threading.Event)
    host: Any = None
    result: Any = None
    error: str | None = None
    cut_reason: str | None = None
    state: str = "queued"  # queued | running | done
    #: run_agent returned (or failed): a cut after this changes nothing.
    finished: bool = False
    deadline: float | None = None
    thread: threading.Thread | None = None

    @property
    def outcome(self) -> str:
        """The child's own outcome; ``timeout`` when a cut kept it from being accepted (a
        cut that came while an accepted child was closing changes nothing)."""
        if self.result is not None and self.result.accepted:
            return "accepted"
        if self.cut_reason is not None:
            return "timeout"
        if self.result is not None:
            return str(self.result.outcome.value)
        return "error"

    @property
    def session(self) -> str | None:
        if self.result is not None:
            return str(self.result.session_id)
        return None if self.host is None else str(self.host.session_id)

    @property
    def spend(self) -> dict[str, Any]:
        if self.result is None:
            return {"usd": None, "priced": 0, "unpriced": 0}
        snap = self.result.snapshot
        usd = snap.spend_usd if (snap.costs.usd is not None or snap.subtasks) else None
        return {"usd": usd, "priced": snap.costs.priced,
                "unpriced": snap.costs.unpriced + snap.subtask_unpriced}


class SubtaskRunner:
    """Starts, bounds, cuts and hands back the sub-tasks of one agent session."""

    def __init__(self, llm: Any, config: DelegationConfig, *, run_child: RunChild,
                 prices: Any = None, system_layers: Any = None, skills: Any = None) -> None:
        """``run_child`` runs one child session (called as :func:`~.loop.run_agent` is).
        ``system_layers`` and ``skills``: the parent's, which its children share (the
        SYSTEM.md files and the skills catalog of the parent's workspace and user)."""
        self.llm = llm
        self.config = config
        self.run_child = run_child
        self.prices = prices
        self.system_layers = system_layers
        self.skills = skills
        #: What is left of the parent's budget (USD), asked as each child starts; a child
        #: runs with it as its own budget. None: no budget.
        self.budget_left: Callable[[], float | None] | None = None
        self._slots = threading.Semaphore(config.max_concurrent)
        self._children: dict[str, _Child] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._reserved = 0

    def attach(self, host: Any) -> None:
        """The parent Host. A resumed session's earlier sub-tasks count against
        ``max_total`` (read from its record)."""
        self.host = host
        if host.ledger is not None:
            rows = host.ledger.query("SELECT count(*) FROM events WHERE session = ? AND "
                                     "kind = 'subtask_started'", (host.session_id,))
            with self._lock:
                self._reserved = max(self._reserved, int(rows[0][0]))

    def release(self) -> None:
        """Give back a place taken by :meth:`reserve` for a sub-task that never started."""
        with self._lock:
            self._reserved = max(0, self._reserved - 1)

    def reserve(self) -> str | None:
        """Take one of the session's sub-task places; or why none may be taken now.

        Checked and counted under one lock, so calls from several kernel threads at
        once cannot pass ``max_total`` together."""
        with self._lock:
            why = self._refusal()
            if why is None:
                self._reserved += 1
            return why

    def _refusal(self) -> str | None:
        if self.config.depth >= self.config.max_depth:
            return (f"delegation refused: this session is at depth {self.config.depth} and the "
                    f"limit is {self.config.max_depth} level(s) of sub-tasks; do the work here")
        if self._closed.is_set():
            return "delegation refused: the session is ending"
        if self._reserved >= self.config.max_total:
            return (f"delegation refused: this session already started "
                    f"{self.config.max_total} sub-tasks, the most it may")
        return None

    def knows(self, handle: str) -> bool:
        return handle in self._children

    # -- running

    def launch(self, handle: str, task: str, *, workdir: Path, record_dir: Path,
               mode: str | None, timeout: float | None, hide: tuple[Path, ...] = (),
               parent: dict[str, str] | None = None) -> str:
        """Start the child's thread; it runs once a slot is free. Returns its state."""
        limit = min(timeout, self.config.timeout) if timeout is not None else self.config.timeout
        child = _Child(handle, task, limit)
        child.thread = threading.Thread(
            target=self._run, args=(child, workdir, record_dir, mode, hide, parent),
            name=f"subtask-{handle}", daemon=True)
        with self._lock:
            self._children[handle] = child
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, name="subtask-watchdog",
                                                  daemon=True)
                self._watchdog.start()
        child.thread.start()
        return child.state

    def _run(self, child: _Child, workdir: Path, record_dir: Path, mode: str | None,
             hide: tuple[Path, ...], parent: dict[str, str] | None) -> None:
        acquired = False
        try:
            while not self._slots.acquire(timeout=0.1):
                if child.cancel.is_set():
                    child.error = "cut before it started (it was waiting for a free slot)"
                    return
            acquired = True
            child.state = "running"
            child.deadline = time.monotonic() + child.timeout
            config = replace(self.config, depth=self.config.depth + 1)

            def seen(host: Any) -> None:
                child.host = host

            budget = None if self.budget_left is None else self.budget_left()
            result = self.run_child(
                child.task, workdir=workdir, mode=mode, llm=self.llm, record_dir=record_dir,
                max_steps=self.config.max_steps, cell_timeout=self.config.cell_timeout,
                prices=self.prices, spare=False, delegation=config, cancel=child.cancel,
                on_host=seen, hide_paths=hide,
                system_layers=self.system_layers, skills=self.skills, parent=parent,
                budget_usd=budget)
            with self._lock:  # from here a cut comes too late to change anything
                child.result = result
                child.finished = True
            if result.reason and result.outcome.value != "accepted":
                child.error = result.reason
        except BaseException as exc:  # noqa: BLE001 - handed to the parent as a failure
            child.error = f"{type(exc).__name__}: {exc}"
        finally:
            if acquired:
                self._slots.release()
            with self._lock:
                child.finished = True
                accepted = child.result is not None and child.result.accepted
                if child.cut_reason is not None and not accepted:
                    child.error = child.cut_reason
                child.state = "done"
            child.done.set()

    def _watch(self) -> None:
        while not self._closed.wait(0.2):
            now = time.monotonic()
            for child in list(self._children.values()):
                if child.deadline is not None and now > child.deadline and \
                        not child.done.is_set() and child.cut_reason is None:
                    self.cut(child.handle, f"the sub-task passed its time limit of "
                                           f"{child.timeout:g} s and was cut")

    def cut(self, handle: str, reason: str) -> None:
        """Stop a child: cancel its loop, interrupt its kernel, kill it if it holds on."""
        child = self._children[handle]
        with self._lock:
            if child.finished or child.cut_reason is not None:
                return
            child.cut_reason = reason
        child.cancel.set()
        threading.Thread(target=self._stop_kernel, args=(child,), daemon=True).start()

    @staticmethod
    def _stop_kernel(child: _Child) -> None:
        for sig, wait in ((signal.SIGINT, KILL_AFTER), (signal.SIGKILL, 0.0)):
            host = child.host
            pid = None if host is None else host.kernel_pid
            if pid is not None:
                try:
                    os.killpg(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            if child.done.wait(wait) if wait else child.done.is_set():
                return

    def wait(self, handle: str, timeout: float | None,
             alive: Callable[[], bool] = lambda: True) -> _Child | None:
        """The child once it has ended and closed its record; a child still running when
        ``timeout`` ends is cut first, then waited for (its session closes, its kernel is
        stopped). None when ``alive()`` turns false (the collecting cell stopped) before."""
        child = self._children[handle]
        end = None if timeout is None else time.monotonic() + timeout
        cut_at: float | None = None
        while not child.done.wait(0.1):
            if not alive():
                return None
            now = time.monotonic()
            if cut_at is None and end is not None and now >= end:
                self.cut(handle, f"collect's timeout of {timeout:g} s ended before the "
                                 f"sub-task did; it was cut")
                cut_at = now
            elif cut_at is not None and now - cut_at > CLOSE_WAIT:
                break  # still closing: the caller reads no record of it
        return child

    def shutdown(self) -> None:
        """The parent session ends: cut every child still running and wait for them."""
        self._closed.set()
        for child in list(self._children.values()):
            if not child.done.is_set():
                self.cut(child.handle, "the parent session ended before the sub-task did")
        for child in list(self._children.values()):
            if not child.done.wait(CLOSE_WAIT) and child.host is not None:
                # Still inside a model call (the cancel is seen only between calls): end its
                # session from here, so its record is closed whatever happens to the thread.
                try:
                    child.host.close()
                except Exception:  # noqa: BLE001, S110 - the thread closes it again when it returns
                    pass
        if self._watchdog is not None:
            self._watchdog.join(timeout=2)
