"""The package root's public surface is explicit and stays small."""

from __future__ import annotations

import subprocess
import sys

import host_kernel


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert host_kernel.__all__ == sorted(host_kernel.__all__)
    for name in host_kernel.__all__:
        assert getattr(host_kernel, name) is not None


def test_public_surface() -> None:
    assert set(host_kernel.__all__) == {
        "Artifact", "AuditReport", "BadArguments", "CallRefused", "Check", "FileChange",
        "FileProblem", "FileRecord", "Host", "HostCallError", "HostKernelError", "HostPool",
        "HostState", "KernelError", "Lineage", "Observation", "PathRefused", "Receipt",
        "RecordError", "StorageError", "SubmissionRefused", "TaskMode", "Verdict", "__version__",
        "audit", "resolve_task_mode",
    }


def test_the_kernel_side_does_not_import_the_host_machinery() -> None:
    code = ("import sys, host_kernel.kernel.extension\n"
            "heavy = [m for m in ('nbformat', 'sqlite3', 'jupyter_client.manager', 'httpx', "
            "'host_kernel.host._host') if m in sys.modules]\nprint(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
