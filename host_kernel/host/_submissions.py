"""Submissions: verifying a completion against the record, and the verdicts given.

Owns ``submit`` (the checks run on a projection rebuilt from the hash-chained
events this Host vouches for, never the tables on disk), the
``submission_verdict`` event, the verdicts this Host gave in order, and the
session's reproducer (the Host re-runs test evidence in a tree and sandbox of
its own). The checks themselves are ``host_kernel.verify``'s; the reproduction
is ``host_kernel.reproduce``'s.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import RecordError
from .._ids import mint_uuid
from ._bash import Redactor
from ._generations import PRIVATE_DIRS, Generations
from ._options import HostOptions
from ._record import SessionRecord
from ._server import Emit
from ._session import Session

if TYPE_CHECKING:
    from .._models import Verdict
    from ..reproduce import Reproducer
    from ..verify import Submission

__all__ = ["Submissions"]


class Submissions:
    """The session's verifier front: what was submitted, and what the Host answered."""

    def __init__(self, workdir: Path, options: HostOptions, record: SessionRecord,
                 session: Session, generations: Generations, redactor: Redactor) -> None:
        self.workdir = workdir
        self.options = options
        self.record = record
        self.session = session
        self.generations = generations
        self.redactor = redactor
        self._reproducer: Reproducer | None = None
        #: (artifact id, progress) → Rederivation: set by the Host (``rederive=True``).
        self.rederiver: Callable[..., Any] | None = None
        self._verdicts: list[tuple[Verdict, str | None]] = []

    def reproducer(self) -> Reproducer:
        """The session's reproducer (made on first use): the Host re-runs test evidence
        in a tree and sandbox of its own, never the workspace or the kernel's environment."""
        if self._reproducer is None:
            # Imported at the first submission: the verifier and the reproduction are most
            # of a Host's modules, and a session that never submits needs neither.
            from ..reproduce import Reproducer
            from ..reproduce.world import HostOverlays

            runtime, private = self.generations.runtime_dir, self.generations.private_dir
            if runtime is None or private is None:
                raise RecordError("the session has no runtime folder for a reproduction")
            # The tests re-run are the agent's code: kept from all the kernel is kept from.
            hidden: list[str | os.PathLike[str]] = [
                self.record.record_dir, self.workdir, private / "tmp",
                *self.record.secret_files(), *self.options.hide_paths]
            # The distributions the session installed are installed again by the Host, into
            # a cache no confined process can write; a workspace that holds the cache gets
            # a private one instead (reproduce/world.py).
            overlays = HostOverlays()
            if not overlays.usable([str(self.workdir), str(private)]):
                overlays = HostOverlays(runtime / "overlays")
            self._reproducer = Reproducer(
                self.record.blobs, hidden=hidden, overlay=private / PRIVATE_DIRS["PIP_TARGET"],
                limits=self.options.reproduce_limits,
                confine=self.generations.policy is not None, base=runtime / "repro",
                overlays=overlays)
        return self._reproducer

    def submit(self, submission: Submission, *, submitting_cell: str | None = None,
               emit: Emit | None = None) -> Verdict:
        """Verify a submission against the record and record the verdict."""
        from ..verify import LiveFiles, RecordView, unreadable_verdict, verify

        record = self.record
        submission_id = mint_uuid()
        seen: dict[str, str | None] = {}
        try:
            json.dumps(submission.output)
        except (TypeError, ValueError, RecursionError) as exc:
            submission = dataclasses.replace(submission, output=None,
                                             output_error=f"{type(exc).__name__}: {exc}"[:300])
        mode = self.session.mode
        try:
            trusted = record.trusted_projection()
            try:
                view = RecordView(trusted, record.blobs, record.session_id)
                submit_seq = max(record.appended) + 1
                verdict, seen = verify(submission, mode=mode, view=view,
                                       files=LiveFiles(self.workdir, record.record_dir),
                                       submission_id=submission_id, submit_seq=submit_seq,
                                       submitting_cell=submitting_cell,
                                       runs=self._runs(submission), emit=emit,
                                       network=self.options.network)
            finally:
                trusted.close()
        except RecordError as exc:
            verdict = unreadable_verdict(submission_id, mode, exc)
        record.append("submission_verdict", {
            "submission_id": submission_id, "cell_id": submitting_cell,
            "accepted": verdict.accepted, "verdict": verdict.to_dict(),
            "submission": self.redactor.deep(submission.to_dict()), "seen": seen,
        })
        self._verdicts.append((verdict, submitting_cell))
        return verdict

    def _runs(self, submission: Submission) -> Any:
        """The reproducer, and for ``rederive=True`` the Host's re-derivation beside it."""
        runs = self.reproducer()
        if submission.rederive is not True or self.rederiver is None:
            return runs
        return _WithRederive(runs, self.rederiver)

    def verdicts(self, start: int = 0) -> list[tuple[Verdict, str | None]]:
        """Every verdict given, in order, from the ``start``-th, each with its cell."""
        return self._verdicts[start:]

    def verdicts_of(self, cell_id: str) -> tuple[Verdict, ...]:
        """The verdicts given to submissions made in ``cell_id``, in order."""
        return tuple(v for v, cell in self._verdicts if cell == cell_id)


class _WithRederive:
    """A reproducer that can also re-derive an artifact (``rederive=True``): the Host's
    own re-derivation (a fresh confined kernel on the recorded inputs), its outcome
    recorded in the verdict as a ``rederivation`` section."""

    def __init__(self, runs: Any, rederiver: Callable[..., Any]) -> None:
        self._runs = runs
        self._rederiver = rederiver

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runs, name)

    def rederive(self, artifact_id: str, sha256: str, emit: Emit | None = None) -> dict[str, Any]:
        def progress(line: str) -> None:
            if emit is not None:
                emit({"stream": "stdout", "text": f"re-deriving {artifact_id[:8]}: {line}\n"})

        result = self._rederiver(artifact_id, progress)
        return {"kind": "rederivation", "sha256": sha256, **result.record_body()}
