"""The judge's import world: what a reproduction may read, and the packages the Host installs.

Owns two decisions that must be out of the judged's reach:

- **What a reproduction reads.** An allow-list, kept here and nowhere else
  (:data:`SYSTEM_FOLDERS`, :data:`SYSTEM_FILES`, :func:`read_allow_list`): the
  reproduction's own folder (its tree, home and temp), the interpreter's
  installation as its isolated-mode import path names it, host_kernel itself,
  the Host-built overlay and bytecode cache, and the parts of the system Python
  needs. Nothing else: no workspace, no ``/tmp`` or ``/dev/shm`` of anyone
  else's, no ``$HOME``, no record.
- **Which packages it imports beyond the base installation.** The kernel's own
  overlay (where a cell's ``pip install`` lands) is written by the judged, so it
  is never imported by a reproduction. The Host reads from it only the names
  and versions the session installed, installs the same ``name==version`` itself
  from the index or wheelhouse pip is configured with, into a Host-owned folder
  keyed by the requirement set (:class:`HostOverlays`, cached across sessions),
  and a reproduction puts that folder after the standard library on its path.
  What it cannot get is named (``missing``) and decided by the caller.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..sandbox.policy import Policy
from .environment import HashCheckCache, check_overlay

__all__ = ["SYSTEM_FILES", "SYSTEM_FOLDERS", "HostOverlay", "HostOverlays",
           "read_allow_list", "recorded_requirements", "reproduction_policy",
           "requirements_of"]

#: System folders a Python process needs to run: shared libraries, the C library's
#: locale and time-zone data, the interpreter's own executables. Read-only to every
#: sandbox; none of them holds a session's files.
SYSTEM_FOLDERS = ("/usr/lib", "/usr/lib64", "/usr/libexec", "/usr/share/zoneinfo",
                  "/usr/share/locale", "/usr/lib/locale", "/lib", "/lib64", "/usr/bin", "/bin",
                  "/usr/local/lib", "/usr/share/ca-certificates", "/etc/ssl", "/etc/alternatives",
                  "/sys/devices/system/cpu")
#: Single system files Python and its C libraries read (the loader cache, users and
#: groups for ``getpass``, time zone, host names, MIME types).
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/timezone",
                "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/hosts",
                "/etc/resolv.conf", "/etc/host.conf", "/etc/mime.types", "/etc/os-release",
                "/proc/cpuinfo", "/proc/meminfo")

#: A distribution's name and version as the Host will ask pip for them (PEP 508 names,
#: PEP 440-ish versions): anything else read from the kernel's overlay is ignored.
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]{0,62}$")
#: Most distributions one session's overlay may ask the Host to install.
MAX_REQUIREMENTS = 200
#: Seconds pip may take to install one requirement set.
INSTALL_TIMEOUT = 600.0


def read_allow_list(identity: dict[str, Any], extra: list[str]) -> tuple[list[str], list[str]]:
    """(folders, files) a reproduction may read, besides its own folder.

    The interpreter's part comes from its isolated-mode ``sys.path`` (asked once per
    process, :func:`~.environment.interpreter_identity`) and from where its executable
    and prefixes are; host_kernel is read from where it is installed.
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folders = [os.path.realpath(p) for p in identity.get("path", ())
               if isinstance(p, str) and os.path.isdir(p)]
    folders += [os.path.realpath(p) for p in (
        sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable),
        os.path.dirname(os.path.realpath(sys.executable)), package)]
    folders += [p for p in SYSTEM_FOLDERS if os.path.isdir(p)]
    folders += [os.path.realpath(p) for p in extra if p and os.path.exists(p)]
    files = [p for p in SYSTEM_FILES if os.path.exists(p)]
    return list(dict.fromkeys(folders)), files


def reproduction_policy(folder: Path, identity: dict[str, Any], extra: list[str],
                        hidden: list[str], *, network: bool) -> Policy:
    """The sandbox policy of one reproduction: writes to its own folder only, reads only
    the allow-list (:func:`read_allow_list`). A listed folder that holds one of ``hidden``
    (the workspace, the record, a secret) is left out rather than granted."""
    folders, files = read_allow_list(identity, extra)
    hide = [os.path.realpath(h) for h in hidden]
    folders = [f for f in folders
               if not any(h == f or h.startswith(f.rstrip("/") + "/") for h in hide)]
    real = os.path.realpath(folder)
    interpreter = sorted({os.path.realpath(p) for p in (
        sys.prefix, sys.base_prefix, sys.exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)))})
    return Policy(workspace=real, writable=(real,), readable=tuple(folders),
                  readable_files=tuple(files), hidden=tuple(hide), network=network,
                  interpreter=tuple(interpreter))


def requirements_of(overlay: Path | None) -> tuple[list[str], list[str]]:
    """The ``name==version`` of each distribution in the kernel's overlay, and what was
    ignored (a name or version that is not one, past the bound).

    Only names and versions are read (from the ``.dist-info`` folder names and their
    METADATA); no file of the overlay is ever put on a reproduction's path.
    """
    if overlay is None or not overlay.is_dir():
        return [], []
    wanted: dict[str, str] = {}
    ignored: list[str] = []
    from .environment import _name_version

    for info in sorted(overlay.glob("*.dist-info"))[:MAX_REQUIREMENTS + 1]:
        name, version = _name_version(info)
        if not _NAME.match(name) or not _VERSION.match(version):
            ignored.append(info.name[:120])
            continue
        wanted[name.lower().replace("_", "-")] = version
    reqs = [f"{n}=={v}" for n, v in sorted(wanted.items())]
    if len(reqs) > MAX_REQUIREMENTS:
        ignored += reqs[MAX_REQUIREMENTS:]
        reqs = reqs[:MAX_REQUIREMENTS]
    return reqs, ignored


