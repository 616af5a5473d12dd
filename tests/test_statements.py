"""Feeding a cell to the flow tracker in pieces: which read reached which name and file.

Each cell is (cell id, code, paths it read, paths it wrote), as the Host
reports it (reads without statement information); the code is never run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from host_kernel.lineage.flow import FlowTracker, Source
from host_kernel.lineage.statements import observe

Cell = tuple[str, str, Sequence[str], Sequence[str]]
PYPLOT = "import matplotlib.pyplot as plt\nimport pandas as pd\n"
RUNS = ["data/runs/r1.csv", "data/runs/r2.csv", "data/runs/r1.json", "data/runs/r2.json"]


def run(cells: Sequence[Cell], source_of: Callable[[str], str | None] | None = None
        ) -> FlowTracker:
    tracker = FlowTracker()
    for cell_id, code, reads, writes in cells:
        sources = [(p, Source(f"file:{p}", "observed", cell_id)) for p in reads]
        if source_of is None:
            observe(tracker, cell_id, code, sources, list(writes), [], [])
        else:
            observe(tracker, cell_id, code, sources, list(writes), [], [], source_of=source_of)
    return tracker


def inputs(tracker: FlowTracker, path: str) -> list[str]:
    return sorted(s.key.removeprefix("file:") for s in tracker.inputs_for_file(path))


def taint(tracker: FlowTracker, name: str) -> list[str]:
    return sorted(s.key.removeprefix("file:") for s in tracker.names_taint(name))


# -- pieces cut at their own source ------------------------------------------------


def test_several_statements_on_one_line_keep_the_read() -> None:
    tracker = run([
        ("c1", "import os\nfd = os.open('a.csv', 0); d = os.read(fd, 9); os.close(fd)",
         ["a.csv"], []),
        ("c2", "open('o.txt', 'w').write(str(d))", [], ["o.txt"]),
    ])
    assert inputs(tracker, "o.txt") == ["a.csv"]


def test_a_decorated_definition_keeps_its_decorator() -> None:
    tracker = run([
        ("c1", "cfg = open('cfg.json').read()\n@register(cfg)\ndef f():\n    pass\n"
               "d = open('decoy.csv').read()", ["cfg.json", "decoy.csv"], []),
    ])
    assert taint(tracker, "f") == ["cfg.json"]


def test_a_read_inside_a_function_reaches_where_it_is_called() -> None:
    tracker = run([
        ("c1", "def load():\n    return open('a.csv').read()\nt = load()\n"
               "d = open('decoy.csv').read()\nopen('o.txt', 'w').write(t)",
         ["a.csv", "decoy.csv"], ["o.txt"]),
    ])
    assert inputs(tracker, "o.txt") == ["a.csv"]


# -- computed paths ------------------------------------------------------------------


def test_an_fstring_write_path_is_attributed_to_its_statement() -> None:
    tracker = run([
        ("c1", "df = pd.read_csv('a.csv')\nd = pd.read_csv('decoy.csv')\nname = 'x'\n"
               "df.to_csv(f'out/{name}.csv')", ["a.csv", "decoy.csv"], ["out/x.csv"]),
    ])
    assert inputs(tracker, "out/x.csv") == ["a.csv"]


def test_an_fstring_with_an_unknown_part_still_matches() -> None:
    tracker = run([
        ("c1", "df = pd.read_csv('a.csv')\nd = pd.read_csv('decoy.csv')\n"
               "df.to_csv(f'out/{label}.csv')", ["a.csv", "decoy.csv"], ["out/run7.csv"]),
    ])
    assert inputs(tracker, "out/run7.csv") == ["a.csv"]


def test_os_path_join_through_variables() -> None:
    tracker = run([
        ("c1", "import os\nd = 'out'\np = os.path.join(d, 'x.csv')\n"
               "df = pd.read_csv('a.csv')\nj = pd.read_csv('decoy.csv')\ndf.to_csv(p)",
         ["a.csv", "decoy.csv"], ["out/x.csv"]),
    ])
    assert inputs(tracker, "out/x.csv") == ["a.csv"]


def test_pathlib_division_and_a_method_on_the_path() -> None:
    tracker = run([
        ("c1", "out = Path('res')\ntext = Path('data') / 'a.csv'\nt = text.read_text()\n"
               "d = open('decoy.csv').read()\n(out / 'x.txt').write_text(t)",
         ["data/a.csv", "decoy.csv"], ["res/x.txt"]),
    ])
    assert inputs(tracker, "res/x.txt") == ["data/a.csv"]


def test_a_read_path_built_in_the_cell_reaches_only_its_statement() -> None:
    tracker = run([
        ("c1", "base = 'data'\na = open(base + '/a.csv').read()\n"
               "b = open(f'{base}/decoy.csv').read()", ["data/a.csv", "data/decoy.csv"], []),
    ])
    assert taint(tracker, "a") == ["data/a.csv"]
    assert taint(tracker, "b") == ["data/decoy.csv"]


def test_a_file_handle_carries_what_is_written_through_it() -> None:
    tracker = run([
        ("c1", "fh = open('o.txt', 'w')\nt = open('a.csv').read()\n"
               "d = open('decoy.csv').read()\nfh.write(t)\nfh.close()",
         ["a.csv", "decoy.csv"], ["o.txt"]),
    ])
    assert inputs(tracker, "o.txt") == ["a.csv"]


def test_a_write_no_statement_names_gets_the_whole_cell() -> None:
    tracker = run([
        ("c1", "t = open('a.csv').read()\nd = open('decoy.csv').read()\nsave(target, t)",
         ["a.csv", "decoy.csv"], ["o.txt"]),
    ])
    assert inputs(tracker, "o.txt") == ["a.csv", "decoy.csv"]


# -- loops -----------------------------------------------------------------------------


def test_a_sidecar_only_printed_in_a_loop_stays_out_of_the_total() -> None:
    tracker = run([
        ("c1", "total = 0\nfor f in sorted(glob.glob('data/runs/*.csv')):\n"
               "    meta = open(f[:-4] + '.json').read(); print(meta)\n"
               "    total += pd.read_csv(f).y.sum()\n"
               "open('total.txt', 'w').write(str(total))", RUNS, ["total.txt"]),
    ])
    assert inputs(tracker, "total.txt") == ["data/runs/r1.csv", "data/runs/r2.csv"]


def test_a_loop_over_a_glob_bound_earlier_in_the_cell() -> None:
    tracker = run([
        ("c1", "files = Path('data/runs').glob('*.csv')\ntotal = 0\nfor f in files:\n"
               "    meta = open(str(f).replace('.csv', '.json')).read()\n    print(meta)\n"
               "    total += pd.read_csv(f).y.sum()", RUNS, []),
        ("c2", "open('total.txt', 'w').write(str(total))", [], ["total.txt"]),
    ])
    assert inputs(tracker, "total.txt") == ["data/runs/r1.csv", "data/runs/r2.csv"]


def test_a_loop_over_constants_ties_each_output_to_its_own_input() -> None:
    tracker = run([
        ("c1", "for name in ['a', 'b']:\n    text = open(f'data/{name}.csv').read()\n"
               "    open(f'upper_{name}.txt', 'w').write(text.upper())",
         ["data/a.csv", "data/b.csv"], ["upper_a.txt", "upper_b.txt"]),
    ])
    assert inputs(tracker, "upper_a.txt") == ["data/a.csv"]
    assert inputs(tracker, "upper_b.txt") == ["data/b.csv"]


def test_a_path_with_an_unknown_part_leaves_a_file_named_exactly_elsewhere() -> None:
    # run comes from an earlier cell: data/{run}.csv is one file, and not the decoy,
    # which the next statement names exactly
    tracker = run([
        ("c1", "df = pd.read_csv(f'data/{run}.csv')\nref = pd.read_csv('data/decoy.csv')",
         ["data/b.csv", "data/decoy.csv"], []),
    ])
    assert taint(tracker, "df") == ["data/b.csv"]
    assert taint(tracker, "ref") == ["data/decoy.csv"]


def test_a_glob_keeps_a_file_also_named_exactly_elsewhere() -> None:
    tracker = run([
        ("c1", "every = [open(p).read() for p in glob.glob('data/*.csv')]\n"
               "ref = open('data/decoy.csv').read()", ["data/b.csv", "data/decoy.csv"], []),
    ])
    assert taint(tracker, "every") == ["data/b.csv", "data/decoy.csv"]


def test_a_value_carried_to_the_next_iteration_is_followed() -> None:
    tracker = run([
        ("c1", "acc = 0\nfor f in files:\n    x = g(acc)\n    acc = h(x, open(f).read())",
         ["a.csv"], []),
        ("c2", "save('o', x)", [], ["o"]),
    ])
    assert inputs(tracker, "o") == ["a.csv"]


def test_a_name_bound_in_a_loop_keeps_its_old_taint() -> None:
    # the body may not run: x may still hold what it held before the loop
    tracker = run([
        ("c1", "x = open('a.csv').read()", ["a.csv"], []),
        ("c2", "for f in files:\n    x = open('b.csv').read()", ["b.csv"], []),
    ])
    assert taint(tracker, "x") == ["a.csv", "b.csv"]


def test_a_binding_in_a_loop_depends_on_what_the_loop_iterates() -> None:
    tracker = run([
        ("c1", "rows = open('a.csv').read().splitlines()", ["a.csv"], []),
        ("c2", "n = 0\nfor r in rows:\n    n += 1", [], []),
    ])
    assert taint(tracker, "n") == ["a.csv"]


# -- magics ----------------------------------------------------------------------------


SCRIPT = ("import pandas as pd\ndf = pd.read_csv('data/a.csv')\n"
          "junk = open('data/decoy.csv').read()\n")
SCRIPT_READS = ["make.py", "data/a.csv", "data/decoy.csv"]


def test_run_binds_the_scripts_names_with_their_own_reads() -> None:
    tracker = run([
        ("c1", "%run make.py", SCRIPT_READS, []),
        ("c2", "df.to_csv('o.csv')", [], ["o.csv"]),
    ], source_of={"make.py": SCRIPT}.get)
    assert inputs(tracker, "o.csv") == ["data/a.csv", "make.py"]


def test_run_with_options_and_arguments() -> None:
    tracker = run([
        ("c1", "%run -i make.py --fast", SCRIPT_READS, []),
        ("c2", "df.to_csv('o.csv')", [], ["o.csv"]),
    ], source_of={"make.py": SCRIPT}.get)
    assert inputs(tracker, "o.csv") == ["data/a.csv", "make.py"]


def test_run_without_the_scripts_text_gives_unknown_names_every_read() -> None:
    tracker = run([
        ("c1", "%run make.py", SCRIPT_READS, []),
        ("c2", "df.to_csv('o.csv')", [], ["o.csv"]),
    ])
    assert inputs(tracker, "o.csv") == ["data/a.csv", "data/decoy.csv", "make.py"]


def test_run_of_a_script_that_cannot_be_read_is_conservative() -> None:
    tracker = run([
        ("c1", "%run make.py\nz = 1", SCRIPT_READS, []),
        ("c2", "df.to_csv('o.csv')", [], ["o.csv"]),
    ], source_of=lambda path: None)
    assert inputs(tracker, "o.csv") == ["data/a.csv", "data/decoy.csv", "make.py"]


def test_time_cell_magic_body_is_cut_into_statements() -> None:
    tracker = run([
        ("c1", "%%time\nt = open('a.csv').read()\nd = open('decoy.csv').read()\n"
               "open('o.txt', 'w').write(t)", ["a.csv", "decoy.csv"], ["o.txt"]),
    ])
    assert inputs(tracker, "o.txt") == ["a.csv"]


def test_a_non_python_cell_magic_is_fed_whole() -> None:
    tracker = run([("c1", "%%bash\ncat a.csv > o.txt", ["a.csv"], ["o.txt"])])
    assert inputs(tracker, "o.txt") == ["a.csv"]


# -- figures and modules -----------------------------------------------------------------


def test_a_figure_drawn_and_saved_in_one_cell_skips_a_decoy() -> None:
    tracker = run([
        ("c0", PYPLOT, [], []),
        ("c1", "df = pd.read_csv('a.csv')", ["a.csv"], []),
        ("c2", "fig, ax = plt.subplots()\nax.plot(df.x)\nd = open('decoy.csv').read()\n"
               "fig.savefig('f.png')", ["decoy.csv"], ["f.png"]),
    ])
    assert inputs(tracker, "f.png") == ["a.csv"]


def test_pyplot_current_figure_drawn_in_one_cell_and_saved_in_the_next() -> None:
    tracker = run([
        ("c0", PYPLOT, [], []),
        ("c1", "df = pd.read_csv('a.csv')\nplt.plot(df.x)", ["a.csv"], []),
        ("c2", "plt.savefig('g.png')", [], ["g.png"]),
    ])
    assert inputs(tracker, "g.png") == ["a.csv"]


def test_an_imported_workspace_module_is_tied_to_its_import_statement() -> None:
    tracker = run([
        ("c1", "import helpers\nt = open('a.csv').read()", ["helpers.py", "a.csv"], []),
        ("c2", "from helpers import f", [], []),
        ("c3", "y = f(t)\nsave('o', y)", [], ["o"]),
    ])
    assert inputs(tracker, "o") == ["a.csv", "helpers.py"]
    assert taint(tracker, "helpers") == ["helpers.py"]


# -- a read named only in a statement that binds nothing ---------------------------------


def test_a_file_only_printed_stays_with_the_print() -> None:
    for printed in ("print(open('notes.txt').read())", "logging.info(open(p).read())",
                    "print(pd.read_csv(p).shape)", "pd.read_csv(p).head()",
                    "print(json.load(open(p)))"):
        tracker = run([
            ("c1", (f"import logging\np = 'notes.txt'\ndf = pd.read_csv('a.csv')\n{printed}\n"
                   "df.to_csv('o.csv')"), ["a.csv", "notes.txt"], ["o.csv"]),
        ])
        assert inputs(tracker, "o.csv") == ["a.csv"], printed


def test_a_path_bound_in_an_earlier_cell_names_the_file_it_holds() -> None:
    tracker = run([
        ("c1", "notes = 'notes.txt'\nimport logging", [], []),
        ("c2", "df = pd.read_csv('a.csv')\nlogging.info(open(notes).read())\ndf.to_csv('o.csv')",
         ["a.csv", "notes.txt"], ["o.csv"]),
    ])
    assert inputs(tracker, "o.csv") == ["a.csv"]


def test_a_path_rebound_in_between_is_forgotten() -> None:
    tracker = run([
        ("c1", "notes = 'notes.txt'", [], []),
        ("c2", "notes = pick()", [], []),
        ("c3", "df = pd.read_csv('a.csv')\nprint(open(notes).read())\ndf.to_csv('o.csv')",
         ["a.csv", "notes.txt"], ["o.csv"]),
    ])
    assert inputs(tracker, "o.csv") == ["a.csv", "notes.txt"]


def test_a_path_a_sink_names_without_reading_it_still_belongs_to_every_piece() -> None:
    """``os.symlink`` and ``os.path.getsize`` name ``b.csv``; the read is through the link."""
    for naming in ("os.symlink(os.path.abspath('b.csv'), ln)", "print(os.path.getsize('b.csv'))"):
        tracker = run([
            ("c1", (f"import os\nln = os.path.join(tmp, 'ln.csv')\n{naming}\n"
                   "b = open(ln).read()\nopen('o.txt', 'w').write(b)"), ["b.csv"], ["o.txt"]),
        ])
        assert inputs(tracker, "o.txt") == ["b.csv"], naming


# -- containers at known keys ------------------------------------------------------------


STATIONS = ["stations/oslo.csv", "stations/bergen.csv", "stations/tromso.csv"]


def test_a_dict_comprehension_over_literals_keeps_a_taint_per_key() -> None:
    tracker = run([
        ("c1", ("stations = {n: pd.read_csv(f'stations/{n}.csv') for n in "
               "['oslo', 'bergen', 'tromso']}\nkeep = stations['oslo']"), STATIONS, []),
        ("c2", "stations['bergen'].to_csv('b.csv')", [], ["b.csv"]),
    ])
    assert taint(tracker, "keep") == ["stations/oslo.csv"]
    assert inputs(tracker, "b.csv") == ["stations/bergen.csv"]


def test_the_decoy_read_into_a_dict_keyed_by_file_name_stays_out() -> None:
    tracker = run([
        ("c1", ("names = ['a', 'decoy']\nparts = {n: open(f'data/{n}.csv').read() for n in names}\n"
               "keep = parts['a']"), ["data/a.csv", "data/decoy.csv"], []),
        ("c2", "out = 'o' + '.txt'\nopen(out, 'w').write(keep)", [], ["o.txt"]),
    ])
    assert inputs(tracker, "o.txt") == ["data/a.csv"]


def test_a_loop_over_names_of_an_earlier_cell_stores_one_key_per_file() -> None:
    tracker = run([
        ("c1", "names = ['oslo', 'bergen', 'tromso']", [], []),
        ("c2", ("filled = {}\nfor name in names:\n"
               "    filled[name] = pd.read_csv(f'stations/{name}.csv')"), STATIONS, []),
        ("c3", ("two = {k: v for k, v in filled.items() if k in ('oslo', 'bergen')}\n"
               "rest = {k: v for k, v in filled.items() if k != 'oslo'}"), [], []),
    ])
    assert taint(tracker, "two") == ["stations/bergen.csv", "stations/oslo.csv"]
    assert taint(tracker, "rest") == ["stations/bergen.csv", "stations/tromso.csv"]


def test_a_list_display_of_reads_keeps_a_taint_per_index() -> None:
    tracker = run([
        ("c1", "frames = [pd.read_csv('a.csv'), pd.read_csv('b.csv')]\nsecond = frames[1]",
         ["a.csv", "b.csv"], []),
    ])
    assert taint(tracker, "second") == ["b.csv"]
    tracker.observe_cell("c2", "frames.insert(0, pd.read_csv('c.csv'))",
                         [Source("file:c.csv", "observed", "c2")], [])
    tracker.observe_cell("c3", "last = frames[1]", [], [])
    assert taint(tracker, "last") == ["a.csv", "b.csv", "c.csv"]  # a list's indices moved


def test_writing_each_value_of_a_dict_out_in_a_loop_gives_each_file_its_own_source() -> None:
    tracker = run([
        ("c1", ("stations = {n: pd.read_csv(f'stations/{n}.csv') for n in "
               "['oslo', 'bergen', 'tromso']}\nkeep = stations['oslo']"), STATIONS, []),
        ("c2", ("for name in ['oslo', 'bergen', 'tromso']:\n"
               "    stations[name].to_csv(f'out/{name}.csv')"), [],
         ["out/oslo.csv", "out/bergen.csv", "out/tromso.csv"]),
    ])
    assert inputs(tracker, "out/bergen.csv") == ["stations/bergen.csv"]
    assert inputs(tracker, "out/tromso.csv") == ["stations/tromso.csv"]
    assert taint(tracker, "keep") == ["stations/oslo.csv"]


def test_a_comprehension_with_a_condition_stores_conditionally() -> None:
    tracker = run([
        ("c1", "d = {'oslo': old()}", [], []),
        ("c2", ("d = {n: pd.read_csv(f'stations/{n}.csv') for n in ['oslo', 'bergen'] if ok(n)}\n"
               "x = d['oslo']"), STATIONS[:2], []),
    ])
    assert taint(tracker, "x") == ["stations/oslo.csv"]


def test_a_build_that_reads_the_old_value_is_not_split() -> None:
    tracker = run([
        ("c1", "d = {'a': open('a.csv').read()}", ["a.csv"], []),
        ("c2", "d = {'a': open('b.csv').read(), 'b': d['a']}\nx = d['a']", ["b.csv"], []),
    ])
    assert taint(tracker, "x") == ["a.csv", "b.csv"]


def test_a_key_held_by_a_name_is_written_in_but_not_inside_a_comprehension() -> None:
    tracker = run([
        ("c1", "d = {n: open(f'{n}.csv').read() for n in ['a', 'b', 'c']}", 
         ["a.csv", "b.csv", "c.csv"], []),
        ("c2", "k = 'b'\nx = d[k]\ny = [d[k] for k in ks]", [], []),
    ])
    assert taint(tracker, "x") == ["b.csv"]
    assert taint(tracker, "y") == ["a.csv", "b.csv", "c.csv"]


def test_a_key_rebound_on_one_branch_is_not_known() -> None:
    tracker = run([
        ("c1", "d = {n: open(f'{n}.csv').read() for n in ['a', 'b']}", ["a.csv", "b.csv"], []),
        ("c2", "k = 'a'\nif flip:\n    k = 'b'\nx = d[k]", [], []),
    ])
    assert taint(tracker, "x") == ["a.csv", "b.csv"]


def test_a_handle_stored_in_a_dict_display_writes_what_is_written_through_it() -> None:
    tracker = run([
        ("c1", "handles = {'a': open('a.txt', 'w'), 'b': open('b.txt', 'w')}\n"
               "x = open('in.csv').read()\nhandles['a'].write(x)\nhandles['b'].write('-')",
         ["in.csv"], ["a.txt", "b.txt"]),
    ])
    assert inputs(tracker, "a.txt") == ["in.csv"]


def test_a_name_a_function_rebinds_through_global_is_not_carried_as_a_key() -> None:
    tracker = run([
        ("c1", "k = 'a'\ndef pick():\n    global k\n    k = 'b'", [], []),
        ("c2", "d = {n: open(f'{n}.csv').read() for n in ['a', 'b']}", ["a.csv", "b.csv"], []),
        ("c3", "pick()", [], []),
        ("c4", "x = d[k]", [], []),
    ])
    assert taint(tracker, "x") == ["a.csv", "b.csv"]


def test_a_path_rebound_inside_a_branch_still_names_its_file_before_the_rebinding() -> None:
    tracker = run([
        ("c1", "p = 'a.csv'\nif cond:\n    df = pd.read_csv(p)\n    p = 'b.csv'\n"
               "d = pd.read_csv('decoy.csv')\nopen('o.txt', 'w').write(str(df))",
         ["a.csv", "decoy.csv"], ["o.txt"]),
    ])
    assert inputs(tracker, "o.txt") == ["a.csv"]


def test_a_path_built_up_from_its_own_value_still_names_its_file() -> None:
    tracker = run([
        ("c1", "p = 'data/a'\np = p + '.csv'\nq = 'data/b'\nq += '.csv'\n"
               "x = open(p).read()\ny = open(q).read()\nopen('o.txt', 'w').write(x)",
         ["data/a.csv", "data/b.csv"], ["o.txt"]),
    ])
    assert inputs(tracker, "o.txt") == ["data/a.csv"]
