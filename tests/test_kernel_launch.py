"""What our kernel launcher changes in ipykernel's start (host_kernel/kernel/launch.py).

:func:`no_interface_scan`: a connection file that names its address is read without
listing the machine's network interfaces; one that does not still gets jupyter_client's
default address. Checked on a real ``IPKernelApp`` reading a real connection file; the
kernels the Host starts are checked in tests/test_pool.py (no ``psutil`` imported).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ipykernel.kernelapp import IPKernelApp
from jupyter_client import localinterfaces

from host_kernel.kernel.launch import no_interface_scan


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of jupyter_client's interface listing (``localhost()`` calls it)."""
    calls: list[int] = []
    real = localinterfaces._load_ips

    def counted(**kwargs: Any) -> Any:
        calls.append(1)
        return real(**kwargs)

    monkeypatch.setattr(localinterfaces, "_load_ips", counted)
    no_interface_scan()
    return calls


def _app() -> Any:
    app: Any = IPKernelApp()  # not .instance(): nothing of it is started
    app.transport = "tcp"
    return app


def _info(**extra: Any) -> dict[str, Any]:
    return {"transport": "tcp", "shell_port": 50001, "iopub_port": 50002,
            "stdin_port": 50003, "control_port": 50004, "hb_port": 50005,
            "key": "k", "signature_scheme": "hmac-sha256", **extra}


def test_a_file_naming_its_address_is_read_without_listing_interfaces(
        scans: list[int], tmp_path: Path) -> None:
    path = tmp_path / "kernel.json"
    path.write_text(json.dumps(_info(ip="127.0.0.7")))
    app = _app()
    app.load_connection_file(str(path))
    assert scans == []
    assert app.ip == "127.0.0.7" and app.shell_port == 50001
    assert app.session.key == b"k"
    assert "_ip_default" not in app.__dict__  # the class's own default is back


def test_a_file_without_an_address_gets_the_default_one(scans: list[int]) -> None:
    app = _app()
    app.load_connection_info(_info())
    assert app.ip == localinterfaces.localhost()
    assert scans  # worked out, as jupyter_client does


def _outcome(load: Any, info: dict[str, Any]) -> tuple[str, object]:
    app = _app()
    try:
        load(app, info)
    except Exception as exc:  # noqa: BLE001 - compared, not judged
        return "raised", type(exc)
    return "read", app.ip


@pytest.mark.parametrize("ip", [None, 7, b"127.0.0.1", "", "*"])
def test_any_other_address_is_read_as_jupyter_client_reads_it(scans: list[int],
                                                              ip: object) -> None:
    patched = IPKernelApp.load_connection_info
    original = patched.__wrapped__  # type: ignore[attr-defined]
    assert _outcome(patched, _info(ip=ip)) == _outcome(original, _info(ip=ip))


def test_patching_twice_wraps_once() -> None:
    no_interface_scan()
    first = IPKernelApp.load_connection_info
    no_interface_scan()
    assert IPKernelApp.load_connection_info is first
