"""OS-level tracing through real cells: the inputs of saved artifacts and how each was found.

Each test starts a real Host over a real (confined, traced) kernel in a tmp_path
workspace, runs cells, saves an artifact and asserts its inputs *and* their
``method``: ``traced`` for reads the seccomp supervisor saw (docs/lineage.md),
``def-use`` for reads carried through variables from an earlier cell,
``receipt`` for the link to a ``host.bash`` receipt. The fallback (no tracing)
reports ``observed`` and says so once.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import run_ok
from _tracing_helpers import artifact_id_of, events, finished, inputs_of, last_line, receipt_body

from host_kernel import Host
from host_kernel.lineage.graph import build_lineage


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"MODULE MISSING: {module} is not installed in this environment, so "
                    f"this tracing test cannot run")


@pytest.fixture
def traced(workdir: Path) -> Iterator[Host]:
    """A Host whose generation is traced by seccomp; skips nothing: untraced is a failure."""
    with Host(workdir) as host:
        assert host.tracing == {"status": "seccomp"}, host.tracing
        yield host


def _write(ws: Path, rel: str, text: str) -> Path:
    path = ws / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ------------------------------------------------------------------ reads made in C


@pytest.mark.parametrize("reader", ["pq.read_table('data/a.parquet').to_pandas()",
                                    "pd.read_parquet('data/a.parquet')"])
def test_a_parquet_read_by_arrow_is_a_traced_input(workdir: Path, reader: str) -> None:
    _require("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    (workdir / "data").mkdir()
    pq.write_table(pa.table({"x": [1, 2, 3]}), workdir / "data" / "a.parquet")
    _write(workdir, "data/decoy.txt", "not an input")
    with Host(workdir) as host:
        run_ok(host, "import pandas as pd\nimport pyarrow.parquet as pq\n"
                     "noise = open('data/decoy.txt').read()\n"
                     f"{reader}.to_csv('derived.csv')\n"
                     "host.save_artifact('derived.csv')")
        assert inputs_of(host, "derived.csv") == {"file:data/a.parquet": "traced"}


def test_an_h5py_read_is_a_traced_input(traced: Host, workdir: Path) -> None:
    _require("h5py")
    import h5py
    import numpy as np

    (workdir / "data").mkdir()
    with h5py.File(workdir / "data" / "m.h5", "w") as f:
        f["x"] = np.arange(4.0)
    run_ok(traced, "import h5py, numpy as np\n"
                   "with h5py.File('data/m.h5', 'r') as f:\n"
                   "    np.savetxt('h5.txt', f['x'][:] * 2)\n"
                   "host.save_artifact('h5.txt')")
    assert inputs_of(traced, "h5.txt") == {"file:data/m.h5": "traced"}


def test_a_sqlite_query_makes_the_database_file_the_input(traced: Host, workdir: Path) -> None:
    (workdir / "data").mkdir()
    with sqlite3.connect(workdir / "data" / "runs.db") as db:
        db.execute("CREATE TABLE t (v INTEGER)")
        db.executemany("INSERT INTO t VALUES (?)", [(1,), (2,), (39,)])
    db.close()
    run_ok(traced, "import sqlite3\n"
                   "open('total.txt', 'w').write(str(sqlite3.connect('data/runs.db')"
                   ".execute('SELECT sum(v) FROM t').fetchone()[0]))\n"
                   "host.save_artifact('total.txt')")
    assert (workdir / "total.txt").read_text() == "42"
    assert inputs_of(traced, "total.txt") == {"file:data/runs.db": "traced"}


def test_files_read_by_forked_pool_workers_are_traced_inputs(traced: Host,
                                                             workdir: Path) -> None:
    _write(workdir, "wmod.py", "def load(path):\n    with open(path) as f:\n"
                               "        return f.read()\n")
    _write(workdir, "data/p1.txt", "one ")
    _write(workdir, "data/p2.txt", "two")
    _write(workdir, "data/decoy.txt", "not an input")
    # One statement reads and writes, so every read is the saving statement's own.
    out = run_ok(traced, "import multiprocessing as mp, os\n"
                         "noise = open('data/decoy.txt').read()\n"
                         "with mp.get_context('fork').Pool(2) as pool:\n"
                         "    import wmod\n"
                         "    worker = pool.apply(os.getpid)\n"
                         "    open('joined.txt', 'w').write(''.join(\n"
                         "        pool.map(wmod.load, ['data/p1.txt', 'data/p2.txt'])))\n"
                         "print(worker != os.getpid())\n"
                         "host.save_artifact('joined.txt')")
    assert "True" in out  # the reads really happened in other processes
    assert (workdir / "joined.txt").read_text() == "one two"
    inputs = inputs_of(traced, "joined.txt")
    # The module whose code the workers ran is read by the import in this cell.
    assert inputs == {"file:data/p1.txt": "traced", "file:data/p2.txt": "traced",
                      "file:wmod.py": "traced"}


# ------------------------------------------------------------------ host.bash commands


def test_a_file_a_script_opens_unnamed_is_a_traced_input_of_its_receipt(
        traced: Host, workdir: Path) -> None:
    _write(workdir, "tool.py", "with open('data/hidden.csv') as f:\n"
                               "    open('out.txt', 'w').write(f.read().upper())\n")
    _write(workdir, "data/hidden.csv", "a,b\n")
    _write(workdir, "data/unused.csv", "never opened\n")
    receipt_id = last_line(traced, "import sys\nr = host.bash(f'{sys.executable} tool.py')\n"
                                   "assert r.exit_status == 0, r\nprint(r.receipt_id)")
    run_ok(traced, "host.save_artifact('out.txt')")
    assert (workdir / "out.txt").read_text() == "A,B\n"
    assert inputs_of(traced, "out.txt") == {f"receipt:{receipt_id}": "receipt",
                                            "file:tool.py": "traced",
                                            "file:data/hidden.csv": "traced"}
    body = receipt_body(traced, receipt_id)
    assert "data/hidden.csv" in body["traced"]["reads"]
    assert "data/unused.csv" not in body["traced"]["reads"]
    assert [c["path"] for c in body["changes"]] == ["out.txt"]


def test_every_file_a_shell_glob_matches_is_an_input(traced: Host, workdir: Path) -> None:
    for i in (1, 2, 3):
        _write(workdir, f"data/runs/r{i}.csv", f"{i}\n")
    _write(workdir, "data/runs/notes.txt", "not matched\n")
    _write(workdir, "data/other.csv", "not matched\n")
    receipt_id = last_line(traced, "r = host.bash('cat data/runs/*.csv > all.csv')\n"
                                   "assert r.exit_status == 0, r\n"
                                   "host.save_artifact('all.csv')\nprint(r.receipt_id)")
    assert (workdir / "all.csv").read_text() == "1\n2\n3\n"
    assert inputs_of(traced, "all.csv") == {f"receipt:{receipt_id}": "receipt",
                                            "file:data/runs/r1.csv": "traced",
                                            "file:data/runs/r2.csv": "traced",
                                            "file:data/runs/r3.csv": "traced"}


def test_a_file_cell_code_writes_while_a_command_runs_is_not_the_commands_change(
        traced: Host, workdir: Path) -> None:
    # The command waits (by stat, which is not traced) until the thread has written
    # side.txt, so side.txt is certainly written while the command runs.
    receipt_id = last_line(traced, """
