"""The skill catalog: reviewed recipes kept as Markdown files with front matter.

A skill is one ``.md`` file whose first lines are a small front matter block::

    ---
    name: load-tabular-data
    summary: Load a CSV or Parquet file safely: check encoding, dtypes and row counts.
    tags: [pandas, csv, parquet, data-loading]
    ---
    # the body, in Markdown

The catalog reads three collections, in this order (:data:`COLLECTIONS`):
``bundled`` (shipped in this package), ``user``
(``$XDG_CONFIG_HOME/host_kernel/skills``, by default ``~/.config/host_kernel/skills``)
and ``project`` (``<workdir>/.host_kernel/skills``). A later collection's skill
shadows an earlier one of the same name; each shadowing is listed in
:attr:`Catalog.shadowed` so it stays visible.

This module owns reading those folders, listing in pages, literal search and
fetching a body. It is pure: it starts no kernel, calls no model and writes
nothing. A file that breaks a rule is never loaded and never raises; it is
listed in :attr:`Catalog.problems` with the reason. Only the caller's own
mistakes (an unknown collection, a bad page bound, an empty query, an unknown
name) raise :class:`SkillError`.

The front matter is a deliberately small subset of YAML, parsed here (no
PyYAML): ``key: value`` lines, an inline list ``[a, b]``, or a list of
``- item`` lines under a key with no value. Blank lines and ``#`` comment lines
are skipped; keys other than ``name``, ``summary`` and ``tags`` are ignored so
that later fields do not break older readers.

The ``project`` collection lives in the workspace, which cell code can write:
a caller that puts :meth:`Catalog.catalog_lines` into a prompt should load the
catalog once, when the session starts.
"""

from __future__ import annotations

import builtins
import difflib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

__all__ = [
    "COLLECTIONS",
    "MAX_FILE_BYTES",
    "MAX_NAME_CHARS",
    "MAX_SUMMARY_CHARS",
    "STOPWORDS",
    "Catalog",
    "Hit",
    "Page",
    "Problem",
    "Shadowed",
    "Skill",
    "SkillError",
    "bundled_dir",
    "user_skills_dir",
    "words",
]

#: The standard collections, in catalog order: a later one shadows an earlier one.
COLLECTIONS: Final[tuple[str, ...]] = ("bundled", "user", "project")

#: A skill file larger than this is not read (it is reported in ``problems``).
MAX_FILE_BYTES: Final[int] = 256 * 1024
MAX_NAME_CHARS: Final[int] = 64
MAX_SUMMARY_CHARS: Final[int] = 200
MAX_TAG_CHARS: Final[int] = 64

#: Common English words that carry no meaning for search; a fixed set, so a
#: search gives the same answer everywhere.
STOPWORDS: Final[frozenset[str]] = frozenset("""
    a an and are as at be been but by can do does for from has have how i if in
    into is it its me my not of on or our so than that the their then there these
    this those to was we were what when where which while who why will with you your
""".split())

