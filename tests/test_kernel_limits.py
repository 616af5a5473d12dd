"""Limits on the kernel, not just the Host: memory, processes and open files of a generation.

A memory bomb and a fork bomb (in Python, and in ``host.bash``) in a real cell: the
generation is ended with the limit it reached named in the Observation and in the
record, the Host's memory and threads stay where they were, the next cell runs in the
next generation, and the record audits clean. Honest twins: work within the bounds is
untouched. Where the system delegates no cgroup (here switched off with
``HOST_KERNEL_FAKE_NO_CGROUP=1``) the rlimit fallback bounds them too, as recorded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import run_ok

from host_kernel import Host
from host_kernel._errors import BadArguments
from host_kernel.audit import audit
from host_kernel.sandbox.landlock import abi_version
from host_kernel.sandbox.limits import DEFAULT_OPEN_FILES, KernelLimits, cgroup_homes

pytestmark = pytest.mark.skipif(abi_version() < 1, reason="LANDLOCK UNAVAILABLE ON THIS "
                                "MACHINE: no sandbox, so no limits of its own")

MEMORY = 512 * 2**20
PROCESSES = 256
#: A cell that allocates without bound, touching every page.
MEMORY_BOMB = ("hoard = []\nwhile True:\n    hoard.append(bytearray(32 * 2**20))\n"
               "    hoard[-1][::4096] = b'x' * (len(hoard[-1]) // 4096)")
#: A cell that forks without bound; each child forks on, as the parent does.
FORK_BOMB = ("import os, time\nwhile True:\n    try:\n        os.fork()\n"
             "    except OSError:\n        time.sleep(0.01)")
BASH_FORK_BOMB = "r = host.bash(':(){ :|:& };:')"


def _host_rss_and_threads() -> tuple[int, int]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["Threads"])


def _generations(host: Host) -> list[dict[str, Any]]:
    rows = host.ledger.query("SELECT body FROM events WHERE kind = 'generation_started' "
                             "ORDER BY seq")
    return [json.loads(r["body"]) for r in rows]


def _cgroups() -> dict[str, Any]:
    return cgroup_homes()[0]


def _session(tmp_path_factory: pytest.TempPathFactory, **limits: int) -> Iterator[Host]:
    ws = tmp_path_factory.mktemp("limits") / "ws"
    ws.mkdir()
    with Host(ws, **limits) as host:
        if host.confinement is None or not host.confinement.active:
            pytest.skip(f"CONFINEMENT NOT ACTIVE: {host.confinement}")
        yield host
    assert audit(host.record_dir).clean, audit(host.record_dir).summary()


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """A session whose generations may use 512 MiB (and the default processes)."""
    yield from _session(tmp_path_factory, memory_limit=MEMORY)


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """A session whose generations may start 256 processes and threads (and the default
    memory, so that a fork bomb reaches its process limit first)."""
    yield from _session(tmp_path_factory, process_limit=PROCESSES)


def _bomb(host: Host, code: str, limit: str) -> None:
    """Run ``code``; it must end its generation at ``limit``, and nothing else may suffer."""
    rss, threads = _host_rss_and_threads()
    before = host.generation
    obs = host.execute(code, timeout=120)
    assert obs.status == "kernel_died", obs.text
    assert host.generation == before + 1
    started = _generations(host)[-1]
    assert started["reason"] == "kernel_died"
    assert started["ended"]["generation"] == before
    assert started["ended"]["limit"] == limit
    assert started["ended"]["reason"].startswith(f"limit reached: {limit}")
    rss_after, threads_after = _host_rss_and_threads()
    assert rss_after - rss < 64 * 2**20, (rss, rss_after)
    assert threads_after <= threads + 4, (threads, threads_after)
    assert run_ok(host, "print(6 * 7)").strip() == "42"  # the next cell, the next generation
    # The Observation names the limit too (host/_cells.py joins Generations.ended in).
    assert obs.notice is not None and f"limit reached: {limit}" in obs.notice, obs.notice


def test_a_memory_bomb_ends_its_generation_and_says_so(bounded: Host) -> None:
    if "memory" not in _cgroups():
        pytest.skip(f"LOUD: no memory cgroup here ({cgroup_homes()[1].get('memory')}); "
                    f"see test_without_a_cgroup_memory_is_bounded_per_process")
    _bomb(bounded, MEMORY_BOMB, "memory")
    # The honest twin: work within the bound is untouched.
    assert run_ok(bounded, "b = bytearray(128 * 2**20)\nb[::4096] = b'y' * (len(b) // 4096)\n"
                           "print(len(b))").strip() == str(128 * 2**20)


def test_a_fork_bomb_in_a_cell_ends_its_generation_and_says_so(crowded: Host) -> None:
    _bomb(crowded, FORK_BOMB, "processes")


def test_a_fork_bomb_in_a_command_ends_its_generation_and_says_so(crowded: Host) -> None:
    _bomb(crowded, BASH_FORK_BOMB, "processes")
    # The honest twin: many processes within the bound are fine.
    out = run_ok(crowded, "import subprocess\nps = [subprocess.Popen(['sleep', '0.2']) "
                          "for _ in range(64)]\nprint(sum(p.wait() for p in ps))")
    assert out.strip() == "0"
    receipt = crowded.execute("r = host.bash('for i in $(seq 32); do sleep 0.2 & done; wait')\n"
                              "print(r.exit_status)")
    assert receipt.outputs[-1]["text"].strip().splitlines()[-1] == "0"


def test_the_record_says_what_bounds_each_generation(bounded: Host) -> None:
    limits = _generations(bounded)[-1]["confinement"]["limits"]
    default = KernelLimits.defaults()
    assert limits["asked"] == {"memory": MEMORY, "processes": default.processes,
                               "open_files": DEFAULT_OPEN_FILES}
    enforced = limits["enforced"]
    assert enforced["memory"]["max"] == MEMORY
    assert enforced["processes"]["max"] == default.processes
    if "memory" in _cgroups():
        assert "cgroup" in enforced["memory"]["by"]
    if "pids" in _cgroups():
        assert "pids cgroup" in enforced["processes"]["by"]
    assert enforced["open_files"]["by"] == "RLIMIT_NOFILE"
    got = json.loads(run_ok(bounded, "import json, resource\nprint(json.dumps("
                                     "resource.getrlimit(resource.RLIMIT_NOFILE)))"))
    assert got == [enforced["open_files"]["max"]] * 2


def test_open_files_are_bounded_and_the_kernel_lives(tmp_path: Path) -> None:
    with Host(tmp_path, open_files=300) as host:
        obs = host.execute("fs = []\ntry:\n    while True:\n        fs.append(open(__file__ "
                           "if '__file__' in dir() else '/dev/null'))\nexcept OSError as e:\n"
                           "    print(type(e).__name__, e.errno, len(fs) < 300)\n"
                           "finally:\n    [f.close() for f in fs]")
        assert obs.status == "ok" and obs.outputs[-1]["text"].split() == ["OSError", "24",
                                                                          "True"], obs.text
        assert run_ok(host, "print('alive')").strip() == "alive"


def test_limits_are_options_checked_where_they_are_built(tmp_path: Path) -> None:
    for bad in ({"memory_limit": -1}, {"memory_limit": 1.5}, {"memory_limit": True},
                {"memory_limit": 2**20}, {"process_limit": 10}, {"process_limit": "4096"},
                {"open_files": 16}):
        with pytest.raises(BadArguments, match="at least"):
            Host(tmp_path, **bad)
    default = KernelLimits.defaults()
    assert default.processes >= 4096 and default.open_files == DEFAULT_OPEN_FILES
    assert default.memory >= 2**30
    with Host(tmp_path) as host:
        assert host.options.kernel_limits == default
        assert _generations(host)[-1]["confinement"]["limits"]["asked"] == default.to_dict()


def test_without_a_cgroup_memory_is_bounded_per_process(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback: RLIMIT_AS of each process. The cell gets MemoryError; the generation
    and its state live on."""
    monkeypatch.setenv("HOST_KERNEL_FAKE_NO_CGROUP", "1")
    with Host(tmp_path, memory_limit=MEMORY) as host:
        enforced = _generations(host)[-1]["confinement"]["limits"]["enforced"]
        assert enforced["memory"]["by"].startswith("RLIMIT_AS")
        run_ok(host, "kept = 'state'")
        obs = host.execute(MEMORY_BOMB, timeout=120)
        assert obs.status == "error" and "MemoryError" in obs.text, obs.text
        assert run_ok(host, "del hoard\nprint(kept)").strip() == "state"
    assert audit(host.record_dir).clean, audit(host.record_dir).summary()


def test_without_a_cgroup_a_fork_bomb_is_capped_and_ended(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback: the PID namespace's own pid_max (Linux 6.14+) caps the processes,
    root or not, and init ends the generation when its namespace is full."""
    monkeypatch.setenv("HOST_KERNEL_FAKE_NO_CGROUP", "1")
    with Host(tmp_path, process_limit=PROCESSES) as host:
        by = _generations(host)[-1]["confinement"]["limits"]["enforced"]["processes"]["by"]
        if "pid_max" not in by:
            pytest.skip(f"LOUD: this kernel ({os.uname().release}) has no pid_max per PID "
                        f"namespace; processes are bounded by {by} alone")
        _bomb(host, FORK_BOMB, "processes")
    assert audit(host.record_dir).clean, audit(host.record_dir).summary()
