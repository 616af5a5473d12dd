"""A receipt never describes a file the confined kernel cannot see.

The Host looks a command's executable up and hashes it for the receipt, in its own view
of the file system. A confined kernel sees less: the temp root, the records and other
sessions are hidden or replaced by a fresh folder in its view. A cell that names such a
file (by a PATH entry it sets, or by an absolute path) must learn nothing of it from the
receipt: not its hash, not its real path, not whether it starts like a program.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host_kernel import Host
from host_kernel.sandbox.client import probe


@pytest.fixture(scope="module")
def confined(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, Path]]:
    if not probe(None).active:
        pytest.skip("LOUD: confinement is not available here; the kernel sees what the "
                    "Host sees, and there is nothing unseen to test")
    root = tmp_path_factory.mktemp("unseen")
    (root / "ws").mkdir()
    hidden = root / "outside"  # under the temp root: hidden from the kernel
    hidden.mkdir()
    tool = hidden / "secret-tool"
    tool.write_bytes(b"#!/bin/sh\necho the secret bytes 42\n")
    tool.chmod(0o755)
    (hidden / "link").symlink_to(tool)
    host = Host(root / "ws", record_dir=root / "record")
    host.start()
    yield host, hidden
    host.close()


def receipt_of(host: Host, code: str) -> dict[str, Any]:
    obs = host.execute(f"import os, json\n{code}\nprint(json.dumps(r.to_dict()))")
    assert obs.status == "ok", obs.text
    text = next(o["text"] for o in obs.outputs if o.get("name") == "stdout")
    receipt: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
    return receipt


def test_the_kernel_cannot_see_the_file_it_names(confined: tuple[Host, Path]) -> None:
    host, hidden = confined
    obs = host.execute(f"import os\nprint(os.path.exists({str(hidden / 'secret-tool')!r}))")
    assert "False" in obs.text


@pytest.mark.parametrize("how", ["path", "absolute", "symlink"])
def test_a_receipt_names_no_file_the_kernel_cannot_see(confined: tuple[Host, Path],
                                                      how: str) -> None:
    host, hidden = confined
    tool = hidden / "secret-tool"
    secret = hashlib.sha256(tool.read_bytes()).hexdigest()
    code = {
        "path": f"env = dict(os.environ, PATH={str(hidden)!r} + ':' + os.environ['PATH'])\n"
                f"os.environ['PATH'] = env['PATH']\nr = host.bash('secret-tool')",
        "absolute": f"r = host.bash({str(tool)!r})",
        "symlink": f"r = host.bash({str(hidden / 'link')!r})",
    }[how]
    try:
        receipt = receipt_of(host, code)
    finally:
        host.execute("import os\nos.environ['PATH'] = os.environ['PATH'].split(':', 1)[-1] "
                     f"if os.environ['PATH'].startswith({str(hidden)!r}) else os.environ['PATH']")
    assert receipt["executable"] is None
    assert receipt["executable_sha256"] is None
    assert secret not in repr(receipt)
    assert "secret-tool" not in str(receipt.get("executable"))
    assert receipt["exit_status"] != 0  # the kernel's view has no such program: it did not run
    assert "the secret bytes" not in repr(receipt)


def test_a_program_the_kernel_sees_is_still_named_and_hashed(
        confined: tuple[Host, Path]) -> None:
    host, _ = confined
    receipt = receipt_of(host, "r = host.bash('true')")
    assert receipt["executable"] and os.path.basename(str(receipt["executable"])) == "true"
    real = os.path.realpath(str(receipt["executable"]))
    assert receipt["executable_sha256"] == hashlib.sha256(Path(real).read_bytes()).hexdigest()


def test_what_the_policy_says_confined_code_reads_as_the_host_does(tmp_path: Path) -> None:
    from host_kernel.sandbox.policy import Policy

    ws, private = tmp_path / "ws", tmp_path / "private"
    ws.mkdir()
    private.mkdir()
    policy = Policy.for_session(ws, private, [tmp_path / "record"])
    real = os.path.realpath
    assert policy.may_read(real(ws / "bin" / "tool"))  # the workspace, bound back
    assert policy.may_read(real(private / "x"))
    assert policy.may_read(real("/usr/bin/true"))
    assert not policy.may_read(real(tmp_path / "elsewhere" / "tool"))  # the temp root
    assert not policy.may_read(real(tmp_path / "record" / "ledger.db"))
    if os.path.isdir("/dev/shm"):
        assert not policy.may_read("/dev/shm/tool")  # a fresh one in the kernel's view
    assert not policy.may_read(real(ws) + "-sibling/tool")
