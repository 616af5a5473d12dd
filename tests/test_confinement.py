"""The trust boundary enforced by the OS: what confined cell code and commands cannot do.

Every attempt runs in a real cell of a real kernel that the Host started inside
its sandbox (Landlock, plus a user and PID namespace where the system allows).
Where Landlock is missing the confined tests skip, loudly; the fake-missing
tests run everywhere.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import sys
import sysconfig
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_kernel import Host
from host_kernel._errors import ConfinementError
from host_kernel.sandbox.landlock import abi_version

LANDLOCK = abi_version()
needs_landlock = pytest.mark.skipif(
    LANDLOCK < 1, reason="LANDLOCK UNAVAILABLE ON THIS MACHINE: the OS boundary cannot be tested")


def _denied(host: Host, code: str) -> str:
    """Run ``code``; it must fail with PermissionError. Returns the Observation's text."""
    obs = host.execute(code)
    assert obs.status == "error", obs.text
    assert "PermissionError" in obs.text, obs.text
    return obs.text


@pytest.fixture
def confined(host: Host) -> Host:
    if not host.confinement or not host.confinement.active:
        pytest.skip(f"CONFINEMENT NOT ACTIVE: {host.confinement}")
    return host


# -- the file system ----------------------------------------------------------------------------


@needs_landlock
def test_the_record_folder_cannot_be_written_or_even_read(confined: Host) -> None:
    record = str(confined.record_dir)
    text = _denied(confined, f"open({record + '/forged.txt'!r}, 'w')")
    assert "confined by the operating system" in text  # the cell is told why
    _denied(confined, f"open({record + '/ledger.sqlite'!r}, 'rb').read(16)")
    _denied(confined, f"open({record + '/record.key'!r}, 'rb').read()")
    assert not (confined.record_dir / "forged.txt").exists()


@needs_landlock
def test_site_packages_and_the_interpreter_are_read_only(confined: Host) -> None:
    purelib = sysconfig.get_paths()["purelib"]
    _denied(confined, f"open({purelib + '/evil.pth'!r}, 'w').write('import os')")
    _denied(confined, f"open({sys.base_prefix + '/evil.txt'!r}, 'w')")
    assert not Path(purelib, "evil.pth").exists()
    # reading and importing from them is fine
    assert confined.execute("import json, sqlite3; print('ok')").status == "ok"


@needs_landlock
def test_writes_outside_the_workspace_and_to_shared_tmp_are_denied(confined: Host,
                                                                    workdir: Path) -> None:
    outside = workdir.parent / "outside.txt"
    _denied(confined, f"open({str(outside)!r}, 'w')")
    _denied(confined, "open('/tmp/host-kernel-escape.txt', 'w')")
    _denied(confined, "import os\nos.mkdir('/var/tmp/host-kernel-escape')")
    assert not outside.exists() and not Path("/tmp/host-kernel-escape.txt").exists()
    obs = confined.execute(
        "import os, tempfile\n"
        "p = os.path.join(tempfile.gettempdir(), 'scratch.txt')\n"
        "open(p, 'w').write('x')\n"
        "open('in-workspace.txt', 'w').write('y')\n"
        "print(p.startswith(os.environ['TMPDIR']))")
    assert obs.status == "ok" and obs.outputs[-1]["text"].strip() == "True"
    assert (workdir / "in-workspace.txt").read_text() == "y"


@needs_landlock
def test_other_sessions_runtime_folders_are_hidden(confined: Host) -> None:
    # Every Host's socket folder (with its kernels' connection files and HMAC keys)
    # lives under the temp root; a confined kernel may not even list it.
    runtime_parent = str(Path(confined.generations.runtime_dir).parent)  # type: ignore[arg-type]
    _denied(confined, f"import os\nos.listdir({runtime_parent!r})")


# -- processes ------------------------------------------------------------------------------


