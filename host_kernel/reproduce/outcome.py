"""What a reproduction's report means: its events, test by test, held against the separate
collection run, the runner's exit status and its own terminal summary.

Owns :func:`parse` (one run's report lines into a :class:`Report`), :func:`judge`
(the run and its collection run into the verdict's outcome and counts) and
:func:`read_report` (one report on its own, as older callers read it). It runs
in the Host and reads only what the Host read from the pipes (``channel.py``).

A report is the runner's only when, in order: every line is one of the
reporter's events; nothing follows the session's end (``finished``, then
``closed``); every test it reports was collected, and each phase of each test
is reported once; the test run collected exactly the collection run's list;
every collected test reported; the process's exit status is the one the runner
returned, and agrees with the reports (failures and status 0 do not go
together); and the run's own terminal summary (``3 passed, 1 failed in 0.1s``,
or unittest's ``Ran N tests`` and ``OK``/``FAILED``) is printed once and counts
what the reports say. Any disagreement is ``tampered`` (``runner_tampered``);
a failure, or a runner that stopped on its own, is ``failed``. Then every
declared test file must show at least one test that ran and passed
(``tests_not_run`` names each one that did not, and why), and each skipped test
is listed with its reason.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .channel import Captured

__all__ = ["Report", "judge", "parse", "read_report"]

EVENTS = frozenset({"hello", "items", "collected", "deselected", "collect_error",
                    "collect_skip", "phase", "subtest", "error", "tampered", "finished",
                    "closed"})
WHENS = ("setup", "call", "teardown")
#: The reporter's exit status when its channel was closed or replaced (plugin.LOST).
LOST = 86
#: How many sentences of each kind a section keeps.
KEEP = 20
TERM = re.compile(r"(\d+) ([a-z ]+?)(?=,| in |$)")
#: unittest's loader names a module it could not load as tests with a stand-in test.
LOADER = "unittest.loader."


@dataclass
class Report:
    """One run's report, read line by line."""

    #: Why the report is not the runner's (a sentence each).
    problems: list[str] = field(default_factory=list)
    #: What the reporter itself found changed (``tampered`` events).
    tampered: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    collected: dict[str, Any] | None = None
    deselected: int = 0
    collect_errors: list[tuple[str, str]] = field(default_factory=list)
    collect_skips: list[tuple[str, str]] = field(default_factory=list)
    #: nodeid → its phases: (when, outcome, xfail).
    phases: dict[str, list[tuple[str, str, bool]]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    #: (nodeid, outcome, xfail) of each subtest.
    subtests: list[tuple[str, str, bool]] = field(default_factory=list)
    #: A unittest class or module fixture's failure or skip: (id, outcome, text or reason).
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    finished: dict[str, Any] | None = None
    closed: dict[str, Any] | None = None

    def problem(self, text: str) -> None:
        if len(self.problems) < KEEP and text not in self.problems:
            self.problems.append(text)


def parse(lines: Sequence[bytes], strict: bool = True, unterminated: bytes = b"",
          overflow: bool = False) -> Report:
    """The report's events; with ``strict``, every rule of the stream is checked."""
    rep = Report()
    allowed: Counter[str] = Counter()
    seen: Counter[tuple[str, str]] = Counter()
    hello = 0
    for number, line in enumerate(lines[:1_000_000], 1):
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        kind = event.get("event") if isinstance(event, dict) else None
        if kind not in EVENTS or not isinstance(event, dict):
            if strict:
                rep.problem(f"line {number} of the report is not an event of the Host's "
                            f"reporter")
            continue
        if strict:
            if rep.closed is not None:
                rep.problem("the report has lines after the session's end")
            elif rep.finished is not None and kind not in ("tampered", "closed"):
                rep.problem(f"the report has a {kind!r} line after the session's end")
            if kind == "hello":
                hello += 1
                if hello > 1 or number > 1:
                    rep.problem("the report says hello again, after the run began")
            elif kind == "items" and rep.collected is not None:
                rep.problem("the report lists collected tests after collection ended")
            elif kind in ("phase", "subtest") and rep.collected is None:
                rep.problem("the report has a test's outcome before collection ended")
        if kind == "items":
            ids = [str(i) for i in event.get("ids") or ()]
            if rep.collected is None:  # a list after collection ended counts for nothing
                rep.items += ids
                allowed.update(ids)
        elif kind == "collected":
            if rep.collected is not None and strict:
                rep.problem("the report says twice that collection ended")
            rep.collected = rep.collected or event
        elif kind == "deselected":
            rep.deselected += int(event.get("count", 0))
        elif kind == "collect_error":
            rep.collect_errors.append((str(event.get("nodeid")), str(event.get("text"))))
        elif kind == "collect_skip":
            rep.collect_skips.append((str(event.get("nodeid")), str(event.get("reason"))))
        elif kind in ("phase", "subtest"):
            nodeid, when = str(event.get("nodeid")), str(event.get("when"))
            outcome, xfail = str(event.get("outcome")), bool(event.get("xfail"))
            if strict and (when not in WHENS or outcome not in ("passed", "failed",
                                                                 "skipped", "error")):
                rep.problem(f"{nodeid}: a report with phase {when!r} and outcome {outcome!r}")
            if strict and nodeid not in allowed:
                rep.problem(f"a report for {nodeid}, which the run never collected")
            if kind == "subtest":
                rep.subtests.append((nodeid, outcome, xfail))
            else:
                seen[(nodeid, when)] += 1
                if strict and seen[(nodeid, when)] > max(1, allowed[nodeid]):
                    rep.problem(f"{nodeid} reported its {when} more than once")
                rep.phases.setdefault(nodeid, []).append((when, outcome, xfail))
                if event.get("reason") and outcome == "skipped":
                    rep.reasons.setdefault(nodeid, str(event["reason"]))
            if event.get("text") and nodeid not in rep.texts:
                rep.texts[nodeid] = str(event["text"])
        elif kind == "error":
            rep.errors.append((str(event.get("nodeid")), str(event.get("outcome")),
                               str(event.get("text") or event.get("reason") or "")))
        elif kind == "tampered":
            rep.tampered += [str(w) for w in event.get("what") or event.get("hooks") or ()]
        elif kind == "finished":
            rep.finished = rep.finished or event
        elif kind == "closed":
            rep.closed = rep.closed or event
    if strict and unterminated:
        rep.problem("the report ends in the middle of a line")
    if strict and overflow:
        rep.problem("the report is larger than the Host reads")
    return rep


def _test_outcome(seen: list[tuple[str, str, bool]]) -> str:
    """One test's outcome from its phases (setup, call, teardown)."""
    outcome = "passed"
    for when, result, xfail in seen:
        if result == "failed":
            return "failed" if when == "call" else "errors"
        if result == "error":
            return "errors"
        if result == "skipped":
            outcome = "xfailed" if xfail else "skipped"
    if not any(when == "call" for when, _, _ in seen) and outcome == "passed":
        return "errors"  # set up and torn down, never called
    return outcome


def _counts(rep: Report) -> tuple[dict[str, int], dict[str, str], list[str]]:
    """Counts, each test's outcome, and the failing tests, from the reports alone."""
    counts = {"collected": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
              "xfailed": 0, "deselected": rep.deselected, "not_run": 0,
              "collect_errors": len(rep.collect_errors)}
    subfailed = {n for n, o, x in rep.subtests if o in ("failed", "error") and not x}
    outcomes: dict[str, str] = {}
    for nodeid, seen in rep.phases.items():
        outcome = _test_outcome(seen)
        if nodeid in subfailed and outcome not in ("failed", "errors"):
            outcome = "failed"
        outcomes[nodeid] = outcome
        counts[outcome] += 1
    for _, outcome, _ in rep.errors:
        if outcome != "skipped":
            counts["errors"] += 1
    failing = [n for n, o in outcomes.items() if o in ("failed", "errors")] + [
        i for i, o, _ in rep.errors if o != "skipped"]
    if rep.collected is not None:
        counts["collected"] = int(rep.collected.get("before", rep.collected.get("count", 0)))
        counts["deselected"] = max(rep.deselected, int(rep.collected.get("removed_count", 0)))
    counts["not_run"] = max(0, counts["collected"] - len(rep.phases))
    return counts, outcomes, failing


def read_report(data: bytes, exit_status: int | None = 0) -> dict[str, Any]:
    """One report on its own (no collection run, no summary), test by test: outcome and
    counts. The runner's exit status must agree: a report of nothing but passes from a
    run that exited non-zero says the report was written by someone else."""
    rep = parse(data.splitlines(), strict=False)
    counts, _, failing = _counts(rep)
    failures = [rep.texts[n][-800:] for n in failing[:3] if n in rep.texts] + [
        f"{n}: {t[-400:]}" for n, t in rep.collect_errors[:3]]
    if rep.tampered:
        outcome = "tampered"
    elif rep.collect_errors or counts["failed"] or counts["errors"]:
        outcome = "failed"
    elif rep.finished is None or rep.collected is None or counts["deselected"] or \
            counts["not_run"]:
        outcome = "incomplete"
    elif counts["passed"] < 1:
        outcome = "no_tests"
    elif exit_status != 0:
        outcome = "failed"
        failures.append(f"the runner exited {exit_status} although its report shows no "
                        f"failure: the report was not the runner's own")
    else:
        outcome = "passed"
    return {"outcome": outcome, "counts": counts, "finished": rep.finished is not None,
            "tampered": sorted(set(rep.tampered))[:KEEP], "failing": failing[:KEEP],
            "failures": failures}


# -- the whole judgement -----------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One run as the Host saw it: what it read, and how the process ended."""

    captured: Captured
    #: The process's exit status (negative: killed by that signal).
    status: int


def _killed(status: int) -> bool:
    return status < 0 or status >= 128


def _ending(rep: Report, status: int, label: str) -> tuple[list[str], list[str]]:
    """(tampering, failures) from how a run ended."""
    if rep.closed is None:
        if status == LOST:
            return [(f"{label}: its report channel was closed or replaced while it ran, so "
                    f"the runner's reports went nowhere")], []
        if _killed(status):
            return [], [(f"{label} was killed (exit status {status}) before the runner "
                        f"finished: a crash, or a limit of the Host's")]
        return [(f"{label} ended (exit status {status}) without the runner's session end: "
                f"a test or declared code ended the process")], []
    returned = int(rep.closed.get("status", -1))
    if returned != status:
        return [(f"{label}: the process exited {status}, but the runner returned {returned} "
                f"(something ended it after the runner: an atexit handler, os._exit)")], []
    if rep.finished is None:
        return [], [(f"{label}: the runner stopped before its session began or ended (exit "
                    f"status {returned}); see its output")]
    if int(rep.finished.get("exitstatus", -1)) != returned:
        return [(f"{label}: the session ended with status {rep.finished.get('exitstatus')} "
                f"but the runner returned {returned}")], []
    return [], []


def _pytest_expected(rep: Report) -> Counter[str]:
    """The counts pytest's terminal summary shows for these reports."""
    stats: Counter[str] = Counter()
    for seen in rep.phases.values():
        for when, outcome, xfail in seen:
            if outcome == "passed" and when == "call":
                stats["xpassed" if xfail else "passed"] += 1
            elif outcome in ("failed", "error"):
                stats["failed" if when == "call" else "error"] += 1
            elif outcome == "skipped":
                stats["xfailed" if xfail else "skipped"] += 1
    stats["failed"] += sum(1 for _, o, x in rep.subtests if o == "failed" and not x)
    stats["error"] += len(rep.collect_errors)
    stats["skipped"] += len(rep.collect_skips)
    stats["deselected"] += rep.deselected
    return stats


def _summary(run: Run, runner: str, rep: Report, verbose: bool,
             failed: bool) -> tuple[str, list[str]]:
    """The run's own summary line, and how it disagrees with the reports."""
    if runner == "unittest":
        stream = run.captured.err
        ran = [line for kind, line in stream.matches if kind == "ran"]
        status = [line for kind, line in stream.matches if kind == "status"]
        if stream.counts.get("ran", 0) != 1 or not status:
            return "", [(f"the run printed {stream.counts.get('ran', 0)} 'Ran N tests' lines "
                        f"where unittest prints one")]
        line = f"{ran[-1]}; {status[-1]}"
        number = int(ran[-1].split()[1])
        tests = sum(len(s) for s in rep.phases.values())
        wrong = []
        if number != tests:
            wrong.append(f"its summary says {ran[-1]!r} but {tests} tests reported")
        if status[-1].startswith("FAILED") != failed:
            wrong.append(f"its summary says {status[-1]!r} but the reports say the run "
                         f"{'failed' if failed else 'passed'}")
        return line, wrong
    stream = run.captured.out
    lines = [line for kind, line in stream.matches if kind == "pytest"]
    seen = stream.counts.get("pytest", 0)
    if not verbose:
        return "", ([(f"the run printed a summary line ({lines[-1]!r}) that pytest does not "
                     f"print at this verbosity")] if seen else [])
    if seen != 1:
        return (lines[-1] if lines else ""), [
            f"the run printed {seen} terminal summary lines where pytest prints one"
            + (f" (the last: {lines[-1]!r})" if lines else "")]
    line = lines[-1].strip("= ")
    told: Counter[str] = Counter()
    for number, word in TERM.findall(line.rsplit(" in ", 1)[0]):
        word = {"errors": "error", "warning": "warnings"}.get(word, word)
        told[word] += int(number)
    want = _pytest_expected(rep)
    keys = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected")
    wrong = [k for k in keys if told.get(k, 0) != want.get(k, 0)]
    if wrong:
        said = ", ".join(f"{want[k]} {k}" for k in keys if want.get(k)) or "nothing"
        return line, [f"the terminal summary says {line!r} but the reports say {said}"]
    return line, []


def judge(run: Run, collection: Run | None, *, runner: str, verbose: bool = True,
          expected: Sequence[str] = (), file_of: Callable[[str], str | None] | None = None,
          ) -> dict[str, Any]:
    """The section fields of one reproduction, from its run and its collection run."""
    cap = run.captured
    rep = parse(cap.lines, True, cap.unterminated, cap.overflow)
    counts, outcomes, failing = _counts(rep)
    tampered = list(rep.problems) + list(rep.tampered)
    failures = [rep.texts[n][-800:] for n in failing[:3] if n in rep.texts] + [
        f"{n}: {t[-400:]}" for n, t in rep.collect_errors[:3]]
    more, stopped = _ending(rep, run.status, "the run")
    tampered += more
    failures += stopped
    col: Report | None = None
    col_stopped: list[str] = []
    if collection is not None:
        ccap = collection.captured
        col = parse(ccap.lines, True, ccap.unterminated, ccap.overflow)
        tampered += [f"the collection run: {p}" for p in col.problems + col.tampered]
        more, col_stopped = _ending(col, collection.status, "the collection run")
        tampered += more
        failures += col_stopped
        want, got = Counter(col.items), Counter(rep.items)
        if col.closed is not None and rep.collected is not None and want != got:
            only_run = sorted((got - want).elements())[:5]
            only_col = sorted((want - got).elements())[:5]
            tampered.append("the run collected other tests than the separate collection run"
                            + (f"; only in the run: {', '.join(only_run)}" if only_run else "")
                            + (f"; never in the run: {', '.join(only_col)}" if only_col else ""))
        for nodeid, text in col.collect_errors:
            if nodeid not in {n for n, _ in rep.collect_errors}:
                rep.collect_errors.append((nodeid, text))
                counts["collect_errors"] += 1
                failures.append(f"{nodeid}: {text[-400:]}")
    failed = bool(rep.collect_errors or counts["failed"] or counts["errors"] or stopped)
    exitstatus = int(rep.finished.get("exitstatus", -1)) if rep.finished else None
    if exitstatus == 0 and failed and not stopped:
        tampered.append(f"the runner's exit status says success although "
                        f"{counts['failed']} failed and "
                        f"{counts['errors'] + counts['collect_errors']} errored")
    # Each collected test reports (a unittest class or module fixture's failure or skip
    # accounts for the tests it stood in front of).
    reported: Counter[str] = Counter({n: max(1, sum(1 for w, _, _ in s if w == "call"))
                                      for n, s in rep.phases.items()})
    fronts = tuple(i[i.rindex(" (") + 2:-1] + "." for i, _, _ in rep.errors
                   if i.endswith(")") and " (" in i)
    missing = [n for n in (Counter(rep.items) - reported).elements()
               if not (fronts and n.startswith(fronts))]
    if missing and not failed and rep.finished is not None and exitstatus == 0:
        tampered.append(f"{len(missing)} collected test(s) never reported, though the runner "
                        f"finished with status 0: {', '.join(missing[:5])}")
    summary, disagree = "", list[str]()
    if rep.finished is not None and rep.closed is not None:
        summary, disagree = _summary(run, runner, rep, verbose, failed)
    tampered += disagree
    skipped = [{"nodeid": n, "reason": rep.reasons.get(n, "")} for n, o in outcomes.items()
               if o == "skipped"] + [{"nodeid": n, "reason": r} for n, r in rep.collect_skips]
    not_run = [] if file_of is None else _not_run(
        rep, outcomes, expected, file_of, col.items if col is not None else rep.items, failed)
    section: dict[str, Any] = {
        "counts": counts, "finished": rep.finished is not None,
        "tampered": list(dict.fromkeys(tampered))[:KEEP], "failing": failing[:KEEP],
        "failures": failures[:6], "skipped": skipped[:50], "summary": summary,
        "not_run": not_run[:KEEP],
    }
    if col is not None:
        section["collection"] = {"collected": len(col.items), "exit_status": collection.status
                                 if collection else None,
                                 "errors": [n for n, _ in col.collect_errors][:KEEP]}
    why = "; ".join(f"{d['file']} ({d['why']})" for d in not_run[:6])
    if not_run:
        section["why"] = (f"declared test files that showed no test that ran and passed: "
                          f"{why}; each declared test file must run at least one passing "
                          f"test (rename a helper module that holds no tests)")
    if section["tampered"]:
        outcome = "tampered"
    elif failed or col_stopped:  # the collection run must end as the runner ends it, too
        outcome = "failed"
    elif rep.finished is None or rep.collected is None or counts["deselected"]:
        outcome = "incomplete"
    elif exitstatus not in (0, None):
        outcome = "no_tests" if exitstatus == 5 else "failed"
        if exitstatus != 5:
            section["failures"] = failures + [(f"the runner exited {exitstatus} although no "
                                              f"test failed; see its output")]
    elif not_run:
        outcome = "tests_not_run"
    elif counts["passed"] < 1:
        outcome = "no_tests"
    else:
        outcome = "passed"
    if not_run and outcome in ("failed", "tampered", "incomplete", "no_tests"):
        section["also"] = [["tests_not_run", section["why"]]]  # a second refusal
    if outcome == "tests_not_run":
        # What a verifier that knows no such outcome shows (as the Host could not run it).
        section["error"] = section["why"]
    return {"outcome": outcome, **section}


def _not_run(rep: Report, outcomes: dict[str, str], expected: Sequence[str],
             file_of: Callable[[str], str | None], collected: Sequence[str],
             failed: bool) -> list[dict[str, str]]:
    """Each expected file with no test that ran and passed, and why. A file whose tests
    were collected but never ran because the run failed elsewhere is not named: the
    failure refuses on its own."""
    has_tests = {file_of(n) for n in collected if not n.startswith(LOADER)}
    by_file: dict[str, list[str]] = {}
    notes: dict[str, str] = {}
    for nodeid, outcome in outcomes.items():
        f = file_of(nodeid)
        if f is None:
            continue
        if nodeid.startswith(LOADER):  # unittest's stand-in for a module it could not load
            text = rep.texts.get(nodeid, "") or rep.reasons.get(nodeid, "")
            last = (text.strip().splitlines() or ["?"])[-1][:200]
            notes.setdefault(f, f"it skipped at module level: {last!r}" if outcome == "skipped"
                             else f"it failed to import: {last}")
        else:
            by_file.setdefault(f, []).append(outcome)
    for nodeid, text in rep.collect_errors:
        for f in _files_at(nodeid, expected, file_of):
            notes.setdefault(f, "it errored at collection: " + (text.strip().splitlines()
                                                                or ["?"])[-1][:200])
    for nodeid, reason in rep.collect_skips:
        for f in _files_at(nodeid, expected, file_of):
            notes.setdefault(f, f"it skipped at module level: {reason[:200]!r}")
    for ident, outcome, text in rep.errors:
        f = file_of(ident)
        if f is not None:
            notes.setdefault(f, f"its class or module fixture {outcome}: {text[-200:]}")
    found = []
    for f in expected:
        seen = by_file.get(f, [])
        if "passed" in seen or "failed" in seen or "errors" in seen:
            continue  # passed, or failing (which refuses on its own)
        if f in notes:
            why = notes[f]
        elif not seen and f in has_tests:
            if failed:
                continue
            why = "its collected tests never ran"
        elif seen:
            reasons = sorted({rep.reasons.get(n, "") for n, o in outcomes.items()
                              if file_of(n) == f and o in ("skipped", "xfailed")} - {""})
            why = "every test in it was skipped" + (f": {'; '.join(reasons)[:200]}"
                                                    if reasons else "")
        else:
            why = "it collected no test"
        found.append({"file": f, "why": why})
    return found


def _files_at(nodeid: str, expected: Sequence[str],
              file_of: Callable[[str], str | None]) -> list[str]:
    """The expected files a collection report stands for: its file, or every expected
    file under the folder it names (a package that failed to import)."""
    f = file_of(nodeid)
    if f is not None:
        return [f]
    folder = nodeid.split("::", 1)[0].rstrip("/")
    return [e for e in expected if folder and e.startswith(folder + "/")]
