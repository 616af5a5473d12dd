"""The ``regenerates`` declaration: its checks, and the hand-off to the reproducer.

Owns what the verifier asks of ``regenerates=[{"command": …, "artifacts": [id, …]}]``
before anything runs: the shape (``host_kernel.modes.parse_regenerates``; a
mode that does not take the declaration, or an artifact saved from no
workspace path, is ``regenerates_malformed``), and that each id is an artifact
of this session (``claim_unbacked``, as for an artifact id ``output`` claims).
Then, once every other check and the test reproduction have passed,
:func:`_regenerate` hands the commands, the declared files and each artifact's
recorded row and lineage inputs to ``host_kernel.reproduce.regenerate_artifacts``,
which runs them in the judge's world and decides ``regeneration_differs``.
"""

from __future__ import annotations

from typing import Any

from .._errors import HostCallError
from ..modes import DECLARATIONS, DeclarationError, TaskMode, parse_regenerates
from ..reproduce import Claimed, Emit, RegenEntry, RegenRequest, Runs, regenerate_artifacts
from .checks import _Checks
from .submission import Submission, _norm


def _check_regenerates(sub: Submission, mode: TaskMode, c: _Checks) -> list[RegenEntry]:
    """The declared entries with their artifacts' records; [] when none or refused."""
    if sub.regenerates is None:
        return []
    takes = [m for m, d in DECLARATIONS.items() if "regenerates" in d.optional]
    if "regenerates" not in DECLARATIONS[mode.name].optional:
        c.fail("regenerates_malformed", f"regenerates is a declaration of "
                                        f"{' and '.join(takes)} (the declared files alone "
                                        f"must make the artifacts); this session is "
                                        f"{mode.name}, so leave it out")
        return []
    try:
        declared = parse_regenerates(sub.regenerates)
    except DeclarationError as exc:
        c.fail("regenerates_malformed", exc.message)
        return []
    rows = {r["artifact_id"]: r for r in c.view.artifacts}
    entries: list[RegenEntry] = []
    refused = False
    for i, entry in enumerate(declared):
        claimed: list[Claimed] = []
        for artifact_id in entry.artifacts:
            row = rows.get(artifact_id)
            if row is None:
                c.fail("claim_unbacked", f"regenerates[{i}] claims {artifact_id!r}, which is "
                                         f"not an artifact of this session; use the ids "
                                         f"host.artifacts() lists (host.save_artifact(path)"
                                         f".artifact_id)")
                refused = True
                continue
            path = _norm(row["source_path"]) if isinstance(row["source_path"], str) else None
            if path is None:
                c.fail("regenerates_malformed", f"regenerates[{i}]: artifact {artifact_id} was "
                                                f"not saved from a workspace file, so there is "
                                                f"no path a command could write it at")
                refused = True
                continue
            claimed.append(Claimed(artifact_id, path, str(row["sha256"]),
                                   c.view.artifact_inputs(row)))
        entries.append(RegenEntry(entry.command, tuple(claimed)))
    return [] if refused else entries


def _regenerate(c: _Checks, entries: list[RegenEntry], runs: Runs, emit: Emit | None,
                network: bool) -> list[dict[str, Any]]:
    """Run the declared commands in the judge's world; their findings and sections."""
    request = RegenRequest(dict(c.sources), entries, network)
    try:
        findings, sections = regenerate_artifacts(request, runs, c.view.blobs, emit)
    except (OSError, HostCallError) as exc:
        c.fail("regeneration_differs", f"the Host could not run the regenerates commands: "
                                       f"{exc}")
        return []
    for code, ok, message in findings:
        (c.ok if ok else c.fail)(code, message)
    return sections
