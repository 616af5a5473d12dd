"""The launching side's own costs: the package's content hash remembered per user.

Every kernelspec launch and ``host-kernel exec`` names the user's zygote and factory by
the package's code (host_kernel/factory/_place.py). Hashing every file took a fifth of a
launch, so the hash is remembered in the factory's folder, and only there: a folder of
the user's that no one else may enter.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from host_kernel.factory import _place
from host_kernel.factory._place import Place


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_place, "_CONTENT", {})  # as a new process finds it


def _private(tmp_path: Path) -> Path:
    folder = tmp_path / "factory"
    folder.mkdir(mode=0o700)
    return folder


def test_the_code_hash_is_remembered_in_the_private_folder(tmp_path: Path,
                                                           fresh_process: None) -> None:
    folder = _private(tmp_path)
    code = Place(folder).identity["code"]
    [kept] = folder.glob("code-*")
    assert kept.read_text().strip() == code
    _place._CONTENT.clear()
    assert Place(folder).identity["code"] == code


def test_a_folder_others_may_enter_remembers_nothing(tmp_path: Path,
                                                     fresh_process: None) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o755)
    Place(folder)
    assert list(folder.glob("code-*")) == []


@pytest.mark.parametrize("garbage", ["", "not a hash", "0" * 15, "ZZZZZZZZZZZZZZZZ", "\xff"])
def test_a_garbled_remembered_hash_is_not_believed(tmp_path: Path, fresh_process: None,
                                                   garbage: str) -> None:
    folder = _private(tmp_path)
    code = Place(folder).identity["code"]
    [kept] = folder.glob("code-*")
    kept.write_bytes(garbage.encode("latin-1"))
    _place._CONTENT.clear()
    assert Place(folder).identity["code"] == code
    assert kept.read_text().strip() == code  # put right again


def test_a_remembered_hash_is_believed_only_from_the_private_folder(
        tmp_path: Path, fresh_process: None) -> None:
    """What the folder holds is believed, for those files as they are (their names,
    sizes and change times key it): the folder is the user's alone, beneath the runtime
    folder every sandbox's view covers, so no kernel can write there."""
    folder = _private(tmp_path)
    Place(folder)
    [kept] = folder.glob("code-*")
    kept.write_text("0123456789abcdef\n")
    _place._CONTENT.clear()
    assert Place(folder).identity["code"] == "0123456789abcdef"
    os.chmod(folder, 0o750)  # no longer the user's alone: not read
    _place._CONTENT.clear()
    assert Place(folder).identity["code"] != "0123456789abcdef"


# -- what the launching process imports -------------------------------------------------

#: Modules the launching process does without: each (with what it brings) was a
#: measurable share of a launch's start in an installed package (docs/jupyter.md).
HEAVY = ("typing", "pathlib", "socket", "signal", "array", "tempfile", "hashlib", "_hashlib",
         "importlib.util", "contextlib", "re", "enum", "shutil", "random", "subprocess")


def test_the_launching_process_imports_nothing_heavy(tmp_path: Path) -> None:
    """What ``python -m host_kernel.control`` runs before it connects to the zygote: the
    module, the Place (its fingerprint, its folder made), the socket's name, the
    start-up facts. Whatever the interpreter's start had imported is not counted."""
    folder = _private(tmp_path)
    code = (
        "import sys, json\n"
        "before = set(sys.modules)\n"
        "import host_kernel.control.__main__\n"
        "from host_kernel._launch import socket_file, startup\n"
        "from host_kernel.factory._place import Place, disabled\n"
        f"place = Place({str(folder)!r}); place.ensure(); disabled()\n"
        "name = socket_file(place); facts = startup()\n"
        "print(json.dumps({'new': sorted(set(sys.modules) - before), 'name': name}))\n")
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout
    seen = json.loads(out)
    assert not set(seen["new"]) & set(HEAVY), sorted(set(seen["new"]) & set(HEAVY))
    assert seen["name"] == str(folder / Place(folder).socket_name.replace("factory-", "relay-"))


