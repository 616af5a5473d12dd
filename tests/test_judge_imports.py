"""The judge's import world is the Host's: a reproduction never imports what a kernel wrote.

A session's ``pip install`` lands in its overlay, a folder the kernel writes; so the Host
reads from it only which ``name==version`` were installed, installs those itself from the
wheelhouse or index pip is configured with (here a wheelhouse the kernel cannot reach),
and a reproduction imports that Host-built overlay, after the standard library. Each attack
below was accepted before (the kernel's overlay stood first on the reproduction's path and
its RECORD, written by the same hand as the files, vouched for them); its honest twin is
accepted now.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_kernel import Host

from _helpers import run_ok
from test_reproduction import BAD, CMD, GOOD, put, run, submit_files

DEMO = "hk-judge-demo"
DEMO_VERSION = "1.0"
DEMO_MODULE = "hk_judge_demo"
#: The declared test needs the installed distribution (and a stdlib module pytest does
#: not import itself, so a stand-in for it would be imported from the first folder found).
TEST_NEEDS_DEMO = ("import colorsys\nfrom hk_judge_demo import twice\nfrom pkg.core import add\n"
                   "\n\ndef test_add():\n    assert add(1, 2) == 3\n    assert twice(2) == 4\n"
                   "    assert colorsys.rgb_to_yiq(0, 0, 0) == (0.0, 0.0, 0.0)\n")


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
        b"=").decode()


def make_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of ``files``, built by hand (no network, no build backend)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    entries = {rel: text.encode() for rel, text in files.items()}
    entries[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\n"
                                   f"Version: {version}\n").encode()
    entries[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: host_kernel-tests\n"
                                b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = "".join(f"{rel},{_hash(data)},{len(data)}\n" for rel, data in entries.items())
    entries[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for rel, data in entries.items():
            z.writestr(rel, data)
    return path


@pytest.fixture
def wheelhouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The Host's pip finds distributions here only (outside every workspace, where the
    kernel cannot read or write); the kernel installs from a copy in its workspace."""
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    make_wheel(folder, DEMO, DEMO_VERSION,
               {f"{DEMO_MODULE}/__init__.py": "def twice(x):\n    return 2 * x\n"})
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    # A cache of this test's own: the Host installs the set anew, and no other run's
    # cached overlay is used.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return folder


@pytest.fixture
def judged(workdir: Path, wheelhouse: Path) -> Iterator[Host]:
    """An armed session that pip-installed the demo distribution into its overlay."""
    wheel = next(wheelhouse.glob("*.whl"))
    (workdir / wheel.name).write_bytes(wheel.read_bytes())
    with Host(workdir, mode="reusable_pipeline") as host:
        run(host, f"python -m pip install --no-index --no-deps --quiet ./{wheel.name}")
        yield host


def _files(core: str) -> dict[str, str]:
    return {"pkg/__init__.py": "", "pkg/core.py": core, "tests/test_core.py": TEST_NEEDS_DEMO}


def _overlay_write(files: dict[str, bytes], record_of: str | None = None) -> str:
    """Kernel code writing ``files`` into its overlay; with ``record_of`` (a dist-info
    folder), rewriting that RECORD so it vouches for the new bytes (the same hand)."""
    code = ("import os, base64, hashlib\n_site = os.environ['PIP_TARGET']\n"
            f"for rel, data in {files!r}.items():\n"
            "    path = os.path.join(_site, rel)\n"
            "    os.makedirs(os.path.dirname(path), exist_ok=True)\n"
            "    open(path, 'wb').write(data)\n")
    if record_of:
        code += (f"_rec = os.path.join(_site, {record_of!r}, 'RECORD')\n"
                 "_rows = []\n"
                 "for line in open(_rec).read().splitlines():\n"
                 "    rel = line.split(',')[0]\n"
                 f"    if rel in {list(files)!r}:\n"
                 "        data = open(os.path.join(_site, rel), 'rb').read()\n"
                 "        h = base64.urlsafe_b64encode(hashlib.sha256(data).digest())"
                 ".rstrip(b'=').decode()\n"
                 "        line = f'{rel},sha256={h},{len(data)}'\n"
                 "    _rows.append(line)\n"
                 "open(_rec, 'w').write('\\n'.join(_rows) + '\\n')\n")
    return code


