"""Task modes: naming them, arming them explicitly, and detecting them from prose.

This module owns the three task modes, the vocabulary that detects the two
non-default ones from a request's text, the rule that turns matches into a
:class:`TaskMode`, and which code declarations each armed mode requires or
accepts (:data:`DECLARATIONS`), with the shape of the optional
``regenerates`` declaration (:func:`parse_regenerates`). It does not own what
a mode *does*: the prompt fragments live in :mod:`host_kernel.prompts` and the
checks (what a declaration must be backed by) in the Host's verifier.

Two ways to get a mode:

* **Armed**: the caller named it (``explicit=``). Only an armed mode makes the
  verifier require code declarations and test evidence.
* **Detected**: inferred from the request. Detection needs two independent
  signals, a *target* (what is being built or changed) and an *action* (what
  is to be done to it); one signal alone is never enough. A detected mode only
  advises. When both non-default modes are detected, ``codebase_change`` wins,
  because restructuring existing code is the narrower, more specific reading.

Matching is case-insensitive and word-bounded. All vocabulary lives in
:data:`VOCABULARY`; see :func:`_phrase_regex` for the small notation its
entries are written in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = [
    "CODE_DECLARATIONS",
    "DECLARATIONS",
    "DEFAULT_MODE",
    "MAX_REGENERATES",
    "MODES",
    "VOCABULARY",
    "DeclarationError",
    "ModeDeclarations",
    "Regenerate",
    "TaskMode",
    "UnknownModeError",
    "normalise_mode_name",
    "parse_regenerates",
    "resolve_task_mode",
]

MODES: Final[tuple[str, ...]] = ("analysis_run", "reusable_pipeline", "codebase_change")
DEFAULT_MODE: Final[str] = "analysis_run"

# The whole detection vocabulary. Notation of an entry (see _phrase_regex):
#   "entry point"   words joined by a space also match when hyphenated, joined
#                   by an underscore or written as one word (entry-point,
#                   entrypoint);
#   "refactor*"     a trailing star lets the last word go on (refactoring);
#   "split … into"  an ellipsis stands for up to six words in between;
#   otherwise the entry may take a plural "s" or "es" and nothing more, so
#   "script" matches "scripts" but never "transcript" or "scripted".
# Order inside a tuple does not matter. The dict order is the tie order:
# codebase_change comes first because it wins when both modes match.
_RAW_VOCABULARY: dict[str, dict[str, tuple[str, ...]]] = {
    "codebase_change": {
        "target": (
            "codebase",
            "code base",
            "source code",
            "source tree",
            "repository",
            "repositories",
            "repo",
            "module",
            "submodule",
            "package",
            "subpackage",
            "library",
            "libraries",
        ),
        "action": (
            "refactor*",
            "restructur*",
            "modularis*",
            "modulariz*",
            "re organis*",
            "re organiz*",
            "decoupl*",
            "split … into",
            "splitting … into",
            "extract … into",
            "extracting … into",
            "move … into",
            "moving … into",
            "break … into",
            "breaking … into",
        ),
    },
    "reusable_pipeline": {
        "target": (
            "pipeline",
            "workflow",
            "cli",
            "command line",
            "entry point",
            "script",
            "etl",
        ),
        "action": (
            "re usab*",
            "re run*",
            "run … again",
            "running … again",
            "reproducib*",
            "parameteris*",
            "parameteriz*",
            "parametris*",
            "parametriz*",
            "schedul*",
            "automate",
            "automating",
            "productionis*",
            "productioniz*",
            "turn … into",
            "convert … into",
        ),
    },
}

VOCABULARY: Final[Mapping[str, Mapping[str, tuple[str, ...]]]] = MappingProxyType(
    {mode: MappingProxyType(dict(kinds)) for mode, kinds in _RAW_VOCABULARY.items()}
)

_GAP_WORDS: Final[int] = 6
# Between the words of one entry: any run of spaces, hyphens, underscores, or
# nothing at all ("re-run", "re run", "rerun").
_JOINER: Final[str] = r"[\s_-]*"
# A hyphen directly before a word makes a different word ("re-package" is not
# "package"), so the left edge refuses a preceding hyphen as well as a letter.
_LEFT_EDGE: Final[str] = r"(?<![\w-])"


def _word_regex(word: str) -> str:
    if word.endswith("*"):
        return re.escape(word[:-1]) + r"\w*"
    return re.escape(word)


def _chunk_regex(chunk: str) -> str:
    return _JOINER.join(_word_regex(word) for word in chunk.split())


def _phrase_regex(phrase: str) -> str:
    """Translate one vocabulary entry into a regular expression (no flags)."""
    chunks = [chunk.strip() for chunk in phrase.split("…")]
    if any(not chunk for chunk in chunks):
        raise ValueError(f"malformed vocabulary entry {phrase!r}")
    gap = rf"(?:\s+\S+){{0,{_GAP_WORDS}}}?\s+"
    body = gap.join(_chunk_regex(chunk) for chunk in chunks)
    if len(chunks) == 1 and not phrase.endswith("*"):
        body += r"(?:e?s)?"
    return _LEFT_EDGE + body + r"\b"


def _compile(entries: tuple[str, ...]) -> re.Pattern[str]:
    # One named group per entry, so a match can say which entry it was. Longer
    # entries come first so that "command line" is preferred to a shorter
    # overlapping entry at the same position.
    ordered = sorted(range(len(entries)), key=lambda i: len(entries[i]), reverse=True)
    alternatives = [f"(?P<e{i}>{_phrase_regex(entries[i])})" for i in ordered]
    return re.compile("|".join(alternatives), re.IGNORECASE)


_PATTERNS: Final[dict[str, dict[str, re.Pattern[str]]]] = {
    mode: {kind: _compile(entries) for kind, entries in kinds.items()}
    for mode, kinds in _RAW_VOCABULARY.items()
}


class UnknownModeError(ValueError):
    """A mode name that is not one of :data:`MODES`."""

    def __init__(self, name: object) -> None:
        self.name = name
        self.known = MODES
        super().__init__(f"unknown task mode {name!r}; known modes: {', '.join(MODES)}")


@dataclass(frozen=True, slots=True)
class TaskMode:
    """The mode of one task and how it was chosen.

    ``signals`` holds the words that led to a detection (targets then actions,
    in the order they appear in the text); it is empty for an armed mode and
    for the default.
    """

    name: str
    armed: bool
    signals: tuple[str, ...] = ()

    @property
    def detected(self) -> bool:
        """True when the mode was inferred from prose rather than selected."""
        return not self.armed and bool(self.signals)

    @property
    def enforced(self) -> bool:
        """True when the verifier must require code declarations and test evidence."""
        return self.armed and self.name != DEFAULT_MODE

    @property
    def how(self) -> str:
        """``armed``, ``detected`` or ``default``."""
        if self.armed:
            return "armed"
        return "detected" if self.signals else "default"

    def describe(self) -> str:
        """One line for logs and Observations, naming the signals when detected."""
        if self.detected:
            return f"{self.name} (detected: {', '.join(self.signals)})"
        return str(self)

    def __str__(self) -> str:
        return f"{self.name} ({self.how})"


def normalise_mode_name(name: str) -> str:
    """Return the canonical spelling of ``name`` or raise :class:`UnknownModeError`.

    Case, surrounding space, and hyphens or spaces in place of underscores are
    forgiven ("Reusable-Pipeline" is ``reusable_pipeline``); nothing else is.
    """
    if not isinstance(name, str):
        raise UnknownModeError(name)
    canonical = re.sub(r"[\s-]+", "_", name.strip().lower())
    if canonical not in MODES:
        raise UnknownModeError(name)
    return canonical


def _matches(mode: str, kind: str, text: str) -> list[tuple[int, str]]:
    """(position, signal) for each match; a gapped entry is reported as written."""
    entries = _RAW_VOCABULARY[mode][kind]
    found: list[tuple[int, str]] = []
    for match in _PATTERNS[mode][kind].finditer(text):
        group = match.lastgroup
        if group is None:  # every alternative is a named group; kept for the type
            continue
        entry = entries[int(group[1:])]
        if "…" in entry:
            signal = entry
        else:
            signal = " ".join(match.group(0).lower().split())
        found.append((match.start(), signal))
    return found


def _signals(mode: str, text: str) -> tuple[str, ...]:
    """The target and action signals of ``mode`` in ``text``; () unless both occur."""
    targets = _matches(mode, "target", text)
    actions = _matches(mode, "action", text)
    if not targets or not actions:
        return ()
    seen: dict[str, None] = {}
    for _, signal in targets + actions:
        seen.setdefault(signal, None)
    return tuple(seen)


def resolve_task_mode(text: str | None, explicit: str | None = None) -> TaskMode:
    """Decide the task mode of a request.

    With ``explicit`` the mode is armed (an unknown name raises
    :class:`UnknownModeError`; ``""`` counts as given, and is unknown). Without
    it the text is read: a mode is detected only when both a target and an
    action of that mode appear; ``codebase_change`` wins a tie; otherwise the
    result is the default ``analysis_run``, not armed, with no signals.
    """
    if explicit is not None:
        return TaskMode(normalise_mode_name(explicit), armed=True)
    if text:
        for mode in _RAW_VOCABULARY:  # dict order is the tie order
            signals = _signals(mode, text)
            if signals:
                return TaskMode(mode, armed=False, signals=signals)
    return TaskMode(DEFAULT_MODE, armed=False)


# -- what an armed mode declares


@dataclass(frozen=True, slots=True)
class ModeDeclarations:
    """The code declarations of one mode: those it requires (when armed) and those it
    accepts besides. Any other declaration given to ``submit_output`` is ignored by the
    mode, except an optional one of another mode, which is refused as misplaced."""

    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


#: The four declarations both code modes require.
CODE_DECLARATIONS: Final[tuple[str, ...]] = ("source_files", "entry_points",
                                             "architecture_summary", "test_evidence")

DECLARATIONS: Final[Mapping[str, ModeDeclarations]] = MappingProxyType({
    "analysis_run": ModeDeclarations(),
    # regenerates: commands the Host re-runs on the declared files, which must write the
    # claimed artifacts' exact bytes (docs/verification.md, "Regenerated artifacts").
    "reusable_pipeline": ModeDeclarations(CODE_DECLARATIONS, ("regenerates",)),
    "codebase_change": ModeDeclarations(CODE_DECLARATIONS, ("intended_changes",)),
})

#: Bounds of the regenerates declaration.
MAX_REGENERATES: Final[int] = 20
MAX_REGENERATE_ARTIFACTS: Final[int] = 100
MAX_REGENERATE_COMMAND: Final[int] = 4096


class DeclarationError(ValueError):
    """A declaration that is not the shape its mode takes; the message says how to fix it."""

    def __init__(self, declaration: str, message: str) -> None:
        super().__init__(message)
        self.declaration = declaration
        self.message = message


@dataclass(frozen=True, slots=True)
class Regenerate:
    """One ``regenerates`` entry: a command, and the artifacts it must write exactly."""

    command: str
    #: Artifact ids (UUIDs) of the session, in the order declared, without repeats.
    artifacts: tuple[str, ...]


_REGENERATES_SHAPE = ("regenerates must be a list of at most {n} {{'command': 'python -m "
                      "MODULE ARGS…' or 'python SCRIPT.py ARGS…', 'artifacts': [<artifact "
                      "id>, …]}} objects")


def parse_regenerates(value: object) -> tuple[Regenerate, ...]:
    """The ``regenerates`` declaration as :class:`Regenerate` entries.

    It must be a non-empty list of at most :data:`MAX_REGENERATES` dicts, each with a
    non-empty ``command`` string (at most :data:`MAX_REGENERATE_COMMAND` characters)
    and a non-empty list of at most :data:`MAX_REGENERATE_ARTIFACTS` non-empty artifact
    id strings. Raises :class:`DeclarationError` naming the first entry that is not.
    Whether the ids are the session's, and whether the commands write their bytes, is
    the verifier's to judge.
    """
    shape = _REGENERATES_SHAPE.format(n=MAX_REGENERATES)
    if not isinstance(value, list) or not value:
        got = "an empty list" if value == [] else f"a {type(value).__name__}"
        raise DeclarationError("regenerates", f"{shape}; got {got}")
    if len(value) > MAX_REGENERATES:
        raise DeclarationError("regenerates", f"{shape}; got {len(value)} entries")
    entries: list[Regenerate] = []
    for i, item in enumerate(value):
        where = f"regenerates[{i}]"
        if not isinstance(item, dict):
            raise DeclarationError("regenerates", f"{where} is a {type(item).__name__}; {shape}")
        unknown = sorted(str(k) for k in item if k not in ("command", "artifacts"))
        if unknown:
            raise DeclarationError("regenerates", f"{where} has unknown keys "
                                                  f"{', '.join(unknown[:5])}; {shape}")
        command, artifacts = item.get("command"), item.get("artifacts")
        if not isinstance(command, str) or not command.strip():
            raise DeclarationError("regenerates", f"{where}: 'command' must be a non-empty "
                                                  f"string (the command that writes the "
                                                  f"artifacts)")
        if len(command) > MAX_REGENERATE_COMMAND or "\x00" in command:
            raise DeclarationError("regenerates", f"{where}: 'command' is over "
                                                  f"{MAX_REGENERATE_COMMAND} characters or "
                                                  f"holds a NUL")
        if not isinstance(artifacts, list) or not artifacts or \
                len(artifacts) > MAX_REGENERATE_ARTIFACTS:
            raise DeclarationError("regenerates", f"{where}: 'artifacts' must be a list of 1 "
                                                  f"to {MAX_REGENERATE_ARTIFACTS} artifact "
                                                  f"ids (from host.artifacts() or "
                                                  f"host.save_artifact(...).artifact_id)")
        if not all(isinstance(a, str) and a.strip() for a in artifacts):
            raise DeclarationError("regenerates", f"{where}: each of 'artifacts' must be an "
                                                  f"artifact id string")
        ids = tuple(dict.fromkeys(a.strip() for a in artifacts))
        entries.append(Regenerate(command.strip(), ids))
    return tuple(entries)