# Search weights: a query word found in the name, tags or summary counts more
# than one found only in the body, because those lines are what a reviewer
# wrote to say what the skill is for.
HEAD_WEIGHT: Final[int] = 2
BODY_WEIGHT: Final[int] = 1

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_WORD = re.compile(r"[a-z0-9]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_FENCE = "---"


class SkillError(ValueError):
    """A caller's mistake: an unknown collection or skill, a bad page bound, an empty query.

    The message says what was wrong and what would be accepted.
    """

    code = "skill_error"


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Skill:
    """One loaded skill: its front matter, where it came from, and its Markdown body."""

    name: str
    summary: str
    tags: tuple[str, ...]
    collection: str
    path: Path
    body: str = field(repr=False)

    def line(self) -> str:
        """The catalog line: ``- name: summary``."""
        return f"- {self.name}: {self.summary}"

    def to_dict(self, *, body: bool = False) -> dict[str, Any]:
        """The skill as plain values for a tool result; the body only when asked."""
        data: dict[str, Any] = {"name": self.name, "summary": self.summary,
                                "collection": self.collection, "tags": list(self.tags)}
        if body:
            data["body"] = self.body
        return data


@dataclass(frozen=True, slots=True)
class Problem:
    """A file or folder that was not loaded, and why."""

    path: Path
    reason: str
    collection: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Shadowed:
    """A skill hidden by one of the same name in a later collection."""

    name: str
    hidden: Path
    hidden_collection: str
    winner: Path
    winner_collection: str

    def __str__(self) -> str:
        return (f"{self.name}: {self.winner_collection} ({self.winner}) shadows "
                f"{self.hidden_collection} ({self.hidden})")


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a listing. ``next_offset`` is set while more remain, None on the last page."""

    items: tuple[Skill, ...]
    total: int
    offset: int
    next_offset: int | None
    collection: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain values for a tool result: each item's name, summary, collection and tags."""
        return {"collection": self.collection, "total": self.total, "offset": self.offset,
                "next_offset": self.next_offset,
                "items": [skill.to_dict() for skill in self.items]}


@dataclass(frozen=True, slots=True)
class Hit:
    """A search result: the skill, its score and the query words that matched it."""

    skill: Skill
    score: int
    matched: tuple[str, ...]

    def to_dict(self, *, body: bool = True) -> dict[str, Any]:
        data = self.skill.to_dict(body=body)
        data["score"] = self.score
        data["matched"] = list(self.matched)
        return data


# ----------------------------------------------------------------------------- words


def words(text: str) -> tuple[str, ...]:
    """The searchable words of ``text``: lowercase runs of ``[a-z0-9]``, stopwords dropped.

    ``"data-loading"`` gives ``("data", "loading")``. No stemming, no synonyms.
    """
    return tuple(w for w in _WORD.findall(text.lower()) if w not in STOPWORDS)


# ----------------------------------------------------------------------------- folders


def bundled_dir() -> Path:
    """The folder of the package's bundled collection."""
    return Path(__file__).resolve().parent / "bundled"


def user_skills_dir() -> Path:
    """``$XDG_CONFIG_HOME/host_kernel/skills``, or ``~/.config/host_kernel/skills`` when
    ``XDG_CONFIG_HOME`` is unset or not absolute."""
    value = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(value) if value and os.path.isabs(value) else Path.home() / ".config"
    return base / "host_kernel" / "skills"


# ----------------------------------------------------------------------------- parsing


class _Invalid(Exception):
    """Why one file is not a skill; becomes a Problem."""


def _open(path: Path, beneath: Path | None) -> BinaryIO:
    """Open a skill file: plainly, or (``beneath``: a folder the kernel may write) from
    that root following no symlink on the way, so a link there cannot make the Host read
    a file the kernel may not."""
    if beneath is None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise _Invalid(f"cannot be opened ({exc.strerror or exc})") from None
        return os.fdopen(fd, "rb")
    from .._errors import HostKernelError
    from ..store.blobs import open_beneath

    try:
        return open_beneath(beneath, path.relative_to(beneath).as_posix())
    except HostKernelError as exc:
        raise _Invalid(exc.message) from None
    except OSError as exc:
        raise _Invalid(f"cannot be opened ({exc.strerror or exc})") from None


def _read_text(path: Path, beneath: Path | None = None) -> str:
    """The file's text: a regular file of at most MAX_FILE_BYTES, valid UTF-8.

    Opened without blocking and checked on the descriptor, so a FIFO put where
    a skill should be is refused at once instead of waiting for a writer.
    """
    with _open(path, beneath) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _Invalid("not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise _Invalid(f"{info.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit")
        data: bytes = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise _Invalid(f"over the {MAX_FILE_BYTES}-byte limit")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Invalid(f"not UTF-8 (byte {exc.start})") from None
    return text.removeprefix("\ufeff")


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _front_matter(text: str) -> tuple[dict[str, str | list[str]], str]:
    """Split ``text`` into its front matter fields and its body."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != _FENCE:
        raise _Invalid("no front matter: the file must start with a '---' line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == _FENCE)
    except StopIteration:
        raise _Invalid("front matter is not closed by a '---' line") from None
    fields: dict[str, str | list[str]] = {}
    open_list: str | None = None  # the key whose dash list is being read
    for number, raw in enumerate(lines[1:end], start=2):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("- ") or stripped == "-":
            if open_list is None:
                raise _Invalid(f"line {number}: a '- item' line outside a list")
            item = _unquote(stripped[1:].strip())
            entries = fields[open_list]
            if isinstance(entries, list) and item:
                entries.append(item)
            continue
        key, colon, value = stripped.partition(":")
        key = key.strip()
        if not colon or not _KEY.fullmatch(key):
            raise _Invalid(f"line {number}: expected 'key: value', got {stripped[:60]!r}")
        if key in fields:
            raise _Invalid(f"line {number}: {key!r} is given twice")
        value = value.strip()
        if not value:
            fields[key] = []
            open_list = key
        elif value.startswith("["):
            if not value.endswith("]"):
                raise _Invalid(f"line {number}: an inline list must end with ']'")
            fields[key] = [_unquote(v.strip()) for v in value[1:-1].split(",") if v.strip()]
            open_list = None
        else:
            fields[key] = _unquote(value)
            open_list = None
    body = "\n".join(lines[end + 1:]).strip("\n")
    return fields, body


def _text_field(fields: dict[str, str | list[str]], key: str) -> str | None:
    value = fields.get(key)
    if value is None or value == []:
        return None
    if not isinstance(value, str):
        raise _Invalid(f"{key!r} must be one line of text, not a list")
    return value


def _parse(text: str, path: Path, collection: str) -> Skill:
    fields, body = _front_matter(text)
    name = _text_field(fields, "name")
    if name is None:
        raise _Invalid("no 'name' in the front matter")
    if len(name) > MAX_NAME_CHARS or not _NAME.fullmatch(name):
        raise _Invalid(f"bad name {name[:80]!r}: use 1 to {MAX_NAME_CHARS} lowercase letters, "
                       "digits, '-' or '_', starting with a letter or digit")
    summary = _text_field(fields, "summary")
    if summary is None or not summary.strip():
        raise _Invalid("no 'summary' in the front matter")
    summary = summary.strip()
    if len(summary) > MAX_SUMMARY_CHARS:
        raise _Invalid(f"summary is {len(summary)} characters, over {MAX_SUMMARY_CHARS}")
    if _CONTROL.search(summary):
        raise _Invalid("summary holds a control character")
    raw_tags = fields.get("tags", [])
    tag_list = [raw_tags] if isinstance(raw_tags, str) else raw_tags
    for tag in tag_list:
        if len(tag) > MAX_TAG_CHARS or _CONTROL.search(tag) or any(c in tag for c in "[],"):
            raise _Invalid(f"bad tag {tag[:80]!r}: write tags as [a, b] or as '- a' lines, "
                           f"each at most {MAX_TAG_CHARS} characters")
    if not body.strip():
        raise _Invalid("the body is empty")
    return Skill(name=name, summary=summary, tags=tuple(tag_list), collection=collection,
                 path=path, body=body + "\n")


def _load_folder(collection: str, folder: Path, beneath: Path | None = None
                 ) -> tuple[list[Skill], list[Problem]]:
    """The skills of one folder (its ``*.md`` files, not its sub-folders), sorted by name.

    ``beneath``: a root the folder must be reached from without a symlink (the
    workspace, for the project collection); its files are opened the same way.
    """
    skills: list[Skill] = []
    problems: list[Problem] = []
    try:
        if beneath is not None:
            step = beneath
            for part in folder.relative_to(beneath).parts:
                step = step / part
                if step.is_symlink():
                    return skills, [Problem(step, "a symlink: the project's skills must be "
                                                  "a real folder inside the workspace",
                                            collection)]
        if not folder.exists():
            return skills, problems
        if not folder.is_dir():
            return skills, [Problem(folder, "not a folder", collection)]
        paths = sorted(p for p in folder.iterdir() if p.name.endswith(".md"))
    except OSError as exc:
        return skills, [Problem(folder, f"cannot be listed ({exc.strerror or exc})", collection)]
    seen: dict[str, Path] = {}
    for path in paths:
        try:
            skill = _parse(_read_text(path, beneath), path, collection)
        except _Invalid as why:
            problems.append(Problem(path, str(why), collection))
            continue
        if skill.name in seen:
            problems.append(Problem(path, f"name {skill.name!r} is already used in this "
                                          f"collection by {seen[skill.name]}", collection))
            continue
        seen[skill.name] = path
        skills.append(skill)
    skills.sort(key=lambda s: s.name)
    return skills, problems


# ----------------------------------------------------------------------------- the catalog


class Catalog:
    """The skills of several collections, in catalog order: collection order, then name.

    Build one with :meth:`load` or :meth:`default`; it is not changed afterwards.
    """

    def __init__(self, collections: Sequence[str], skills: Sequence[Skill],
                 problems: Sequence[Problem] = (), shadowed: Sequence[Shadowed] = ()) -> None:
        self._collections = tuple(collections)
        self.skills: tuple[Skill, ...] = tuple(skills)
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.shadowed: tuple[Shadowed, ...] = tuple(shadowed)
        self._by_name = {skill.name: skill for skill in self.skills}
        self._index = {skill.name: i for i, skill in enumerate(self.skills)}
        self._head = {s.name: frozenset(words(" ".join((s.name, s.summary, *s.tags))))
                      for s in self.skills}
        self._body = {s.name: frozenset(words(s.body)) for s in self.skills}

    @classmethod
    def load(cls, folders: Sequence[tuple[str, Path]], *,
             beneath: Mapping[str, Path] | None = None) -> Catalog:
        """Read ``(collection, folder)`` pairs, in order; a missing folder is an empty collection.

        Collection names must be unique. A skill shadows any earlier one of the
        same name; files that break the rules go to ``problems``. ``beneath`` maps
        a collection to a root its folder lies in and must be reached from
        following no symlink (a folder the kernel may write).
        """
        beneath = beneath or {}
        names = [name for name, _ in folders]
        if len(set(names)) != len(names):
            raise SkillError(f"collection names must be unique, got {names}")
        for name in names:
            if not _NAME.fullmatch(name):
                raise SkillError(f"bad collection name {name!r}")
        winners: dict[str, Skill] = {}
        problems: builtins.list[Problem] = []
        shadowed: builtins.list[Shadowed] = []
        for collection, folder in folders:
            found, bad = _load_folder(collection, Path(folder), beneath.get(collection))
            problems += bad
            for skill in found:
                earlier = winners.get(skill.name)
                if earlier is not None:
                    shadowed.append(Shadowed(skill.name, earlier.path, earlier.collection,
                                             skill.path, skill.collection))
                winners[skill.name] = skill
        rank = {name: i for i, name in enumerate(names)}
        skills = sorted(winners.values(), key=lambda s: (rank[s.collection], s.name))
        return cls(names, skills, problems, shadowed)

    @classmethod
    def default(cls, workdir: str | os.PathLike[str], *,
                user_dir: str | os.PathLike[str] | None = None) -> Catalog:
        """The three standard collections: bundled, the user's (``user_dir`` or
        :func:`user_skills_dir`) and the project's (``<workdir>/.host_kernel/skills``)."""
        user = Path(user_dir) if user_dir is not None else user_skills_dir()
        project = Path(workdir) / ".host_kernel" / "skills"
        return cls.load((("bundled", bundled_dir()), ("user", user), ("project", project)),
                        beneath={"project": Path(workdir)})

    # -- counting

    def __len__(self) -> int:
        return len(self.skills)

    def __repr__(self) -> str:
        counts = ", ".join(f"{c} {n}" for c, n in self.collections().items())
        return f"<Catalog: {len(self)} skills ({counts}); {len(self.problems)} problems>"

    def collections(self) -> dict[str, int]:
        """Each collection, in catalog order, with how many skills it shows (after shadowing)."""
        counts = dict.fromkeys(self._collections, 0)
        for skill in self.skills:
            counts[skill.collection] += 1
        return counts

    # -- listing

    def list(self, collection: str | None = None, offset: int = 0, limit: int = 10) -> Page:
        """One page of the catalog, or of one collection, in catalog order.

        ``total`` is the exact count; ``next_offset`` is the offset of the next
        page, or None when this is the last. An offset past the end gives an
        empty page. Refuses an unknown collection, a negative offset and a
        limit below 1.
        """
        if collection is not None and collection not in self._collections:
            known = ", ".join(self._collections) or "none"
            raise SkillError(f"unknown collection {collection!r}; the collections are: {known}")
        offset = _whole(offset, "offset", minimum=0)
        limit = _whole(limit, "limit", minimum=1)
        chosen = [s for s in self.skills if collection is None or s.collection == collection]
        items = tuple(chosen[offset:offset + limit])
        following = offset + limit
        return Page(items=items, total=len(chosen), offset=offset,
                    next_offset=following if following < len(chosen) else None,
                    collection=collection)

    # -- searching

    def search(self, queries: str | Sequence[str], limit: int = 5) -> builtins.list[Hit]:
        """The skills that share words with a query, best first.

        Literal word overlap (see :func:`words`): no stemming, no synonyms, so
        "chart" does not find a skill that only says "plot". Each distinct query
        word counts once: ``HEAD_WEIGHT`` when it is in the skill's name, tags or
        summary, else ``BODY_WEIGHT`` when it is in the body. With several
        queries a skill keeps its best score over them (and that query's matched
        words). Ties keep catalog order; only scores above zero are returned.
        """
        limit = _whole(limit, "limit", minimum=1)
        texts = [queries] if isinstance(queries, str) else builtins.list(queries)
        if not all(isinstance(q, str) for q in texts):
            raise SkillError("each query must be a string")
        wanted = [tuple(dict.fromkeys(words(q))) for q in texts]
        wanted = [w for w in wanted if w]
        if not wanted:
            raise SkillError("the query holds no searchable word: give one or more words "
                             "a skill's name, summary, tags or body would use")
        best: dict[str, Hit] = {}
        for skill in self.skills:
            head, body = self._head[skill.name], self._body[skill.name]
            for query_words in wanted:
                matched = tuple(w for w in query_words if w in head or w in body)
                score = sum(HEAD_WEIGHT if w in head else BODY_WEIGHT for w in matched)
                current = best.get(skill.name)
                if score > 0 and (current is None or score > current.score):
                    best[skill.name] = Hit(skill, score, matched)
        ranked = sorted(best.values(), key=lambda h: (-h.score, self._index[h.skill.name]))
        return ranked[:limit]

    # -- fetching

    def get(self, name: str) -> Skill:
        """The skill called ``name`` (case does not matter); refuses an unknown one,
        naming close matches when there are any."""
        if not isinstance(name, str):
            raise SkillError("a skill name must be a string")
        key = name.strip().lower()
        skill = self._by_name.get(key)
        if skill is not None:
            return skill
        close = difflib.get_close_matches(key, builtins.list(self._by_name), n=3, cutoff=0.6)
        hint = (f"; did you mean {', '.join(close)}?" if close
                else "; list_skills pages through every skill")
        raise SkillError(f"no skill named {name!r}{hint}")

    # -- the prompt's view

    def catalog_lines(self, limit: int = 20) -> str:
        """The compact text for the agent's stable prompt prefix.

        A header with each collection's count, one :meth:`Skill.line` per skill
        up to ``limit``, then how many more there are. Built from the files
        alone, so the same files give the same bytes.
        """
        limit = _whole(limit, "limit", minimum=0)
        counts = ", ".join(f"{c} {n}" for c, n in self.collections().items())
        lines = [f"Skills: {len(self)} in the catalog ({counts})."]
        lines += [skill.line() for skill in self.skills[:limit]]
        more = len(self) - min(limit, len(self))
        if more:
            lines.append(f"… and {more} more: page with list_skills")
        return "\n".join(lines) + "\n"


def _whole(value: object, what: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SkillError(f"{what} must be a whole number, not {type(value).__name__}")
    if value < minimum:
        raise SkillError(f"{what} must be at least {minimum}, got {value}")
    return value
