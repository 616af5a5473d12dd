"""Warm starts and instant restarts: standby kernels from a HostPool, spare kernels.

Real pools start real standby kernels (confined where Landlock works here);
each test says what a session handed one of them can and cannot do, and that
every process a pool or a spare starts is gone when it should be.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import descendants

from host_kernel import BadArguments, Host, HostPool
from host_kernel._procs import pid_alive
from host_kernel.sandbox.landlock import abi_version

needs_landlock = pytest.mark.skipif(
    abi_version() < 1, reason="LOUD SKIP: Landlock is not available on this kernel, so a "
                              "pooled kernel's confinement cannot be shown here")


def _generations(host: Host) -> list[dict[str, object]]:
    assert host.ledger is not None
    return [json.loads(row["body"]) for row in host.ledger.query(
        "SELECT body FROM events WHERE kind = 'generation_started' AND session = ? "
        "ORDER BY seq", (host.session_id,))]


def _until(check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def _gone(pids: set[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) and not _zombie(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if pid_alive(p)]}"
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "sessions"
    root.mkdir()
    (root / "a").mkdir()
    (root / "b").mkdir()
    return root


@pytest.fixture
def pool(roots: Path) -> Iterator[HostPool]:
    with HostPool(size=1, roots=[roots]) as p:
        assert p.wait_ready(90), p.broken
        yield p


def _warm(host: Host) -> dict[str, object]:
    warm = _generations(host)[0].get("warm")
    assert isinstance(warm, dict)
    return warm


# ---------------------------------------------------------------------------- confinement


@needs_landlock
def test_a_pooled_kernel_cannot_write_outside_its_sessions_workspace(pool: HostPool,
                                                                      roots: Path) -> None:
    """Started before the session, the kernel is narrowed to it: every thread, every command."""
    with Host(roots / "a", pool=pool) as host:
        warm = _warm(host)
        assert warm["used"] is True and warm["pool"] == pool.id and warm["ready"] is True
        assert host.confinement is not None and host.confinement.active
        out = host.execute("open('mine.txt', 'w').write('ok')")
        assert out.status == "ok"
        assert (roots / "a" / "mine.txt").read_text() == "ok"
        # The other workspace lies beneath the pool's roots, so the pool's own domain
        # allows it: only the session's, stacked on top, stops the write.
        denied = host.execute(f"open({str(roots / 'b' / 'x.txt')!r}, 'w')")
        assert denied.status == "error" and "PermissionError" in denied.text
        # ipykernel's own threads started after the narrowing: code run on them is denied
        # too (Landlock binds a thread, so a thread started before would not be).
        probe = textwrap.dedent(f"""
            import threading
            kernel = get_ipython().kernel
            results = {{}}
            done = threading.Event()
            def attempt(name):
                try:
                    open({str(roots / 'b' / 'from-thread.txt')!r}, 'w')
                    results[name] = 'written'
                except PermissionError:
                    results[name] = 'denied'
                if len(results) == 2:
                    done.set()
            kernel.iopub_thread.io_loop.add_callback(attempt, 'iopub')
            kernel.control_thread.io_loop.add_callback(attempt, 'control')
            done.wait(10)
            print(sorted(results.items()))
        """)
        out = host.execute(probe)
        assert "[('control', 'denied'), ('iopub', 'denied')]" in out.text, out.text
        target = roots / "b" / "cmd.txt"
        bash = host.execute(f"r = host.bash('touch {target}'); print(r.exit_status)")
        assert bash.text.strip().endswith("1"), bash.text
        assert not any((roots / "b").iterdir())
        # The tracer learned the session's workspace at hand-out: a command's change is
        # found from what it traced, as in a cold start.
        if pool.traced:
            assert host.tracing["status"] == "seccomp"
            host.execute("r = host.bash('echo traced > t.txt')")
            assert host.ledger is not None
            row = host.ledger.query("SELECT body FROM events WHERE kind = 'receipt_recorded' "
                                      "AND session = ?", (host.session_id,))[-1]
            body = json.loads(row["body"])
            assert body["changes_found_by"] == "traced", body.get("traced")
            assert [c["path"] for c in body["changes"]] == ["t.txt"]


@needs_landlock
def test_the_pools_domain_stays_under_the_sessions(roots: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Rulesets stack: a session right the pool's domain lacks is not gained by handing out.

    The Host normally refuses such a standby (a cold start, and the record says why);
    with that check taken away, the workspace outside the pool's roots stays unwritable.
    """
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with HostPool(size=1, roots=[roots]) as pool:
        assert pool.wait_ready(90), pool.broken
        with Host(outside, pool=pool) as host:
            warm = _warm(host)
            assert warm["used"] is False
            assert "does not grant the session's rules" in str(warm["reason"])
            assert host.execute("open('f.txt', 'w').write('x')").status == "ok"
            cold_tmp = host.execute("import os; print(os.environ['TMPDIR'])").text.strip()
        assert pool.wait_ready(90)
        import host_kernel.host._generations as host_module
        monkeypatch.setattr(host_module, "uncovered", lambda broad, narrow: [])
        with Host(outside, pool=pool) as host:
            assert _warm(host)["used"] is True, _warm(host)
            # The refused standby was not given back: its folder held the cold session's
            # private one, which no other session may share.
            warm_tmp = host.execute("import os; print(os.environ['TMPDIR'])").text.strip()
            assert warm_tmp != cold_tmp
            out = host.execute("open('g.txt', 'w')")
            assert out.status == "error" and "PermissionError" in out.text, out.text
        assert not (outside / "g.txt").exists()


