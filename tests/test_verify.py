"""submit_output: every refusal code triggered through real cells, and the honest path accepted."""

from __future__ import annotations

import json
import subprocess
import sys
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_kernel import Host
from host_kernel.audit import audit
from host_kernel._errors import RecordError
from host_kernel.verify import CHECKS, RETIRED

from _helpers import run_ok
from _pipeline import SOURCES, SUMMARY, TEST_CMD, build_package, submit

def test_the_honest_path_is_accepted_and_recorded(honest: Host) -> None:
    accepted, failed, text = submit(honest)
    assert accepted, text
    assert failed == {}
    row = honest.ledger.query("SELECT accepted, body FROM submissions ORDER BY seq DESC LIMIT 1")[0]
    assert row["accepted"] == 1
    assert json.loads(row["body"])["verdict"]["accepted"] is True


def test_the_kernel_sees_a_refusal_as_an_exception_listing_every_failure(honest: Host) -> None:
    obs = honest.execute("host.submit_output({'x': 1}, [], task_status='done')")
    assert obs.status == "error"
    assert "SubmissionRefused" in obs.text
    assert "[completion_bullets]" in obs.text and "[task_status]" in obs.text
    assert "[declarations_missing]" in obs.text


# -- every mode -------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, code", [
    ({"output": "just a string"}, "output_not_json"),
    ({"output": {"big": "x" * (1024 * 1024 + 10)}}, "output_too_large"),
    ({"output": {"n": 1}, "output_schema": {"type": "object", "required": ["total"]}}, "output_schema"),
    ({"completion_bullets": []}, "completion_bullets"),
    ({"completion_bullets": ["a", "b", "c", "d", "e"]}, "completion_bullets"),
    ({"completion_bullets": ["  "]}, "completion_bullets"),
    ({"task_status": "done"}, "task_status"),
    ({"output": {"figures": ["plots/never_made.png"]}}, "claim_missing"),
    ({"output": {"summary": "done", "details": [{"chart": "plots/never_made.png"}]}},
     "claim_missing"),
    ({"output": {"artifact_id": "5b0e7a8e-3c1d-4c4e-9f00-000000000000", "artifacts": ["5b0e7a8e-3c1d-4c4e-9f00-000000000000"]}}, "claim_unbacked"),
])
def test_every_mode_checks(honest: Host, overrides: dict[str, object], code: str) -> None:
    accepted, failed, text = submit(honest, **overrides)
    assert not accepted
    assert code in failed, text


def test_a_deeply_nested_output_fails_closed(honest: Host) -> None:
    obs = honest.execute(
        "from host_kernel import SubmissionRefused\nd = x = {}\n"
        "for _ in range(100):\n    x['k'] = {}; x = x['k']\n"
        "try:\n    host.submit_output(d, ['x'])\nexcept SubmissionRefused as e:\n"
        "    print([c.code for c in e.verdict.failed])")
    assert "output_too_large" in obs.text


def test_an_unserialisable_output_is_refused_and_recorded(honest: Host) -> None:
    obs = honest.execute(
        "from host_kernel import SubmissionRefused\n"
        "try:\n    host.submit_output({'f': object()}, ['x'])\nexcept SubmissionRefused as e:\n"
        "    print([c.code for c in e.verdict.failed])")
    assert "output_not_json" in obs.text


def test_a_same_named_file_outside_the_session_backs_nothing(honest: Host) -> None:
    (honest.workdir / "report.csv").write_text("made outside the Host\n")
    accepted, failed, _ = submit(honest, output={"files": ["report.csv"]})
    assert not accepted and "claim_unbacked" in failed


def test_a_file_written_by_cell_code_directly_backs_nothing(honest: Host) -> None:
    run_ok(honest, "open('direct.txt', 'w').write('x')")
    accepted, failed, _ = submit(honest, output={"output_path": "direct.txt"})
    assert not accepted and "claim_unbacked" in failed


def test_files_written_through_host_and_by_host_bash_are_backed(honest: Host) -> None:
    run_ok(honest, "host.write_file('out/a.txt', 'a')\nhost.bash('echo b > out/b.txt')")
    accepted, failed, text = submit(honest, output={"files": ["out/a.txt", "out/b.txt"]})
    assert accepted, text


