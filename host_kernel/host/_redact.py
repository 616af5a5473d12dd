"""Redacting secrets: the values of secret-looking environment variables, wherever they
appear in what the Host records (receipts, outputs, submissions).

Owns :class:`Redactor` alone, so that what needs only it (the warm pool's environment
filter, which runs before the control kernel starts its kernel) does not import the
``host.bash`` machinery of host/_bash.py, which re-exports it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Redactor"]


class Redactor:
    """Replaces the values of secret-looking environment variables with ``[redacted]``."""

    PATTERNS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
    MIN_LEN = 4

    def __init__(self, extra_names: Iterable[str] = ()) -> None:
        self.extra = {n.upper() for n in extra_names}
        self._values: set[str] = set()
        self._bytes: list[bytes] = []
        #: Whether every secret reads the same inside JSON text as outside it (no quote,
        #: backslash or control character), so finding none in a value's JSON finds none
        #: in its strings.
        self._json_plain = True
        #: Names already judged (an environment is sent with every command).
        self._judged: dict[str, bool] = {}

    def is_secret_name(self, name: str) -> bool:
        upper = name.upper()
        return upper in self.extra or any(p in upper for p in self.PATTERNS)

    def learn(self, env: Mapping[str, str]) -> None:
        judged = self._judged
        if len(judged) > 4096:
            judged.clear()
        new = set()
        for k, v in env.items():
            if isinstance(v, str) and len(v) >= self.MIN_LEN:
                secret = judged.get(k)
                if secret is None:
                    secret = judged[k] = self.is_secret_name(k)
                if secret:
                    new.add(v)
        if new - self._values:
            self._values |= new
            # Longest first, so a secret that contains another is replaced whole.
            ordered = sorted(self._values, key=len, reverse=True)
            self._bytes = [v.encode("utf-8", "surrogateescape") for v in ordered]
            self._json_plain = not any(c in '"\\' or c < " " for v in ordered for c in v)

    def text(self, value: str) -> str:
        if not self._bytes:
            return value
        for secret in sorted(self._values, key=len, reverse=True):
            if secret in value:
                value = value.replace(secret, "[redacted]")
        return value

    def data(self, value: bytes) -> bytes:
        for secret in self._bytes:
            if secret in value:
                value = value.replace(secret, b"[redacted]")
        return value

    def deep(self, value: Any) -> Any:
        """Redact every string inside a JSON-like value.

        A value whose JSON text holds no secret is returned as it is, without a walk (a
        receipt or an output usually holds none)."""
        if not self._bytes:
            return value
        if self._json_plain:
            try:
                text = json.dumps(value, ensure_ascii=False)
            except (TypeError, ValueError, RecursionError):
                pass
            else:
                if not any(secret in text for secret in self._values):
                    return value
        return self._walk(value)

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self._walk(v) for v in value]
        if isinstance(value, dict):
            return {k: self._walk(v) for k, v in value.items()}
        return value
