"""The judge's tests in ``codebase_change``, through real cells: a baseline no recorded
session could have written, and the baseline's own tests, at their baseline bytes, run
against the change.

- ``baseline_untrusted``: the workspace's git HEAD moved since the first session of the
  record and an earlier session wrote under ``.git`` (a commit through ``host.bash``, a
  process left running after its last cell, a hook): the baseline is refused, and the way
  out is a revision the user names from outside (``Host(baseline=REV)``, ``--baseline``).
- ``regression``: a baseline test that passed on the baseline fails on the changed tree,
  whatever the agent did to its copy of it (left it out, edited it, edited the fixtures it
  uses, broke its imports), unless ``intended_changes`` names it with a reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from _helpers import bash_exit_cell, run_ok, wait_for

from host_kernel import Host
from host_kernel._errors import BadArguments, HostKernelError
from host_kernel.audit import audit
from host_kernel.host._baseline import EARLY_SLACK, LATE_WRITES

MODULES = 5
CMD = "python -m pytest -q tests"
GIT = "git -c user.name=a -c user.email=a@example.com"
#: A conftest that makes every test pass without running it.
FORCE_PASS = "import _pytest.python as p\np.Function.runtest = lambda self: None\n"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t",
                           "-c", "init.defaultBranch=main", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small codebase in git: pkg/modNN.value() returns NN, tests use a conftest fixture."""
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "tests").mkdir()
    (ws / "pkg" / "__init__.py").write_text("")
    for i in range(MODULES):
        (ws / "pkg" / f"mod{i:02d}.py").write_text(f"def value():\n    return {i}\n")
        (ws / "tests" / f"test_mod{i:02d}.py").write_text(
            f"from pkg.mod{i:02d} import value\n\n\ndef test_value(base):\n"
            f"    assert value() == base + {i}\n")
    (ws / "tests" / "conftest.py").write_text(
        "import pytest\n\n\n@pytest.fixture\ndef base():\n    return 0\n")
    _git(ws, "init", "-q")
    _git(ws, "add", "-A")
    _git(ws, "commit", "-q", "-m", "baseline")
    # A change stamped up to EARLY_SLACK before a session's start counts as the session's
    # (file systems stamp with a coarse clock), and a Host records its start about 15 ms
    # after it is made: let the commit's stamps fall clearly before the first session.
    time.sleep(EARLY_SLACK * 5)
    return ws


def put(host: Host, files: dict[str, str], save: bool = True) -> None:
    lines = []
    for path, content in files.items():
        lines.append(f"host.write_file({path!r}, {content!r})")
        if save:
            lines.append(f"host.save_artifact({path!r})")
    run_ok(host, "\n".join(lines))


def bash(host: Host, command: str) -> str:
    """Run ``command`` through host.bash in a cell of its own; it must exit 0."""
    obs = host.execute(bash_exit_cell(command, "_r"), timeout=120)
    assert "EXIT 0" in obs.text, obs.text
    return obs.cell_id


def submit(host: Host, declared: list[str], cell: str, command: str = CMD,
           **extra: Any) -> dict[str, Any]:
    more = "".join(f", {k}={v!r}" for k, v in extra.items())
    code = ("from host_kernel import SubmissionRefused\n"
            "try:\n"
            f"    v = host.submit_output({{'summary': 'changed'}}, ['changed the modules'], "
            f"task_status='completed', source_files={declared!r}, "
            f"entry_points=[{declared[0]!r}], architecture_summary='pkg modules each own one "
            f"value and tests check each.', test_evidence=[{{'command': {command!r}, "
            f"'producing_cell_id': {cell!r}}}]{more})\n"
            "except SubmissionRefused as e:\n    v = e.verdict\n"
            "print('VERDICT', __import__('json').dumps(v.to_dict()))")
    obs = host.execute(code, timeout=300)
    line = next(line for o in obs.outputs for line in o.get("text", "").splitlines()
                if line.startswith("VERDICT "))
    verdict: dict[str, Any] = json.loads(line[len("VERDICT "):])
    verdict["failed"] = {c["code"]: c["message"] for c in verdict["checks"] if not c["ok"]}
    return verdict


def after_session(repo: Path) -> None:
    """Wait until the record's last session ended more than LATE_WRITES seconds ago."""
    from host_kernel._paths import default_record_dir
    from host_kernel.store.ledger import SQLiteLedger

    with SQLiteLedger.open_readonly(default_record_dir(repo) / "ledger.sqlite") as ledger:
        ended = ledger.query("SELECT MAX(ts) AS ts FROM events WHERE kind = 'session_ended'")
    wait_for(lambda: time.time() > float(ended[0]["ts"]) + LATE_WRITES, 30,
             "the end of the session's late-write window")


