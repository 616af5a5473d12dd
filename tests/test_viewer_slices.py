"""The viewer's artifact page shows the artifact's slice and its latest re-derivation, and
serves the slice as a script and a notebook: over a real Host's record, whose artifacts a
real re-derivation (a second kernel) reproduced or not, read by plain HTTP on loopback."""

from __future__ import annotations

import hashlib
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest
from markupsafe import escape

from host_kernel import Host
from host_kernel.lineage.slice import compute_slice
from host_kernel.store.verified import open_verified
from host_kernel.viewer import ViewerServer

DATA = "1,a\n2,b\n3,c\n"
SCRIPT = "<script>alert(1)</script>"

CELLS = {
    "imports": "import csv",
    "label": f"label = {SCRIPT!r}",
    "unrelated": "print('not part of any slice')",
    "mid": "rows = list(csv.reader(open('data.csv')))\n"
           "with open('mid.csv', 'w') as f:\n"
           "    f.write('\\n'.join(r[0] for r in rows))",
    "out": "total = sum(int(x) for x in open('mid.csv').read().split())\n"
           "open('out.txt', 'w').write(label + str(total))\n"
           "host.save_artifact('out.txt')",
    "stamp": "import time\nopen('stamp.txt', 'w').write(str(time.time()))\n"
             "host.save_artifact('stamp.txt')",
    "never": "open('never.txt', 'w').write('made once')\nhost.save_artifact('never.txt')",
}


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A record whose ``out.txt`` is made from ``data.csv`` through ``mid.csv`` and was
    re-derived twice (reproduced, then reproduced again with ``minimal``), whose
    ``stamp.txt`` holds the time and re-derived to other bytes, and whose ``never.txt``
    was never re-derived."""
    root = tmp_path_factory.mktemp("viewer-slices")
    ws, rec = root / "ws", root / "record"
    ws.mkdir()
    (ws / "data.csv").write_text(DATA)
    cells: dict[str, str] = {}
    with Host(ws, record_dir=rec) as host:
        for name, code in CELLS.items():
            obs = host.execute(code)
            assert obs.status == "ok", obs.text
            cells[name] = obs.cell_id
        with open_verified(rec) as ledger:
            ids = {r["filename"]: r["artifact_id"]
                   for r in ledger.query("SELECT filename, artifact_id FROM artifacts")}
            session = ledger.query("SELECT session FROM sessions")[0][0]
        assert host.rederive(ids["out.txt"]).outcome == "reproduced"
        again = host.rederive(ids["out.txt"], minimal=True)
        assert again.outcome == "reproduced" and again.not_needed == [], again.line()
        assert host.rederive(ids["stamp.txt"]).outcome == "differs"
    return {"dir": rec, "ids": ids, "cells": cells, "session": session}


@pytest.fixture(scope="module")
def viewer(record: dict[str, Any]) -> Iterator[ViewerServer]:
    with ViewerServer(record["dir"]) as server:
        yield server


def _client(server: ViewerServer) -> httpx.Client:
    """A client with the cookie a first visit is given, so the pages' links carry no token
    (they do when the request's URL has it)."""
    return httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30,
                        cookies={f"host_kernel_view_{server.port}": server.token})


def _section(page: str, anchor: str) -> str:
    """The page from the heading ``id=anchor`` to the next heading."""
    start = page.index(f'<h2 id="{anchor}">')
    end = page.find("<h2", start + 1)
    return page[start:end if end > 0 else len(page)]


def _slice_cells(page: str) -> list[str]:
    return re.findall(r'<li class="cell slice-cell[^"]*" data-cell-id="([^"]+)"',
                      _section(page, "slice"))


# --------------------------------------------------------------------------- the slice


def test_the_artifact_page_lists_the_slice_cells_in_order_with_why_and_links(
        record: dict[str, Any], viewer: ViewerServer) -> None:
    cells = record["cells"]
    with _client(viewer) as client:
        page = client.get(f"/artifact/{record['ids']['out.txt']}").text
        session_page = client.get(f"/session/{record['session']}").text
    part = _section(page, "slice")
    assert "(4 of 5 cells)" in part
    assert _slice_cells(page) == [cells["imports"], cells["label"], cells["mid"], cells["out"]]
    assert cells["unrelated"] not in part
    assert "saves the artifact" in part and "wrote mid.csv" in part and "defines label" in part
    for name in ("imports", "label", "mid", "out"):
        anchor = f"cell-{cells[name]}"
        assert f'href="/session/{record["session"]}#{anchor}"' in part
        assert f'id="{anchor}"' in session_page  # the link lands on the cell
    assert str(escape("open('mid.csv')")) in part  # the code, in its <pre>


def test_the_slice_names_its_inputs_by_path_and_short_sha256(
        record: dict[str, Any], viewer: ViewerServer) -> None:
    digest = hashlib.sha256(DATA.encode()).hexdigest()
    with _client(viewer) as client:
        part = _section(client.get(f"/artifact/{record['ids']['out.txt']}").text, "slice")
    inputs = re.search(r'<ul class="slice-inputs">(.*?)</ul>', part, re.DOTALL)
    assert inputs is not None
    assert "<code>data.csv</code>" in inputs.group(1)
    assert f"{digest[:12]}…" in inputs.group(1) and f'title="sha256 {digest}"' in inputs.group(1)
    assert "mid.csv" not in inputs.group(1)  # made by the slice, not given to it


def test_html_in_a_cell_is_escaped_in_the_slices_code(
        record: dict[str, Any], viewer: ViewerServer) -> None:
    with _client(viewer) as client:
        page = client.get(f"/artifact/{record['ids']['out.txt']}").text
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/viewer.js" defer>']
    assert f"<pre class=\"code\">label = {escape(repr(SCRIPT))}</pre>" in page


