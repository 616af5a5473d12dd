"""The workspace's baseline and the reproduction tree built from the blob store.

Owns two things:

- :func:`record_baseline`: at the start of a ``codebase_change`` session,
  before any cell runs, the workspace's files as they are then. In a git
  repository that is the HEAD commit, read with git's own plumbing
  (``ls-tree``, ``cat-file --batch``); elsewhere the workspace's files. Either
  way every file's bytes go into the blob store (deduplicated) and a manifest
  ``{path: [sha256, mode]}`` is stored as a blob too, so the baseline is
  evidence the kernel cannot change afterwards (``.git`` is in the writable
  workspace; the blob store is not).
- :func:`build_tree`: a fresh folder holding exactly a manifest's files, copied
  from the blob store (never hardlinked: the tree is writable by the tests, the
  store must not be), each checked against its sha256 as it is copied.

No bytecode, ``__pycache__``, ``.pth``-bearing virtual environment, VCS folder or
tool cache is taken into a baseline.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import StorageError
from ..store.blobs import FileBlobStore, open_beneath

__all__ = ["Baseline", "BaselineError", "build_tree", "record_baseline", "tree_digest"]

#: A baseline holds at most this many files, and this many bytes in all.
MAX_BASELINE_FILES = 50_000
MAX_BASELINE_BYTES = 2 * 1024**3
#: Folders never taken into a baseline made from the workspace's files.
SKIP_DIRS = frozenset({".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                       ".tox", ".nox", "node_modules", ".hg", ".svn", ".ipynb_checkpoints"})
SKIP_SUFFIXES = (".pyc", ".pyo")

Manifest = dict[str, tuple[str, int]]  # path → (sha256, mode bits)
Baseline = dict[str, Any]


class BaselineError(StorageError):
    """The baseline cannot be read back (missing or altered blob)."""


def _skip_file(rel: str) -> bool:
    parts = rel.split("/")
    return rel.endswith(SKIP_SUFFIXES) or any(p in SKIP_DIRS for p in parts[:-1])


def record_baseline(workspace: Path, blobs: FileBlobStore) -> Baseline:
    """Snapshot the workspace into the blob store; the returned dict goes into the record."""
    try:
        head = _git(workspace, "rev-parse", "--verify", "-q", "HEAD^{commit}").strip()
        top = _git(workspace, "rev-parse", "--show-toplevel").strip()
    except (OSError, subprocess.CalledProcessError):
        head = top = ""
    if head and os.path.realpath(top) == os.path.realpath(workspace):
        try:
            manifest = _from_git(workspace, head, blobs)
        except _TooLarge as exc:
            return {"kind": "unavailable", "reason": str(exc)}
        except (OSError, subprocess.CalledProcessError, ValueError) as exc:
            return {"kind": "unavailable", "reason": f"git could not list HEAD: {exc}"}
        source: dict[str, Any] = {"kind": "git", "commit": head}
    else:
        try:
            manifest = _from_files(workspace, blobs)
        except _TooLarge as exc:
            return {"kind": "unavailable", "reason": str(exc)}
        source = {"kind": "files"}
    ref = blobs.put_bytes(_manifest_bytes(manifest))
    return source | {"manifest_sha256": ref.sha256, "files": len(manifest),
                     "bytes": sum(_size(blobs, sha) for sha, _ in manifest.values())}


def _size(blobs: FileBlobStore, sha: str) -> int:
    try:
        return blobs.path(sha).stat().st_size
    except OSError:
        return 0


class _TooLarge(ValueError):
    pass


def _git_env() -> dict[str, str]:
    """The Host's environment without GIT_* (no other repository, index or object store),
    and replace refs ignored: HEAD is read as it is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_NO_REPLACE_OBJECTS"] = "1"
    return env


def _git(workspace: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(workspace), *args], capture_output=True, text=True,
                          check=True, env=_git_env(), timeout=60).stdout


