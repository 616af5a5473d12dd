"""The baseline's own tests judge a ``codebase_change``, at their baseline bytes.

Owns the two regression runs and what they mean. The tests that judge a change
are not only the ones the agent cited: every test of the baseline runs, as the
baseline holds it, against the changed tree:

- **baseline**: the baseline tree alone, with pytest over it (the Reproducer
  caches the run, so a session pays for it once);
- **changed**: the tree the declared change makes, with every baseline test
  file, ``conftest.py``, pytest config and file under a ``tests``/``test``
  folder put back to its baseline bytes, and every such file the baseline does
  not hold taken out (an agent's new conftest or helper judges nothing here).

A test that passed on the baseline and does not pass after is a regression
(``regression``), whatever the agent did to its copy of that test, unless the
submission names it under ``intended_changes`` with a reason. The agent's own
edits to baseline tests and test configuration are shown as a unified diff in
the verdict, bounded.

The runner names at most 20 failing tests per run; a shortfall of passing tests
the names do not explain (a file that no longer imports, a test now skipped or
beyond the first 20) is a regression the run cannot name, and only a fixed
change clears it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import StorageError
from ..store.blobs import FileBlobStore
from .invocation import Invocation
from .roles import test_role
from .runner import Plan

__all__ = ["INVOCATION", "regression_runs"]

#: How the baseline's tests run: pytest from the tree's root, its own config deciding what
#: it collects, the root on the import path (as ``python -m pytest`` puts it).
INVOCATION = Invocation("pytest", ".", (), (), True)
#: Bounds of the diff of the agent's test edits in the verdict.
MAX_DIFF_CHARS = 20_000
MAX_DIFF_LINES_PER_FILE = 400
#: A collection error as the runner lists it among its failures: ``path.py: text``.
COLLECT_ERROR = re.compile(r"^([^\s:]+\.py): ")

Manifest = Mapping[str, tuple[str, int]]
Finding = tuple[str, bool, str]
RunPlan = Callable[[Plan], dict[str, Any]]


def judged_tree(changed: Manifest, baseline: Manifest) -> dict[str, tuple[str, int]]:
    """The changed tree with the baseline's tests and test configuration as it holds them."""
    tree: dict[str, tuple[str, int]] = {}
    for rel, entry in changed.items():
        if test_role(rel) is None:
            tree[rel] = entry
        elif rel in baseline:
            tree[rel] = baseline[rel]
    return tree


def regression_runs(changed: Manifest, baseline: Manifest, sources: Mapping[str, str],
                    intended: Sequence[tuple[str, str]], run: RunPlan, blobs: FileBlobStore,
                    agent_duration: float | None, network: bool
                    ) -> tuple[list[Finding], list[dict[str, Any]]]:
    """Run the baseline's tests on the baseline and on the change; findings and sections."""
    if not any(test_role(rel) == "test" for rel in baseline):
        return [("regression", True, "the baseline holds no test file, so no baseline test "
                                     "can regress")], []
    before = run(Plan("the baseline's own tests, on the baseline", INVOCATION, baseline,
                      agent_duration, network, frozenset()))
    tree = judged_tree(changed, baseline)
    declared = frozenset(rel for rel, sha in sources.items()
                         if rel in tree and tree[rel][0] == sha)
    after = run(Plan("the baseline's own tests, on the changed tree", INVOCATION, tree,
                     agent_duration, network, declared))
    before = dict(before, role="baseline_tests")
    after = dict(after, role="regression", test_edits=test_edits(baseline, sources, blobs))
    findings = [_judge(before, after, intended)]
    return findings, [before, after]