import os, threading, time
def side():
    for _ in range(400):
        if os.path.exists('started.flag'):
            break
        time.sleep(0.01)
    with open('side.txt', 'w') as f:
        f.write('side')
t = threading.Thread(target=side)
t.start()
r = host.bash('touch started.flag; for i in $(seq 200); do [ -e side.txt ] && break; '
              'sleep 0.02; done; sleep 0.1; echo x > cmd.txt')
t.join()
assert r.exit_status == 0, r
print(r.receipt_id)
""")
    assert (workdir / "side.txt").read_text() == "side"
    body = receipt_body(traced, receipt_id)
    changed = {c["path"] for c in body["changes"]}
    assert changed == {"started.flag", "cmd.txt"}
    assert "side.txt" in body["traced"]["changes_by_others"]
    run_ok(traced, "host.save_artifact('cmd.txt')")
    assert inputs_of(traced, "cmd.txt") == {f"receipt:{receipt_id}": "receipt"}


def test_a_command_writing_through_a_hard_link_outside_the_workspace_keeps_its_change(
        traced: Host, workdir: Path) -> None:
    """The writes are traced by path, and $TMPDIR is outside the workspace: a command that
    links a workspace file out and writes through the other name must not hide the change
    from its receipt (a change dropped there would be nobody's)."""
    _write(workdir, "data/x.csv", "x\n1\n")
    receipt_id = last_line(traced, """
r = host.bash('sleep 0.05; ln data/x.csv "$TMPDIR/h" && echo 2 >> "$TMPDIR/h"')
print(r.receipt_id)
""")
    # With a private view the workspace and $TMPDIR are separate bind mounts: ln gets
    # EXDEV, the attack cannot be made, and the test says so below.
    if (workdir / "data/x.csv").read_text() != "x\n1\n2\n":
        pytest.skip("LOUD: the hard link could not be made here (another file system?)")
    body = receipt_body(traced, receipt_id)
    assert [c["path"] for c in body["changes"]] == ["data/x.csv"]
    assert "data/x.csv" not in body["traced"].get("changes_by_others", [])


# ------------------------------------------------------------------ a hostile kernel


def test_a_kernel_that_fools_its_audit_hook_still_gets_traced_lineage(
        traced: Host, workdir: Path) -> None:
    for name in ("a", "b", "c", "decoy"):
        _write(workdir, f"data/{name}.bin", f"<{name}>")
    # Whatever in-kernel capture there is (a traced kernel runs none) is silenced, and a
    # fake one reports a read that never happened, at save time and at the cell's end.
    run_ok(traced, """
from host_kernel.kernel.capture import CellAccess
if host._capture is not None:
    host._capture.begin = lambda key: None
    host._capture._state = None
class Liar:
    def peek(self):
        return CellAccess(reads=('data/decoy.bin',))
    def end(self):
        return self.peek()
host._capture = Liar()
def lie(result):
    host._report_access(host._capture.end().to_dict())
get_ipython().events.register('post_run_cell', lie)
""")
    obs = traced.execute("""
import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.open.argtypes = [ctypes.c_char_p, ctypes.c_int]
with open('joined.bin', 'wb') as out:  # one statement: its reads are its own
    fd = os.open('data/a.bin', os.O_RDONLY)
    out.write(os.read(fd, 100))
    os.close(fd)
    with open('data/b.bin', 'rb') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        out.write(bytes(m))
    fd = libc.open(b'data/c.bin', os.O_RDONLY)
    buf = ctypes.create_string_buffer(100)
    n = libc.read(fd, buf, 100)
    out.write(buf.raw[:n])
    libc.close(fd)
host.save_artifact('joined.bin')
""", timeout=60)
    assert obs.status == "ok", obs.text
    assert (workdir / "joined.bin").read_bytes() == b"<a><b><c>"
    # The kernel's own report was fooled ...
    assert finished(traced, obs).get("access", {}).get("reads") == ["data/decoy.bin"]
    # ... the Host's was not.
    assert inputs_of(traced, "joined.bin") == {"file:data/a.bin": "traced",
                                               "file:data/b.bin": "traced",
                                               "file:data/c.bin": "traced"}
    assert "data/decoy.bin" not in finished(traced, obs)["traced"]["reads"]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"),
                    reason="the tracer's seccomp filter knows x86_64 and aarch64 only")
