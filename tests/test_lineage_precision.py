"""False positives of lineage removed by design (issue 29), through real cells and a real Host.

Three causes: a read named only by a statement that binds nothing (``print(open(p).read())``
beside the real computation), a container filled from many files of which only some keys
reach the artifact, and state kept inside a function object (``functools.lru_cache``, a memo
dict in a closure), where a later call reads nothing because the read happened when the
cache was filled. Each test asserts which files are (and are not) among the artifact's
direct inputs, so it holds whether or not inputs bring their own upstream inputs along.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _helpers import run_ok

from host_kernel import Host
from host_kernel.lineage.graph import build_lineage

CITIES = ("oslo", "bergen", "tromso")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    ws = tmp_path_factory.mktemp("precision")
    (ws / "data").mkdir()
    (ws / "stations").mkdir()
    (ws / "data" / "a.csv").write_text("x,y\n1,2\n3,4\n")
    (ws / "data" / "b.csv").write_text("x,y\n5,6\n")
    (ws / "notes.txt").write_text("read me, print me, forget me\n")
    (ws / "which.txt").write_text("bergen\n")
    for i, city in enumerate(CITIES):
        (ws / "stations" / f"{city}.csv").write_text(f"t\n{i}\n{i + 1}\n")
    with Host(ws) as h:
        run_ok(h, "import pandas as pd")
        yield h


def _inputs(host: Host, code: str) -> list[str]:
    """Run a cell ending in ``a = host.save_artifact(...)``; the paths of its direct inputs."""
    aid = run_ok(host, code + "\nprint(a.artifact_id)").strip().splitlines()[-1]
    assert host.ledger is not None
    nodes = build_lineage(host.ledger, aid).inputs()
    assert all(n.kind == "file" for n in nodes), nodes
    return sorted(str(n.attrs.get("path")) for n in nodes)


# -- 1. a read named only in a statement that binds nothing ------------------------------


def test_a_file_only_printed_beside_the_computation_is_not_an_input(host: Host) -> None:
    found = _inputs(host, "df = pd.read_csv('data/a.csv')\np = 'notes.txt'\n"
                          "print(open(p).read())\n"
                          "df.to_csv('printed.csv')\n"
                          "a = host.save_artifact('printed.csv')")
    assert "notes.txt" not in found
    assert "data/a.csv" in found


def test_a_file_only_logged_through_a_name_of_an_earlier_cell_is_not_an_input(
        host: Host) -> None:
    run_ok(host, "import logging\nnotes = 'notes.txt'")
    found = _inputs(host, "df = pd.read_csv('data/a.csv')\n"
                          "logging.info(open(notes).read())\n"
                          "print(pd.read_csv('data/b.csv').shape)\n"
                          "df.to_csv('logged.csv')\n"
                          "a = host.save_artifact('logged.csv')")
    assert "notes.txt" not in found
    assert "data/b.csv" not in found
    assert "data/a.csv" in found


def test_a_file_read_through_a_path_a_sink_names_but_does_not_read_stays_an_input(
        host: Host) -> None:
    """``os.symlink`` names ``data/b.csv`` without reading it; the read is through the link,
    whose path the analysis cannot follow: it must still reach what was built from it."""
    found = _inputs(host, "import os, tempfile\n"
                          "ln = os.path.join(tempfile.mkdtemp(), 'ln.csv')\n"
                          "os.symlink(os.path.abspath('data/b.csv'), ln)\n"
                          "b = open(ln).read()\n"
                          "open('linked.txt', 'w').write(b + '!')\n"
                          "a = host.save_artifact('linked.txt')")
    assert found == ["data/b.csv"]


# -- 2. containers filtered by key ---------------------------------------------------------


def test_one_key_of_a_dict_comprehension_over_files_brings_only_its_file(host: Host) -> None:
    run_ok(host, "stations = {name: pd.read_csv(f'stations/{name}.csv')\n"
                 "            for name in ['oslo', 'bergen', 'tromso']}")
    found = _inputs(host, "keep = stations['oslo']\nkeep.to_csv('oslo.csv')\n"
                          "a = host.save_artifact('oslo.csv')")
    assert found == ["stations/oslo.csv"]


def test_a_dict_filled_in_a_loop_brings_only_the_keys_that_reach_the_artifact(
        host: Host) -> None:
    run_ok(host, "names = ['oslo', 'bergen', 'tromso']")
    run_ok(host, "filled = {}\nfor name in names:\n"
                 "    filled[name] = pd.read_csv(f'stations/{name}.csv')")
    found = _inputs(host, "two = {k: v for k, v in filled.items() if k in ('oslo', 'bergen')}\n"
                          "pd.concat(two.values()).to_csv('two.csv')\n"
                          "a = host.save_artifact('two.csv')")
    assert found == ["stations/bergen.csv", "stations/oslo.csv"]
    found = _inputs(host, "filled['bergen'].to_csv('bergen.csv')\n"
                          "a = host.save_artifact('bergen.csv')")
    assert found == ["stations/bergen.csv"]


def test_each_value_of_a_dict_written_out_in_a_loop_brings_only_its_own_file(
        host: Host) -> None:
    run_ok(host, "per = {n: pd.read_csv(f'stations/{n}.csv') for n in "
                 "['oslo', 'bergen', 'tromso']}")
    found = _inputs(host, "import os\nos.makedirs('out', exist_ok=True)\n"
                          "for n in ['oslo', 'bergen', 'tromso']:\n"
                          "    per[n].assign(k=1).to_csv(f'out/{n}.csv')\n"
                          "a = host.save_artifact('out/bergen.csv')")
    assert found == ["stations/bergen.csv"]


def test_one_element_of_a_list_of_reads_brings_only_its_file(host: Host) -> None:
    found = _inputs(host, "frames = [pd.read_csv('data/a.csv'), pd.read_csv('data/b.csv')]\n"
                          "frames[1].to_csv('second.csv')\n"
                          "a = host.save_artifact('second.csv')")
    assert found == ["data/b.csv"]


def test_a_key_that_cannot_be_known_brings_the_whole_dict(host: Host) -> None:
    run_ok(host, "per_city = {name: pd.read_csv(f'stations/{name}.csv') for name in "
                 "['oslo', 'bergen', 'tromso']}")
    found = _inputs(host, "k = open('which.txt').read().strip()\n"
                          "per_city[k].to_csv('picked.csv')\n"
                          "a = host.save_artifact('picked.csv')")
    assert found == sorted(["which.txt", *(f"stations/{c}.csv" for c in CITIES)])


# -- 3. state inside a function object --------------------------------------------------


def test_a_value_served_by_lru_cache_carries_the_read_that_filled_the_cache(
        host: Host) -> None:
    run_ok(host, "import functools\n@functools.lru_cache(maxsize=None)\n"
                 "def load(path):\n    return open(path).read()")
    run_ok(host, "first = load('data/a.csv')")
    found = _inputs(host, "again = load('data/a.csv')\n"
                          "open('cached.txt', 'w').write(again + '!')\n"
                          "a = host.save_artifact('cached.txt')")
    assert "data/a.csv" in found


def test_a_value_served_by_a_memo_dict_in_a_closure_carries_the_read_that_filled_it(
        host: Host) -> None:
    run_ok(host, "def memoised():\n    memo = {}\n    def get(path):\n"
                 "        if path not in memo:\n            memo[path] = open(path).read()\n"
                 "        return memo[path]\n    return get\n"
                 "_seen = {}\ndef remember(path):\n"
                 "    if path not in _seen:\n        _seen[path] = open(path).read()\n"
                 "    return _seen[path]")
    run_ok(host, "warm = remember('data/b.csv')\nget = memoised()")
    run_ok(host, "warm_too = get('data/a.csv')")
    found = _inputs(host, "again = remember('data/b.csv')\n"
                          "open('memo.txt', 'w').write(again + '!')\n"
                          "a = host.save_artifact('memo.txt')")
    assert "data/b.csv" in found
    found = _inputs(host, "again_too = get('data/a.csv')\n"
                          "open('closure.txt', 'w').write(again_too + '!')\n"
                          "a = host.save_artifact('closure.txt')")
    assert "data/a.csv" in found
