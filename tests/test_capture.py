"""Per-cell file access capture (PEP 578 audit hook) in the kernel process.

Audit hooks cannot be removed, so every scenario that installs one runs in a
fresh interpreter: the script below sets up a workspace, runs the ``setup``
code untraced, runs ``cell`` between ``begin()`` and ``end()``, and prints
the resulting ``CellAccess`` as JSON. Value-level behaviour (serialisation,
argument checks) is tested in-process, where no hook is installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from host_kernel.kernel import capture as capture_module
from host_kernel.kernel.capture import Capture, CellAccess

# The runner loads capture.py by its file path: the module is standard-library
# only, and importing the package root would start the whole Host stack in
# every scenario's interpreter.
_RUNNER = textwrap.dedent(
    """
    import importlib.util, json, os, sys
    spec = json.loads(sys.argv[1])
    module_spec = importlib.util.spec_from_file_location("_capture", spec["module"])
    capture_module = importlib.util.module_from_spec(module_spec)
    sys.modules["_capture"] = capture_module
    module_spec.loader.exec_module(capture_module)
    Capture = capture_module.Capture
    ws = spec["workspace"]
    os.chdir(ws)
    exec(spec["setup"], globals())
    cap = Capture(ws, ignore=spec["ignore"], extra_roots=spec["extra_roots"],
                  max_paths=spec["max_paths"])
    cap.install()
    exec(spec["before"], globals())
    cap.begin("cell-1")
    exec(spec["cell"], globals())
    access = cap.end()
    exec(spec["after"], globals())
    print(json.dumps(access.to_dict()))
    """
)


def run_cell(
    workspace: Path,
    cell: str,
    *,
    setup: str = "",
    before: str = "",
    after: str = "",
    ignore: tuple[str, ...] = (),
    extra_roots: tuple[str, ...] = (),
    max_paths: int = 10_000,
) -> dict[str, Any]:
    """Run ``cell`` under capture in a fresh interpreter; return ``CellAccess.to_dict()``."""
    spec = {
        "module": capture_module.__file__,
        "workspace": str(workspace),
        "setup": textwrap.dedent(setup),
        "before": textwrap.dedent(before),
        "cell": textwrap.dedent(cell),
        "after": textwrap.dedent(after),
        "ignore": list(ignore),
        "extra_roots": list(extra_roots),
        "max_paths": max_paths,
    }
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "data").mkdir()
    (workspace / "data" / "in.csv").write_text("a,b\n1,2\n")
    (workspace / "notes.txt").write_text("hello\n")
    return Path(os.path.realpath(workspace))


# -- open modes ---------------------------------------------------------------


def test_open_for_reading_is_a_read(ws: Path) -> None:
    access = run_cell(ws, "open('data/in.csv').read()")
    assert access["reads"] == ["data/in.csv"]
    assert access["writes"] == []


def test_open_for_writing_is_a_write(ws: Path) -> None:
    access = run_cell(ws, "open('out.txt', 'w').write('x')")
    assert access["writes"] == ["out.txt"]
    assert access["reads"] == []


def test_append_and_exclusive_create_are_writes(ws: Path) -> None:
    access = run_cell(ws, "open('notes.txt', 'a').close(); open('new.bin', 'xb').close()")
    assert access["writes"] == ["notes.txt", "new.bin"]
    assert access["reads"] == []


def test_read_plus_mode_is_both_read_and_write(ws: Path) -> None:
    access = run_cell(ws, "open('notes.txt', 'r+').close()")
    assert access["reads"] == ["notes.txt"]
    assert access["writes"] == ["notes.txt"]


def test_pathlib_read_text_and_write_text(ws: Path) -> None:
    cell = """
    from pathlib import Path
    text = Path('notes.txt').read_text()
    Path('copy.txt').write_text(text)
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["notes.txt"]
    assert access["writes"] == ["copy.txt"]


def test_io_open_and_csv_module(ws: Path) -> None:
    cell = """
    import csv, io
    with io.open('data/in.csv', newline='') as fh:
        rows = list(csv.reader(fh))
    with open('data/out.csv', 'w', newline='') as fh:
        csv.writer(fh).writerows(rows)
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["data/in.csv"]
    assert access["writes"] == ["data/out.csv"]


def test_json_load_through_open_is_a_read(ws: Path) -> None:
    access = run_cell(
        ws,
        "import json; cfg = json.load(open('cfg.json'))",
        setup="open('cfg.json', 'w').write('{\"k\": 1}')",
    )
    assert access["reads"] == ["cfg.json"]


def test_repeated_opens_are_listed_once_in_first_seen_order(ws: Path) -> None:
    cell = """
    for _ in range(3):
        open('notes.txt').read()
        open('data/in.csv').read()
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["notes.txt", "data/in.csv"]


