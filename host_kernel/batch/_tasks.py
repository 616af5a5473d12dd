"""What a batch runs: :class:`Task`, task files, and the checks made before anything starts.

Owns the task value, reading a task file (:func:`load_tasks`: JSON lines or a JSON list),
checking a batch's tasks on the driver (:func:`_checked`: notebooks that read,
inputs that exist, modes spelled canonically, names unique), and the list of its tasks a
batch keeps in its workspaces folder, which ``--resume`` reads (:func:`keep_tasks`,
:func:`kept_tasks`). It does not own running a task (:mod:`._worker`) or submitting it
(:mod:`._driver`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import TaskInvalid

__all__ = ["KINDS", "TASK_LIST", "Task", "keep_tasks", "kept_tasks", "load_tasks"]

KINDS = ("notebook", "agent")
#: The longest task name: it names folders (``NAME/attempt-N``).
NAME_LENGTH = 100
#: The batch's checked tasks, in its workspaces folder (no task's name starts with a dot).
TASK_LIST = ".host-kernel-tasks.json"


@dataclass(frozen=True, slots=True)
class Task:
    """One session to run: a notebook (``source`` its path) or an agent task (``source``
    the task's text). ``inputs`` are files and folders copied into the task's fresh
    workspace (for a notebook without inputs: the contents of the notebook's folder);
    ``mode`` arms a task mode; ``name`` names its folders and its row in the results
    (default: the notebook's stem, or ``agent-<n>``; made unique within a batch)."""

    kind: str
    source: str
    inputs: tuple[str, ...] = ()
    mode: str | None = None
    name: str = ""

    @classmethod
    def notebook(cls, path: str | os.PathLike[str], *, inputs: Iterable[str | os.PathLike[str]]
                 = (), mode: str | None = None, name: str = "") -> Task:
        return cls("notebook", os.fspath(path), tuple(os.fspath(p) for p in inputs), mode, name)

    @classmethod
    def agent(cls, text: str, *, inputs: Iterable[str | os.PathLike[str]] = (),
              mode: str | None = None, name: str = "") -> Task:
        return cls("agent", text, tuple(os.fspath(p) for p in inputs), mode, name)


_TASK_KEYS = frozenset({"kind", "notebook", "task", "inputs", "mode", "name"})


def _task_from(entry: Any, base: Path, where: str) -> Task:
    if not isinstance(entry, dict):
        raise TaskInvalid(f"{where}: a task is a JSON object, not {type(entry).__name__}")
    unknown = sorted(set(entry) - _TASK_KEYS)
    if unknown:
        raise TaskInvalid(f"{where}: unknown key {unknown[0]!r} (a task has "
                          f"{', '.join(sorted(_TASK_KEYS))})")
    if ("notebook" in entry) == ("task" in entry):
        raise TaskInvalid(f"{where}: give \"notebook\" (a path) or \"task\" (an agent's "
                          f"task), one of them")
    kind = "notebook" if "notebook" in entry else "agent"
    if entry.get("kind", kind) != kind:
        raise TaskInvalid(f"{where}: kind {entry['kind']!r} does not match the task given")
    source = entry.get("notebook", entry.get("task"))
    inputs = entry.get("inputs", [])
    if not isinstance(source, str) or not source.strip():
        raise TaskInvalid(f"{where}: {'notebook' if kind == 'notebook' else 'task'} must be "
                          f"a non-empty string")
    if not isinstance(inputs, list) or not all(isinstance(p, str) and p for p in inputs):
        raise TaskInvalid(f"{where}: inputs must be a list of paths")
    for key in ("mode", "name"):
        if entry.get(key) is not None and not isinstance(entry[key], str):
            raise TaskInvalid(f"{where}: {key} must be a string")
    if kind == "notebook":
        source = str(base / source)
    return Task(kind, source, tuple(str(base / p) for p in inputs), entry.get("mode"),
                entry.get("name") or "")


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """The tasks of a task file: a JSON list of task objects, or JSON lines (one object a
    line; blank lines and lines starting with ``#`` are skipped). An object is
    ``{"notebook": PATH}`` or ``{"task": TEXT}``, with optional ``"inputs": [PATH, …]``,
    ``"mode"``, ``"name"`` and ``"kind"``; relative paths are read from the file's folder.
    Raises TaskInvalid naming the line (or entry) at fault."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise TaskInvalid(f"cannot read {file}: {why or exc}") from None
    base = file.resolve().parent
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            entries = json.loads(text)
        except (ValueError, RecursionError) as exc:  # nested past Python's stack: not ours
            raise TaskInvalid(f"{file} is not JSON: {exc}") from None
        tasks = [_task_from(e, base, f"{file}: entry {i}") for i, e in enumerate(entries, 1)]
    else:
        tasks = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise TaskInvalid(f"{file}: line {number} is not JSON: {exc}") from None
            tasks.append(_task_from(entry, base, f"{file}: line {number}"))
    if not tasks:
        raise TaskInvalid(f"{file} holds no task")
    return tasks


def _checked(tasks: Iterable[Task]) -> list[Task]:
    """The tasks, checked, their modes spelled canonically and their names unique."""
    from ..modes import UnknownModeError, normalise_mode_name

    out: list[Task] = []
    taken: set[str] = set()
    agents = 0
    for task in tasks:
        if not isinstance(task, Task):
            raise TaskInvalid(f"not a Task: {task!r}")
        if task.kind not in KINDS:
            raise TaskInvalid(f"task kind must be notebook or agent, not {task.kind!r}")
        if not isinstance(task.source, str) or not task.source.strip():
            raise TaskInvalid(f"an empty {task.kind} task")
        if task.kind == "notebook":
            _check_notebook(Path(task.source))
        else:
            agents += 1
        names: set[str] = set()
        for p in task.inputs:
            if not os.path.lexists(p):
                raise TaskInvalid(f"no such input: {p}")
            name = Path(os.path.abspath(p)).name
            if not name or name in (".", ".."):
                raise TaskInvalid(f"input {p!r} names no file or folder to copy (give the "
                                  f"folder by its own name)")
            if name in names:
                raise TaskInvalid(f"two inputs of one task are named {name!r}; each is copied "
                                  f"into the workspace under its own name")
            names.add(name)
        if task.kind == "notebook" and Path(task.source).name in names:
            raise TaskInvalid(f"an input of {task.source} has the notebook's own name "
                              f"{Path(task.source).name!r}; the notebook is copied into the "
                              f"workspace under it")
        mode = task.mode
        if mode is not None:
            try:
                mode = normalise_mode_name(mode)
            except UnknownModeError as exc:
                raise TaskInvalid(str(exc)) from None
        stem = task.name or (Path(task.source).stem if task.kind == "notebook"
                             else f"agent-{agents}")
        # A folder's name: at most NAME_LENGTH characters (a file system takes 255).
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem)[:NAME_LENGTH].strip("._") or "task"
        name, n = stem, 1
        while name in taken:
            n += 1
            name = f"{stem}-{n}"
        taken.add(name)
        # Paths are opened on the workers: made absolute here, where they were checked.
        source = os.path.abspath(task.source) if task.kind == "notebook" else task.source
        out.append(Task(task.kind, source, tuple(os.path.abspath(p) for p in task.inputs),
                        mode, name))
    if not out:
        raise TaskInvalid("no tasks to run")
    return out


def _check_notebook(path: Path) -> None:
    if not path.is_file():
        raise TaskInvalid(f"no such file: {path}" if not path.exists() else
                          f"not a file: {path}")
    try:
        read_quietly(path)
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds; any is a refusal
        raise TaskInvalid(f"not a notebook: {path}: {str(exc).splitlines()[0][:200]}"
                          ) from None


def _nbformat() -> Any:
    import nbformat  # ships no type hints

    return nbformat


def read_quietly(path: Path) -> Any:
    """The notebook at ``path`` (nbformat 4), read without nbformat's warnings (a cell
    without an id is given one quietly, as ``exec`` reads it)."""
    from .._cli.common import quiet_nbformat

    with quiet_nbformat():
        return _nbformat().read(path, as_version=4)


def keep_tasks(root: Path, tasks: list[Task], records: str | None, ledger: str | None) -> None:
    """Write the batch's checked tasks, its records folder and its ledger's URL (without
    its password) to ``root/TASK_LIST``: what ``host-kernel batch --resume ROOT`` runs."""
    body = {"tasks": [{"kind": t.kind, "source": t.source, "inputs": list(t.inputs),
                       "mode": t.mode, "name": t.name} for t in tasks],
            "records": records, "ledger": ledger}
    tmp = root / f".{TASK_LIST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(body, indent=1), encoding="utf-8")
    os.replace(tmp, root / TASK_LIST)


def kept_tasks(root: str | os.PathLike[str]) -> tuple[list[Task], str | None, str | None]:
    """The tasks, records folder and ledger URL (no password) that the batch whose
    workspaces folder is ``root`` kept. Raises TaskInvalid when ``root`` holds none."""
    path = Path(root) / TASK_LIST
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        tasks = [Task(str(t["kind"]), str(t["source"]), tuple(str(p) for p in t["inputs"]),
                      t.get("mode"), str(t["name"])) for t in body["tasks"]]
        records, ledger = body.get("records"), body.get("ledger")
    except FileNotFoundError:
        raise TaskInvalid(f"{root} is not the workspaces folder of a batch that can be "
                          f"resumed: it holds no {TASK_LIST}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TaskInvalid(f"cannot read the batch's task list {path}: {exc}") from None
    if not tasks:
        raise TaskInvalid(f"{path} holds no task")
    return (tasks, records if isinstance(records, str) else None,
            ledger if isinstance(ledger, str) else None)