def test_a_places_paths_are_the_folders_files(tmp_path: Path) -> None:
    folder = _private(tmp_path)
    place = Place(folder)
    assert place.path == str(folder) and place.folder == folder
    assert place.socket == folder / place.socket_name
    assert place.lock == folder / place.lock_name and place.log == folder / place.log_name
    assert {place.socket.suffix, place.lock.suffix, place.log.suffix} == {".sock", ".lock",
                                                                          ".log"}
    assert Place(str(folder)).socket == place.socket  # a str and a Path name one place


# -- the temp folder, found without tempfile ------------------------------------------------

def _in_fresh_process(code: str, env: dict[str, str], cwd: Path) -> str:
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, cwd=cwd,
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("env", [
    {},
    {"TMPDIR": "{tmp}/writable"},
    {"TMPDIR": "{tmp}/missing"},
    {"TMPDIR": "/etc/hostname/not-a-folder", "TEMP": "{tmp}/writable"},
    {"TMPDIR": "", "TMP": "{tmp}/writable"},
    {"TMPDIR": "relative"},
])
def test_the_temp_root_is_the_one_tempfile_finds(tmp_path: Path, env: dict[str, str]) -> None:
    """The factory's default folder lies beneath ``tempfile.gettempdir()``, which every
    sandbox's view hides; the launching process finds that folder without importing
    tempfile, and must find the same one."""
    (tmp_path / "writable").mkdir()
    (tmp_path / "relative").mkdir()
    given = {k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()}
    ours = _in_fresh_process(
        "import sys\n"
        "from host_kernel.factory._place import temp_root\n"
        "assert 'tempfile' not in sys.modules\n"
        "print(temp_root())", given, tmp_path)
    theirs = _in_fresh_process("import tempfile; print(tempfile.gettempdir())", given,
                               tmp_path)
    assert ours == theirs


def test_the_temp_root_goes_down_tempfiles_list(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delitem(sys.modules, "tempfile", raising=False)
    monkeypatch.delenv("TEMP", raising=False)
    monkeypatch.delenv("TMP", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    refused: list[str] = []

    def only(allowed: set[str]) -> object:
        def probe(folder: str) -> bool:
            if folder not in allowed:
                refused.append(folder)
            return folder in allowed
        return probe

    assert _place.temp_root(only({"/var/tmp"})) == "/var/tmp"  # type: ignore[arg-type]
    assert refused == [str(tmp_path), "/tmp"]
    assert _place.temp_root(only({str(tmp_path)})) == str(tmp_path)  # type: ignore[arg-type]
    refused.clear()
    monkeypatch.delenv("TMPDIR")
    assert _place.temp_root(only({str(tmp_path)})) == str(tmp_path)  # type: ignore[arg-type]
    assert refused == ["/tmp", "/var/tmp", "/usr/tmp"]  # the working folder comes last
    with pytest.raises(FileNotFoundError):
        _place.temp_root(only(set()))  # type: ignore[arg-type]


# -- descriptors passed without the socket module -------------------------------------------

def test_descriptors_pass_and_extra_ones_are_closed() -> None:
    import _socket

    from host_kernel._fds import recv_fds, send_fds
    from host_kernel._launch import read_line

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    a, b = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    pipes = [os.pipe() for _ in range(3)]
    fds = [fd for pair in pipes for fd in pair]  # six descriptors
    try:
        before = open_fds()
        send_fds(a, b"hello\n", fds)
        data, got = recv_fds(b, 1024, 4)
        assert data == b"hello\n" and len(got) == 4
        assert open_fds() == before + 4  # the two past the fourth were closed at once
        for fd in got:
            os.close(fd)
        send_fds(a, b"one ", fds[:1])
        a.sendall(b"line\n")
        line, more = read_line(b, deadline=None)
        assert line == b"one line\n" and len(more) == 1
        os.close(more[0])
    finally:
        for fd in fds:
            os.close(fd)
        a.close()
        b.close()
