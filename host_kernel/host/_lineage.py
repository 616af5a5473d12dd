"""The Host's side of dataflow provenance: turning what it saw into artifact lineage.

Owns the session's :class:`~host_kernel.lineage.flow.FlowTracker` and feeds it,
in order: each finished cell (the files the kernel's audit hook saw it read
and write, plus the Host's own reads and writes for it and the artifacts it
loaded), and each ``host.bash`` receipt (the files the command changed, linked
to the receipt and to the workspace files its command line names). At
``save_artifact`` it answers which inputs flowed into the file, hashing each
input file as it is then (``hashed_at`` says when: at the end of the reading
cell, or at save time for reads in the saving cell itself). A traced read whose
stamp (the file's stat key at the open, host/_trace.py) is the key of a hash
the Host already holds is that hash, with no look at the file: a file is
hashed once per content, not once per read; one that changed between its open
and its hash is marked ``changed_after_read``. A read of a file that still
holds the bytes of an artifact loaded there becomes that artifact.

It does not decide trust: reads reported by the kernel are lineage evidence
only (docs/lineage.md), never acceptance evidence.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import HostCallError
from ..lineage.taint import OBSERVED, RECEIPT, TRACED, Source, file_key
from ._workspace import FileStat, HashCache, Workspace, cached_hash, cached_sha256, file_sha256

if TYPE_CHECKING:
    from ..lineage.flow import FlowTracker
    from ..lineage.statements import Prepared

__all__ = ["CellIO", "SessionLineage", "read_source"]

#: Most files named on one command line that are linked as its inputs.
MAX_COMMAND_INPUTS = 50


@dataclass
class CellIO:
    """What the Host itself did for one running cell (the kernel cannot see these)."""

    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    loads: list[tuple[str, str, str]] = field(default_factory=list)  # artifact, path, sha
    collects: list[str] = field(default_factory=list)  # handles of sub-tasks collected


def read_source(workspace: Workspace, path: str) -> str | None:
    """The text of a workspace file a cell runs (``%run script.py``), or None."""
    try:
        _, fh = workspace.open_file(path)
    except (HostCallError, OSError):
        return None
    with fh:
        data = fh.read(1 << 20)
    return data.decode("utf-8", "replace")


class SessionLineage:
    def __init__(self, workspace: Workspace, hash_cache: HashCache | None = None, *,
                 source_of: Callable[[str], str | None] | None = None) -> None:
        """``source_of``: the text of a workspace file a cell runs (``%run``), or None."""
        self.workspace = workspace
        self.source_of = source_of
        self.hash_cache = {} if hash_cache is None else hash_cache
        self._tracker: FlowTracker | None = None
        self._making = threading.Lock()
        #: path → (artifact id, sha256) of an artifact materialised there by load_artifact
        self.materialised: dict[str, tuple[str, str]] = {}
        #: (key, sha256) → when it was hashed: "cell_end" or "save"
        self.hashed_at: dict[tuple[str, str | None], str] = {}
        self.receipts: dict[str, dict[str, Any]] = {}
        #: sha256 → the first artifact of this session saved with those bytes: a file read
        #: later with the same bytes links to the artifact (and so to its own upstream).
        self.artifact_bytes: dict[str, str] = {}
        #: path → what wrote its current content in this session: {"cell": id} or
        #: {"receipt": id, "cell": id, "command": …}
        self.writers: dict[str, dict[str, Any]] = {}
        #: (path, sha256) of a session-made file as it was read → its derivation: who wrote
        #: those bytes and the direct inputs they were made from (the graph's file edges).
        self.derivations: dict[tuple[str, str], dict[str, Any]] = {}
        #: (key, sha256, cell) of traced reads hashed after their file changed: the bytes
        #: named are the file's later ones, not those its open found.
        self.changed_after_read: set[tuple[str, str, str]] = set()

    @property
    def tracker(self) -> FlowTracker:
        """The session's tracker, made at the first cell that feeds or asks it: the
        dataflow analysis (lineage.flow and its def-use pass) is a tenth of the control
        kernel's imports, and a session's start needs none of it."""
        tracker = self._tracker
        if tracker is None:
            # Made once: the main thread prepares a cell while a call's thread may record
            # a receipt, and two trackers would each keep half of the session.
            with self._making:
                if self._tracker is None:
                    from ..lineage.flow import FlowTracker

                    self._tracker = FlowTracker()
                tracker = self._tracker
        return tracker

    # -- feeding

    def artifact_saved(self, artifact_id: str, sha256: str, size: int) -> None:
        """An artifact was saved: from now on, reading its bytes from a file reads it.
        An empty artifact is not matched: every empty file has its bytes."""
        if size > 0:
            self.artifact_bytes.setdefault(sha256, artifact_id)

    def _file_source(self, rel: str, sha: str, method: str, cell_id: str) -> Source:
        """A read of ``rel`` (bytes ``sha``) as its one direct source: an artifact
        materialised there or saved with those bytes; otherwise the file. When the session
        wrote the file earlier, what its content was made from is kept as the file's own
        derivation (an edge of the graph), not added to the reader's inputs."""
        loaded = self.materialised.get(rel)
        if loaded is not None and loaded[1] == sha:
            return Source(f"artifact:{loaded[0]}", method, cell_id, sha)
        saved = self.artifact_bytes.get(sha)
        if saved is not None:
            return Source(f"artifact:{saved}", method, cell_id, sha)
        writer = self.writers.get(rel)
        if writer is not None and (rel, sha) not in self.derivations:
            upstream = self.tracker.inputs_for_file(rel)
            self.derivations[(rel, sha)] = {
                "path": rel, "sha256": sha, "written_by": dict(writer),
                "inputs": [self._item(s) for s in upstream],
                "truncated": self.tracker.is_truncated(rel)}
        return Source(file_key(rel), method, cell_id, sha)

    def _note_writes(self, cell_id: str, writes: Iterable[str],
                     renames: Sequence[tuple[str, str]], removes: Iterable[str]) -> None:
        for rel in writes:
            self.writers[rel] = {"cell": cell_id}
        for src, dst in renames:
            moved = self.writers.pop(src, None)
            if moved is not None:
                self.writers[dst] = moved
        for rel in removes:
            if rel not in writes:
                self.writers.pop(rel, None)

    def derivations_of(self, items: Iterable[dict[str, Any]],
                       limit: int = 1_000) -> list[dict[str, Any]]:
        """The derivations of the session-made files among ``items`` (lineage input
        records) and of their own inputs, transitively, each once, nearest first."""
        out: list[dict[str, Any]] = []
        seen: set[tuple[str, str]] = set()
        queue = list(items)
        while queue and len(out) < limit:
            item = queue.pop(0)
            key = (item.get("path"), item.get("sha256"))
            if not isinstance(key[0], str) or not isinstance(key[1], str) or key in seen:
                continue
            seen.add(key)  # type: ignore[arg-type]
            found = self.derivations.get(key)  # type: ignore[arg-type]
            if found is not None:
                out.append(found)
                queue += found["inputs"]
        return out

    def _sources(self, cell_id: str, reads: Sequence[str], io: CellIO, when: str,
                 method: str = OBSERVED,
                 known: Mapping[str, FileStat] | None = None) -> list[tuple[str, Source]]:
        """(path it was read at, source) for each direct read of the cell; ``method``
        says how the reads were found (traced by the Host, or reported by the kernel);
        ``known`` as for :meth:`cell_finished`."""
        out: list[tuple[str, Source]] = []
        for artifact_id, path, sha in io.loads:
            out.append((path, Source(f"artifact:{artifact_id}", OBSERVED, cell_id, sha)))
        for handle in dict.fromkeys(io.collects):
            # A collected result is a data conduit: what the cell builds from it comes
            # from the sub-task (and, through it, from the inputs the sub-task read).
            out.append((f"subtask:{handle}", Source(f"subtask:{handle}", OBSERVED, cell_id)))
        # The tracer's stamps of these very reads (none for the kernel's own report); a
        # file the Host itself read or wrote for the cell is looked at again.
        stamps = self.workspace.stamps.for_reads(reads) if method == TRACED else {}
        by_host = set(io.reads).union(io.writes) if stamps else set()
        known = known or {}
        cache, hashed_at, root = self.hash_cache, self.hashed_at, self.workspace.root
        materialised, artifact_bytes, writers = (self.materialised, self.artifact_bytes,
                                                 self.writers)
        for rel in dict.fromkeys([*reads, *io.reads]) if io.reads else dict.fromkeys(reads):
            stamp = stamps.get(rel)
            hit = cache.get(rel) if stamp is not None else None
            if hit is not None and hit[0] == stamp and rel not in by_host:
                found = hit[1]  # the open found the bytes hashed under its key
            else:
                hashed = cached_hash(root, rel, cache, known.get(rel))
                if hashed is None:
                    continue  # opened but gone, or a failed open
                key, found = hashed
                if stamp is not None and rel not in by_host and key != stamp:
                    # Hashed under another key than the open's: changed since it was read.
                    # (The key the bytes were hashed under, cached or not: a file too fresh
                    # to be cached, host/_workspace.py ``settled``, is not a change.)
                    self.changed_after_read.add((file_key(rel), found, cell_id))
            if rel in materialised or found in artifact_bytes or rel in writers:
                direct = self._file_source(rel, found, method, cell_id)
            else:
                direct = Source(file_key(rel), method, cell_id, found)  # as _file_source would
            hashed_at.setdefault((direct.key, direct.sha256), when)
            out.append((rel, direct))
        return out

    def _hash(self, rel: str) -> str | None:
        """sha256 of a workspace file that was read; None when it is gone, not a regular
        file, or a symlink leading out (hashing resolves one that stays inside)."""
        return cached_sha256(self.workspace.root, rel, self.hash_cache)

    @staticmethod
    def _access(access: Any) -> tuple[list[str], list[str], list[tuple[str, str]], list[str]]:
        if not isinstance(access, dict):
            return [], [], [], []

        def strs(key: str) -> list[str]:
            value = access.get(key)
            return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

        renames = [(a, b) for a, b in (r for r in access.get("renames", [])
                                       if isinstance(r, list) and len(r) == 2)
                   if isinstance(a, str) and isinstance(b, str)]
        return strs("reads"), strs("writes"), renames, strs("removes")

    def new_generation(self) -> None:
        if self._tracker is not None:  # a tracker made now would have nothing to forget
            self._tracker.forget_names()

    def prepare(self, code: str) -> Prepared:
        """What a cell's code alone tells lineage, worked out while the kernel runs it
        (``cell_finished`` does it again if the session's names moved on meanwhile)."""
        from ..lineage.statements import prepare

        return prepare(self.tracker, code, source_of=self.source_of)

    def cell_finished(self, cell_id: str, code: str, access: Any, io: CellIO,
                      method: str = OBSERVED, *,
                      known: Mapping[str, FileStat] | None = None,
                      prepared: Prepared | None = None) -> None:
        """Feed a finished cell. ``known``: path -> a stat key the Host itself took of the
        file since the cell ended (the input keeper's), for ``cached_hash`` to use instead
        of taking another; ``prepared``: this cell's :meth:`prepare`."""
        reads, writes, renames, removes = self._access(access)
        writes = list(dict.fromkeys([*writes, *io.writes, *(p for _, p, _ in io.loads)]))
        for artifact_id, path, sha in io.loads:
            self.materialised[path] = (artifact_id, sha)
        sources = self._sources(cell_id, reads, io, "cell_end", method, known)
        for rel in writes:
            loaded = self.materialised.get(rel)
            root = self.workspace.root
            if loaded is not None and file_sha256(root / rel, root=root) != loaded[1]:
                del self.materialised[rel]
        loaded_paths = {p for _, p, _ in io.loads}
        from ..lineage.statements import observe  # with the tracker: not on the start path

        observe(self.tracker, cell_id, code, sources,
                [w for w in writes if w not in loaded_paths], renames, removes,
                source_of=self.source_of, prepared=prepared)
        self._note_writes(cell_id, writes, renames, removes)

    def receipt(self, cell_id: str, body: dict[str, Any]) -> None:
        """A command ran: the files it created or changed come from it and its named inputs."""
        self.receipts[body["receipt_id"]] = body
        changed = {c["path"] for c in body.get("changes", ())}
        inputs = [s for s in self._command_inputs(cell_id, body, changed)]
        for change in body.get("changes", ()):
            if change["change"] == "deleted":
                self.tracker.forget_file(change["path"])
                self.materialised.pop(change["path"], None)
                self.writers.pop(change["path"], None)
            else:
                self.writers[change["path"]] = {
                    "receipt": body["receipt_id"], "cell": cell_id,
                    "command": body.get("command")}
                self.tracker.note_receipt_write(change["path"], body["receipt_id"], inputs,
                                                cell_id=cell_id)

    def _command_inputs(self, cell_id: str, body: dict[str, Any],
                        changed: set[str]) -> list[Source]:
        traced = body.get("traced")
        if isinstance(traced, dict):
            # Every workspace file the command's processes opened, as the Host saw.
            reads = [r for r in traced.get("reads", ()) if isinstance(r, str)]
            return self._file_sources(cell_id, reads, changed, TRACED)
        # Untraced: the workspace files its command line names.
        try:
            words = shlex.split(body["command"], comments=True)
        except ValueError:
            words = body["command"].split()
        cwd = Path(body["cwd"])
        named: list[str] = []
        for word in words[:500]:
            if word.startswith("-") or "=" in word and not word.startswith(("./", "/")):
                continue
            real = (cwd / word).resolve() if not word.startswith("/") else Path(word).resolve()
            if not self.workspace.contains(real) or self.workspace.in_record(real) \
                    or not real.is_file():
                continue
            named.append(self.workspace.relative(real))
        return self._file_sources(cell_id, named, changed, RECEIPT, MAX_COMMAND_INPUTS)

    def _file_sources(self, cell_id: str, rels: Iterable[str], changed: set[str],
                      method: str, limit: int | None = None) -> list[Source]:
        out: list[Source] = []
        for rel in dict.fromkeys(rels):
            sha = None if rel in changed else self._hash(rel)
            if sha is None:
                continue  # its own product, gone, or not a regular file
            direct = self._file_source(rel, sha, method, cell_id)
            self.hashed_at.setdefault(direct.identity, "command_end")
            out.append(direct)
            if limit is not None and len(out) >= limit:
                break
        return out

    # -- asking

    def inputs_at_save(self, cell_id: str, code: str, rel: str, partial_access: Any,
                       io: CellIO, method: str = OBSERVED) -> dict[str, Any]:
        """The lineage record for a file saved now, from the cell that is running."""
        reads, writes, renames, removes = self._access(partial_access)
        written_now = rel in writes or rel in io.writes
        for artifact_id, path, sha in io.loads:
            self.materialised.setdefault(path, (artifact_id, sha))
        if written_now:
            from ..lineage.statements import observe

            fork = self.tracker.fork()
            sources = self._sources(cell_id, reads, io, "save", method)
            observe(fork, cell_id, code, sources, list(dict.fromkeys([*writes, *io.writes])),
                    renames, removes, source_of=self.source_of)
            found: Sequence[Source] = fork.inputs_for_file(rel)
            truncated = fork.is_truncated(rel)
        else:
            found = self.tracker.inputs_for_file(rel)
            truncated = self.tracker.is_truncated(rel)
        loaded = self.materialised.get(rel)
        if loaded is not None and not written_now and loaded[1] == file_sha256(
                self.workspace.root / rel, root=self.workspace.root):
            # Saving a materialised artifact again: its input is that artifact.
            found = [Source(f"artifact:{loaded[0]}", OBSERVED, cell_id, loaded[1])]
        items = [self._item(s) for s in found]
        record: dict[str, Any] = {"inputs": items, "truncated": truncated}
        writer = self.writers.get(rel)
        if not written_now and writer is not None:
            # saved from a file an earlier cell or command made: that is what produced it
            record["written_by"] = dict(writer)
        derivations = self.derivations_of(items)
        if derivations:
            record["derivations"] = derivations
        return record

    def _item(self, s: Source) -> dict[str, Any]:
        kind, _, rest = s.key.partition(":")
        item: dict[str, Any] = {"key": s.key, "method": s.method, "via_cell": s.via_cell}
        if kind == "file":
            item.update(path=rest, sha256=s.sha256,
                        hashed_at=self.hashed_at.get(s.identity, "cell_end"))
            if (s.key, s.sha256, s.via_cell) in self.changed_after_read:
                item["changed_after_read"] = True
        elif kind == "artifact":
            item.update(artifact_id=rest, sha256=s.sha256)
        elif kind == "subtask":
            item.update(handle=rest)
        elif kind == "receipt":
            body = self.receipts.get(rest, {})
            item.update(receipt_id=rest, command=body.get("command"),
                        exit_status=body.get("exit_status"))
        return item


