"""The viewer as a reviewer reads it (issue 31, viewer points 1 to 8), in a real headless
Chromium, over the record of a real Host: a notebook session whose first submission was
refused (its tests fail on the declared files; they passed in the workspace only through an
undeclared conftest.py) and whose second, after a fix, was accepted, with PNG, SVG, CSV, JSON
and Parquet artifacts, HTML outputs of different heights, and a second session beside it."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _browser import Browser
from test_viewer import SETTLED, _bare, _screenshot, start_browser

from host_kernel import Host
from host_kernel.lineage.graph import record_lineage
from host_kernel.store.verified import open_verified
from host_kernel.verify.checks import CHECKS
from host_kernel.viewer import ViewerServer

TEST_CMD = "python -m pytest -q tests"
SOURCES = {
    "pkg/__init__.py": "",
    "pkg/core.py": "def add(a, b):\n    return a - b\n",
    "tests/test_core.py": "from pkg.core import add\n\n\ndef test_add():\n"
                          "    assert add(1, 2) == 3\n\n\ndef test_add_zero():\n"
                          "    assert add(5, 0) == 5\n",
}
#: Makes the wrong add pass in the workspace; the Host's run, on the declared files, fails.
CHEAT = "import pkg.core\npkg.core.add = lambda a, b: a + b\n"
REQUEST = "Write pkg.core.add with its tests, and tabulate data.csv"
TALL_ROWS = 30
PARQUET = importlib.util.find_spec("pyarrow") is not None
SAVED = ("plot.png", "plot.svg", "params.json") + (("squares.parquet",) if PARQUET else ())


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    row = b"\x00" + b"\xd0\x30\x30" * width
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b""))


def _submit(evidence_cell: str) -> str:
    declared = {"source_files": list(SOURCES), "entry_points": ["pkg/core.py"],
                "architecture_summary": "pkg.core owns the arithmetic; tests/ checks it.",
                "test_evidence": [{"command": TEST_CMD, "producing_cell_id": evidence_cell}]}
    args = ", ".join(f"{k}={v!r}" for k, v in declared.items())
    return ("from host_kernel import SubmissionRefused\ntry:\n"
            f"    host.submit_output({{'files': ['pkg/core.py']}}, ['wrote pkg.core.add'], "
            f"task_status='completed', {args})\n"
            "    print('ACCEPTED')\nexcept SubmissionRefused as e:\n    print(e)\n")


def _workspace(ws: Path) -> None:
    ws.mkdir()
    for name in ("analysis.ipynb", "count.ipynb"):
        (ws / name).write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                           "nbformat_minor": 5}))
    (ws / "data.csv").write_text("name,value\nb,2\na,1\nc,3\n")
    (ws / "plot.png").write_bytes(_png(40, 20))
    (ws / "plot.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="90" '
                                 'height="30"><rect width="90" height="30" fill="teal"/>'
                                 '<script>alert(1)</script></svg>')
    (ws / "params.json").write_text('{"alpha":1,"names":["x","y"]}')
    if PARQUET:  # a Parquet preview is shown when pyarrow is installed
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"n": list(range(30)), "sq": [i * i for i in range(30)]}),
                       ws / "squares.parquet")


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("viewer-review")
    ws, rec = root / "ws", root / "record"
    _workspace(ws)
    cells: dict[str, str] = {}
    with Host(ws, mode="reusable_pipeline", request=REQUEST, record_dir=rec,
              notebook=str(ws / "analysis.ipynb")) as host:
        def run(name: str, code: str) -> str:
            obs = host.execute(code)
            assert obs.status == ("error" if name == "error" else "ok"), obs.text
            cells[name] = obs.cell_id
            return obs.text

        run("table", "r = host.bash('(head -1 data.csv; tail -n +2 data.csv | sort) > "
                     "table.csv')\nhost.save_artifact('table.csv')")
        run("saves", f"for f in {SAVED!r}:\n    host.save_artifact(f)")
        run("html", "from IPython.display import HTML, display\n"
                    f"display(HTML('<table id=\"tall\">' + ''.join(f'<tr><td>row {{i}}</td>"
                    f"</tr>' for i in range({TALL_ROWS})) + '</table>'))\n"
                    "display(HTML('<p id=\"short\">one short line</p>'))")
        run("error", "1/0")
        writes = "\n".join(f"host.write_file({p!r}, {c!r})" for p, c in SOURCES.items())
        saves = "\n".join(f"host.save_artifact({p!r})" for p in SOURCES)
        run("build", f"{writes}\nhost.write_file('conftest.py', {CHEAT!r})\n{saves}")
        assert "EXIT 0" in run("tests1", f"r = host.bash({TEST_CMD!r})\n"
                                         f"print('EXIT', r.exit_status)")
        assert "reproduction_failed" in run("submit1", _submit(cells["tests1"]))
        run("fix", "import os\nos.remove('conftest.py')\n"
                   "host.edit_file('pkg/core.py', 'a - b', 'a + b')\n"
                   "host.save_artifact('pkg/core.py')")
        assert "EXIT 0" in run("tests2", f"r = host.bash({TEST_CMD!r})\n"
                                         f"print('EXIT', r.exit_status)")
        assert "ACCEPTED" in run("submit2", _submit(cells["tests2"]))
    with Host(ws, request="Count the rows of data.csv", record_dir=rec,
              notebook=str(ws / "count.ipynb")) as other:
        assert other.execute("print(3)").status == "ok"
    with open_verified(rec) as ledger:
        sessions = [r[0] for r in ledger.query("SELECT session FROM sessions ORDER BY started")]
        artifacts = {r["filename"]: r["artifact_id"] for r in ledger.query(
            "SELECT filename, artifact_id FROM artifacts ORDER BY seq")}
        submissions = [r[0] for r in ledger.query(
            "SELECT submission_id FROM submissions ORDER BY seq")]
        receipts = {r["cell_id"]: r["receipt_id"] for r in ledger.query(
            "SELECT cell_id, receipt_id FROM receipts")}
        bodies = [json.loads(r[0]) for r in ledger.query(
            "SELECT body FROM submissions ORDER BY seq")]
    return {"dir": rec, "ws": ws, "session": sessions[0], "other": sessions[1],
            "cells": cells, "artifacts": artifacts, "refused": submissions[0],
            "accepted": submissions[1], "receipts": receipts, "bodies": bodies}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with start_browser() as b:
        yield b


@pytest.fixture(scope="module")
def viewer(record: dict[str, Any]) -> Iterator[ViewerServer]:
    with ViewerServer(record["dir"]) as server:
        yield server


def _goto(browser: Browser, viewer: ViewerServer, path: str) -> None:
    """Open ``path`` with the token in its URL, as the printed URL does."""
    base, _, fragment = path.partition("#")
    joint = "&" if "?" in base else "?"
    browser.goto(f"http://127.0.0.1:{viewer.port}{base}{joint}token={viewer.token}"
                 + (f"#{fragment}" if fragment else ""))


def _cells_shown(browser: Browser) -> list[str]:
    return list(browser.evaluate("[...document.querySelectorAll('li.cell')]"
                                 ".map(c => c.dataset.cellId)"))


# --------------------------------------------------------------------------- 1: the list


def test_the_sessions_list_tells_sessions_apart_by_notebook_workspace_request_and_duration(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    _goto(browser, viewer, "/")
    rows = browser.evaluate(
        "[...document.querySelectorAll('tr[data-session]')].map(r => ({id: r.dataset.session,"
        " status: r.dataset.status, notebook: r.querySelector('.notebook').innerText,"
        " title: r.querySelector('.notebook').title,"
        " workspace: r.querySelector('.workspace').innerText,"
        " request: r.querySelector('td.request').innerText, duration: r.cells[4].innerText}))")
    assert [r["id"] for r in rows] == [record["other"], record["session"]]  # newest first
    main, other = rows[1], rows[0]
    assert (main["notebook"], other["notebook"]) == ("analysis.ipynb", "count.ipynb")
    digest = hashlib.sha256((record["ws"] / "analysis.ipynb").read_bytes()).hexdigest()
    assert main["title"] == f"analysis.ipynb · sha256 {digest}"
    assert main["workspace"] == other["workspace"] == "in ws"
    assert main["request"] == REQUEST and other["request"] == "Count the rows of data.csv"
    assert re.fullmatch(r"\d+\.\d+ s|\d+ min \d+ s", main["duration"]), main["duration"]
    assert (main["status"], other["status"]) == ("accepted", "no submission")
    _screenshot(browser, "sessions")
    # The session's own page names them too, above its cells.
    _goto(browser, viewer, f"/session/{record['session']}")
    facts = browser.evaluate("document.querySelector('dl.facts').innerText")
    assert "analysis.ipynb" in facts and REQUEST in facts and str(record["ws"]) in facts


# --------------------------------------------------------------------------- 2: whole output


def test_a_refused_checks_pytest_output_is_shown_whole_with_its_lines(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    message = next(c["message"] for c in record["bodies"][0]["verdict"]["checks"]
                   if c["code"] == "reproduction_failed")
    assert "\n>       assert add(1, 2) == 3\nE       assert -1 == 3" in message
    no_scrollbar = ("[...document.querySelectorAll(SEL)].every(e => e.scrollHeight <= "
                    "e.clientHeight + 1 && e.scrollWidth <= e.clientWidth + 1)")
    _goto(browser, viewer, f"/verdict/{record['refused']}")
    shown = browser.evaluate(
        "(r => r.querySelector('.message').innerText + '\\n' + "
        "r.querySelector('pre.message').innerText)"
        "(document.querySelector('tr.check[data-code=reproduction_failed]'))")
    assert shown.rstrip() == message.rstrip()
    assert browser.evaluate(no_scrollbar.replace("SEL", "'pre.message, tr.check'"))
    _screenshot(browser, "verdict")
    # The card under the submitting cell on the session page: the same, not cut with "…".
    _goto(browser, viewer, f"/session/{record['session']}")
    card = f"div.verdict-card[data-submission='{record['refused']}']"
    text = browser.evaluate(f"document.querySelector(\"{card}\").innerText")
    assert "reproduction_failed" in text and "test_undeclared" in text
    for line in message.splitlines():
        assert line.strip() in text
    assert browser.evaluate(no_scrollbar.replace("SEL", f'"{card}, {card} *"'))


# --------------------------------------------------------------------------- 3: what it rests on


def test_a_verdict_links_the_bytes_cell_receipt_and_reproduction_it_checked(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    body = record["bodies"][1]
    seen = body["seen"]
    _goto(browser, viewer, f"/verdict/{record['accepted']}")
    files = browser.evaluate(
        "[...document.querySelectorAll('ul.source-files li')].map(li => [li.dataset.path, "
        "li.querySelector('a.source-artifact').getAttribute('href'), "
        "li.querySelector('a.source-bytes').getAttribute('href'), "
        "li.querySelector('a.source-bytes').title])")
    assert [f[0] for f in files] == list(SOURCES)
    with open_verified(record["dir"]) as ledger:
        for path, page, raw, title in files:
            aid = _bare(page).removeprefix("/artifact/")
            assert _bare(raw) == f"/artifact/{aid}/bytes"
            assert title == f"sha256 {seen[path]}"
            row = ledger.query("SELECT sha256, source_path FROM artifacts WHERE artifact_id = ?",
                               (aid,))[0]
            assert (row["sha256"], row["source_path"]) == (seen[path], path)
    cell, receipt, reproduction = browser.evaluate(
        "(li => ['a.evidence-cell', 'a.evidence-receipt', 'a.evidence-reproduction']"
        ".map(s => li.querySelector(s).getAttribute('href')))"
        "(document.querySelector('ul.test-evidence li'))")
    tests2 = record["cells"]["tests2"]
    assert _bare(cell) == f"/session/{record['session']}#cell-{tests2}"
    assert _bare(receipt) == f"/receipt/{record['receipts'][tests2]}"
    assert reproduction == "#reproduction-1"
    # The reproduction names the tree it ran on by the digest the record holds.
    digest = body["verdict"]["reproduction"][0]["tree_digest"]
    assert browser.evaluate("document.querySelector('#reproduction-1 details.tree code')"
                            ".title") == digest
    # The links land: the cell on its session's page, the command on the receipt's.
    browser.goto(browser.evaluate("document.querySelector('a.evidence-cell').href"))
    assert browser.evaluate(f"!!document.getElementById('cell-{tests2}')")
    _goto(browser, viewer, _bare(receipt))
    assert TEST_CMD in browser.evaluate("document.querySelector('.receipt-head').innerText")


def test_between_the_refused_and_the_accepted_submission_the_declared_files_diff_is_shown(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    _goto(browser, viewer, f"/verdict/{record['accepted']}")
    diffs = browser.evaluate(
        "[...document.querySelectorAll('section.file-diff')].map(s => [s.dataset.path, "
        "s.dataset.change, [...s.querySelectorAll('pre.diff span')].map(x => [x.className, "
        "x.innerText, getComputedStyle(x).backgroundColor])])")
    assert [d[:2] for d in diffs] == [["pkg/core.py", "changed"]]
    lines = {(kind, text): colour for kind, text, colour in diffs[0][2]}
    assert lines[("del", "-    return a - b")] == "rgb(255, 235, 233)"  # red
    assert lines[("add", "+    return a + b")] == "rgb(230, 255, 236)"  # green
    assert ("head", "--- a/pkg/core.py") in lines and ("ctx", " def add(a, b):") in lines
    assert browser.evaluate("[...document.querySelectorAll('p.unchanged code')]"
                            ".map(c => c.innerText)") == ["pkg/__init__.py", "tests/test_core.py"]
    previous = browser.evaluate("document.querySelector('#changes a').getAttribute('href')")
    assert _bare(previous) == f"/verdict/{record['refused']}"
    _screenshot(browser, "diff")
    # And the refused verdict points on to the one that was accepted.
    _goto(browser, viewer, f"/verdict/{record['refused']}")
    later = browser.evaluate("document.getElementById('later').getAttribute('href')")
    assert _bare(later) == f"/verdict/{record['accepted']}"


# --------------------------------------------------------------------------- 4: rules, not codes


def test_passing_checks_read_as_the_rules_they_hold_with_the_code_small(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    _goto(browser, viewer, f"/verdict/{record['accepted']}")
    rows = browser.evaluate(
        "[...document.querySelectorAll('tr.check')].map(r => [r.className, r.dataset.code, "
        "r.querySelector('td.mark').innerText, r.querySelector('td.rule').innerText, "
        "r.querySelectorAll('td.rule code').length, "
        "parseFloat(getComputedStyle(r.querySelector('td.code-cell code')).fontSize), "
        "parseFloat(getComputedStyle(r.querySelector('td.rule')).fontSize)])")
    assert len(rows) == len(record["bodies"][1]["verdict"]["checks"]) > 10
    for klass, code, mark, rule, codes_in_rule, small, text in rows:
        assert (klass, mark) == ("check ok", "✓")
        assert rule == CHECKS[code] and codes_in_rule == 0  # the rule, not its code
        assert small < text
    page = browser.evaluate("document.body.innerText")
    assert "✓ source_missing" not in page and "✓ output_not_json" not in page


# --------------------------------------------------------------------------- 5: the artifact page


def test_the_artifact_page_previews_a_png_an_svg_a_csv_and_json(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    ids = record["artifacts"]
    image = ("(i => [i.naturalWidth, i.naturalHeight, i.getAttribute('src')])"
             "(document.querySelector('.preview img.artifact-image'))")
    _goto(browser, viewer, f"/artifact/{ids['plot.png']}")
    width, height, src = browser.evaluate(image)
    assert (width, height, _bare(src)) == (40, 20, f"/artifact/{ids['plot.png']}/image")
    _goto(browser, viewer, f"/artifact/{ids['plot.svg']}")
    width, height, src = browser.evaluate(image)
    assert (width, height) == (90, 30)  # drawn as an image: its script never runs
    assert browser.evaluate("document.querySelectorAll('.preview svg, .preview script')"
                            ".length") == 0
    _goto(browser, viewer, f"/artifact/{ids['table.csv']}")
    table = browser.evaluate(
        "(t => [[...t.querySelectorAll('th')].map(c => c.innerText), [...t.querySelectorAll("
        "'tbody tr')].map(r => [...r.cells].map(c => c.innerText))])"
        "(document.querySelector('.preview table.preview-table'))")
    assert table == [["name", "value"], [["a", "1"], ["b", "2"], ["c", "3"]]]
    assert "all 3 rows" in browser.evaluate("document.querySelector('.preview').innerText")
    _screenshot(browser, "artifact")
    _goto(browser, viewer, f"/artifact/{ids['params.json']}")
    assert browser.evaluate("document.querySelector('.preview pre').innerText") == \
        json.dumps({"alpha": 1, "names": ["x", "y"]}, indent=2)


def test_a_parquet_artifact_is_previewed_as_the_head_of_its_table(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    if not PARQUET:
        pytest.skip("a Parquet preview needs pyarrow, which is not installed")
    _goto(browser, viewer, f"/artifact/{record['artifacts']['squares.parquet']}")
    header, rows, note = browser.evaluate(
        "(p => [[...p.querySelectorAll('th')].map(c => c.innerText), [...p.querySelectorAll("
        "'tbody tr')].map(r => [...r.cells].map(c => c.innerText)), p.innerText])"
        "(document.querySelector('.preview'))")
    assert header == ["n", "sq"] and rows[:3] == [["0", "0"], ["1", "1"], ["2", "4"]]
    assert len(rows) == 20 and "20 of 30 rows" in note


def test_an_artifacts_image_is_served_inline_only_for_images_under_a_sandbox(
        viewer: ViewerServer, record: dict[str, Any]) -> None:
    ids = record["artifacts"]
    with httpx.Client(base_url=f"http://127.0.0.1:{viewer.port}",
                      params={"token": viewer.token}, timeout=30) as client:
        svg = client.get(f"/artifact/{ids['plot.svg']}/image")
        assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
        assert svg.content == (record["ws"] / "plot.svg").read_bytes()
        policies = svg.headers.get_list("content-security-policy")
        assert any(p.split(";")[-1].strip() == "sandbox" for p in policies), policies
        assert svg.headers["x-content-type-options"] == "nosniff"
        assert "content-disposition" not in svg.headers
        assert client.get(f"/artifact/{ids['table.csv']}/image").status_code == 404


def test_the_lineage_has_a_legend_whole_cell_labels_and_nodes_that_link_to_their_pages(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    graph = record_lineage(record["dir"], record["artifacts"]["table.csv"])
    methods = sorted(e.method for e in graph.edges if e.method)
    assert methods, graph.edges
    _goto(browser, viewer, f"/artifact/{record['artifacts']['table.csv']}")
    legend = browser.evaluate("[...document.querySelectorAll('dl.legend-methods dt')]"
                              ".map(d => d.innerText)")
    for method in set(methods):
        assert f"{method} × {methods.count(method)}" in legend
    assert {"traced", "def-use", "receipt"} <= {d.split(" ")[0] for d in legend}
    nodes = browser.evaluate(
        "[...document.querySelectorAll('figure.lineage svg g.node')].map(g => [g.dataset.kind,"
        " [...g.querySelectorAll('text')].pop().textContent,"
        " g.parentNode.tagName === 'a' ? g.parentNode.getAttribute('href') : null])")
    table = record["cells"]["table"]
    cells = [n for n in nodes if n[0] == "cell"]
    assert cells == [["cell", f"cell {table}",
                      f"/session/{record['session']}?token={viewer.token}#cell-{table}"]]
    receipts = [n for n in nodes if n[0] == "receipt"]
    assert [_bare(n[2]) for n in receipts] == [f"/receipt/{record['receipts'][table]}"]
    # Following the cell's node lands on the cell.
    browser.goto(f"http://127.0.0.1:{viewer.port}{cells[0][2]}")
    assert browser.evaluate(f"!!document.getElementById('cell-{table}')")


# --------------------------------------------------------------------------- 6: the receipt page


def test_the_receipt_page_leads_with_the_command_and_says_what_it_read_and_changed_in_words(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    rid = record["receipts"][record["cells"]["table"]]
    with open_verified(record["dir"]) as ledger:
        body = json.loads(ledger.query("SELECT body FROM receipts WHERE receipt_id = ?",
                                       (rid,))[0][0])
    _goto(browser, viewer, f"/receipt/{rid}")
    head, facts, first_fact, command_top = browser.evaluate(
        "[document.querySelector('.receipt-head').innerText, "
        "document.querySelector('dl.facts').innerText, "
        "document.querySelector('dl.facts').getBoundingClientRect().top, "
        "document.querySelector('.receipt-head').getBoundingClientRect().top]")
    assert head.startswith("$ (head -1 data.csv;") and "exit 0" in head
    assert command_top < first_fact  # the command and its outcome before the hashes
    for repr_ in ("False", "True", "None", "[]", "{}"):
        assert not re.search(rf"(^|\s){re.escape(repr_)}($|\s)", facts), (repr_, facts)
    assert re.search(r"PATH differs from launch\s+no", facts)
    changed = browser.evaluate("[...document.querySelectorAll('ul.changes li')]"
                               ".map(l => l.innerText)")
    assert any("created" in c and "table.csv" in c for c in changed)
    reads = browser.evaluate("[...document.querySelectorAll('ul.reads li')].map(l => l.innerText)")
    if body.get("traced"):
        assert "data.csv" in reads
    else:
        assert reads == [] and "not traced" in browser.evaluate("document.body.innerText")
    _screenshot(browser, "receipt")


# --------------------------------------------------------------------------- 7: frames


def test_html_output_frames_are_as_tall_as_their_content(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    _goto(browser, viewer, f"/session/{record['session']}")
    browser.evaluate(SETTLED)
    frames = browser.evaluate(
        f"[...document.querySelectorAll('#cell-{record['cells']['html']} iframe.out.html')]"
        ".map(f => [f.getBoundingClientRect().height, "
        "f.contentDocument.documentElement.scrollHeight, "
        "f.contentDocument.documentElement.clientHeight])")
    assert len(frames) == 2
    for outer, content, inner in frames:
        assert content <= inner + 1  # nothing scrolls inside the frame
        assert outer <= content + 6  # and no gap below it
    tall, short = frames
    assert tall[0] > TALL_ROWS * 15 and short[0] < 60
    _screenshot(browser, "session")


# --------------------------------------------------------------------------- 8: search, links


def test_a_sessions_cells_are_searched_and_filtered_by_status_and_what_they_hold(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    cells = record["cells"]
    every = [cells[n] for n in ("table", "saves", "html", "error", "build", "tests1",
                                "submit1", "fix", "tests2", "submit2")]
    expected = {
        "": every,
        "?kind=receipt": [cells[n] for n in ("table", "tests1", "tests2")],
        "?kind=submission": [cells["submit1"], cells["submit2"]],
        "?kind=artifact": [cells[n] for n in ("table", "saves", "build", "fix")],
        "?status=error": [cells["error"]],
        "?q=conftest": [cells[n] for n in ("build", "submit1", "fix")],  # code, output
        "?q=%22assert+-1+%3D%3D+3%22": [cells["submit1"]],  # a phrase, in an output
        "?q=AssertionError+test_add": [cells["submit1"]],  # words, in an output
        f"?q={cells['html']}": [cells["html"]],  # by id
        "?q=conftest&kind=receipt": [],
    }
    for query, shown in expected.items():
        _goto(browser, viewer, f"/session/{record['session']}{query}")
        assert _cells_shown(browser) == shown, query
    heading = browser.evaluate("document.getElementById('cells').innerText")
    assert heading == f"Cells (0 of {len(every)})"
    assert browser.evaluate("document.getElementById('no-cells').innerText") == "No cell matches."


def test_sessions_are_searched_and_filtered_by_status_and_kind(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    main, other = record["session"], record["other"]
    expected = {"?q=count.ipynb": [other], "?q=tabulate+pkg.core": [main],
                "?status=accepted": [main], "?status=no+submission": [other],
                "?kind=reusable_pipeline": [main], "?kind=api": [other, main],
                "?status=refused": [], f"?q={main[:8]}": [main]}
    for query, shown in expected.items():
        _goto(browser, viewer, f"/{query}")
        assert browser.evaluate("[...document.querySelectorAll('tr[data-session]')]"
                                ".map(r => r.dataset.session)") == shown, query
    assert browser.evaluate("document.getElementById('no-sessions') === null")


def test_links_and_the_search_form_work_with_the_token_in_the_url_alone(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    # In the browser, with its cookie cleared before each step: a link, then the search form.
    _goto(browser, viewer, "/")
    browser.call("Network.clearBrowserCookies")
    link = browser.evaluate(f"document.querySelector('tr[data-session=\"{record['session']}\"]"
                            f" a[href^=\"/session/\"]').href")
    browser.goto(link)
    assert browser.evaluate(f"!!document.getElementById('cell-{record['cells']['table']}')")
    browser.call("Network.clearBrowserCookies")
    browser.evaluate("(f => { f.q.value = 'conftest'; f.submit(); })"
                     "(document.querySelector('form.search'))")
    browser.wait_event("Page.loadEventFired")
    assert _cells_shown(browser) == [record["cells"][n] for n in ("build", "submit1", "fix")]
    assert browser.evaluate("new URL(location.href).searchParams.get('token')") == viewer.token
    # Over plain HTTP with no cookie at all: every link of every page reached from the list.
    seen: set[str] = set()
    todo = [f"/?token={viewer.token}"]
    while todo:
        url = todo.pop()
        response = httpx.get(f"http://127.0.0.1:{viewer.port}{url}", timeout=30)
        assert response.status_code == 200, url
        seen.add(url)
        if not response.headers["content-type"].startswith("text/html") or len(seen) > 60:
            continue
        for href in re.findall(r'(?:href|src)="(/[^"#]*)', response.text):
            href = href.replace("&amp;", "&")
            assert f"token={viewer.token}" in href, (url, href)
            if href not in seen and href not in todo and "/static/" not in href:
                todo.append(href)
    assert len(seen) > 20
