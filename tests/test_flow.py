"""Carrying reads forward across cells: scenarios as sequences of cells.

Each cell is (cell id, code, files it read, files it wrote), as the Host
would report it after capture; the code is never run.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest

from host_kernel.lineage.flow import DEF_USE, OBSERVED, RECEIPT, FlowTracker, Source

Cell = tuple[str, str, Sequence[str], Sequence[str]]


def read(path: str, cell: str, sha: str | None = None) -> Source:
    return Source(key=f"file:{path}", method=OBSERVED, via_cell=cell, sha256=sha)


def run(cells: Sequence[Cell], tracker: FlowTracker | None = None) -> FlowTracker:
    tracker = tracker or FlowTracker()
    for cell_id, code, reads, writes in cells:
        tracker.observe_cell(cell_id, code, [read(p, cell_id) for p in reads], list(writes))
    return tracker


def summary(sources: Sequence[Source]) -> list[tuple[str, str, str]]:
    return [(s.key, s.method, s.via_cell) for s in sources]


# -- basic edges -----------------------------------------------------------------


def test_read_in_the_writing_cell_is_an_observed_input() -> None:
    tracker = run(
        [("c1", "open('out.csv', 'w').write(open('in.csv').read())", ["in.csv"], ["out.csv"])]
    )
    assert summary(tracker.inputs_for_file("out.csv")) == [("file:in.csv", OBSERVED, "c1")]


def test_read_flows_through_a_variable_to_a_later_write() -> None:
    tracker = run(
        [
            ("c1", "data = open('in.csv').read()", ["in.csv"], []),
            ("c2", "open('out.csv', 'w').write(data.upper())", [], ["out.csv"]),
        ]
    )
    assert summary(tracker.inputs_for_file("out.csv")) == [("file:in.csv", DEF_USE, "c1")]


def test_hash_at_read_time_is_kept() -> None:
    tracker = FlowTracker()
    tracker.observe_cell("c1", "data = load()", [read("in.csv", "c1", sha="ab" * 32)], [])
    tracker.observe_cell("c2", "save(data)", [], ["out.csv"])
    (source,) = tracker.inputs_for_file("out.csv")
    assert source.sha256 == "ab" * 32


def test_chain_over_several_cells_is_followed() -> None:
    tracker = run(
        [
            ("c1", "raw = load('in.csv')", ["in.csv"], []),
            ("c2", "clean = tidy(raw)", [], []),
            ("c3", "table = summarise(clean)", [], []),
            ("c4", "save('out.csv', table)", [], ["out.csv"]),
        ]
    )
    assert summary(tracker.inputs_for_file("out.csv")) == [("file:in.csv", DEF_USE, "c1")]


def test_direct_reads_and_carried_reads_combine_in_cell_order() -> None:
    tracker = run(
        [
            ("c1", "a = load('a.csv')", ["a.csv"], []),
            ("c2", "b = load('b.csv')", ["b.csv"], []),
            ("c3", "save(a, b, load('c.csv'))", ["c.csv"], ["out.csv"]),
        ]
    )
    assert summary(tracker.inputs_for_file("out.csv")) == [
        ("file:c.csv", OBSERVED, "c3"),
        ("file:a.csv", DEF_USE, "c1"),
        ("file:b.csv", DEF_USE, "c2"),
    ]


def test_a_file_never_written_has_no_inputs() -> None:
    tracker = run([("c1", "data = load('in.csv')", ["in.csv"], [])])
    assert tracker.inputs_for_file("in.csv") == ()
    assert tracker.inputs_for_file("nowhere.csv") == ()


# -- precision -------------------------------------------------------------------


def test_decoy_read_whose_variable_is_unused_does_not_appear() -> None:
    tracker = run(
        [
            ("c1", "real = load('real.csv')", ["real.csv"], []),
            ("c2", "decoy = load('decoy.csv')", ["decoy.csv"], []),
            ("c3", "save('out.csv', real)", [], ["out.csv"]),
        ]
    )
    assert summary(tracker.inputs_for_file("out.csv")) == [("file:real.csv", DEF_USE, "c1")]


def test_path_named_in_a_string_but_never_opened_does_not_appear() -> None:
    tracker = run(
        [("c1", "path = 'secret.csv'\nopen('out.txt', 'w').write(path)", [], ["out.txt"])]
    )
    assert tracker.inputs_for_file("out.txt") == ()


def test_rebinding_a_variable_cuts_the_stale_edge() -> None:
    tracker = run(
        [
            ("c1", "x = load('old.csv')", ["old.csv"], []),
            ("c2", "x = load('new.csv')", ["new.csv"], []),
            ("c3", "save('out.csv', x)", [], ["out.csv"]),
        ]
    )
    assert summary(tracker.inputs_for_file("out.csv")) == [("file:new.csv", DEF_USE, "c2")]


def test_del_clears_a_names_taint() -> None:
    tracker = run([("c1", "x = load('a.csv')", ["a.csv"], []), ("c2", "del x", [], [])])
    assert tracker.names_taint("x") == ()


def test_reads_within_one_cell_reach_every_name_it_binds() -> None:
    # documented cell-level approximation: both names get both reads
    tracker = run(
        [
            ("c1", "a = load('a.csv')\nb = load('b.csv')", ["a.csv", "b.csv"], []),
            ("c2", "save('out.csv', a)", [], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:a.csv", "file:b.csv"]


def test_inputs_are_a_snapshot_taken_when_the_file_was_written() -> None:
    tracker = run(
        [
            ("c1", "x = load('a.csv')", ["a.csv"], []),
            ("c2", "save('out.csv', x)", [], ["out.csv"]),
            ("c3", "x = load('b.csv')", ["b.csv"], []),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:a.csv"]


# -- mutation, imports, builtins --------------------------------------------------


def test_mutation_adds_the_new_taint_to_the_old() -> None:
    tracker = run(
        [
            ("c1", "rows = load('base.csv')", ["base.csv"], []),
            ("c2", "x = load('extra.csv')", ["extra.csv"], []),
            ("c3", "rows.append(x)", [], []),
            ("c4", "save('out.csv', rows)", [], ["out.csv"]),
        ]
    )
    assert summary(tracker.inputs_for_file("out.csv")) == [
        ("file:base.csv", DEF_USE, "c1"),
        ("file:extra.csv", DEF_USE, "c2"),
    ]


def test_mutation_of_an_empty_container_carries_the_appended_value() -> None:
    tracker = run(
        [
            ("c1", "rows = []", [], []),
            ("c2", "x = load('a.csv')", ["a.csv"], []),
            ("c3", "rows.append(x)", [], []),
            ("c4", "save('out.csv', rows)", [], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:a.csv"]


def test_imported_modules_carry_no_taint() -> None:
    tracker = run(
        [
            ("c1", "import json\ncfg = json.load(open('cfg.json'))", ["cfg.json"], []),
            (
                "c2",
                "other = load('other.csv')\njson.dump(other, open('x.json', 'w'))",
                ["other.csv"],
                [],
            ),
            ("c3", "json.dump({'k': 1}, open('out.json', 'w'))", [], ["out.json"]),
        ]
    )
    assert tracker.names_taint("json") == ()
    assert tracker.inputs_for_file("out.json") == ()


def test_a_shadowed_builtin_still_carries_its_taint() -> None:
    tracker = run(
        [
            ("c1", "max = load('a.csv')", ["a.csv"], []),
            ("c2", "save('out.csv', max)", [], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:a.csv"]


# -- re-running and rewriting -----------------------------------------------------


def test_rerun_cell_under_a_new_id_replaces_the_taint() -> None:
    tracker = FlowTracker()
    tracker.observe_cell("c1", "x = load('a.csv')", [read("a.csv", "c1", sha="1" * 64)], [])
    tracker.observe_cell("c2", "save('out.csv', x)", [], ["out.csv"])
    tracker.observe_cell("c3", "x = load('a.csv')", [read("a.csv", "c3", sha="2" * 64)], [])
    tracker.observe_cell("c4", "save('out2.csv', x)", [], ["out2.csv"])
    (first,) = tracker.inputs_for_file("out.csv")
    (second,) = tracker.inputs_for_file("out2.csv")
    assert (first.via_cell, first.sha256) == ("c1", "1" * 64)
    assert (second.via_cell, second.sha256) == ("c3", "2" * 64)


def test_rewriting_a_file_in_place_keeps_its_previous_inputs_not_itself() -> None:
    tracker = run(
        [
            ("c1", "save('out.csv', load('in.csv'))", ["in.csv"], ["out.csv"]),
            ("c2", "t = load('out.csv')\nsave('out.csv', t.strip())", ["out.csv"], ["out.csv"]),
        ]
    )
    assert summary(tracker.inputs_for_file("out.csv")) == [("file:in.csv", OBSERVED, "c1")]


def test_rewriting_through_a_variable_is_also_in_place() -> None:
    tracker = run(
        [
            ("c1", "save('out.csv', load('in.csv'))", ["in.csv"], ["out.csv"]),
            ("c2", "t = load('out.csv')", ["out.csv"], []),
            ("c3", "save('out.csv', t.strip())", [], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:in.csv"]


def test_overwriting_a_file_replaces_its_inputs() -> None:
    tracker = run(
        [
            ("c1", "save('out.csv', load('a.csv'))", ["a.csv"], ["out.csv"]),
            ("c2", "save('out.csv', load('b.csv'))", ["b.csv"], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:b.csv"]


def test_rename_moves_the_inputs_to_the_new_name() -> None:
    tracker = FlowTracker()
    tracker.observe_cell(
        "c1",
        "save('tmp.part', load('in.csv'))\nos.replace('tmp.part', 'final.csv')",
        [read("in.csv", "c1")],
        ["tmp.part", "final.csv"],
        renames=[("tmp.part", "final.csv")],
    )
    assert [s.key for s in tracker.inputs_for_file("final.csv")] == ["file:in.csv"]
    assert tracker.inputs_for_file("tmp.part") == ()


def test_rename_in_a_later_cell_keeps_the_original_inputs() -> None:
    tracker = run([("c1", "save('a.csv', load('in.csv'))", ["in.csv"], ["a.csv"])])
    tracker.observe_cell(
        "c2", "os.rename('a.csv', 'b.csv')", [], ["b.csv"], renames=[("a.csv", "b.csv")]
    )
    assert [s.key for s in tracker.inputs_for_file("b.csv")] == ["file:in.csv"]


def test_removed_file_is_forgotten() -> None:
    tracker = run([("c1", "save('out.csv', load('in.csv'))", ["in.csv"], ["out.csv"])])
    tracker.observe_cell("c2", "os.remove('out.csv')", [], [], removes=["out.csv"])
    assert tracker.inputs_for_file("out.csv") == ()
    assert "out.csv" not in tracker.written_files()


# -- receipts and artifacts --------------------------------------------------------


def test_receipt_write_lists_the_script_and_the_receipt() -> None:
    tracker = FlowTracker()
    script = read("make.py", "c1", sha="cd" * 32)
    tracker.note_receipt_write("out.csv", "r-1", [script], cell_id="c1")
    assert tracker.inputs_for_file("out.csv") == (
        script,
        Source(key="receipt:r-1", method=RECEIPT, via_cell="c1"),
    )


def test_receipt_write_merges_with_the_same_cells_own_write() -> None:
    tracker = FlowTracker()
    tracker.note_receipt_write("out.csv", "r-1", [read("make.py", "c1")], cell_id="c1")
    tracker.observe_cell(
        "c1", "append('out.csv', load('extra.csv'))", [read("extra.csv", "c1")], ["out.csv"]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == [
        "file:extra.csv",
        "file:make.py",
        "receipt:r-1",
    ]


def test_a_later_cell_overwriting_a_receipt_output_replaces_it() -> None:
    tracker = FlowTracker()
    tracker.note_receipt_write("out.csv", "r-1", [read("make.py", "c1")], cell_id="c1")
    tracker.observe_cell("c1", "pass", [], [])
    tracker.observe_cell("c2", "save('out.csv', 1)", [], ["out.csv"])
    assert tracker.inputs_for_file("out.csv") == ()


def test_artifact_source_flows_through_a_variable() -> None:
    artifact = Source(
        key="artifact:6f1c0e52-4b1f-4d0e-9a43-4a8f5c1e2d3b", method=OBSERVED, via_cell="c1"
    )
    tracker = FlowTracker()
    tracker.observe_cell("c1", "df = host.load_artifact(aid)", [artifact], [])
    tracker.observe_cell("c2", "df.to_csv('out.csv')", [], ["out.csv"])
    assert summary(tracker.inputs_for_file("out.csv")) == [(artifact.key, DEF_USE, "c1")]


# -- functions and classes ---------------------------------------------------------


def test_function_defined_before_its_data_carries_the_data_when_called() -> None:
    tracker = run(
        [
            ("c1", "def summary():\n    return data.mean()", [], []),
            ("c2", "data = load('in.csv')", ["in.csv"], []),
            ("c3", "save('out.csv', summary())", [], ["out.csv"]),
        ]
    )
    assert summary(tracker.inputs_for_file("out.csv")) == [("file:in.csv", DEF_USE, "c2")]


def test_function_resolves_its_globals_at_call_time() -> None:
    tracker = run(
        [
            ("c1", "data = load('old.csv')", ["old.csv"], []),
            ("c2", "def summary():\n    return data.mean()", [], []),
            ("c3", "data = load('new.csv')", ["new.csv"], []),
            ("c4", "save('out.csv', summary())", [], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:new.csv"]


def test_function_default_keeps_the_value_of_its_definition() -> None:
    tracker = run(
        [
            ("c1", "data = load('old.csv')", ["old.csv"], []),
            ("c2", "def summary(frame=data):\n    return frame.mean()", [], []),
            ("c3", "data = load('new.csv')", ["new.csv"], []),
            ("c4", "save('out.csv', summary())", [], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:old.csv"]


def test_function_calling_a_later_defined_helper_is_followed() -> None:
    tracker = run(
        [
            ("c1", "def report():\n    return helper()", [], []),
            ("c2", "def helper():\n    return table", [], []),
            ("c3", "table = load('t.csv')", ["t.csv"], []),
            ("c4", "save('out.csv', report())", [], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:t.csv"]


def test_recursive_function_does_not_loop() -> None:
    tracker = run(
        [
            ("c1", "def walk(n):\n    return walk(n - 1) if n else seed", [], []),
            ("c2", "seed = load('s.csv')", ["s.csv"], []),
        ]
    )
    assert [s.key for s in tracker.names_taint("walk")] == ["file:s.csv"]


def test_function_defined_in_a_reading_cell_does_not_take_the_cells_reads() -> None:
    tracker = run(
        [
            (
                "c1",
                "df = load('in.csv')\ndef describe(x):\n    return x.describe()",
                ["in.csv"],
                [],
            ),
            ("c2", "other = load('other.csv')", ["other.csv"], []),
            ("c3", "save('out.csv', describe(other))", [], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:other.csv"]


def test_class_body_runs_at_definition_and_takes_the_cells_reads() -> None:
    tracker = run(
        [
            ("c1", "class Config:\n    values = json.load(open('cfg.json'))", ["cfg.json"], []),
            ("c2", "save('out.csv', Config.values)", [], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:cfg.json"]


# -- odd cells and bounds ----------------------------------------------------------


def test_cell_that_does_not_parse_keeps_only_its_direct_reads() -> None:
    tracker = run(
        [
            ("c1", "x = load('a.csv')", ["a.csv"], []),
            ("c2", "save('out.csv', x) +", ["b.csv"], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:b.csv"]


def test_ipython_magic_cell_is_analysed() -> None:
    tracker = run(
        [
            ("c1", "%time x = load('a.csv')", ["a.csv"], []),
            ("c2", "!echo hi\nsave('out.csv', x)", [], ["out.csv"]),
        ]
    )
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:a.csv"]


def test_same_file_same_bytes_read_twice_is_one_input() -> None:
    tracker = FlowTracker()
    tracker.observe_cell("c1", "a = load()", [read("in.csv", "c1", sha="e" * 64)], [])
    tracker.observe_cell("c2", "save(a, load())", [read("in.csv", "c2", sha="e" * 64)], ["out.csv"])
    assert summary(tracker.inputs_for_file("out.csv")) == [("file:in.csv", OBSERVED, "c2")]


def test_inputs_beyond_the_bound_are_cut_and_flagged() -> None:
    tracker = FlowTracker(max_sources=3)
    reads = [read(f"f{i}.csv", "c1") for i in range(5)]
    tracker.observe_cell("c1", "save(load_all())", reads, ["out.csv"])
    assert len(tracker.inputs_for_file("out.csv")) == 3
    assert tracker.is_truncated("out.csv")


def test_name_taint_beyond_the_bound_flags_files_written_from_it() -> None:
    tracker = FlowTracker(max_sources=2)
    tracker.observe_cell("c1", "x = load_all()", [read(f"f{i}.csv", "c1") for i in range(4)], [])
    tracker.observe_cell("c2", "save(x)", [], ["out.csv"])
    assert len(tracker.names_taint("x")) == 2
    assert tracker.is_truncated("out.csv")


def test_unbounded_cell_is_not_flagged() -> None:
    tracker = run([("c1", "save(load('a.csv'))", ["a.csv"], ["out.csv"])])
    assert not tracker.is_truncated("out.csv")


# -- values ------------------------------------------------------------------------


def test_source_rejects_an_unknown_method() -> None:
    with pytest.raises(ValueError, match="unknown source method"):
        Source(key="file:a", method="guessed", via_cell="c1")


def test_source_serialises_to_a_plain_dict() -> None:
    source = Source(key="file:a.csv", method=OBSERVED, via_cell="c1", sha256="f" * 64)
    assert source.to_dict() == {
        "key": "file:a.csv",
        "method": "observed",
        "via_cell": "c1",
        "sha256": "f" * 64,
    }


def test_max_sources_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_sources"):
        FlowTracker(max_sources=0)


def test_fork_is_independent_of_the_original() -> None:
    tracker = run([("c1", "x = load('a.csv')", ["a.csv"], [])])
    twin = copy.deepcopy(tracker)
    twin.observe_cell("c2", "save('out.csv', x)", [], ["out.csv"])
    assert [s.key for s in twin.inputs_for_file("out.csv")] == ["file:a.csv"]
    assert tracker.inputs_for_file("out.csv") == ()
    assert tracker.fork().names_taint("x") == tracker.names_taint("x")


# -- figures, workspace modules, mutation through arguments, unknown names ----------

PYPLOT = "import matplotlib.pyplot as plt\nimport pandas as pd"


def test_axes_drawn_in_one_cell_taint_the_figure_saved_in_another() -> None:
    tracker = run([
        ("c0", PYPLOT, [], []),
        ("c1", "df = pd.read_csv('a.csv')", ["a.csv"], []),
        ("c2", "fig, ax = plt.subplots()", [], []),
        ("c3", "ax.plot(df.x)", [], []),
        ("c4", "fig.savefig('f.png')", [], ["f.png"]),
    ])
    assert summary(tracker.inputs_for_file("f.png")) == [("file:a.csv", DEF_USE, "c1")]


def test_subplot_added_later_taints_its_figure() -> None:
    tracker = run([
        ("c0", PYPLOT, [], []),
        ("c1", "df = pd.read_csv('a.csv')", ["a.csv"], []),
        ("c2", "fig = plt.figure()", [], []),
        ("c3", "ax = fig.add_subplot()", [], []),
        ("c4", "ax.scatter(df.x, df.y)", [], []),
        ("c5", "fig.savefig('f.png')", [], ["f.png"]),
    ])
    assert [s.key for s in tracker.inputs_for_file("f.png")] == ["file:a.csv"]


def test_element_of_an_axes_array_taints_the_figure() -> None:
    tracker = run([
        ("c0", PYPLOT, [], []),
        ("c1", "df = pd.read_csv('a.csv')", ["a.csv"], []),
        ("c2", "fig, axes = plt.subplots(2)", [], []),
        ("c3", "axes[0].hist(df.x)\naxes[1].set_title('x')", [], []),
        ("c4", "plt.savefig('f.png')", [], ["f.png"]),
    ])
    assert [s.key for s in tracker.inputs_for_file("f.png")] == ["file:a.csv"]


def test_pyplot_current_figure_carries_across_cells() -> None:
    tracker = run([
        ("c0", PYPLOT, [], []),
        ("c1", "df = pd.read_csv('a.csv')", ["a.csv"], []),
        ("c2", "plt.bar(df.x, df.y)", [], []),
        ("c3", "plt.savefig('g.png')", [], ["g.png"]),
    ])
    assert [s.key for s in tracker.inputs_for_file("g.png")] == ["file:a.csv"]


def test_a_new_figure_cuts_the_old_ones_taint() -> None:
    tracker = run([
        ("c0", PYPLOT, [], []),
        ("c1", "old = pd.read_csv('old.csv')\nplt.plot(old.x)", ["old.csv"], []),
        ("c2", "new = pd.read_csv('new.csv')", ["new.csv"], []),
        ("c3", "plt.figure()\nplt.plot(new.x)", [], []),
        ("c4", "plt.savefig('g.png')", [], ["g.png"]),
        ("c5", "plt.close()", [], []),
        ("c6", "plt.savefig('h.png')", [], ["h.png"]),
    ])
    assert [s.key for s in tracker.inputs_for_file("g.png")] == ["file:new.csv"]
    assert tracker.inputs_for_file("h.png") == ()


def test_seaborn_drawing_into_an_axes_taints_its_figure() -> None:
    tracker = run([
        ("c0", PYPLOT + "\nimport seaborn as sns", [], []),
        ("c1", "df = pd.read_csv('a.csv')", ["a.csv"], []),
        ("c2", "fig, ax = plt.subplots()\nsns.lineplot(data=df, ax=ax)", [], []),
        ("c3", "fig.savefig('s.png')", [], ["s.png"]),
    ])
    assert [s.key for s in tracker.inputs_for_file("s.png")] == ["file:a.csv"]


def test_pandas_plot_draws_on_the_current_figure() -> None:
    tracker = run([
        ("c0", PYPLOT, [], []),
        ("c1", "df = pd.read_csv('a.csv')", ["a.csv"], []),
        ("c2", "df.plot(x='x', y='y')", [], []),
        ("c3", "plt.savefig('p.png')", [], ["p.png"]),
    ])
    assert [s.key for s in tracker.inputs_for_file("p.png")] == ["file:a.csv"]


def test_an_imported_workspace_module_is_an_input_of_what_its_functions_compute() -> None:
    tracker = run([
        ("c1", "import helpers", ["helpers.py"], []),
        ("c2", "data = load('a.csv')", ["a.csv"], []),
        ("c3", "y = helpers.f(data)", [], []),
        ("c4", "save('o', y)", [], ["o"]),
    ])
    assert [s.key for s in tracker.inputs_for_file("o")] == ["file:helpers.py", "file:a.csv"]


def test_a_from_import_served_from_the_cache_still_carries_the_module() -> None:
    tracker = run([
        ("c1", "import pkg.tools as t", ["pkg/__init__.py", "pkg/tools.py"], []),
        ("c2", "from pkg.tools import f", [], []),
    ])
    assert [s.key for s in tracker.names_taint("f")] == ["file:pkg/__init__.py",
                                                         "file:pkg/tools.py"]


def test_a_library_module_read_outside_the_workspace_name_carries_nothing() -> None:
    tracker = run([("c1", "import json\nimport helpers", ["helpers.py"], [])])
    assert tracker.names_taint("json") == ()


def test_a_call_not_known_pure_may_mutate_its_arguments() -> None:
    tracker = run([
        ("c1", "rows = []", [], []),
        ("c2", "data = load('a.csv')", ["a.csv"], []),
        ("c3", "fill(rows, data)", [], []),
        ("c4", "save('out.csv', rows)", [], ["out.csv"]),
    ])
    assert [s.key for s in tracker.inputs_for_file("out.csv")] == ["file:a.csv"]


def test_a_known_pure_call_does_not_mutate_its_arguments() -> None:
    tracker = run([
        ("c1", "rows = []", [], []),
        ("c2", "data = load('a.csv')", ["a.csv"], []),
        ("c3", "print(rows, data)\nn = len(rows)", [], []),
        ("c4", "save('out.csv', rows)", [], ["out.csv"]),
    ])
    assert tracker.inputs_for_file("out.csv") == ()


def test_names_from_a_star_import_get_the_modules_taint() -> None:
    tracker = run([
        ("c1", "from helpers import *", ["helpers.py"], []),
        ("c2", "save('o', f())", [], ["o"]),
    ])
    assert [s.key for s in tracker.inputs_for_file("o")] == ["file:helpers.py"]


def test_pieces_of_one_run_writing_one_file_merge_their_inputs() -> None:
    tracker = FlowTracker()
    tracker.observe_cell("c1", "w(a)", [read("a.csv", "c1")], ["o"])
    tracker.observe_cell("c1", "w(b)", [read("b.csv", "c1")], ["o"], continues=True)
    assert [s.key for s in tracker.inputs_for_file("o")] == ["file:a.csv", "file:b.csv"]
    tracker.observe_cell("c1", "w(b)", [read("b.csv", "c1")], ["o"])
    assert [s.key for s in tracker.inputs_for_file("o")] == ["file:b.csv"]


def test_a_conditional_piece_keeps_the_old_taint() -> None:
    tracker = FlowTracker()
    tracker.observe_cell("c1", "x = f()", [read("a.csv", "c1")], [])
    tracker.observe_cell("c2", "x = g()", [read("b.csv", "c2")], [], conditional=True)
    assert [s.key for s in tracker.names_taint("x")] == ["file:a.csv", "file:b.csv"]


def test_the_kernels_own_names_are_not_taken_for_unknown_names() -> None:
    tracker = run([
        ("c1", "from helpers import *", ["helpers.py"], []),
        ("c2", "host.write_file('o', '1')", [], ["o"]),
    ])
    assert tracker.inputs_for_file("o") == ()


# -- containers at known keys ------------------------------------------------------


def keys_of(tracker: FlowTracker, name: str) -> list[str]:
    return sorted(s.key.removeprefix("file:") for s in tracker.names_taint(name))


def test_a_store_at_a_key_is_read_back_at_that_key_only() -> None:
    tracker = run([
        ("c1", "d = {}", [], []),
        ("c2", "d['a'] = open('a.csv').read()", ["a.csv"], []),
        ("c3", "d['b'] = open('b.csv').read()", ["b.csv"], []),
        ("c4", "keep = d['a']", [], []),
        ("c5", "open('o.txt', 'w').write(d['b'])", [], ["o.txt"]),
    ])
    assert keys_of(tracker, "keep") == ["a.csv"]
    assert [s.key for s in tracker.inputs_for_file("o.txt")] == ["file:b.csv"]
    assert keys_of(tracker, "d") == ["a.csv", "b.csv"]


def test_a_key_not_known_or_a_whole_use_reads_every_key() -> None:
    cells: list[Cell] = [("c1", "d = {}", [], []),
                         ("c2", "d['a'] = open('a.csv').read()", ["a.csv"], []),
                         ("c3", "d['b'] = open('b.csv').read()", ["b.csv"], [])]
    for code in ("x = d[k]", "x = d['zzz']", "x = list(d)", "x = {k: d[k] for k in d}"):
        tracker = run([*cells, ("c4", code, [], [])])
        assert keys_of(tracker, "x") == ["a.csv", "b.csv"], code


def test_a_store_at_a_key_replaces_that_key_and_a_conditional_one_adds() -> None:
    tracker = run([("c1", "d = {}", [], []), ("c2", "d['a'] = open('a.csv').read()", ["a.csv"], []),
                   ("c3", "d['a'] = open('b.csv').read()", ["b.csv"], []),
                   ("c4", "x = d['a']", [], [])])
    assert keys_of(tracker, "x") == ["b.csv"]
    tracker.observe_cell("c5", "d['a'] = open('c.csv').read()", [read("c.csv", "c5")], [],
                         conditional=True)
    tracker.observe_cell("c6", "y = d['a']", [], [])
    assert keys_of(tracker, "y") == ["b.csv", "c.csv"]


def test_a_change_that_is_not_a_store_at_a_key_adds_to_every_key_of_a_dict() -> None:
    tracker = run([("c1", "d = {}", [], []), ("c2", "d['a'] = open('a.csv').read()", ["a.csv"], []),
                   ("c3", "d['b'] = open('b.csv').read()", ["b.csv"], []),
                   ("c4", "d.update(extra)\nd.setdefault('z', open('c.csv').read())",
                    ["c.csv"], []),
                   ("c5", "x = d['a']", [], [])])
    assert keys_of(tracker, "x") == ["a.csv", "c.csv"]
    # a call given d reads it whole, and may move its values around
    run([("c6", "fill(d, y)", [], []), ("c7", "z = d['a']", [], [])], tracker)
    assert keys_of(tracker, "z") == ["a.csv", "b.csv", "c.csv"]


def test_a_list_changed_otherwise_than_at_a_key_folds_its_keys_together() -> None:
    """``l.insert(0, v)`` moves every index: what was at 1 is at 2 now."""
    tracker = run([("c1", "l = [None, None]", [], []),
                   ("c2", "l[0] = open('a.csv').read()", ["a.csv"], []),
                   ("c3", "l[1] = open('b.csv').read()", ["b.csv"], []),
                   ("c4", "x = l[1]", [], [])])
    assert keys_of(tracker, "x") == ["b.csv"]
    run([("c5", "l.insert(0, 'z')", [], []), ("c6", "y = l[1]", [], [])], tracker)
    assert keys_of(tracker, "y") == ["a.csv", "b.csv"]


def test_a_negative_index_store_into_what_may_be_a_list_changes_it_whole() -> None:
    tracker = run([("c1", "l = load()", [], []),
                   ("c2", "l[0] = open('a.csv').read()", ["a.csv"], []),
                   ("c3", "l[-1] = open('b.csv').read()", ["b.csv"], []),
                   ("c4", "x = l[0]", [], [])])
    assert keys_of(tracker, "x") == ["a.csv", "b.csv"]


def test_a_store_through_an_alias_reaches_the_other_name() -> None:
    tracker = run([("c1", "d = {}", [], []), ("c2", "e = d", [], []),
                   ("c3", "e['a'] = open('a.csv').read()", ["a.csv"], []),
                   ("c4", "x = d['a']", [], [])])
    assert keys_of(tracker, "x") == ["a.csv"]


def test_a_name_bound_from_one_key_does_not_join_the_others() -> None:
    tracker = run([("c1", "d = {}", [], []), ("c2", "d['a'] = open('a.csv').read()", ["a.csv"], []),
                   ("c3", "d['b'] = open('b.csv').read()", ["b.csv"], []),
                   ("c4", "keep = d['a']", [], []),
                   ("c5", "out = keep.upper()", [], [])])
    assert keys_of(tracker, "out") == ["a.csv"]


def test_a_function_reading_a_container_reads_it_whole_even_beside_a_key_read() -> None:
    tracker = run([("c1", "d = {}", [], []), ("c2", "d['a'] = open('a.csv').read()", ["a.csv"], []),
                   ("c3", "d['b'] = open('b.csv').read()", ["b.csv"], []),
                   ("c4", "def every():\n    return list(d.values())", [], []),
                   ("c5", "x = (d['a'], every())", [], [])])
    assert keys_of(tracker, "x") == ["a.csv", "b.csv"]


# -- functions with state ----------------------------------------------------------


def test_a_cached_call_that_reads_nothing_carries_the_read_that_filled_the_cache() -> None:
    tracker = run([
        ("c1", "import functools\n@functools.lru_cache\ndef load(p):\n    return open(p).read()",
         [], []),
        ("c2", "first = load('a.csv')", ["a.csv"], []),
        ("c3", "again = load('a.csv')", [], []),
    ])
    assert keys_of(tracker, "again") == ["a.csv"]


def test_a_call_filling_a_module_dict_reaches_later_calls() -> None:
    tracker = run([
        ("c1", ("_seen = {}\ndef remember(p):\n    if p not in _seen:\n"
               "        _seen[p] = open(p).read()\n    return _seen[p]"), [], []),
        ("c2", "warm = remember('a.csv')", ["a.csv"], []),
        ("c3", "again = remember('a.csv')", [], []),
    ])
    assert keys_of(tracker, "again") == ["a.csv"]


def test_a_closure_with_state_carries_what_its_calls_read() -> None:
    tracker = run([
        ("c1", ("def memoised():\n    memo = {}\n    def get(p):\n"
               "        if p not in memo:\n            memo[p] = open(p).read()\n"
               "        return memo[p]\n    return get"), [], []),
        ("c2", "get = memoised()", [], []),
        ("c3", "warm = get('a.csv')", ["a.csv"], []),
        ("c4", "again = get('a.csv')", [], []),
    ])
    assert keys_of(tracker, "again") == ["a.csv"]


def test_a_plain_function_called_twice_does_not_carry_the_first_calls_read() -> None:
    tracker = run([
        ("c1", "def load(p):\n    return open(p).read()", [], []),
        ("c2", "first = load('a.csv')", ["a.csv"], []),
        ("c3", "second = load('b.csv')", ["b.csv"], []),
    ])
    assert keys_of(tracker, "second") == ["b.csv"]
