"""What the control kernel's relay imports before its first cell.

With no factory, the relay imports the Host while its early standby kernel imports
ipykernel beside it, on the same cores (docs/jupyter.md, "What starts when"): every
module the Host needs only at a cell (the dataflow tracker, the values and their cards,
the verifier, the reproduction) is imported when that cell comes, not at the start.
And the standby is started before ``host.bash``'s machinery is imported.
"""

from __future__ import annotations

import json
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
