"""Export: a recorded session as an nbformat 4.5 notebook with the Host's cell ids."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from host_kernel import Host, RecordError
from host_kernel.cli import main
from host_kernel.export import export_notebook

CELLS = {
    "print": 'print("hello")',
    "receipt": 'host.write_file("data/a.csv", "x\\n1\\n2\\n")\nr = host.bash("wc -l data/a.csv")',
    "artifact": 'art = host.save_artifact("data/a.csv")\nart.artifact_id',
    "error": "1 / 0",
    "display": ("from IPython.display import HTML, Markdown, display\n"
                "display(HTML('<b>bold</b>'))\ndisplay(Markdown('*md*'))"),
    "json": "from IPython.display import JSON\ndisplay(JSON({'a': [1, 2]}))",
}


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Default record folders go under this module's own state folder, not ~/.local/state."""
    home = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(home))
        yield home


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def recorded(workspace: Path) -> Iterator[tuple[Path, dict[str, str], str]]:
    """One real session, with a receipt, an artifact, an error and rich outputs."""
    ids: dict[str, str] = {}
    with Host(workspace) as host:
        for name, code in CELLS.items():
            ids[name] = host.execute(code, timeout=30).cell_id
        session = host.session_id
    yield host.record_dir, ids, session


def _copy(record: Path, to: Path) -> Path:
    """A copy of the record's ledger and key, to tamper with."""
    to.mkdir()
    for name in ("ledger.sqlite", "record.key"):
        shutil.copy2(record / name, to / name)
    return to


def test_export_validates_as_nbformat_4_5(recorded: tuple[Path, dict[str, str], str]) -> None:
    record, _, _ = recorded
    nb = export_notebook(record)
    nbformat.validate(nb)
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    # and it survives a round trip through the file format
    again = nbformat.reads(nbformat.writes(nb), as_version=4)
    nbformat.validate(again)


def test_exported_cell_ids_are_the_host_ids_in_order(
        recorded: tuple[Path, dict[str, str], str]) -> None:
    record, ids, _ = recorded
    nb = export_notebook(record)
    assert [c.id for c in nb.cells] == list(ids.values())
    assert [c.source for c in nb.cells] == list(CELLS.values())
    assert [c.execution_count for c in nb.cells] == list(range(1, len(CELLS) + 1))


def test_cell_metadata_holds_generation_status_receipts_and_artifacts(
        recorded: tuple[Path, dict[str, str], str]) -> None:
    record, ids, _ = recorded
    cells = {c.id: c for c in export_notebook(record).cells}
    receipt_cell = cells[ids["receipt"]].metadata["host_kernel"]
    assert receipt_cell["generation"] == 1 and receipt_cell["status"] == "ok"
    [receipt] = receipt_cell["receipts"]
    assert receipt["command"] == "wc -l data/a.csv" and receipt["exit_status"] == 0
    assert receipt["receipt_id"]
    [artifact] = cells[ids["artifact"]].metadata["host_kernel"]["artifacts"]
    assert artifact["filename"] == "a.csv" and len(artifact["sha256"]) == 64
    assert cells[ids["artifact"]].outputs[0]["data"]["text/plain"].strip("'") == \
        artifact["artifact_id"]
    assert cells[ids["error"]].metadata["host_kernel"]["status"] == "error"
    assert cells[ids["print"]].metadata["host_kernel"]["frontend_cell_id"] is None


def test_recorded_outputs_are_kept(recorded: tuple[Path, dict[str, str], str]) -> None:
    record, ids, _ = recorded
    cells = {c.id: c for c in export_notebook(record).cells}
    assert cells[ids["print"]].outputs == [{"output_type": "stream", "name": "stdout",
                                            "text": "hello\n"}]
    [error] = cells[ids["error"]].outputs
    assert error["output_type"] == "error" and error["ename"] == "ZeroDivisionError"
    html, markdown = cells[ids["display"]].outputs
    assert html["data"]["text/html"] == "<b>bold</b>"
    assert markdown["data"]["text/markdown"] == "*md*"
    [js] = cells[ids["json"]].outputs
    assert js["data"]["application/json"] == {"a": [1, 2]}


def test_notebook_metadata_names_session_mode_and_kernelspec(
        recorded: tuple[Path, dict[str, str], str]) -> None:
    record, _, session = recorded
    meta = export_notebook(record).metadata
    assert meta["kernelspec"]["name"] == "host_kernel"
    assert meta["host_kernel"]["session"] == session
    assert meta["host_kernel"]["mode"] == "analysis_run"
    assert meta["host_kernel"]["armed"] is False
    assert meta["host_kernel"]["submissions"] == []


