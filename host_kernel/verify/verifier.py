"""The verifier's entry point: runs the checks a mode asks for and gives the Verdict.

Owns :func:`verify` (the checks of every mode, then the code declarations,
enforced or as advice, then the reproduction), the checks every mode runs on
``output``, ``completion_bullets`` and ``task_status``, and the fail-closed
verdict when the record cannot be read. The checks themselves live in
claims.py, declarations.py, evidence.py and regeneration.py.
"""

from __future__ import annotations

import json
from typing import Any

from .._models import Check, Verdict
from ..modes import CODE_DECLARATIONS, TaskMode
from ..reproduce import Emit, Runs
from ..schema import json_depth
from .checks import _Checks
from .claims import _check_claims
from .declarations import _check_declarations
from .evidence import NOT_REPRODUCED, _reproduce
from .rederivation import check_rederive
from .regeneration import _check_regenerates, _regenerate
from .submission import MAX_OUTPUT_BYTES, MAX_OUTPUT_DEPTH, STATUSES, Submission
from .views import RecordView, _Recording


def verify(sub: Submission, *, mode: TaskMode, view: RecordView, files: Any,
           submission_id: str, submit_seq: int, submitting_cell: str | None,
           runs: Runs | None = None, emit: Emit | None = None, network: bool = False,
           ) -> tuple[Verdict, dict[str, str | None]]:
    """Run every check; returns the Verdict and the source hashes it saw (for audit).

    In an enforced mode whose other checks pass, ``runs`` reproduces each test
    evidence entry (a live :class:`~host_kernel.reproduce.Reproducer`, or the
    record's own runs when ``audit`` re-verifies); without it the submission
    cannot be accepted (``reproduction_error``). Once those pass, it re-runs each
    ``regenerates`` command (``regeneration_differs``).
    """
    seen: dict[str, str | None] = {}
    files = _Recording(files, seen)
    checks = _Checks(view, files, submit_seq, submitting_cell)
    _check_every_mode(sub, checks)
    declared = any(getattr(sub, n) is not None for n in (*CODE_DECLARATIONS, "regenerates"))
    sections: list[dict[str, Any]] = []
    if mode.enforced:
        _check_declarations(sub, checks)
        regenerates = _check_regenerates(sub, mode, checks)
        if all(c.ok for c in checks.items):
            sections = _reproduce(checks, mode, runs, emit, network)
        # The claimed artifacts are regenerated once the declared tests have passed.
        if regenerates and runs is not None and runs is not NOT_REPRODUCED and \
                all(c.ok for c in checks.items):
            sections += _regenerate(checks, regenerates, runs, emit, network)
    elif (mode.detected and mode.name != "analysis_run") or declared:
        advice = _Checks(view, files, submit_seq, submitting_cell, advisory=True)
        _check_declarations(sub, advice)
        _check_regenerates(sub, mode, advice)
        checks.items.extend(advice.items)
    if sub.rederive is not None and all(c.ok for c in checks.items):
        sections += check_rederive(sub, checks, runs, emit)
    accepted = all(c.ok or c.advisory for c in checks.items)
    return Verdict(submission_id, accepted, mode.name, mode.armed, tuple(checks.items),
                   tuple(sections)), seen


def _check_every_mode(sub: Submission, c: _Checks) -> None:
    out = sub.output
    if sub.output_error is not None or not isinstance(out, dict):
        what = sub.output_error or f"it is a {type(out).__name__}"
        c.fail("output_not_json", f"output must be a JSON-serialisable dict ({what}); pass a "
                                  f"dict of plain values")
    else:
        text = json.dumps(out)
        if len(text.encode("utf-8")) > MAX_OUTPUT_BYTES or json_depth(out, MAX_OUTPUT_DEPTH) > \
                MAX_OUTPUT_DEPTH:
            c.fail("output_too_large", f"output is over {MAX_OUTPUT_BYTES} bytes or "
                                       f"{MAX_OUTPUT_DEPTH} levels deep; save large results as "
                                       f"artifacts and name them in output")
        else:
            c.ok("output_not_json")
            if sub.output_schema is not None:
                _check_schema(out, sub.output_schema, c)
            _check_claims(out, c)
    bullets = sub.completion_bullets
    if (not isinstance(bullets, list) or not 1 <= len(bullets) <= 4
            or not all(isinstance(b, str) and b.strip() for b in bullets)):
        c.fail("completion_bullets", "completion_bullets must be a list of 1 to 4 non-empty "
                                     "strings, each saying what was done")
    else:
        c.ok("completion_bullets")
    if sub.task_status is not None and sub.task_status not in STATUSES:
        c.fail("task_status", f"task_status {sub.task_status!r} is not one of "
                              f"{', '.join(STATUSES)}")
    elif sub.task_status is not None:
        c.ok("task_status")


def _check_schema(out: Any, schema: Any, c: _Checks) -> None:
    """``output`` against ``output_schema``, bounded (host_kernel/schema.py)."""
    from ..schema import check_output_schema

    failure = check_output_schema(out, schema)
    if failure is None:
        c.ok("output_schema")
    else:
        c.fail(*failure)


def unreadable_verdict(submission_id: str, mode: TaskMode, error: Exception) -> Verdict:
    """Fail closed: the record could not be read, so nothing can be shown to back the claim."""
    return Verdict(submission_id, False, mode.name, mode.armed, (
        Check("record_unreadable", False, f"the Host could not read its record ({error}); "
                                          f"nothing can be accepted until it can"),))
