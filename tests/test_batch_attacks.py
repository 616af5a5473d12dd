"""``host-kernel batch`` against a task's own code and against bad input.

A notebook is a task's code, as untrusted as an agent's: it must not reach the batch's
LLM key, whichever way the key is given. And what a user may get wrong (the workspaces
folder where the notebooks are, a file where a folder belongs, a notebook that is a link,
a task file nested past Python's stack) is refused in one line before anything starts,
or runs as asked. Attempts run here with :func:`run_task` (no Dask worker: the Host starts
cold, confined as on a worker); the folders a kernel must not read lie outside /tmp,
which every confined kernel is kept from anyway.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from _helpers import descendants
from nbformat.v4 import new_code_cell, new_notebook

from host_kernel.batch import (
    BatchError,
    Settings,
    Task,
    TaskInvalid,
    load_tasks,
    run_batch,
    run_task,
)
from host_kernel.batch._tasks import _checked
from host_kernel.cli import main
from host_kernel.llm import LLMConfig
from host_kernel.sandbox.client import probe

CONFINED = probe(None).active


@pytest.fixture
def home_root() -> Iterator[Path]:
    """A folder under the home folder (not /tmp, hidden from every kernel), removed after."""
    root = Path(tempfile.mkdtemp(dir=Path.home(), prefix=".hk-batch-attack-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def notebook(path: Path, *cells: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(new_notebook(cells=[new_code_cell(c) for c in cells]), path)
    return path


def settings(root: Path, **kwargs: object) -> Settings:
    return Settings(str(root / "ws"), batch="b", secret=os.urandom(32), **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- a task's own code


def test_a_notebook_task_cannot_read_the_batchs_llm_key_from_its_variable(
        home_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that does not look secret (no KEY, TOKEN…) is hidden as the batch's key."""
    monkeypatch.setenv("HKB_LLM_AUTH", "sk-the-batch-key")
    nb = notebook(home_root / "nbs" / "peek.ipynb",
                  "import os\nfound = os.environ.get('HKB_LLM_AUTH')\n"
                  "assert found is None, 'read the key: ' + found")
    llm = LLMConfig("http://127.0.0.1:9/v1", "m", api_key_env="HKB_LLM_AUTH")
    summary = run_task(Task("notebook", str(nb), name="peek"), settings(home_root, llm=llm))
    assert summary.ok, (summary.detail, summary.error)


def test_a_notebook_task_cannot_read_the_batchs_llm_key_file(home_root: Path) -> None:
    if not CONFINED:
        pytest.skip("NO CONFINEMENT HERE: nothing keeps a file from the kernel")
    key = home_root / "llm.key"
    key.write_text("sk-the-batch-key")
    nb = notebook(home_root / "nbs" / "peek.ipynb",
                  f"try:\n    found = open({str(key)!r}).read()\nexcept PermissionError:\n"
                  f"    found = None\nassert found is None, 'read the key: ' + found")
    llm = LLMConfig("http://127.0.0.1:9/v1", "m", api_key_file=str(key))
    summary = run_task(Task("notebook", str(nb), name="peek"), settings(home_root, llm=llm))
    assert summary.confinement == "landlock"
    assert summary.ok, (summary.detail, summary.error)


# ---------------------------------------------------------------------- notebooks and inputs


@pytest.mark.parametrize("relative", [True, False])
def test_a_notebook_that_is_a_link_runs_under_its_own_name(home_root: Path,
                                                           relative: bool) -> None:
    real = notebook(home_root / "shared" / "real.ipynb",
                    "import os\nassert os.path.isfile('linked.ipynb')\n"
                    "assert not os.path.islink('linked.ipynb')")
    link = home_root / "nbs" / "linked.ipynb"
    link.parent.mkdir()
    link.symlink_to("../shared/real.ipynb" if relative else real)
    (task,) = _checked([Task.notebook(link)])
    summary = run_task(task, settings(home_root))
    assert summary.ok, (summary.detail, summary.error)
    assert real.read_text() == (Path(summary.workspace or "") / "linked.ipynb").read_text()


def test_a_later_batch_where_the_notebooks_are_copies_no_earlier_batchs_workspaces(
        home_root: Path) -> None:
    """As the command's default ./hk-batch-<time> does when run in the notebooks' folder
    twice: the second batch's workspaces get the notebooks and their data, not the first
    batch's folder (every task's workspace of it, and so on, batch after batch)."""
    nbs = home_root / "nbs"
    nb = notebook(nbs / "a.ipynb", "print(1)")
    (nbs / "data.csv").write_text("x\n1\n")
    for n in (1, 2):
        ws = nbs / f"hk-batch-{n}"
        summary = run_task(_checked([Task.notebook(nb)])[0],
                           Settings(str(ws), batch=f"b{n}", secret=os.urandom(32),
                                    skip=(str(ws),)))
        assert summary.ok, (summary.detail, summary.error)
        assert sorted(p.name for p in Path(summary.workspace or "").iterdir()) == [
            "a.ipynb", "data.csv"]


