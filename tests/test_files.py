"""host.write_file / edit_file / read_file: done by the Host, atomic, confined to the workspace."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_kernel import Host

from _helpers import run_ok


def _err(host: Host, call: str) -> str:
    obs = host.execute(f"try:\n    {call}\nexcept Exception as e:\n    print(type(e).__name__, e.code, '|', e.message)")
    assert obs.status == "ok", obs.text
    return obs.outputs[0]["text"].strip()


def test_write_creates_parents_and_records_the_write(host: Host, workdir: Path) -> None:
    obs = host.execute("r = host.write_file('deep/er/f.txt', 'héllo')\nprint(r.path, r.size, r.sha256)")
    path, size, digest = obs.outputs[0]["text"].split()
    data = "héllo".encode()
    assert (path, int(size), digest) == ("deep/er/f.txt", len(data), hashlib.sha256(data).hexdigest())
    assert (workdir / "deep/er/f.txt").read_bytes() == data
    rows = host.ledger.query("SELECT cell_id, path, sha256, size FROM writes")
    assert [tuple(r) for r in rows] == [(obs.cell_id, path, digest, len(data))]


def test_bytes_content_round_trips(host: Host, workdir: Path) -> None:
    run_ok(host, "host.write_file('b.bin', bytes(range(256)))")
    assert (workdir / "b.bin").read_bytes() == bytes(range(256))
    assert "True" in run_ok(host, "print(host.read_file('b.bin', binary=True) == bytes(range(256)))")


def test_read_file_returns_text(host: Host, workdir: Path) -> None:
    (workdir / "r.txt").write_text("from disk")
    assert "from disk" in run_ok(host, "print(host.read_file('r.txt'))")


def test_edit_replaces_exactly_one_occurrence(host: Host, workdir: Path) -> None:
    (workdir / "e.py").write_text("a = 1\nb = 2\n")
    run_ok(host, "host.edit_file('e.py', 'b = 2', 'b = 3')")
    assert (workdir / "e.py").read_text() == "a = 1\nb = 3\n"
    assert host.ledger.query("SELECT op FROM writes")[0]["op"] == "edit"


@pytest.mark.parametrize("content, expect", [("x\n", "does not appear"), ("b = 2\nb = 2\n", "appears 2 times")])
def test_edit_refuses_zero_or_several_matches_and_changes_nothing(
        host: Host, workdir: Path, content: str, expect: str) -> None:
    (workdir / "e.py").write_text(content)
    msg = _err(host, "host.edit_file('e.py', 'b = 2', 'b = 9')")
    assert msg.startswith("FileProblem file_problem") and expect in msg
    assert (workdir / "e.py").read_text() == content
    assert host.ledger.query("SELECT count(*) FROM writes")[0][0] == 0


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, Path]]:
    ws = tmp_path_factory.mktemp("shared") / "ws"
    ws.mkdir()
    with Host(ws) as h:
        yield h, ws


@pytest.mark.parametrize("call", ["write_file({p!r}, 'x')", "edit_file({p!r}, 'a', 'b')",
                                  "read_file({p!r})", "save_artifact({p!r})"])
@pytest.mark.parametrize("p", ["/etc/passwd", "../outside.txt", "sub/../../outside.txt",
                               "link_record/ledger.sqlite", "link_out/x.txt"])
def test_paths_leaving_the_workspace_are_refused_for_every_file_call(
        shared: tuple[Host, Path], call: str, p: str) -> None:
    host, workdir = shared
    writes_before = host.ledger.query("SELECT count(*) FROM writes")[0][0]
    outside = workdir.parent / "outside_dir"
    outside.mkdir(exist_ok=True)
    (outside / "x.txt").write_text("secret")
    if not (workdir / "link_out").exists():
        os.symlink(outside, workdir / "link_out")
    if not (workdir / "link_record").exists():  # the record lives outside the workspace
        os.symlink(host.record_dir, workdir / "link_record")
    before = sorted(str(q) for q in workdir.parent.rglob("*"))
    msg = _err(host, "host." + call.format(p=p))
    assert msg.startswith("PathRefused path_refused"), msg
    assert sorted(str(q) for q in workdir.parent.rglob("*")) == before
    assert (outside / "x.txt").read_text() == "secret"
    assert host.ledger.query("SELECT count(*) FROM writes")[0][0] == writes_before
    assert host.ledger.query("SELECT code FROM refusals ORDER BY seq")[-1]["code"] == "path_refused"


@pytest.mark.parametrize("call, expect", [
    ("host.write_file(3, 'x')", "path must be a str"),
    ("host.write_file('a.txt', 3)", "content must be str or bytes"),
    ("host.write_file('', 'x')", "non-empty"),
    ("host.edit_file('a.txt', 1, 'x')", "must both be str"),
    ("host.read_file('missing.txt')", "does not exist"),
    ("host.read_file('.')", "directory"),
    ("host.write_file('dir', 'x')", "directory"),
])
def test_wrong_arguments_get_clear_errors(host: Host, workdir: Path, call: str, expect: str) -> None:
    (workdir / "dir").mkdir()
    (workdir / "a.txt").write_text("a")
    assert expect in _err(host, call)


def test_binary_file_read_as_text_says_use_binary(host: Host, workdir: Path) -> None:
    (workdir / "img.bin").write_bytes(b"\xff\xfe\x00")
    assert "binary=True" in _err(host, "host.read_file('img.bin')")


def test_write_is_atomic_no_temp_files_left(host: Host, workdir: Path) -> None:
    run_ok(host, "for i in range(20): host.write_file('same.txt', str(i) * 1000)")
    assert sorted(p.name for p in workdir.iterdir() if p.name != ".host_kernel") == ["same.txt"]
    assert (workdir / "same.txt").read_text() == "19" * 1000


def test_huge_request_body_is_refused_with_a_clear_error(host: Host, workdir: Path) -> None:
    from host_kernel.host import _server

    limit = _server.MAX_BODY
    try:
        _server.MAX_BODY = 1000
        msg = _err(host, "host.write_file('big.txt', 'x' * 5000)")
        # A body far larger than the socket's buffers: the Host has answered and closed
        # while the kernel is still sending; the kernel reads the answer all the same,
        # and the next call opens a new connection.
        for _ in range(2):
            again = _err(host, "host.write_file('big.txt', 'x' * 20_000_000)")
            assert "over the 1000-byte limit" in again, again
    finally:
        _server.MAX_BODY = limit
    assert "over the 1000-byte limit" in msg
    assert not (workdir / "big.txt").exists()
    assert host.execute("host.write_file('small.txt', 'ok')").status == "ok"


def test_writes_are_recorded_with_cell_ids_in_the_ledger(host: Host) -> None:
    obs = host.execute("host.write_file('x.json', '{}')")
    row = host.ledger.query("SELECT body FROM events WHERE kind = 'file_written'")[0]
    assert json.loads(row["body"])["cell_id"] == obs.cell_id
