"""The kernel→Host channel: attribution to the running cell, tokens per generation."""

from __future__ import annotations

import os
import stat
import time

from host_kernel import Host


def test_ping_is_attributed_to_the_running_cell(host: Host) -> None:
    obs = host.execute("r = host.ping()\nprint(r['cell_id'], r['generation'])")
    assert obs.outputs[0]["text"].split() == [obs.cell_id, "1"]


def test_host_cell_id_in_a_cell_is_the_host_minted_id(host: Host) -> None:
    obs = host.execute("print(host.cell_id)")
    assert obs.outputs[0]["text"].strip() == obs.cell_id


def test_mode_reports_name_and_whether_armed(workdir) -> None:  # type: ignore[no-untyped-def]
    with Host(workdir, mode="codebase_change") as h:
        assert "codebase_change (armed)" in h.execute("print(host.mode)").text
    with Host(workdir) as h:
        text = h.execute("print(host.mode.name, host.mode.armed)").text
        assert "analysis_run False" in text


def test_ping_from_a_thread_that_outlives_its_cell_is_refused(host: Host) -> None:
    host.execute(
        "import threading, time\n"
        "result = {}\n"
        "def late():\n"
        "    time.sleep(1.0)\n"
        "    try:\n"
        "        host.ping()\n"
        "        result['r'] = 'accepted'\n"
        "    except Exception as e:\n"
        "        result['r'] = f'{type(e).__name__}:{e.code}'\n"
        "t = threading.Thread(target=late); t.start()"
    )
    time.sleep(2.0)
    obs = host.execute("t.join(); print(result['r'])")
    assert obs.outputs[0]["text"].strip() == "CallRefused:no_cell"
    refused = host.ledger.query("SELECT call, code, cell_id FROM refusals")
    assert [(r["call"], r["code"], r["cell_id"]) for r in refused] == [("ping", "no_cell", None)]


def test_token_of_generation_1_is_refused_in_generation_2(host: Host) -> None:
    host.execute("import os; old = os.environ['HOST_KERNEL_TOKEN']")
    token = host.generations.kernel.token  # type: ignore[union-attr]
    host.restart()
    # A process of the new generation replays the old token, as a leftover child would.
    obs = host.execute(
        "from host_kernel.kernel.client import HostClient\n"
        "import os\n"
        f"c = HostClient(os.environ['HOST_KERNEL_SOCKET'], {token!r}, 1)\n"
        "try:\n    c.ping(); print('accepted')\n"
        "except Exception as e:\n    print(type(e).__name__, e.code)"
    )
    assert obs.outputs[0]["text"].strip() == "CallRefused stale_token"
    assert host.execute("print(host.ping()['generation'])").outputs[0]["text"].strip() == "2"


def test_a_made_up_token_is_refused(host: Host) -> None:
    obs = host.execute(
        "from host_kernel.kernel.client import HostClient\n"
        "import os\n"
        "c = HostClient(os.environ['HOST_KERNEL_SOCKET'], 'guess', 1)\n"
        "try:\n    c.ping(); print('accepted')\n"
        "except Exception as e:\n    print(e.code)"
    )
    assert obs.outputs[0]["text"].strip() == "bad_token"


def test_socket_is_private(host: Host) -> None:
    path = host.execute("import os; print(os.environ['HOST_KERNEL_SOCKET'])").outputs[0]["text"]
    mode = stat.S_IMODE(os.stat(path.strip()).st_mode)
    assert mode == 0o600


def test_unknown_call_and_malformed_body_get_clear_errors(host: Host) -> None:
    obs = host.execute(
        "try:\n    host._call('format_disk')\n"
        "except Exception as e:\n    print(e.code, '|', e.message)"
    )
    assert obs.outputs[0]["text"].startswith("unknown_call | there is no host call named")
    raw = host.execute(
        "import httpx, os\n"
        "c = httpx.Client(transport=httpx.HTTPTransport(uds=os.environ['HOST_KERNEL_SOCKET']))\n"
        "r = c.post('http://h/call/ping', content=b'{not json', headers={'Authorization': "
        "'Bearer ' + os.environ['HOST_KERNEL_TOKEN']})\n"
        "print(r.text)"
    )
    assert "bad_arguments" in raw.text and "not JSON" in raw.text