def test_a_file_only_touched_by_host_bash_backs_nothing(honest: Host) -> None:
    # Made outside the session, then touched by a command: its bytes are the same as at the
    # command's start, so the command produced nothing.
    (honest.workdir / "touched.csv").write_text("made outside the Host\n")
    run_ok(honest, "host.bash('touch touched.csv')")
    accepted, failed, text = submit(honest, output={"files": ["touched.csv"]})
    assert not accepted and "claim_unbacked" in failed, text
    # A command that really changes its bytes backs it.
    run_ok(honest, "host.bash('echo more >> touched.csv')")
    accepted, failed, text = submit(honest, output={"files": ["touched.csv"]})
    assert accepted, text


# -- code declarations (armed) ----------------------------------------------------------------


@pytest.mark.parametrize("overrides, code", [
    ({"source_files": None}, "declarations_missing"),
    ({"test_evidence": None}, "declarations_missing"),
    ({"source_files": list(SOURCES) + ["../escape.py"]}, "source_outside"),
    ({"source_files": list(SOURCES) + ["/etc/passwd"]}, "source_outside"),
    ({"source_files": list(SOURCES) + ["pkg/missing.py"]}, "source_missing"),
    ({"source_files": [{"path": "pkg/core.py", "sha256": "0" * 64}]}, "source_hash_mismatch"),
    ({"entry_points": ["main.py"]}, "entry_point_not_source"),
    ({"architecture_summary": ""}, "declarations_missing"),
    ({"architecture_summary": "stuff"}, "architecture_summary"),
    ({"test_evidence": ["python -m pytest"]}, "test_evidence_malformed"),
    ({"test_evidence": [{"command": TEST_CMD, "producing_cell_id": 2}]}, "cell_id_unknown"),
    ({"test_evidence": [{"command": TEST_CMD, "producing_cell_id": "2"}]}, "cell_id_unknown"),
    ({"test_evidence": [{"command": TEST_CMD, "producing_cell_id": "AAAAAAAAAAAAAAAA"}]}, "cell_id_unknown"),
    ({"test_evidence": [{"command": "python -m pytest tests", "producing_cell_id": "CITED"}]}, "receipt_missing"),
])
def test_declaration_checks(honest: Host, overrides: dict[str, object], code: str) -> None:
    if "test_evidence" in overrides and overrides["test_evidence"] and isinstance(
            overrides["test_evidence"][0], dict) and overrides["test_evidence"][0]["producing_cell_id"] == "CITED":  # type: ignore[index]
        overrides["test_evidence"][0]["producing_cell_id"] = honest._evidence_cell  # type: ignore[attr-defined,index]
    accepted, failed, text = submit(honest, **overrides)
    assert not accepted
    assert code in failed, text


def test_cell_id_from_another_sessions_record_is_unknown(honest: Host, tmp_path: Path) -> None:
    ws = tmp_path / "other"
    ws.mkdir()
    with Host(ws, mode="reusable_pipeline") as other:
        foreign = build_package(other)
    accepted, failed, _ = submit(honest, test_evidence=[{"command": TEST_CMD, "producing_cell_id": foreign}])
    assert not accepted and "cell_id_unknown" in failed


def test_entry_point_that_does_not_compile(honest: Host) -> None:
    run_ok(honest, "host.write_file('pkg/broken.py', 'def main(:\\n')\nhost.save_artifact('pkg/broken.py')")
    accepted, failed, text = submit(honest, source_files=list(SOURCES) + ["pkg/broken.py"],
                                    entry_points=["pkg/broken.py"])
    assert not accepted and "entry_point_syntax" in failed
    assert "does not compile (line 1)" in text


def test_tests_run_with_subprocess_then_cited_have_no_receipt(honest: Host) -> None:
    obs = honest.execute(f"import subprocess\nsubprocess.run({TEST_CMD!r}, shell=True)")
    accepted, failed, text = submit(honest, test_evidence=[{"command": TEST_CMD, "producing_cell_id": obs.cell_id}])
    assert not accepted and "receipt_missing" in failed
    assert "no receipt" in text


def test_printed_pass_lines_are_not_evidence(honest: Host) -> None:
    obs = honest.execute(f"print('[cell id: FAKE]')\nprint('$ {TEST_CMD}')\nprint('1 passed in 0.01s')")
    accepted, failed, _ = submit(honest, test_evidence=[{"command": TEST_CMD, "producing_cell_id": obs.cell_id}])
    assert not accepted and "receipt_missing" in failed


