"""Shared fixtures: real Hosts over real ipykernels, and a check that none leak."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import descendants
from _pipeline import build_package

from host_kernel import Host

# A shell that starts the suite in the background without job control (nohup …  &, some
# CI runners) hands it SIGINT ignored, and Python then installs no KeyboardInterrupt
# handler; the Ctrl-C tests need one, and so do the processes they start (a caught signal
# is reset to its default in a child, an ignored one stays ignored).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite's Hosts start cold or from pools the tests make: none reaches for the user's
# kernel factory, nor starts one that would outlive the run. tests/test_factory.py
# serves a factory of its own, in a folder of its own, and turns it back on there.
os.environ["HOST_KERNEL_FACTORY"] = "off"

#: Every HTTP request of the suite goes to a server on 127.0.0.1 that the test started.
PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy of the machine's stands between a test and its loopback server."""
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session", autouse=True)
def no_stray_kernels() -> Iterator[None]:
    """Every kernel, command and socket folder the suite starts is gone at its end."""
    before = descendants(os.getpid())
    # Hosts make their socket folders with tempfile; give this run a folder of its own.
    own_tmp = tempfile.mkdtemp(prefix="hkt-")
    saved = tempfile.tempdir
    tempfile.tempdir = own_tmp
    # Records live under $XDG_STATE_HOME by default: keep the suite's out of the real one.
    # ...and the user's own SYSTEM.md files and skills (under $XDG_CONFIG_HOME) out of tests.
    saved_env = {name: os.environ.get(name) for name in ("XDG_STATE_HOME", "XDG_CONFIG_HOME")}
    os.environ["XDG_STATE_HOME"] = os.path.join(own_tmp, "state")
    os.environ["XDG_CONFIG_HOME"] = os.path.join(own_tmp, "config")
    try:
        yield
    finally:
        tempfile.tempdir = saved
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    leftover = descendants(os.getpid()) - before
    # (host-kernel-<uid>: a kernel factory's folder, had a process of the suite started
    # one with the suite's temp folder for its own)
    runtime_after = [*Path(own_tmp).glob("hk-*"), *Path(own_tmp).glob("hks-*"),
                     *Path(own_tmp).glob("host-kernel-*")]
    shutil.rmtree(own_tmp, ignore_errors=True)
    assert not leftover, f"processes left running by the suite: {sorted(leftover)}"
    assert not runtime_after, f"runtime folders (sockets) left behind: {runtime_after}"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def host(workdir: Path) -> Iterator[Host]:
    with Host(workdir) as h:
        yield h


@pytest.fixture
def armed_host(workdir: Path) -> Iterator[Host]:
    with Host(workdir, mode="reusable_pipeline") as h:
        yield h


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """An armed session with a real package and a passing test receipt. Tests that only
    submit share it (one per test module); tests that change files or the record use
    ``fresh``."""
    ws = tmp_path_factory.mktemp("honest") / "ws"
    ws.mkdir()
    with Host(ws, mode="reusable_pipeline") as h:
        h._evidence_cell = build_package(h)  # type: ignore[attr-defined]
        yield h


@pytest.fixture
def fresh(workdir: Path) -> Iterator[Host]:
    with Host(workdir, mode="reusable_pipeline") as h:
        h._evidence_cell = build_package(h)  # type: ignore[attr-defined]
        yield h


@pytest.fixture(scope="session")
def pg_server() -> Iterator[object]:
    """One real PostgreSQL server for the whole run (tests/_pg.py), started on first use.

    Skips, loudly, only where no server can run here; under CI a missing server fails.
    """
    import _pg

    why = _pg.unavailable()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"no PostgreSQL server can run under CI: {why}")
        pytest.skip(f"NO POSTGRESQL SERVER: {why}")
    server = _pg.PgServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: object) -> Iterator[str]:
    """The URL of a new, empty database on the suite's PostgreSQL server, dropped after."""
    url = pg_server.create_database()  # type: ignore[attr-defined]
    try:
        yield url
    finally:
        pg_server.drop_database(url)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An S3 API on 127.0.0.1 (moto's server mode, tests/_s3.py) for one test module, with
    the bucket ``_s3.BUCKET``; skips loudly where moto or s3fs is not installed."""
    import _s3

    if not _s3.HAVE_MOTO:
        pytest.skip(_s3.NO_MOTO)
    with _s3.moto_server(tmp_path_factory.mktemp("aws")) as endpoint:
        yield endpoint