def baseline_of(host: Host) -> dict[str, Any]:
    rows = host.ledger.query("SELECT body FROM events WHERE session = ? AND "
                             "kind = 'baseline_recorded'", (host.session_id,))
    body: dict[str, Any] = json.loads(rows[-1]["body"])
    return body


def honest_change(host: Host) -> dict[str, Any]:
    """Change one module without changing what it returns; every baseline test holds."""
    put(host, {"pkg/mod03.py": "def value():\n    return 1 + 2\n"})
    return submit(host, ["pkg/mod03.py"], bash(host, CMD))


def broken_change(host: Host) -> dict[str, Any]:
    """A broken module, declared; the agent's run passes only through the workspace's
    force-pass conftest."""
    put(host, {"pkg/mod03.py": "def value():\n    return -1\n"})
    return submit(host, ["pkg/mod03.py"], bash(host, CMD))


# -- a baseline no session could have written --------------------------------------------------


def test_a_force_pass_conftest_an_earlier_session_committed_makes_the_baseline_untrusted(
        repo: Path) -> None:
    with Host(repo) as plain:
        put(plain, {"conftest.py": FORCE_PASS}, save=False)
        bash(plain, f"git add conftest.py && {GIT} commit -qm 'speed up the tests'")
    with Host(repo, mode="codebase_change") as h:
        v = broken_change(h)
        assert not v["accepted"], "a baseline an earlier session committed was trusted"
        assert "baseline_untrusted" in v["failed"], v["failed"]
        assert "baseline=" in v["failed"]["baseline_untrusted"]
        assert v["reproduction"] == []
        assert baseline_of(h)["trusted"] is False
    # The user names the revision they reviewed: the conftest is not in it.
    with Host(repo, mode="codebase_change", baseline="HEAD~1") as h:
        assert baseline_of(h)["chosen_by"] == "user"
        v = broken_change(h)
        assert "reproduction_failed" in v["failed"], v["failed"]