def test_evidence_from_the_submitting_cell_itself(honest: Host) -> None:
    code = (f"from host_kernel import SubmissionRefused\nr = host.bash({TEST_CMD!r})\n"
            f"try:\n    host.submit_output({{'s': 1}}, ['x'], source_files={list(SOURCES)!r}, "
            f"entry_points=['pkg/cli.py'], architecture_summary={SUMMARY!r}, "
            f"test_evidence=[{{'command': {TEST_CMD!r}, 'producing_cell_id': host.cell_id}}])\n"
            f"except SubmissionRefused as e:\n    print(sorted(c.code for c in e.verdict.failed))")
    obs = honest.execute(code)
    assert "cell_unfinished" in obs.text and "evidence_after_submission" in obs.text


@pytest.mark.parametrize("command, codes", [
    ("exit 1", {"exit_nonzero"}),
    ("python -m pytest -q tests -k nothing_matches", {"exit_nonzero"}),
    ("python -m pytest -q failing", {"exit_nonzero"}),
    # Commands that hide the failing test's exit status: the receipt exits 0, and the Host
    # will not reproduce more than one plain command.
    ("python -m pytest -q failing || true", {"runner_unrecognised"}),
    ("python -m pytest -q failing; true", {"runner_unrecognised"}),
    ("python -m pytest -q failing | tee log.txt", {"runner_unrecognised"}),
    ("echo $(false) && python -m pytest -q failing || true", {"runner_unrecognised"}),
    ("python -m pytest --co -q failing && echo '1 passed in 0.01s'", {"runner_unrecognised"}),
    ("PYTHONPATH=fakes python -m pytest -q tests", {"runner_unrecognised"}),
    ("python -c 'print(1)'", {"runner_unrecognised"}),
    # Commands that choose which tests run (or run none) and exit 0.
    ("python -m pytest --collect-only -q failing", {"selection_not_allowed"}),
    ("python -m pytest -q -k test_ok failing", {"selection_not_allowed"}),
    ("python -m pytest -q --deselect failing/test_bad.py::test_bad failing",
     {"selection_not_allowed"}),
    ("python -m pytest -q failing/test_bad.py::test_ok", {"selection_not_allowed"}),
    ("python -m pytest -q -p no:randomly tests", {"selection_not_allowed"}),
    ("python -m pytest -q --version", {"selection_not_allowed"}),
])
def test_receipt_checks(honest: Host, command: str, codes: set[str]) -> None:
    run_ok(honest, "host.write_file('failing/test_bad.py', 'def test_ok():\\n    assert True\\n\\n\\n"
                   "def test_bad():\\n    assert 1 == 2\\n')")
    obs = honest.execute(f"r = host.bash({command!r})\nprint('EXIT', r.exit_status)")
    if codes != {"exit_nonzero"}:
        assert "EXIT 0" in obs.text, obs.text  # the receipt itself looks fine
    accepted, failed, text = submit(honest, test_evidence=[{"command": command, "producing_cell_id": obs.cell_id}])
    assert not accepted
    assert codes <= set(failed), text
    assert _reproduction(honest) == []  # refused before anything is re-run


def test_a_test_path_that_was_not_declared(honest: Host) -> None:
    # The command really ran and exited 0, but the Host re-runs only declared files.
    run_ok(honest, "host.write_file('extra/test_more.py', 'def test_more():\\n    assert True\\n')")
    command = "python -m pytest -q extra"
    obs = honest.execute(f"r = host.bash({command!r})\nprint('EXIT', r.exit_status)")
    assert "EXIT 0" in obs.text, obs.text
    accepted, failed, text = submit(honest, test_evidence=[{"command": command, "producing_cell_id": obs.cell_id}])
    assert not accepted and "test_path_undeclared" in failed, text
    # Declared (and saved), and cited beside the package's own tests, it is reproduced and
    # accepted; cited alone, it would leave tests/test_core.py out (selection_not_allowed).
    run_ok(honest, "host.save_artifact('extra/test_more.py')")
    sources = list(SOURCES) + ["extra/test_more.py"]
    evidence = [{"command": command, "producing_cell_id": obs.cell_id}]
    accepted, failed, text = submit(honest, source_files=sources, test_evidence=evidence)
    assert not accepted and "selection_not_allowed" in failed, text
    both = evidence + [{"command": TEST_CMD, "producing_cell_id": honest._evidence_cell}]  # type: ignore[attr-defined]
    accepted, failed, text = submit(honest, source_files=sources, test_evidence=both)
    assert accepted, text


