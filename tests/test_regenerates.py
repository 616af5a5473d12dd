"""Regenerated artifacts, through real cells: a ``regenerates`` command, re-run by the Host
in the judge's world on the declared files and the recorded inputs, must write each claimed
artifact's exact bytes at its path.

The honest pipeline is tests/_pipeline.py's package plus ``pkg/report.py``, which sums the
rows of a CSV file into a text file. Every attack below leaves the right bytes somewhere the
kernel can reach (the workspace, the kernel's /tmp, the record's blob store, a saved copy)
and is refused; the honest variant is accepted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import run_ok
from _pipeline import SOURCES, SUMMARY, TEST_CMD, build_package

from host_kernel import Host
from host_kernel.audit import audit
from host_kernel.modes import MAX_REGENERATES, DeclarationError, parse_regenerates
from host_kernel.reproduce.regenerate import (
    Claimed,
    CommandRefused,
    RegenEntry,
    RegenRequest,
    _judge,
    parse_command,
    plan_regeneration,
)
from host_kernel.store.blobs import FileBlobStore

REPORT = ("import os\nimport sys\n\nfrom pkg.core import add\n\n\ndef main():\n"
          "    rows = [line.split(',') for line in open(sys.argv[1]).read().split()]\n"
          "    os.makedirs(os.path.dirname(sys.argv[2]) or '.', exist_ok=True)\n"
          "    with open(sys.argv[2], 'w') as f:\n"
          "        f.write(''.join(f'{add(int(a), int(b))}\\n' for a, b in rows))\n\n\n"
          "if __name__ == '__main__':\n    main()\n")
#: Writes the file named by its first argument as a copy of the second: how a "pipeline"
#: would hand the judge a pre-made copy of the artifact.
COPY = ("import os\nimport shutil\nimport sys\n\n"
        "os.makedirs(os.path.dirname(sys.argv[2]) or '.', exist_ok=True)\n"
        "shutil.copyfile(sys.argv[1], sys.argv[2])\n")
LINK = ("import os\nimport sys\n\n"
        "os.makedirs(os.path.dirname(sys.argv[2]) or '.', exist_ok=True)\n"
        "os.symlink(sys.argv[1], sys.argv[2])\n")
NOOP = "print('nothing to do')\n"
FAIL = "import sys\n\nsys.stderr.write('boom: the input is not there\\n')\nsys.exit(1)\n"
DATA = "1,2\n3,4\n"
SUMS = "3\n7\n"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """One armed session with the bundled package (its tests run), and the helper modules
    each test declares as it needs them, saved."""
    ws = tmp_path_factory.mktemp("regen") / "ws"
    ws.mkdir()
    with Host(ws, mode="reusable_pipeline") as h:
        h._evidence_cell = build_package(h)  # type: ignore[attr-defined]
        modules = {"pkg/report.py": REPORT, "pkg/copy.py": COPY, "pkg/link.py": LINK,
                   "pkg/noop.py": NOOP, "pkg/fail.py": FAIL}
        run_ok(h, "\n".join(f"host.write_file({p!r}, {c!r})\nhost.save_artifact({p!r})"
                            for p, c in modules.items()))
        yield h


def save(host: Host, path: str, content: str) -> str:
    """Write ``path`` through the Host, save it; its artifact id."""
    text = run_ok(host, f"host.write_file({path!r}, {content!r})\n"
                        f"print('ID', host.save_artifact({path!r}).artifact_id)")
    return next(line.split()[1] for line in text.splitlines() if line.startswith("ID "))


def bash_then_save(host: Host, command: str, path: str) -> str:
    """Run ``command`` with host.bash (exit 0), then save ``path`` in the next cell: the
    artifact's lineage is the command's traced reads."""
    text = run_ok(host, f"r = host.bash({command!r})\nprint('EXIT', r.exit_status)")
    assert "EXIT 0" in text, text
    text = run_ok(host, f"print('ID', host.save_artifact({path!r}).artifact_id)")
    return next(line.split()[1] for line in text.splitlines() if line.startswith("ID "))


class Result:
    """A verdict as the kernel received it."""

    def __init__(self, verdict: dict[str, Any], text: str) -> None:
        self.verdict = verdict
        self.text = text
        self.accepted: bool = verdict["accepted"]
        self.failed = {c["code"]: c["message"] for c in verdict["checks"] if not c["ok"]}
        self.passed = {c["code"]: c["message"] for c in verdict["checks"] if c["ok"]}
        self.regenerations = [s for s in verdict.get("reproduction") or []
                              if s.get("kind") == "regeneration"]

    def refused_with(self, code: str) -> bool:
        return not self.accepted and code in self.failed

    def __repr__(self) -> str:
        runs = [(s.get("outcome"), s.get("exit_status"), s.get("artifacts"), s.get("inputs"))
                for s in self.regenerations]
        return f"Result(accepted={self.accepted}, failed={self.failed}, regenerations={runs})"


def submit(host: Host, regenerates: Any, *declared: str, mode_sources: bool = True) -> Result:
    """Submit the package plus ``declared`` with ``regenerates``, from a new cell, through
    the call socket (the kernel client's keyword is not there yet: the Host reads the
    field from the request)."""
    sources = [*SOURCES, *declared] if mode_sources else list(declared)
    cell = host._evidence_cell  # type: ignore[attr-defined]
    code = ("import json\n"
            f"d = host._call('submit_output', output={{'summary': 'sums'}}, "
            f"completion_bullets=['wrote the report pipeline'], task_status='completed', "
            f"source_files={sources!r}, entry_points=['pkg/cli.py'], "
            f"architecture_summary={SUMMARY!r}, test_evidence=[{{'command': {TEST_CMD!r}, "
            f"'producing_cell_id': {cell!r}}}], regenerates={regenerates!r})\n"
            "print('VERDICT', json.dumps(d))")
    obs = host.execute(code, timeout=300)
    assert obs.status == "ok", obs.text
    printed = "".join(o.get("text", "") for o in obs.outputs if o.get("output_type") == "stream")
    line = next(ln for ln in printed.splitlines() if ln.startswith("VERDICT "))
    return Result(json.loads(line[len("VERDICT "):]), printed)


# -- accepted ----------------------------------------------------------------------------------


def test_the_honest_pipeline_regenerates_its_artifact_from_the_recorded_input(
        pipeline: Host) -> None:
    # data/n.csv is saved (its bytes are in the store) but not declared: the Host places it
    # in the tree as a recorded input of the artifact.
    save(pipeline, "data/n.csv", DATA)
    command = "python -m pkg.report data/n.csv out/sums.txt"
    artifact = bash_then_save(pipeline, command, "out/sums.txt")
    result = submit(pipeline, [{"command": command, "artifacts": [artifact]}], "pkg/report.py")
    assert result.accepted, result
    assert "regeneration_differs" in result.passed
    assert "wrote the exact bytes of 1 artifact" in result.passed["regeneration_differs"]
    [section] = result.regenerations
    assert section["outcome"] == "passed" and section["confined"] is True, section
    assert section["inputs"]["placed"] == ["data/n.csv"], section["inputs"]
    assert section["artifacts"][0]["got"] == sha(SUMS)
    assert "regenerating 1 artifact with 1 command" in result.text


def test_audit_re_runs_a_regeneration_and_catches_an_altered_input_blob(workdir: Path) -> None:
    with Host(workdir, mode="reusable_pipeline") as h:
        h._evidence_cell = build_package(h)  # type: ignore[attr-defined]
        save(h, "pkg/report.py", REPORT)
        save(h, "data/n.csv", DATA)
        command = "python -m pkg.report data/n.csv out/sums.txt"
        artifact = bash_then_save(h, command, "out/sums.txt")
        result = submit(h, [{"command": command, "artifacts": [artifact]}], "pkg/report.py")
        assert result.accepted, result
        record = h.record_dir
    plain = audit(record)
    assert plain.clean, [str(f) for f in plain.findings]
    again = audit(record, reproduce=True)
    assert again.clean and again.reproduced == 2, [str(f) for f in again.findings]
    # The recorded input's blob altered: the tree the record rebuilds is not the one judged.
    blob = record / "blobs" / "sha256" / sha(DATA)[:2] / sha(DATA)
    blob.chmod(0o644)
    blob.write_text("1,2\n3,5\n")
    altered = audit(record)
    unbacked = [f.message for f in altered.findings if f.code == "submission_unbacked"]
    assert unbacked and "regeneration_differs" in unbacked[0], [str(f) for f in altered.findings]


def test_commands_run_in_order_in_one_tree_and_a_later_one_reads_what_an_earlier_wrote(
        pipeline: Host) -> None:
    first = "python -m pkg.report data/o.csv out/o.txt"
    second = "python -m pkg.copy out/o.txt out/o_copy.txt"
    save(pipeline, "data/o.csv", "5,5\n")
    made = bash_then_save(pipeline, first, "out/o.txt")
    copied = bash_then_save(pipeline, second, "out/o_copy.txt")
    result = submit(pipeline, [{"command": first, "artifacts": [made]},
                               {"command": second, "artifacts": [copied]}],
                    "pkg/report.py", "pkg/copy.py")
    assert result.accepted, result
    assert [s["outcome"] for s in result.regenerations] == ["passed", "passed"]
    # out/o.txt is an input of the copy, with a claimed artifact's bytes: made, not placed
    assert "out/o.txt" in result.regenerations[0]["inputs"]["regenerated"]


# -- refused -----------------------------------------------------------------------------------


def test_an_entry_point_that_writes_other_bytes_than_the_artifact_is_refused(
        pipeline: Host) -> None:
    save(pipeline, "data/m.csv", DATA)
    # the artifact was written by hand, not by the pipeline: 3 + 4 is not 8
    artifact = save(pipeline, "out/m.txt", "3\n8\n")
    command = "python -m pkg.report data/m.csv out/m.txt"
    result = submit(pipeline, [{"command": command, "artifacts": [artifact]}],
                    "pkg/report.py", "data/m.csv")
    assert result.refused_with("regeneration_differs"), result
    message = result.failed["regeneration_differs"]
    assert artifact in message and "out/m.txt" in message
    assert sha("3\n8\n")[:16] in message and sha(SUMS)[:16] in message, message
    assert "exited 0" in message
    assert result.regenerations[0]["outcome"] == "differs"


def test_a_command_that_exits_nonzero_is_refused_with_its_status_and_stderr(
        pipeline: Host) -> None:
    artifact = save(pipeline, "out/x.txt", SUMS)
    result = submit(pipeline, [{"command": "python -m pkg.fail", "artifacts": [artifact]}],
                    "pkg/fail.py")
    assert result.refused_with("regeneration_differs"), result
    message = result.failed["regeneration_differs"]
    assert "exited 1" in message and "boom: the input is not there" in message, message


def test_a_command_the_host_cannot_run_as_written_is_refused_before_it_runs(
        pipeline: Host) -> None:
    artifact = save(pipeline, "out/y.txt", SUMS)
    cases = {
        "python -m pkg.report data/n.csv > out/y.txt": "not one plain command",
        "python -c 'open(\"out/y.txt\", \"w\").write(\"3\\n7\\n\")'": "python -c",
        "cat data/n.csv": "is not python",
        # a tool of the installation, not the pipeline's own code
        "python -m zipfile -e data.zip out": "not a declared file",
        "python scripts/undeclared.py": "not a declared file",
    }
    for command, why in cases.items():
        result = submit(pipeline, [{"command": command, "artifacts": [artifact]}])
        assert result.refused_with("regeneration_differs"), (command, result)
        message = result.failed["regeneration_differs"]
        assert "cannot run" in message and why in message, (command, message)
        assert result.regenerations == []  # nothing ran


def test_malformed_declarations_are_refused_with_a_clear_message(pipeline: Host) -> None:
    artifact = save(pipeline, "out/z.txt", SUMS)
    cases: list[tuple[Any, str]] = [
        ("python -m pkg.report", "must be a list"),
        ([], "got an empty list"),
        ([{"artifacts": [artifact]}], "'command' must be a non-empty string"),
        ([{"command": "python -m pkg.report", "artifacts": []}], "'artifacts' must be a list"),
        ([{"command": "python -m pkg.report", "artifacts": [3]}], "artifact id string"),
        ([{"command": "python -m pkg.report", "artifacts": [artifact], "cwd": "pkg"}],
         "unknown keys cwd"),
        ([{"command": "python -m pkg.report", "artifacts": [artifact]}] * (MAX_REGENERATES + 1),
         f"got {MAX_REGENERATES + 1} entries"),
    ]
    for value, why in cases:
        result = submit(pipeline, value)
        assert result.refused_with("regenerates_malformed"), (value, result)
        assert why in result.failed["regenerates_malformed"], (value, result.failed)
        assert result.regenerations == [] and not result.verdict["reproduction"]
    # an id that is not an artifact of this session is a claim the record does not back
    stranger = "7d3f6a1e-2b4c-4d5e-8f90-a1b2c3d4e5f6"
    result = submit(pipeline, [{"command": "python -m pkg.report", "artifacts": [stranger]}])
    assert result.refused_with("claim_unbacked"), result
    assert f"regenerates[0] claims {stranger!r}" in result.failed["claim_unbacked"]


def test_only_reusable_pipeline_takes_regenerates(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with Host(ws, mode="codebase_change") as h:
        artifact = save(h, "out.txt", SUMS)
        code = ("import json\n"
                "d = host._call('submit_output', output={'summary': 's'}, "
                "completion_bullets=['did it'], regenerates=[{'command': 'python -m pkg', "
                f"'artifacts': [{artifact!r}]}}])\nprint('VERDICT', json.dumps(d))")
        text = run_ok(h, code)
    verdict = json.loads(next(ln for ln in text.splitlines()
                              if ln.startswith("VERDICT "))[len("VERDICT "):])
    failed = {c["code"]: c["message"] for c in verdict["checks"] if not c["ok"]}
    assert "regenerates_malformed" in failed, failed
    assert "declaration of reusable_pipeline" in failed["regenerates_malformed"]


# -- the attacker: the right bytes where the kernel can reach them -----------------------------


def test_the_expected_output_written_into_the_workspace_does_not_reach_the_judge(
        pipeline: Host) -> None:
    # The right bytes sit at the artifact's path in the workspace; the "pipeline" does
    # nothing. The judge's tree is built from declared bytes only.
    artifact = save(pipeline, "out/a.txt", SUMS)
    result = submit(pipeline, [{"command": "python -m pkg.noop", "artifacts": [artifact]}],
                    "pkg/noop.py")
    assert result.refused_with("regeneration_differs"), result
    assert "out/a.txt was not written" in result.failed["regeneration_differs"]
    assert (pipeline.workdir / "out" / "a.txt").read_text() == SUMS  # it was there all along


def test_declaring_the_expected_output_itself_is_refused_before_anything_runs(
        pipeline: Host) -> None:
    artifact = save(pipeline, "out/b.txt", SUMS)
    result = submit(pipeline, [{"command": "python -m pkg.noop", "artifacts": [artifact]}],
                    "pkg/noop.py", "out/b.txt")
    assert result.refused_with("regeneration_differs"), result
    message = result.failed["regeneration_differs"]
    assert "already holds" in message and "at out/b.txt (a declared file)" in message, message
    assert result.regenerations == []


def test_copying_a_premade_copy_from_the_kernels_temp_folder_is_refused(
        pipeline: Host) -> None:
    # The kernel's private temp folder ($TMPDIR; /tmp itself is read-only to it) holds the
    # artifact's bytes; the agent's own run copies them from there, and so would the judge's
    # if it could see that folder.
    text = run_ok(pipeline, "import os, tempfile\n"
                            "p = os.path.join(tempfile.gettempdir(), 'premade_c.txt')\n"
                            f"with open(p, 'w') as f:\n    f.write({SUMS!r})\nprint('PATH', p)")
    premade = next(ln.split()[1] for ln in text.splitlines() if ln.startswith("PATH "))
    command = f"python -m pkg.copy {premade} out/c.txt"
    artifact = bash_then_save(pipeline, command, "out/c.txt")
    result = submit(pipeline, [{"command": command, "artifacts": [artifact]}], "pkg/copy.py")
    assert result.refused_with("regeneration_differs"), result
    [section] = result.regenerations
    assert section["confined"] is True and section["exit_status"] != 0, section
    assert premade in section["stderr_tail"], section["stderr_tail"]


def test_copying_the_artifacts_blob_from_the_record_is_refused(pipeline: Host) -> None:
    artifact = save(pipeline, "out/d.txt", SUMS)
    blob = pipeline.record_dir / "blobs" / "sha256" / sha(SUMS)[:2] / sha(SUMS)
    assert blob.is_file()
    command = f"python -m pkg.copy {blob} out/d.txt"
    result = submit(pipeline, [{"command": command, "artifacts": [artifact]}], "pkg/copy.py")
    assert result.refused_with("regeneration_differs"), result
    [section] = result.regenerations
    assert section["confined"] is True and section["exit_status"] != 0, section
    assert "Error" in section["stderr_tail"] and str(blob) in section["stderr_tail"]


def test_reading_the_kernels_workspace_by_its_absolute_path_is_refused(pipeline: Host) -> None:
    artifact = save(pipeline, "out/e.txt", SUMS)
    source = pipeline.workdir / "out" / "e.txt"
    command = f"python -m pkg.copy {source} out/e.txt"
    result = submit(pipeline, [{"command": command, "artifacts": [artifact]}], "pkg/copy.py")
    assert result.refused_with("regeneration_differs"), result
    [section] = result.regenerations
    assert section["confined"] is True and section["exit_status"] != 0, section
    assert str(source) in section["stderr_tail"], section["stderr_tail"]


def test_a_saved_copy_of_the_artifact_is_never_placed_as_an_input(pipeline: Host) -> None:
    # premade.txt holds the artifact's bytes and is in the store (saved); the artifact's
    # lineage names it as the input. Copying it is not making it.
    save(pipeline, "premade.txt", SUMS)
    command = "python -m pkg.copy premade.txt out/f.txt"
    artifact = bash_then_save(pipeline, command, "out/f.txt")
    result = submit(pipeline, [{"command": command, "artifacts": [artifact]}], "pkg/copy.py")
    assert result.refused_with("regeneration_differs"), result
    [section] = result.regenerations
    assert "premade.txt" in section["inputs"]["regenerated"], section["inputs"]
    assert section["inputs"]["placed"] == []
    assert section["exit_status"] != 0 and "premade.txt" in section["stderr_tail"]
    # declared instead, the copy is refused before it runs
    declared = submit(pipeline, [{"command": command, "artifacts": [artifact]}],
                      "pkg/copy.py", "premade.txt")
    assert declared.refused_with("regeneration_differs"), declared
    assert "already holds" in declared.failed["regeneration_differs"]


def test_a_symlink_at_the_artifacts_path_is_not_followed(pipeline: Host) -> None:
    artifact = save(pipeline, "out/g.txt", SUMS)
    command = f"python -m pkg.link {pipeline.workdir / 'out' / 'g.txt'} out/g.txt"
    result = submit(pipeline, [{"command": command, "artifacts": [artifact]}], "pkg/link.py")
    assert result.refused_with("regeneration_differs"), result
    assert "out/g.txt is not a regular file" in result.failed["regeneration_differs"]


# -- the parts, alone --------------------------------------------------------------------------


def test_parse_regenerates_accepts_the_documented_shape_and_drops_repeated_ids() -> None:
    [entry] = parse_regenerates([{"command": " python -m pkg.report a b ",
                                  "artifacts": ["id-1", "id-1", "id-2"]}])
    assert entry.command == "python -m pkg.report a b"
    assert entry.artifacts == ("id-1", "id-2")
    with pytest.raises(DeclarationError, match=r"regenerates\[1\] is a str"):
        parse_regenerates([{"command": "python -m x", "artifacts": ["a"]}, "python -m y"])


def test_parse_command_forms() -> None:
    files = {"pkg/__init__.py", "pkg/report.py", "pkg/tool/__main__.py", "scripts/run.py"}
    assert parse_command("python -m pkg.report a.csv b.txt", files) == (
        ".", ("-m", "pkg.report"), ("a.csv", "b.txt"))
    assert parse_command("python3 -u -m pkg.tool", files) == (".", ("-m", "pkg.tool"), ())
    assert parse_command("cd scripts && python run.py --n 2", files) == (
        "scripts", ("run.py",), ("--n", "2"))
    for bad in ("python -m pkg.report | tee x", "bash run.sh", "python -c 'print(1)'",
                "python -I -m pkg.report", "cd /tmp && python -m pkg.report",
                "python -m json.tool a b", "python ../run.py", "X=1 python -m pkg.report"):
        with pytest.raises(CommandRefused):
            parse_command(bad, files)


def test_recorded_inputs_are_placed_from_the_store_and_missing_ones_are_named(
        tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path / "record")
    stored = blobs.put_bytes(b"1,2\n").sha256
    absent = sha("never stored")
    source = blobs.put_bytes(REPORT.encode()).sha256
    claimed = Claimed("art-1", "out/s.txt", sha(SUMS), inputs=(
        ("pkg/report.py", sha("an older report.py")),  # declared: the declared bytes stand
        ("data/in.csv", stored), ("data/gone.csv", absent), ("/etc/hostname", stored),
        ("premade.txt", sha(SUMS))))
    request = RegenRequest({"pkg/report.py": source},
                           [RegenEntry("python -m pkg.report data/in.csv out/s.txt",
                                       (claimed,))])
    plan, refused = plan_regeneration(request, blobs)
    assert plan is not None and refused == []
    assert dict(plan.manifest) == {"pkg/report.py": (source, 0o644),
                                   "data/in.csv": (stored, 0o644)}
    assert plan.inputs["placed"] == ["data/in.csv"]
    assert plan.inputs["missing"] == [["data/gone.csv", absent]]
    assert plan.inputs["outside"] == ["/etc/hostname"]
    assert plan.inputs["regenerated"] == ["premade.txt"]
    code, ok, message = _judge(0, {"command": "python -m pkg.report", "outcome": "failed",
                                   "exit_status": 1}, plan)
    assert (code, ok) == ("regeneration_differs", False)
    assert "data/gone.csv" in message and "the record does not hold" in message, message
    assert "/etc/hostname" in message
    # The right bytes from a command the Host could not confine vouch for nothing.
    code, ok, message = _judge(0, {"command": "python -m pkg.report", "outcome": "passed",
                                   "confined": False, "exit_status": 0}, plan)
    assert (code, ok) == ("regeneration_differs", False)
    assert "could not confine" in message
    code, ok, _ = _judge(0, {"command": "python -m pkg.report", "outcome": "passed",
                             "confined": True, "exit_status": 0}, plan)
    assert (code, ok) == ("regeneration_differs", True)


def test_an_unconfined_regeneration_is_refused_through_a_real_cell(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Landlock the command could read the artifact's bytes wherever the kernel
    left them: the right bytes from it vouch for nothing."""
    monkeypatch.setenv("HOST_KERNEL_FAKE_NO_LANDLOCK", "1")
    ws = tmp_path / "ws"
    ws.mkdir()
    with Host(ws, mode="reusable_pipeline") as h:
        h._evidence_cell = build_package(h)  # type: ignore[attr-defined]
        save(h, "pkg/report.py", REPORT)
        save(h, "data/n.csv", DATA)
        command = "python -m pkg.report data/n.csv out/sums.txt"
        artifact = bash_then_save(h, command, "out/sums.txt")
        result = submit(h, [{"command": command, "artifacts": [artifact]}], "pkg/report.py")
    assert result.refused_with("regeneration_differs"), result
    assert "could not confine" in result.failed["regeneration_differs"]
