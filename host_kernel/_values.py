"""The values that cross a boundary: observations, receipts, artifacts, verdicts.

Frozen, slotted dataclasses, each serialised one way (``to_dict`` /
``from_dict``). The kernel side rebuilds them from the Host's JSON for display;
a value rebuilt or forged in the kernel decides nothing, because the Host
verifies against its own record, never against these objects.

Each shows itself in a notebook through IPython's display protocol
(:class:`~host_kernel._displayed.Displayed`): a compact plain text (its
``repr``, what a terminal and an agent's Observation read) is here; the HTML
and Markdown cards are not: :mod:`host_kernel._display` draws them and
registers them for these types. The package hands the values out from
:mod:`host_kernel._models`, which brings both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TypeVar

from ._displayed import Displayed

__all__ = [
    "Artifact",
    "Check",
    "FileChange",
    "FileRecord",
    "Observation",
    "Receipt",
    "Verdict",
    "verdict_text",
]

Status = Literal["ok", "error", "timeout", "kernel_died", "interrupted"]
T = TypeVar("T")


def _from_dict(cls: type[T], data: dict[str, Any]) -> T:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)
class Observation(Displayed):
    """What one executed cell produced, as the Host saw it."""

    cell_id: str
    status: Status
    outputs: tuple[dict[str, Any], ...]
    execution_count: int | None
    generation: int
    text: str
    duration: float = 0.0
    notice: str | None = None

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return (f"Observation(cell_id={self.cell_id!r}, status={self.status!r}, "
                f"generation={self.generation}, execution_count={self.execution_count}, "
                f"duration={self.duration:.3f})")

    def _plain_text(self) -> str:
        return repr(self) + ("\n" + self.text if self.text else "")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outputs"] = list(self.outputs)
        return d


@dataclass(frozen=True, slots=True)
class FileRecord(Displayed):
    """A file the Host wrote for a cell."""

    path: str
    sha256: str
    size: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FileRecord:
        return _from_dict(cls, data)


@dataclass(frozen=True, slots=True)
class FileChange:
    """A workspace file a command created, modified or deleted."""

    path: str
    change: Literal["created", "modified", "deleted"]
    sha256: str | None
    size: int | None


@dataclass(frozen=True, slots=True)
class Receipt(Displayed):
    """The Host's own record of one ``host.bash`` command."""

    receipt_id: str
    cell_id: str
    generation: int
    command: str
    cwd: str
    executable: str | None
    executable_sha256: str | None
    executable_in_workspace: bool
    path_env: str
    path_differs: bool
    env_changed: tuple[str, ...]
    started: float
    ended: float
    duration: float
    exit_status: int | None
    signal: int | None
    timed_out: bool
    stdout_sha256: str
    stdout_size: int
    stderr_sha256: str
    stderr_size: int
    stdout_tail: str = ""
    stderr_tail: str = ""
    changes: tuple[FileChange, ...] = ()
    changes_truncated: bool = False
    workspace_manifest_sha256: str | None = None
    workspace_manifest_files: int = 0
    shadowed_modules: tuple[str, ...] = ()
    #: How the Host started it: ``"bash"`` (``bash -c command``) or ``"exec"`` (a plain
    #: line's program exec'd as bash would, docs/receipts.md); None in older receipts.
    via: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_status == 0 and not self.timed_out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Receipt:
        data = dict(data)
        data["env_changed"] = tuple(data.get("env_changed", ()))
        data["changes"] = tuple(FileChange(**c) for c in data.get("changes", ()))
        data["shadowed_modules"] = tuple(data.get("shadowed_modules", ()))
        return _from_dict(cls, data)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["env_changed"] = list(self.env_changed)
        d["changes"] = [asdict(c) for c in self.changes]
        d["shadowed_modules"] = list(self.shadowed_modules)
        return d

    def outcome(self) -> str:
        if self.timed_out:
            return "timed out (process group killed)"
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        return f"exit {self.exit_status}"

    def __repr__(self) -> str:
        return (f"Receipt({self.receipt_id[:8]}…, {self.command!r}, {self.outcome()}, "
                f"{self.duration:.3f}s, cell {self.cell_id})")


@dataclass(frozen=True, slots=True)
class Artifact(Displayed):
    """A file copied into the content-addressed store."""

    artifact_id: str
    filename: str
    sha256: str
    size: int
    media_type: str
    cell_id: str
    generation: int
    source_path: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Artifact:
        return _from_dict(cls, data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Check:
    """One verifier check: a stable code, whether it passed, and a sentence."""

    code: str
    ok: bool
    message: str
    advisory: bool = False


@dataclass(frozen=True, slots=True)
class Verdict(Displayed):
    """The verifier's answer to one submission."""

    submission_id: str
    accepted: bool
    mode: str
    armed: bool
    checks: tuple[Check, ...] = field(default_factory=tuple)
    #: One section per test evidence entry the Host reproduced (docs/verification.md).
    reproduction: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def explain(self) -> str:
        if self.accepted:
            head = f"Submission {self.submission_id} accepted ({self.mode}"
            head += ", armed)." if self.armed else ")."
            advice = [c for c in self.checks if not c.ok and c.advisory]
            if advice:
                head += " Advice (not blocking): " + " ".join(
                    f"[{c.code}] {c.message}" for c in advice)
            for c in self.checks:
                if c.code == "reproduced" and c.ok:
                    head += f" {c.message[0].upper()}{c.message[1:]}."
            return head
        lines = [f"Submission {self.submission_id} refused; fix each of these and submit again:"]
        lines += [f"- [{c.code}] {c.message}" for c in self.failed if not c.advisory]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return verdict_text(self)

    def __str__(self) -> str:
        return self.explain()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["checks"] = [asdict(c) for c in self.checks]
        d["reproduction"] = [dict(r) for r in self.reproduction]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        data = dict(data)
        data["checks"] = tuple(Check(**c) for c in data.get("checks", ()))
        data["reproduction"] = tuple(data.get("reproduction", ()))
        return _from_dict(cls, data)


def verdict_text(v: Verdict) -> str:
    """The compact one-line form (``repr``) of a verdict."""
    blocking = [c.code for c in v.failed if not c.advisory]
    advice = [c.code for c in v.failed if c.advisory]
    passed = sum(1 for c in v.checks if c.ok)
    text = (f"Verdict({v.submission_id}, {'accepted' if v.accepted else 'refused'}, "
            f"{v.mode}{' armed' if v.armed else ''}, {passed}/{len(v.checks)} checks passed")
    if blocking:
        text += "; failed: " + ", ".join(blocking)
    if advice:
        text += "; advice: " + ", ".join(advice)
    return text + ")"