def test_and_and_redirections_are_fine(honest: Host) -> None:
    command = f"cd . && {TEST_CMD} 2>&1"
    obs = honest.execute(f"host.bash({command!r})")
    accepted, failed, text = submit(honest, test_evidence=[{"command": command, "producing_cell_id": obs.cell_id}])
    assert accepted, text


#: pkg.core broken: its test fails wherever it really runs.
BROKEN = "def add(a, b):\n    return a - b\n"


def _break(host: Host) -> None:
    """Write and save the broken pkg/core.py: the declared bytes now fail their test."""
    run_ok(host, f"host.write_file('pkg/core.py', {BROKEN!r})\nhost.save_artifact('pkg/core.py')")


def _reproduction(host: Host) -> list[dict[str, object]]:
    """The reproduction sections of the last verdict, as the record holds them."""
    row = host.ledger.query("SELECT body FROM submissions ORDER BY seq DESC LIMIT 1")[0]
    return json.loads(row["body"])["verdict"]["reproduction"]


def test_path_shadowing_python_with_a_script_that_exits_0(fresh: Host) -> None:
    _break(fresh)
    fake = "#!/bin/sh\necho '3 passed in 0.01s'\nexit 0\n"
    run_ok(fresh, f"host.write_file('shim/python', {fake!r})\nimport os\nos.chmod('shim/python', 0o755)\n"
                  "os.environ['PATH'] = os.path.abspath('shim') + ':' + os.environ['PATH']")
    obs = fresh.execute(f"r = host.bash({TEST_CMD!r})\nprint(r.exit_status)")
    assert "3 passed" in obs.text
    accepted, failed, text = submit(fresh, test_evidence=[{"command": TEST_CMD, "producing_cell_id": obs.cell_id}])
    assert not accepted and "reproduction_failed" in failed, text
    [section] = _reproduction(fresh)
    assert section["outcome"] == "failed" and section["counts"]["failed"] == 1
    assert "shim" not in str(section["interpreter"])  # the Host's interpreter, not the shim


def test_a_workspace_module_shadowing_the_runner(fresh: Host) -> None:
    _break(fresh)
    shim = 'print("5 passed in 0.01s")\n'
    assert fresh.execute(f"host.write_file('pytest.py', {shim!r})").status == "ok"
    obs = fresh.execute(f"r = host.bash({TEST_CMD!r})\nprint(r.exit_status, r.shadowed_modules)")
    assert "0 ('pytest',)" in obs.text
    accepted, failed, text = submit(fresh, test_evidence=[{"command": TEST_CMD, "producing_cell_id": obs.cell_id}])
    assert not accepted and "reproduction_failed" in failed, text
    # Declaring the shim puts it in the Host's tree, where it is named for what it is.
    run_ok(fresh, "host.save_artifact('pytest.py')")
    accepted, failed, text = submit(fresh, source_files=list(SOURCES) + ["pytest.py"],
                                    test_evidence=[{"command": TEST_CMD, "producing_cell_id": obs.cell_id}])
    assert not accepted and "runner_tampered" in failed, text
    assert "pytest.py" in text


def test_pythonpath_edited_in_the_kernel(fresh: Host) -> None:
    _break(fresh)
    run_ok(fresh, "host.write_file('fakes/pytest.py', 'print(\"1 passed in 0.01s\")\\n')")
    obs = fresh.execute(f"import os\nos.environ['PYTHONPATH'] = 'fakes'\nr = host.bash({TEST_CMD!r})\n"
                        "del os.environ['PYTHONPATH']\nprint('EXIT', r.exit_status)")
    assert "EXIT 0" in obs.text, obs.text
    accepted, failed, text = submit(fresh, test_evidence=[{"command": TEST_CMD, "producing_cell_id": obs.cell_id}])
    assert not accepted and "reproduction_failed" in failed, text


