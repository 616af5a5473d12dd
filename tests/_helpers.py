"""Small helpers shared by the tests."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from host_kernel import Host


def run_ok(host: Host, code: str, timeout: float | None = 60) -> str:
    """Execute a cell that must succeed; return its text."""
    obs = host.execute(code, timeout=timeout)
    assert obs.status == "ok", obs.text
    return obs.text


def refusal(host: Host, call: str) -> str:
    """Run ``call`` in a cell that catches the Host's error; return 'Type code | message'."""
    obs = host.execute(f"try:\n    {call}\nexcept Exception as e:\n"
                       f"    print(type(e).__name__, getattr(e, 'code', '?'), '|', e)")
    assert obs.status == "ok", obs.text
    return obs.outputs[0]["text"].strip() if obs.outputs else ""


def wait_for(predicate: Callable[[], object], seconds: float, what: str) -> None:
    """Poll ``predicate`` every 50 ms until it is true; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found