@needs_landlock
def test_the_host_cannot_be_signalled_and_lives_on(confined: Host) -> None:
    obs = confined.execute(
        "import os, signal\n"
        "for pid in (os.getppid(), 1):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "        print('killed', pid)\n"
        "    except (PermissionError, ProcessLookupError) as e:\n"
        "        print('refused', type(e).__name__)\n"
        f"try:\n    os.kill({os.getpid()}, signal.SIGKILL)\n"
        "except (PermissionError, ProcessLookupError) as e:\n    print('refused', type(e).__name__)")
    assert "killed" not in obs.text
    assert obs.text.count("refused") == 3
    assert confined.execute("print('still here')").outputs[0]["text"] == "still here\n"


@needs_landlock
def test_the_hosts_environment_cannot_be_read(confined: Host,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    obs = confined.execute(
        f"try:\n    data = open('/proc/{os.getpid()}/environ', 'rb').read()\n"
        "    print('READ', len(data))\n"
        "except OSError as e:\n    print('refused', type(e).__name__)")
    assert "READ" not in obs.text and "refused" in obs.text
    if confined.confinement and confined.confinement.pid_namespace:
        # In its own PID namespace the kernel sees only the sandbox's processes.
        listing = confined.execute("import os\nprint(sorted(int(p) for p in os.listdir('/proc') "
                                   "if p.isdigit()))")
        pids = json.loads(listing.outputs[0]["text"])
        assert os.getpid() not in pids and max(pids) < 1000


@needs_landlock
def test_the_hosts_llm_key_never_reaches_the_kernel(workdir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HK_TEST_LLM_KEY", "sk-host-only-0123456789")

    class Config:
        api_key_env = "HK_TEST_LLM_KEY"

    class FakeLLM:
        config = Config()

    with Host(workdir, llm=FakeLLM()) as host:
        obs = host.execute("import os\nprint(os.environ.get('HK_TEST_LLM_KEY'))\n"
                           "r = host.bash('echo \"[$HK_TEST_LLM_KEY]\"')")
        assert "None" in obs.text and "[]" in obs.text
        started = json.loads(host.ledger.query(
            "SELECT body FROM events WHERE kind = 'session_started'")[0]["body"])
        assert "HK_TEST_LLM_KEY" not in started["kernel_env"]


@needs_landlock
def test_a_host_bash_command_is_confined_the_same_way(confined: Host, workdir: Path) -> None:
    record = str(confined.record_dir)
    obs = confined.execute(
        f"r = host.bash('touch /tmp/hk-bash-escape; echo a; touch {record}/x; echo b; "
        f"touch ok.txt; cat /proc/{os.getpid()}/environ; kill -9 {os.getpid()}; echo done')\n"
        "print(r.exit_status)")
    assert "Permission denied" in obs.text
    assert not Path("/tmp/hk-bash-escape").exists() and not Path(record, "x").exists()
    assert (workdir / "ok.txt").exists()
    assert confined.execute("print(1)").status == "ok"  # the Host is alive


@needs_landlock
def test_the_hosts_llm_key_file_is_hidden_from_the_kernel(workdir: Path,
                                                          tmp_path: Path) -> None:
    key = tmp_path / "keys" / "llm.key"
    key.parent.mkdir()
    key.write_text("sk-from-a-file-0123456789")

    class Config:
        api_key_env = None
        api_key_file = str(key)

    class FakeLLM:
        config = Config()

    with Host(workdir, llm=FakeLLM()) as host:
        _denied(host, f"open({str(key)!r}).read()")
        assert host.confinement is not None and str(key) in host.confinement.hidden


# -- network --------------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


CONNECT = ("import socket\ns = socket.socket()\ns.settimeout(5)\n"
           "try:\n    s.connect(('127.0.0.1', {port}))\n    print('connected')\n"
           "except OSError as e:\n    print('refused', type(e).__name__)\nfinally:\n    s.close()")


@pytest.mark.skipif(LANDLOCK < 4, reason="LANDLOCK ABI < 4: no network rules on this kernel")
def test_network_false_denies_tcp_connect_and_is_recorded(workdir: Path, listener: int) -> None:
    with Host(workdir, network=False) as host:
        obs = host.execute(CONNECT.format(port=listener))
        assert "refused PermissionError" in obs.text
        bash = host.execute(f"r = host.bash('exec 3<>/dev/tcp/127.0.0.1/{listener}')\n"
                            "print(r.exit_status)")
        assert bash.outputs[-1]["text"].strip() != "0"
        started = json.loads(host.ledger.query(
            "SELECT body FROM events WHERE kind = 'session_started'")[0]["body"])
        assert started["confinement"]["network"] is False


@needs_landlock
def test_network_is_allowed_by_default(confined: Host, listener: int) -> None:
    """No Landlock refusal of TCP by default; but in a network namespace of its own the
    kernel cannot reach the machine's loopback (docs/security.md), so the listener there
    refuses it as an address with nothing behind it would."""
    text = confined.execute(CONNECT.format(port=listener)).text
    if confined.confinement is not None and confined.confinement.network_namespace:
        assert "refused ConnectionRefusedError" in text, text
    else:
        assert "connected" in text, text


# -- package installs -----------------------------------------------------------------------


def _wheel(folder: Path) -> Path:
    """A tiny pure-Python wheel, built here (no network, no build backend)."""
    files = {"hk_tinypkg/__init__.py": b"VALUE = 42\n",
             "hk_tinypkg-1.0.dist-info/METADATA":
                 b"Metadata-Version: 2.1\nName: hk-tinypkg\nVersion: 1.0\n",
             "hk_tinypkg-1.0.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                 b"Tag: py3-none-any\n"}

    def row(name: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{name},sha256={digest},{len(data)}"

    record = "\n".join(row(n, d) for n, d in files.items())
    record += "\nhk_tinypkg-1.0.dist-info/RECORD,,\n"
    path = folder / "hk_tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("hk_tinypkg-1.0.dist-info/RECORD", record)
    return path


@needs_landlock
def test_pip_install_lands_in_the_session_overlay_and_imports_next_cell(
        confined: Host, workdir: Path) -> None:
    wheel = _wheel(workdir)
    obs = confined.execute(f"r = host.bash('python -m pip install --no-index --no-deps "
                           f"{wheel.name}')\nprint('exit', r.exit_status)")
    assert "exit 0" in obs.text, obs.text
    imported = confined.execute("import hk_tinypkg, os\nprint(hk_tinypkg.VALUE)\n"
                                "print(hk_tinypkg.__file__.startswith(os.environ['PIP_TARGET']))")
    assert imported.outputs[0]["text"].split() == ["42", "True"]
    purelib = sysconfig.get_paths()["purelib"]
    assert not Path(purelib, "hk_tinypkg").exists()  # the base interpreter is untouched


# -- where confinement is missing, or asked for ------------------------------------------------


def test_without_landlock_the_first_observation_and_the_record_say_none(
        workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_KERNEL_FAKE_NO_LANDLOCK", "1")
    with Host(workdir) as host:
        first = host.execute("print('hello')")
        second = host.execute("print('again')")
        assert "confinement: none" in first.text and "HOST_KERNEL_FAKE_NO_LANDLOCK" in first.text
        assert "confinement: none" not in second.text  # said once
        started = json.loads(host.ledger.query(
            "SELECT body FROM events WHERE kind = 'session_started'")[0]["body"])
        assert started["confinement"]["status"] == "none"
        assert "HOST_KERNEL_FAKE_NO_LANDLOCK" in started["confinement"]["reason"]


def test_require_confinement_refuses_to_start_without_landlock(
        workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_KERNEL_FAKE_NO_LANDLOCK", "1")
    host = Host(workdir, require_confinement=True)
    with pytest.raises(ConfinementError, match="confinement is required"):
        host.start()
    assert host.kernel_pid is None


@needs_landlock
def test_a_record_inside_the_workspace_is_refused_when_confined(workdir: Path) -> None:
    with pytest.raises(ConfinementError, match="inside the workspace"):
        Host(workdir, record_dir=workdir / ".host_kernel").start()
    assert not (workdir / ".host_kernel").exists()


@needs_landlock
def test_the_start_event_records_the_abi_and_every_rule(confined: Host) -> None:
    started = json.loads(confined.ledger.query(
        "SELECT body FROM events WHERE kind = 'session_started'")[0]["body"])
    conf = started["confinement"]
    assert conf["status"] == "landlock" and conf["abi"] == LANDLOCK
    writable = {r["path"] for r in conf["rules"] if r["access"] == "write"}
    assert str(confined.workdir) in writable
    assert not any(str(confined.record_dir).startswith(p.rstrip("/") + "/") or
                   str(confined.record_dir) == p for p in writable)
    assert str(confined.record_dir) in conf["hidden"]
    gen = json.loads(confined.ledger.query(
        "SELECT body FROM events WHERE kind = 'generation_started'")[0]["body"])
    assert gen["confinement"]["status"] == "landlock"
    assert "HOST_KERNEL_RECORD" not in started["kernel_env"]


@needs_landlock
def test_interrupt_restart_and_kill_still_reach_the_confined_kernel(confined: Host) -> None:
    obs = confined.execute("import time\ntime.sleep(30)", timeout=1)
    assert obs.status == "timeout" and "KeyboardInterrupt" in obs.text
    assert confined.execute("print('alive')").status == "ok"
    assert confined.restart() == 2
    died = confined.execute("import os\nos._exit(3)")
    assert died.status == "kernel_died" and confined.generation == 3
    assert confined.execute("print('new')").outputs[0]["text"] == "new\n"


def test_the_head_is_returned_by_close_and_matches_the_ledger(workdir: Path) -> None:
    host = Host(workdir).start()
    host.execute("x = 1")
    head = host.close()
    from host_kernel.store.ledger import SQLiteLedger

    ledger = SQLiteLedger.open_readonly(host.record_dir / "ledger.sqlite")
    try:
        assert ledger.head() is not None and ledger.head().hash == head  # type: ignore[union-attr]
    finally:
        ledger.close()


# -- the record while the Host runs ---------------------------------------------------------


def test_a_foreign_event_appended_by_another_process_stops_the_next_append(
        workdir: Path) -> None:
    import sqlite3

    from host_kernel._errors import RecordError
    from host_kernel.audit import audit
    from host_kernel.store.ledger import canonical_json, event_hash

    with Host(workdir) as host:
        host.execute("x = 1")
        # Another process of the same user appends a perfectly chained event (an accepted
        # verdict for a session of its own making), without the record's key.
        db = sqlite3.connect(host.record_dir / "ledger.sqlite")
        seq, prev = db.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        body = canonical_json({"submission_id": "forged", "accepted": True, "verdict": {}})
        digest = event_hash(prev, seq + 1, "forged-session", 1.0, "submission_verdict", body)
        db.execute("INSERT INTO events (seq, session, ts, kind, body, prev, hash) "
                   "VALUES (?,?,?,?,?,?,?)",
                   (seq + 1, "forged-session", 1.0, "submission_verdict", body, prev, digest))
        db.commit()
        db.close()
        with pytest.raises(RecordError) as caught:
            host.execute("y = 2")
        assert caught.value.code == "foreign_event" and str(seq + 1) in caught.value.message
        log = (host.record_dir / "foreign-events.log").read_text()
        assert json.loads(log.splitlines()[-1])["seqs"] == [seq + 1]
        with pytest.raises(RecordError):  # and it stays stopped
            host.execute("z = 3")
    report = audit(host.record_dir)
    assert not report.clean
    assert "event_unauthenticated" in {f.code for f in report.findings}


@needs_landlock
def test_an_interpreter_or_package_inside_the_workspace_is_said_plainly(tmp_path: Path) -> None:
    import host_kernel
    from host_kernel.sandbox.client import probe
    from host_kernel.sandbox.policy import Policy

    package_home = Path(host_kernel.__file__).resolve().parent.parent
    # A workspace holding the package (as when the workspace is this repository): the
    # policy is computed, no kernel is started in it.
    policy = Policy.for_session(package_home, tmp_path / "private", [tmp_path / "record"])
    confinement = probe(policy)
    assert str(package_home / "host_kernel") in confinement.interpreter_writable
    notice = confinement.notice()
    assert notice is not None and "installed inside the workspace" in notice
    assert probe(Policy.for_session(tmp_path, tmp_path / "private",
                                    [tmp_path / "record"])).interpreter_writable == []


@needs_landlock
def test_a_host_that_imports_from_its_workspace_is_told_so(
        workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script run from the workspace (or ``python -c``, ``python -m`` there) puts the
    workspace on the Host's own ``sys.path``: a module a cell leaves there would be
    imported by the Host's process. The record and the first Observation say so."""
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "path", ["", *sys.path])
    with Host(workdir) as host:
        first = host.execute("x = 1")
        assert first.notice is not None and "imports from a folder" in first.notice, first
        assert str(workdir.resolve()) in first.notice
        rows = host.ledger.query("SELECT body FROM events WHERE kind = 'session_started'")
        recorded = json.loads(rows[0]["body"])["confinement"]["host_path_writable"]
        assert recorded == [str(workdir.resolve())]
    # The honest twin: started from elsewhere, nothing to say.
    monkeypatch.chdir(workdir.parent)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p])
    with Host(workdir) as host:
        notice = host.execute("x = 1").notice
        assert notice is None or "imports from a folder" not in notice


@needs_landlock
def test_a_cell_cannot_ptrace_the_sandboxs_init(confined: Host) -> None:
    obs = confined.execute(
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.ptrace(16, 1, 0, 0)  # PTRACE_ATTACH to pid 1: init (or the Host's parent)\n"
        "print(rc, os.strerror(ctypes.get_errno()))")
    assert obs.outputs[0]["text"].split()[0] == "-1"


@needs_landlock
def test_code_planted_for_the_next_generation_runs_confined_or_not_at_all(
        confined: Host, workdir: Path) -> None:
    # A sitecustomize in the package overlay (first on the kernel's path) and a fake
    # host_kernel package in the workspace and the overlay: init starts with -I -S and
    # its own path, so neither reaches the unconfined code; the next kernel runs the
    # sitecustomize confined, and its escape fails.
    escape = "/tmp/hk-planted-escape"
    plant = (
        "import os\n"
        "overlay = os.environ['PIP_TARGET']\n"
        "payload = f\"open({escape!r}, 'w').write('escaped')\\n\"\n"
        "open(os.path.join(overlay, 'sitecustomize.py'), 'w').write("
        "'try:\\n    ' + payload + 'except OSError:\\n    open(\\'planted-ran\\', \\'w\\')\\n')\n"
        "for root in (overlay, '.'):\n"
        "    d = os.path.join(root, 'host_kernel', 'sandbox')\n"
        "    os.makedirs(d, exist_ok=True)\n"
        "    for f in ('host_kernel/__init__.py', 'host_kernel/sandbox/__init__.py'):\n"
        "        open(os.path.join(root, f), 'w').write('')\n"
        "    open(os.path.join(d, 'init.py'), 'w').write(payload + 'def main(a):\\n    return 0\\n')\n")
    assert confined.execute(plant.replace("{escape!r}", repr(escape))).status == "ok"
    assert confined.restart() == 2
    assert confined.execute("print('next generation')").status == "ok"
    assert not Path(escape).exists()
    assert (workdir / "planted-ran").exists()  # the plant did run, in the confined kernel
    assert confined.confinement is not None and confined.confinement.active
    _denied(confined, f"open({escape!r}, 'w')")