def test_old_bytes_put_back_after_the_tests_fail_their_reproduction(fresh: Host) -> None:
    # broken code saved, fixed, tested, then the broken bytes put back (and they are an artifact)
    assert fresh.execute(f"host.write_file('pkg/core.py', {BROKEN!r})\n"
                         "host.save_artifact('pkg/core.py')\n"
                         f"host.write_file('pkg/core.py', {SOURCES['pkg/core.py']!r})").status == "ok"
    obs = fresh.execute(f"r = host.bash({TEST_CMD!r})\nprint('EXIT', r.exit_status)")
    assert "EXIT 0" in obs.text
    assert fresh.execute(f"open('pkg/core.py', 'w').write({BROKEN!r})").status == "ok"
    accepted, failed, text = submit(fresh, test_evidence=[{"command": TEST_CMD, "producing_cell_id": obs.cell_id}])
    assert not accepted and "reproduction_failed" in failed, text
    assert "test_add" in text


def test_a_source_edited_after_the_tests_ran_is_reproduced_on_its_saved_bytes(fresh: Host) -> None:
    # A correct edit after the agent's own run: the Host tests the saved bytes itself.
    run_ok(fresh, "host.edit_file('pkg/core.py', 'return a + b', 'return a + b + 0')\n"
                  "host.save_artifact('pkg/core.py')")
    accepted, failed, text = submit(fresh)
    assert accepted, text
    [section] = _reproduction(fresh)
    assert section["outcome"] == "passed" and section["counts"]["passed"] == 1
    # A wrong edit after it, with the same old evidence, is refused.
    run_ok(fresh, "host.edit_file('pkg/core.py', 'return a + b + 0', 'return a + b + 1')\n"
                  "host.save_artifact('pkg/core.py')")
    accepted, failed, text = submit(fresh)
    assert not accepted and "reproduction_failed" in failed, text
    assert _reproduction(fresh)[0]["outcome"] == "failed"


def test_a_source_edited_directly_and_resaved_after_the_tests_is_reproduced(fresh: Host) -> None:
    run_ok(fresh, "open('pkg/core.py', 'a').write('# touched\\n')\nhost.save_artifact('pkg/core.py')")
    accepted, failed, text = submit(fresh)
    assert accepted, text
    assert _reproduction(fresh)[0]["outcome"] == "passed"
    run_ok(fresh, f"open('pkg/core.py', 'w').write({BROKEN!r})\nhost.save_artifact('pkg/core.py')")
    accepted, failed, text = submit(fresh)
    assert not accepted and "reproduction_failed" in failed, text


def test_a_source_changed_but_not_saved(fresh: Host) -> None:
    run_ok(fresh, "open('pkg/core.py', 'a').write('# unsaved\\n')")
    accepted, failed, _ = submit(fresh)
    assert not accepted and "source_not_saved" in failed


def _blob(host: Host, sha: str) -> Path:
    return host.record_dir / "blobs" / "sha256" / sha[:2] / sha


def test_a_claimed_artifact_whose_blob_was_altered(fresh: Host) -> None:
    obs = fresh.execute("host.write_file('result.txt', 'r')\na = host.save_artifact('result.txt')\nprint(a.artifact_id, a.sha256)")
    aid, sha = obs.outputs[0]["text"].split()
    os.chmod(_blob(fresh, sha), 0o644)
    _blob(fresh, sha).write_text("forged")
    accepted, failed, _ = submit(fresh, output={"artifacts": [aid]})
    assert not accepted and "artifact_altered" in failed


def test_a_receipts_output_altered_in_the_store_is_not_evidence(fresh: Host) -> None:
    # The Host never reads the agent's printed output to decide: its own run does.
    body = json.loads(fresh.ledger.query("SELECT body FROM receipts WHERE cell_id = ?",
                                         (fresh._evidence_cell,))[0]["body"])  # type: ignore[attr-defined]
    blob = _blob(fresh, body["stdout_sha256"])
    os.chmod(blob, 0o644)
    blob.write_text("1 passed in 0.01s\n")
    _break(fresh)
    accepted, failed, text = submit(fresh)
    assert not accepted and "reproduction_failed" in failed, text
    assert set(failed).isdisjoint(RETIRED)
    # The same altered output with the good code back: accepted on the Host's own run...
    run_ok(fresh, f"host.write_file('pkg/core.py', {SOURCES['pkg/core.py']!r})\n"
                  "host.save_artifact('pkg/core.py')")
    accepted, failed, text = submit(fresh)
    assert accepted, text
    # ...and the altered blob is still caught by audit.
    report = audit(fresh.record_dir)
    assert any(f.code in ("blob_altered", "receipt_stream_altered") and f.fatal
               for f in report.findings), [str(f) for f in report.findings]


