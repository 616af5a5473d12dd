"""The environment a reproduction runs in: the interpreter, its packages, the variables.

Owns:

- :func:`interpreter_identity`: the interpreter the Host launched the kernel
  with (path, version, import path in isolated mode, installed distributions),
  asked once per process by running it with ``-I``, which also fills the
  Host-owned bytecode cache (:func:`pycache_dir`) from the base installation
  alone (confined code cannot write there, nor to the base installation).
- :func:`check_overlay`: the session's package overlay (where ``pip install``
  lands) checked file by file against each distribution's ``RECORD``: a file no
  ``RECORD`` lists (a ``.pth``, ``sitecustomize``, a module dropped in), or one
  whose bytes differ from its recorded hash, is tampering.
- :func:`run_env`: the variables, built from an allow-list, never inherited
  from the kernel.

Bytecode next to sources (``__pycache__``) is never read by a reproduction: it
runs with ``-B -X pycache_prefix=<Host cache>``, so Python looks for compiled
files only in that cache; a sourceless ``.pyc`` in the overlay is tampering.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

__all__ = ["check_overlay", "environment_digest", "interpreter_identity", "pycache_dir",
           "run_env"]

#: Run once per Host process, unconfined, from the base installation alone (``-I``): it
#: says who the interpreter is and fills the bytecode cache by running one trivial test
#: the way a reproduction runs (the base install's plugins, the Host's reporter).
_IDENTITY_CODE = r"""
import contextlib, io, json, os, sys, tempfile, importlib.metadata as md
import pytest
from host_kernel.reproduce import boot
from host_kernel.reproduce.plugin import ReportPlugin
dists = sorted({(d.metadata["Name"] or "?", d.version) for d in md.distributions()})
eps = sorted({e.name for e in md.entry_points(group="pytest11")})
with tempfile.TemporaryDirectory() as d:
    for name, text in (("test_warm.py", "def test_warm():\n    assert True\n"),
                       ("pytest.ini", "[pytest]\n"), ("report", "")):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    args = ["-q", "-p", "no:cacheprovider", "-c", os.path.join(d, "pytest.ini"), "--rootdir", d]
    for name in eps:
        args += ["-p", name]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        pytest.main(args + [os.path.join(d, "test_warm.py")],
                    plugins=[ReportPlugin(os.path.join(d, "report"))])
print(json.dumps({"executable": sys.executable, "version": sys.version.split()[0],
                  "implementation": sys.implementation.name, "path": sys.path,
                  "distributions": dists, "pytest_plugins": eps}))
