"""Small helpers shared by the tests."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

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


#: Kernel code that makes the pytest runs of ``host.bash`` load no plugin by entry point,
#: as the Host's own test runs load none (reproduce/environment.py): the dev venv's
#: plugins (hypothesis above all) cost about 2 s a run and play no part in these tests.
NO_PLUGIN_AUTOLOAD = "os.environ['PYTEST_DISABLE_PLUGIN_AUTOLOAD'] = '1'"


def bash_exit_cell(command: str, name: str = "r") -> str:
    """A cell running ``command`` through ``host.bash`` (its pytest loading no plugin by
    entry point, the environment restored after) and printing ``EXIT <status>``."""
    return (f"import os\n{NO_PLUGIN_AUTOLOAD}\n"
            f"try:\n    {name} = host.bash({command!r})\n"
            "finally:\n    del os.environ['PYTEST_DISABLE_PLUGIN_AUTOLOAD']\n"
            f"print('EXIT', {name}.exit_status)")


def bash_receipt(host: Host, command: str) -> dict[str, Any]:
    """Run ``command`` with ``host.bash`` in a cell that must succeed; the body of the
    receipt the Host recorded for it (read from the record, not from the kernel)."""
    text = run_ok(host, f"r = host.bash({command!r})\nprint('receipt', r.receipt_id)")
    receipt_id = next(line.split()[1] for line in text.splitlines()
                      if line.startswith("receipt "))
    assert host.ledger is not None
    rows = host.ledger.query("SELECT body FROM receipts WHERE receipt_id = ?", (receipt_id,))
    return dict(json.loads(rows[0]["body"]))


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


PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@contextlib.contextmanager
def batch_cluster(prefix: str, *, stop_tracker: bool = True) -> Iterator[Any]:
    """A Dask client on a two-worker LocalCluster whose workers' temp folder is its own
    (so a Host killed with its worker leaves nothing behind), with proxy variables kept
    from the workers. ``stop_tracker``: the multiprocessing resource tracker the workers
    start is stopped after, when it was not running before."""
    from multiprocessing import resource_tracker

    from distributed import Client

    from host_kernel.batch import local_cluster

    tracker = resource_tracker._resource_tracker  # type: ignore[attr-defined]
    tracking = getattr(tracker, "_fd", None) is not None
    saved = {name: os.environ.pop(name) for name in PROXIES if name in os.environ}
    scratch = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        with local_cluster(2, retries=2, env={"TMPDIR": scratch}) as cluster, \
                Client(cluster) as client:
            yield client
    finally:
        os.environ.update(saved)
        shutil.rmtree(scratch, ignore_errors=True)
        if stop_tracker and not tracking:
            tracker._stop()


#: Cell code that keeps the kernel from ever publishing its ``idle`` status again (until
#: ``k._publish_status = _publish``); ipykernel's own, replaced by a cell.
MUTE_IDLE = ("k = get_ipython().kernel\n"
             "_publish = k._publish_status\n"
             "k._publish_status = (lambda status, *a, **kw:\n"
             "    None if status == 'idle' else _publish(status, *a, **kw))\n")

#: Cell code that keeps the kernel's next execute_reply (this cell's) from being sent,
#: then puts ``session.send`` back.
DROP_REPLY = ("k = get_ipython().kernel\n_send = k.session.send\n"
              "def _drop(stream, msg_or_type, *a, **kw):\n"
              "    if msg_or_type == 'execute_reply':\n"
              "        k.session.send = _send\n"
              "        return None\n"
              "    return _send(stream, msg_or_type, *a, **kw)\n"
              "k.session.send = _drop\n")
