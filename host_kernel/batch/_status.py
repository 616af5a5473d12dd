"""An attempt's status file, ``<workspaces>/<name>/attempt-<n>.json``: writing, reading, signing.

Owns the file's three operations: written whole (a temp file renamed over it), read (None
for a file that is missing or not a JSON object), and signed with the batch's secret (a
finished attempt's summary is reused only when its own batch signed it). The file says
``running`` (with the session id and where its record is) from the Host's start, then
holds the summary. It does not decide what a status means (:mod:`._worker`,
:mod:`._ledger`): a status names a session; the record says how it went.
"""

from __future__ import annotations

import hmac
import json
import os
from pathlib import Path
from typing import Any

__all__: list[str] = []


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _signature(secret: bytes, summary: Any) -> str:
    text = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    return hmac.digest(secret, text.encode("utf-8"), "sha256").hex()


def _signed(status: dict[str, Any], secret: bytes) -> bool:
    """Whether a finished status was written by a worker of the batch holding ``secret``."""
    mac = status.get("mac")
    return bool(secret) and isinstance(mac, str) and hmac.compare_digest(
        mac, _signature(secret, status.get("summary")))
