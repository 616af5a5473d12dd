"""The workspace's baseline and the reproduction tree built from the blob store.

Owns three things:

- :func:`record_baseline`: at the start of a ``codebase_change`` session,
  before any cell runs, the workspace's files as they are then. In a git
  repository that is the HEAD commit (or the revision the user named,
  :func:`read_revision`), read with ``git cat-file --batch`` and every object
  on the way, commit, trees and blobs, checked against its id, so a commit id
  stands for exactly one tree whatever was written under ``.git``; elsewhere
  the workspace's files. Either way every file's bytes go into the blob store
  (deduplicated) and a manifest ``{path: [sha256, mode]}`` is stored as a blob
  too, so the baseline is evidence the kernel cannot change afterwards
  (``.git`` is in the writable workspace; the blob store is not).
- what the Host needs to judge whether a recorded session could have written
  that baseline (the decision is the Host's, host/_session.py):
  :func:`head_commit`, :func:`git_dirs` and :func:`changed_within` (entries
  whose change time, which no process can set back, falls while a session ran).
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

__all__ = ["Baseline", "BaselineError", "build_tree", "changed_within", "git_dirs", "head_commit",
           "load_manifest", "read_revision", "record_baseline", "taken", "tree_digest"]

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


def taken(rel: str) -> bool:
    """Whether a workspace file at ``rel`` would be taken into a baseline of its files."""
    return not _skip_file(rel)


def record_baseline(workspace: Path, blobs: FileBlobStore) -> Baseline:
    """Snapshot the workspace into the blob store; the returned dict goes into the record."""
    head = head_commit(workspace)
    if head is not None:
        try:
            manifest = _from_git(workspace, head, blobs)
        except _TooLarge as exc:
            return {"kind": "unavailable", "reason": str(exc)}
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return {"kind": "unavailable", "reason": f"git could not read HEAD: {exc}"}
        source: dict[str, Any] = {"kind": "git", "commit": head}
    else:
        try:
            manifest = _from_files(workspace, blobs)
        except _TooLarge as exc:
            return {"kind": "unavailable", "reason": str(exc)}
        source = {"kind": "files"}
    return source | _stored(manifest, blobs)


def read_revision(workspace: Path, blobs: FileBlobStore, revision: str) -> Baseline:
    """The tree of ``revision`` (a commit id, branch, tag or ``HEAD~2``), which the user
    named from outside the session; BaselineError when it cannot be read."""
    if not revision or revision.startswith("-") or any(ch in revision for ch in "\0\n\r"):
        raise BaselineError(f"{revision!r} is not a git revision", code="baseline_unavailable")
    if not _is_toplevel(workspace):
        raise BaselineError(f"the workspace {workspace} is not the top folder of a git "
                            f"repository, so no revision can be its baseline",
                            code="baseline_unavailable")
    try:
        commit = _git(workspace, "rev-parse", "--verify", "-q", "--end-of-options",
                      f"{revision}^{{commit}}").strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    if not commit:
        raise BaselineError(f"{revision!r} names no commit of the workspace's repository",
                            code="baseline_unavailable")
    try:
        manifest = _from_git(workspace, commit, blobs)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise BaselineError(f"git could not read {revision!r} ({commit[:12]}): {exc}",
                            code="baseline_unavailable") from None
    return {"kind": "git", "commit": commit} | _stored(manifest, blobs)


def _stored(manifest: Manifest, blobs: FileBlobStore) -> dict[str, Any]:
    ref = blobs.put_bytes(_manifest_bytes(manifest))
    return {"manifest_sha256": ref.sha256, "files": len(manifest),
            "bytes": sum(_size(blobs, sha) for sha, _ in manifest.values())}


def _is_toplevel(workspace: Path) -> bool:
    if not os.path.lexists(workspace / ".git"):
        return False  # not a repository's top folder (git would look in the folders above)
    try:
        top = _git(workspace, "rev-parse", "--show-toplevel").strip()
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(top) and os.path.realpath(top) == os.path.realpath(workspace)


def head_commit(workspace: Path) -> str | None:
    """The HEAD commit when the workspace is the top folder of a git repository."""
    if not _is_toplevel(workspace):
        return None
    try:
        head = _git(workspace, "rev-parse", "--verify", "-q", "HEAD^{commit}").strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head or None


def git_dirs(workspace: Path) -> list[Path]:
    """The repository's own folders (its git dir and common dir, wherever they are) and
    the workspace's ``.git`` entry: everything whose change would change what a revision
    means or what the user's next commit holds."""
    found = [workspace / ".git"]
    try:
        out = _git(workspace, "rev-parse", "--absolute-git-dir", "--git-common-dir")
    except (OSError, subprocess.SubprocessError):
        return found
    for line in out.splitlines():
        path = Path(line) if os.path.isabs(line) else workspace / line
        real = Path(os.path.realpath(path))
        if real not in found:
            found.append(real)
    return found


