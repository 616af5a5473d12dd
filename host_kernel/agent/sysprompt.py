"""The system prompt as an append-only log of entries, and where its blocks come from.

Owns three things:

* the **log**: an :class:`Entry` is one positioned change to the system
  prompt, ``append`` (add a block) or ``replace`` (clear, then add a block).
  Entries travel in the agent event stream as records of kind
  :data:`EVENT_KIND`; :func:`entries_from_records` reads them back and
  :func:`effective` walks them into the prompt's blocks, so the walk over a
  prefix of the history (:func:`prompt_at`) rebuilds the prompt exactly as it
  stood at that point;
* **resume reconciliation**: :func:`config_window` is the part of the log that
  came from configuration (the last ``replace`` and everything after it);
  :func:`reconcile` compares it with freshly resolved blocks and answers the
  entries to append, none when nothing changed. :func:`initial_entries` starts
  a new session's log so that a later resume with the same files is a no-op;
* **sourcing**: :func:`resolve_blocks` reads ``SYSTEM.md`` and
  ``APPEND_SYSTEM.md`` from the three :class:`Layers` (base, user, project)
  into :class:`Block` values, and :func:`to_openai` / :func:`join_single`
  serialise the effective blocks for a provider.

It does no I/O other than reading those two files, and knows nothing of the
agent loop: appending entries to the event stream, and deciding when to
resolve and reconcile, are the loop's business. History is never rewritten
here; every function answers new values.

A record on disk::

    {"v": 1, "seq": 7, "ts": 1700000000.1, "session": "<id>", "kind": "system_prompt",
     "data": {"op": "append", "text": "...", "source": "project:APPEND_SYSTEM.md"}}

Errors::

    ValueError
     └── SystemPromptError   a SYSTEM.md / APPEND_SYSTEM.md that cannot be used
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "APPEND_FILE",
    "EVENT_KIND",
    "MAX_FILE_BYTES",
    "OPS",
    "SEED_FILE",
    "SINGLE_SEPARATOR",
    "Block",
    "Entry",
    "Layers",
    "SystemPromptError",
    "config_window",
    "effective",
    "entries_from_records",
    "initial_entries",
    "join_single",
    "prompt_at",
    "reconcile",
    "resolve_blocks",
    "to_openai",
]

#: The agent event kind whose records carry system-prompt entries.
EVENT_KIND: Final = "system_prompt"

#: The two operations an entry may carry.
OPS: Final[tuple[str, ...]] = ("append", "replace")

#: The seed file (the highest layer that has one wins).
SEED_FILE: Final = "SYSTEM.md"
#: The append file (every layer that has one contributes a block).
APPEND_FILE: Final = "APPEND_SYSTEM.md"

#: A prompt file larger than this is refused: a system prompt that big is a mistake.
MAX_FILE_BYTES: Final = 256 * 1024

#: What :func:`join_single` puts between blocks: a blank line, ``---``, a blank line.
SINGLE_SEPARATOR: Final = "\n\n---\n\n"


class SystemPromptError(ValueError):
    """A ``SYSTEM.md`` or ``APPEND_SYSTEM.md`` that exists but cannot be used."""

    code = "system_prompt_file"

    def __init__(self, path: str | os.PathLike[str], why: str) -> None:
        self.path = Path(path)
        self.why = why
        super().__init__(f"system prompt file {str(self.path)!r}: {why}")


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Entry:
    """One positioned change to the system prompt.

    ``source`` says where the text came from (``"project:APPEND_SYSTEM.md"``,
    ``"builtin"``, ``"host"``, …); ``seq`` is the event record's sequence
    number when the entry was read from a stream, ``None`` for one not yet
    recorded.
    """

    op: str
    text: str
    source: str = ""
    seq: int | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"system prompt entry op {self.op!r}; expected one of {OPS}")

    def to_data(self) -> dict[str, str]:
        """The ``data`` of the event record that carries this entry."""
        return {"op": self.op, "text": self.text, "source": self.source}


@dataclass(frozen=True, slots=True)
class Block:
    """A resolved block of the system prompt: its text and where it came from."""

    text: str
    source: str


# ----------------------------------------------------------------------------- the log


def effective(entries: Iterable[Entry]) -> tuple[str, ...]:
    """The prompt's blocks after walking ``entries`` in order.

    ``append`` adds its text; ``replace`` clears what came before, then adds
    its text.
    """
    blocks: list[str] = []
    for entry in entries:
        if entry.op == "replace":
            blocks.clear()
        blocks.append(entry.text)
    return tuple(blocks)


def _entry_from_record(record: Mapping[str, Any]) -> Entry | None:
    data = record.get("data")
    if not isinstance(data, Mapping):
        return None
    op, text, source = data.get("op"), data.get("text"), data.get("source", "")
    if op not in OPS or not isinstance(text, str) or not isinstance(source, str):
        return None
    seq = record.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool):
        seq = None
    return Entry(op, text, source, seq)


def entries_from_records(
    records: Iterable[Mapping[str, Any] | None],
    session: str | None = None,
    *,
    upto: int | None = None,
) -> list[Entry]:
    """The system-prompt entries of an agent event stream, in stream order.

    ``records`` are parsed JSON records (as :func:`.events.read_records`
    yields them). Skipped: ``None`` and non-mapping items, records of another
    kind, records whose ``data`` is not ``{"op": "append"|"replace", "text":
    str, "source": str (optional)}``, and, when ``session`` is given, records
    of other sessions. When ``upto`` is given, only records whose integer
    ``seq`` is at most ``upto`` count (a record without one cannot be placed
    and is skipped).
    """
    entries: list[Entry] = []
    for record in records:
        if not isinstance(record, Mapping) or record.get("kind") != EVENT_KIND:
            continue
        if session is not None and record.get("session") != session:
            continue
        entry = _entry_from_record(record)
        if entry is None:
            continue
        if upto is not None and (entry.seq is None or entry.seq > upto):
            continue
        entries.append(entry)
    return entries


def prompt_at(
    records: Iterable[Mapping[str, Any] | None], seq: int, session: str | None = None,
) -> tuple[str, ...]:
    """The prompt's blocks as they stood at record ``seq`` (entries at or before it)."""
    return effective(entries_from_records(records, session, upto=seq))