def test_editing_the_sqlite_file_is_denied_to_a_cell_and_refused_from_outside(
        fresh: Host) -> None:
    # The edit flips a failing receipt to exit 0 in both the projection and the event, and
    # recomputes the event's hash so that the chain alone still looks intact.
    obs = fresh.execute("host.bash('python -m pytest -q tests -k nothing_matches')")
    code = f"""
import sqlite3, os, json, hashlib
from host_kernel.store.ledger import canonical_json, event_hash
db = sqlite3.connect({str(fresh.record_dir / 'ledger.sqlite')!r})
db.execute("UPDATE receipts SET exit_status = 0 WHERE cell_id = '{obs.cell_id}'")
rows = db.execute("SELECT seq, session, ts, kind, body, prev FROM events ORDER BY seq").fetchall()
prev = None
for seq, session, ts, kind, body, old_prev in rows:
    if prev is not None:
        old_prev = prev
    b = json.loads(body)
    if kind == 'receipt_recorded' and b['cell_id'] == '{obs.cell_id}':
        b['exit_status'] = 0
        body = canonical_json(b)
    h = event_hash(old_prev, seq, session, ts, kind, body)
    db.execute("UPDATE events SET body = ?, prev = ?, hash = ? WHERE seq = ?", (body, old_prev, h, seq))
    prev = h
db.commit()
"""
    if fresh.confinement is not None and fresh.confinement.active:
        # Confined, the cell cannot even open the ledger...
        denied = fresh.execute(code)
        assert denied.status == "error" and "OperationalError" in denied.text
    # ...and another process of the same user that can is caught by the Host's own hashes.
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # The rewrite moved the chain's tail under the live Host: it refuses to go on.
    with pytest.raises(RecordError) as caught:
        submit(fresh)
    assert caught.value.code == "foreign_event"
    assert not audit(fresh.record_dir).clean


# -- detected vs armed -------------------------------------------------------------------------


REQUEST = "Turn the cleaning script into a reusable pipeline we can re-run on new exports."


def test_detected_mode_with_failing_declarations_is_accepted_with_advice(workdir: Path) -> None:
    with Host(workdir, request=REQUEST) as h:
        assert h.mode.name == "reusable_pipeline" and not h.mode.armed
        run_ok(h, "host.write_file('clean.py', 'def clean(x):\\n    return x\\n')")
        obs = h.execute("v = host.submit_output({'summary': 'done'}, ['wrote clean.py'], "
                        "source_files=['clean.py'], entry_points=['clean.py'])\nprint(v.explain())")
        assert obs.status == "ok", obs.text
        assert "accepted" in obs.text and "Advice (not blocking)" in obs.text
        assert "[source_not_saved]" in obs.text


def test_armed_mode_with_the_same_declarations_is_refused(workdir: Path) -> None:
    with Host(workdir, mode="reusable_pipeline") as h:
        run_ok(h, "host.write_file('clean.py', 'def clean(x):\\n    return x\\n')")
        obs = h.execute("host.submit_output({'summary': 'done'}, ['wrote clean.py'], "
                        "source_files=['clean.py'], entry_points=['clean.py'])")
        assert obs.status == "error"
        assert "[source_not_saved]" in obs.text and "[declarations_missing]" in obs.text


def test_analysis_run_needs_no_declarations(host: Host) -> None:
    obs = host.execute("print(host.submit_output({'answer': 42}, ['computed 42']).accepted)")
    assert obs.outputs[-1]["text"].strip() == "True"


def test_every_check_code_is_documented() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "verification.md").read_text()
    missing = [code for code in CHECKS if f"`{code}`" not in doc]
    assert not missing, f"codes missing from docs/verification.md: {missing}"


# -- output_schema cannot hold the Host -----------------------------------------------------
#
# A pattern that backtracks in Python's re holds the GIL, which would freeze this very test
# process (the Host runs in it) past any thread or timeout: so these checks run in a child
# process, and a regression fails on the child's timeout instead of hanging the suite.


CATASTROPHIC = "^(a|aa)+$"  # backtracks without end in regex and re alike on "a" * 40 + "b"
CLASSIC = "^(a+)+$"  # the textbook case for re; regex matches it in linear time
STUCK_TEXT = "a" * 40 + "b"
CHILD_TIMEOUT = 60