def recorded_requirements(sections: list[dict[str, Any]]) -> list[str]:
    """The requirement set a verdict's reproduction installed (for ``audit --reproduce``)."""
    for section in sections:
        host = (section.get("environment") or {}).get("host_overlay") or {}
        reqs = host.get("requirements")
        if isinstance(reqs, list):
            return [str(r) for r in reqs]
    return []


@dataclass(frozen=True)
class HostOverlay:
    """One requirement set as the Host installed it."""

    requirements: tuple[str, ...]
    #: The folder put on a reproduction's path (after the standard library); None when
    #: nothing could be installed.
    path: Path | None
    installed: tuple[str, ...]
    #: Requirements pip could not install from its index or wheelhouse, with why.
    missing: tuple[tuple[str, str], ...]
    #: sha256 over the installed distributions' RECORDs.
    digest: str
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"requirements": list(self.requirements), "installed": list(self.installed),
                "missing": [{"requirement": r, "why": w} for r, w in self.missing],
                "digest": self.digest, "cached": self.cached, "source": "host"}


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "host_kernel" / "overlays"


class HostOverlays:
    """Overlays the Host installs itself, one per requirement set, cached on disk.

    ``root`` must be a folder no confined process can write (the default is the
    user's cache folder, which no sandbox grants; :meth:`usable` says whether a
    given workspace contains it, in which case the caller passes a private root).
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or _cache_root()
        self._lock = threading.Lock()
        self._checked: HashCheckCache = {}
        self._memo: dict[tuple[str, ...], HostOverlay] = {}

    def usable(self, writable: list[str]) -> bool:
        """Whether none of ``writable`` (folders confined code may write) holds the root."""
        root = os.path.realpath(self.root)
        return not any(root == w or root.startswith(w.rstrip("/") + "/")
                       for w in (os.path.realpath(p) for p in writable))

    def get(self, requirements: list[str]) -> HostOverlay:
        """The overlay of ``requirements``, installed now if not cached."""
        reqs = tuple(sorted(requirements))
        if not reqs:
            return HostOverlay((), None, (), (), hashlib.sha256(b"").hexdigest())
        with self._lock:
            known = self._memo.get(reqs)
            if known is not None:
                return known
            tag = hashlib.sha256(f"{sys.executable}\0{sys.version}".encode()).hexdigest()[:12]
            key = hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:32]
            folder = self.root / f"{tag}-{key}"
            overlay = self._load(folder, reqs)
            if overlay is None:
                overlay = self._install(folder, reqs)
            self._memo[reqs] = overlay
            return overlay

    def _load(self, folder: Path, reqs: tuple[str, ...]) -> HostOverlay | None:
        """A cached overlay, when its marker and every file's RECORD hash still hold."""
        try:
            marker = json.loads((folder / "host-overlay.json").read_text("utf-8"))
        except (OSError, ValueError):
            return None
        if marker.get("requirements") != list(reqs):
            return None
        site = folder / "site"
        problems, _, digest = check_overlay(site if site.is_dir() else None, self._checked)
        if problems or digest != marker.get("digest"):
            shutil.rmtree(folder, ignore_errors=True)  # not what the Host installed: anew
            return None
        return HostOverlay(reqs, site if site.is_dir() else None,
                           tuple(marker.get("installed", ())),
                           tuple((str(m[0]), str(m[1])) for m in marker.get("missing", ())),
                           digest, cached=True)

    def _install(self, folder: Path, reqs: tuple[str, ...]) -> HostOverlay:
        """Install ``reqs`` with pip, no dependencies resolved (the set is the session's
        whole overlay, dependencies included), each one alone when the set fails."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        work = Path(tempfile.mkdtemp(prefix=".install-", dir=self.root))
        site = work / "site"
        try:
            ok, _ = _pip(site, list(reqs))
            missing: list[tuple[str, str]] = []
            installed = list(reqs)
            if not ok:
                shutil.rmtree(site, ignore_errors=True)
                installed = []
                for req in reqs:
                    one_ok, one_why = _pip(site, [req])
                    if one_ok:
                        installed.append(req)
                    else:
                        missing.append((req, one_why))
            problems, _, digest = check_overlay(site if site.is_dir() else None, self._checked)
            if problems:  # pip's own install is not what its RECORDs say: never use it
                raise OSError("the Host's own install is inconsistent: " + problems[0])
            marker = {"requirements": list(reqs), "installed": installed,
                      "missing": [list(m) for m in missing], "digest": digest}
            (work / "host-overlay.json").write_text(json.dumps(marker), "utf-8")
            try:
                os.rename(work, folder)
            except OSError:  # another Host installed the same set first: use theirs
                shutil.rmtree(work, ignore_errors=True)
                loaded = self._load(folder, reqs)
                if loaded is not None:
                    return loaded
                raise
            final = folder / "site"
            return HostOverlay(reqs, final if final.is_dir() else None, tuple(installed),
                               tuple(missing), digest)
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)


def _pip(target: Path, reqs: list[str]) -> tuple[bool, str]:
    """``pip install --target`` of exact requirements, from pip's configured index."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PIP_TARGET", "PIP_PREFIX", "PIP_USER"))}
    argv = [sys.executable, "-m", "pip", "install", "--target", str(target), "--no-deps",
            "--no-input", "--disable-pip-version-check", "--no-compile", "--no-warn-conflicts",
            "--quiet", *reqs]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
                             env=env, stdin=subprocess.DEVNULL, cwd=str(target.parent))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"pip could not run: {exc}"
    if out.returncode != 0:
        lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
        return False, (lines[-1] if lines else f"pip exited {out.returncode}")[:300]
    return True, ""
