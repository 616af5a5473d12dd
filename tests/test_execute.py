"""Host.execute through a real ipykernel: ids, outputs, errors, truncation, deaths, timeouts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import nbformat
import pytest

from host_kernel import Host, Observation


def test_cell_ids_are_unique_nbformat_valid_and_shown_only_when_armed(workdir: Path) -> None:
    with Host(workdir) as h:
        plain = [h.execute("pass") for _ in range(5)]
    with Host(workdir, mode="codebase_change") as h:
        armed = [h.execute("pass") for _ in range(5)]
    ids = [o.cell_id for o in plain + armed]
    assert len(set(ids)) == len(ids)
    cell = nbformat.v4.new_code_cell("pass")
    for cid in ids:
        cell["id"] = cid
        nbformat.validate(nbformat.v4.new_notebook(cells=[cell]))
        assert len(cid) >= 16  # 96 random bits in URL-safe base64
    assert all("[cell id:" not in o.text for o in plain)
    assert all(o.text.startswith(f"[cell id: {o.cell_id}]\n") for o in armed)


def test_request_metadata_carries_the_host_cell_id(host: Host) -> None:
    code = ("from ipykernel.kernelbase import Kernel\n"
            "print(Kernel.instance().get_parent()['metadata']['cellId'])")
    obs = host.execute(code)
    assert obs.outputs[0]["text"].strip() == obs.cell_id


def test_outputs_of_every_type_are_recorded(host: Host) -> None:
    code = (
        "import sys\n"
        "from IPython.display import display, HTML, Image\n"
        "print('out')\n"
        "print('err', file=sys.stderr)\n"
        "display(HTML('<b>bold</b>'))\n"
        "png = bytes.fromhex('89504e470d0a1a0a0000000d4948445200000001000000010806000000'"
        "'1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082')\n"
        "display(Image(data=png, format='png'))\n"
        "42\n"
    )
    obs = host.execute(code)
    kinds = [(o["output_type"], o.get("name")) for o in obs.outputs]
    assert kinds == [("stream", "stdout"), ("stream", "stderr"), ("display_data", None),
                     ("display_data", None), ("execute_result", None)]
    assert obs.outputs[2]["data"]["text/html"] == "<b>bold</b>"
    assert "image/png" in obs.outputs[3]["data"]
    assert "[text/html: 11 characters, kept in the record]" in obs.text
    assert "[image/png:" in obs.text and "base64" in obs.text
    assert "Out[" in obs.text and "42" in obs.text
    # The record keeps the same outputs whole.
    row = host.ledger.query("SELECT outputs FROM cells WHERE cell_id = ?", (obs.cell_id,))[0]
    recorded = json.loads(row["outputs"])
    assert recorded[3]["data"]["image/png"] == obs.outputs[3]["data"]["image/png"]


def test_error_renders_name_value_and_traceback_without_ansi(host: Host) -> None:
    obs = host.execute("def f():\n    raise ValueError('bad thing')\nf()")
    assert obs.status == "error"
    assert "ValueError: bad thing" in obs.text
    assert "\x1b[" not in obs.text
    assert "raise ValueError" in obs.text  # the traceback is there


def test_empty_cell_says_so(host: Host) -> None:
    assert "(no output)" in host.execute("x = 1").text


def test_long_output_is_cut_for_text_and_kept_whole_in_record(workdir: Path) -> None:
    with Host(workdir, text_limit=1000) as h:
        obs = h.execute("print('a' * 5000 + 'END')")
        assert len(obs.text) < 1200
        assert "characters cut" in obs.text
        assert obs.text.rstrip().endswith("END")
        # 5004 characters of output, 1000 kept: 4004 cut.
        assert "4004 characters cut" in obs.text
        row = h.ledger.query("SELECT outputs FROM cells WHERE cell_id = ?", (obs.cell_id,))[0]
        assert json.loads(row["outputs"])[0]["text"] == "a" * 5000 + "END\n"


def test_kernel_death_is_reported_and_next_cell_runs_in_a_new_generation(host: Host) -> None:
    host.execute("x = 1")
    t0 = time.monotonic()
    obs = host.execute("import os; os._exit(1)")
    assert time.monotonic() - t0 < 15
    assert obs.status == "kernel_died"
    assert obs.generation == 1
    assert "in memory is gone" in obs.text and "workspace files" in obs.text
    nxt = host.execute("print(x)")
    assert nxt.generation == 2
    assert nxt.status == "error" and "NameError" in nxt.text
    gens = host.ledger.query("SELECT generation, reason FROM generations ORDER BY generation")
    assert [tuple(g) for g in gens] == [(1, "start"), (2, "kernel_died")]


def test_sigkill_of_the_kernel_mid_cell_is_noticed(host: Host) -> None:
    obs = host.execute("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert obs.status == "kernel_died"
    assert host.execute("print('alive')").generation == 2


def test_infinite_loop_times_out_promptly_and_kernel_stays_usable(host: Host) -> None:
    host.execute("keep = 'me'")
    t0 = time.monotonic()
    obs = host.execute("while True:\n    pass", timeout=2)
    elapsed = time.monotonic() - t0
    assert obs.status == "timeout"
    assert elapsed < 4.5, elapsed
    assert "timeout" in obs.text and "interrupted" in obs.text
    after = host.execute("print(keep)")
    assert after.status == "ok" and "me" in after.text
    assert after.generation == 1


def test_cell_ignoring_interrupts_is_restarted_after_the_grace(host: Host) -> None:
    code = ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "while True:\n    time.sleep(0.05)")
    t0 = time.monotonic()
    obs = host.execute(code, timeout=1)
    assert time.monotonic() - t0 < 15
    assert obs.status == "timeout"
    assert "restarted the kernel" in obs.text
    assert host.execute("pass").generation == 2


def test_restart_bumps_generation_and_forgets_memory(host: Host) -> None:
    host.execute("y = 5")
    assert host.restart() == 2
    obs = host.execute("print(host.generation); y")
    assert obs.generation == 2
    assert "NameError" in obs.text
    assert obs.outputs[0]["text"].strip() == "2"


def test_observation_is_a_frozen_value(host: Host) -> None:
    obs = host.execute("pass")
    assert isinstance(obs, Observation)
    with pytest.raises(AttributeError):
        obs.status = "ok"  # type: ignore[misc]


def test_host_object_is_there_before_the_first_cell(host: Host) -> None:
    obs = host.execute("type(host).__name__")
    assert "HostClient" in obs.text


def test_host_rejects_use_before_start_and_after_close(workdir: Path) -> None:
    from host_kernel import KernelError

    h = Host(workdir)
    with pytest.raises(KernelError):
        h.execute("pass")
    h.start()
    h.close()
    with pytest.raises(KernelError):
        h.execute("pass")
    h.close()  # twice is fine


def test_a_long_temp_folder_does_not_break_the_kernels_sockets(
        workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    long_tmp = tmp_path / ("t" * 60) / ("u" * 60)
    long_tmp.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(long_tmp))
    with Host(workdir) as h:
        assert h.execute("print(host.ping()['generation'])").status == "ok"


def test_a_session_runs_no_heartbeat_thread_and_still_sees_its_kernel_die(
        tmp_path: Path) -> None:
    """The Host tells a dead kernel by its process, not by jupyter_client's heartbeat: no
    heartbeat thread (an event loop and a socket each, pinging every second) is started
    for a generation, however many there are, and a death is still seen at once."""
    import threading

    from jupyter_client.channels import HBChannel

    def beating() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if isinstance(t, HBChannel)]

    before = len(beating())
    with Host(tmp_path) as host:
        assert host.execute("pass").status == "ok"
        host.restart()
        obs = host.execute("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        assert obs.status == "kernel_died"
        assert host.generation == 3
        assert host.execute("1 + 1").status == "ok"
        assert len(beating()) == before
