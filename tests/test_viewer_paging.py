"""The viewer at scale (issue 31, viewer point 8): a 10,000-cell session served two hundred
cells to a page and searched, sixty sessions listed fifty to a page, and every page read
from a projection verified once and kept only while every byte of the record is unchanged.

The record is written through the Host's own ledger writer (real SQLite, its hash chain,
MACs and projection) with the events a Host records, because running 10,000 cells through a
kernel would take minutes; it is read over loopback HTTP and in a headless Chromium."""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _browser import Browser
from test_viewer import _bare, _screenshot, start_browser

from host_kernel.store.ledger import RecordRefused, SQLiteLedger
from host_kernel.viewer import ViewerServer
from host_kernel.viewer.reads import VerifiedReads

BIG, SMALL = 10_000, 59
BIG_ID = "big-session"
#: Every this many cells of the big session fails; its submission is made from cell SUBMITTED.
FAILING_EVERY, SUBMITTED = 500, 4321


def _cell_events(session: str, index: int) -> list[tuple[str, dict[str, Any]]]:
    cell = f"{session}-{index:06d}"
    failed = session == BIG_ID and index % FAILING_EVERY == FAILING_EVERY - 1
    output = ({"output_type": "error", "ename": "ValueError", "evalue": f"bad {index}",
               "traceback": [f"ValueError: bad {index}"]} if failed else
              {"output_type": "stream", "name": "stdout", "text": f"line {index}\n"})
    return [("cell_started", {"cell_id": cell, "generation": 1,
                              "code": f"print('line', {index})"}),
            ("cell_finished", {"cell_id": cell, "generation": 1, "execution_count": index + 1,
                               "status": "error" if failed else "ok", "duration": 0.004,
                               "outputs": [output]})]


def _session_events(session: str, number: int, cells: int) -> list[tuple[str, dict[str, Any]]]:
    """A session as a Host records it: started (with the notebook exec would name), its
    cells, for some a submission from one of them, ended."""
    mode = "codebase_change" if number % 2 else "analysis_run"
    events = [("session_started", {"workdir": f"/work/ws-{number}", "request": f"task {number}",
                                   "mode": {"name": mode, "armed": bool(number % 2)},
                                   "front": "cli" if number % 3 else "api",
                                   "notebook": {"path": f"nb-{number}.ipynb", "sha256": "0" * 64}}),
              ("generation_started", {"generation": 1, "reason": "start"})]
    for index in range(cells):
        events += _cell_events(session, index)
    if session == BIG_ID or number % 4 == 0:
        cell = events[2 + 2 * min(SUBMITTED, cells - 1)][1]["cell_id"]
        events.append(("submission_verdict", {
            "submission_id": f"sub-{session}", "cell_id": cell, "accepted": number % 8 == 0,
            "verdict": {"checks": [], "mode": mode}, "submission": {}, "seen": {}}))
    return [*events, ("session_ended", {})]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("viewer-paging") / "record"
    folder.mkdir()
    with SQLiteLedger(folder / "ledger.sqlite") as ledger:
        sessions = [(BIG_ID, BIG)] + [(f"s{n:03d}", 1) for n in range(1, SMALL + 1)]
        for number, (session, cells) in enumerate(sessions):
            for kind, body in _session_events(session, number, cells):
                ledger.append(session, kind, body)
    return folder


@pytest.fixture(scope="module")
def viewer(record: Path) -> Iterator[ViewerServer]:
    with ViewerServer(record) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with start_browser() as b:
        yield b


def _get(viewer: ViewerServer, path: str) -> str:
    joint = "&" if "?" in path else "?"
    response = httpx.get(f"http://127.0.0.1:{viewer.port}{path}{joint}token={viewer.token}",
                         timeout=60)
    assert response.status_code == 200, (path, response.text[:500])
    return response.text


def _cells(page: str) -> list[str]:
    return re.findall(r'<li class="cell status-\w+" id="cell-([^"]+)"', page)


def _cell(index: int) -> str:
    return f"{BIG_ID}-{index:06d}"


# --------------------------------------------------------------------------- a session


def test_a_10000_cell_session_is_served_two_hundred_cells_to_a_page(
        viewer: ViewerServer) -> None:
    first = _get(viewer, f"/session/{BIG_ID}")
    assert _cells(first) == [_cell(i) for i in range(200)]
    assert "page 1 of 50" in first and "(1–200 of 10000)" in first
    assert first.count('<li class="generation">') == 1  # the kernel started on page 1
    middle = _get(viewer, f"/session/{BIG_ID}?page=22")
    assert _cells(middle) == [_cell(i) for i in range(4200, 4400)]
    assert '<li class="generation">' not in middle
    prev, nxt = (re.search(rf'<a rel="{rel}" href="([^"]+)"', middle) for rel in ("prev", "next"))
    assert prev and nxt
    assert _bare(prev.group(1).replace("&amp;", "&")) == f"/session/{BIG_ID}?page=21"
    assert _bare(nxt.group(1).replace("&amp;", "&")) == f"/session/{BIG_ID}?page=23"
    last = _get(viewer, f"/session/{BIG_ID}?page=50")
    assert _cells(last) == [_cell(i) for i in range(9800, 10000)] and 'rel="next"' not in last
    assert _cells(_get(viewer, f"/session/{BIG_ID}?page=999")) == _cells(last)  # the last
    assert _cells(_get(viewer, f"/session/{BIG_ID}?page=two")) == _cells(first)