def test_export_refuses_stored_projections_that_disagree_with_the_events(
        recorded: tuple[Path, dict[str, str], str], tmp_path: Path) -> None:
    record, _, _ = recorded
    copy = _copy(record, tmp_path / "record")
    with sqlite3.connect(copy / "ledger.sqlite") as db:
        db.execute("UPDATE cells SET code = 'forged', outputs = '[]'")
    with pytest.raises(RecordError, match="disagree with the events") as refused:
        export_notebook(copy)
    assert refused.value.code == "projection_drift"
    assert "forged" not in str(refused.value)


def test_export_of_an_untouched_copy_equals_the_original(
        recorded: tuple[Path, dict[str, str], str], tmp_path: Path) -> None:
    record, _, _ = recorded
    copy = _copy(record, tmp_path / "record")
    assert export_notebook(copy) == export_notebook(record)


def test_export_refuses_a_record_whose_chain_is_broken(
        recorded: tuple[Path, dict[str, str], str], tmp_path: Path) -> None:
    record, _, _ = recorded
    copy = _copy(record, tmp_path / "record")
    with sqlite3.connect(copy / "ledger.sqlite") as db:
        db.execute("UPDATE events SET body = replace(body, 'hello', 'HELLO') "
                   "WHERE kind = 'cell_started'")
    with pytest.raises(RecordError, match="chain is broken") as refused:
        export_notebook(copy)
    assert refused.value.code == "chain_broken"


def test_export_of_an_unknown_session_is_refused(
        recorded: tuple[Path, dict[str, str], str]) -> None:
    with pytest.raises(RecordError, match="no session"):
        export_notebook(recorded[0], "not-a-session")


def test_export_cleans_outputs_nbformat_would_reject(tmp_path: Path) -> None:
    """Outputs recorded with keys or values the schema rejects still export and validate."""
    from host_kernel.store.ledger import SQLiteLedger

    outputs = [
        {"output_type": "display_data", "data": {"text/plain": {"not": "text"},
                                                 "application/vnd.x+json": {"ok": 1}},
         "metadata": {}, "transient": {"display_id": "d1"}},
        {"output_type": "stream", "name": "stdout", "text": "hi\n", "extra": 1},
        {"output_type": "execute_result", "data": {"text/plain": "2"}, "metadata": None,
         "execution_count": "2"},
        {"output_type": "something_else"},
        "not an output",
    ]
    with SQLiteLedger(tmp_path / "ledger.sqlite") as ledger:
        ledger.append("s1", "session_started", {"workdir": str(tmp_path), "mode": {}})
        ledger.append("s1", "cell_started", {"cell_id": "c1", "generation": 1, "code": "x"})
        ledger.append("s1", "cell_finished", {"cell_id": "c1", "status": "ok",
                                              "execution_count": 1, "outputs": outputs})
    nb = export_notebook(tmp_path)
    nbformat.validate(nb)
    display, stream, result = nb.cells[0].outputs
    assert "transient" not in display and json.loads(display["data"]["text/plain"]) == {
        "not": "text"}
    assert display["data"]["application/vnd.x+json"] == {"ok": 1}
    assert "extra" not in stream
    assert result["metadata"] == {} and result["execution_count"] is None


def test_cli_export_writes_a_notebook_and_names_a_session(
        recorded: tuple[Path, dict[str, str], str], workspace: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    record, ids, session = recorded
    out = tmp_path / "out.ipynb"
    # the workspace names its record (kept outside it)
    assert main(["export", str(workspace), "-o", str(out), "--session", session]) == 0
    nb = nbformat.read(out, as_version=4)
    nbformat.validate(nb)
    assert [c.id for c in nb.cells] == list(ids.values())
    capsys.readouterr()
    assert main(["export", str(record)]) == 0
    assert json.loads(capsys.readouterr().out)["metadata"]["host_kernel"]["session"] == session


def test_cli_export_refuses_a_missing_or_drifted_record_in_one_line(
        recorded: tuple[Path, dict[str, str], str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("host-kernel export: error: [record_missing]") and err.count("\n") == 1
    copy = _copy(recorded[0], tmp_path / "record")
    with sqlite3.connect(copy / "ledger.sqlite") as db:
        db.execute("UPDATE receipts SET exit_status = 9")
    assert main(["export", str(copy)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("host-kernel export: error: [projection_drift]") and "receipts " in err
