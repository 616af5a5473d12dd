"""The verifier: decides whether a submission is backed by the Host's own record.

Owns every check of ``submit_output`` (and the agent loop's
``finalize_response``) and its stable code. It reads only the record (the
ledger's projections and the blob store) and the workspace files as they are
now; it never trusts what the kernel says about itself, never runs code, and
fails closed when the record cannot be read.

The checks, by code, are listed in :data:`CHECKS`; docs/verification.md
explains each one. In an armed ``reusable_pipeline`` or ``codebase_change``
mode every check must pass. In a detected mode the code-declaration checks are
advice: reported, never refusing. ``analysis_run`` needs no declarations.

This module is the package's surface, and holds :class:`LiveFiles` (the
workspace as it is now), whose size limit :data:`KEEP_SOURCE_BYTES` is a
setting of this module. The rest, by part:

- ``checks.py``: the table of check codes (:data:`CHECKS`, :data:`RETIRED`)
  and one verdict's tally of them;
- ``submission.py``: :class:`Submission` and the bounds it is held to;
- ``views.py``: what is read (:class:`RecordView`, :class:`RecordedFiles`);
- ``claims.py``: the files and artifacts ``output`` claims;
- ``declarations.py``: source_files, entry_points, architecture_summary;
- ``evidence.py``: test evidence, and the hand-off to host_kernel/reproduce
  (the reproduction itself lives there);
- ``regeneration.py``: the ``regenerates`` declaration, and its hand-off to
  host_kernel/reproduce (which re-runs the commands);
- ``verifier.py``: :func:`verify`, which runs them into a Verdict.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .._errors import HostCallError
from ..store.blobs import open_beneath
from .checks import CHECKS
from .checks import RETIRED as RETIRED
from .evidence import NOT_REPRODUCED as NOT_REPRODUCED
from .submission import Submission
from .verifier import unreadable_verdict as unreadable_verdict
from .verifier import verify
from .views import RecordedFiles, RecordView

__all__ = ["CHECKS", "LiveFiles", "RecordView", "RecordedFiles", "Submission", "verify"]

#: A workspace file's bytes are kept for :meth:`LiveFiles.source` when at most this big.
KEEP_SOURCE_BYTES = 8 * 1024 * 1024


class LiveFiles:
    """The workspace as it is now: used when the Host verifies a submission.

    Each file is opened once per verdict, from the workspace root with no
    symlink followed after resolving and never blocking, and only when it is a
    regular file; the bytes compiled as an entry point are the bytes hashed.
    """

    def __init__(self, root: Path, record: Path) -> None:
        self.root = Path(os.path.realpath(root))
        self.record = Path(os.path.realpath(record))
        self._read: dict[str, tuple[str, bytes | None]] = {}

    def _real(self, rel: str) -> Path | None:
        real = Path(os.path.realpath(self.root / rel))
        inside = real == self.root or self.root in real.parents
        in_record = real == self.record or self.record in real.parents
        return real if inside and not in_record else None

    def inside(self, rel: str) -> bool:
        return self._real(rel) is not None

    def is_dir(self, rel: str) -> bool:
        real = self._real(rel)
        return real is not None and real.is_dir() and not os.path.islink(self.root / rel)

    def sha256(self, rel: str) -> str | None:
        """The file's sha256; None when it does not exist or is outside the workspace.

        Raises FileProblem ``not_regular_file`` (a FIFO, device, socket or
        directory) or PathRefused ``symlink_refused`` (a folder swapped for a
        symlink while it was opened), at once.
        """
        done = self._read.get(rel)
        if done is not None:
            return done[0]
        real = self._real(rel)
        if real is None:
            return None
        hasher = hashlib.sha256()
        kept: bytearray | None = bytearray()
        try:
            with open_beneath(self.root, real.relative_to(self.root).as_posix(),
                              label=repr(rel)) as f:
                while chunk := f.read(1024 * 1024):
                    hasher.update(chunk)
                    if kept is not None and len(kept) + len(chunk) <= KEEP_SOURCE_BYTES:
                        kept += chunk
                    else:
                        kept = None
        except OSError:
            return None
        sha = hasher.hexdigest()
        self._read[rel] = (sha, None if kept is None else bytes(kept))
        return sha

    def source(self, rel: str) -> bytes | None:
        """The bytes :meth:`sha256` hashed; None when unreadable.

        A file over KEEP_SOURCE_BYTES is read again, and its bytes are given
        only if they still have the sha256 first seen.
        """
        try:
            sha = self.sha256(rel)
        except HostCallError:
            return None
        if sha is None:
            return None
        kept = self._read[rel][1]
        if kept is not None:
            return kept
        real = self._real(rel)
        try:
            if real is None:
                return None
            with open_beneath(self.root, real.relative_to(self.root).as_posix()) as f:
                data = f.read()
        except (OSError, HostCallError):
            return None
        return data if hashlib.sha256(data).hexdigest() == sha else None
