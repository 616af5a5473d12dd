"""Identifiers the Host mints: cell ids, tokens, session and receipt ids."""

from __future__ import annotations

import re
import secrets
import uuid

__all__ = ["CELL_ID_PATTERN", "mint_cell_id", "mint_token", "mint_uuid", "is_cell_id"]

#: nbformat 4.5's cell id pattern.
CELL_ID_PATTERN = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")


def mint_cell_id() -> str:
    """A fresh cell id: 16 URL-safe characters, valid per nbformat 4.5, that begins with a
    letter or digit (so a command line never takes it for an option): about 95.9 random
    bits."""
    while True:
        cell_id = secrets.token_urlsafe(12)
        if cell_id[0] not in "-_":
            return cell_id


def mint_token() -> str:
    """A per-generation RPC token: 256 random bits."""
    return secrets.token_urlsafe(32)


def mint_uuid() -> str:
    return str(uuid.uuid4())


def is_cell_id(value: object) -> bool:
    return isinstance(value, str) and CELL_ID_PATTERN.match(value) is not None
