"""The control kernel starts its kernel before it imports the Host: a one-shot standby.

``python -m host_kernel.control`` launches a standby kernel (host/_pool.py,
``refill=False``) confined to the workspace as its first act, imports the Host
while the standby imports ipykernel, and hands it the session's orders. These tests
start the real kernelspec through jupyter_client and read what the record says.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import descendants
from test_control_kernel import RelayKernel, kernelspecs

from host_kernel import Host, HostPool


@pytest.fixture
def specs(tmp_path: Path) -> Iterator[Path]:
    with kernelspecs(tmp_path) as prefix:
        yield prefix


def standbys_under(pid: int) -> list[int]:
    """The standby kernels (handed out or not) among ``pid``'s descendants (not the
    sandbox inits in front of them, whose command lines hold the kernel's)."""
    found = []
    for child in descendants(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(b"host_kernel.kernel.standby" in part for part in argv) and \
                not any(b"host_kernel.sandbox.init" in part for part in argv):
            found.append(child)
    return found


def relay_pid(kernel: RelayKernel) -> int:
    proc = kernel.km.provisioner.process  # type: ignore[union-attr]
    return int(proc.pid)


def test_the_first_kernel_is_the_standby_started_before_the_imports(
        specs: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "ws"
    workdir.mkdir()
    kernel = RelayKernel.start(workdir)
    try:
        printed = kernel.stdout("print(host.cell_id, host.generation)")
        cell_id, generation = printed.split()
        assert generation == "1"
        [started] = kernel.events("generation_started")
        warm = started["warm"]
        assert warm["used"] is True, warm
        # Before the hand-out it could write only the workspace and its own folder.
        writable = {os.path.realpath(p) for p in warm["pool_writable"]}
        assert os.path.realpath(workdir) in writable
        assert all(p == os.path.realpath(workdir) or Path(p).name.startswith("hks-")
                   for p in writable), writable
        # One kernel under the relay: the pool started no second standby after the first.
        time.sleep(0.5)
        assert len(standbys_under(relay_pid(kernel))) == 1
        [cell] = [c for c in kernel.events("cell_started") if c["cell_id"] == cell_id]
        assert cell["generation"] == 1
    finally:
        kernel.stop()


def test_host_kernel_warm_off_starts_the_kernel_cold(specs: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_KERNEL_WARM", "off")
    workdir = tmp_path / "ws"
    workdir.mkdir()
    kernel = RelayKernel.start(workdir)
    try:
        assert kernel.stdout("print(1 + 1)").strip() == "2"
        [started] = kernel.events("generation_started")
        assert "warm" not in started
        assert standbys_under(relay_pid(kernel)) == []
    finally:
        kernel.stop()


def test_a_one_shot_pool_starts_one_standby_and_no_more(tmp_path: Path) -> None:
    workdir = tmp_path / "ws"
    workdir.mkdir()
    with HostPool(size=1, roots=[workdir], refill=False) as pool:
        with Host(workdir, pool=pool) as host:
            assert host.execute("x = 1").status == "ok"
            time.sleep(0.5)  # a refilling pool would be starting its next standby by now
            assert pool.pids() == []
            assert pool.stats["started"] == 1 and pool.stats["handed_out"] == 1
        # A second session finds nothing waiting and starts cold, saying why.
        with Host(workdir, pool=pool) as again:
            rows = again.ledger.query(
                "SELECT body FROM events WHERE session = ? AND kind = 'generation_started'",
                (again.session_id,))
            warm = json.loads(rows[0]["body"])["warm"]
            assert warm["used"] is False and warm["reason"] == "no standby kernel was waiting"


def test_a_one_shot_pool_refuses_a_bad_refill_argument(tmp_path: Path) -> None:
    from host_kernel import BadArguments

    with pytest.raises(BadArguments, match="refill"):
        HostPool(size=1, roots=[tmp_path], refill="no")  # type: ignore[arg-type]
