"""The shortcuts lineage takes with a cell of many reads give what the general paths give.

lineage/statements.py's matcher tests a glob's literal text before its regex and
hands a piece every read at once when it owns them all. These tests hold each
shortcut to the slower code it stands for: no tracing needed, pure functions.
"""

from __future__ import annotations

import fnmatch
import random
import re

from host_kernel.lineage import statements
from host_kernel.lineage.flow import FlowTracker
from host_kernel.lineage.knowledge import UNKNOWN
from host_kernel.lineage.taint import Source, file_key


def test_a_glob_matches_what_its_regexes_alone_match() -> None:
    rng = random.Random(1)
    paths = ["".join(rng.choice("ab/.x]-[!") for _ in range(rng.randint(1, 8)))
             for _ in range(300)]
    match = statements._Matcher(paths)
    checked = 0
    for _ in range(5_000):
        pattern = "".join(rng.choice("ab/.*?[]!x-" + UNKNOWN) for _ in range(rng.randint(1, 8)))
        query = pattern.replace(UNKNOWN, "*").removeprefix("./")
        if not any(c in query for c in "*?["):
            continue
        whole = re.compile(fnmatch.translate(query))
        below = re.compile(fnmatch.translate("*/" + query))
        assert match._match(pattern) == {p for p in match.paths
                                         if whole.match(p) or below.match(p)}, pattern
        checked += 1
    assert checked > 1_000


def test_a_loop_over_many_reads_gives_each_piece_every_read_it_names() -> None:
    tracker = FlowTracker()
    statements.observe(tracker, "c0", "import os\npaths = sorted(os.listdir('files'))",
                       [], [], [], [])
    sources = [(f"files/f{i}.txt", Source(file_key(f"files/f{i}.txt"), "traced", "c1",
                                          f"{i:064x}")) for i in range(50)]
    code = "out = []\nfor p in paths:\n    out.append(open(p).read())"
    statements.observe(tracker, "c1", code, sources, [], [], [])
    statements.observe(tracker, "c2", "open('made.txt', 'w').write(str(out))", [],
                       ["made.txt"], [], [])
    inputs = {s.key for s in tracker.inputs_for_file("made.txt")}
    assert inputs == {file_key(p) for p, _ in sources}
