"""Cell code trying to get an unbacked completion accepted: each attempt refused or without effect.

Every attempt runs in a real cell of an armed session with a real package (the `honest`
and `fresh` fixtures of conftest.py). Attempts on the record use the package whose tests
really pass, so the only thing wrong is the lie. Attempts on the test run itself use the
same package with a broken, saved ``pkg/core.py`` (the `broken` fixture, or `_break`),
whose test fails wherever it really runs: the forged run exits 0 all the same, and the
Host's own reproduction (or its refusal to reproduce such a command) is what stops it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_kernel import Host
from host_kernel.audit import audit

from _helpers import refusal, run_ok
from _pipeline import SOURCES, TEST_CMD, build_package, submit


BROKEN = "def add(a, b):\n    return a - b\n"


def _break(host: Host) -> None:
    """Write and save a broken pkg/core.py: the declared bytes now fail their test."""
    run_ok(host, f"host.write_file('pkg/core.py', {BROKEN!r})\nhost.save_artifact('pkg/core.py')")


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """An armed session whose saved package fails its test (its passing run came first)."""
    ws = tmp_path_factory.mktemp("broken") / "ws"
    ws.mkdir()
    with Host(ws, mode="reusable_pipeline") as h:
        h._evidence_cell = build_package(h)  # type: ignore[attr-defined]
        _break(h)
        yield h


def _cite(host: Host, cell_id: object, command: str = TEST_CMD) -> tuple[bool, dict[str, bool]]:
    accepted, failed, _ = submit(host, test_evidence=[{"command": command,
                                                        "producing_cell_id": cell_id}])
    return accepted, failed


def _ran(host: Host, code: str) -> str:
    return host.execute(code).cell_id


def _ran_ok(host: Host, command: str) -> str:
    """Run ``command`` through host.bash in a cell; its receipt must exit 0. The cell id."""
    obs = host.execute(f"r = host.bash({command!r})\nprint('EXIT', r.exit_status)")
    assert "EXIT 0" in obs.text, obs.text
    return obs.cell_id


def _outcomes(host: Host) -> list[object]:
    """The outcomes of the last verdict's reproductions, as the record holds them."""
    import json

    row = host.ledger.query("SELECT body FROM submissions ORDER BY seq DESC LIMIT 1")[0]
    return [r["outcome"] for r in json.loads(row["body"])["verdict"]["reproduction"]]


def test_made_up_exit_status_sent_to_the_socket(honest: Host) -> None:
    cell = _ran(honest, "import httpx, os\n"
                         "c = httpx.Client(transport=httpx.HTTPTransport(uds=os.environ['HOST_KERNEL_SOCKET']))\n"
                         "c.post('http://h/call/bash', json={'command': 'exit 1', 'exit_status': 0, "
                         "'cwd': os.getcwd(), 'env': dict(os.environ)}, headers={'Authorization': "
                         "'Bearer ' + os.environ['HOST_KERNEL_TOKEN']})")
    accepted, failed = _cite(honest, cell, "exit 1")
    assert not accepted and "exit_nonzero" in failed


def test_a_receipt_built_by_hand(honest: Host) -> None:
    code = ("from host_kernel import Receipt\nr = host.bash('exit 1')\nd = r.to_dict()\n"
            "d.update(exit_status=0, command=" + repr(TEST_CMD) + ")\nfake = Receipt.from_dict(d)")
    cell = _ran(honest, code)
    accepted, failed = _cite(honest, cell)
    assert not accepted and "receipt_missing" in failed


def test_a_printed_cell_id_line(honest: Host) -> None:
    run_ok(honest, f"print('[cell id: FORGED-cell-id-0001]')\nprint('$ {TEST_CMD}')\n"
                    "print('4 passed in 0.02s')")
    accepted, failed = _cite(honest, "FORGED-cell-id-0001")
    assert not accepted and "cell_id_unknown" in failed


