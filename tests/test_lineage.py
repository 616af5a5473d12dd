"""Lineage through real cells: host.lineage, exports (PROV-JSON checked by prov), in-toto
receipts, drift in audit, generations, and LLM narrowing against a scripted endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from host_kernel import Host
from host_kernel.audit import audit
from host_kernel.lineage.graph import build_lineage, receipt_statement

from _helpers import run_ok
from scripted_llm import ScriptedLLMServer, chat_reply


def _session(host: Host) -> dict[str, str]:
    """a.csv → table.csv (pandas-free) → figure.txt from the table; returns artifact ids."""
    run_ok(host, "host.write_file('data/a.csv', 'x,y\\n1,2\\n3,4\\n')\n"
                 "host.write_file('data/decoy.csv', 'nothing')")
    run_ok(host, "import csv\nrows = list(csv.DictReader(open('data/a.csv')))\n"
                 "noise = open('data/decoy.csv').read()")
    obs = run_ok(host, "with open('table.csv', 'w') as f:\n"
                       "    f.write('\\n'.join(r['x'] + ',' + r['y'] for r in rows))\n"
                       "t = host.save_artifact('table.csv')\nprint(t.artifact_id)")
    table = obs.strip().splitlines()[-1]
    obs = run_ok(host, "p = host.load_artifact(t.artifact_id, 'work/table.csv')\n"
                       "lines = open('work/table.csv').read().splitlines()")
    obs = run_ok(host, "open('figure.txt', 'w').write('#' * len(lines))\n"
                       "fig = host.save_artifact('figure.txt')\nprint(fig.artifact_id)")
    return {"table": table, "figure": obs.strip().splitlines()[-1]}


def test_lineage_walks_from_a_figure_back_to_its_input_data(host: Host) -> None:
    ids = _session(host)
    text = run_ok(host, f"g = host.lineage({ids['figure']!r})\nprint(g.to_text())")
    assert "artifact figure.txt" in text
    assert f"artifact table.csv ({ids['table']}" in text
    assert "file data/a.csv" in text
    assert "decoy" not in text
    graph = build_lineage(host.ledger, ids["figure"])
    inputs = graph.inputs()
    assert [n.kind for n in inputs] == ["artifact"]  # by id, not by the materialised path
    assert not graph.truncated


def test_exports_mermaid_dot_and_prov_json_that_prov_loads(host: Host) -> None:
    prov_model = pytest.importorskip("prov.model")
    ids = _session(host)
    graph = build_lineage(host.ledger, ids["figure"])
    assert graph.to_mermaid().startswith("flowchart RL")
    assert "wasDerivedFrom" in graph.to_dot() and graph.to_dot().startswith("digraph")
    doc = prov_model.ProvDocument.deserialize(content=json.dumps(graph.to_prov()),
                                              format="json")
    records = list(doc.get_records())
    kinds = {type(r).__name__ for r in records}
    assert {"ProvEntity", "ProvActivity", "ProvDerivation", "ProvGeneration"} <= kinds
    # stable identifiers: the same graph exports the same document
    assert graph.to_prov() == build_lineage(host.ledger, ids["figure"]).to_prov()


def test_cli_lineage_and_receipt_export(host: Host) -> None:
    ids = _session(host)
    obs = host.execute("r = host.bash('cp table.csv t2.csv')\nprint(r.receipt_id)")
    receipt_id = obs.outputs[-1]["text"].strip().splitlines()[-1]
    out = subprocess.run([sys.executable, "-m", "host_kernel", "lineage", ids["figure"],
                          "--record", str(host.record_dir), "--format", "prov-json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["entity"]
    statement = receipt_statement(host.ledger, receipt_id)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicate"]["byproducts"]["return-value"] == 0
    assert statement["subject"][0]["name"] == "t2.csv"
    out = subprocess.run([sys.executable, "-m", "host_kernel", "receipt", receipt_id,
                          "--record", str(host.record_dir)], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == statement


def test_audit_reports_a_drifted_input_and_strict_makes_it_fatal(workdir: Path) -> None:
    with Host(workdir) as host:
        _session(host)
    assert audit(host.record_dir).clean
    (workdir / "data" / "a.csv").write_text("x,y\n9,9\n")
    report = audit(host.record_dir)
    assert report.clean  # drift is reported, not fatal
    drift = [f for f in report.findings if f.code == "lineage_drift"]
    assert drift and "data/a.csv" in drift[0].where and not drift[0].fatal
    strict = audit(host.record_dir, strict=True)
    assert not strict.clean
    cli = subprocess.run([sys.executable, "-m", "host_kernel", "audit", str(host.record_dir),
                          "--strict"], capture_output=True, text=True)
    assert cli.returncode == 1 and "lineage_drift" in cli.stdout


def test_a_new_generation_forgets_in_memory_taint(host: Host) -> None:
    run_ok(host, "host.write_file('a.txt', 'a')\nt = open('a.txt').read()")
    host.restart()
    run_ok(host, "t = 'fresh'\nopen('o.txt', 'w').write(t)\nhost.save_artifact('o.txt')")
    row = host.ledger.query("SELECT lineage FROM artifacts")[0]
    assert json.loads(row["lineage"])["inputs"] == []


def test_an_llm_may_narrow_the_candidates_but_never_add(workdir: Path) -> None:
    from host_kernel.llm import LLMClient, LLMConfig

    answers = [chat_reply('["file:data/a.csv", "file:/etc/passwd"]')]
    with ScriptedLLMServer(answers) as server, LLMClient(
            LLMConfig(base_url=server.base_url, model="m", max_retries=0)) as llm, \
            Host(workdir, llm=llm) as host:
        run_ok(host, "host.write_file('data/a.csv', 'a')\nhost.write_file('data/b.csv', 'b')")
        run_ok(host, "a = open('data/a.csv').read()\nb = open(''.join(['data/', 'b.csv'])).read()")
        run_ok(host, "open('o.txt', 'w').write(a + b)\nhost.save_artifact('o.txt')")
        lineage = json.loads(host.ledger.query("SELECT lineage FROM artifacts")[0]["lineage"])
        sent = server.requests[0].json()
    assert [i["key"] for i in lineage["inputs"]] == ["file:data/a.csv"]
    assert lineage["inputs"][0]["method"] == "llm-confirmed"
    assert lineage["llm"]["dropped"] == ["file:data/b.csv"]
    assert lineage["llm"]["discarded_non_candidates"] == ["file:/etc/passwd"]
    assert "file:data/b.csv" in sent["messages"][0]["content"]  # the candidates were given


def test_names_of_a_cell_that_killed_its_kernel_carry_nothing_forward(host: Host) -> None:
    run_ok(host, "host.write_file('a.txt', 'a')")
    died = host.execute("t = open('a.txt').read()\nimport os\nos._exit(1)")
    assert died.status == "kernel_died"
    run_ok(host, "try:\n    v = t\nexcept NameError:\n    v = 'fresh'\n"
                 "open('o.txt', 'w').write(v)\nhost.save_artifact('o.txt')")
    row = host.ledger.query("SELECT lineage FROM artifacts")[0]
    assert json.loads(row["lineage"])["inputs"] == []