def confirm_with_llm(llm: Any, code: str, lineage: dict[str, Any]) -> dict[str, Any]:
    """Ask the dataflow-provenance prompt which candidates flowed in; it may only narrow.

    Kept inputs are marked ``llm-confirmed``; names that are not candidates are
    discarded and recorded; an unusable answer or a failed call leaves the
    candidates as they were and says why.
    """
    from ..prompts import PromptAnswerError, render, restrict_to_candidates

    candidates = [item["key"] for item in lineage["inputs"]]
    try:
        answer = render("dataflow_provenance", code, llm, candidates=candidates)
        kept, discarded = restrict_to_candidates(answer, candidates)
    except PromptAnswerError as exc:
        return lineage | {"llm": {"error": f"unusable answer: {exc}"}}
    except Exception as exc:  # noqa: BLE001 - the LLM is optional; lineage stands without it
        return lineage | {"llm": {"error": f"{type(exc).__name__}: {exc}"}}
    kept_set = set(kept)
    inputs = [dict(item, method="llm-confirmed") for item in lineage["inputs"]
              if item["key"] in kept_set]
    dropped = [item["key"] for item in lineage["inputs"] if item["key"] not in kept_set]
    return lineage | {"inputs": inputs, "llm": {"kept": kept, "dropped": dropped,
                                                  "discarded_non_candidates": discarded}}