# ----------------------------------------------------------------------------- reconciliation


def config_window(entries: Sequence[Entry]) -> list[Entry]:
    """The last ``replace`` entry and every entry after it; all entries when none replaces."""
    for index in range(len(entries) - 1, -1, -1):
        if entries[index].op == "replace":
            return list(entries[index:])
    return list(entries)


def initial_entries(blocks: Sequence[Block]) -> list[Entry]:
    """A new session's first entries: one ``append`` per block, in order.

    Appends rather than a leading ``replace``, so the config window of a fresh
    session is all of it and reconciling the same blocks later answers ``[]``.
    """
    if not blocks:
        raise ValueError("a system prompt needs at least one block")
    return [Entry("append", block.text, block.source) for block in blocks]


def reconcile(entries: Sequence[Entry], blocks: Sequence[Block]) -> list[Entry]:
    """The entries to append so that the log's config window matches ``blocks``.

    The window's texts are compared with the blocks' texts by position and
    exact text (sources are not compared: the same bytes from another layer
    are the same prompt). All equal: ``[]``, a true no-op. Any difference (a
    changed text, a block added, removed or moved): one ``replace`` with the
    first block, then one ``append`` per later block.
    """
    if not blocks:
        raise ValueError("a system prompt needs at least one block")
    window = [entry.text for entry in config_window(entries)]
    if window == [block.text for block in blocks]:
        return []
    first, *rest = blocks
    return [Entry("replace", first.text, first.source)] + [
        Entry("append", block.text, block.source) for block in rest
    ]


# ----------------------------------------------------------------------------- serialisation


def to_openai(blocks: Sequence[str]) -> list[dict[str, str]]:
    """The blocks as leading ``system`` messages of an OpenAI-compatible chat, one each."""
    return [{"role": "system", "content": text} for text in blocks]


def join_single(blocks: Sequence[str]) -> str:
    """The blocks as one system string: trailing newlines stripped, joined by ``---``."""
    return SINGLE_SEPARATOR.join(text.rstrip("\r\n") for text in blocks)


# ----------------------------------------------------------------------------- sourcing