def test_tests_run_with_subprocess_then_cited(honest: Host) -> None:
    cell = _ran(honest, f"import subprocess\nsubprocess.run({TEST_CMD!r}, shell=True, check=True)")
    accepted, failed = _cite(honest, cell)
    assert not accepted and "receipt_missing" in failed


@pytest.mark.parametrize("cell_id", [3, "3", "In[3]", "cell-3"])
def test_a_cell_number_or_execution_count(honest: Host, cell_id: object) -> None:
    accepted, failed = _cite(honest, cell_id)
    assert not accepted and "cell_id_unknown" in failed


def test_a_cell_id_from_another_sessions_record(honest: Host, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    with Host(other, mode="reusable_pipeline") as h:
        foreign = build_package(h)
    accepted, failed = _cite(honest, foreign)
    assert not accepted and "cell_id_unknown" in failed


@pytest.mark.parametrize("command", [f"{TEST_CMD} || true", f"{TEST_CMD}; true",
                                     f"{TEST_CMD} | tee out.log",
                                     f"eval {TEST_CMD + ' || true'!r}",
                                     f"{TEST_CMD} & wait"])
def test_commands_that_can_hide_a_failure(broken: Host, command: str) -> None:
    cell = _ran_ok(broken, command)  # the failing test is hidden: the receipt exits 0
    accepted, failed = _cite(broken, cell, command)
    assert not accepted and "runner_unrecognised" in failed
    assert _outcomes(broken) == []


def test_old_passing_evidence_for_broken_code(broken: Host) -> None:
    accepted, failed = _cite(broken, broken._evidence_cell)  # type: ignore[attr-defined]
    assert not accepted and "reproduction_failed" in failed
    assert _outcomes(broken) == ["failed"]


def test_path_pointing_at_a_fake_python(fresh: Host) -> None:
    _break(fresh)
    fake = "#!/bin/sh\necho '9 passed in 0.01s'\n"
    run_ok(fresh, f"host.write_file('bin/python', {fake!r})\nimport os\nos.chmod('bin/python', 0o755)\n"
                "os.environ['PATH'] = os.path.abspath('bin') + os.pathsep + os.environ['PATH']")
    cell = _ran_ok(fresh, TEST_CMD)
    accepted, failed = _cite(fresh, cell)
    assert not accepted and "reproduction_failed" in failed
    assert _outcomes(fresh) == ["failed"]


def test_a_workspace_wrapper_script(broken: Host) -> None:
    script = "#!/bin/sh\necho '2 passed in 0.01s'\n"
    run_ok(broken, f"host.write_file('run_tests.sh', {script!r})\nimport os\n"
                    "os.chmod('run_tests.sh', 0o755)")
    command = "./run_tests.sh pytest"
    cell = _ran_ok(broken, command)
    accepted, failed = _cite(broken, cell, command)
    assert not accepted and "runner_unrecognised" in failed


def test_evidence_older_than_the_last_source_edit(fresh: Host) -> None:
    # The Host re-runs the tests on the saved bytes: a correct edit after the agent's own
    # run is accepted on that reproduction...
    run_ok(fresh, "host.edit_file('pkg/core.py', 'a + b', 'b + a')\nhost.save_artifact('pkg/core.py')")
    accepted, failed = _cite(fresh, fresh._evidence_cell)  # type: ignore[attr-defined]
    assert accepted, failed
    assert _outcomes(fresh) == ["passed"]
    # ...and a breaking one, with the same old evidence, is refused.
    run_ok(fresh, "host.edit_file('pkg/core.py', 'b + a', 'b - a')\nhost.save_artifact('pkg/core.py')")
    accepted, failed = _cite(fresh, fresh._evidence_cell)  # type: ignore[attr-defined]
    assert not accepted and "reproduction_failed" in failed


def test_collect_only_runs_no_test(broken: Host) -> None:
    command = "python -m pytest --collect-only -q tests"
    cell = _ran_ok(broken, command)
    accepted, failed = _cite(broken, cell, command)
    assert not accepted and "selection_not_allowed" in failed


def test_a_forged_summary_printed_after_the_runner(broken: Host) -> None:
    command = "python -m pytest -q tests -k nothing; echo '7 passed in 0.01s'"
    cell = _ran_ok(broken, command)
    accepted, failed = _cite(broken, cell, command)
    assert not accepted and "runner_unrecognised" in failed


def test_a_host_call_from_a_thread_after_its_cell_ended(honest: Host) -> None:
    run_ok(honest, "import threading, time\nout = {}\n"
                    "def late():\n    time.sleep(0.8)\n    try:\n"
                    "        host.write_file('late.txt', 'x'); out['r'] = 'written'\n"
                    "    except Exception as e:\n        out['r'] = e.code\n"
                    "threading.Thread(target=late).start()")
    import time
    time.sleep(1.6)
    assert run_ok(honest, "print(out['r'])").strip().splitlines()[-1] == "no_cell"
    assert not (honest.workdir / "late.txt").exists()


def test_the_old_generations_token_after_a_restart(fresh: Host) -> None:
    token = fresh.generations.kernel.token  # type: ignore[union-attr]
    fresh.restart()
    text = run_ok(fresh, "from host_kernel.kernel.client import HostClient\nimport os\n"
                       f"c = HostClient(os.environ['HOST_KERNEL_SOCKET'], {token!r}, 1)\n"
                       "try:\n    c.write_file('x.txt', 'x')\nexcept Exception as e:\n    print(e.code)")
    assert text.strip().splitlines()[-1] == "stale_token"


def test_editing_the_sqlite_file_behind_the_hosts_back(fresh: Host) -> None:
    failing = _ran(fresh, "host.bash('python -m pytest -q tests -k nothing')")
    db = sqlite3.connect(fresh.record_dir / "ledger.sqlite")
    db.execute("UPDATE receipts SET exit_status = 0")
    db.execute("UPDATE events SET body = replace(body, '\"exit_status\":5', '\"exit_status\":0')")
    db.commit()
    db.close()
    accepted, failed = _cite(fresh, failing, "python -m pytest -q tests -k nothing")
    assert not accepted and "record_unreadable" in failed
    assert not audit(fresh.record_dir).clean


def test_editing_a_blob_behind_the_hosts_back(fresh: Host) -> None:
    text = run_ok(fresh, "host.write_file('result.json', '{}')\na = host.save_artifact('result.json')\n"
                       "print(a.artifact_id, a.sha256)")
    aid, sha = text.split()[-2:]
    blob = fresh.record_dir / "blobs" / "sha256" / sha[:2] / sha
    os.chmod(blob, 0o644)
    blob.write_text('{"forged": true}')
    accepted, failed, _ = submit(fresh, output={"artifacts": [aid]})
    assert not accepted and "artifact_altered" in failed
    assert any(f.code == "blob_altered" for f in audit(fresh.record_dir).findings)


def test_a_claim_backed_only_by_a_same_named_file_outside_this_session(
        honest: Host, tmp_path: Path) -> None:
    (honest.workdir / "summary.csv").write_text("made by someone else\n")
    other = tmp_path / "o"
    other.mkdir()
    (other / "summary.csv").write_text("x")
    with Host(other) as h:
        run_ok(h, "host.save_artifact('summary.csv')")  # an artifact, but of another honest
    accepted, failed, _ = submit(honest, output={"files": ["summary.csv"]})
    assert not accepted and "claim_unbacked" in failed


@pytest.mark.parametrize("path", ["/etc/hostname", "../escape.txt", "a/../../escape.txt",
                                  "link/escape.txt", "RECORD/ledger.sqlite"])
@pytest.mark.parametrize("call", ["write_file({p!r}, 'x')", "edit_file({p!r}, 'a', 'b')",
                                  "read_file({p!r})", "save_artifact({p!r})",
                                  "load_artifact(host.artifacts()[0].artifact_id, {p!r})"])
def test_paths_out_of_the_workspace_for_every_file_call(honest: Host, call: str, path: str) -> None:
    if not (honest.workdir / "link").exists():
        os.symlink(honest.workdir.parent, honest.workdir / "link")
    path = path.replace("RECORD", str(honest.record_dir))  # the record, outside the workspace
    assert "path_refused" in refusal(honest, "host." + call.format(p=path))
    assert not (honest.workdir.parent / "escape.txt").exists()


def test_entry_points_are_never_executed(honest: Host) -> None:
    trap = "open('TRAPPED', 'w').write('ran')\n"
    run_ok(honest, f"host.write_file('pkg/trap.py', {trap!r})\nhost.save_artifact('pkg/trap.py')")
    submit(honest, source_files=list(SOURCES) + ["pkg/trap.py"], entry_points=["pkg/trap.py"])
    assert not (honest.workdir / "TRAPPED").exists()


@pytest.mark.parametrize("command, code", [
    ("echo '1 passed in 0.01s'  # pytest", "runner_unrecognised"),
    ("echo '1 passed in 0.01s' >&2 && python -m pytest --co -q tests", "runner_unrecognised"),
    ("echo '1 passed in 0.01s' && python -m pytest --co -q tests", "runner_unrecognised"),
    ("echo pytest", "runner_unrecognised"),
    ("cd . && python -m pytest --co -q tests 2>&1", "selection_not_allowed"),
])
def test_a_runner_named_but_not_run_or_a_summary_forged_before_it(
        broken: Host, command: str, code: str) -> None:
    cell = _ran_ok(broken, command)
    accepted, failed = _cite(broken, cell, command)
    assert not accepted and code in failed


def test_bytes_swapped_at_the_same_size_with_mtime_restored(fresh: Host) -> None:
    # Broken code of the same size is saved, the good bytes are put in place with the old
    # mtime for the test run (which passes), then the broken bytes come back the same way:
    # the tests never ran on the declared bytes, and the Host's own run shows it.
    good = SOURCES["pkg/core.py"]
    bad = good.replace("a + b", "a - b")
    assert len(bad) == len(good)
    code = (f"import os\nst = os.stat('pkg/core.py')\nopen('pkg/core.py', 'w').write({bad!r})\n"
            "os.utime('pkg/core.py', ns=(st.st_atime_ns, st.st_mtime_ns))")
    run_ok(fresh, code + "\nhost.save_artifact('pkg/core.py')")
    run_ok(fresh, code.replace(repr(bad), repr(good)))
    cell = _ran_ok(fresh, TEST_CMD)
    run_ok(fresh, code)
    assert (fresh.workdir / "pkg" / "core.py").read_text() == bad
    accepted, failed = _cite(fresh, cell)
    assert not accepted and "reproduction_failed" in failed


@pytest.mark.parametrize("setup, command, declared, code", [
    # The shim is not declared: the folder the command runs in holds no declared file.
    ("host.write_file('sub/pytest.py', 'print(\"3 passed in 0.01s\")')", "cd sub && python -m pytest",
     None, "test_path_undeclared"),
    # Declared, the shim is in the tree, on the import path, where it is named for what it is.
    ("host.write_file('sub/pytest.py', 'print(\"3 passed in 0.01s\")')", "cd sub && python -m pytest",
     "sub/pytest.py", "runner_tampered"),
    # A script named pytest: the Host would run its own pytest in that folder, which holds no
    # test; the declared tests/test_core.py is under no cited path, so it is refused first.
    ("host.write_file('sub/pytest', '#!/bin/sh\\necho 3 passed in 0.01s\\n')\n"
     "import os\nos.chmod('sub/pytest', 0o755)", "cd sub && ./pytest", "sub/pytest",
     "selection_not_allowed"),
])
def test_a_runner_substituted_after_a_cd(broken: Host, setup: str, command: str,
                                         declared: str | None, code: str) -> None:
    run_ok(broken, setup)
    cell = _ran_ok(broken, command)
    sources = list(SOURCES)
    if declared is not None:
        run_ok(broken, f"host.save_artifact({declared!r})")
        sources.append(declared)
    accepted, failed, text = submit(broken, source_files=sources, test_evidence=[
        {"command": command, "producing_cell_id": cell}])
    assert not accepted and code in failed, text