def _from_git(workspace: Path, commit: str, blobs: FileBlobStore) -> Manifest:
    listing = _git(workspace, "ls-tree", "-r", "-z", "--full-tree", commit)
    wanted: list[tuple[str, str, int]] = []
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        git_mode, kind, oid = meta.split()
        if kind != "blob" or git_mode == "120000" or _skip_file(path):
            continue  # submodules, symlinks and bytecode are not taken
        wanted.append((path, oid, 0o755 if git_mode == "100755" else 0o644))
    if len(wanted) > MAX_BASELINE_FILES:
        raise _TooLarge(f"HEAD holds {len(wanted)} files; a baseline holds at most "
                        f"{MAX_BASELINE_FILES}")
    manifest: Manifest = {}
    proc = subprocess.Popen(["git", "-C", str(workspace), "cat-file", "--batch"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_git_env())
    assert proc.stdin is not None and proc.stdout is not None
    total = 0
    try:
        for path, oid, mode in wanted:
            proc.stdin.write(oid.encode() + b"\n")
            proc.stdin.flush()
            header = proc.stdout.readline().split()
            if len(header) != 3 or header[1] != b"blob":
                raise ValueError(f"git cat-file gave {header!r} for {path}")
            size = int(header[2])
            total += size
            if total > MAX_BASELINE_BYTES:
                raise _TooLarge(f"HEAD's files exceed {MAX_BASELINE_BYTES} bytes")
            data = proc.stdout.read(size)
            proc.stdout.read(1)
            # The object's id is the hash of its content: what we store is what HEAD holds.
            algo = "sha1" if len(oid) == 40 else "sha256"  # a repository's object format
            if hashlib.new(algo, b"blob %d\0" % size + data).hexdigest() != oid:
                raise ValueError(f"git object {oid} for {path} does not match its id")
            manifest[path] = (blobs.put_bytes(data).sha256, mode)
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait()
        proc.stdout.close()
    return manifest


def _from_files(workspace: Path, blobs: FileBlobStore) -> Manifest:
    manifest: Manifest = {}
    total = 0
    root = str(workspace)
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not os.path.isfile(
            os.path.join(folder, d, "pyvenv.cfg")) and not os.path.islink(os.path.join(folder, d)))
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
            if _skip_file(rel):
                continue
            try:
                info = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            total += info.st_size
            if len(manifest) >= MAX_BASELINE_FILES or total > MAX_BASELINE_BYTES:
                raise _TooLarge(f"the workspace holds more than {MAX_BASELINE_FILES} files or "
                                f"{MAX_BASELINE_BYTES} bytes")
            try:
                with open_beneath(workspace, rel) as f:
                    ref = blobs.put_stream(f)
            except (OSError, StorageError):
                continue
            manifest[rel] = (ref.sha256, 0o755 if info.st_mode & 0o111 else 0o644)
    return manifest


def _manifest_bytes(manifest: Mapping[str, tuple[str, int]]) -> bytes:
    return json.dumps({p: [s, m] for p, (s, m) in sorted(manifest.items())},
                      separators=(",", ":")).encode()


def load_manifest(blobs: FileBlobStore, sha256: str) -> Manifest:
    """A baseline manifest from the store; BaselineError when it is missing or altered."""
    try:
        data = json.loads(blobs.read(sha256))
    except (StorageError, ValueError) as exc:
        raise BaselineError(f"the baseline manifest {sha256[:12]}… cannot be read: {exc}",
                            code="baseline_unavailable") from None
    return {str(p): (str(v[0]), int(v[1])) for p, v in data.items()}


def tree_digest(manifest: Mapping[str, tuple[str, int]]) -> str:
    """One sha256 for a tree: its paths, their bytes' sha256 and their modes."""
    return hashlib.sha256(_manifest_bytes(manifest)).hexdigest()


def build_tree(dest: Path, manifest: Mapping[str, tuple[str, int]],
               blobs: FileBlobStore) -> None:
    """Write each file of ``manifest`` under ``dest`` from the store, checked as copied."""
    made: set[str] = set()
    for rel, (sha, mode) in sorted(manifest.items()):
        target = dest / rel
        parent = str(target.parent)
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        hasher = hashlib.sha256()
        try:
            src = blobs.open(sha)
        except (StorageError, OSError) as exc:
            raise BaselineError(f"{rel}: its stored bytes {sha[:12]}… are missing ({exc})",
                                code="blob_missing") from None
        with src, open(target, "xb") as out:
            while chunk := src.read(1 << 20):
                hasher.update(chunk)
                out.write(chunk)
        if hasher.hexdigest() != sha:
            raise BaselineError(f"{rel}: its stored bytes no longer hash to {sha[:12]}…",
                                code="blob_altered")
        os.chmod(target, mode)