def test_io_uring_setup_is_refused_inside_a_cell(traced: Host) -> None:
    out = last_line(traced, "import ctypes, errno\n"
                            "libc = ctypes.CDLL(None, use_errno=True)\n"
                            "params = ctypes.create_string_buffer(120)\n"
                            "rc = libc.syscall(425, 8, params)\n"
                            "print(rc, errno.errorcode.get(ctypes.get_errno()))")
    assert out == "-1 ENOSYS"


@pytest.mark.skip(reason="a 32-bit `int 0x80` system call needs hand-written machine code "
                         "and a 32-bit-capable kernel; it cannot be tested portably")
def test_a_32_bit_system_call_is_refused() -> None:
    raise AssertionError("skipped")


# ------------------------------------------------------------------ time and place


def test_a_read_between_cells_is_recorded_as_between_and_is_no_input(
        traced: Host, workdir: Path) -> None:
    _write(workdir, "data/late.txt", "late")
    _write(workdir, "data/real.txt", "real")
    run_ok(traced, """
import os, threading, time
def late():
    for _ in range(1000):
        if os.path.exists('go.flag'):
            break
        time.sleep(0.01)
    with open('data/late.txt') as f:
        f.read()
    open('done.flag', 'w').close()
threading.Thread(target=late, daemon=True).start()
""")
    (workdir / "go.flag").touch()  # by the test process: never traced
    deadline = time.monotonic() + 10
    while not (workdir / "done.flag").exists():
        assert time.monotonic() < deadline, "the thread of cell 1 never read its file"
        time.sleep(0.01)
    obs = traced.execute("with open('data/real.txt') as f:\n"
                         "    open('c2.txt', 'w').write(f.read())\n"
                         "host.save_artifact('c2.txt')", timeout=60)
    assert obs.status == "ok", obs.text
    record = finished(traced, obs)["traced"]
    assert "data/late.txt" in record["between"]
    assert "data/late.txt" not in record.get("reads", [])
    assert inputs_of(traced, "c2.txt") == {"file:data/real.txt": "traced"}


