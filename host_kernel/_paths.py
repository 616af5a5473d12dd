"""Where a workspace's record lives, and how readers find it again.

The record lives **outside** the workspace by default, because a Landlock rule
cannot make a sub-folder of a writable tree read-only (docs/security.md)::

    $XDG_STATE_HOME/host_kernel/records/<workspace name>-<12 hex of sha256(real path)>/

(``$XDG_STATE_HOME`` defaults to ``~/.local/state``.) An explicit ``record_dir``
always wins. Records made before this rule, at ``<workspace>/.host_kernel``,
still open: :func:`find_record` looks there too. This module owns only paths;
it opens nothing.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "LEDGER_NAME",
    "LEGACY_RECORD_NAME",
    "default_record_dir",
    "find_record",
    "records_home",
    "state_home",
    "user_site",
]

#: The folder name of a record kept inside its workspace (before the record moved out).
LEGACY_RECORD_NAME = ".host_kernel"
#: The ledger's file name inside a record folder.
LEDGER_NAME = "ledger.sqlite"


def state_home() -> Path:
    """``$XDG_STATE_HOME``, or ``~/.local/state`` when it is unset or not absolute."""
    value = os.environ.get("XDG_STATE_HOME", "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home() / ".local" / "state"


def records_home() -> Path:
    """The folder holding one record folder per workspace."""
    return state_home() / "host_kernel" / "records"


def default_record_dir(workdir: str | os.PathLike[str]) -> Path:
    """The record folder of a workspace: outside it, named after it, unique per real path."""
    real = os.path.realpath(workdir)
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    name = os.path.basename(real.rstrip("/")) or "root"
    return records_home() / f"{name}-{digest}"


def find_record(path: str | os.PathLike[str]) -> Path | None:
    """The record folder that ``path`` names, or None.

    ``path`` may be a record folder itself (it holds ``ledger.sqlite``), a
    workspace whose record is at its default place, or a workspace holding a
    legacy ``.host_kernel`` record. The first that holds a ledger wins.
    """
    root = Path(path)
    for candidate in (root, default_record_dir(root), root / LEGACY_RECORD_NAME):
        if (candidate / LEDGER_NAME).is_file():
            return candidate
    return None


def _venv_without_user_site() -> bool:
    """Whether this interpreter is a virtual environment whose ``pyvenv.cfg`` leaves the
    user site out (``include-system-site-packages`` other than true), as :mod:`site` reads it."""
    if sys.prefix == sys.base_prefix:
        return False
    bindir = os.path.dirname(os.path.abspath(sys.executable))
    for folder in (bindir, os.path.dirname(bindir)):
        cfg = os.path.join(folder, "pyvenv.cfg")
        if not os.path.isfile(cfg):
            continue
        with open(cfg, encoding="utf-8") as lines:
            for line in lines:
                key, sep, value = line.partition("=")
                if sep and key.strip().lower() == "include-system-site-packages":
                    return value.strip().lower() != "true"
        return False
    return False


def user_site(env: Mapping[str, str]) -> str | None:
    """The user's site folder a fresh ``python`` of this interpreter started with ``env``
    would put on its path (and whose ``.pth`` files and ``usercustomize`` it would run),
    whether or not it exists; None where it would leave it out (``PYTHONNOUSERSITE``, a
    virtual environment without system site-packages, a set-uid start)."""
    if (env.get("PYTHONNOUSERSITE") or _venv_without_user_site()
            or os.getuid() != os.geteuid() or os.getgid() != os.getegid()):
        return None
    import sysconfig  # only now: a warm kernel calls this, and each import is traced

    base = env.get("PYTHONUSERBASE") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".local")
    scheme = f"{os.name}_user"
    if scheme not in sysconfig.get_scheme_names():
        return None
    return sysconfig.get_path("purelib", scheme, vars={"userbase": base})
