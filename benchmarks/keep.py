"""Benchmarks of keeping a session's input bytes in its record (docs/record.md, "Inputs kept").

``keep_inputs`` times a cell reading 1 GiB of workspace files (four of 256 MiB,
read with plain Python in 8 MiB chunks) in a Host that keeps them, against the
same cell in a Host with ``input_budget=0`` plus the disk floor of copying those
bytes: ``shutil.copyfile`` of the four files, each fsynced (the blob store
fsyncs every blob), to a folder on the record's file system.

It does not own the timing discipline (benchmarks/_harness.py), the report or
the registry (benchmarks/registry.py lists :data:`KEEP`).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any

from benchmarks._harness import MIB, Plan, Result, fmt_seconds, interleaved, scratch, timed
from host_kernel import Host

__all__ = ["KEEP"]

CODE = ("for _name in _inputs:\n"
        "    with open(_name, 'rb') as _f:\n"
        "        while _f.read(8 << 20):\n"
        "            pass")


def _write_random(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.writelines(os.urandom(4 * MIB) for _ in range(size // (4 * MIB)))


def _fresh(files: list[Path], stamp: int) -> None:
    """New bytes in every input (its first 8), so no round finds them kept already."""
    for path in files:
        with open(path, "r+b") as f:
            f.write(stamp.to_bytes(8, "little"))


def _inputs_kept(host: Host, cell_id: str) -> dict[str, Any]:
    rows = host.record.ledger.query("SELECT body FROM events WHERE kind = 'cell_finished' "
                             "ORDER BY seq DESC LIMIT 1")
    body = json.loads(rows[0]["body"])
    if body["cell_id"] != cell_id:
        raise RuntimeError("the benchmark cell's cell_finished is not the last event")
    return dict(body.get("inputs_kept") or {})


def bench_keep_inputs(plan: Plan) -> Result:
    each = MIB * plan.n(256, 16)
    n = plan.n(5, 3)
    names = [f"part{i}.bin" for i in range(4)]
    floors: list[float] = []
    floors_unsynced: list[float] = []
    unkept: list[float] = []
    with scratch() as root:
        data = root / "data"
        data.mkdir()
        files = [data / name for name in names]
        for path in files:
            _write_random(path, each)
        work = {side: root / f"ws-{side}" for side in ("kept", "unkept")}
        for ws in work.values():
            ws.mkdir()
            for path in files:
                os.link(path, ws / path.name)  # the same bytes in both workspaces
        floor = root / "floor"  # beside the records: the blob folder's file system
        floor.mkdir()
        stamps = count(1)

        def copy_floor(sync: bool) -> float:
            def run() -> None:
                for path in files:
                    target = floor / path.name
                    shutil.copyfile(path, target)
                    if sync:
                        fd = os.open(target, os.O_RDONLY)
                        try:
                            os.fsync(fd)
                        finally:
                            os.close(fd)

            took = timed(run)
            for path in files:
                (floor / path.name).unlink()
            return took

        with Host(work["kept"], record_dir=root / "rec-kept", input_budget=2**40) as kept, \
                Host(work["unkept"], record_dir=root / "rec-unkept", input_budget=0) as bare:
            setup = f"_inputs = {names!r}"
            for host in (kept, bare):
                host.execute(setup)

            def cell(host: Host, keeps: bool) -> float:
                _fresh(files, next(stamps))
                t0 = time.perf_counter()
                obs = host.execute(CODE)
                took = time.perf_counter() - t0
                if obs.status != "ok":
                    raise RuntimeError(f"benchmark cell ended {obs.status}:\n{obs.text}")
                found = _inputs_kept(host, obs.cell_id)
                held = {entry[0] for entry in found.get("kept", [])}
                if keeps and not set(names) <= held:
                    raise RuntimeError(f"the inputs were not all kept: {found}")
                if not keeps and held:
                    raise RuntimeError(f"input_budget=0 kept inputs: {found}")
                return took

            def ours() -> float:
                return cell(kept, True)

            def baseline() -> float:
                u, f = cell(bare, False), copy_floor(sync=True)
                unkept.append(u)
                floors.append(f)
                return u + f

            ours(), baseline()  # warm-up: page cache, imports, the first blob folders
            unkept.clear()
            floors.clear()
            mine, base = interleaved(n, ours, baseline)
            floors_unsynced.extend(copy_floor(sync=False) for _ in range(n))
    u, f, fu = (statistics.median(x) for x in (unkept, floors, floors_unsynced))
    k = statistics.median(mine)
    return Result(
        "keep_inputs", mine, base, 1.1,
        notes=(f"4 × {each // MIB} MiB, new bytes every round, {n} rounds each",
               (f"medians: the cell with input_budget=0 {fmt_seconds(u)}, copyfile + fsync "
                f"{fmt_seconds(f)}, copyfile alone {fmt_seconds(fu)} (kept ÷ (unkept + "
                f"copyfile alone) {k / (u + fu):.3f}×); kept ÷ unkept {k / u:.3f}×")))


#: (name, target, ours, baseline, run), listed by benchmarks/registry.py.
KEEP: list[tuple[str, float, str, str, Callable[[Plan], Result]]] = [
    ("keep_inputs", 1.1,
     ("a cell reading 1 GiB of workspace files (4 × 256 MiB, 8 MiB chunks; 4 × 16 MiB with "
      "--quick) in a Host that keeps their bytes in its blob store"),
     ("the same cell in a Host with `input_budget=0`, plus `shutil.copyfile` + fsync of the "
      "four files to the record's file system (the disk floor of keeping them)"),
     bench_keep_inputs),
]