def test_an_honest_package_that_needs_what_the_session_installed_is_accepted(
        judged: Host) -> None:
    files = _files(GOOD)
    put(judged, files)
    cell = run(judged, CMD)
    r = submit_files(judged, files, CMD, cell)
    assert r.accepted, r
    host = r.sections[0]["environment"]["host_overlay"]
    assert host["installed"] == [f"{DEMO}=={DEMO_VERSION}"] and not host["missing"], host
    assert host["source"] == "host"
    # The import world's digest covers what the Host installed, not the kernel's copy.
    assert r.sections[0]["environment_digest"] == r.sections[0]["environment"]["digest"]


def test_a_distribution_rewritten_in_the_overlay_with_its_record_is_not_what_the_judge_imports(
        judged: Host) -> None:
    """The kernel edits the installed module and rewrites its RECORD to match: the overlay
    checks out, but the Host's run imports the distribution as the Host installed it."""
    files = _files(BAD)
    put(judged, files)
    forged = ("def twice(x):\n    return 2 * x\n"
              "import pkg.core as _core\n_core.add = lambda a, b: a + b\n")
    run_ok(judged, _overlay_write({f"{DEMO_MODULE}/__init__.py": forged.encode()},
                                  record_of=f"hk_judge_demo-{DEMO_VERSION}.dist-info"))
    cell = run(judged, CMD)  # the agent's own run passes: it imports the forged module
    r = submit_files(judged, files, CMD, cell)
    assert r.refused_with("reproduction_failed"), r
    assert "environment_tampered" not in r.failed, r  # the forgery is consistent


def test_a_forged_distribution_standing_in_for_the_standard_library_is_never_imported(
        judged: Host) -> None:
    """A dist-info made by hand, whose RECORD vouches for a ``colorsys.py`` that patches
    the package under test: the Host cannot install it from its wheelhouse, and the
    tests fail without it, so the entry is refused and the missing requirement named."""
    files = _files(BAD)
    put(judged, files)
    shadow = ("import pkg.core as _core\n_core.add = lambda a, b: a + b\n\n\n"
              "def rgb_to_yiq(r, g, b):\n    return (0.0, 0.0, 0.0)\n")
    info = "hk_forged-9.9.dist-info"
    meta = b"Metadata-Version: 2.1\nName: hk-forged\nVersion: 9.9\n\n"
    shadow_bytes = shadow.encode()
    record = (f"colorsys.py,{_hash(shadow_bytes)},{len(shadow_bytes)}\n"
              f"{info}/METADATA,{_hash(meta)},{len(meta)}\n{info}/RECORD,,\n").encode()
    run_ok(judged, _overlay_write({"colorsys.py": shadow_bytes, f"{info}/METADATA": meta,
                                   f"{info}/RECORD": record}))
    cell = run(judged, CMD)
    r = submit_files(judged, files, CMD, cell)
    assert r.refused_with("environment_unavailable"), r
    assert "hk-forged==9.9" in r.failed["environment_unavailable"], r
    host = r.sections[0]["environment"]["host_overlay"]
    assert [m["requirement"] for m in host["missing"]] == ["hk-forged==9.9"], host
    assert f"{DEMO}=={DEMO_VERSION}" in host["installed"], host


def test_a_missing_distribution_the_tests_do_not_need_does_not_block(judged: Host) -> None:
    """Honest twin: the session installed something the Host cannot get, but the declared
    tests pass without it: accepted, and the verdict names what was missing."""
    files = _files(GOOD)
    put(judged, files)
    info = "hk_unused-2.0.dist-info"
    meta = b"Metadata-Version: 2.1\nName: hk-unused\nVersion: 2.0\n\n"
    record = f"{info}/METADATA,{_hash(meta)},{len(meta)}\n{info}/RECORD,,\n".encode()
    run_ok(judged, _overlay_write({f"{info}/METADATA": meta, f"{info}/RECORD": record}))
    cell = run(judged, CMD)
    r = submit_files(judged, files, CMD, cell)
    assert r.accepted, r
    host = r.sections[0]["environment"]["host_overlay"]
    assert [m["requirement"] for m in host["missing"]] == ["hk-unused==2.0"], host


