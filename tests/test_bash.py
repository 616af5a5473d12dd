"""host.bash: the Host runs the command, streams its output, and keeps the receipt."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from host_kernel import Host
from host_kernel.store.blobs import FileBlobStore

from _helpers import run_ok


def _receipt(host: Host, cell_id: str) -> dict:  # type: ignore[type-arg]
    rows = host.ledger.query("SELECT body FROM receipts WHERE cell_id = ?", (cell_id,))
    assert len(rows) == 1
    return json.loads(rows[0]["body"])


def test_non_zero_exit_is_recorded_not_raised(host: Host) -> None:
    obs = host.execute("r = host.bash('echo out; echo err >&2; exit 3')\nprint(r.exit_status, r.ok)")
    assert obs.status == "ok"
    assert obs.outputs[-1]["text"].strip() == "3 False"
    rec = _receipt(host, obs.cell_id)
    assert rec["exit_status"] == 3 and rec["signal"] is None and not rec["timed_out"]
    assert rec["command"] == "echo out; echo err >&2; exit 3"
    assert rec["generation"] == 1 and rec["cell_id"] == obs.cell_id
    store = FileBlobStore(host.record_dir)
    assert store.read(rec["stdout_sha256"]) == b"out\n"
    assert store.read(rec["stderr_sha256"]) == b"err\n"
    assert rec["stdout_size"] == 4
    # streamed into the cell's own outputs
    assert {"output_type": "stream", "name": "stderr", "text": "err\n"} in obs.outputs


def _stamped(call: str, after: str) -> str:
    """A cell that runs ``call`` with its standard output stamped when "first" reaches
    it (``stamp.t``, monotonic), then ``after``."""
    return ("import sys, time\n"
            "class Stamp:\n"
            "    def __init__(self, s): self.s, self.t = s, None\n"
            "    def write(self, x):\n"
            "        if 'first' in x and self.t is None: self.t = time.monotonic()\n"
            "        return self.s.write(x)\n"
            "    def flush(self): self.s.flush()\n"
            "stamp = Stamp(sys.stdout); real = sys.stdout; sys.stdout = stamp\n"
            f"try:\n    {call}\nfinally:\n    sys.stdout = real\n{after}")


def test_output_streams_before_the_command_ends(host: Host) -> None:
    code = _stamped("host.bash('echo first; sleep 1.5; echo second')",
                    "print(round(time.monotonic() - stamp.t, 2))")
    obs = host.execute(code)
    assert obs.status == "ok", obs.text
    assert float(obs.outputs[-1]["text"].split()[-1]) > 1.0


def test_output_streams_before_its_spool_is_on_disk(host: Host,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The Host keeps a command's output in a spool file it makes at the first bytes; a
    file system slow to make it (another process's fsync flushing) must not hold the
    text back from the cell. Here making the stdout spool takes 2 s."""
    import tempfile

    from host_kernel.host import _bash

    made = tempfile.mkstemp

    def slow(*args: Any, **kwargs: Any) -> tuple[int, str]:
        if "stdout" in str(kwargs.get("prefix", "")):
            time.sleep(2.0)
        return made(*args, **kwargs)

    monkeypatch.setattr(_bash.tempfile, "mkstemp", slow)
    code = _stamped("r = host.bash('echo first')", "print(round(time.monotonic() - stamp.t, 2), "
                    "r.stdout_tail.strip(), r.stdout_size)")
    obs = host.execute(code)
    assert obs.status == "ok", obs.text
    waited, kept, size = obs.outputs[-1]["text"].split()[-3:]
    assert float(waited) > 1.5 and kept == "first" and size == "6"  # and the spool kept it