def changed_within(roots: list[Path], windows: list[tuple[float, float | None]],
                   limit: int = 200_000, skip: frozenset[str] = frozenset()
                   ) -> tuple[list[tuple[str, float]], bool]:
    """Entries under ``roots`` (files and folders, symlinks not followed; a folder's change
    time moves when an entry is added, removed or renamed in it) whose change time falls
    in a window ``(start, end)`` (``end`` None: still open), in wall-clock seconds.

    Returns (path, change time) pairs, at most 50, and whether ``limit`` entries were
    looked at before the walk was done (then the answer is incomplete).
    """
    found: list[tuple[str, float]] = []
    seen = 0

    def inside(ctime: float) -> bool:
        return any(start <= ctime and (end is None or ctime <= end) for start, end in windows)

    stack: list[str] = []
    for root in roots:
        try:
            info = os.lstat(root)
        except OSError:
            continue
        if inside(info.st_ctime):
            found.append((str(root), info.st_ctime))
        if stat.S_ISDIR(info.st_mode):
            stack.append(str(root))
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > limit:
                return found[:50], True
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if inside(info.st_ctime) and len(found) < 50:
                found.append((entry.path, info.st_ctime))
            if stat.S_ISDIR(info.st_mode) and entry.name not in skip:
                stack.append(entry.path)
    return found, False


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
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    return env


#: The Host runs git on a repository a session may have written: nothing it runs may
#: start a program the repository's config names (fsmonitor, hooks).
_GIT = ("git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null")


def _git(workspace: Path, *args: str) -> str:
    return subprocess.run([*_GIT, "-C", str(workspace), *args], capture_output=True,
                          text=True, check=True, env=_git_env(), timeout=60).stdout


class _Objects:
    """``git cat-file --batch``: objects by id, each checked against its id (git itself
    does not re-hash what it reads, and ``.git`` is writable to the kernel)."""

    def __init__(self, workspace: Path) -> None:
        self.proc = subprocess.Popen([*_GIT, "-C", str(workspace), "cat-file", "--batch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=_git_env())
        self.total = 0

    def get(self, oid: str, want: str) -> bytes:
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(oid.encode() + b"\n")
        proc.stdin.flush()
        header = proc.stdout.readline().split()
        if len(header) != 3 or header[1] != want.encode():
            raise ValueError(f"git cat-file gave {header!r} for the {want} {oid}")
        size = int(header[2])
        self.total += size
        if self.total > MAX_BASELINE_BYTES:
            raise _TooLarge(f"the revision's files exceed {MAX_BASELINE_BYTES} bytes")
        data = proc.stdout.read(size)
        proc.stdout.read(1)
        # The object's id is the hash of its content: what we store is what the id names.
        algo = "sha1" if len(oid) == 40 else "sha256"  # a repository's object format
        if len(data) != size or hashlib.new(
                algo, b"%s %d\0" % (want.encode(), size) + data).hexdigest() != oid:
            raise ValueError(f"git object {oid} does not match its id")
        return data

    def close(self) -> None:
        proc = self.proc
        if proc.stdin is not None:
            proc.stdin.close()
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _from_git(workspace: Path, commit: str, blobs: FileBlobStore) -> Manifest:
    objects = _Objects(workspace)
    try:
        body = objects.get(commit, "commit")
        first = body.split(b"\n", 1)[0].split()
        if len(first) != 2 or first[0] != b"tree":
            raise ValueError(f"commit {commit} names no tree")
        wanted: list[tuple[str, str, int]] = []
        raw_len = 20 if len(commit) == 40 else 32
        folders = [("", first[1].decode())]
        while folders:
            prefix, oid = folders.pop()
            data = objects.get(oid, "tree")
            at = 0
            while at < len(data):
                space, nul = data.index(b" ", at), data.index(b"\0", at)
                kind = data[at:space]
                name = data[space + 1:nul].decode("utf-8", "surrogateescape")
                child = data[nul + 1:nul + 1 + raw_len].hex()
                at = nul + 1 + raw_len
                if "/" in name or name in ("", ".", ".."):
                    raise ValueError(f"tree {oid} holds the name {name!r}")
                path = prefix + name
                if kind == b"40000":
                    folders.append((path + "/", child))
                elif kind in (b"100644", b"100755", b"100664") and not _skip_file(path):
                    wanted.append((path, child, 0o755 if kind == b"100755" else 0o644))
                # symlinks (120000) and submodules (160000) are not taken
            if len(wanted) > MAX_BASELINE_FILES:
                raise _TooLarge(f"the revision holds more than {MAX_BASELINE_FILES} files; a "
                                f"baseline holds at most {MAX_BASELINE_FILES}")
        manifest: Manifest = {}
        for path, oid, mode in sorted(wanted):
            manifest[path] = (blobs.put_bytes(objects.get(oid, "blob")).sha256, mode)
        return manifest
    finally:
        objects.close()


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
