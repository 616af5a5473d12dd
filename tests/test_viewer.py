"""`host-kernel view`: a read-only web viewer of a record, over a real Host's record, served
on loopback and read by plain HTTP and by a real headless Chromium."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _browser import CHROMIUM, Browser, find_nodes, text_of
from _pipeline import TEST_CMD, build_package, submit

from host_kernel import Host
from host_kernel.cli import main
from host_kernel.lineage.graph import record_lineage, record_receipt_statement
from host_kernel.store.verified import open_verified
from host_kernel.viewer import ViewerServer, pages, serve_in_thread
from host_kernel.viewer.pages import choose_output, strip_ansi

# A 40 x 20 PNG, left half red, right half blue, built in the kernel from bytes.
PNG_CELL = """\
import struct, zlib
from IPython.display import Image, display
def chunk(kind, data):
    body = kind + data
    return struct.pack('>I', len(data)) + body + struct.pack('>I', zlib.crc32(body) & 0xffffffff)
row = b'\\x00' + b'\\xd0\\x30\\x30' * 20 + b'\\x30\\x60\\xd0' * 20
png = (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 40, 20, 8, 2, 0, 0, 0))
       + chunk(b'IDAT', zlib.compress(row * 20)) + chunk(b'IEND', b''))
display(Image(data=png, format='png'))
"""

RICH_CELL = """\
from IPython.display import HTML, SVG, Markdown, display
display(HTML('<table><tr><th>n</th><td id="cell-html">42</td></tr></table>'
             '<b id="bold">bold html</b>'
             '<script>document.body.dataset.ran = "yes"; parent.document.title = "pwned"</script>'))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="60" height="30">'
            '<rect width="60" height="30" fill="teal"/><script>alert(1)</script></svg>'))
display(Markdown('# A heading\\n\\nsome *markdown*'))
"""

SUBMIT_CELL = """\
from host_kernel import SubmissionRefused
try:
    host.submit_output({'rows': 3}, ['counted the rows'])
except SubmissionRefused as e:
    print(e)
"""


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A record made by a real Host: text, HTML, SVG, Markdown and PNG outputs, an error, a
    receipt, an artifact derived through a command from an input file, and a refused
    submission in an armed mode."""
    root = tmp_path_factory.mktemp("viewer")
    ws, rec = root / "ws", root / "record"
    ws.mkdir()
    (ws / "input.csv").write_text("b,2\na,1\nc,3\n")
    cells: dict[str, str] = {}
    with Host(ws, mode="reusable_pipeline", record_dir=rec) as host:
        for name, code, fid in [
            ("hello", "print('hello from the viewer test')", "frontend-hello"),
            ("rich", RICH_CELL, None),
            ("png", PNG_CELL, None),
            ("error", "1/0", None),
            ("bash", "r = host.bash('sort input.csv > sorted.csv && echo sorted')", None),
            ("save", ("n = len(open('sorted.csv').read().splitlines())\n"
                     "host.write_file('summary.txt', str(n))\n"
                     "print(host.save_artifact('summary.txt').artifact_id)"), None),
            ("submit", SUBMIT_CELL, None),
        ]:
            obs = host.execute(code, frontend_cell_id=fid)
            assert obs.status == ("error" if name == "error" else "ok"), obs.text
            cells[name] = obs.cell_id
        # Then an honest package, its tests, and a submission the Host reproduces and accepts.
        host._evidence_cell = build_package(host)  # type: ignore[attr-defined]
        accepted, _, text = submit(host)
        assert accepted, text
    with open_verified(rec) as ledger:
        session = ledger.query("SELECT session FROM sessions")[0][0]
        artifact = ledger.query("SELECT artifact_id FROM artifacts "
                                "WHERE filename = 'summary.txt'")[0][0]
        receipt = ledger.query("SELECT receipt_id FROM receipts "
                               "WHERE command LIKE 'sort %'")[0][0]
        verdicts = ledger.query("SELECT submission_id, accepted FROM submissions ORDER BY seq")
    assert [v["accepted"] for v in verdicts] == [0, 1]
    return {"dir": rec, "workspace": ws, "session": session, "cells": cells,
            "artifact": artifact, "receipt": receipt, "submission": verdicts[0][0],
            "accepted": verdicts[1][0]}


@pytest.fixture(scope="module")
def viewer(record: dict[str, Any]) -> Iterator[ViewerServer]:
    with ViewerServer(record["dir"]) as server:
        yield server


def _client(server: ViewerServer, *, token: bool = True) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{server.port}",
                        params={"token": server.token} if token else None, timeout=30)