def test_timeout_kills_the_whole_process_group(host: Host, workdir: Path) -> None:
    obs = host.execute(
        "r = host.bash('sleep 30 & echo $! > child.pid; sleep 30', timeout=1)\n"
        "print(r.timed_out, r.exit_status, r.signal)"
    )
    assert obs.outputs[-1]["text"].split() == ["True", "None", "9"]
    assert obs.duration < 8
    # The pid is the one the command saw: in the sandbox's PID namespace, which is also
    # the kernel's, so the kernel is where to look it up.
    pid = int((workdir / "child.pid").read_text())
    gone = host.execute(
        "import time, os\n"
        "def alive(pid):\n"
        "    try:\n"
        "        with open(f'/proc/{pid}/stat') as f:\n"
        "            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'\n"
        "    except FileNotFoundError:\n"
        "        return False\n"
        "deadline = time.monotonic() + 5\n"
        f"while alive({pid}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.1)\n"
        f"print('gone' if not alive({pid}) else 'running')")
    assert gone.outputs[-1]["text"].strip() == "gone", f"child {pid} still runs"
    assert _receipt(host, obs.cell_id)["timed_out"] is True


def test_path_edited_in_the_kernel_is_flagged(host: Host) -> None:
    obs = host.execute("import os\nos.environ['PATH'] = '/usr/bin:/bin'\nhost.bash('true')")
    rec = _receipt(host, obs.cell_id)
    assert rec["path_differs"] is True
    assert "PATH" in rec["env_changed"]


def test_launch_path_is_the_kernels_own_interpreter_first(host: Host) -> None:
    import sys

    obs = host.execute("r = host.bash('command -v python')")
    rec = _receipt(host, obs.cell_id)
    assert rec["path_differs"] is False
    assert obs.outputs[0]["text"].strip() == os.path.join(os.path.dirname(sys.executable), "python")
    assert rec["env_changed"] == []


def test_workspace_script_as_runner_is_flagged(host: Host, workdir: Path) -> None:
    run_ok(host, "host.write_file('fake/pytest', '#!/bin/sh\\necho 1 passed\\n')")
    os.chmod(workdir / "fake/pytest", 0o755)
    obs = host.execute("import os\nos.environ['PATH'] = os.path.abspath('fake') + ':' + os.environ['PATH']\n"
                       "host.bash('pytest -q')")
    rec = _receipt(host, obs.cell_id)
    assert rec["executable"] == str(workdir / "fake/pytest")
    assert rec["executable_in_workspace"] is True
    assert rec["executable_sha256"] == hashlib.sha256((workdir / "fake/pytest").read_bytes()).hexdigest()
    obs2 = host.execute("host.bash('./fake/pytest')")
    assert _receipt(host, obs2.cell_id)["executable_in_workspace"] is True


def test_a_file_named_as_a_command_is_hashed_only_when_it_could_run(
        host: Host, tmp_path: Path) -> None:
    """A cell naming any file the Host can read as its command learns nothing of its bytes:
    the receipt hashes an executable, and a file that is not one is no executable."""
    secret = tmp_path / "secret.txt"
    secret.write_text("1234\n")
    secret.chmod(0o600)
    obs = host.execute(f"r = host.bash({str(secret)!r})\nprint(r.exit_status)")
    rec = _receipt(host, obs.cell_id)
    assert rec["exit_status"] in (126, 127)  # not executable, or not in the sandbox's view
    assert rec["executable"] is None and rec["executable_sha256"] is None
    assert hashlib.sha256(b"1234\n").hexdigest() not in json.dumps(rec)


