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