def test_a_read_relative_to_a_changed_folder_maps_to_its_workspace_path(
        traced: Host, workdir: Path) -> None:
    _write(workdir, "data/a.csv", "x\n1\n")
    _write(workdir, "a.csv", "the wrong one\n")
    run_ok(traced, "import os\nos.chdir('data')\n"
                   "try:\n"
                   "    with open('a.csv') as f, open('../out.txt', 'w') as g:\n"
                   "        g.write(f.read())\n"
                   "finally:\n"
                   "    os.chdir('..')\n"
                   "host.save_artifact('out.txt')")
    assert inputs_of(traced, "out.txt") == {"file:data/a.csv": "traced"}


# ------------------------------------------------------------------ the fallback


@pytest.mark.parametrize("switch", ["env", "argument"])
def test_without_tracing_the_record_and_first_notice_say_so_and_the_hook_still_works(
        workdir: Path, monkeypatch: pytest.MonkeyPatch, switch: str) -> None:
    if switch == "env":
        monkeypatch.setenv("HOST_KERNEL_FAKE_NO_TRACE", "1")
    _write(workdir, "data/a.csv", "x\n1\n")
    with Host(workdir, trace=switch != "argument") as host:
        started = events(host, "generation_started")
        tracing = started[0]["tracing"]
        assert tracing["status"] == "audit-hook"
        assert ("HOST_KERNEL_FAKE_NO_TRACE" if switch == "env" else "trace=False") \
            in tracing["reason"]
        first = host.execute("with open('data/a.csv') as f:\n"
                             "    open('out.txt', 'w').write(f.read())\n"
                             "host.save_artifact('out.txt')", timeout=60)
        assert first.status == "ok", first.text
        assert first.notice is not None
        assert first.notice.count("not traced at the OS level") == 1
        assert tracing["reason"] in first.notice
        second = host.execute("1 + 1", timeout=60)
        assert "not traced" not in (second.notice or "")
        assert inputs_of(host, "out.txt") == {"file:data/a.csv": "observed"}
        assert "traced" not in finished(host, first)


# ------------------------------------------------------------------ def-use with tracing


def test_a_read_through_a_variable_of_the_saving_cell_is_traced(
        traced: Host, workdir: Path) -> None:
    _write(workdir, "data/a.csv", "x\n1\n2\n")
    obs = traced.execute("import pandas as pd\ndf = pd.read_csv('data/a.csv')\n"
                         "df.to_csv('out.csv')\nhost.save_artifact('out.csv')", timeout=60)
    assert obs.status == "ok", obs.text
    assert inputs_of(traced, "out.csv") == {"file:data/a.csv": "traced"}


def test_a_file_renamed_into_place_and_saved_in_the_same_cell_keeps_its_input(
        traced: Host, workdir: Path) -> None:
    _write(workdir, "data/a.csv", "x\n1\n")
    # Paths in variables: the cell is fed whole, so statement splitting plays no part.
    run_ok(traced, "import os\nsrc, tmp, dst = 'data/a.csv', 'tmp.txt', 'out.txt'\n"
                   "with open(src) as f:\n    open(tmp, 'w').write(f.read())\n"
                   "os.replace(tmp, dst)\nhost.save_artifact(dst)")
    assert inputs_of(traced, "out.txt") == {"file:data/a.csv": "traced"}


