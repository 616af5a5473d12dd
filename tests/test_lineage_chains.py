"""An artifact's inputs are its direct inputs; a session-made file among them carries its own
derivation as edges of the graph (PROV's wasDerivedFrom chain), walked by upstream().

Through real cells in a confined, traced session: an intermediate parquet file, a pickle
across a restart, a tar extracted by host.bash and then read."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import run_ok

from host_kernel import Host


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    ws = tmp_path_factory.mktemp("chains")
    (ws / "raw.csv").write_text("x,y\n1,2\n3,4\n5,6\n")
    (ws / "other.csv").write_text("x,y\n0,0\n")
    with Host(ws) as host:
        yield host


def _saved(host: Host, code: str) -> str:
    return run_ok(host, code + "\nprint(a.artifact_id)").strip().splitlines()[-1]


def _paths(nodes: list) -> list[str]:  # type: ignore[type-arg]
    return sorted(n.attrs.get("path") or n.label for n in nodes if n.kind == "file")


def test_an_intermediate_parquet_is_one_direct_input_and_its_source_is_upstream(
        chains: Host) -> None:
    run_ok(chains, "import pandas as pd\nraw = pd.read_csv('raw.csv')\n"
                   "raw['z'] = raw.x * 10\nraw.to_parquet('mid.parquet')")
    aid = _saved(chains, "m = pd.read_parquet('mid.parquet')\nnoise = open('other.csv').read()\n"
                         "m[['z']].to_csv('z.csv', index=False)\na = host.save_artifact('z.csv')")
    graph = _graph(chains, aid)
    assert _paths(graph.inputs()) == ["mid.parquet"]
    assert _paths(graph.upstream()) == ["mid.parquet", "raw.csv"]
    mid = next(n for n in graph.inputs() if n.kind == "file")
    assert _paths(graph.inputs(mid.id)) == ["raw.csv"]
    made_by = [e.dst for e in graph.edges if e.src == mid.id and e.relation == "wasGeneratedBy"]
    assert made_by and made_by[0].startswith("cell:")
    # The record holds the direct inputs and the file's derivation, hash-chained.
    row = chains.own_rows("SELECT lineage FROM artifacts WHERE artifact_id = ?", (aid,))[0]
    record = json.loads(row["lineage"])
    assert [i["path"] for i in record["inputs"]] == ["mid.parquet"]
    assert [(d["path"], [i["path"] for i in d["inputs"]]) for d in record["derivations"]] \
        == [("mid.parquet", ["raw.csv"])]


def test_a_pickle_written_before_a_restart_keeps_its_chain(chains: Host) -> None:
    run_ok(chains, "import pickle, csv\nrows = list(csv.reader(open('raw.csv')))\n"
                   "pickle.dump(rows, open('rows.pkl', 'wb'))")
    chains.restart()
    aid = _saved(chains, "import pickle\nrows = pickle.load(open('rows.pkl', 'rb'))\n"
                         "open('n.txt', 'w').write(str(len(rows)))\na = host.save_artifact('n.txt')")
    graph = _graph(chains, aid)
    assert _paths(graph.inputs()) == ["rows.pkl"]
    assert _paths(graph.upstream()) == ["raw.csv", "rows.pkl"]
    depth1 = graph.depth(1)
    assert _paths(depth1.upstream()) == ["rows.pkl"]


def test_a_tar_extracted_by_a_command_then_read(chains: Host) -> None:
    run_ok(chains, "import tarfile\nwith tarfile.open('bundle.tar', 'w') as t:\n"
                   "    t.add('raw.csv', arcname='inner/data.csv')")
    run_ok(chains, "r = host.bash('mkdir -p unpacked && tar -xf bundle.tar -C unpacked')\n"
                   "assert r.exit_status == 0, r")
    aid = _saved(chains, "text = open('unpacked/inner/data.csv').read()\n"
                         "open('lines.txt', 'w').write(str(text.count(chr(10))))\n"
                         "a = host.save_artifact('lines.txt')")
    graph = _graph(chains, aid)
    assert _paths(graph.inputs()) == ["unpacked/inner/data.csv"]
    upstream = graph.upstream()
    assert "bundle.tar" in _paths(upstream)
    assert any(n.kind == "receipt" and "tar -xf" in n.label for n in upstream)
    extracted = next(n for n in graph.inputs() if n.kind == "file")
    assert any(e.src == extracted.id and e.relation == "wasGeneratedBy"
               and e.dst.startswith("receipt:") for e in graph.edges)


def test_the_cli_cuts_the_graph_by_depth(chains: Host) -> None:
    run_ok(chains, "import pandas as pd\npd.read_csv('raw.csv').to_parquet('mid2.parquet')")
    aid = _saved(chains, "import pandas as pd\npd.read_parquet('mid2.parquet').to_csv('d.csv')\n"
                         "a = host.save_artifact('d.csv')")

    def lineage(*extra: str) -> dict:  # type: ignore[type-arg]
        out = subprocess.run([sys.executable, "-m", "host_kernel", "lineage", aid, "--record",
                              str(chains.record_dir), "--format", "json", *extra],
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    whole = {n["attrs"].get("path") for n in lineage("--depth", "all")["nodes"]}
    near = {n["attrs"].get("path") for n in lineage("--depth", "1")["nodes"]}
    assert {"mid2.parquet", "raw.csv"} <= whole
    assert "mid2.parquet" in near and "raw.csv" not in near
    statement = subprocess.run([sys.executable, "-m", "host_kernel", "lineage", aid, "--record",
                                str(chains.record_dir), "--format", "in-toto"],
                               capture_output=True, text=True, timeout=60, check=False)
    assert statement.returncode == 0, statement.stderr
    doc = json.loads(statement.stdout)
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert [m["name"] for m in doc["predicate"]["materials"]] == ["mid2.parquet"]
    derivation = doc["predicate"]["byproducts"]["derivations"][0]
    assert derivation["name"] == "mid2.parquet"
    assert [m["name"] for m in derivation["materials"]] == ["raw.csv"]
    bad = subprocess.run([sys.executable, "-m", "host_kernel", "lineage", aid, "--record",
                          str(chains.record_dir), "--depth", "0"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--depth" in bad.stderr


def test_prov_json_carries_the_chain(chains: Host) -> None:
    aid = _saved(chains, "import pandas as pd\nm = pd.read_parquet('mid.parquet')\n"
                         "m.to_csv('again.csv')\na = host.save_artifact('again.csv')")
    doc = _graph(chains, aid).to_prov()
    derived = {(r["prov:generatedEntity"], r["prov:usedEntity"])
               for r in doc["wasDerivedFrom"].values()}
    mid = next(k for k in doc["entity"] if k.startswith("hk:file_mid.parquet"))
    raw = next(k for k in doc["entity"] if k.startswith("hk:file_raw.csv"))
    assert (mid, raw) in derived
    assert any(g["prov:entity"] == mid for g in doc["wasGeneratedBy"].values())


def _graph(host: Host, aid: str):  # type: ignore[no-untyped-def]
    from host_kernel.lineage.graph import build_lineage

    assert host.ledger is not None
    return build_lineage(host.ledger, aid)


def test_in_a_cell_inputs_are_direct_and_upstream_walks(chains: Host) -> None:
    aid = _saved(chains, "import pandas as pd\nm = pd.read_parquet('mid.parquet')\n"
                         "m.to_csv('cell.csv')\na = host.save_artifact('cell.csv')")
    out = run_ok(chains, f"g = host.lineage({aid!r})\n"
                         "print(sorted(n.label for n in g.inputs() if n.kind == 'file'))\n"
                         "print(sorted(n.label for n in g.upstream() if n.kind == 'file'))")
    direct, upstream = out.strip().splitlines()[-2:]
    assert direct == "['mid.parquet']"
    assert upstream == "['mid.parquet', 'raw.csv']"


def test_no_stray_paths(tmp_path: Path) -> None:
    # depth() on a graph with nothing upstream keeps just the root and its cell
    from host_kernel.lineage.model import Lineage, LineageEdge, LineageNode

    g = Lineage("artifact:a", (LineageNode("artifact:a", "artifact", "a"),
                               LineageNode("cell:c", "cell", "c")),
                (LineageEdge("artifact:a", "cell:c", "wasGeneratedBy"),))
    assert [n.id for n in g.depth(1).nodes] == ["artifact:a", "cell:c"]
    assert g.upstream() == []
