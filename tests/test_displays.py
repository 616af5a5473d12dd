"""Rich displays: the cards of receipts, artifacts, verdicts, lineage, files and observations,
and the lineage graph drawn as SVG; escaped, compact in plain text, and seen through a kernel."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest
from _helpers import run_ok

from host_kernel import Host
from host_kernel._models import (
    Artifact,
    Check,
    FileChange,
    FileRecord,
    Observation,
    Receipt,
    Verdict,
)
from host_kernel.lineage.graph import Lineage, LineageEdge, LineageNode
from host_kernel.lineage.svg import MAX_SVG_NODES, lineage_svg

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = "<img src=x onerror=alert(1)>"
MIMES = {"text/plain", "text/html", "text/markdown"}


def receipt(command: str = "echo hi", exit_status: int = 0, **kw: Any) -> Receipt:
    base: dict[str, Any] = dict(
        receipt_id="3f2a9c1e-1111-2222-3333-444455556666", cell_id="2pTP7AUQguZWw9AX",
        generation=1, command=command, cwd="/w", executable="/usr/bin/echo",
        executable_sha256="e" * 64, executable_in_workspace=False, path_env="/usr/bin",
        path_differs=False, env_changed=(), started=0.0, ended=0.5, duration=0.5,
        exit_status=exit_status, signal=None, timed_out=False, stdout_sha256="a" * 64,
        stdout_size=3, stderr_sha256="b" * 64, stderr_size=0, stdout_tail="hi\n")
    base.update(kw)
    return Receipt(**base)


def artifact(filename: str = "summary.json") -> Artifact:
    return Artifact("9b2c0d1e-1111-2222-3333-444455556666", filename, "d" * 64, 1234,
                    "application/json", "2pTP7AUQguZWw9AX", 1, "results/summary.json")


def verdict(accepted: bool = False) -> Verdict:
    return Verdict("5e5e5e5e-1111-2222-3333-444455556666", accepted, "reusable_pipeline", True, (
        Check("artifacts_saved", True, "every source file was saved"),
        Check("reproduction_failed", accepted, "1 failed: tests/test_core.py::test_top"),
        Check("summary_short", False, "the summary is short", advisory=True),
        Check("entry_point_compiles", True, "compiles"),
    ))


def lineage(label: str = "summary.json") -> Lineage:
    return Lineage("artifact:a", (
        LineageNode("artifact:a", "artifact", label, {"sha256": "d" * 64}),
        LineageNode("cell:c", "cell", "cell c (generation 1)",
                    {"cell_id": "2pTP7AUQguZWw9AX", "generation": 1}),
        LineageNode("file:data/x.csv@ee", "file", "data/x.csv", {"path": "data/x.csv"}),
        LineageNode("artifact:b", "artifact", "raw.csv", {}),
        LineageNode("file:raw.txt@ff", "file", "raw.txt", {"path": "raw.txt"}),
    ), (
        LineageEdge("artifact:a", "cell:c", "wasGeneratedBy"),
        LineageEdge("artifact:a", "file:data/x.csv@ee", "wasDerivedFrom", "read"),
        LineageEdge("artifact:a", "artifact:b", "wasDerivedFrom"),
        LineageEdge("artifact:b", "file:raw.txt@ff", "wasDerivedFrom"),
        LineageEdge("cell:c", "file:data/x.csv@ee", "used"),
    ))


def observation() -> Observation:
    return Observation("2pTP7AUQguZWw9AX", "error", (), 3, 1, f"NameError: {HOSTILE}\n", 0.25)


def outside_fences(markdown: str) -> str:
    kept, fence = [], ""
    for line in markdown.splitlines():
        if fence and line == fence:
            fence = ""
        elif not fence and line.startswith("```"):
            fence = line
        elif not fence:
            kept.append(line)
    return "\n".join(kept)


def parsed(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def groups(root: ET.Element, cls: str) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == cls]


# --------------------------------------------------------------------------- the SVG


def test_lineage_svg_parses_and_has_one_group_per_node_and_edge() -> None:
    g = lineage()
    root = parsed(lineage_svg(g, title="lineage of summary.json"))
    assert root.tag == f"{SVG}svg"
    assert {n.get("data-id") for n in groups(root, "node")} == {n.id for n in g.nodes}
    assert {n.get("data-kind") for n in groups(root, "node")} == {"artifact", "cell", "file"}
    edges = {(e.get("data-from"), e.get("data-to")) for e in groups(root, "edge")}
    assert edges == {(e.src, e.dst) for e in g.edges}
    width, height = int(root.get("width", "0")), int(root.get("height", "0"))
    assert root.get("viewBox") == f"0 0 {width} {height}"
    assert root.find(f"{SVG}defs/{SVG}marker") is not None


def test_lineage_svg_escapes_hostile_labels_and_ids() -> None:
    hostile = '<script>alert("x")</script> & more\x00'
    g = Lineage("artifact:<a&>", (LineageNode("artifact:<a&>", "artifact", hostile, {}),), ())
    svg = lineage_svg(g, title=hostile)
    assert "<script>" not in svg and "&amp; more" in svg and "&lt;script&gt;" in svg
    root = parsed(svg)
    [node] = groups(root, "node")
    assert node.get("data-id") == "artifact:<a&>"
    assert hostile.replace("\x00", "\ufffd") in (node.findtext(f"{SVG}title") or "")
    assert not list(root.iter(f"{SVG}script"))


def test_lineage_svg_puts_the_artifact_at_the_right_and_its_sources_further_left() -> None:
    root = parsed(lineage_svg(lineage()))
    x = {g.get("data-id"): float(g.find(f"{SVG}rect").get("x", "0"))  # type: ignore[union-attr]
         for g in groups(root, "node")}
    assert x["artifact:a"] == max(x.values())
    # longest path: raw.txt sits behind raw.csv, which sits behind the artifact
    assert x["file:raw.txt@ff"] < x["artifact:b"] < x["artifact:a"]
    assert x["file:data/x.csv@ee"] < x["cell:c"]  # the cell used it: one layer further


def test_lineage_svg_of_an_artifact_with_no_inputs_is_one_node() -> None:
    g = Lineage("artifact:a", (LineageNode("artifact:a", "artifact", "x" * 200, {}),), ())
    root = parsed(lineage_svg(g))
    [node] = groups(root, "node")
    assert not groups(root, "edge")
    shown = [t.text or "" for t in node.iter(f"{SVG}text")]
    assert any(t.endswith("…") and len(t) < 40 for t in shown)  # cut, the whole in <title>
    assert "x" * 200 in (node.findtext(f"{SVG}title") or "")


def test_lineage_svg_survives_a_cycle() -> None:
    nodes = tuple(LineageNode(f"artifact:{i}", "artifact", str(i), {}) for i in range(3))
    edges = (LineageEdge("artifact:0", "artifact:1", "wasDerivedFrom"),
             LineageEdge("artifact:1", "artifact:2", "wasDerivedFrom"),
             LineageEdge("artifact:2", "artifact:1", "wasDerivedFrom"),
             LineageEdge("artifact:2", "artifact:2", "wasDerivedFrom"))
    root = parsed(lineage_svg(Lineage("artifact:0", nodes, edges)))
    assert len(groups(root, "node")) == 3
    assert len(groups(root, "edge")) == 3  # the self-loop is not drawn


def test_lineage_svg_caps_large_graphs_with_a_note() -> None:
    n = MAX_SVG_NODES + 50
    nodes = (LineageNode("artifact:root", "artifact", "root", {}),) + tuple(
        LineageNode(f"file:f{i}@x", "file", f"f{i}", {"path": f"f{i}"}) for i in range(n - 1))
    edges = tuple(LineageEdge("artifact:root", f"file:f{i}@x", "wasDerivedFrom")
                  for i in range(n - 1))
    svg = lineage_svg(Lineage("artifact:root", nodes, edges, truncated=True))
    root = parsed(svg)
    assert len(groups(root, "node")) == MAX_SVG_NODES
    assert len(groups(root, "edge")) == MAX_SVG_NODES - 1
    assert "+50 more nodes not drawn" in svg and "cut at its node bound" in svg


# --------------------------------------------------------------------------- the cards


@pytest.mark.parametrize("value", [receipt(), artifact(), verdict(), lineage(), observation(),
                                   FileRecord("data/x.csv", "c" * 64, 53)],
                         ids=lambda v: type(v).__name__)
def test_every_value_offers_plain_text_html_and_markdown(value: Any) -> None:
    bundle = value._repr_mimebundle_()
    assert MIMES <= set(bundle)
    assert all(isinstance(v, str) and v for v in bundle.values())
    assert "data-hk-card=" in bundle["text/html"]
    assert "<style" not in bundle["text/html"] and "<script" not in bundle["text/html"]
    assert "\n" not in bundle["text/plain"].splitlines()[0]
    only = value._repr_mimebundle_(include=["text/html"])
    assert set(only) == {"text/plain", "text/html"}
    assert "text/html" not in value._repr_mimebundle_(exclude=["text/html"])


def test_lineage_bundle_carries_the_graph_as_svg_too() -> None:
    bundle = lineage()._repr_mimebundle_()
    parsed(bundle["image/svg+xml"])
    assert "<svg" in bundle["text/html"] and 'class="node"' in bundle["text/html"]
    assert bundle["text/plain"] == lineage().to_text().rstrip("\n")
    assert repr(lineage()) == "Lineage(root='artifact:a', nodes=5, edges=5)"


def test_plain_text_of_receipts_files_and_artifacts_is_unchanged() -> None:
    assert receipt()._repr_mimebundle_()["text/plain"] == (
        "Receipt(3f2a9c1e…, 'echo hi', exit 0, 0.500s, cell 2pTP7AUQguZWw9AX)")
    f = FileRecord("data/x.csv", "c" * 64, 53)
    assert f._repr_mimebundle_()["text/plain"] == (
        f"FileRecord(path='data/x.csv', sha256='{'c' * 64}', size=53)")
    assert "artifact_id='9b2c0d1e-1111-2222-3333-444455556666'" in repr(artifact())


def test_html_escapes_a_hostile_command_filename_label_and_message() -> None:
    values = [receipt(HOSTILE, stdout_tail=HOSTILE,
                      changes=(FileChange(HOSTILE, "created", None, 1),)),
              artifact(HOSTILE), lineage(HOSTILE), observation(),
              Verdict("v", False, "m", False, (Check(HOSTILE, False, HOSTILE),))]
    for value in values:
        bundle = value._repr_mimebundle_()
        assert "<img" not in bundle["text/html"], type(value).__name__
        # in Markdown, raw HTML is live everywhere but inside a fenced code block
        assert "<img" not in outside_fences(bundle["text/markdown"]), type(value).__name__
        assert "&lt;img src=x onerror=alert" in bundle["text/html"]


def test_verdict_card_lists_failed_checks_first_marked_then_advice_then_passed() -> None:
    html = verdict()._repr_html_()
    order = [html.index(f"data-check='{code}'") for code in
             ("reproduction_failed", "summary_short", "artifacts_saved", "entry_point_compiles")]
    assert order == sorted(order)
    assert "data-check='reproduction_failed' data-ok='false' title='failed'" in html
    assert "refused" in html and "advisory" in html and "#d1242f" in html
    md = verdict()._repr_markdown_().splitlines()
    assert md[2].startswith("- ✗ reproduction\\_failed") and "(advisory)" in md[3]
    assert repr(verdict()) == ("Verdict(5e5e5e5e-1111-2222-3333-444455556666, refused, "
                               "reusable_pipeline armed, 2/4 checks passed; "
                               "failed: reproduction_failed; advice: summary_short)")
    assert str(verdict(True)).startswith("Submission 5e5e5e5e-1111-2222-3333-444455556666 accepted")


def test_cards_shorten_hashes_and_keep_the_whole_value_on_hover() -> None:
    html = artifact()._repr_html_()
    assert f"title='{'d' * 64}'>{'d' * 12}…</code>" in html
    assert "1.2 KiB" in html and "application/json" in html and "2pTP7AUQguZWw9AX" in html
    r = receipt(exit_status=2, stderr_size=5, stderr_tail="boom\n")
    html = r._repr_html_()
    assert ">failed</span>" in html and "exit 2" in html and "boom" in html
    assert len(html) < 6000


# --------------------------------------------------------------------------- through a kernel


def test_a_kernel_shows_receipt_artifact_and_lineage_cards_and_the_agent_reads_text(
        host: Host) -> None:
    obs = host.execute("host.bash('true')")
    [result] = [o for o in obs.outputs if o["output_type"] == "execute_result"]
    assert "data-hk-card='receipt'" in result["data"]["text/html"]
    assert result["data"]["text/plain"].startswith("Receipt(") and "'true', exit 0" in \
        result["data"]["text/plain"]
    assert "**Receipt** · ok" in result["data"]["text/markdown"]
    assert "'true', exit 0" in obs.text and "<div" not in obs.text

    run_ok(host, "host.write_file('data/x.csv', 'a,b\\n1,2\\n')")
    obs = host.execute("import shutil\nshutil.copy('data/x.csv', 'out.csv')\n"
                       "art = host.save_artifact('out.csv')\nart")
    [result] = [o for o in obs.outputs if o["output_type"] == "execute_result"]
    assert "data-hk-card='artifact'" in result["data"]["text/html"]
    assert result["data"]["text/plain"].startswith("Artifact(artifact_id='")

    obs = host.execute("host.lineage(art.artifact_id)")
    [result] = [o for o in obs.outputs if o["output_type"] == "execute_result"]
    data = result["data"]
    assert "data-hk-card='lineage'" in data["text/html"] and "<svg" in data["text/html"]
    root = parsed(data["image/svg+xml"])
    assert {g.get("data-kind") for g in groups(root, "node")} >= {"artifact", "cell", "file"}
    assert data["text/plain"].startswith("artifact out.csv")
    assert "data/x.csv" in obs.text and "<svg" not in obs.text
