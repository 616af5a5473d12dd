"""Lineage's work on a cell's code, done while the kernel runs it (``statements.prepare``).

The Host prepares a cell right after sending it and feeds the result to ``observe`` at the
cell's end. A prepared cell is used only if it still holds: the session's names are those it
was prepared on, and no ``%run`` script was read (the cell may change the script).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from host_kernel import Host
from host_kernel.lineage import statements
from host_kernel.lineage.defuse import CellNames
from host_kernel.lineage.flow import FlowTracker, Source
from host_kernel.lineage.statements import observe, prepare


def sources(cell_id: str, reads: list[str]) -> list[tuple[str, Source]]:
    return [(p, Source(f"file:{p}", "observed", cell_id)) for p in reads]


def names_of(prepared: statements.Prepared) -> CellNames:
    assert prepared.names is not None
    return prepared.names


def inputs(tracker: FlowTracker, path: str) -> list[str]:
    return sorted(s.key.removeprefix("file:") for s in tracker.inputs_for_file(path))


CELLS = [
    ("c1", "import pandas as pd\nimport os\nroot = 'data'", [], []),
    ("c2", ("df = pd.read_csv(os.path.join(root, 'a.csv'))\n"
            "junk = open('data/b.csv').read()\nprint(junk)"),
     ["data/a.csv", "data/b.csv"], []),
    ("c3", ("for name in ['x', 'y']:\n    df.to_csv(f'out/{name}.csv')\n"
            "open('o.txt', 'w').write(junk)"),
     [], ["out/x.csv", "out/y.csv", "o.txt"]),
]


def test_a_prepared_cell_gives_what_observing_it_alone_gives() -> None:
    alone, early = FlowTracker(), FlowTracker()
    for cell_id, code, reads, writes in CELLS:
        observe(alone, cell_id, code, sources(cell_id, reads), writes, [], [])
        ready = prepare(early, code)
        observe(early, cell_id, code, sources(cell_id, reads), writes, [], [], prepared=ready)
    for path in ("out/x.csv", "out/y.csv", "o.txt"):
        assert inputs(early, path) == inputs(alone, path)
    assert inputs(early, "out/x.csv") == ["data/a.csv"]
    assert inputs(early, "o.txt") == ["data/b.csv"]
    assert early.path_state == alone.path_state
    assert early.aliases() == alone.aliases() == {"pd": "pandas", "os": "os"}


def test_preparing_changes_nothing_in_the_tracker() -> None:
    tracker = FlowTracker()
    observe(tracker, "c1", "import numpy as np\np = 'a.csv'", [], [], [], [])
    state, aliases = tracker.path_state, tracker.aliases()
    prepare(tracker, "import pandas as pd\np = 'b.csv'\ndel np")
    assert tracker.path_state is state
    assert tracker.aliases() == aliases == {"np": "numpy"}


def test_a_cell_prepared_before_the_names_moved_on_is_worked_out_again() -> None:
    first = "p = 'data/a.csv'"
    second = "x = open(p).read()"
    fresh = FlowTracker()
    observe(fresh, "c1", first, [], [], [], [])
    observe(fresh, "c2", second, sources("c2", ["data/a.csv"]), [], [], [])

    tracker = FlowTracker()
    stale = prepare(tracker, second)  # prepared on names before c1
    observe(tracker, "c1", first, [], [], [], [])
    assert stale.carried != fresh.path_state  # using it would lose what c1 bound
    observe(tracker, "c2", second, sources("c2", ["data/a.csv"]), [], [], [], prepared=stale)
    assert tracker.path_state == fresh.path_state


def test_a_cell_prepared_before_an_import_is_worked_out_again() -> None:
    second = "r.shuffle(xs, open('s.txt').read())"  # changes xs only if r is random
    fresh = FlowTracker()
    observe(fresh, "c1", "import random as r", [], [], [], [])
    assert "xs" in names_of(prepare(fresh, second)).mutated

    tracker = FlowTracker()
    stale = prepare(tracker, second)  # prepared before the import
    assert "xs" not in names_of(stale).mutated
    observe(tracker, "c1", "import random as r", [], [], [], [])
    observe(tracker, "c2", second, sources("c2", ["s.txt"]), [], [], [], prepared=stale)
    assert tracker.aliases() == {"r": "random"}
    assert [s.key for s in tracker.names_taint("xs")] == ["file:s.txt"]


def test_a_run_script_is_read_at_the_cells_end_not_when_it_was_sent() -> None:
    # The cell may rewrite the script before %run runs it: the text at its end counts.
    before = "import pandas as pd\ndf = pd.read_csv('data/a.csv')\njunk = open('data/b.csv').read()\n"
    after = "import pandas as pd\ndf = pd.read_csv('data/b.csv')\njunk = open('data/a.csv').read()\n"
    scripts = {"make.py": before}
    tracker = FlowTracker()
    ready = prepare(tracker, "%run make.py", source_of=scripts.get)
    assert ready.read_scripts
    scripts["make.py"] = after
    observe(tracker, "c1", "%run make.py", sources("c1", ["make.py", "data/a.csv", "data/b.csv"]),
            [], [], [], source_of=scripts.get, prepared=ready)
    observe(tracker, "c2", "df.to_csv('o.csv')", [], ["o.csv"], [], [])
    assert inputs(tracker, "o.csv") == ["data/b.csv", "make.py"]


def test_the_host_works_out_each_cells_pieces_once(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The Host prepares the cell while the kernel runs it and uses that at the end: one
    cut per cell, and the lineage it records is the cell's."""
    (tmp_path / "a.csv").write_text("1\n")
    (tmp_path / "b.csv").write_text("2\n")
    calls: list[tuple[str, bool]] = []  # (code, while the cell ran)
    cut = statements._pieces
    host = Host(tmp_path)

    def counting(code: str, *args: object) -> object:
        calls.append((code, host.cells.running is not None))
        return cut(code, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(statements, "_pieces", counting)
    code = ("a = open('a.csv').read()\nb = open('b.csv').read()\n"
            "open('out.txt', 'w').write(a)\n")
    with host:
        assert host.execute("p = 1").status == "ok"
        calls.clear()
        assert host.execute(code).status == "ok"
        assert calls == [(code, True)]
        obs = host.execute("host.save_artifact('out.txt')")
        assert obs.status == "ok", obs.text
        assert host.ledger is not None
        row = host.ledger.query("SELECT lineage FROM artifacts WHERE session = ?",
                                (host.session_id,))[0]
    assert '"a.csv"' in row["lineage"] and '"b.csv"' not in row["lineage"]


def test_the_relay_host_works_out_a_cell_once_while_it_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay prepares a cell once it has forwarded it (``prepare_cell``); recording
    the cell's end uses that, and the lineage recorded is the cell's."""
    from host_kernel.host._relay_support import RelayHost

    work = tmp_path / "ws"
    work.mkdir()
    (work / "a.csv").write_text("1\n")
    calls: list[str] = []
    cut = statements._pieces

    def counting(code: str, *args: object) -> object:
        calls.append(code)
        return cut(code, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(statements, "_pieces", counting)
    code = "import os\nroot = 'data'"
    host = RelayHost(work, record_dir=tmp_path / "record").start()
    try:
        cell_id = host.begin_cell(code, frontend_cell_id=None, silent=False)
        host.prepare_cell()
        host.prepare_cell()  # a second call is no second cut
        assert calls == [code]
        host.finish_cell("ok", 1, [])
        assert calls == [code]
        assert host.cells.lineage.tracker.aliases() == {"os": "os"}
        assert host.ledger is not None
        kinds = [r["kind"] for r in host.ledger.query(
            "SELECT kind FROM events WHERE session = ? ORDER BY seq", (host.session_id,))]
    finally:
        host.close()
    assert kinds[-2:] == ["cell_started", "cell_finished"]
    assert cell_id


def test_the_sessions_tracker_is_made_once_whichever_threads_ask(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The main thread prepares a cell while a call's thread records a receipt: both ask for
    the session's tracker at the session's first cell, and must get the same one."""
    import threading
    import time

    from host_kernel.host._lineage import SessionLineage
    from host_kernel.host._workspace import Workspace

    made: list[FlowTracker] = []
    init = FlowTracker.__init__

    def slow(self: FlowTracker, **kwargs: object) -> None:
        made.append(self)
        time.sleep(0.05)  # long enough for every other thread to ask meanwhile
        init(self, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FlowTracker, "__init__", slow)
    (tmp_path / "ws").mkdir()
    lineage = SessionLineage(Workspace(tmp_path / "ws", tmp_path / "record"))
    got: list[FlowTracker] = []
    threads = [threading.Thread(target=lambda: got.append(lineage.tracker)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1
    assert len(got) == 6 and all(t is made[0] for t in got)