def test_failed_open_still_counts_as_an_attempted_read(ws: Path) -> None:
    cell = """
    try:
        open('missing.txt')
    except FileNotFoundError:
        pass
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["missing.txt"]


# -- os.open flags --------------------------------------------------------------


def test_os_open_read_only_flags_are_a_read(ws: Path) -> None:
    access = run_cell(ws, "os.close(os.open('notes.txt', os.O_RDONLY))")
    assert access["reads"] == ["notes.txt"]
    assert access["writes"] == []


def test_os_open_write_flags_are_a_write(ws: Path) -> None:
    cell = """
    os.close(os.open('a.txt', os.O_WRONLY | os.O_CREAT))
    os.close(os.open('notes.txt', os.O_WRONLY | os.O_APPEND))
    """
    access = run_cell(ws, cell)
    assert access["writes"] == ["a.txt", "notes.txt"]
    assert access["reads"] == []


def test_os_open_read_write_flags_are_both(ws: Path) -> None:
    access = run_cell(ws, "os.close(os.open('notes.txt', os.O_RDWR))")
    assert access["reads"] == ["notes.txt"]
    assert access["writes"] == ["notes.txt"]


def test_os_open_of_a_folder_is_not_a_read(ws: Path) -> None:
    access = run_cell(ws, "os.close(os.open('data', os.O_RDONLY)); os.close(os.open('.', 0))")
    assert access["reads"] == []


def test_opening_a_file_descriptor_adds_nothing(ws: Path) -> None:
    cell = """
    fd = os.open('notes.txt', os.O_RDONLY)
    with open(fd) as fh:
        fh.read()
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["notes.txt"]


def test_bytes_paths_are_decoded(ws: Path) -> None:
    access = run_cell(
        ws, "open(b'notes.txt').read(); os.close(os.open(b'b.txt', os.O_CREAT | os.O_WRONLY))"
    )
    assert access["reads"] == ["notes.txt"]
    assert access["writes"] == ["b.txt"]


# -- paths ---------------------------------------------------------------------


def test_relative_paths_follow_chdir(ws: Path) -> None:
    cell = """
    os.chdir('data')
    open('in.csv').read()
    open('../notes.txt').read()
    os.chdir('..')
    open('./data/./in.csv').read()
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["data/in.csv", "notes.txt"]


def test_absolute_paths_inside_the_workspace_are_made_relative(ws: Path) -> None:
    access = run_cell(ws, f"open({str(ws / 'data' / 'in.csv')!r}).read()")
    assert access["reads"] == ["data/in.csv"]


def test_absolute_path_through_a_symlinked_folder_is_resolved(ws: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(ws, target_is_directory=True)
    access = run_cell(ws, f"open({str(link / 'notes.txt')!r}).read()")
    assert access["reads"] == ["notes.txt"]


def test_dotdot_paths_are_normalised_and_escapes_dropped(ws: Path) -> None:
    cell = f"""
    open('data/../notes.txt').read()
    open({str(ws / "data" / ".." / ".." / "elsewhere.txt")!r}, 'w').close()
    open('../ws/data//in.csv').read()
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["notes.txt", "data/in.csv"]
    assert access["writes"] == []


