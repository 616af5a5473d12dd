"""A small real package with passing tests, built through host calls, and a way to submit it.

Shared by the verification, audit and adversarial tests.
"""

from __future__ import annotations

import json

from host_kernel import Host

from _helpers import bash_exit_cell

SOURCES = {
    "pkg/__init__.py": "",
    "pkg/core.py": "def add(a, b):\n    return a + b\n",
    "pkg/cli.py": "import sys\nfrom pkg.core import add\n\n\ndef main():\n"
                  "    print(add(*map(int, sys.argv[1:3])))\n\n\nif __name__ == '__main__':\n"
                  "    main()\n",
    "tests/test_core.py": "from pkg.core import add\n\n\ndef test_add():\n"
                          "    assert add(1, 2) == 3\n",
}
SUMMARY = "pkg.core owns the arithmetic; pkg.cli is the thin command-line entry point."
TEST_CMD = "python -m pytest -q tests"


def build_package(host: Host) -> str:
    """Write and save the package, run its tests; return the producing cell id."""
    writes = "\n".join(f"host.write_file({p!r}, {c!r})" for p, c in SOURCES.items())
    saves = "\n".join(f"host.save_artifact({p!r})" for p in SOURCES)
    assert host.execute(writes + "\n" + saves).status == "ok"
    obs = host.execute(bash_exit_cell(TEST_CMD))
    assert "EXIT 0" in obs.text, obs.text
    return obs.cell_id


def submit(host: Host, **overrides: object) -> tuple[bool, dict[str, bool], str]:
    """Submit from a new cell; returns (accepted, {code: ok} of failed+passed, text)."""
    kwargs: dict[str, object] = {
        "output": {"summary": "adds numbers", "files": ["pkg/core.py"]},
        "completion_bullets": ["wrote pkg.core.add with a test"],
        "task_status": "completed",
        "source_files": list(SOURCES),
        "entry_points": ["pkg/cli.py"],
        "architecture_summary": SUMMARY,
        "test_evidence": [{"command": TEST_CMD, "producing_cell_id": host._evidence_cell}],  # type: ignore[attr-defined]
    }
    kwargs.update(overrides)
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k not in ("output", "completion_bullets"))
    code = (f"from host_kernel import SubmissionRefused\n"
            f"try:\n    v = host.submit_output({kwargs['output']!r}, {kwargs['completion_bullets']!r}, {args})\n"
            f"except SubmissionRefused as e:\n    v = e.verdict\n"
            f"print('VERDICT', __import__('json').dumps(v.to_dict()))")
    obs = host.execute(code)
    # The verdict line is in one of the cell's stream outputs; others (a reproduction's
    # progress on stdout, a warning on stderr) may come before or after it.
    printed = "".join(o.get("text", "") for o in obs.outputs if o.get("output_type") == "stream")
    line = next(l for l in printed.splitlines() if l.startswith("VERDICT"))
    verdict = json.loads(line[len("VERDICT "):])
    failed = {c["code"]: c["ok"] for c in verdict["checks"] if not c["ok"]}
    return verdict["accepted"], failed, obs.text