def test_a_file_read_back_after_writing_keeps_the_input_it_was_written_from(
        traced: Host, workdir: Path) -> None:
    _write(workdir, "data/a.csv", "x\n1\n")
    run_ok(traced, "with open('data/a.csv') as f:\n    open('out.txt', 'w').write(f.read())\n"
                   "print(open('out.txt').read())\nhost.save_artifact('out.txt')")
    assert inputs_of(traced, "out.txt") == {"file:data/a.csv": "traced"}


# ------------------------------------------------------------------ across cells (def-use)



def test_a_value_read_in_an_earlier_cell_is_a_def_use_input(traced: Host,
                                                            workdir: Path) -> None:
    _write(workdir, "data/a.csv", "1\n2\n")
    _write(workdir, "data/decoy.csv", "9\n")
    first = traced.execute("rows = open('data/a.csv').read().split()\n"
                           "noise = open('data/decoy.csv').read()", timeout=60)
    assert first.status == "ok", first.text
    run_ok(traced, "open('sum.txt', 'w').write(str(sum(map(int, rows))))\n"
                   "host.save_artifact('sum.txt')")
    assert inputs_of(traced, "sum.txt") == {"file:data/a.csv": "def-use"}
    assert finished(traced, first)["traced"]["reads"] == ["data/a.csv", "data/decoy.csv"]


_MPL_SETUP = ("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
              "ys = [float(v) for v in open('data/ys.txt').read().split()]\n"
              "noise = open('data/decoy.txt').read()")


def test_a_plt_savefig_figure_has_the_data_it_plots(traced: Host, workdir: Path) -> None:
    _require("matplotlib")
    _write(workdir, "data/ys.txt", "1 3 2\n")
    _write(workdir, "data/decoy.txt", "unused\n")
    run_ok(traced, _MPL_SETUP)
    run_ok(traced, "plt.plot(ys)\nplt.savefig('fig.png')\nhost.save_artifact('fig.png')")
    assert inputs_of(traced, "fig.png") == {"file:data/ys.txt": "def-use"}


def test_a_figure_drawn_with_ax_plot_and_saved_a_cell_later_has_its_data(
        traced: Host, workdir: Path) -> None:
    _require("matplotlib")
    _write(workdir, "data/ys.txt", "1 3 2\n")
    _write(workdir, "data/decoy.txt", "unused\n")
    run_ok(traced, _MPL_SETUP)
    run_ok(traced, "fig, ax = plt.subplots()")
    run_ok(traced, "ax.plot(ys)")
    run_ok(traced, "fig.savefig('fig.png')\nhost.save_artifact('fig.png')")
    assert inputs_of(traced, "fig.png") == {"file:data/ys.txt": "def-use"}


def test_values_a_run_script_computed_carry_its_reads(traced: Host, workdir: Path) -> None:
    _write(workdir, "script.py", "total = sum(map(int, open('data/a.txt').read().split()))\n")
    _write(workdir, "data/a.txt", "1 2 3\n")
    _write(workdir, "data/decoy.txt", "unused\n")
    run_ok(traced, "%run script.py")
    run_ok(traced, "noise = open('data/decoy.txt').read()")
    run_ok(traced, "open('total.txt', 'w').write(str(total))\nhost.save_artifact('total.txt')")
    assert (workdir / "total.txt").read_text() == "6"
    # The script's code computed the value: its bytes flowed too.
    assert inputs_of(traced, "total.txt") == {"file:data/a.txt": "def-use",
                                              "file:script.py": "def-use"}


