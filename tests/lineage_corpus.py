"""Hand-labelled notebook sessions for measuring lineage precision and recall.

Each case is a list of cells run in order in one fresh kernel generation, and,
for each saved artifact (by filename), the inputs that really flowed into it:
``file:<path>``, ``artifact:<filename of an earlier artifact>`` or
``receipt:<command>``. Expected sets are the truth, not what the method can see:
where the method misses something, recall says so.

The truth follows one rule, **bytes flowed**: an input belongs to an artifact
when bytes read from it reached the artifact's bytes, whatever carried them
(a variable, an object mutated through a function argument, a worker process,
a shell command, a file, a figure). Worked out:

* A file opened but whose bytes did not reach the artifact is not an input: a
  decoy, a sidecar whose contents were only printed, a path in a string never
  read, a file read by a variable later rebound or deleted.
* Code in the workspace is data: a script or module whose code ran to compute
  the artifact (``host.bash('python s.py')``, ``%run s.py``, ``import helpers``)
  is an input. The interpreter and libraries outside the workspace are not.
* A file made by ``host.bash`` also has ``receipt:<command>`` as an input.
* **Chains through files.** A file written by an earlier cell (or by a child
  process or a command) and read back is an input, and so is everything
  upstream of it, transitively: the truth lists the intermediate file *and*
  the inputs of the cell that wrote it. Files written from constants (SETUP,
  and the cells that make a case's data) have no upstream.
* **Chains stop at artifacts.** Reading a file that holds the bytes of an
  earlier artifact of the session (saved here, or loaded by id) gives
  ``artifact:<filename>``, and neither the file nor that artifact's upstream,
  which the artifact's own lineage records.
"""

from __future__ import annotations

from dataclasses import dataclass

SETUP = (
    "import os\n"
    "os.makedirs('data', exist_ok=True)\n"
    "open('data/a.csv', 'w').write('x,y\\n1,2\\n3,4\\n')\n"
    "open('data/b.csv', 'w').write('x,z\\n1,9\\n3,8\\n')\n"
    "open('data/decoy.csv', 'w').write('x,y\\n0,0\\n')\n"
    "open('data/config.json', 'w').write('{\"scale\": 2}')\n"
    "open('data/nums.txt', 'w').write('1 2\\n3 4\\n')\n"
)

# Data-making cells for the formats that need a library to write; constants only.
MAKE_PARQUET = (
    "import pandas as pd\n"
    "pd.DataFrame({'site': ['A', 'A', 'B'], 't': [1.5, 2.5, 9.0]})"
    ".to_parquet('data/m.parquet')\n"
    "pd.DataFrame({'site': ['Z'], 't': [0.0]}).to_parquet('data/decoy.parquet')\n"
)
MAKE_RUNS = (
    "os.makedirs('data/runs', exist_ok=True)\n"
    "for i, (v, who) in enumerate([(5, 'ana'), (7, 'bo'), (11, 'cy')], start=1):\n"
    "    open(f'data/runs/r{i}.csv', 'w').write(f'x,y\\n{i},{v}\\n')\n"
    "    open(f'data/runs/r{i}.json', 'w').write(f'{{\"operator\": \"{who}\"}}')\n"
    "open('data/runs/notes.txt', 'w').write('r2 was noisy\\n')\n"
)
MAKE_DB = (
    "import sqlite3\ncon = sqlite3.connect('data/obs.db')\n"
    "con.executescript(\"CREATE TABLE obs (station TEXT, temp REAL);\"\n"
    "                  \"INSERT INTO obs VALUES ('north', 1.5), ('north', 2.5),\"\n"
    "                  \"  ('south', 8.0);\")\n"
    "con.commit()\ncon.close()\n"
)
RUN_CSVS = ("file:data/runs/r1.csv", "file:data/runs/r2.csv", "file:data/runs/r3.csv")
PYPLOT = ("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
          "import pandas as pd\n")

