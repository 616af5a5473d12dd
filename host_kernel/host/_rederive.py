"""Re-derivation: running an artifact's slice again, in a world the Host builds, to prove it.

Owns :func:`rederive`: computes the slice (:mod:`host_kernel.lineage.slice`), makes
a fresh workspace that holds only the slice's recorded input bytes (each checked
against its sha256 as it is written), runs the slice's cells in a fresh confined
kernel (a new Host over that workspace, with its own record), and compares what
the slice wrote at the artifact's path with the artifact's bytes
(:mod:`host_kernel.lineage.compare`). Outcomes:

* ``reproduced``: the same sha256 (or equal within ``tolerance`` for tables).
* ``differs``: other bytes; with a short diff and, when it looks like one, a hint
  (a timestamp, unseeded randomness).
* ``failed``: a cell that ran in the session raised here, the artifact's file was not
  written, or an input's bytes were not kept.
* ``lineage_incomplete``: the slice tried to read a workspace file the lineage did not
  name (the fresh kernel's tracer saw the attempt): re-derivation measures recall.

With ``minimal``, it re-runs once per input with that input left out: an input whose
absence still reproduces the artifact is ``not_needed`` (precision).

The Host that runs the slice is built by the caller (``start``): this module does not
import the Host (it is one of its parts), so the facade and the CLI hand it one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import FileProblem, HostKernelError
from ..store.blobs import FileBlobStore, open_beneath
from ..store.ledger import Ledger

if TYPE_CHECKING:
    from ..lineage.slice import Slice, SliceInput

__all__ = ["OUTCOMES", "Rederivation", "in_own_thread", "rederive", "rederive_slice"]

OUTCOMES = ("reproduced", "differs", "failed", "lineage_incomplete")

#: Builds the Host that runs a slice: (workspace, record folder, the folders its kernel
#: must not see) → a context manager.
StartHost = Callable[[Path, Path, tuple[str, ...]], AbstractContextManager[Any]]



@dataclass
class Rederivation:
    artifact_id: str
    outcome: str
    detail: str
    cells: list[str] = field(default_factory=list)
    session_cells: int = 0
    comparison: dict[str, Any] | None = None
    #: workspace files the slice tried to read that the lineage did not name
    missing: list[str] = field(default_factory=list)
    #: with ``minimal``: inputs the artifact reproduced without (None: not asked)
    not_needed: list[str] | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def record_body(self) -> dict[str, Any]:
        """What the record keeps of it (``artifact_rederived``): the diff cut short."""
        body = self.to_dict()
        if self.comparison is not None:
            body["comparison"] = {**self.comparison,
                                  "diff": str(self.comparison.get("diff", ""))[:4000]}
        body["detail"] = self.detail[:4000]
        return body

    def line(self) -> str:
        """One line for a console."""
        head = f"{self.outcome}: artifact {self.artifact_id} ({len(self.cells)} of " \
               f"{self.session_cells} cells, {self.seconds:.1f} s)"
        extra = f"; not needed: {', '.join(self.not_needed)}" if self.not_needed else ""
        return f"{head}: {self.detail}{extra}"


def in_own_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (a re-derivation) in a thread of its own with an event loop of its own,
    closed afterwards. A Host started from a thread that is not the main one (the call
    server's, for ``submit_output(rederive=True)``) would otherwise leave jupyter_client's
    loop and its self-pipe behind, to be collected at any later moment."""
    import asyncio
    import threading

    box: dict[str, Any] = {}

    def run() -> None:
        # jupyter_client runs its coroutines on jupyter_core's loop for this thread's
        # context: made here, so that it is the one closed below.
        from jupyter_core.utils import ensure_event_loop

        loop = ensure_event_loop()
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    thread = threading.Thread(target=run, name="hk-rederive", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _place(blobs: FileBlobStore, workspace: Path, item: SliceInput) -> bool:
    """Write one input's recorded bytes at its path; False when they were not kept."""
    if not blobs.stored(item.sha256):
        return False
    dest = workspace / item.path
    if not dest.resolve().is_relative_to(workspace.resolve()):
        raise FileProblem(f"input path {item.path!r} leaves the workspace")
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with blobs.open(item.sha256) as src, open(dest, "wb") as out:
        while chunk := src.read(1 << 22):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != item.sha256:
        dest.unlink()
        raise FileProblem(f"the kept bytes of {item.path} do not hash to {item.sha256[:12]}…")
    return True


def rederive(ledger: Ledger, blobs: FileBlobStore, artifact_id: str, start: StartHost, *,
             minimal: bool = False, tolerance: float | None = None,
             timeout: float | None = 600, progress: Callable[[str], None] | None = None,
             hide: Sequence[str | Path] = ()) -> Rederivation:
    """Re-derive ``artifact_id`` of the record (``ledger`` and its ``blobs``).

    The kernel that runs the slice is kept from the first run's world: the session's
    workspace and record folder (from its ``session_started``), and ``hide`` (the
    caller's: its private folder, the record it reads). A confined kernel may read most
    of the machine; without this, a slice could copy the artifact from where the first
    run left it and be "reproduced"."""
    from ..lineage.slice import compute_slice  # the slicer's def-use pass: not the start's

    sliced = compute_slice(ledger, artifact_id)
    first = [*hide]
    for row in ledger.query("SELECT body FROM events WHERE session = ? AND kind = "
                            "'session_started'", (sliced.session,)):
        body = json.loads(row["body"])
        first += [body[k] for k in ("workdir", "record_dir") if isinstance(body.get(k), str)]
    hidden = tuple(dict.fromkeys(str(p) for p in first if Path(p).exists()))

    def start_hidden(workspace: Path, record: Path, more: tuple[str, ...] = ()) -> Any:
        return start(workspace, record, hidden + more)

    return rederive_slice(sliced, blobs, start_hidden, minimal=minimal,
                          tolerance=tolerance, timeout=timeout, progress=progress)


def rederive_slice(sliced: Slice, blobs: FileBlobStore,
                   start: StartHost, *, minimal: bool = False, tolerance: float | None = None,
                   timeout: float | None = 600, progress: Callable[[str], None] | None = None,
                   ) -> Rederivation:
    say = progress or (lambda _line: None)
    t0 = time.monotonic()
    result = Rederivation(sliced.artifact_id, "failed", "", [c.cell_id for c in sliced.cells],
                          sliced.session_cells)
    if not blobs.stored(sliced.sha256):
        result.detail = "the artifact's own bytes are not in the record's blob store"
    elif not sliced.source_path:
        result.detail = "the artifact was not saved from a workspace file"
    elif sliced.unsupported:
        result.detail = "the slice needs what cannot be re-run here: " + \
            ", ".join(sliced.unsupported)
    else:
        result = _run(sliced, blobs, start, None, tolerance, timeout, say)
        if minimal and result.outcome == "reproduced":
            result.not_needed = []
            for item in (*sliced.inputs, *sliced.context):
                say(f"re-deriving without {item.path}")
                again = _run(sliced, blobs, start, item, tolerance, timeout, say)
                if again.outcome == "reproduced":
                    result.not_needed.append(item.path)
    result.seconds = time.monotonic() - t0
    return result


def _run(sliced: Slice, blobs: FileBlobStore, start: StartHost,
         leave_out: SliceInput | None, tolerance: float | None, timeout: float | None,
         say: Callable[[str], None]) -> Rederivation:
    from ..lineage.compare import compare_bytes

    result = Rederivation(sliced.artifact_id, "failed", "", [c.cell_id for c in sliced.cells],
                          sliced.session_cells)
    with _fresh() as (workspace, record):
        absent = []
        for item in sliced.inputs:
            if item is leave_out:
                continue
            if not _place(blobs, workspace, item):
                absent.append(item.path)
        for item in sliced.context:
            if item is not leave_out and not (workspace / item.path).exists():
                _place(blobs, workspace, item)  # not kept: the slice may still not need it
        for made in sliced.makes:  # folders carry no bytes: the ones the session wrote into
            if _inside(workspace, made) is not None:
                (workspace / made).parent.mkdir(parents=True, exist_ok=True)
        if absent:
            result.detail = ("the bytes of these inputs were not kept (the session's input "
                             "budget was reached): " + ", ".join(absent))
            return result
        failure: str | None = None
        try:
            host_cm = start(workspace, record, ())
            host = host_cm.__enter__()
        except HostKernelError as exc:
            result.detail = f"the Host could not start a confined kernel to re-run it: {exc}"
            return result
        with _closing(host_cm, host):
            generation = sliced.cells[0].generation if sliced.cells else 0
            for n, cell in enumerate(sliced.cells, 1):
                if cell.generation != generation:
                    generation = cell.generation
                    host.restart("the slice's kernel restarted here")
                say(f"cell {n}/{len(sliced.cells)} ({cell.cell_id}): {cell.why}")
                obs = host.execute(cell.code, timeout=timeout)
                if obs.status != "ok" and cell.status == "ok":
                    failure = f"cell {cell.cell_id} ended {obs.status} here:\n" + \
                        _tail(obs.text)
                    break
            reads, writes = _traced(host)
        named = {i.path for i in (*sliced.inputs, *sliced.context)} | set(sliced.makes)
        missing = [p for p in dict.fromkeys(reads) if p not in named and p not in writes
                   and not _import_probe(p) and not (workspace / p).exists()]
        result.missing = list(dict.fromkeys(_inside(workspace, p) or p for p in missing))
        if result.missing and leave_out is None:
            result.outcome = "lineage_incomplete"
            result.detail = ("the slice tried to read what the lineage does not name: "
                             + ", ".join(result.missing))
            return result
        if failure is not None:
            result.detail = failure
            return result
        try:
            fh = open_beneath(workspace, str(sliced.source_path))
        except (OSError, HostKernelError) as exc:
            result.detail = f"the slice did not write {sliced.source_path} ({exc})"
            return result
        with fh:
            digest = hashlib.sha256()
            head = bytearray()
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
                if len(head) <= DIFF_LIMIT:
                    head += chunk
        if digest.hexdigest() == sliced.sha256:
            result.outcome = "reproduced"
            result.detail = f"the same sha256 ({sliced.sha256[:12]}…)"
            result.comparison = {"outcome": "reproduced", "kind": "identical",
                                 "summary": result.detail, "diff": "", "hint": None}
            return result
        # Differs by bytes: diffed when both sides are small enough to hold (a table may
        # still be equal within the tolerance); otherwise said by sizes and hashes.
        if len(head) > DIFF_LIMIT or blobs_size(blobs, sliced.sha256) > DIFF_LIMIT:
            result.outcome = "differs"
            result.detail = (f"sha256 {digest.hexdigest()[:12]}… instead of "
                             f"{sliced.sha256[:12]}… (too large to diff here)")
            result.comparison = {"outcome": "differs", "kind": "binary",
                                 "summary": result.detail, "diff": "", "hint": None}
            return result
        got = bytes(head)
        expected = blobs.read(sliced.sha256)
        comparison = compare_bytes(expected, got, name=str(sliced.source_path),
                                   code="\n".join(c.code for c in sliced.cells),
                                   tolerance=tolerance)
        result.comparison = comparison.to_dict()
        result.outcome = comparison.outcome
        result.detail = comparison.summary + (f" ({comparison.hint})" if comparison.hint else "")
        return result


#: Largest artifact (either side) a re-derivation holds in memory to diff (64 MiB).
DIFF_LIMIT = 64 << 20


def blobs_size(blobs: FileBlobStore, sha256: str) -> int:
    with blobs.open(sha256) as fh:
        fh.seek(0, 2)
        return fh.tell()


def _import_probe(path: str) -> bool:
    """An open the interpreter's import system makes on its own for a ``sys.path`` entry
    that names no file here (a path hook's name, an egg or zip it tries as an archive,
    bytecode caches): not a read of data the slice needed."""
    name = path.rsplit("/", 1)[-1]
    # ipykernel names each cell's code file by a hash (``1068734164.py``); a traceback's
    # source lookup tries it under every sys.path entry
    return ("__path_hook__" in path or name.startswith("__editable__")
            or (name.endswith(".py") and name[:-3].isdigit())
            or name.endswith((".zip", ".egg", ".whl", ".pth", ".pyc"))
            or "/__pycache__/" in f"/{path}")


def _inside(workspace: Path, path: str) -> str | None:
    """``path`` relative to the workspace, when it names a place inside it."""
    p = Path(path)
    if not p.is_absolute():
        return str(p) if ".." not in p.parts else None
    for root in (workspace, workspace.resolve()):
        if p.is_relative_to(root):
            return str(p.relative_to(root))
    return None


def _traced(host: Any) -> tuple[list[str], set[str]]:
    """Every workspace path the fresh session's cells and commands tried to read, and
    every one they wrote, as its tracer saw them."""
    reads: list[str] = []
    writes: set[str] = set()
    ledger = host.ledger
    for row in ledger.query("SELECT kind, body FROM events WHERE session = ? AND kind IN "
                            "('cell_finished', 'receipt_recorded')", (host.session_id,)):
        body = json.loads(row["body"])
        traced = body.get("traced")
        if not isinstance(traced, dict):
            continue
        # "between": opened by a process the slice left running, between two cells
        reads += [r for key in ("reads", "between") for r in traced.get(key, ())
                  if isinstance(r, str)]
        writes |= {w for w in traced.get("writes", ()) if isinstance(w, str)}
        for change in body.get("changes", ()) if row["kind"] == "receipt_recorded" else ():
            writes.add(change.get("path"))
    return reads, writes


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


class _closing(AbstractContextManager[Any]):
    """Exit an already entered context manager (the fresh Host) when the block ends."""

    def __init__(self, manager: AbstractContextManager[Any], value: Any) -> None:
        self.manager, self.value = manager, value

    def __enter__(self) -> Any:
        return self.value

    def __exit__(self, *exc: Any) -> None:  # noqa: PYI036 - handed on as received
        self.manager.__exit__(*exc)


class _fresh(AbstractContextManager[tuple[Path, Path]]):
    """A fresh workspace and a record folder beside it, removed afterwards."""

    def __enter__(self) -> tuple[Path, Path]:
        self.tmp = Path(tempfile.mkdtemp(prefix="hk-rederive-"))
        (self.tmp / "workspace").mkdir()
        return self.tmp / "workspace", self.tmp / "record"

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