def test_a_standby_refuses_to_narrow_with_a_second_thread() -> None:
    """Landlock binds only the calling thread: narrowing beside another thread would leave
    that thread in the pool's domain, so the standby stops instead."""
    code = textwrap.dedent("""
        import os, threading, time
        from host_kernel.kernel.standby import StandbyError, narrow
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
        try:
            narrow({"ruleset": True}, [os.open("/dev/null", os.O_RDONLY)])
        except StandbyError as exc:
            print("refused:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert "refused: 2 threads before narrowing" in out.stdout, out.stderr


# ---------------------------------------------------------------------------- handing out


def test_a_standby_that_died_while_waiting_is_replaced_not_handed_out(pool: HostPool,
                                                                     roots: Path) -> None:
    [dead] = pool.pids()
    os.kill(dead, signal.SIGKILL)
    _until(lambda: not pool._idle[0].alive() if pool._idle else True)
    with Host(roots / "a", pool=pool) as host:
        warm = _warm(host)
        assert warm["used"] is False and warm["reason"] == "no standby kernel was waiting"
        assert host.kernel_pid != dead
        assert host.execute("1 + 1").status == "ok"
    assert pool.stats["replaced"] == 1
    _until(lambda: len(pool.pids()) == 1 and pool.pids()[0] != dead, 90)
    with Host(roots / "b", pool=pool) as host:
        assert _warm(host)["used"] is True, _warm(host)
        assert host.kernel_pid != dead


def test_a_pool_refills_and_each_session_gets_its_own_kernel(pool: HostPool,
                                                             roots: Path) -> None:
    with Host(roots / "a", pool=pool) as first:
        first.execute("x = 'first'")
        assert pool.wait_ready(90)
        with Host(roots / "b", pool=pool) as second:
            assert _warm(second)["used"] is True, _warm(second)
            assert first.kernel_pid != second.kernel_pid
            out = second.execute("print(globals().get('x'))")
            assert out.text.strip().endswith("None")
            cwd = second.execute("import os; print(os.getcwd())")
            assert cwd.text.strip().endswith(str((roots / "b").resolve()))
            env = second.execute("import os; print(os.environ['HOST_KERNEL_SESSION'])")
            assert second.session_id in env.text
            _started_without_the_debugger(second)
            _started_without_listing_interfaces(second)
    assert pool.stats["handed_out"] == 2


def _started_without_the_debugger(host: Host) -> None:
    """The kernel was built without importing debugpy (no front offers the debugger), and
    a cell may still import it."""
    out = host.execute("import sys\nprint(sorted(m for m in sys.modules if 'pydev' in m "
                       "or m.startswith('debugpy')))")
    assert out.status == "ok" and out.text.strip() == "[]", out.text
    reply = host.execute("import debugpy\nprint(debugpy.__name__)")
    assert reply.status == "ok" and reply.text.strip() == "debugpy", reply.text


def _started_without_listing_interfaces(host: Host) -> None:
    """The kernel read its connection file's address without working out a default one
    (jupyter_client's ``localhost()`` imports psutil to list every interface)."""
    out = host.execute("import sys\nprint('psutil' in sys.modules)")
    assert out.status == "ok" and out.text.strip().endswith("False"), out.text


def test_a_cold_kernel_starts_without_the_debugger(host: Host) -> None:
    assert _generations(host)[0].get("warm") is None
    _started_without_the_debugger(host)
    _started_without_listing_interfaces(host)


def test_a_refill_waits_while_another_standby_waits(roots: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby started beside one just handed out would take a core from the session's
    kernel while it starts: the refill waits (QUIET) while another standby is still there
    to serve, and starts at once when none is."""
    from host_kernel.host import _pool

    monkeypatch.setattr(_pool, "QUIET", 600.0)
    with HostPool(size=2, roots=[roots]) as pool:
        assert pool.wait_ready(90), pool.broken
        first = pool.take()
        assert first is not None
        try:
            time.sleep(1.0)
            assert pool.stats["started"] == 2 and not pool._starting
            assert len(pool.pids()) == 1
            second = pool.take()
            assert second is not None
            try:
                _until(lambda: pool.stats["started"] == 3, 90)  # at once, not in 600 s
                _until(lambda: len(pool.pids()) == 1, 90)
            finally:
                second.close()
        finally:
            first.close()


def test_a_session_that_hides_a_name_the_standby_holds_starts_cold(roots: Path,
                                                                   monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """/proc/self/environ keeps a process's first environment: a standby that started with a
    name the session hides must not serve it."""
    monkeypatch.setenv("LAB_PROJECT_ID", "do-not-show")
    with HostPool(size=1, roots=[roots]) as pool:
        assert pool.wait_ready(90), pool.broken
        with Host(roots / "a", pool=pool, hide_env=("LAB_PROJECT_ID",)) as host:
            warm = _warm(host)
            assert warm["used"] is False and "LAB_PROJECT_ID" in str(warm["reason"])
            out = host.execute("print(open('/proc/self/environ', 'rb').read().count(b'LAB_PRO'))")
            assert out.text.strip().endswith("0")


def test_a_pool_told_to_hide_a_name_serves_sessions_that_hide_it(
        roots: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAB_PROJECT_ID", "do-not-show")
    with HostPool(size=1, roots=[roots], hide_env=("LAB_PROJECT_ID",)) as pool:
        assert pool.wait_ready(90), pool.broken
        with Host(roots / "a", pool=pool, hide_env=("LAB_PROJECT_ID",)) as host:
            assert _warm(host)["used"] is True, _warm(host)
            out = host.execute("import os; print('LAB_PROJECT_ID' in os.environ)")
            assert out.text.strip() == "False"


def test_a_pool_hides_the_names_an_iterator_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAB_PROJECT_ID", "do-not-show")
    pool = HostPool(size=1, hide_env=iter(["LAB_PROJECT_ID"]))  # type: ignore[arg-type]
    assert pool.refusal(confined=pool.confinement.active, traced=pool.traced,
                        hidden=frozenset({"LAB_PROJECT_ID"})) is None


def test_a_record_that_cannot_open_after_the_orders_leaves_no_kernel(pool: HostPool,
                                                                    roots: Path,
                                                                    tmp_path: Path) -> None:
    """A new session's standby gets its orders before the record opens (the record opens
    while the kernel initialises: Host._start_orders_first). When the record then cannot
    open, the start fails with the record's error and the kernel it ordered is stopped."""
    from host_kernel import HostKernelError

    [standby] = pool.pids()
    record = tmp_path / "record"
    (record / "ledger.sqlite").mkdir(parents=True)  # a folder where the ledger's file goes
    host = Host(roots / "a", pool=pool, record_dir=record)
    with pytest.raises(HostKernelError):
        host.start()
    assert pool.stats["handed_out"] == 1  # it was ordered, then stopped
    _gone({standby})
    assert not [p for p in descendants(os.getpid()) if p == standby]
    with Host(roots / "b", pool=pool) as other:  # the pool serves the next session
        assert other.execute("1 + 1").status == "ok"


def test_an_unconfined_pool_serves_an_unconfined_session(roots: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Where Landlock is not available, a pool's standby is launched bare (no sandbox's
    init in front of it, its parent the pool's process) and serves a session as well."""
    monkeypatch.setenv("HOST_KERNEL_FAKE_NO_LANDLOCK", "1")
    with HostPool(size=1, roots=[roots]) as pool:
        assert not pool.confinement.active
        assert pool.wait_ready(90), pool.broken
        [standby] = pool.pids()
        with Host(roots / "a", pool=pool) as host:
            assert _warm(host)["used"] is True, _warm(host)
            assert host.kernel_pid == standby
            out = host.execute("import os\nprint(os.getcwd(), 6 * 7)")
            assert f"{(roots / 'a').resolve()} 42\n" in out.text, out.text  # (and the notice)
    _gone({standby})


def test_a_process_started_otherwise_than_its_kernelspec_says_is_not_adopted(
        tmp_path: Path) -> None:
    """A pool starts its standbys' processes itself, before jupyter_client is imported,
    and hands them to a KernelManager after (host/_kernel.py ``started_manager``): only
    a process started with the very command jupyter_client would have made of the
    kernelspec is taken."""
    from host_kernel import KernelError
    from host_kernel.host._kernel import started_manager, stop_manager

    argv = [sys.executable, "-c", "import time; time.sleep(60)", "-f", "{connection_file}"]
    conn = tmp_path / "kernel.json"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    try:
        with pytest.raises(KernelError, match="another command line"):
            started_manager(conn, argv, other)
        assert not conn.exists()
    finally:
        other.kill()
        other.wait()
    same = subprocess.Popen([a.replace("{connection_file}", str(conn)) for a in argv],
                            start_new_session=True)
    manager = started_manager(conn, argv, same)
    try:
        assert manager.is_alive() and json.loads(conn.read_text())["transport"] == "ipc"
    finally:
        stop_manager(manager, None, None)
    assert same.poll() is not None and not conn.exists()


def test_bad_pool_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BadArguments):
        HostPool(size=0)
    for hide_env in ("LAB_PROJECT_ID", None, 5, [["LAB_PROJECT_ID"]], [1]):
        with pytest.raises(BadArguments):
            HostPool(size=1, hide_env=hide_env)  # type: ignore[arg-type]
    with pytest.raises(BadArguments):
        HostPool(size=1, roots=[tmp_path / "missing"])
    with pytest.raises(BadArguments):
        Host(tmp_path, pool="a pool")  # type: ignore[arg-type]
    with pytest.raises(BadArguments):
        Host(tmp_path, spare="yes")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- cleanup


def test_closing_a_pool_ends_every_standby_but_not_the_sessions_it_served(roots: Path) -> None:
    before = descendants(os.getpid())
    pool = HostPool(size=1, roots=[roots]).start()
    try:
        assert pool.wait_ready(90), pool.broken
        host = Host(roots / "a", pool=pool).start()
        try:
            assert pool.wait_ready(90)
            standby_tree = descendants(os.getpid()) - before
            folders = [standby.folder for standby in pool._idle]
            assert folders and all(folder.is_dir() for folder in folders)
            pool.close()
            host.execute("x = 1")
            kept = descendants(os.getpid()) - before
            assert host.kernel_pid in kept
            assert host.execute("print(x + 1)").text.strip().endswith("2")
        finally:
            host.close()
    finally:
        pool.close()
    _gone(standby_tree)
    assert not (descendants(os.getpid()) - before)
    assert not any(folder.exists() for folder in folders)


def test_a_pools_kernels_end_when_its_process_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from host_kernel import HostPool
        pool = HostPool(size=2, roots=[{str(tmp_path)!r}]).start()
        assert pool.wait_ready(90), pool.broken
        print(" ".join(map(str, pool.pids())), flush=True)
        time.sleep(600)
    """)
    # A pool killed with SIGKILL cannot remove its standbys' folders: keep them in a
    # short folder of the test's own (IPC socket paths must stay short) and remove it.
    runtime = Path(tempfile.mkdtemp(prefix="hkp-", dir="/tmp"))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONPATH": str(Path(__file__).parent.parent),
                                              "TMPDIR": str(runtime)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        pids = {int(p) for p in line.split()}
        assert len(pids) == 2, line
        tree = set(pids)
        for pid in pids:
            tree |= descendants(pid)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    try:
        _gone(tree)
        assert len(list(runtime.glob("hks-*"))) == 2  # theirs, left by the kill
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


# ---------------------------------------------------------------------------- spare kernels


def test_a_restart_swaps_in_the_spare_and_a_new_spare_is_started(workdir: Path) -> None:
    with Host(workdir, spare=True) as host:
        host.execute("x = 1")
        _until(lambda: host.generations.spare_kernel is not None, 90)
        spare = host.generations.spare_kernel
        assert spare is not None and spare.generation == 2
        assert host.restart() == 2
        assert host.generations.kernel is spare
        assert host.execute("print('x' in globals())").text.strip().endswith("False")
        out = host.execute("import os; print(os.environ['HOST_KERNEL_GENERATION'])")
        assert out.text.strip().endswith("2")
        assert _generations(host)[-1]["spare"] == {"used": True}
        _until(lambda: host.generations.spare_kernel is not None, 90)
        assert host.generations.spare_kernel is not None and host.generations.spare_kernel.generation == 3
        assert host.generations.spare_kernel.pid != spare.pid


def test_a_spare_that_died_is_not_swapped_in(workdir: Path) -> None:
    with Host(workdir, spare=True) as host:
        _until(lambda: host.generations.spare_kernel is not None, 90)
        spare = host.generations.spare_kernel
        assert spare is not None and spare.pid is not None
        os.kill(spare.pid, signal.SIGKILL)
        _until(lambda: not spare.is_alive())
        host.restart()
        assert host.generations.kernel is not spare
        last = _generations(host)[-1]
        assert last["spare"] == {"used": False, "reason": "the spare kernel died while it waited"}
        assert host.execute("1 + 1").status == "ok"


def test_a_kernel_death_is_recovered_on_the_spare(workdir: Path) -> None:
    with Host(workdir, spare=True) as host:
        _until(lambda: host.generations.spare_kernel is not None, 90)
        spare = host.generations.spare_kernel
        died = host.execute("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        assert died.status == "kernel_died"
        assert host.generations.kernel is spare
        assert _generations(host)[-1]["reason"] == "kernel_died"
        assert host.execute("2 + 2").status == "ok"


def test_closing_a_host_ends_its_spare(workdir: Path) -> None:
    before = descendants(os.getpid())
    with Host(workdir, spare=True) as host:
        _until(lambda: host.generations.spare_kernel is not None, 90)
        tree = descendants(os.getpid()) - before
        assert len(tree) >= 2
    _gone(tree)


def test_orders_taken_at_once_are_not_a_broken_pipe(tmp_path: Path) -> None:
    """A standby that has read its whole orders closes its end at once (it then takes
    its standard input from /dev/null). The Host must not write to the socket after the
    last byte of the orders: ``sendall(b"")`` still sends, and fails with EPIPE, which
    made an unconfined pool's hand-out fail one time in two."""
    import socket
    import threading

    from host_kernel.host._kernel import KernelGeneration, new_manager
    from host_kernel.kernel.standby import read_orders

    manager = new_manager(tmp_path / "kernel.json", [sys.executable, "-f", "{connection_file}"])
    orders = {"env": {"X": "y" * 2000}, "cwd": str(tmp_path), "ruleset": False}
    for _ in range(200):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        got: list[object] = []

        def standby(theirs: socket.socket = theirs, got: list[object] = got) -> None:
            got.append(read_orders(theirs.fileno()))
            theirs.close()

        reader = threading.Thread(target=standby)
        reader.start()
        try:
            KernelGeneration.order(1, "token", manager, None, {}, mine.fileno(), orders)
        finally:
            reader.join(timeout=10)
            mine.close()
        assert got and got[0] == (orders, [])