def test_a_result_computed_by_a_workspace_module_function_carries_its_reads(
        traced: Host, workdir: Path) -> None:
    _write(workdir, "wlib.py", "def total(path):\n"
                               "    return sum(map(int, open(path).read().split()))\n")
    _write(workdir, "data/nums.txt", "4 5\n")
    _write(workdir, "data/decoy.txt", "unused\n")
    run_ok(traced, "import wlib\nt = wlib.total('data/nums.txt')\n"
                   "noise = open('data/decoy.txt').read()")
    run_ok(traced, "open('t.txt', 'w').write(str(t))\nhost.save_artifact('t.txt')")
    assert (workdir / "t.txt").read_text() == "9"
    # The module's code computed the value: its source (as it is now) flowed too.
    assert inputs_of(traced, "t.txt") == {"file:data/nums.txt": "def-use",
                                          "file:wlib.py": "def-use"}


def test_an_artifact_chain_through_a_re_read_file_reaches_the_first_input(
        traced: Host, workdir: Path) -> None:
    _write(workdir, "data/a.csv", "1\n2\n")
    run_ok(traced, "with open('data/a.csv') as f:\n"
                   "    open('mid.txt', 'w').write(str(sum(map(int, f.read().split()))))\n"
                   "host.save_artifact('mid.txt')")
    run_ok(traced, "m = int(open('mid.txt').read())")
    run_ok(traced, "open('final.txt', 'w').write(str(m * 10))\nhost.save_artifact('final.txt')")
    mid, final = artifact_id_of(traced, "mid.txt"), artifact_id_of(traced, "final.txt")
    assert (workdir / "final.txt").read_text() == "30"
    # The re-read file still holds the first artifact's bytes: the chain goes through it.
    assert inputs_of(traced, "final.txt") == {f"artifact:{mid}": "def-use"}
    graph = build_lineage(traced.ledger, final)
    labels = {n.label for n in graph.nodes}
    assert any("data/a.csv" in label for label in labels), labels


def test_a_module_imported_a_cell_earlier_reads_traced_when_called(traced: Host,
                                                                   workdir: Path) -> None:
    _write(workdir, "wlib.py", "def total(path):\n"
                               "    return sum(map(int, open(path).read().split()))\n")
    _write(workdir, "data/nums.txt", "4 5\n")
    run_ok(traced, "import wlib")
    run_ok(traced, "open('t.txt', 'w').write(str(wlib.total('data/nums.txt')))\n"
                   "host.save_artifact('t.txt')")
    # The module's source was read (traced) when it was imported, a cell ago.
    assert inputs_of(traced, "t.txt") == {"file:data/nums.txt": "traced",
                                          "file:wlib.py": "def-use"}



def test_an_empty_artifact_is_not_the_input_of_every_empty_file_read_later(
        traced: Host, workdir: Path) -> None:
    run_ok(traced, "open('empty.txt', 'w').close()\nhost.save_artifact('empty.txt')")
    _write(workdir, "data/blank.txt", "")
    run_ok(traced, "b = open('data/blank.txt').read()\nopen('o.txt', 'w').write(b + 'x')\n"
                   "host.save_artifact('o.txt')")
    assert inputs_of(traced, "o.txt") == {"file:data/blank.txt": "traced"}


def test_reads_through_proc_self_cwd_or_a_symlink_planted_outside_the_workspace_are_seen(
        traced: Host, workdir: Path) -> None:
    """The private $TMPDIR is writable to the kernel: a symlink there (or /proc/self/cwd)
    must not let a read of a workspace file pass for a read outside it."""
    _write(workdir, "data/a.csv", "x\n1\n")
    _write(workdir, "data/b.csv", "x\n2\n")
    _write(workdir, "data/c.csv", "x\n3\n")
    os.symlink("data/c.csv", workdir / "link.csv")  # inside the workspace, to a workspace file
    run_ok(traced, "import os, tempfile\n"
                   "a = open('/proc/self/cwd/data/a.csv').read()\n"
                   "ln = os.path.join(tempfile.gettempdir(), 'ln.csv')\n"
                   "os.symlink(os.path.abspath('data/b.csv'), ln)\n"
                   "b = open(ln).read()\n"
                   "c = open('link.csv').read()\n"
                   "open('out.txt', 'w').write(a + b + c)\nhost.save_artifact('out.txt')")
    # A symlink inside the workspace that stays inside it is hashed as the path read.
    assert inputs_of(traced, "out.txt") == {"file:data/a.csv": "traced",
                                            "file:data/b.csv": "traced",
                                            "file:link.csv": "traced"}