@dataclass(frozen=True)
class Layers:
    """The three folders a system prompt is sourced from, lowest first."""

    base: Path
    user: Path
    project: Path

    @classmethod
    def default(cls, workdir: str | os.PathLike[str]) -> Layers:
        """The conventional folders for a workspace.

        base: the package's ``host_kernel/agent/system/``; user:
        ``$XDG_CONFIG_HOME/host_kernel`` (``~/.config/host_kernel`` when the
        variable is unset, empty or not absolute, as the XDG spec asks);
        project: ``<workdir>/.host_kernel``.
        """
        xdg = os.environ.get("XDG_CONFIG_HOME", "")
        config = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
        return cls(
            base=Path(__file__).parent / "system",
            user=config / "host_kernel",
            project=Path(workdir) / ".host_kernel",
        )

    def named(self) -> tuple[tuple[str, Path], ...]:
        """``(name, folder)`` pairs, base → user → project."""
        return (("base", self.base), ("user", self.user), ("project", self.project))


def _read_project(folder: Path, filename: str) -> bytes | None:
    """The project layer's file, opened beneath the workspace following no symlink.

    The project folder lies in the workspace, which the kernel may write: a
    symlink put there would have the Host read, and send to the model, a file
    the kernel itself may not read. So ``.host_kernel`` and the file must be a
    real folder and a regular file inside the workspace; anything else is refused.
    """
    from .._errors import HostKernelError
    from ..store.blobs import open_beneath

    path = folder / filename
    try:
        with open_beneath(folder.parent, f"{folder.name}/{filename}") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except HostKernelError as error:
        if error.code == "not_regular_file":
            return None
        raise SystemPromptError(path, "is (or lies behind) a symlink; a project layer file "
                                      "must be a regular file inside the workspace") from None
    except OSError as error:
        raise SystemPromptError(path, f"cannot be read ({error.strerror or error})") from error


def _read_block(folder: Path, layer: str, filename: str) -> Block | None:
    """The block in ``folder/filename``, or ``None`` when the file counts as absent."""
    path = folder / filename
    try:
        if layer == "project":
            found = _read_project(folder, filename)
            if found is None:
                return None
            raw = found
        else:
            if not path.is_file():  # missing, a directory, a dangling symlink, a fifo
                return None
            with path.open("rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise SystemPromptError(path, f"cannot be read ({error.strerror or error})") from error
    if len(raw) > MAX_FILE_BYTES:
        raise SystemPromptError(path, f"is larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise SystemPromptError(
            path, f"is not valid UTF-8 (byte {error.start}: {error.reason})") from error
    if not text.strip():
        return None
    return Block(text.rstrip("\r\n"), f"{layer}:{filename}")


def resolve_blocks(
    layers: Layers, default_seed: str, *, host_block: str | None = None,
) -> list[Block]:
    """The current blocks of the system prompt: ``[seed, append…, host]``.

    * the seed: ``SYSTEM.md`` of the highest layer that has one (project >
      user > base), else ``Block(default_seed, "builtin")``;
    * the appends: ``APPEND_SYSTEM.md`` of every layer that has one, collected
      base → user → project and emitted in reverse (project first);
    * last, when given, ``Block(host_block, "host")``: the Host's fixed block,
      recorded like the others so a resume stays byte-identical unless it
      changed.

    Sources read ``"<layer>:<file>"`` (``"project:SYSTEM.md"``), ``"builtin"``
    or ``"host"``. ``default_seed`` and ``host_block`` are taken verbatim.

    Reading rules for the files:

    * read as UTF-8 (a leading byte-order mark is dropped); a file that is not
      valid UTF-8, cannot be read, or is larger than :data:`MAX_FILE_BYTES`
      raises :class:`SystemPromptError` naming its path;
    * every trailing newline (``"\\n"`` or ``"\\r\\n"``) is removed, so a file
      saved with or without a final newline gives the same block; nothing
      else is changed;
    * a file that is empty or whitespace-only counts as absent, and so does a
      path that is not a regular file (a directory, a dangling symlink);
    * the project layer lies in the workspace, which the kernel may write: its
      files are opened beneath the workspace following no symlink, and a
      symlink there (the folder or the file) raises :class:`SystemPromptError`.

    Only the files needed are read: a lower layer's ``SYSTEM.md`` shadowed by
    a higher one is not opened.
    """
    named = layers.named()
    seed: Block | None = None
    for layer, folder in reversed(named):
        seed = _read_block(folder, layer, SEED_FILE)
        if seed is not None:
            break
    blocks = [seed if seed is not None else Block(default_seed, "builtin")]
    appends = [_read_block(folder, layer, APPEND_FILE) for layer, folder in named]
    blocks.extend(block for block in reversed(appends) if block is not None)
    if host_block is not None:
        blocks.append(Block(host_block, "host"))
    return blocks