# Workspace code the cases write and run.
WORKERS = (
    "def column_sum(path):\n"
    "    rows = open(path).read().splitlines()[1:]\n"
    "    return sum(int(r.split(',')[1]) for r in rows)\n"
)
SUMMARIZE = (
    "rows = open('data/b.csv').read().splitlines()[1:]\n"
    "open('summary.txt', 'w').write(f'{len(rows)} rows\\n')\n"
)
ANALYSIS = "import json\ncfg = json.load(open('data/config.json'))\nscale = cfg['scale']\n"
HELPERS = (
    "def load_column(path, col):\n"
    "    head, *rows = open(path).read().splitlines()\n"
    "    i = head.split(',').index(col)\n"
    "    return [int(r.split(',')[i]) for r in rows]\n"
)
SCALING = (
    "def scale_in_place(values, factor):\n"
    "    for i, v in enumerate(values):\n"
    "        values[i] = v * factor\n"
)


@dataclass(frozen=True)
class Case:
    name: str
    cells: tuple[str, ...]
    expected: dict[str, frozenset[str]]
    needs: tuple[str, ...] = ()  # modules the case imports (skipped when missing)


def case(name: str, cells: list[str], expected: dict[str, set[str]],
         needs: tuple[str, ...] = ()) -> Case:
    return Case(name, (SETUP, *cells), {k: frozenset(v) for k, v in expected.items()}, needs)


def write(path: str, text: str) -> str:
    """A cell that writes workspace code (a script or module) through the Host."""
    return f"host.write_file({path!r}, {text!r})"