def test_the_slice_downloads_as_the_script_and_as_a_notebook(
        record: dict[str, Any], viewer: ViewerServer) -> None:
    aid = record["ids"]["out.txt"]
    with open_verified(record["dir"]) as ledger:
        sliced = compute_slice(ledger, aid)
    with _client(viewer) as client:
        page = client.get(f"/artifact/{aid}").text
        script = client.get(f"/artifact/{aid}/slice.py")
        notebook = client.get(f"/artifact/{aid}/slice.ipynb")
    assert f'href="/artifact/{aid}/slice.py"' in page
    assert f'href="/artifact/{aid}/slice.ipynb"' in page
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/x-python")
    assert script.headers["content-disposition"] == 'attachment; filename="out.txt.slice.py"'
    assert script.text == sliced.to_script()
    compile(script.text, "slice.py", "exec")
    assert notebook.status_code == 200
    assert notebook.headers["content-disposition"] == \
        'attachment; filename="out.txt.slice.ipynb"'
    nb = nbformat.reads(notebook.text, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.source for c in code] == [c.code for c in sliced.cells]
    assert [c.metadata["host_kernel"]["cell_id"] for c in code] == \
        [record["cells"][n] for n in ("imports", "label", "mid", "out")]


def test_slice_downloads_of_an_unknown_artifact_are_404(viewer: ViewerServer) -> None:
    with _client(viewer) as client:
        for path in ("/artifact/nope/slice.py", "/artifact/nope/slice.ipynb"):
            response = client.get(path)
            assert response.status_code == 404, path
            assert "no artifact 'nope'" in response.text


def test_a_refused_record_serves_no_slice(record: dict[str, Any], tmp_path: Path) -> None:
    copy = tmp_path / "record"
    shutil.copytree(record["dir"], copy)
    with sqlite3.connect(copy / "ledger.sqlite") as db:
        changed = db.execute("UPDATE events SET body = replace(body, 'not part of any slice', "
                             "'forged') WHERE kind = 'cell_started' "
                             "AND body LIKE '%not part of any slice%'").rowcount
    db.close()
    assert changed == 1
    aid = record["ids"]["out.txt"]
    with ViewerServer(copy) as server, _client(server) as client:
        page = client.get(f"/artifact/{aid}")
        script = client.get(f"/artifact/{aid}/slice.py")
    assert page.status_code == 409 and 'id="slice"' not in page.text
    assert script.status_code == 409 and script.text.startswith("refused: [")


# --------------------------------------------------------------------------- re-derivation


def test_the_latest_rederivation_is_shown_with_its_outcome_and_not_needed(
        record: dict[str, Any], viewer: ViewerServer) -> None:
    with _client(viewer) as client:
        part = _section(client.get(f"/artifact/{record['ids']['out.txt']}").text,
                        "rederivation")
    assert re.search(r'<span class="badge big good rederived" id="rederived-outcome">'
                     r'reproduced</span>', part)
    assert "the same sha256" in part
    assert "ran 4 of 5 cells" in part
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", part)  # when it ran
    # the second, minimal run is the latest: it says which inputs were not needed
    assert "not needed" in part and "every input was needed" in part
    assert "not re-derived" not in part


def test_a_rederivation_that_differs_shows_its_diff_and_hint(
        record: dict[str, Any], viewer: ViewerServer) -> None:
    with _client(viewer) as client:
        part = _section(client.get(f"/artifact/{record['ids']['stamp.txt']}").text,
                        "rederivation")
    assert re.search(r'class="badge big bad rederived"[^>]*>differs</span>', part)
    diff = re.search(r'<pre class="out text diff">(.*?)</pre>', part, re.DOTALL)
    assert diff is not None
    assert diff.group(1).startswith("--- expected stamp.txt\n+++ got stamp.txt")
    assert "hint: the difference looks like a timestamp" in part


def test_an_artifact_never_rederived_says_how_to(
        record: dict[str, Any], viewer: ViewerServer) -> None:
    aid = record["ids"]["never.txt"]
    with _client(viewer) as client:
        page = client.get(f"/artifact/{aid}").text
    part = _section(page, "rederivation")
    assert 'id="not-rederived"' in part and "not re-derived" in part
    assert f"<code>host-kernel rederive {aid}</code>" in part
    assert "rederived-outcome" not in part
    assert _slice_cells(page) == [record["cells"]["never"]]
    assert "(1 of 7 cells)" in page


def test_the_session_page_badges_each_artifact_with_its_latest_outcome(
        record: dict[str, Any], viewer: ViewerServer) -> None:
    with _client(viewer) as client:
        page = client.get(f"/session/{record['session']}").text
    badges = {aid: (kind, outcome) for kind, aid, outcome in re.findall(
        r'<a class="badge (\w+) rederived" href="/artifact/([^"#]+)#rederivation"[^>]*>'
        r'(\w+)</a>', page)}
    ids = record["ids"]
    assert badges == {ids["out.txt"]: ("good", "reproduced"),
                      ids["stamp.txt"]: ("bad", "differs")}


def test_the_lineage_graph_draws_the_file_to_file_derivation(
        record: dict[str, Any], viewer: ViewerServer) -> None:
    with _client(viewer) as client:
        page = client.get(f"/artifact/{record['ids']['out.txt']}").text
    svg = page[page.index("<svg"):page.index("</svg>")]
    edges = re.findall(r'<g class="edge" data-from="([^"]+)" data-to="([^"]+)"', svg)
    assert any(src.startswith("file:mid.csv@") and dst.startswith("file:data.csv@")
               for src, dst in edges), edges
