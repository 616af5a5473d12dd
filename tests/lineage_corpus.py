"""Hand-labelled notebook sessions for measuring lineage precision and recall.

Each case is a list of cells run in order in one fresh kernel generation, and,
for each saved artifact (by filename), the inputs whose bytes really flowed
into it: ``file:<path>``, ``artifact:<filename of an earlier artifact>`` or
``receipt:<command>``. Expected sets are the truth, not what the method can see:
where the method misses something, recall says so.
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


@dataclass(frozen=True)
class Case:
    name: str
    cells: tuple[str, ...]
    expected: dict[str, frozenset[str]]
    needs: tuple[str, ...] = ()  # modules the case imports (skipped when missing)


def case(name: str, cells: list[str], expected: dict[str, set[str]],
         needs: tuple[str, ...] = ()) -> Case:
    return Case(name, (SETUP, *cells), {k: frozenset(v) for k, v in expected.items()}, needs)


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
    ], {"final.txt": {"file:mid.txt"}}),
    case("numpy_save_load", [
        "import numpy as np\nnp.save('arr.npy', np.loadtxt('data/nums.txt'))",
        "x = np.load('arr.npy')",
        "np.savetxt('x.txt', x + 1)\nhost.save_artifact('x.txt')",
    ], {"x.txt": {"file:arr.npy"}}, needs=("numpy",)),
    case("json_written_then_read_in_another_cell", [
        "import json\njson.dump({'n': len(open('data/a.csv').read())}, open('stats.json', 'w'))",
        "s = json.load(open('stats.json'))",
        "open('report.txt', 'w').write(f\"n={s['n']}\")\nhost.save_artifact('report.txt')",
    ], {"report.txt": {"file:stats.json"}}),
    case("import_alias_and_unused_read", [
        "import csv as c\nunused = open('data/decoy.csv').read()",
        "rows = list(c.reader(open('data/a.csv')))",
        "open('n.txt', 'w').write(str(len(rows)))\nhost.save_artifact('n.txt')",
    ], {"n.txt": {"file:data/a.csv"}}),
    # Known limits, kept in the measurement on purpose:
    case("dynamic_paths_and_a_decoy_in_one_cell", [
        "names = ['a', 'decoy']\nparts = {n: open(f'data/{n}.csv').read() for n in names}\n"
        "keep = parts['a']",
        "out = 'o' + '.txt'\nopen(out, 'w').write(keep)\nhost.save_artifact(out)",
    ], {"o.txt": {"file:data/a.csv"}}),
    case("read_by_a_child_process_of_the_kernel", [
        "import subprocess\nsubprocess.run('cp data/b.csv child.txt', shell=True)",
        "c = open('child.txt').read()\nopen('o.txt', 'w').write(c)\nhost.save_artifact('o.txt')",
    ], {"o.txt": {"file:child.txt"}}),
]