CASES: list[Case] = [
    case("open_read_write_same_cell", [
        "t = open('data/a.csv').read()\nopen('out.txt', 'w').write(t.upper())\n"
        "host.save_artifact('out.txt')",
    ], {"out.txt": {"file:data/a.csv"}}),
    case("value_carried_across_cells", [
        "t = open('data/a.csv').read()",
        "n = len(t.splitlines())",
        "open('count.txt', 'w').write(str(n))\nhost.save_artifact('count.txt')",
    ], {"count.txt": {"file:data/a.csv"}}),
    case("decoy_opened_in_another_cell", [
        "t = open('data/a.csv').read()",
        "d = open('data/decoy.csv').read()",
        "open('o.txt', 'w').write(t)\nhost.save_artifact('o.txt')",
    ], {"o.txt": {"file:data/a.csv"}}),
    case("decoy_opened_in_the_same_cell", [
        "t = open('data/a.csv').read()\nd = open('data/decoy.csv').read()",
        "open('o.txt', 'w').write(t)\nhost.save_artifact('o.txt')",
    ], {"o.txt": {"file:data/a.csv"}}),
    case("file_named_in_a_string_never_read", [
        "other = 'data/b.csv'\nt = open('data/a.csv').read()",
        "open('o.txt', 'w').write(t + other)\nhost.save_artifact('o.txt')",
    ], {"o.txt": {"file:data/a.csv"}}),
    case("overwritten_variable_cuts_the_edge", [
        "t = open('data/a.csv').read()",
        "t = open('data/b.csv').read()",
        "open('o.txt', 'w').write(t)\nhost.save_artifact('o.txt')",
    ], {"o.txt": {"file:data/b.csv"}}),
    case("pathlib_read_text", [
        "from pathlib import Path\ntext = Path('data/a.csv').read_text()",
        "Path('p.txt').write_text(text[::-1])\nhost.save_artifact('p.txt')",
    ], {"p.txt": {"file:data/a.csv"}}),
    case("json_load", [
        "import json\ncfg = json.load(open('data/config.json'))",
        "json.dump({'scale': cfg['scale'] * 2}, open('cfg2.json', 'w'))\n"
        "host.save_artifact('cfg2.json')",
    ], {"cfg2.json": {"file:data/config.json"}}),
    case("csv_module", [
        "import csv\nrows = list(csv.DictReader(open('data/a.csv')))",
        "total = sum(int(r['y']) for r in rows)",
        "open('total.txt', 'w').write(str(total))\nhost.save_artifact('total.txt')",
    ], {"total.txt": {"file:data/a.csv"}}),
    case("numpy_loadtxt_savetxt", [
        "import numpy as np\narr = np.loadtxt('data/nums.txt')",
        "np.savetxt('doubled.txt', arr * 2)\nhost.save_artifact('doubled.txt')",
    ], {"doubled.txt": {"file:data/nums.txt"}}, needs=("numpy",)),
    case("pandas_read_to_csv_across_cells", [
        "import pandas as pd\ndf = pd.read_csv('data/a.csv')",
        "df['s'] = df.x + df.y",
        "df.to_csv('sums.csv', index=False)\nhost.save_artifact('sums.csv')",
    ], {"sums.csv": {"file:data/a.csv"}}, needs=("pandas",)),
    case("pandas_merge_two_inputs", [
        "import pandas as pd\na = pd.read_csv('data/a.csv')",
        "b = pd.read_csv('data/b.csv')",
        "m = a.merge(b, on='x')\nm.to_csv('merged.csv', index=False)\n"
        "host.save_artifact('merged.csv')",
    ], {"merged.csv": {"file:data/a.csv", "file:data/b.csv"}}, needs=("pandas",)),
    case("artifact_loaded_by_id", [
        "src = host.save_artifact('data/a.csv')",
        "p = host.load_artifact(src.artifact_id, 'copy.csv')",
        "t = open('copy.csv').read()",
        "open('from_artifact.txt', 'w').write(t)\nhost.save_artifact('from_artifact.txt')",
    ], {"a.csv": set(), "from_artifact.txt": {"artifact:a.csv"}}),
    case("file_made_by_host_bash", [
        "host.write_file('make.py', 'import sys\\nopen(sys.argv[2], \"w\").write(open(sys.argv[1]).read() * 2)\\n')",
        "host.bash('python make.py data/a.csv made.txt')",
        "host.save_artifact('made.txt')",
    ], {"made.txt": {"file:make.py", "file:data/a.csv",
                     "receipt:python make.py data/a.csv made.txt"}}),
    case("rerun_cell_after_input_changed", [
        "t = open('data/a.csv').read()",
        "open('data/a.csv', 'a').write('5,6\\n')",
        "t = open('data/a.csv').read()",
        "open('o.txt', 'w').write(t)\nhost.save_artifact('o.txt')",
    ], {"o.txt": {"file:data/a.csv"}}),
    case("function_reading_a_global", [
        "def double():\n    return data * 2",
        "data = open('data/a.csv').read()",
        "open('o.txt', 'w').write(double())\nhost.save_artifact('o.txt')",
    ], {"o.txt": {"file:data/a.csv"}}),
    case("transitive_chain_over_four_cells", [
        "raw = open('data/b.csv').read()",
        "lines = raw.splitlines()",
        "body = lines[1:]",
        "open('body.txt', 'w').write('\\n'.join(body))\nhost.save_artifact('body.txt')",
    ], {"body.txt": {"file:data/b.csv"}}),
    case("deleted_and_rebound_name", [
        "t = open('data/a.csv').read()",
        "del t\nt = 'constant'",
        "open('o.txt', 'w').write(t)\nhost.save_artifact('o.txt')",
    ], {"o.txt": set()}),
    case("mutation_by_append", [
        "rows = []",
        "rows.append(open('data/b.csv').read())",
        "open('o.txt', 'w').write(''.join(rows))\nhost.save_artifact('o.txt')",
    ], {"o.txt": {"file:data/b.csv"}}),
    case("host_write_file_from_a_variable", [
        "text = open('data/a.csv').read()",
        "host.write_file('hw.txt', text.lower())\nhost.save_artifact('hw.txt')",
    ], {"hw.txt": {"file:data/a.csv"}}),
    case("two_outputs_from_two_inputs_in_one_cell", [
        "a = open('data/a.csv').read()\nb = open('data/b.csv').read()\n"
        "open('oa.txt', 'w').write(a)\nopen('ob.txt', 'w').write(b)\n"
        "host.save_artifact('oa.txt')\nhost.save_artifact('ob.txt')",
    ], {"oa.txt": {"file:data/a.csv"}, "ob.txt": {"file:data/b.csv"}}),
    case("augmented_assignment", [
        "total = 0",
        "total += len(open('data/a.csv').read())",
        "open('o.txt', 'w').write(str(total))\nhost.save_artifact('o.txt')",
    ], {"o.txt": {"file:data/a.csv"}}),
    case("with_block_readlines", [
        "with open('data/b.csv') as fh:\n    lines = fh.readlines()",
        "with open('o.txt', 'w') as out:\n    out.writelines(reversed(lines))\n"
        "host.save_artifact('o.txt')",
    ], {"o.txt": {"file:data/b.csv"}}),
    case("derived_file_read_again", [
        "open('mid.txt', 'w').write(open('data/a.csv').read())",
        "m = open('mid.txt').read()",
        "open('final.txt', 'w').write(m)\nhost.save_artifact('final.txt')",
    ], {"final.txt": {"file:mid.txt", "file:data/a.csv"}}),
    case("numpy_save_load", [
        "import numpy as np\nnp.save('arr.npy', np.loadtxt('data/nums.txt'))",
        "x = np.load('arr.npy')",
        "np.savetxt('x.txt', x + 1)\nhost.save_artifact('x.txt')",
    ], {"x.txt": {"file:arr.npy", "file:data/nums.txt"}}, needs=("numpy",)),
    case("json_written_then_read_in_another_cell", [
        "import json\njson.dump({'n': len(open('data/a.csv').read())}, open('stats.json', 'w'))",
        "s = json.load(open('stats.json'))",
        "open('report.txt', 'w').write(f\"n={s['n']}\")\nhost.save_artifact('report.txt')",
    ], {"report.txt": {"file:stats.json", "file:data/a.csv"}}),
    case("import_alias_and_unused_read", [
        "import csv as c\nunused = open('data/decoy.csv').read()",
        "rows = list(c.reader(open('data/a.csv')))",
        "open('n.txt', 'w').write(str(len(rows)))\nhost.save_artifact('n.txt')",
    ], {"n.txt": {"file:data/a.csv"}}),
    # Columnar, hierarchical and database formats: read by C code, not Python's open.
    case("parquet_read_with_pandas", [
        MAKE_PARQUET,
        "df = pd.read_parquet('data/m.parquet')",
        "df.groupby('site').t.mean().to_csv('site_means.csv')\n"
        "host.save_artifact('site_means.csv')",
    ], {"site_means.csv": {"file:data/m.parquet"}}, needs=("pandas", "pyarrow")),
    case("parquet_partitioned_dataset_directory", [
        "import pyarrow as pa, pyarrow.parquet as pq\n"
        "for site, temps in [('A', [1.0, 2.0]), ('B', [5.0])]:\n"
        "    os.makedirs(f'data/ds/site={site}', exist_ok=True)\n"
        "    pq.write_table(pa.table({'t': temps}), f'data/ds/site={site}/part-0.parquet')",
        "table = pq.read_table('data/ds')",
        "pq.write_table(table.group_by('site').aggregate([('t', 'max')]), 'maxima.parquet')\n"
        "host.save_artifact('maxima.parquet')",
    ], {"maxima.parquet": {"file:data/ds/site=A/part-0.parquet",
                           "file:data/ds/site=B/part-0.parquet"}}, needs=("pyarrow",)),
    case("decoy_read_in_c_by_pyarrow", [
        MAKE_PARQUET,
        "import pyarrow.compute as pc, pyarrow.parquet as pq\n"
        "kept = pq.read_table('data/m.parquet')\n"
        "seen = pq.read_table('data/decoy.parquet').num_rows\nprint(seen)",
        "pq.write_table(kept.filter(pc.greater(kept['t'], 2)), 'hot.parquet')\n"
        "host.save_artifact('hot.parquet')",
    ], {"hot.parquet": {"file:data/m.parquet"}}, needs=("pandas", "pyarrow")),
    case("hdf5_dataset_read_with_h5py", [
        "import h5py, numpy as np\nwith h5py.File('data/field.h5', 'w') as f:\n"
        "    f['temp'] = np.arange(12.0).reshape(3, 4)\n    f['pressure'] = np.ones(3)",
        "with h5py.File('data/field.h5', 'r') as f:\n    temp = f['temp'][:]",
        "np.savetxt('row_means.txt', temp.mean(axis=1))\nhost.save_artifact('row_means.txt')",
    ], {"row_means.txt": {"file:data/field.h5"}}, needs=("h5py", "numpy")),
    case("sqlite_query_with_pandas_read_sql", [
        MAKE_DB,
        "import pandas as pd\ncon = sqlite3.connect('data/obs.db')\n"
        "df = pd.read_sql('SELECT station, AVG(temp) AS mean FROM obs GROUP BY station', con)",
        "df.to_csv('station_means.csv', index=False)\nhost.save_artifact('station_means.csv')",
    ], {"station_means.csv": {"file:data/obs.db"}}, needs=("pandas",)),
    case("sqlite_cursor_fetchall", [
        MAKE_DB,
        "cur = sqlite3.connect('data/obs.db').cursor()\n"
        "rows = cur.execute(\"SELECT temp FROM obs WHERE station = 'north'\").fetchall()",
        "open('north.txt', 'w').write(str(sum(t for (t,) in rows)))\n"
        "host.save_artifact('north.txt')",
    ], {"north.txt": {"file:data/obs.db"}}),
    # Other processes: pool workers, scripts and shell globs run by host.bash.
    case("multiprocessing_pool_workers_read_files", [
        write("workers.py", WORKERS),
        "import multiprocessing, workers\n"
        "with multiprocessing.get_context('fork').Pool(2) as pool:\n"
        "    sums = pool.map(workers.column_sum, ['data/a.csv', 'data/b.csv'])",
        "open('sums.txt', 'w').write(repr(sums))\nhost.save_artifact('sums.txt')",
    ], {"sums.txt": {"file:workers.py", "file:data/a.csv", "file:data/b.csv"}}),
    case("script_run_by_host_bash_opens_a_file_not_on_its_command_line", [
        write("summarize.py", SUMMARIZE),
        "host.bash('python summarize.py')",
        "host.save_artifact('summary.txt')",
    ], {"summary.txt": {"file:summarize.py", "file:data/b.csv",
                        "receipt:python summarize.py"}}),
    case("shell_glob_concatenates_runs", [
        MAKE_RUNS,
        "host.bash('cat data/runs/*.csv > all.csv')",
        "host.save_artifact('all.csv')",
    ], {"all.csv": {*RUN_CSVS, "receipt:cat data/runs/*.csv > all.csv"}}),
    # Figures: the data reaches the file through the figure, not a name the saving cell uses.
    case("pyplot_plot_then_savefig", [
        PYPLOT + "df = pd.read_csv('data/a.csv')",
        "plt.plot(df.x, df.y)\nplt.title('y against x')",
        "ref = pd.read_csv('data/decoy.csv')\nprint(ref.shape)",
        "plt.savefig('line.png')\nhost.save_artifact('line.png')",
    ], {"line.png": {"file:data/a.csv"}}, needs=("matplotlib", "pandas")),
    case("subplots_axes_drawn_in_another_cell", [
        PYPLOT + "fig, ax = plt.subplots()",
        "df = pd.read_csv('data/a.csv')\nnoise = pd.read_csv('data/decoy.csv')",
        "ax.plot(df.x)\nax.set_xlabel('sample')",
        "fig.savefig('axes.png')\nhost.save_artifact('axes.png')",
    ], {"axes.png": {"file:data/a.csv"}}, needs=("matplotlib", "pandas")),
    # Workspace code: %run, imported modules, mutation through arguments.
    case("ipython_run_script_that_reads_data", [
        write("analysis.py", ANALYSIS),
        "%run analysis.py",
        "open('scaled.txt', 'w').write(str(scale * 10))\nhost.save_artifact('scaled.txt')",
    ], {"scaled.txt": {"file:analysis.py", "file:data/config.json"}}),
    case("workspace_module_function_reads_a_file", [
        write("helpers.py", HELPERS),
        "from helpers import load_column",
        "z = load_column('data/b.csv', 'z')",
        "open('zmax.txt', 'w').write(str(max(z)))\nhost.save_artifact('zmax.txt')",
    ], {"zmax.txt": {"file:helpers.py", "file:data/b.csv"}}),
    case("workspace_module_mutates_its_argument", [
        write("scaling.py", SCALING),
        "import json, scaling\nvalues = [int(r.split(',')[1]) for r in "
        "open('data/a.csv').read().splitlines()[1:]]",
        "cfg = json.load(open('data/config.json'))",
        "scaling.scale_in_place(values, cfg['scale'])",
        "open('scaled.txt', 'w').write(repr(values))\nhost.save_artifact('scaled.txt')",
    ], {"scaled.txt": {"file:scaling.py", "file:data/a.csv", "file:data/config.json"}}),
    case("mutation_through_a_function_argument", [
        "import pandas as pd\nbase = pd.read_csv('data/a.csv')",
        "extra = pd.read_csv('data/b.csv')",
        "def attach(frame, other):\n    frame['z'] = other['z'].values",
        "attach(base, extra)",
        "base.to_csv('joined.csv', index=False)\nhost.save_artifact('joined.csv')",
    ], {"joined.csv": {"file:data/a.csv", "file:data/b.csv"}}, needs=("pandas",)),
    # Chains through files and artifacts.
    case("artifact_file_read_back_later", [
        "import pandas as pd\ndf = pd.read_csv('data/a.csv')\ndf['s'] = df.x + df.y\n"
        "df.to_csv('clean.csv', index=False)\nhost.save_artifact('clean.csv')",
        "clean = pd.read_csv('clean.csv')",
        "clean.s.describe().to_csv('clean_stats.csv')\nhost.save_artifact('clean_stats.csv')",
    ], {"clean.csv": {"file:data/a.csv"}, "clean_stats.csv": {"artifact:clean.csv"}},
        needs=("pandas",)),
    case("chain_through_two_intermediate_files", [
        "import pandas as pd\na = pd.read_csv('data/a.csv')\n"
        "a[a.x > 1].to_csv('stage1.csv', index=False)",
        "s1 = pd.read_csv('stage1.csv')\nb = pd.read_csv('data/b.csv')\n"
        "s1.merge(b, on='x').to_csv('stage2.csv', index=False)",
        "final = pd.read_csv('stage2.csv')",
        "final.to_json('final.json')\nhost.save_artifact('final.json')",
    ], {"final.json": {"file:stage2.csv", "file:stage1.csv", "file:data/a.csv",
                       "file:data/b.csv"}}, needs=("pandas",)),
    case("command_output_read_back_by_a_later_cell", [
        "host.bash('sort -t, -k2 -n data/b.csv > sorted.csv')",
        "import pandas as pd\nranked = pd.read_csv('sorted.csv')",
        "ranked.head(1).to_csv('lowest.csv', index=False)\nhost.save_artifact('lowest.csv')",
    ], {"lowest.csv": {"file:sorted.csv", "file:data/b.csv",
                       "receipt:sort -t, -k2 -n data/b.csv > sorted.csv"}}, needs=("pandas",)),
    # Loops and computed paths.
    case("loop_sums_csvs_and_only_prints_sidecars", [
        MAKE_RUNS,
        "import glob, json\ntotal = 0\nfor path in sorted(glob.glob('data/runs/*.csv')):\n"
        "    meta = json.load(open(path[:-4] + '.json'))\n"
        "    print(path, meta['operator'])\n"
        "    total += int(open(path).read().splitlines()[1].split(',')[1])",
        "open('total.txt', 'w').write(str(total))\nhost.save_artifact('total.txt')",
    ], {"total.txt": set(RUN_CSVS)}),
    case("fstring_output_paths_in_a_loop", [
        "for name in ['a', 'b']:\n    text = open(f'data/{name}.csv').read()\n"
        "    open(f'upper_{name}.txt', 'w').write(text.upper())",
        "host.save_artifact('upper_a.txt')\nhost.save_artifact('upper_b.txt')",
    ], {"upper_a.txt": {"file:data/a.csv"}, "upper_b.txt": {"file:data/b.csv"}}),
    case("fstring_paths_from_a_variable", [
        "import pandas as pd\nrun = 'b'",
        "df = pd.read_csv(f'data/{run}.csv')\nref = pd.read_csv('data/decoy.csv')\n"
        "print(len(ref))",
        "os.makedirs('out', exist_ok=True)\ndf.to_csv(f'out/{run}_clean.csv', index=False)\n"
        "host.save_artifact(f'out/{run}_clean.csv')",
    ], {"b_clean.csv": {"file:data/b.csv"}}, needs=("pandas",)),
    # Images and arrays.
    case("pil_image_read_resized_and_written", [
        "from PIL import Image\nImage.new('L', (8, 8), 200).save('data/scan.png')\n"
        "Image.new('L', (8, 8), 10).save('data/blank.png')",
        "scan = Image.open('data/scan.png')\nthumb = scan.resize((4, 4))\n"
        "with Image.open('data/blank.png') as other:\n    print(other.size)",
        "thumb.save('thumb.png')\nhost.save_artifact('thumb.png')",
    ], {"thumb.png": {"file:data/scan.png"}}, needs=("PIL",)),
    case("scipy_io_loadmat", [
        "import numpy as np, scipy.io\n"
        "scipy.io.savemat('data/trial.mat', {'v': np.arange(4.0), 'w': np.ones(2)})",
        "mat = scipy.io.loadmat('data/trial.mat')\nv = mat['v'].ravel()",
        "np.save('v2.npy', v * 2)\nhost.save_artifact('v2.npy')",
    ], {"v2.npy": {"file:data/trial.mat"}}, needs=("numpy", "scipy")),
    case("numpy_load_npy_memory_mapped", [
        "import numpy as np\nnp.save('data/weights.npy', np.arange(6.0))\n"
        "np.save('data/bias.npy', np.ones(6))",
        "w = np.load('data/weights.npy', mmap_mode='r')\nb = np.load('data/bias.npy')\n"
        "print(b.sum())",
        "np.savetxt('w10.txt', w[:3] * 10)\nhost.save_artifact('w10.txt')",
    ], {"w10.txt": {"file:data/weights.npy"}}, needs=("numpy",)),
    # Known limits, kept in the measurement on purpose:
    case("dynamic_paths_and_a_decoy_in_one_cell", [
        "names = ['a', 'decoy']\nparts = {n: open(f'data/{n}.csv').read() for n in names}\n"
        "keep = parts['a']",
        "out = 'o' + '.txt'\nopen(out, 'w').write(keep)\nhost.save_artifact(out)",
    ], {"o.txt": {"file:data/a.csv"}}),
    case("read_by_a_child_process_of_the_kernel", [
        "import subprocess\nsubprocess.run('cp data/b.csv child.txt', shell=True)",
        "c = open('child.txt').read()\nopen('o.txt', 'w').write(c)\nhost.save_artifact('o.txt')",
    ], {"o.txt": {"file:child.txt", "file:data/b.csv"}}),
]
