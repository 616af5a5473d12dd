"""Slices and re-derivation through real cells: one exploratory session with many artifacts
(pandas, numpy, matplotlib PNG and SVG, a host.bash script, %run, a workspace module, a
restart, a cache, a dict filtered by key, an intermediate parquet), each re-derived in a
fresh confined kernel on its recorded input bytes; a timestamp that differs, with the hint;
reads the lineage could not see (an already-open descriptor, an untraced C read) reported
as lineage_incomplete naming the file; --minimal naming an input that is not needed; and
the CLI (slice -o, --notebook, rederive, audit --rederive)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import run_ok

from host_kernel import Host

pytest.importorskip("pandas", reason="the realistic sessions use pandas")
pytest.importorskip("matplotlib", reason="the realistic sessions draw with matplotlib")

SUMMARIZE = """import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
total = sum(float(r['value']) for r in rows)
open(sys.argv[2], 'w').write(f'{len(rows)} rows, total {total:.3f}\\n')
"""
PREP = """import pandas as pd
prepared = pd.read_csv('data/measurements.csv')
prepared['value2'] = prepared['value'] ** 2
"""
HELPERS = """def scale(xs, k):
    return [x * k for x in xs]
"""


def _lab_files(ws: Path) -> None:
    (ws / "data" / "stations").mkdir(parents=True)
    rows = ["station,day,value"] + [f"{s},{d},{(d * 7 + i * 3) % 11 / 3:.4f}"
                                    for i, s in enumerate(["oslo", "bergen", "tromso"])
                                    for d in range(1, 31)]
    (ws / "data" / "measurements.csv").write_text("\n".join(rows) + "\n")
    for i, name in enumerate(["oslo", "bergen", "tromso", "bodo"]):
        (ws / "data" / "stations" / f"{name}.csv").write_text(
            "day,temp\n" + "".join(f"{d},{(d + i) % 9 - 2}\n" for d in range(1, 15)))
    (ws / "data" / "notes.txt").write_text("calibrated 2026-11-30\n")
    (ws / "scripts").mkdir()
    (ws / "scripts" / "summarize.py").write_text(SUMMARIZE)
    (ws / "scripts" / "prep.py").write_text(PREP)
    (ws / "analysis").mkdir()
    (ws / "analysis" / "__init__.py").write_text("")
    (ws / "analysis" / "helpers.py").write_text(HELPERS)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, dict[str, str]]]:
    ws = tmp_path_factory.mktemp("lab")
    _lab_files(ws)
    ids: dict[str, str] = {}
    with Host(ws) as host:
        def cell(code: str) -> None:
            run_ok(host, code)

        def save(name: str, code: str) -> None:
            out = run_ok(host, code + f"\nprint('ID', host.save_artifact({name!r}).artifact_id)")
            ids[name] = out.split("ID ")[-1].split()[0]

        cell("import os\nimport pandas as pd\nimport numpy as np\nos.makedirs('out', exist_ok=True)")
        cell("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt")
        cell("df = pd.read_csv('data/measurements.csv')\ndf.head()")
        cell("unrelated = list(range(10))\nprint(sum(unrelated))")
        save("out/means.csv", "means = df.groupby('station')['value'].mean().round(6)\n"
                              "means.to_csv('out/means.csv')")
        save("out/arr.npy", "arr = np.loadtxt('data/measurements.csv', delimiter=',', "
                            "skiprows=1, usecols=2)\nnp.save('out/arr.npy', np.cumsum(arr))")
        save("out/fig.png", "fig, ax = plt.subplots(figsize=(4, 3))\n"
                            "for s, g in df.groupby('station'):\n    ax.plot(g.day, g.value, label=s)\n"
                            "ax.legend()\nfig.savefig('out/fig.png', dpi=60)\nplt.close(fig)")
        save("out/fig.svg", "plt.rcParams['svg.hashsalt'] = 'host-kernel'\n"
                            "fig2, ax2 = plt.subplots(figsize=(3, 2))\nax2.bar(means.index, means.values)\n"
                            "fig2.savefig('out/fig.svg', metadata={'Date': None})\nplt.close(fig2)")
        cell("r = host.bash('python scripts/summarize.py data/measurements.csv out/summary.txt')\n"
             "assert r.exit_status == 0, r")
        save("out/summary.txt", "print(open('out/summary.txt').read())")
        cell("%run scripts/prep.py")
        save("out/prepared.csv", "prepared.describe().round(6).to_csv('out/prepared.csv')")
        cell("from analysis.helpers import scale")
        save("out/scaled.txt", "open('out/scaled.txt', 'w').write(repr(scale(list(means.values), 3)))")
        cell("import functools\n@functools.lru_cache\ndef station(name):\n"
             "    return pd.read_csv(f'data/stations/{name}.csv')")
        cell("warm = station('oslo').temp.sum()")
        save("out/oslo.txt", "open('out/oslo.txt', 'w').write(str(station('oslo').temp.max()))")
        cell("temps = {n: pd.read_csv(f'data/stations/{n}.csv') for n in "
             "['oslo', 'bergen', 'tromso', 'bodo']}")
        save("out/north.csv", "pd.concat([temps['tromso'], temps['bodo']]).to_csv('out/north.csv')")
        cell("df.assign(v3=df.value * 3).to_parquet('out/mid.parquet')")
        cell("import pickle\npickle.dump(means.to_dict(), open('out/means.pkl', 'wb'))")
        host.restart()
        save("out/from_mid.csv", "import pandas as pd\nimport pickle\n"
                                 "m = pd.read_parquet('out/mid.parquet')\n"
                                 "k = pickle.load(open('out/means.pkl', 'rb'))\n"
                                 "m.groupby('station').v3.sum().mul(len(k)).to_csv('out/from_mid.csv')")
        save("out/stamp.txt", "import datetime\nopen('out/stamp.txt', 'w').write("
                              "'made at ' + datetime.datetime.now().isoformat() + '\\n')")
        cell("import os\nextra = open('data/notes.txt').read() if os.path.exists('data/notes.txt') "
             "else ''\nm2 = pd.read_parquet('out/mid.parquet')")
        save("out/tagged.csv", "m2.attrs['notes'] = extra\nm2.head(3).to_csv('out/tagged.csv')")
        yield host, ids


DETERMINISTIC = ["out/means.csv", "out/arr.npy", "out/fig.png", "out/fig.svg",
                 "out/summary.txt", "out/prepared.csv", "out/scaled.txt", "out/oslo.txt",
                 "out/north.csv", "out/from_mid.csv"]


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_each_deterministic_artifact_is_reproduced_from_its_slice(
        lab: tuple[Host, dict[str, str]], name: str) -> None:
    host, ids = lab
    result = host.rederive(ids[name])
    assert result.outcome == "reproduced", result.line()
    # the slice is smaller than the session: the unrelated cell is never in it
    sliced = _slice(host, ids[name])
    assert all("unrelated" not in c.code for c in sliced.cells)
    assert len(sliced.cells) < sliced.session_cells


def _slice(host: Host, aid: str):  # type: ignore[no-untyped-def]
    from host_kernel.lineage.slice import compute_slice

    assert host.ledger is not None
    return compute_slice(host.ledger, aid)


def test_the_slices_hold_what_each_artifact_needs(lab: tuple[Host, dict[str, str]]) -> None:
    host, ids = lab
    summary = _slice(host, ids["out/summary.txt"])
    assert any("host.bash('python scripts/summarize.py" in c.code for c in summary.cells)
    assert {i.path for i in summary.inputs} == {"data/measurements.csv", "scripts/summarize.py"}
    prepared = _slice(host, ids["out/prepared.csv"])
    assert any("%run scripts/prep.py" in c.code for c in prepared.cells)
    assert "scripts/prep.py" in {i.path for i in prepared.inputs}
    north = _slice(host, ids["out/north.csv"])
    assert {i.path for i in north.inputs} == {"data/stations/tromso.csv",
                                              "data/stations/bodo.csv"} or \
        {"data/stations/tromso.csv", "data/stations/bodo.csv"} <= {i.path for i in north.inputs}
    chained = _slice(host, ids["out/from_mid.csv"])
    gens = [c.generation for c in chained.cells]
    assert gens == sorted(gens) and len(set(gens)) == 2  # across the restart
    assert {i.path for i in chained.inputs} == {"data/measurements.csv"}
    assert "the kernel restarted here" in chained.to_script()


def test_a_timestamp_differs_and_says_so(lab: tuple[Host, dict[str, str]]) -> None:
    host, ids = lab
    result = host.rederive(ids["out/stamp.txt"])
    assert result.outcome == "differs", result.line()
    assert result.comparison is not None and "made at" in result.comparison["diff"]
    assert "timestamp" in (result.comparison["hint"] or "")


def test_minimal_names_an_input_the_artifact_does_not_need(
        lab: tuple[Host, dict[str, str]]) -> None:
    host, ids = lab
    sliced = _slice(host, ids["out/tagged.csv"])
    assert "data/notes.txt" in {i.path for i in sliced.inputs}
    lines: list[str] = []
    result = host.rederive(ids["out/tagged.csv"], minimal=True, progress=lines.append)
    assert result.outcome == "reproduced", result.line()
    assert result.not_needed is not None and "data/notes.txt" in result.not_needed
    assert "data/measurements.csv" not in result.not_needed
    assert any("without data/notes.txt" in line for line in lines)
    assert any(line.startswith("cell 1/") for line in lines)


def test_a_read_through_an_already_open_descriptor_is_lineage_incomplete(
        tmp_path: Path) -> None:
    """A thread an earlier cell left running opens the file between two cells (an access
    the record keeps apart, as ``traced.between``, never an input); the next cell reads
    through that descriptor. The lineage cannot name the file; re-derivation does."""
    (tmp_path / "secret.txt").write_text("42\n")
    with Host(tmp_path) as host:
        run_ok(host, "import os, threading, time\nbox = {}\ndef later():\n"
                     "    time.sleep(1.5)\n    box['fd'] = os.open('secret.txt', os.O_RDONLY)\n"
                     "threading.Thread(target=later).start()")
        time.sleep(3.0)
        out = run_ok(host, "for _ in range(100):\n    if 'fd' in box:\n        break\n"
                           "    time.sleep(0.05)\n"
                           "open('copy.txt', 'w').write(os.pread(box['fd'], 100, 0).decode())\n"
                           "print('ID', host.save_artifact('copy.txt').artifact_id)")
        aid = out.split("ID ")[-1].split()[0]
        from host_kernel.lineage.graph import build_lineage

        assert host.ledger is not None
        assert not [n for n in build_lineage(host.ledger, aid).inputs() if n.kind == "file"]
        result = host.rederive(aid)
    assert result.outcome == "lineage_incomplete", result.line()
    assert result.missing == ["secret.txt"]


def test_an_untraced_read_in_c_is_lineage_incomplete(tmp_path: Path) -> None:
    (tmp_path / "hidden.txt").write_text("hidden bytes\n")
    with Host(tmp_path, trace=False) as host:
        out = run_ok(host, "import ctypes\nlibc = ctypes.CDLL(None)\n"
                           "libc.fopen.restype = ctypes.c_void_p\n"
                           "f = libc.fopen(b'hidden.txt', b'r')\nbuf = ctypes.create_string_buffer(64)\n"
                           "n = libc.fread(buf, 1, 64, ctypes.c_void_p(f)) if f else 0\n"
                           "open('seen.txt', 'wb').write(buf.raw[:n])\n"
                           "print('ID', host.save_artifact('seen.txt').artifact_id)")
        aid = out.split("ID ")[-1].split()[0]
        result = host.rederive(aid)
    assert result.outcome == "lineage_incomplete", result.line()
    assert result.missing == ["hidden.txt"]


def test_the_cli_writes_a_runnable_slice_and_rederives(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "in.csv").write_text("a,b\n1,2\n3,4\n")
    with Host(ws) as host:
        run_ok(host, "import csv\nrows = list(csv.DictReader(open('in.csv')))")
        run_ok(host, "noise = 1")
        out = run_ok(host, "open('total.txt', 'w').write(str(sum(int(r['a']) for r in rows)))\n"
                           "print('ID', host.save_artifact('total.txt').artifact_id)")
        aid = out.split("ID ")[-1].split()[0]
        record = host.record_dir

    def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "host_kernel", *args], capture_output=True,
                              text=True, timeout=300, cwd=cwd, check=False)

    script = tmp_path / "make_total.py"
    done = cli("slice", aid, "--record", str(record), "-o", str(script))
    assert done.returncode == 0, done.stderr
    text = script.read_text()
    assert "in.csv" in text.split('"""')[1] and "noise" not in text
    # it runs as a plain script, in a folder holding only its inputs
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "in.csv").write_text("a,b\n1,2\n3,4\n")
    ran = subprocess.run([sys.executable, str(script)], cwd=fresh, capture_output=True,
                         text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    assert (fresh / "total.txt").read_text() == "4"
    nb = tmp_path / "make_total.ipynb"
    done = cli("slice", aid, "--record", str(record), "-o", str(nb), "--notebook")
    assert done.returncode == 0, done.stderr
    import nbformat

    notebook = nbformat.read(str(nb), as_version=4)
    nbformat.validate(notebook)
    assert len([c for c in notebook.cells if c.cell_type == "code"]) == 2
    done = cli("rederive", aid, "--record", str(record), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "reproduced"
    done = cli("audit", str(record), "--rederive")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reproduced: artifact " + aid in done.stdout
    missing = cli("rederive", "no-such-artifact", "--record", str(record))
    assert missing.returncode == 2 and "no artifact" in missing.stderr


def test_audit_rederive_fails_on_an_artifact_that_differs(tmp_path: Path) -> None:
    with Host(tmp_path) as host:
        run_ok(host, "import random\nopen('r.txt', 'w').write(str(random.random()))\n"
                     "host.save_artifact('r.txt')")
        record = host.record_dir
    done = subprocess.run([sys.executable, "-m", "host_kernel", "audit", str(record),
                           "--rederive"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stdout
    assert "[differs]" in done.stderr
    assert "random" in done.stdout  # the hint: unseeded randomness


def test_host_slice_from_a_cell(lab: tuple[Host, dict[str, str]]) -> None:
    host, ids = lab
    out = run_ok(host, f"s = host.slice({ids['out/means.csv']!r})\n"
                       "print(len(s.cells), [i.path for i in s.inputs])\n"
                       "print('read_csv' in s.to_script())")
    first, second = out.strip().splitlines()[-2:]
    assert first.split()[0] in {"3", "4"} and "data/measurements.csv" in first
    assert second == "True"
    refused = run_ok(host, "try:\n    host.slice('nope')\nexcept Exception as e:\n    print(e)")
    assert "no artifact" in refused


def _submit(host: Host, output: str, rederive: str = "True") -> str:
    return run_ok(host, "from host_kernel import SubmissionRefused\ntry:\n"
                        f"    v = host.submit_output({output}, ['made it'], rederive={rederive})\n"
                        "    print('ACCEPTED')\nexcept SubmissionRefused as e:\n"
                        "    print('REFUSED', e)")


def test_rederive_true_accepts_only_what_the_slice_remakes(tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_text("v\n1\n2\n3\n")
    with Host(tmp_path, mode="analysis_run") as host:
        run_ok(host, "import csv\nvals = [int(r['v']) for r in csv.DictReader(open('in.csv'))]")
        good = run_ok(host, "open('sum.txt', 'w').write(str(sum(vals)))\n"
                            "print('ID', host.save_artifact('sum.txt').artifact_id)"
                      ).split("ID ")[-1].split()[0]
        bad = run_ok(host, "import random\nopen('noise.txt', 'w').write(str(random.random()))\n"
                           "print('ID', host.save_artifact('noise.txt').artifact_id)"
                     ).split("ID ")[-1].split()[0]
        accepted = _submit(host, f"{{'artifacts': [{good!r}]}}")
        assert "ACCEPTED" in accepted, accepted
        assert "re-deriving" in accepted  # progress in the cell
        refused = _submit(host, f"{{'artifacts': [{good!r}, {bad!r}]}}")
        assert "REFUSED" in refused and "not_rederived" in refused and "differs" in refused
        nothing = _submit(host, "{'answer': 6}")
        assert "REFUSED" in nothing and "claims no artifact" in nothing
        wrong = _submit(host, f"{{'artifacts': [{good!r}]}}", rederive="'yes'")
        assert "REFUSED" in wrong and "must be True or False" in wrong
        verdicts = host.own_rows("SELECT body FROM events WHERE kind = 'submission_verdict' "
                                 "ORDER BY seq")
        first = json.loads(verdicts[0]["body"])["verdict"]
        assert [s["kind"] for s in first["reproduction"]] == ["rederivation"]
        record = host.record_dir
    from host_kernel.audit import audit

    report = audit(record)
    assert not [f for f in report.findings if f.fatal], [str(f) for f in report.findings]


def test_a_background_writer_cannot_plant_the_artifact_in_the_rederivation(
        tmp_path: Path) -> None:
    """The attacker's cell leaves a process that copies the session's bytes of the claimed
    file into every folder it can find that looks like a re-derivation's workspace, so that
    a slice that cannot remake them would seem to. The fresh workspace is the Host's, out
    of the kernel's view: the claim is refused."""
    watcher = ("import glob, os, shutil, time\n"
               "for _ in range(6000):\n"
               "    for d in glob.glob('/tmp/hk-rederive-*/workspace') + "
               "glob.glob('/tmp/*/hk-rederive-*/workspace'):\n"
               "        try:\n"
               "            shutil.copy('claim.txt', d)\n"
               "        except OSError:\n"
               "            pass\n"
               "    time.sleep(0.005)\n")
    with Host(tmp_path, mode="analysis_run") as host:
        run_ok(host, f"import subprocess, sys\nwatcher = subprocess.Popen([sys.executable, "
                     f"'-c', {watcher!r}])")
        aid = run_ok(host, "import os\nopen('claim.txt', 'w').write(os.urandom(8).hex())\n"
                           "print('ID', host.save_artifact('claim.txt').artifact_id)"
                     ).split("ID ")[-1].split()[0]
        refused = _submit(host, f"{{'artifacts': [{aid!r}]}}")
        run_ok(host, "watcher.kill()")
    assert "REFUSED" in refused and "not_rederived" in refused, refused
    assert "differs" in refused


def test_a_hostile_path_in_the_record_does_not_become_code_in_the_script() -> None:
    from host_kernel.lineage.slice import Slice, SliceCell, SliceInput

    hostile = 'p\\N{x}\n"""\nimport os; os.system("touch pwned")'
    sliced = Slice("a", "f", "out.txt", "ab", "s",
                   (SliceCell("c", 1, 1, "x = 1", "ok", f"wrote {hostile}"),),
                   (SliceInput(hostile, "h"),))
    script = sliced.to_script()
    tree = compile(script, "slice.py", "exec", flags=0x400)  # ast.PyCF_ONLY_AST
    assert [type(node).__name__ for node in tree.body] == ["Expr", "Assign"]


def test_rederivation_refuses_to_run_a_slice_unconfined(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_KERNEL_FAKE_NO_LANDLOCK", "1")
    with Host(tmp_path) as host:
        aid = run_ok(host, "open('o.txt', 'w').write('1')\n"
                           "print('ID', host.save_artifact('o.txt').artifact_id)"
                     ).split("ID ")[-1].split()[0]
        result = host.rederive(aid)
    assert result.outcome == "failed", result.line()
    assert "could not start a confined kernel" in result.detail


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A workspace outside /tmp (which every confined kernel sees as a fresh, empty
    folder): where most users' projects are, readable by any confined kernel unless the
    Host hides it."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=".hk-rederive-test-",
                                   dir=Path(__file__).resolve().parent.parent))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_slice_cannot_read_the_first_run_where_it_lies(outside_tmp: Path) -> None:
    """The slice, run again, copies the artifact from the original workspace by its
    absolute path when it can see it, and makes new random bytes otherwise: only a
    re-derivation that cannot see the first run's workspace, record or private temp
    folder tells it apart from an honest one."""
    ws = outside_tmp
    with Host(ws, mode="analysis_run") as host:
        cell = (f"import os, shutil\nfirst = {str(host.workdir / 'claim.txt')!r}\n"
                "stash = os.path.join(os.environ.get('TMPDIR', '/tmp'), 'claim.keep')\n"
                "found = [p for p in (first, stash) if os.path.exists(p) and "
                "os.path.realpath(p) != os.path.realpath('claim.txt')]\n"
                "if found:\n    shutil.copy(found[0], 'claim.txt')\nelse:\n"
                "    open('claim.txt', 'w').write(os.urandom(8).hex())\n"
                "    shutil.copy('claim.txt', stash)\n"
                "print('ID', host.save_artifact('claim.txt').artifact_id)")
        aid = run_ok(host, cell).split("ID ")[-1].split()[0]
        result = host.rederive(aid)
        # it sees the path (Landlock hides bytes, not names) and fails to copy it
        assert result.outcome in ("differs", "failed"), result.line()
        refused = _submit(host, f"{{'artifacts': [{aid!r}]}}")
    assert "REFUSED" in refused and "not_rederived" in refused, refused


def test_a_later_rederive_cannot_read_the_first_run_where_it_lies(outside_tmp: Path) -> None:
    """The same slice re-derived from the record after its Host closed (a reviewer's
    `host-kernel rederive`): the first run's workspace is no live session's any more."""
    ws = outside_tmp
    with Host(ws) as host:
        cell = (f"import os, shutil\nfirst = {str(host.workdir / 'claim.txt')!r}\n"
                "if os.path.exists(first) and os.path.realpath(first) != "
                "os.path.realpath('claim.txt'):\n    shutil.copy(first, 'claim.txt')\nelse:\n"
                "    open('claim.txt', 'w').write(os.urandom(8).hex())\n"
                "print('ID', host.save_artifact('claim.txt').artifact_id)")
        aid = run_ok(host, cell).split("ID ")[-1].split()[0]
        record = host.record_dir
    done = subprocess.run([sys.executable, "-m", "host_kernel", "rederive", aid, "--record",
                           str(record), "--json"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert json.loads(done.stdout)["outcome"] in ("differs", "failed"), done.stdout + done.stderr
    assert done.returncode == 1
