"""Claims: the files and artifacts ``output`` names, and whether the record backs them.

Owns finding claims in ``output`` (claim-like keys, path-like strings,
artifact ids) and the ``claim_unbacked``, ``claim_missing`` and
``artifact_altered`` checks. It does not check the declared source files
(declarations.py) or the test evidence (evidence.py).
"""

from __future__ import annotations

import os
import re
from typing import Any

from .checks import _Checks
from .submission import MAX_ENTRIES, _norm

#: Keys of ``output`` whose values name files or artifacts the submission claims.
CLAIM_KEY = re.compile(
    r"^(artifacts?|artifact_ids?|files?|figures?|plots?|output_paths?|outputs?_files?|"
    r"saved_to|saved_files?|tables?|models?_path|report_path|paths?)$",
    re.IGNORECASE,
)
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")

#: File name endings that make a bare string in ``output`` a claim that a file exists.
FILE_SUFFIXES = frozenset("""
csv tsv json jsonl ndjson parquet feather arrow orc avro h5 hdf5 hdf nc zarr npy npz pkl pickle
joblib pt pth ckpt safetensors onnx txt md rst log yaml yml toml ini cfg xml html htm pdf png jpg
jpeg gif svg webp tif tiff bmp eps ps py ipynb r sql sqlite sqlite3 db duckdb xlsx xls ods docx
pptx zip gz tgz tar bz2 xz zst mp4 mov wav mp3 flac sh js ts css dot mmd geojson shp tex bib
""".split())  # noqa: SIM905 (a block of words reads as the list it is)
_SUFFIX = re.compile(r"\.([A-Za-z][A-Za-z0-9]{0,9})$")


def _pathlike(value: str) -> bool:
    """A whole string that names a file: it ends like a file name, or starts like a path."""
    if not 1 < len(value) <= 1024 or any(ch.isspace() for ch in value) or "://" in value:
        return False
    if value.startswith(("/", "./", "../", "~/")):
        return True
    m = _SUFFIX.search(value)
    return m is not None and m.group(1).lower() in FILE_SUFFIXES


def _claims(value: Any, under_claim: bool = False, found: list[str] | None = None) -> list[str]:
    """Strings in ``output`` that name files or artifacts, at any depth under any key.

    Under a claim-like key (``artifacts``, ``files``, ``figures``…) every string
    is a claim (in nested objects, the ``path``/``file``/``id`` values); anywhere
    else a string is a claim when it looks like a path or a file name, or is a UUID.
    """
    found = [] if found is None else found
    if isinstance(value, dict):
        for k, v in value.items():
            claim = under_claim or bool(CLAIM_KEY.match(str(k)))
            if under_claim and isinstance(v, str) and k not in ("path", "artifact_id", "file",
                                                               "filename", "id"):
                _claims(v, False, found)
                continue
            _claims(v, claim, found)
    elif isinstance(value, list):
        for v in value:
            _claims(v, under_claim, found)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        if under_claim or _pathlike(text) or UUID.match(text):
            found.append(text)
    return found


def _check_claims(out: dict[str, Any], c: _Checks) -> None:
    view = c.view
    claims = _claims(out)
    by_id = {r["artifact_id"]: r for r in view.artifacts}
    by_name: dict[str, Any] = {}
    for r in view.artifacts:
        by_name[r["filename"]] = r
        if r["source_path"]:
            by_name[r["source_path"]] = r
    problems = 0
    for claim in claims[:MAX_ENTRIES]:
        row = by_id.get(claim) or by_name.get(claim) or by_name.get(_norm(claim) or "")
        if row is not None:
            if not view.blob_ok(row["sha256"]):
                problems += 1
                c.fail("artifact_altered", f"artifact {row['artifact_id']} ({row['filename']})"
                                           f" no longer matches its sha256 in the store; save "
                                           f"it again with host.save_artifact")
            continue
        rel = _norm(claim)
        if rel is None and view.workdir and claim.startswith(view.workdir.rstrip("/") + "/"):
            rel = _norm(claim[len(view.workdir.rstrip("/")) + 1:])
        problems += not _check_path_claim(claim, rel, c)
    if not problems:
        c.ok("claim_unbacked", f"{len(claims)} claimed file(s)/artifact(s) backed")


def _unbacked_name(claim: str, c: _Checks, hint: str = "") -> None:
    """A claim that names nothing in the workspace: an unknown artifact id, or a missing path."""
    if UUID.match(claim):
        c.fail("claim_unbacked", f"{claim} is not an artifact of this session; "
                                 f"host.artifacts() lists the real ids")
    else:
        c.fail("claim_missing", f"{claim!r} does not exist in the workspace; claim only files "
                                f"that exist{hint}")


def _check_path_claim(claim: str, rel: str | None, c: _Checks) -> bool:
    """A claimed path must exist and hold bytes this session produced; True when it does."""
    view = c.view
    if rel is None:
        # Absolute, or leading out with "..": it may exist, but not in this workspace.
        there = claim if claim.startswith("/") else os.path.join(view.workdir or "/", claim)
        if view.workdir and os.path.lexists(there) and not UUID.match(claim):
            c.fail("claim_unbacked", f"{claim!r} is outside the workspace, where this session "
                                     f"produces nothing; save it into the workspace and claim "
                                     f"that")
        else:
            _unbacked_name(claim, c)
        return False
    current = c.files.sha256(rel)
    if current is None and c.files.is_dir(rel):
        if any(p.startswith(rel.rstrip("/") + "/") and c.files.sha256(p) == sha
               for p, sha in view.written.items()):
            return True
        c.fail("claim_unbacked", f"folder {claim!r} holds no file this session produced")
        return False
    if current is None:
        _unbacked_name(claim, c, " (or save it as an artifact and claim its id)")
        return False
    written = view.written.get(rel)
    if written == current:
        return True
    if written is not None:
        c.fail("claim_unbacked", f"{claim!r} changed since this session wrote it; save it "
                                 f"with host.save_artifact after its last change")
    else:
        c.fail("claim_unbacked", f"{claim!r} was not produced by this session (not written "
                                 f"through host, and no host.bash command changed its bytes); "
                                 f"save it with host.save_artifact({claim!r}) and claim that")
    return False