def test_files_outside_the_workspace_are_ignored(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    cell = f"""
    open({str(outside)!r}).read()
    open('../outside.txt').read()
    open({str(tmp_path / "elsewhere.txt")!r}, 'w').write('y')
    import email.mime.text  # an import reads interpreter files
    """
    access = run_cell(ws, cell)
    assert access["reads"] == []
    assert access["writes"] == []


def test_ignored_folder_is_never_recorded(ws: Path) -> None:
    record = ws / ".record"
    record.mkdir()
    cell = """
    open('.record/ledger.db', 'w').write('x')
    open('.record/ledger.db').read()
    open('notes.txt').read()
    """
    access = run_cell(ws, cell, ignore=(str(record),))
    assert access["reads"] == ["notes.txt"]
    assert access["writes"] == []


def test_ignored_folder_reached_through_dot_segments_is_still_ignored(ws: Path) -> None:
    record = ws / ".record"
    record.mkdir()
    access = run_cell(
        ws,
        "open('./.record/x', 'w').close(); open('data/../.record/y', 'w').close()",
        ignore=(str(record),),
    )
    assert access["writes"] == []


def test_extra_roots_are_recorded_as_absolute_paths(ws: Path, tmp_path: Path) -> None:
    store = tmp_path / "materialised"
    store.mkdir()
    (store / "blob.csv").write_text("x")
    access = run_cell(ws, f"open({str(store / 'blob.csv')!r}).read()", extra_roots=(str(store),))
    assert access["reads"] == [str(store / "blob.csv")]


def test_bytecode_caches_in_the_workspace_are_ignored(ws: Path) -> None:
    (ws / "helper.py").write_text("VALUE = 1\n")
    cell = """
    sys.path.insert(0, os.getcwd())
    import helper
    """
    access = run_cell(ws, cell, setup="import sys; sys.dont_write_bytecode = False")
    assert access["reads"] == ["helper.py"]
    assert access["writes"] == []
    assert (ws / "__pycache__").is_dir()


# -- removes, renames ----------------------------------------------------------


def test_rename_records_the_pair_and_the_target_as_written(ws: Path) -> None:
    access = run_cell(ws, "os.rename('notes.txt', 'moved.txt')")
    assert access["renames"] == [["notes.txt", "moved.txt"]]
    assert access["writes"] == ["moved.txt"]
    assert access["removes"] == []


def test_replace_is_a_rename(ws: Path) -> None:
    cell = """
    open('tmp.part', 'w').write('x')
    os.replace('tmp.part', 'final.txt')
    """
    access = run_cell(ws, cell)
    assert access["renames"] == [["tmp.part", "final.txt"]]
    assert access["writes"] == ["tmp.part", "final.txt"]


def test_moving_a_file_out_of_the_workspace_is_a_remove(ws: Path, tmp_path: Path) -> None:
    access = run_cell(ws, f"os.rename('notes.txt', {str(tmp_path / 'gone.txt')!r})")
    assert access["removes"] == ["notes.txt"]
    assert access["renames"] == []
    assert access["writes"] == []


def test_remove_and_unlink_are_removes(ws: Path) -> None:
    cell = """
    from pathlib import Path
    os.remove('notes.txt')
    Path('data/in.csv').unlink()
    """
    access = run_cell(ws, cell)
    assert access["removes"] == ["notes.txt", "data/in.csv"]


def test_rmdir_is_a_remove(ws: Path) -> None:
    access = run_cell(ws, "os.mkdir('empty'); os.rmdir('empty')")
    assert access["removes"] == ["empty"]


def test_truncate_link_and_symlink_name_new_content_as_writes(ws: Path) -> None:
    cell = """
    os.truncate('notes.txt', 0)
    os.link('data/in.csv', 'hard.csv')
    os.symlink('data/in.csv', 'soft.csv')
    """
    access = run_cell(ws, cell)
    assert access["writes"] == ["notes.txt", "hard.csv", "soft.csv"]


def test_rmtree_is_one_remove_of_its_folder(ws: Path) -> None:
    access = run_cell(ws, "import shutil; shutil.rmtree('data')")
    assert access["removes"] == ["data"]
    assert access["reads"] == []


# -- subprocesses ----------------------------------------------------------------


def test_subprocess_launch_records_the_executable(ws: Path) -> None:
    cell = """
    import subprocess
    subprocess.run([sys.executable, '-c', 'pass'], check=True)
    subprocess.run('true', shell=True, check=True)
    """
    access = run_cell(ws, cell)
    assert access["subprocesses"][0] == sys.executable
    assert access["subprocesses"][1] == "/bin/sh"


def test_posix_spawn_records_the_path(ws: Path) -> None:
    cell = """
    pid = os.posix_spawn(sys.executable, [sys.executable, '-c', 'pass'], dict(os.environ))
    os.waitpid(pid, 0)
    """
    access = run_cell(ws, cell)
    assert access["subprocesses"] == [sys.executable]


def test_os_system_records_the_first_word(ws: Path) -> None:
    access = run_cell(ws, "os.system('true --flag')")
    assert access["subprocesses"] == ["true"]


def test_a_child_process_writes_are_not_seen(ws: Path) -> None:
    cell = """
    import subprocess
    subprocess.run([sys.executable, '-c', "open('child.txt', 'w').write('x')"], check=True)
    """
    access = run_cell(ws, cell)
    assert access["writes"] == []
    assert (ws / "child.txt").exists()


# -- attribution -----------------------------------------------------------------


def test_nothing_is_recorded_outside_begin_and_end(ws: Path) -> None:
    access = run_cell(
        ws,
        "open('data/in.csv').read()",
        before="open('notes.txt').read(); open('pre.txt', 'w').close()",
        after="open('post.txt', 'w').close()",
    )
    assert access["reads"] == ["data/in.csv"]
    assert access["writes"] == []


def test_consecutive_cells_are_kept_apart(ws: Path) -> None:
    cell = """
    open('notes.txt').read()
    first = cap.end()
    cap.begin('cell-2')
    open('data/in.csv').read()
    assert first.reads == ('notes.txt',), first
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["data/in.csv"]


def test_peek_reports_the_open_cell_without_ending_it(ws: Path) -> None:
    cell = """
    open('notes.txt').read()
    so_far = cap.peek()
    assert so_far.reads == ('notes.txt',), so_far
    assert cap.active_cell == 'cell-1'
    open('data/in.csv').read()
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["notes.txt", "data/in.csv"]


def test_accesses_from_threads_are_attributed_to_the_running_cell(ws: Path) -> None:
    cell = """
    import threading
    t = threading.Thread(target=lambda: open('notes.txt').read())
    t.start(); t.join()
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["notes.txt"]


def test_more_paths_than_the_bound_sets_truncated(ws: Path) -> None:
    cell = """
    for i in range(10):
        open(f'f{i}.txt', 'w').close()
    """
    access = run_cell(ws, cell, max_paths=4)
    assert access["writes"] == ["f0.txt", "f1.txt", "f2.txt", "f3.txt"]
    assert access["truncated"] is True


def test_under_the_bound_truncated_is_false(ws: Path) -> None:
    access = run_cell(ws, "open('notes.txt').read()", max_paths=4)
    assert access["truncated"] is False


# -- safety ----------------------------------------------------------------------


def test_an_error_inside_the_hook_never_breaks_the_users_call(ws: Path) -> None:
    cell = """
    def broken(path):
        raise RuntimeError('hook bug')
    cap._key = broken  # every slow-path event now fails inside the hook
    os.close(os.open('notes.txt', os.O_RDONLY))
    os.rename('notes.txt', 'renamed.txt')
    assert os.path.exists('renamed.txt')
    open('data/in.csv').read()  # the fast path still records
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["data/in.csv"]
    assert access["renames"] == []


def test_odd_path_types_never_break_the_users_call(ws: Path) -> None:
    cell = """
    import shutil
    class Weird:
        def __fspath__(self):
            raise ValueError('no path for you')
    try:
        shutil.rmtree(Weird())
    except ValueError:
        pass  # raised by shutil's own conversion, not by the hook
    open(b'\\xff.txt', 'w').close()
    open('data/in.csv').read()
    """
    access = run_cell(ws, cell)
    assert access["reads"] == ["data/in.csv"]
    assert access["writes"] == [os.fsdecode(b"\xff.txt")]


def test_hook_work_does_not_reenter_the_hook(ws: Path) -> None:
    # Q's path is converted by the hook only when the hook is not already
    # busy: the removal that P's __fspath__ makes while the hook converts P
    # must not be converted (and recorded) a second time.
    cell = """
    import shutil
    calls = {'q': 0}
    class Q:
        def __fspath__(self):
            calls['q'] += 1
            return 'q-' + str(calls['q'])
    class P:
        def __fspath__(self):
            cap._hook('shutil.rmtree', (Q(), None))
            return 'data'
    cap._hook('shutil.rmtree', (P(), None))
    assert calls['q'] == 0, calls
    cap._hook('shutil.rmtree', (Q(), None))
    assert calls['q'] == 1, calls
    """
    access = run_cell(ws, cell)
    assert access["removes"] == ["data", "q-1"]


# -- values and arguments (no hook installed here) -------------------------------


def test_cell_access_round_trips_through_to_dict() -> None:
    access = CellAccess(
        reads=("a.csv",),
        writes=("b.csv",),
        removes=("c.csv",),
        renames=(("d.tmp", "d.csv"),),
        subprocesses=("/bin/sh",),
        truncated=True,
    )
    data = access.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert CellAccess.from_dict(data) == access


def test_cell_access_from_dict_rejects_a_bad_shape() -> None:
    with pytest.raises(ValueError, match="not a CellAccess"):
        CellAccess.from_dict({"reads": "a.csv"})


def test_workspace_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="absolute"):
        Capture("relative/ws")


def test_ignore_entries_must_be_absolute(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ignore"):
        Capture(str(tmp_path), ignore=["rel"])


def test_end_without_begin_returns_an_empty_access(tmp_path: Path) -> None:
    capture = Capture(str(tmp_path))
    assert capture.end() == CellAccess()
    assert capture.active_cell is None
    assert not capture.installed
