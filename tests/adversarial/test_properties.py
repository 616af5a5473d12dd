"""Property-based tests: any arguments to any host call, and raw requests to the Host's socket,
get a clear answer; the Host never crashes and never leaves a partial write."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host_kernel._paths import default_record_dir
from host_kernel import Host
from host_kernel.store.ledger import check_chain

CALLS = ["ping", "whoami", "write_file", "edit_file", "read_file", "bash", "save_artifact",
         "load_artifact", "artifacts", "submit_output", "lineage", "cell_access", "nope"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                  max_size=4),
    max_leaves=12)
paths = st.sampled_from(["a.txt", "../x", "/etc/passwd", "", ".", "d/", "x" * 5000,
                         ".host_kernel/ledger.sqlite", "sub/../a.txt", "\x00", "ok/new.txt"])
arg_values = paths | json_values
ARG_NAMES = ["path", "content", "content_b64", "old", "new", "command", "timeout", "cwd",
             "env", "filename", "artifact_id", "output", "completion_bullets", "source_files",
             "test_evidence", "access", "binary"]


class Channel:
    """A real cell stays running while the test speaks to the socket as that cell would."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.release = host.workdir / ".release"
        self._thread = threading.Thread(target=self._hold)
        self._thread.start()
        kernel = host.generations.kernel
        assert kernel is not None
        import time

        while host.cells.running is None:
            time.sleep(0.01)
        socket = host.generations.launch_env["HOST_KERNEL_SOCKET"]
        self.client = httpx.Client(transport=httpx.HTTPTransport(uds=socket),
                                   base_url="http://host", timeout=30,
                                   headers={"Authorization": f"Bearer {kernel.token}"})

    def _hold(self) -> None:
        import asyncio

        try:
            self.host.execute("import os, time\nwhile not os.path.exists('.release'):\n"
                              "    time.sleep(0.02)", timeout=600)
        finally:
            # jupyter_client made an event loop for this thread; close it with the thread.
            try:
                asyncio.get_event_loop_policy().get_event_loop().close()
            except RuntimeError:
                pass

    def post(self, name: str, body: bytes) -> list[dict[str, Any]]:
        response = self.client.post(f"/call/{name}", content=body)
        assert response.status_code == 200
        return [json.loads(line) for line in response.text.splitlines() if line]

    def close(self) -> None:
        self.release.write_text("go")
        self._thread.join()
        self.client.close()


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Channel]:
    ws = tmp_path_factory.mktemp("prop") / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha beta")
    (ws / "d").mkdir()
    with Host(ws) as host:
        ch = Channel(host)
        try:
            yield ch
        finally:
            ch.close()
        assert check_chain(host.ledger) == []


def _final(lines: list[dict[str, Any]]) -> dict[str, Any]:
    assert lines, "no answer at all"
    last = lines[-1]
    assert set(last) & {"result", "error"}, last
    if "error" in last:
        err = last["error"]
        assert err["code"] != "host_internal_error", err["message"]
        assert err["message"]
    return last


def _no_partial_files(root: Path) -> None:
    leftovers = [p for p in root.rglob(".*.tmp") if ".host_kernel" not in p.parts]
    assert leftovers == []
    assert list((default_record_dir(root) / "tmp").iterdir()) == []


SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@SETTINGS
@given(name=st.sampled_from(CALLS),
       args=st.dictionaries(st.sampled_from(ARG_NAMES), arg_values, max_size=5))
def test_any_arguments_to_any_call_get_a_clear_answer(channel: Channel, name: str,
                                                      args: dict[str, Any]) -> None:
    if name == "bash":
        args["command"] = "true"  # never run generated shell text
        args.setdefault("timeout", 5)
    if name == "write_file" and isinstance(args.get("path"), str):
        args["path"] = "ok/" + args["path"].replace("/", "_")[:50]
    body = json.dumps(args).encode()
    _final(channel.post(name, body))
    _no_partial_files(channel.host.workdir)


@SETTINGS
@given(body=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_raw_bodies_never_crash_the_host(channel: Channel, body: bytes) -> None:
    _final(channel.post("write_file", body))
    _final(channel.post("ping", b""))  # still answering


def test_a_request_without_the_token_is_refused_and_recorded(channel: Channel) -> None:
    socket = channel.host.generations.launch_env["HOST_KERNEL_SOCKET"]
    with httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://h") as c:
        lines = [json.loads(x) for x in c.post("/call/ping", content=b"{}").text.splitlines()]
    assert lines[-1]["error"]["code"] == "bad_token"