_VERIFY_IN_CHILD = """
import json, sys, tempfile, time
from pathlib import Path
from host_kernel.modes import resolve_task_mode
from host_kernel.store.blobs import FileBlobStore
from host_kernel.store.ledger import SQLiteLedger
from host_kernel.verify import LiveFiles, RecordView, Submission, verify

case = json.load(sys.stdin)
root = Path(tempfile.mkdtemp(dir=case["tmp"]))
ledger = SQLiteLedger(root / "ledger.sqlite")
view = RecordView(ledger, FileBlobStore(root), "no-session")
started = time.process_time()  # work done: a loaded machine stretches wall time, not this
verdict, _ = verify(Submission(case["output"], ["x"], output_schema=case["schema"]),
                    mode=resolve_task_mode(None), view=view, files=LiveFiles(root, root / "rec"),
                    submission_id="s", submit_seq=1, submitting_cell=None)
seconds = time.process_time() - started
ledger.close()
print(json.dumps({"seconds": seconds, "failed": {c.code: c.message for c in verdict.failed}}))
"""


def _in_child(script: str, *args: str, stdin: str = "") -> str:
    """Run ``script`` in a fresh interpreter; its stdout, or a failure if it hangs or fails."""
    try:
        done = subprocess.run([sys.executable, "-c", script, *args], input=stdin,
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {CHILD_TIMEOUT} s: the check hung")
    assert done.returncode == 0, done.stderr
    return done.stdout


def _verify_schema(tmp_path: Path, output: object, schema: object) -> tuple[float, dict[str, str]]:
    """The verifier itself on an empty record, in a child: (CPU seconds it spent, {failed
    code: message})."""
    case = json.dumps({"tmp": str(tmp_path), "output": output, "schema": schema})
    result = json.loads(_in_child(_VERIFY_IN_CHILD, stdin=case).splitlines()[-1])
    return result["seconds"], result["failed"]


S2020 = "https://json-schema.org/draft/2020-12/schema"
#: Each definition refers to the next twice: 2**30 paths to the last one.
NESTED_REFS: dict[str, object] = {
    "$defs": {**{f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(30)},
              "d30": {"type": "object"}},
    "$ref": "#/$defs/d0"}


@pytest.mark.parametrize("output, schema, code, words", [
    ({"s": STUCK_TEXT}, {"properties": {"s": {"pattern": CATASTROPHIC}}}, "schema_too_costly",
     "ran past the 0.5 s"),
    ({STUCK_TEXT: 1}, {"patternProperties": {CATASTROPHIC: {}}}, "schema_too_costly",
     "ran past the 0.5 s"),
    ({STUCK_TEXT: 1}, {"additionalProperties": False, "patternProperties": {CATASTROPHIC: {}}},
     "schema_too_costly", "ran past the 0.5 s"),
    ({STUCK_TEXT: 1}, {"propertyNames": {"pattern": CATASTROPHIC}}, "schema_too_costly",
     "ran past the 0.5 s"),
    ({"s": STUCK_TEXT}, {"$schema": "http://json-schema.org/draft-04/schema#",
                         "properties": {"s": {"pattern": CATASTROPHIC}}}, "schema_too_costly",
     "ran past the 0.5 s"),
    ({"s": STUCK_TEXT}, {"$schema": S2020, "anyOf": [
        {"type": "object", "properties": {"s": {"$ref": "#"}}},
        {"type": "string", "pattern": CATASTROPHIC}]}, "schema_too_costly", "ran past the 0.5 s"),
    ({"s": STUCK_TEXT}, {"properties": {"s": {"$schema": S2020, "pattern": CATASTROPHIC}}},
     "schema_invalid", "$schema only at its top"),
    ({"s": "x"}, {"properties": {"s": {"pattern": "(a{1000}){1000}"}}}, "schema_too_costly",
     "counts of nested"),
    ({"s": "x"}, {"properties": {"s": {"pattern": "(" * 150 + ")" * 150}}}, "schema_too_costly",
     "nests groups"),
    ({"s": 1}, NESTED_REFS, "schema_too_costly", "more than"),
    ({"s": 1}, {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "schema_too_costly",
     "without end"),
    ({"k": {f"x{i}": i for i in range(2000)}},
     {"properties": {"k": {"unevaluatedProperties": False}}}, "schema_too_costly", "2,000 members"),
    ({"k": 1}, {"patternProperties": {"^k": {}}, "unevaluatedProperties": False},
     "schema_too_costly", "unevaluatedProperties together with patternProperties"),
    ({"s": "x"}, {"type": "object", "x": "y" * 70_000}, "schema_too_costly", "65,536 bytes"),
    ({"s": "x"}, {"properties": {"s": {"pattern": "("}}}, "schema_invalid", "is not a 'regex'"),
    ({"s": "x"}, {"$ref": "http://10.255.255.1/schema.json"}, "schema_invalid", "points outside"),
    ({"s": "x"}, {"$ref": "#/$defs/nowhere"}, "schema_invalid", "cannot resolve"),
    ({"s": "x"}, {"$defs": {"m": {"$id": "http://json-schema.org/draft-04/schema"}}},
     "schema_invalid", "json-schema.org"),
    ({"s": "x"}, ["not", "a", "schema"], "schema_invalid", "not list"),
    ({"s": "x"}, {"$schema": 4}, "schema_invalid", "must be a string"),
    ({"s": STUCK_TEXT}, {"properties": {"s": {"pattern": CLASSIC}}}, "output_schema",
     "does not match '^(a+)+$'"),
    ({"l": [{"a": 1}, {"a": 1.0}]}, {"properties": {"l": {"uniqueItems": True}}},
     "output_schema", "non-unique"),
])
def test_output_schema_is_checked_within_bounds(tmp_path: Path, output: object, schema: object,
                                                code: str, words: str) -> None:
    seconds, failed = _verify_schema(tmp_path, output, schema)
    assert seconds < 2.0
    assert code in failed, failed
    assert words in failed[code]
    assert len(failed) == 1, failed


@pytest.mark.parametrize("output, schema", [
    ({"l": [{"a": i} for i in range(60_000)]}, {"properties": {"l": {"uniqueItems": True}}}),
    ({"l": [True, 1, "1"]}, {"properties": {"l": {"uniqueItems": True}}}),
    ({"name": "Ada", "n": 3}, {"$schema": "http://json-schema.org/draft-07/schema#",
                               "type": "object", "required": ["name"],
                               "definitions": {"count": {"type": "integer", "minimum": 0}},
                               "properties": {"name": {"type": "string", "pattern": r"^\p{Lu}"},
                                              "n": {"$ref": "#/definitions/count"}},
                               "additionalProperties": False}),
    ({"k": 1, "x": 2}, {"properties": {"k": {}}, "unevaluatedProperties": {"type": "integer"}}),
])
def test_honest_schemas_still_pass(tmp_path: Path, output: object, schema: object) -> None:
    seconds, failed = _verify_schema(tmp_path, output, schema)
    assert failed == {} and seconds < 2.0


_CELLS_IN_CHILD = """
import sys
from host_kernel import Host

code = ("import time\\nfrom host_kernel import SubmissionRefused\\nt0 = time.perf_counter()\\n"
        "try:\\n    host.submit_output({{'s': {text!r}}}, ['checked s'], "
        "output_schema={{'properties': {{'s': {{'pattern': {pattern!r}}}}}}})\\n"
        "except SubmissionRefused as e:\\n    print([c.code for c in e.verdict.failed])\\n"
        "print('SECONDS', time.perf_counter() - t0)")
with Host(sys.argv[1], record_dir=sys.argv[2]) as host:
    for pattern in sys.argv[3:]:
        obs = host.execute(code.format(text="a" * 40 + "b", pattern=pattern), timeout=30)
        print("CELL", obs.status, obs.text.replace("\\n", " "))
    print("NEXT", host.execute("print(6 * 7)", timeout=30).text.replace("\\n", " "))
"""


def test_a_catastrophic_pattern_in_a_cell_is_refused_promptly(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    out = _in_child(_CELLS_IN_CHILD, str(tmp_path / "ws"), str(tmp_path / "rec"), CATASTROPHIC,
                    CLASSIC)
    cells = [line for line in out.splitlines() if line.startswith("CELL")]
    assert len(cells) == 2, out
    for line, expect in zip(cells, ("['schema_too_costly']", "['output_schema']")):
        assert line.startswith("CELL ok") and expect in line, line
        # Promptly: the pattern would run for hours; the bound leaves room for a loaded
        # machine (2.2 s was seen with CI and three test runs on two cores).
        assert float(line.rsplit("SECONDS", 1)[1]) < 10.0, line
    assert "42" in out.split("NEXT", 1)[1]