def _failures(section: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(failing tests, files that failed to collect) as the run named them."""
    tests = {str(n) for n in section.get("failing") or []}
    files = set()
    for text in section.get("failures") or []:
        m = COLLECT_ERROR.match(str(text))
        if m and "::" not in m.group(1):
            files.add(m.group(1))
    return tests, files


def _covered(name: str, intended: Sequence[tuple[str, str]]) -> bool:
    for test, _ in intended:
        if name == test or name.startswith((test + "::", test + "[")):
            return True
    return False


def _judge(before: Mapping[str, Any], after: dict[str, Any],
           intended: Sequence[tuple[str, str]]) -> Finding:
    """The regression check; ``after`` (the changed tree's section) gets the names."""
    for which, run in (("on the baseline", before), ("on the changed tree", after)):
        outcome = run.get("outcome")
        if outcome == "tampered":
            return ("runner_tampered", False, f"the baseline's own tests {which}: declared code "
                                              f"hooked the runner: "
                                              + "; ".join(run.get("tampered") or []))
        if outcome == "timeout":
            limit = (run.get("limits") or {}).get("timeout") or 0
            return ("reproduction_timeout", False, f"the baseline's own tests {which} passed "
                                                   f"the {limit:g} s limit; the Host must run "
                                                   f"them all (raise Host(reproduce_timeout=))")
        if outcome == "error":
            return ("reproduction_error", False, f"the Host could not run the baseline's own "
                                                 f"tests {which}: {run.get('error')}")
    old_tests, old_files = _failures(before)
    new_tests, new_files = _failures(after)
    named = sorted((new_tests - old_tests) | (new_files - old_files))
    passed_before = int((before.get("counts") or {}).get("passed", 0))
    passed_after = int((after.get("counts") or {}).get("passed", 0))
    # Each newly failing test explains one fewer pass; a file that no longer collects,
    # a test now skipped or not run, or one beyond the names, is not explained.
    unexplained = passed_before - passed_after - len(new_tests - old_tests)
    regressions = [n for n in named if not _covered(n, intended)]
    excused = [n for n in named if _covered(n, intended)]
    files_excused = any(n in new_files for n in excused)
    after["regressions"] = named[:50]
    after["intended"] = excused[:50]
    problems = []
    if regressions:
        problems.append(", ".join(regressions[:10])
                        + (f" and {len(regressions) - 10} more" if len(regressions) > 10 else ""))
    if unexplained > 0 and not files_excused:
        problems.append(f"{unexplained} more baseline test(s) passed on the baseline than on "
                        f"the changed tree without failing by name (a test file that no "
                        f"longer imports or collects, a test now skipped or not run, or more "
                        f"failures than the run names)")
    if problems:
        return ("regression", False, "baseline tests that passed on the baseline do not pass "
                                     "on the changed tree, run at their baseline bytes "
                                     "(whatever the declared copies say): "
                                     + "; ".join(problems) + ". Fix the change; if the new "
                                     "behaviour is intended, name each test under "
                                     "intended_changes=[{'test': <node id or file>, 'reason': "
                                     "…}] of host.submit_output, which a reviewer reads first")
    note = f", {len(excused)} changed as intended" if excused else ""
    return ("regression", True, f"the baseline's {passed_before} passing test(s) ran at their "
                                f"baseline bytes on the changed tree and {passed_after} passed"
                                f"{note}")


def _text(blobs: FileBlobStore, sha: str | None) -> list[str]:
    if sha is None:
        return []
    try:
        return blobs.read(sha).decode("utf-8", "replace").splitlines(keepends=True)
    except StorageError:
        return ["(the stored bytes cannot be read)\n"]


def test_edits(baseline: Manifest, sources: Mapping[str, str], blobs: FileBlobStore) -> str:
    """A unified diff of every declared test file or test configuration that differs from
    the baseline (new ones against nothing), bounded in size."""
    parts: list[str] = []
    size = 0
    for rel in sorted(sources):
        if test_role(rel) is None:
            continue
        old = baseline.get(rel)
        if old is not None and old[0] == sources[rel]:
            continue
        lines = list(difflib.unified_diff(_text(blobs, old[0] if old else None),
                                          _text(blobs, sources[rel]),
                                          f"a/{rel}" if old else "/dev/null", f"b/{rel}"))
        if len(lines) > MAX_DIFF_LINES_PER_FILE:
            cut = len(lines) - MAX_DIFF_LINES_PER_FILE
            lines = lines[:MAX_DIFF_LINES_PER_FILE] + [f"… {cut} more diff lines of {rel}\n"]
        text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
        if size + len(text) > MAX_DIFF_CHARS:
            parts.append(f"… the diff stops here ({MAX_DIFF_CHARS} characters); more test "
                         f"files differ from the baseline, from {rel} on\n")
            break
        parts.append(text)
        size += len(text)
    return "".join(parts)