def test_an_input_named_as_the_notebook_is_refused(home_root: Path) -> None:
    nb = notebook(home_root / "nbs" / "a.ipynb", "print(1)")
    other = notebook(home_root / "other" / "a.ipynb", "print(2)")
    with pytest.raises(TaskInvalid, match="the notebook's own name 'a.ipynb'"):
        _checked([Task.notebook(nb, inputs=[other])])


def test_a_long_task_name_is_cut_to_a_folders_name_and_runs(home_root: Path) -> None:
    nb = notebook(home_root / "nbs" / "a.ipynb", "print(1)")
    first, second = _checked([Task.notebook(nb, name="n" * 300),
                              Task.notebook(nb, name="n" * 300)])
    assert first.name == "n" * 100 and second.name == "n" * 100 + "-2"
    summary = run_task(first, settings(home_root))
    assert summary.ok, (summary.detail, summary.error)


def test_a_task_file_nested_past_pythons_stack_is_refused(tmp_path: Path) -> None:
    for content in ("[" * 100_000, '{"task": ' + "[" * 100_000 + "\n"):
        path = tmp_path / "deep.jsonl"
        path.write_text(content)
        with pytest.raises(TaskInvalid, match="is not JSON"):
            load_tasks(path)


# ---------------------------------------------------------------------- the folders


def test_workspaces_in_a_folder_a_task_copies_whole_are_refused_before_anything_starts(
        home_root: Path) -> None:
    """The workspaces (or records) folder being the notebooks' folder, or an input: each
    task would copy the batch's own folders, other tasks' workspaces and records, into its
    workspace, and into itself without end."""
    nbs = home_root / "nbs"
    notebook(nbs / "a.ipynb", "print(1)")
    notebook(nbs / "b.ipynb", "print(2)")
    tasks = [Task.notebook(nbs / "a.ipynb"), Task.notebook(nbs / "b.ipynb")]
    with pytest.raises(TaskInvalid, match="that is the batch's workspaces folder"):
        run_batch(tasks, workspaces=nbs)
    with pytest.raises(TaskInvalid, match="that is the batch's records folder"):
        run_batch(tasks, workspaces=home_root / "ws", records=nbs)
    (home_root / "data").mkdir()
    with pytest.raises(TaskInvalid, match="that is the batch's workspaces folder"):
        run_batch([Task.notebook(nbs / "a.ipynb", inputs=[home_root / "data"])],
                  workspaces=home_root / "data")
    assert sorted(p.name for p in nbs.iterdir()) == ["a.ipynb", "b.ipynb"]
    assert not (home_root / "ws").exists()


def test_bad_folders_to_the_command_are_one_error_line_and_leave_nothing(
        home_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nbs = home_root / "nbs"
    good = notebook(nbs / "good.ipynb", "print(1)")
    afile = home_root / "afile"
    afile.write_text("not a folder")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"tcp://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening
        before = descendants(os.getpid())
        cases = [
            (["--workspaces", str(afile)], 2, f"the workspaces folder {afile} is a file"),
            (["--workspaces", str(afile / "sub")], 2, "cannot make the workspaces folder"),
            (["--workspaces", str(nbs)], 2, "that is the batch's workspaces folder"),
            (["--workspaces", str(home_root / "w"), "--records", str(home_root / "w")], 2,
             "the records folder is the workspaces folder"),
            (["--workspaces", "/"], 2, "the workspaces folder cannot be the file system's root"),
            (["--records", "/"], 2, "the records folder cannot be the file system's root"),
            (["--workspaces", str(home_root / "ws"), "--scheduler", nobody,
              "--connect-timeout", "1"], 1, f"no Dask scheduler answered at {nobody}"),
        ]
        for argv, exit_code, says in cases:
            code = main(["batch", str(good), *argv])
            out, err = capsys.readouterr()
            assert code == exit_code, (argv, out, err)
            assert err.startswith("host-kernel batch: error: "), err
            assert len(err.splitlines()) == 1 and says in err, (argv, err)
            assert out == ""
        assert descendants(os.getpid()) - before == set()
    # Nothing made: no workspaces folder left empty by a scheduler nobody answered at.
    assert sorted(p.name for p in home_root.iterdir()) == ["afile", "nbs"]
    assert sorted(p.name for p in nbs.iterdir()) == ["good.ipynb"]



def test_a_refused_batch_leaves_no_workspaces_folder_of_its_own(
        home_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where run_batch makes its own
    nb = notebook(home_root / "nbs" / "a.ipynb", "print(1)")
    with pytest.raises(BatchError, match="file system's root"):
        run_batch([Task.notebook(nb)], records="/")
    assert list(tmp_path.iterdir()) == []