def start_browser() -> Browser:
    """A headless Chromium (the viewer's test modules each start one with this); skips the
    test, saying what to install, when there is none."""
    if not CHROMIUM.exists():
        pytest.skip(f"the viewer's browser tests need Chromium: Chromium not found at "
                    f"{CHROMIUM}; install Debian's chromium (apt-get install chromium)")
    return Browser()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with start_browser() as b:
        yield b


#: A promise that settles once the page has drawn two frames (its frames sized, its images in).
SETTLED = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"


def _screenshot(browser: Browser, name: str) -> None:
    """The page as docs/images/viewer-NAME.png, when HOST_KERNEL_SCREENSHOTS names the folder
    (docs/viewer.md says how the screenshots are retaken); the viewer's other test modules
    take theirs with this too."""
    folder = os.environ.get("HOST_KERNEL_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        browser.evaluate(SETTLED)
        browser.screenshot(Path(folder) / f"viewer-{name}.png")


def _copy(record: dict[str, Any], dest: Path) -> Path:
    shutil.copytree(record["dir"], dest)
    return dest


def _tamper(record_dir: Path) -> None:
    """Edit one event's body in the SQLite file, as someone with write access could."""
    with sqlite3.connect(record_dir / "ledger.sqlite") as db:
        changed = db.execute("UPDATE events SET body = replace(body, 'hello from the viewer "
                             "test', 'hello from a forger') WHERE kind = 'cell_started' AND "
                             "body LIKE '%hello from the viewer test%'").rowcount
    db.close()
    assert changed == 1


def _bare(href: str) -> str:
    """A link without the token the viewer adds to it (the page was opened with one)."""
    return re.sub(r"[?&]token=[\w-]+(?=#|$)", "", href)


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


# --------------------------------------------------------------------------- in the browser


def test_the_sessions_page_lists_the_session_with_its_verdict(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    browser.goto(viewer.url)
    rows = browser.evaluate("[...document.querySelectorAll('tr[data-session]')]"
                            ".map(r => [r.dataset.session, r.innerText])")
    assert [r[0] for r in rows] == [record["session"]]
    text = rows[0][1]
    assert "reusable_pipeline" in text and "armed" in text and "1 failed" in text
    assert browser.evaluate("[...document.querySelectorAll('a.verdict')].map(a => a.innerText)"
                            ) == ["refused", "accepted"]
    head = browser.evaluate("document.querySelector('.top .head').innerText")
    with open_verified(record["dir"]) as ledger:
        last = ledger.head()
    assert last is not None and last.hash[:12] in head


def test_a_sessions_cells_render_their_outputs_as_jupyter_would(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    browser.goto(viewer.url.replace("/?", f"/session/{record['session']}?"))
    cells = record["cells"]

    def cell(name: str, js: str) -> Any:
        return browser.evaluate(f"(c => {js})(document.getElementById('cell-{cells[name]}'))")

    assert cell("hello", "c.querySelector('pre.out.stream').innerText") == \
        "hello from the viewer test\n"
    assert cell("hello", "c.querySelector('.frontend-id').innerText") == "frontend-hello"
    assert cell("hello", "c.querySelector('.badge').innerText") == "ok"
    # HTML runs in a sandboxed frame with no script allowed: it renders, its script does not
    # (same-origin only, so that the viewer's own script can read its height).
    assert cell("rich", "c.querySelector('iframe').getAttribute('sandbox')") == \
        "allow-same-origin"
    frames = [browser.document(), *browser.frame_documents()]  # same-process frames too
    bold = [text_of(n) for d in frames for n in find_nodes(d, "b", ("id", "bold"))]
    assert bold == ["bold html"]
    bodies = [n for d in frames for n in find_nodes(d, "body")]
    assert bodies and all("data-ran" not in n.get("attributes", []) for n in bodies)
    assert "pwned" not in browser.evaluate("document.title")
    # SVG is an image (it cannot script), never inline markup; Markdown is preformatted text.
    svg_src = cell("rich", "c.querySelector('img.out').src")
    assert svg_src.startswith("data:image/svg+xml;base64,")
    assert cell("rich", "c.querySelector('img.out').naturalWidth") == 60
    assert cell("rich", "c.querySelectorAll('.outputs svg').length") == 0
    assert "# A heading" in cell("rich", "c.querySelector('pre.out.text').innerText")
    assert cell("png", "[c.querySelector('img.out').naturalWidth, "
                       "c.querySelector('img.out').naturalHeight]") == [40, 20]
    # An error: its name, value and traceback, with IPython's colour codes stripped.
    error = cell("error", "[c.querySelector('.badge').innerText, "
                          "c.querySelector('.out.error').innerText]")
    assert error[0] == "error"
    assert "ZeroDivisionError" in error[1] and "division by zero" in error[1]
    assert "\x1b" not in error[1] and "[31m" not in error[1]
    # The receipt under its cell, and the artifact link under its producing cell.
    receipt = cell("bash", "c.querySelector('details.receipt').innerText")
    assert "sort input.csv > sorted.csv" in receipt and "exit 0" in receipt
    assert "sorted.csv" in receipt and "created" in receipt
    assert _bare(cell("save", "c.querySelector('a.artifact').getAttribute('href')")) == \
        f"/artifact/{record['artifact']}"
    assert cell("submit", "c.querySelector('a.verdict').innerText") == "refused"


def test_the_artifact_page_draws_its_lineage_graph(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    browser.goto(viewer.url.replace("/?", f"/artifact/{record['artifact']}?"))
    drawn = browser.evaluate("[...document.querySelectorAll('figure.lineage svg g.node')]"
                             ".map(g => [g.dataset.id, g.dataset.kind])")
    graph = record_lineage(record["dir"], record["artifact"])
    assert sorted(drawn) == sorted([n.id, n.kind] for n in graph.nodes)
    assert {k for _, k in drawn} >= {"artifact", "cell", "file", "receipt"}
    assert browser.evaluate("document.querySelectorAll('figure.lineage svg g.edge').length") \
        == len(graph.edges)
    facts = browser.evaluate("document.querySelector('dl.facts').innerText")
    assert "summary.txt" in facts and record["cells"]["save"] in facts
    links = [_bare(h) for h in browser.evaluate(
        "[...document.querySelectorAll('ul.downloads a')].map(a => a.getAttribute('href'))")]
    assert f"/receipt/{record['receipt']}/statement.json" in links
    assert f"/artifact/{record['artifact']}/bytes" in links


def test_the_verdict_page_shows_the_failed_check_first_in_red(
        viewer: ViewerServer, browser: Browser, record: dict[str, Any]) -> None:
    browser.goto(viewer.url.replace("/?", f"/verdict/{record['submission']}?"))
    assert browser.evaluate("document.getElementById('verdict').innerText") == "refused"
    first = browser.evaluate(
        "(r => [r.dataset.code, r.className, getComputedStyle(r.cells[2]).color, "
        "r.innerText])(document.querySelector('tr.check'))")
    assert first[0] == "declarations_missing" and "failed" in first[1]
    assert first[2] == "rgb(198, 40, 40)"
    assert "test_evidence" in first[3]
    classes = browser.evaluate("[...document.querySelectorAll('tr.check')].map(r => r.className)")
    assert classes.count("check failed") == 1 and len(classes) > 5


def test_a_tampered_record_shows_the_red_banner_and_nothing_else(
        browser: Browser, record: dict[str, Any], tmp_path: Path) -> None:
    copy = _copy(record, tmp_path / "tampered")
    _tamper(copy)
    url, stop = serve_in_thread(copy)
    try:
        browser.goto(url)
        banner = browser.evaluate("(b => [b.innerText, getComputedStyle(b).color])"
                                  "(document.getElementById('refused'))")
        assert "chain_broken" in banner[0] and banner[1] == "rgb(198, 40, 40)"
        assert browser.evaluate("document.querySelectorAll('tr[data-session]').length") == 0
        assert record["session"] not in browser.evaluate("document.body.innerText")
        _screenshot(browser, "tampered")
    finally:
        stop()


# --------------------------------------------------------------------------- over plain HTTP


def test_an_accepted_verdict_shows_how_its_tests_were_reproduced(
        viewer: ViewerServer, record: dict[str, Any]) -> None:
    with _client(viewer) as client:
        page = client.get(f"/verdict/{record['accepted']}").text
    assert 'id="verdict">accepted<' in page
    section = page[page.index('<section class="reproduction"'):]
    assert f"$ {TEST_CMD}" in section and ">passed<" in section
    assert "collected 1 · passed 1" in section and "pytest" in section
    assert 'class="check failed"' not in page


def test_every_request_needs_the_token_and_a_loopback_host(viewer: ViewerServer) -> None:
    with _client(viewer, token=False) as anon:
        assert anon.get("/").status_code == 403
        assert anon.get("/", params={"token": viewer.token + "x"}).status_code == 403
        assert anon.get("/static/viewer.css").status_code == 403
        first = anon.get("/", params={"token": viewer.token})
        assert first.status_code == 200
        assert f"host_kernel_view_{viewer.port}" in first.headers["set-cookie"]
        assert "HttpOnly" in first.headers["set-cookie"]
        assert anon.get("/").status_code == 200  # the cookie now
        assert anon.get("/static/viewer.css").status_code == 200
    with _client(viewer) as client:
        assert client.get("/", headers={"Host": f"evil.example:{viewer.port}"}
                          ).status_code == 403
        page = client.get("/")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert page.headers["referrer-policy"] == "no-referrer"


def test_only_get_and_head_are_served_and_the_record_is_never_written(
        viewer: ViewerServer, record: dict[str, Any]) -> None:
    before = _listing(record["dir"])
    with _client(viewer) as client:
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            response = client.request(method, "/", content=b"x")
            assert response.status_code == 405, method
            assert response.headers["allow"] == "GET, HEAD"
        head = client.head(f"/session/{record['session']}")
        assert head.status_code == 200 and head.content == b""
        for path in ("/", f"/session/{record['session']}", f"/artifact/{record['artifact']}",
                     f"/artifact/{record['artifact']}/bytes", f"/verdict/{record['submission']}",
                     f"/receipt/{record['receipt']}"):
            assert client.get(path).status_code == 200, path
    assert _listing(record["dir"]) == before


def test_the_downloads_are_the_lineage_and_receipt_exports_and_the_checked_bytes(
        viewer: ViewerServer, record: dict[str, Any]) -> None:
    with _client(viewer) as client:
        prov = client.get(f"/artifact/{record['artifact']}/prov.json")
        assert prov.headers["content-disposition"].startswith("attachment")
        assert json.loads(prov.content) == record_lineage(record["dir"],
                                                          record["artifact"]).to_prov()
        statement = client.get(f"/receipt/{record['receipt']}/statement.json")
        assert json.loads(statement.content) == record_receipt_statement(record["dir"],
                                                                         record["receipt"])
        blob = client.get(f"/artifact/{record['artifact']}/bytes")
        assert blob.content == b"3"
        assert blob.headers["content-type"] == "application/octet-stream"
        assert blob.headers["content-disposition"] == 'attachment; filename="summary.txt"'


def test_unknown_ids_and_paths_are_404(viewer: ViewerServer) -> None:
    with _client(viewer) as client:
        for path in ("/session/nope", "/artifact/nope", "/artifact/nope/prov.json",
                     "/artifact/nope/bytes", "/receipt/nope", "/receipt/nope/statement.json",
                     "/verdict/nope", "/static/nope.css", "/no/such/page"):
            assert client.get(path).status_code == 404, path
        assert "no session &#39;nope&#39;" in client.get("/session/nope").text


def test_a_record_tampered_while_served_is_refused_on_the_next_request(
        record: dict[str, Any], tmp_path: Path) -> None:
    copy = _copy(record, tmp_path / "live")
    with ViewerServer(copy) as server, _client(server) as client:
        assert record["session"] in client.get("/").text
        _tamper(copy)
        # Refused on the next request, and on every one after it (nothing of it is kept).
        for path in 2 * ("/", f"/session/{record['session']}", f"/artifact/{record['artifact']}",
                         f"/verdict/{record['submission']}"):
            page = client.get(path)
            assert page.status_code == 409, path
            assert 'id="refused"' in page.text and "chain_broken" in page.text
            assert record["session"] not in page.text
            assert "hello from" not in page.text
        prov = client.get(f"/artifact/{record['artifact']}/prov.json")
        assert prov.status_code == 409 and "chain_broken" in prov.text


def test_an_altered_blob_is_named_and_not_served(record: dict[str, Any], tmp_path: Path) -> None:
    copy = _copy(record, tmp_path / "blob")
    with open_verified(copy) as ledger:
        sha = ledger.query("SELECT sha256 FROM artifacts")[0][0]
    blob = copy / "blobs" / "sha256" / sha[:2] / sha
    blob.chmod(0o644)
    blob.write_bytes(b"4")
    with ViewerServer(copy) as server, _client(server) as client:
        page = client.get(f"/artifact/{record['artifact']}")
        assert page.status_code == 200 and "blob store was altered" in page.text
        assert f"/artifact/{record['artifact']}/bytes" not in page.text
        response = client.get(f"/artifact/{record['artifact']}/bytes")
        assert response.status_code == 409 and response.text.startswith("not served:")


def test_a_blob_larger_than_memory_holds_is_served_whole_from_the_copy_it_checked(
        tmp_path: Path) -> None:
    data = os.urandom(pages.BLOB_IN_MEMORY + 3 * pages.BLOB_CHUNK + 17)
    sha = hashlib.sha256(data).hexdigest()
    blob = tmp_path / "blobs" / "sha256" / sha[:2] / sha
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    pages.check_blob(tmp_path, sha)
    copy = pages.artifact_blob(tmp_path, sha)
    # The copy was taken in the pass that hashed it: replacing the blob now changes nothing.
    blob.write_bytes(b"swapped")
    with copy:
        assert copy.read() == data
    with pytest.raises(pages.BlobUnavailable, match="blob store was altered"):
        pages.artifact_blob(tmp_path, sha)
    with pytest.raises(pages.BlobUnavailable, match="not a sha256"):
        pages.check_blob(tmp_path, "../" + sha[3:])


def test_the_command_prints_its_url_serves_and_stops_quietly_on_ctrl_c(
        record: dict[str, Any]) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "host_kernel", "view", str(record["dir"]),
                             "--no-browser"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    killer = threading.Timer(30, proc.kill)
    killer.start()
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        second = proc.stdout.readline() if proc.stdout else ""
        found = re.fullmatch(r"host-kernel view: serving (.+) at "
                             r"(http://127\.0\.0\.1:(\d+)/\?token=([\w-]+))\n", first)
        assert found, first
        assert found[1] == str(record["dir"]) and "Ctrl-C" in second
        page = httpx.get(found[2], timeout=30)
        assert page.status_code == 200 and record["session"] in page.text
        assert httpx.get(found[2].split("?")[0], timeout=30).status_code == 403
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert err == "" and out == ""


def test_the_browser_is_given_a_private_page_not_the_url_with_its_token(
        record: dict[str, Any], tmp_path: Path) -> None:
    # A command line is readable by every local user: the token must not be on one.
    seen = tmp_path / "browser-argv.txt"
    browser = tmp_path / "browser"
    browser.write_text(f"#!/bin/sh\n"
                       f"{{ printf '%s\\n' \"$@\"; stat -c %a \"${{1#file://}}\"; "
                       f"cat \"${{1#file://}}\"; }} > {seen}.part && mv {seen}.part {seen}\n")
    browser.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-m", "host_kernel", "view", str(record["dir"])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "BROWSER": str(browser)}, start_new_session=True)
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        token = first.rsplit("token=", 1)[-1].strip()
        deadline = time.monotonic() + 30
        while not seen.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        argv, mode, page = seen.read_text().split("\n", 2)
        assert argv.startswith("file://") and token not in argv
        assert mode == "600" and f"token={token}" in page
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    assert not Path(argv[len("file://"):]).exists()  # removed when the viewer stopped


def test_a_download_name_in_any_script_is_sent_as_rfc_5987(
        record: dict[str, Any]) -> None:
    header = pages.content_disposition("数据 \"x\".csv")
    assert header.encode("latin-1")  # a header value HTTP can carry
    assert header.startswith('attachment; filename="') and '"x"' not in header
    assert "filename*=UTF-8''" + "%E6%95%B0%E6%8D%AE" in header
    assert pages.content_disposition("summary.txt") == 'attachment; filename="summary.txt"'


def test_the_command_refuses_a_folder_with_no_record(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(tmp_path), "--no-browser"]) == 1
    assert "record_missing" in capsys.readouterr().err


# --------------------------------------------------------------------------- output choice


def test_outputs_are_reduced_to_the_richest_safe_representation() -> None:
    both = {"output_type": "display_data", "metadata": {},
            "data": {"text/plain": "plain", "text/html": "<i>rich</i>"}}
    assert choose_output(both)["kind"] == "html"
    svg = choose_output({"output_type": "display_data",
                         "data": {"image/svg+xml": "<svg/>", "text/plain": "x"}})
    assert svg["kind"] == "image" and svg["src"].startswith("data:image/svg+xml;base64,")
    broken = choose_output({"output_type": "display_data",
                            "data": {"image/png": "not base64 ***", "text/plain": "fallback"}})
    assert broken == {"kind": "text", "text": "fallback", "mime": "text/plain",
                      "execution_count": None}
    assert choose_output({"output_type": "stream", "name": "stderr",
                          "text": ["a", "b\n"]})["text"] == "ab\n"
    assert strip_ansi("\x1b[31mred\x1b[39m \x1b]0;title\x07plain") == "red plain"