def test_a_commit_made_after_the_last_cell_by_a_process_it_left_running_is_found(
        repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    with Host(repo) as plain:
        put(plain, {"conftest.py": FORCE_PASS}, save=False)
        # Nothing of this runs while a cell runs: no cell's trace holds it.
        run_ok(plain, "import subprocess\nsubprocess.Popen(['bash', '-c', 'sleep 0.3; git add "
                      f"conftest.py && {GIT} commit -qm later'])")
        wait_for(lambda: _git(repo, "rev-parse", "HEAD") != head, 30, "the late commit")
    with Host(repo, mode="codebase_change") as h:
        v = broken_change(h)
        assert "baseline_untrusted" in v["failed"], v["failed"]
        # No cell's trace holds the commit: the repository's change times do.
        assert "while an earlier session ran" in v["failed"]["baseline_untrusted"]


def test_a_hook_an_earlier_session_planted_taints_the_users_own_later_commit(
        repo: Path) -> None:
    hook = "#!/bin/sh\nexit 0\n"
    with Host(repo) as plain:
        put(plain, {".git/hooks/post-commit": hook}, save=False)
    (repo / "NOTES.md").write_text("the user's own change\n")
    _git(repo, "add", "NOTES.md")
    _git(repo, "commit", "-q", "-m", "notes")
    with Host(repo, mode="codebase_change") as h:
        v = honest_change(h)
        assert "baseline_untrusted" in v["failed"], v["failed"]
        assert ".git/hooks/post-commit" in v["failed"]["baseline_untrusted"]


def test_in_a_plain_folder_the_first_sessions_tree_is_the_baseline_not_what_sessions_left(
        repo: Path) -> None:
    import shutil

    shutil.rmtree(repo / ".git")
    with Host(repo, mode="codebase_change") as first:
        assert baseline_of(first)["chosen_by"] == "first_session"
        put(first, {"conftest.py": FORCE_PASS}, save=False)  # left behind, never declared
    with Host(repo, mode="codebase_change") as h:
        body = baseline_of(h)
        assert (body["kind"], body["chosen_by"]) == ("files", "first_session"), body
        v = broken_change(h)
        assert "reproduction_failed" in v["failed"], v["failed"]  # the conftest is not in it
        assert honest_change(h)["accepted"]


def test_git_status_in_an_earlier_session_leaves_an_unmoved_head_trusted(repo: Path) -> None:
    with Host(repo) as plain:
        bash(plain, "git status --short && git log --oneline")
    with Host(repo, mode="codebase_change") as h:
        assert baseline_of(h).get("chosen_by") == "first_session", baseline_of(h)
        v = honest_change(h)
        assert v["accepted"], v["failed"]


def test_the_users_commit_between_untouched_sessions_is_trusted_and_a_named_head_too(
        repo: Path) -> None:
    with Host(repo) as plain:
        run_ok(plain, "print(open('pkg/mod01.py').read())")
    # The user commits once the session is over: after the seconds a session's processes
    # are given to be killed in (a commit within them could be the session's own).
    after_session(repo)
    (repo / "NOTES.md").write_text("the user's own change\n")
    _git(repo, "add", "NOTES.md")
    _git(repo, "commit", "-q", "-m", "notes")
    with Host(repo, mode="codebase_change") as h:
        assert baseline_of(h).get("chosen_by") == "untouched", baseline_of(h).get("untrusted")
        assert honest_change(h)["accepted"]
        bash(h, f"git add -A && {GIT} commit -qm 'mod03 as a sum'")
    with Host(repo, mode="codebase_change") as h:
        v = honest_change(h)  # HEAD moved by a session's commit: not trusted
        assert "baseline_untrusted" in v["failed"], v["failed"]
    # The user reviewed the session's commit and names it from outside.
    with Host(repo, mode="codebase_change", baseline="HEAD") as h:
        body = baseline_of(h)
        assert (body["chosen_by"], body["revision"]) == ("user", "HEAD")
        assert body["commit"] == _git(repo, "rev-parse", "HEAD")
        v = honest_change(h)
        assert v["accepted"], v["failed"]


def test_a_baseline_is_named_through_host_kernel_exec(repo: Path, tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('hello')")]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    record = tmp_path / "record"
    done = subprocess.run([sys.executable, "-m", "host_kernel", "exec", str(path), "--workdir",
                           str(repo), "--record", str(record), "--mode", "codebase_change",
                           "--baseline", "HEAD"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    from host_kernel.store.ledger import SQLiteLedger

    with SQLiteLedger.open_readonly(record / "ledger.sqlite") as ledger:
        rows = ledger.query("SELECT body FROM events WHERE kind = 'baseline_recorded'")
    body = json.loads(rows[0]["body"])
    assert (body["chosen_by"], body["commit"]) == ("user", _git(repo, "rev-parse", "HEAD"))
    bad = subprocess.run([sys.executable, "-m", "host_kernel", "exec", str(path), "--workdir",
                          str(repo), "--record", str(record), "--mode", "codebase_change",
                          "--baseline", "no-such-rev"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 1 and "no-such-rev" in bad.stderr, bad.stdout + bad.stderr


def test_a_baseline_that_is_no_revision_is_refused_before_any_kernel_starts(
        repo: Path) -> None:
    with pytest.raises(BadArguments):
        Host(repo, mode="codebase_change", baseline="")
    with pytest.raises(BadArguments):
        Host(repo, mode="codebase_change", baseline="--output=/tmp/x")
    with pytest.raises(BadArguments):
        Host(repo, mode="codebase_change", baseline="HEAD", resume="some-session")
    host = Host(repo, mode="codebase_change", baseline="no-such-rev")
    with pytest.raises(HostKernelError, match="no-such-rev"):
        host.start()
    assert host.generation == 0
    plain = Host(repo, baseline="HEAD")  # a baseline judges a codebase_change only
    with pytest.raises(BadArguments, match="codebase_change"):
        plain.start()
    assert plain.generation == 0
    run = subprocess.run([sys.executable, "-m", "host_kernel", "run", "a task", "--workdir",
                          str(repo), "--base-url", "http://127.0.0.1:9", "--model", "m",
                          "--baseline", "HEAD"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--mode codebase_change" in run.stderr, run.stderr


# -- the baseline's own tests judge ------------------------------------------------------------


@pytest.fixture
def session(repo: Path) -> Iterator[Host]:
    with Host(repo, mode="codebase_change") as h:
        yield h


NEW_TEST = "from pkg.mod02 import value\n\n\ndef test_new():\n    assert value() == 20\n"
MOD02 = "def value():\n    return 20\n"


def test_a_change_that_breaks_a_baseline_test_and_cites_only_its_new_test_is_a_regression(
        session: Host) -> None:
    put(session, {"pkg/mod02.py": MOD02, "tests/test_new.py": NEW_TEST})
    cell = bash(session, "python -m pytest -q tests/test_new.py")
    v = submit(session, ["pkg/mod02.py", "tests/test_new.py"], cell,
               command="python -m pytest -q tests/test_new.py")
    assert not v["accepted"], "a broken baseline test was left out of the judgement"
    assert "tests/test_mod02.py::test_value" in v["failed"]["regression"], v["failed"]
    roles = [s.get("role") for s in v["reproduction"]]
    assert roles == [None, "baseline_tests", "regression"], roles


def test_editing_the_broken_baseline_test_to_pass_is_still_a_regression(
        session: Host) -> None:
    edited = "from pkg.mod02 import value\n\n\ndef test_value(base):\n    assert value() == 20\n"
    put(session, {"pkg/mod02.py": MOD02, "tests/test_mod02.py": edited})
    v = submit(session, ["pkg/mod02.py", "tests/test_mod02.py"], bash(session, CMD))
    assert not v["accepted"]
    assert "tests/test_mod02.py::test_value" in v["failed"]["regression"], v["failed"]
    section = v["reproduction"][-1]
    assert "-    assert value() == base + 2" in section["test_edits"]
    assert "+    assert value() == 20" in section["test_edits"]


def test_editing_the_fixture_a_baseline_test_uses_is_still_a_regression(
        session: Host) -> None:
    conftest = ("import pytest\n\n\n@pytest.fixture\ndef base(request):\n"
                "    return 18 if 'mod02' in request.node.nodeid else 0\n")
    put(session, {"pkg/mod02.py": MOD02, "tests/conftest.py": conftest})
    v = submit(session, ["pkg/mod02.py", "tests/conftest.py"], bash(session, CMD))
    assert not v["accepted"]
    assert "tests/test_mod02.py::test_value" in v["failed"]["regression"], v["failed"]
    assert "tests/conftest.py" in v["reproduction"][-1]["test_edits"]


def test_breaking_a_baseline_tests_imports_is_a_regression(session: Host) -> None:
    put(session, {"pkg/mod04.py": "def amount():\n    return 4\n",
                  "tests/test_new.py": "from pkg.mod04 import amount\n\n\n"
                                       "def test_new():\n    assert amount() == 4\n"})
    cell = bash(session, "python -m pytest -q tests/test_new.py")
    v = submit(session, ["pkg/mod04.py", "tests/test_new.py"], cell,
               command="python -m pytest -q tests/test_new.py")
    assert not v["accepted"]
    # The baseline's test file no longer imports: named as its collection error.
    assert "tests/test_mod04.py" in v["failed"]["regression"], v["failed"]


def test_an_honest_change_with_baseline_tests_and_fixtures_is_accepted_and_audits(
        session: Host) -> None:
    v = honest_change(session)
    assert v["accepted"], v["failed"]
    roles = [s.get("role") for s in v["reproduction"]]
    assert roles == [None, "baseline_tests", "regression"], roles
    assert v["reproduction"][-1]["counts"]["passed"] == MODULES
    record = session.record_dir
    session.close()
    report = audit(record, reproduce=True)
    assert report.clean, [str(f) for f in report.findings]
    assert report.reproduced == 3


def test_an_intended_behaviour_change_declared_with_a_reason_is_accepted_and_shown_first(
        session: Host) -> None:
    edited = "from pkg.mod02 import value\n\n\ndef test_value(base):\n    assert value() == 20\n"
    put(session, {"pkg/mod02.py": MOD02, "tests/test_mod02.py": edited})
    cell = bash(session, CMD)
    intended = [{"test": "tests/test_mod02.py::test_value",
                 "reason": "mod02's value is now 20, as the issue asks"}]
    v = submit(session, ["pkg/mod02.py", "tests/test_mod02.py"], cell,
               intended_changes=intended)
    assert v["accepted"], v["failed"]
    first = v["checks"][0]
    assert first["code"] == "intended_changes" and first["ok"], first
    assert "mod02's value is now 20" in first["message"]
    assert "tests/test_mod02.py::test_value" in first["message"]
    # Without a reason it is no declaration.
    bare = submit(session, ["pkg/mod02.py", "tests/test_mod02.py"], cell,
                  intended_changes=[{"test": "tests/test_mod02.py"}])
    assert "intended_changes" in bare["failed"], bare["failed"]
