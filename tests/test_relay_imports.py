"""What the control kernel's relay imports before its first cell.

With no factory, the relay imports the Host while its early standby kernel imports
ipykernel beside it, on the same cores (docs/jupyter.md, "What starts when"): every
module the Host needs only at a cell (the dataflow tracker, the values and their cards,
the verifier, the reproduction) is imported when that cell comes, not at the start.
And the standby is started before ``host.bash``'s machinery is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: Modules a relay run alone must not have imported once it is ready to start the Host.
NOT_AT_START = ("host_kernel.lineage.flow", "host_kernel.lineage.statements",
                "host_kernel.lineage.defuse", "host_kernel.lineage.graph",
                "host_kernel.lineage.slice", "host_kernel._models", "host_kernel._display",
                "host_kernel.verify")


def _imported(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_the_relay_starts_without_what_only_a_cell_needs() -> None:
    modules = _imported("import host_kernel.control._run, host_kernel.host._pool, "
                        "host_kernel.host._relay_support, host_kernel.control.relay")
    assert "host_kernel.host._host" in modules  # the probe did import the Host
    assert not modules & set(NOT_AT_START), sorted(modules & set(NOT_AT_START))


def test_the_early_standby_is_started_without_host_bash() -> None:
    modules = _imported("import host_kernel.control._run, host_kernel.host._pool")
    assert "host_kernel.host._redact" in modules
    assert "host_kernel.host._bash" not in modules


def test_a_cell_s_modules_come_when_the_tracker_is_first_used(tmp_path: Path) -> None:
    modules = _imported(
        "import pathlib\n"
        "from host_kernel.host._lineage import SessionLineage\n"
        "from host_kernel.host._workspace import Workspace\n"
        f"d = pathlib.Path({str(tmp_path)!r})\n"
        "lineage = SessionLineage(Workspace(d, d / 'record'))\n"
        "lineage.new_generation()\n"
        "import sys; assert 'host_kernel.lineage.flow' not in sys.modules\n"
        "lineage.tracker.forget_names()")
    assert "host_kernel.lineage.flow" in modules


def test_a_one_shot_pool_launches_its_standby_before_jupyter_client(tmp_path: Path) -> None:
    """The control kernel's early standby is launched by ``HostPool.start()`` itself, in
    the caller's thread and before jupyter_client is imported (its imports took a tenth
    of a second ahead of the launch); the pool's thread gives it its KernelManager. Here
    that thread is kept from starting: the standby's process must already run when
    start() returns, and closing the pool ends it."""
    (tmp_path / "ws").mkdir()
    code = f"""
import os, sys, threading
from host_kernel.host._pool import HostPool
assert "jupyter_client" not in sys.modules and "zmq" not in sys.modules
pool = HostPool(size=1, roots=[{str(tmp_path / "ws")!r}], refill=False)
real = threading.Thread.start
threading.Thread.start = lambda self: None
try:
    pool.start()
finally:
    threading.Thread.start = real
def children():
    out = set()
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{{tid}}/children") as f:
            out |= {{int(p) for p in f.read().split()}}
    return out
launched = children()
print("launched", len(launched), "jupyter_client" in sys.modules)
pool._thread = None
pool.close()
for pid in launched:
    try:
        os.kill(pid, 0)
        print("alive", pid)
    except ProcessLookupError:
        pass
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "HOST_KERNEL_FACTORY": "off"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "launched 1 False", out.stdout
    assert not [line for line in lines if line.startswith("alive")], out.stdout


def test_the_zygote_makes_jupyter_clients_provisioner_registry_before_it_forks() -> None:
    """A process's first KernelManager reads every installed distribution's entry points
    for jupyter_client's provisioners (about 10 ms of a relay's start, in a cProfile of
    its Host's start): the zygote makes that registry once, and its forks inherit it."""
    probe = ("from host_kernel.control._zygote import preload\n"
             "from jupyter_client.provisioning.factory import KernelProvisionerFactory as F\n"
             "assert not F.initialized()\n"
             "preload()\n"
             "print(F.initialized(), 'local-provisioner' in F.instance().provisioners)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr
