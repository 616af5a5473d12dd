"""Skills: reviewed recipes for recurring notebook work, kept as Markdown files.

The catalog (:mod:`.catalog`) reads three collections, bundled, user and
project, and offers listing in pages, literal search and fetching a body. It is
pure: no kernel, no model. The bundled recipes live in ``bundled/``.
"""

from __future__ import annotations

from .catalog import (
    COLLECTIONS,
    Catalog,
    Hit,
    Page,
    Problem,
    Shadowed,
    Skill,
    SkillError,
    bundled_dir,
    user_skills_dir,
    words,
)

__all__ = [
    "COLLECTIONS",
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