"""

_identity: dict[str, Any] | None = None
#: A cache of this process's own, when neither usual folder can be trusted.
_private_cache: Path | None = None
_identity_lock = threading.Lock()


def pycache_dir() -> Path:
    """The Host-owned bytecode cache for the base interpreter (one per interpreter).

    ``$XDG_CACHE_HOME/host_kernel/pycache-<tag>`` (``~/.cache`` by default), or a
    folder of this user's in the temp folder when that cannot be made. Confined
    code may read it, never write it.
    """
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    tag = hashlib.sha256(f"{sys.executable}\0{sys.version}".encode()).hexdigest()[:12]
    for folder in (root / "host_kernel" / f"pycache-{tag}",
                   Path(tempfile.gettempdir()) / f"host_kernel-{os.getuid()}-pycache-{tag}"):
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.lstat(folder)
        except OSError:
            continue
        # Bytecode read from here runs in every reproduction: only a real folder of ours
        # that nobody else may write will do (another user could plant one in /tmp).
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and \
                not info.st_mode & 0o022:
            return folder
    global _private_cache
    if _private_cache is None:
        _private_cache = Path(tempfile.mkdtemp(prefix="host_kernel-pycache-"))
    return _private_cache


def interpreter_identity() -> dict[str, Any]:
    """Who the base interpreter is; run once per process (it also warms the cache)."""
    global _identity
    with _identity_lock:
        if _identity is None:
            cache = pycache_dir()
            out = subprocess.run(
                [sys.executable, "-I", "-X", f"pycache_prefix={cache}", "-c", _IDENTITY_CODE],
                capture_output=True, text=True, timeout=120, cwd="/",
                env=run_env(Path(tempfile.gettempdir()), Path(tempfile.gettempdir())))
            if out.returncode != 0:
                raise OSError(f"the interpreter {sys.executable} could not load pytest in "
                              f"isolated mode: {out.stderr.strip()[-500:]}")
            _identity = json.loads(out.stdout.strip().splitlines()[-1])
        return dict(_identity)


def run_env(home: Path, tmp: Path) -> dict[str, str]:
    """The reproduction's variables: an allow-list, never the kernel's environment."""
    folder = os.path.dirname(sys.executable)
    env = {
        "PATH": os.pathsep.join([folder, "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        # Plugins from the base installation are loaded by name (-p), never by scanning.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "NO_COLOR": "1",
    }
    tz = os.environ.get("TZ")
    if tz:
        env["TZ"] = tz
    return env


def _record_hash(value: str) -> tuple[str, str] | None:
    if "=" not in value:
        return None
    algo, _, digest = value.partition("=")
    return algo, digest


def _file_hash(path: Path, algo: str) -> str | None:
    try:
        h = hashlib.new(algo)
    except ValueError:
        return None
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


#: What a file's recorded hash was checked against: (size, mtime ns, ctime ns, inode).
HashCheckCache = dict[tuple[str, str], tuple[int, int, int, int]]


def check_overlay(overlay: Path | None, checked: HashCheckCache | None = None,
                  ) -> tuple[list[str], list[tuple[str, str]], str]:
    """Problems, the distributions installed, and a digest of the overlay's RECORDs.

    A problem is a sentence naming one file. Bytecode in ``__pycache__`` is not
    checked: the reproduction never reads it. Everything else must be listed by
    some distribution's ``RECORD`` and, where a hash is given, have it.
    ``checked`` remembers files whose hash matched, by stat (ctime cannot be set
    by a process), so a large overlay is hashed once per Host, not per submit.
    """
    if overlay is None or not overlay.is_dir():
        return [], [], hashlib.sha256(b"").hexdigest()
    problems: list[str] = []
    recorded: dict[str, tuple[str, str] | None] = {}
    dists: list[tuple[str, str]] = []
    digest = hashlib.sha256()
    root = os.path.realpath(overlay)
    for info in sorted(overlay.glob("*.dist-info")):
        record = info / "RECORD"
        name, version = _name_version(info)
        dists.append((name, version))
        try:
            text = record.read_bytes()
        except OSError:
            problems.append(f"{info.name} has no RECORD, so its files cannot be checked")
            continue
        digest.update(info.name.encode() + b"\0" + hashlib.sha256(text).digest())
        for row in csv.reader(io.StringIO(text.decode("utf-8", "replace"))):
            if not row:
                continue
            real = os.path.normpath(os.path.join(root, row[0]))
            parts = row[0].replace("\\", "/").split("/")
            if not real.startswith(root + os.sep) and len(parts) >= 2 and parts[-2] == "bin":
                # pip --target installs scripts as ../../bin/NAME and moves them to bin/
                real = os.path.join(root, "bin", parts[-1])
            if not real.startswith(root + os.sep):
                continue  # installed elsewhere: not on the reproduction's path
            recorded[real] = _record_hash(row[1]) if len(row) > 1 and row[1] else None
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                problems.append(f"{rel} is a symlink no RECORD can vouch for")
                continue
            if path not in recorded:
                problems.append(f"{rel} is not listed by any installed distribution's RECORD")
                continue
            want = recorded[path]
            if want is None:
                if name != "RECORD":
                    problems.append(f"{rel} has no hash in its RECORD, so it cannot be checked")
                continue
            try:
                st = os.lstat(path)
            except OSError:
                problems.append(f"{rel} cannot be read")
                continue
            key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
            if checked is not None and checked.get((path, want[1])) == key:
                continue
            if _file_hash(Path(path), want[0]) != want[1]:
                problems.append(f"{rel} differs from the bytes its RECORD lists")
            elif checked is not None:
                checked[(path, want[1])] = key
    return problems, sorted(dists), digest.hexdigest()


def _name_version(info: Path) -> tuple[str, str]:
    name, version = info.name[: -len(".dist-info")], "?"
    if "-" in name:
        name, version = name.rsplit("-", 1)
    try:
        for line in (info / "METADATA").read_text("utf-8", "replace").splitlines():
            if line.startswith("Name:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
            elif not line.strip():
                break
    except OSError:
        pass
    return name, version


def environment_digest(identity: dict[str, Any], overlay_digest: str) -> str:
    """One sha256 for the interpreter, its distributions and the overlay's RECORDs."""
    data = json.dumps([identity.get("executable"), identity.get("version"),
                       identity.get("distributions"), overlay_digest], sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()