def test_a_package_left_in_shared_memory_does_not_shadow_the_declared_one(
        armed_host: Host) -> None:
    """The kernel leaves a working copy of the package in /dev/shm and declares a pytest.ini
    that puts it first on the path: the reproduction reads only its allow-list and its own
    private /dev/shm, so the declared (broken) package is the one tested."""
    shadow = f"/dev/shm/hk-shadow-{uuid.uuid4().hex[:8]}"
    run_ok(armed_host, f"import os\nos.makedirs({shadow!r} + '/pkg', exist_ok=True)\n"
                       f"open({shadow!r} + '/pkg/__init__.py', 'w').write('')\n"
                       f"open({shadow!r} + '/pkg/core.py', 'w').write({GOOD!r})")
    try:
        files = {"pkg/__init__.py": "", "pkg/core.py": BAD,
                 "tests/test_core.py": "from pkg.core import add\n\n\ndef test_add():\n"
                                       "    assert add(1, 2) == 3\n",
                 "pytest.ini": f"[pytest]\npythonpath = {shadow}\n"}
        put(armed_host, files)
        cell = run(armed_host, CMD)
        r = submit_files(armed_host, files, CMD, cell)
        assert r.refused_with("reproduction_failed"), r
    finally:
        run_ok(armed_host, f"import shutil\nshutil.rmtree({shadow!r}, ignore_errors=True)")


def test_the_reproduction_reads_only_its_allow_list(armed_host: Host, tmp_path: Path) -> None:
    """A declared test that tries to read outside the allow-list (the user's home, a file
    beside the workspace) is denied by the OS; the system's own files are readable."""
    outside = Path.home() / f".hk-judge-probe-{uuid.uuid4().hex[:8]}"
    outside.write_text("secret")
    try:
        # The agent's own run (not isolated) can read it; the Host's (-I) must not.
        probe = ("import os, sys, pytest\n\n\n"
                 f"def test_home_is_not_readable():\n"
                 f"    if sys.flags.isolated:\n"
                 f"        with pytest.raises(PermissionError):\n"
                 f"            open({str(outside)!r}).read()\n\n\n"
                 "def test_the_system_is():\n"
                 "    assert open('/etc/passwd').read()\n")
        files = {"tests/test_probe.py": probe}
        put(armed_host, files)
        cell = run(armed_host, "python -m pytest -q tests")
        r = submit_files(armed_host, files, "python -m pytest -q tests", cell,
                         entry="tests/test_probe.py")
        assert r.accepted, r
    finally:
        outside.unlink()


def test_a_cell_cannot_write_the_overlays_the_host_installs(judged: Host) -> None:
    """The Host-built overlays are what every reproduction imports and are reused across
    sessions: a cell (or its command) that tries to plant a module there is refused by the
    OS, so the cache's marker and RECORD check never have to stand alone."""
    import os

    from host_kernel.reproduce.world import HostOverlays

    root = HostOverlays().root
    root.mkdir(parents=True, exist_ok=True)
    obs = judged.execute(
        "import os\n"
        f"try:\n    open(os.path.join({str(root)!r}, 'planted.py'), 'w').write('x')\n"
        "    print('WROTE')\nexcept OSError as e:\n    print('REFUSED', type(e).__name__)\n"
        f"r = host.bash('touch {root}/planted2.py')\nprint('EXIT', r.exit_status)")
    assert "REFUSED" in obs.text and "WROTE" not in obs.text, obs.text
    assert "EXIT 0" not in obs.text, obs.text
    assert not os.path.exists(root / "planted.py") and not os.path.exists(root / "planted2.py")