def test_secret_values_are_redacted_everywhere_in_the_record(
        workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-live-1234567890abcdef"
    monkeypatch.setenv("MY_API_KEY", secret)
    with Host(workdir) as host:
        _check_redaction(host, secret)


def _check_redaction(host: Host, secret: str) -> None:
    obs = host.execute("import os\nhost.bash('echo key=$MY_API_KEY; echo $MY_API_KEY >&2')")
    assert secret not in obs.text
    assert "key=[redacted]" in obs.text
    rec = _receipt(host, obs.cell_id)
    store = FileBlobStore(host.record_dir)
    assert store.read(rec["stdout_sha256"]) == b"key=[redacted]\n"
    # a later plain print of the secret is redacted in the record too
    obs2 = host.execute("print(os.environ['MY_API_KEY'])")
    assert secret not in obs2.text
    dump = "\n".join(r["body"] for r in host.ledger.query("SELECT body FROM events"))
    assert secret not in dump


def test_a_secret_set_in_the_kernel_is_redacted_from_receipts_and_later_outputs(host: Host) -> None:
    obs = host.execute("import os\nos.environ['DB_PASSWORD'] = 'hunter2-hunter2'\n"
                       "host.bash('echo pw=$DB_PASSWORD')")
    assert "pw=[redacted]" in obs.text
    rec = _receipt(host, obs.cell_id)
    assert "DB_PASSWORD" in rec["env_changed"]
    later = host.execute("print(os.environ['DB_PASSWORD'])")
    assert "hunter2-hunter2" not in later.text
    row = host.ledger.query("SELECT outputs FROM cells WHERE cell_id = ?", (later.cell_id,))[0]
    assert "hunter2-hunter2" not in row["outputs"]


def test_changed_workspace_files_are_in_the_receipt(host: Host, workdir: Path) -> None:
    (workdir / "old.txt").write_text("old")
    (workdir / "gone.txt").write_text("bye")
    obs = host.execute("host.bash('echo new > new.txt; echo more >> old.txt; rm gone.txt')")
    changes = {c["path"]: c for c in _receipt(host, obs.cell_id)["changes"]}
    assert changes["new.txt"]["change"] == "created"
    assert changes["new.txt"]["sha256"] == hashlib.sha256(b"new\n").hexdigest()
    assert changes["old.txt"]["change"] == "modified"
    assert changes["gone.txt"] == {"path": "gone.txt", "change": "deleted", "sha256": None, "size": None}


def test_cwd_is_the_kernels_current_directory(host: Host, workdir: Path) -> None:
    (workdir / "sub").mkdir()
    obs = host.execute("import os\nos.chdir('sub')\nhost.bash('pwd')")
    assert obs.outputs[0]["text"].strip() == str(workdir / "sub")
    assert _receipt(host, obs.cell_id)["cwd"] == str(workdir / "sub")


def test_cwd_outside_the_workspace_is_refused(host: Host) -> None:
    obs = host.execute("import os\nos.chdir('/tmp')\ntry:\n    host.bash('ls')\n"
                       "except Exception as e:\n    print(e.code)\nfinally:\n    os.chdir(host_ws)"
                       .replace("host_ws", repr(str(host.workdir))))
    assert obs.outputs[-1]["text"].strip() == "path_refused"
    assert host.ledger.query("SELECT count(*) FROM receipts")[0][0] == 0


def test_bash_from_subprocess_leaves_no_receipt(host: Host) -> None:
    run_ok(host, "import subprocess\nsubprocess.run('true', shell=True)")
    assert host.ledger.query("SELECT count(*) FROM receipts")[0][0] == 0


def test_receipt_renders_readably(host: Host) -> None:
    obs = host.execute("host.bash('echo hi')")
    result = obs.outputs[-1]
    assert result["output_type"] == "execute_result"
    assert "exit 0" in result["data"]["text/plain"]
    assert "data-hk-card='receipt'" in result["data"]["text/html"]
    # The agent reads the plain text, and one line naming the richer forms.
    assert "[text/html: " in obs.text and "text/markdown: " in obs.text
    assert obs.text.count("kept in the record]") == 1


def test_a_receipt_rebuilt_in_the_kernel_changes_nothing_in_the_record(host: Host) -> None:
    obs = host.execute("r = host.bash('exit 1')")
    run_ok(host, "from host_kernel import Receipt\n"
                 "d = r.to_dict(); d['exit_status'] = 0\nfake = Receipt.from_dict(d)\nprint(fake.ok)")
    assert _receipt(host, obs.cell_id)["exit_status"] == 1


def test_a_made_up_exit_status_sent_to_the_socket_is_not_a_receipt(host: Host) -> None:
    code = ("import httpx, os, json\n"
            "c = httpx.Client(transport=httpx.HTTPTransport(uds=os.environ['HOST_KERNEL_SOCKET']))\n"
            "r = c.post('http://h/call/bash', headers={'Authorization': 'Bearer ' + os.environ['HOST_KERNEL_TOKEN']},\n"
            "           json={'command': 'exit 1', 'exit_status': 0, 'cwd': os.getcwd(), 'env': dict(os.environ)})\n"
            "print(json.loads(r.text.splitlines()[-1])['result']['exit_status'])\n"
            "r2 = c.post('http://h/call/receipt_recorded', headers={'Authorization': 'Bearer ' + os.environ['HOST_KERNEL_TOKEN']}, json={'exit_status': 0})\n"
            "print(r2.text)")
    obs = host.execute(code)
    first, second = [line for line in obs.outputs[0]["text"].splitlines() if line]
    assert first == "1"  # the Host ran the command; the claimed exit status was ignored
    assert "unknown_call" in second
    assert [r["exit_status"] for r in host.ledger.query("SELECT exit_status FROM receipts")] == [1]


def test_writing_into_the_record_folder_from_a_cell_is_denied_by_the_os(host: Host) -> None:
    from host_kernel.store.ledger import check_chain

    if not host.confinement or not host.confinement.active:
        pytest.skip(f"CONFINEMENT UNAVAILABLE HERE: {host.confinement}")
    host.execute("r = host.bash('exit 1')")
    ledger = str(host.record_dir / "ledger.sqlite")
    obs = host.execute(
        "import sqlite3\n"
        f"db = sqlite3.connect({ledger!r})\n"
        "db.execute(\"UPDATE events SET body = replace(body, '\\\"exit_status\\\":1', "
        "'\\\"exit_status\\\":0') WHERE kind = 'receipt_recorded'\")\n"
        "db.commit()"
    )
    assert obs.status == "error" and "OperationalError" in obs.text
    assert check_chain(host.ledger) == []
    assert [r["exit_status"] for r in host.ledger.query("SELECT exit_status FROM receipts")] == [1]


def test_bad_bash_arguments(host: Host) -> None:
    from _helpers import refusal

    assert "non-empty str" in refusal(host, "host.bash('')")
    assert "command must be str" in refusal(host, "host.bash(['ls'])")
    assert "timeout must be a positive" in refusal(host, "host.bash('true', timeout=-1)")


def test_a_command_outliving_its_cells_timeout_is_killed_and_still_recorded(host: Host) -> None:
    obs = host.execute("host.bash('echo start; sleep 30; echo never')", timeout=1)
    assert obs.status == "timeout"
    assert obs.duration < 10
    assert "killed them and recorded their receipts" in obs.text
    rec = _receipt(host, obs.cell_id)
    assert rec["signal"] == 9 and rec["exit_status"] is None
    store = FileBlobStore(host.record_dir)
    assert store.read(rec["stdout_sha256"]) == b"start\n"
    assert list(store.tmp.iterdir()) == []
    assert host.execute("print('usable')").status == "ok"


def test_the_launch_baseline_is_the_hosts_not_the_kernels(host: Host) -> None:
    # A kernel that rewrites its own token in the environment it sends cannot hide the change.
    obs = host.execute("import os\nos.environ['HOST_KERNEL_TOKEN'] = 'forged'\nhost.bash('true')")
    assert "HOST_KERNEL_TOKEN" in _receipt(host, obs.cell_id)["env_changed"]


def test_a_command_that_closes_its_streams_and_runs_on_is_killed_when_its_cell_ends(
        host: Host) -> None:
    # The Host's reader has seen both streams close and now waits for the exit; when the
    # cell times out, settling the cell's commands must not queue behind that wait.
    t0 = time.monotonic()
    obs = host.execute("r = host.bash('exec >&- 2>&-; sleep 60')", timeout=2)
    assert obs.status == "timeout"
    assert time.monotonic() - t0 < 20
    assert "killed them and recorded their receipts" in obs.text
    receipt = json.loads(host.ledger.query(
        "SELECT body FROM receipts ORDER BY seq DESC LIMIT 1")[0]["body"])
    assert receipt["signal"] == 9
    assert host.execute("print('next')").status == "ok"