def test_searching_a_10000_cell_session_pages_what_matches(viewer: ViewerServer) -> None:
    failed = _get(viewer, f"/session/{BIG_ID}?status=error")
    assert _cells(failed) == [_cell(i) for i in range(FAILING_EVERY - 1, BIG, FAILING_EVERY)]
    assert "Cells <span class=\"muted\">(20 of 10000)</span>" in failed
    assert 'class="pager"' not in failed  # one page holds them
    assert _cells(_get(viewer, f"/session/{BIG_ID}?q=line+4321")) == [_cell(4321)]
    assert _cells(_get(viewer, f"/session/{BIG_ID}?q=bad+4499")) == [_cell(4499)]
    held = _get(viewer, f"/session/{BIG_ID}?kind=submission")
    assert _cells(held) == [_cell(SUBMITTED)]
    # A search that keeps more than a page is paged, and the pager keeps the search.
    many = _get(viewer, f"/session/{BIG_ID}?q=line+1&page=2")
    assert "page 2 of " in many and len(_cells(many)) == 200
    assert re.search(r'rel="next" href="[^"]*q=line\+1', many)


def test_a_link_to_a_cell_names_the_page_it_is_on(viewer: ViewerServer) -> None:
    verdict = _get(viewer, f"/verdict/sub-{BIG_ID}")
    link = re.search(r"<dt>submitting cell</dt><dd><a href=\"([^\"]+)\"", verdict)
    assert link is not None
    href = _bare(link.group(1).replace("&amp;", "&"))
    page = SUBMITTED // 200 + 1
    assert href == f"/session/{BIG_ID}?page={page}#cell-{_cell(SUBMITTED)}"
    assert f'id="cell-{_cell(SUBMITTED)}"' in _get(viewer, f"/session/{BIG_ID}?page={page}")


def test_the_pager_is_followed_in_the_browser_with_the_token_in_its_links(
        viewer: ViewerServer, browser: Browser) -> None:
    browser.goto(f"http://127.0.0.1:{viewer.port}/session/{BIG_ID}?page=49&token={viewer.token}")
    assert browser.evaluate("document.querySelector('nav.pager .where').innerText") == \
        "page 49 of 50 (9601–9800 of 10000)"
    _screenshot(browser, "paging")
    browser.call("Network.clearBrowserCookies")  # the link alone must carry the token
    browser.goto(browser.evaluate("document.querySelector('a[rel=next]').href"))
    shown = browser.evaluate("[...document.querySelectorAll('li.cell')].map(c => c.dataset.cellId)")
    assert shown == [_cell(i) for i in range(9800, 10000)]


# --------------------------------------------------------------------------- the list


def test_sixty_sessions_are_listed_fifty_to_a_page_newest_first(viewer: ViewerServer) -> None:
    rows = [re.findall(r'<tr data-session="([^"]+)"', _get(viewer, f"/?page={n}"))
            for n in (1, 2)]
    assert [len(r) for r in rows] == [50, 10]
    listed = rows[0] + rows[1]
    assert listed == [f"s{n:03d}" for n in range(SMALL, 0, -1)] + [BIG_ID]
    assert "nb-7.ipynb" in _get(viewer, "/?q=nb-7.ipynb")
    accepted = re.findall(r'<tr data-session="([^"]+)" data-status="accepted"',
                          _get(viewer, "/?status=accepted"))
    assert sorted(accepted) == sorted([BIG_ID] + [f"s{n:03d}" for n in range(8, SMALL + 1, 8)])
    armed = re.findall(r'<tr data-session="([^"]+)"', _get(viewer, "/?kind=codebase_change"))
    assert len(armed) == (SMALL + 1) // 2


# --------------------------------------------------------------------------- verified reads


def test_the_verified_projection_is_kept_only_while_every_byte_of_the_record_is_unchanged(
        record: Path, tmp_path: Path) -> None:
    copy = tmp_path / "record"
    shutil.copytree(record, copy)
    reads = VerifiedReads(copy)
    try:
        for _ in range(3):
            with reads.open() as ledger:
                assert ledger.query("SELECT count(*) FROM cells")[0][0] == BIG + SMALL
        assert reads.verifications == 1  # the same bytes: verified once
        # A live Host appends: the next read verifies again and shows the new event.
        with SQLiteLedger(copy / "ledger.sqlite") as writer:
            writer.append("s001", "call_refused", {"call": "bash", "code": "no_cell",
                                                   "reason": "no cell was running"})
        with reads.open() as ledger:
            assert ledger.query("SELECT count(*) FROM refusals")[0][0] == 1
        assert reads.verifications == 2
        # An edit, even one that keeps the file's size: refused, and refused again.
        with sqlite3.connect(copy / "ledger.sqlite") as db:
            db.execute("UPDATE events SET body = replace(body, 'line 4321', 'line 4329') "
                       "WHERE kind = 'cell_finished' AND body LIKE '%line 4321%'")
        db.close()
        for attempt in (3, 4):
            with pytest.raises(RecordRefused) as refused, reads.open():
                pass
            assert refused.value.code == "chain_broken" and reads.verifications == attempt
    finally:
        reads.close()
