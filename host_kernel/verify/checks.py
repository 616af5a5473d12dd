"""The check table: every check code and its rule, and one verdict's tally of them.

Owns :data:`CHECKS` (the stable codes docs/verification.md explains),
:data:`RETIRED` (codes reserved but no longer emitted) and :class:`_Checks`,
which the check functions of the other modules append to. It runs no check
itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._models import Check
from .views import RecordView

#: Every check code, with the rule it holds. Stable: tools and docs depend on them.
CHECKS: dict[str, str] = {
    "record_unreadable": "the Host's record can be read",
    "output_not_json": "output is a JSON-serialisable dict",
    "output_too_large": "output stays within the size and depth bounds",
    "output_schema": "output matches output_schema when one is given",
    "schema_invalid": "output_schema, when given, is a valid JSON Schema: its patterns "
                      "compile and its $refs point inside it",
    "schema_too_costly": "output_schema can be checked within the Host's bounds (size, "
                         "nesting, steps, and time for its patterns and in all)",
    "completion_bullets": "completion_bullets is a list of 1 to 4 non-empty strings",
    "task_status": "task_status is completed, partial, blocked or failed when given",
    "claim_unbacked": "every file or artifact that output claims is backed by this session",
    "artifact_altered": "a claimed artifact's stored bytes still have its sha256",
    "declarations_missing": "source_files, entry_points, architecture_summary and "
                            "test_evidence are all given",
    "source_outside": "each source file is a workspace-relative path inside the workspace",
    "source_missing": "each source file exists",
    "source_not_regular_file": "each source file is a regular file (not a FIFO, device, "
                               "socket or directory)",
    "source_hash_mismatch": "a declared sha256 matches the file's current bytes",
    "source_not_saved": "each source file's current bytes were saved as an artifact of "
                        "this session",
    "entry_point_not_source": "each entry point is one of the source files",
    "entry_point_syntax": "each Python entry point compiles (it is never run)",
    "architecture_summary": "architecture_summary is a non-empty paragraph",
    "test_evidence_malformed": "test_evidence is a non-empty list of {command, "
                               "producing_cell_id}",
    "cell_id_unknown": "producing_cell_id is a cell the Host minted in this session",
    "cell_unfinished": "the producing cell finished and its output is recorded",
    "receipt_missing": "the producing cell holds a receipt for exactly that command",
    "exit_nonzero": "the receipt's exit status is 0",
    "evidence_after_submission": "the submitting cell comes after the producing cell",
    "source_bytecode": "each source file is source, not compiled bytecode",
    "claim_missing": "every path output names exists",
    # Verification by reproduction (host_kernel/reproduce, docs/verification.md).
    "runner_unrecognised": "the cited command is one plain pytest or unittest invocation "
                           "the Host can reproduce",
    "selection_not_allowed": "the cited command does not choose which tests run",
    "test_path_undeclared": "each test path the command names is a declared file or a "
                            "folder of them",
    "baseline_unavailable": "the workspace's baseline (codebase_change) is in the record",
    "runner_tampered": "declared code does not reach into the test runner (its hooks, "
                       "internals or plugin manager)",
    "environment_tampered": "every file of the session's package overlay is what its "
                            "distribution's RECORD lists",
    "reproduced": "the Host re-ran the command on the declared files and every test ran, "
                  "at least one passed and none failed",
    "reproduction_failed": "no test failed or errored when the Host re-ran the command",
    "reproduction_no_tests": "at least one test passed when the Host re-ran the command",
    "reproduction_incomplete": "every test collected from the declared paths ran",
    "reproduction_timeout": "the reproduction finished within its time limit",
    "reproduction_error": "the Host could run the reproduction",
    "tests_not_run": "every declared test file the cited command runs showed at least one "
                     "test that ran and passed (none collected nothing, skipped at module "
                     "level or errored at collection)",
    "native_code_declared": "no declared file is native code or other code a loader runs "
                            "unread (an ELF, Mach-O or PE image, a .so/.pyd/.dylib/.dll, a "
                            ".pth, an archive of modules)",
    "test_undeclared": "every test file or test configuration this session wrote that a "
                       "cited command collects or reads in the workspace is declared",
    "baseline_untrusted": "the codebase_change baseline is one no recorded session could "
                          "have written: the first session's tree, a git revision no session "
                          "touched, or a revision the user named (Host(baseline=))",
    "regression": "every baseline test that passed on the baseline passes on the changed "
                  "tree, run at its baseline bytes, unless intended_changes names it",
    "intended_changes": "intended_changes, when given, lists baseline tests with a reason "
                        "each (shown first to a reviewer)",
    "regenerates_malformed": "regenerates, when given, is a list of {command, artifacts} "
                             "in a mode that takes it (reusable_pipeline), each artifact "
                             "saved from a workspace file",
    "regeneration_differs": "each regenerates command, re-run by the Host on the declared "
                            "files and the recorded inputs, exits 0 and writes each claimed "
                            "artifact's exact bytes at the artifact's path",
    "environment_unavailable": "the distributions the session installed, which the Host "
                               "installs again itself, are available from the configured "
                               "index or wheelhouse, or the tests pass without them",
    "not_rederived": "with rederive=True, each artifact the output claims is re-derived by "
                     "the Host from its slice, in a fresh confined kernel on the recorded "
                     "input bytes, with the same sha256",
}

#: Codes of checks that read the agent's command string and printed output. Reproduction
#: does their job now; the codes stay reserved (never reused with another meaning).
RETIRED: dict[str, str] = {
    "masked_failure": "the command cannot hide a failing exit status",
    "runner_substituted": "the command ran the kernel's own runner",
    "stale_evidence": "every source file's current bytes are the bytes the command started "
                      "with",
    "receipt_output_altered": "the receipt's stored output still has its sha256",
    "no_tests_ran": "the receipt's own output shows at least one test passed",
    "tests_failed": "the receipt's own output shows no failed or erroring test",
}


@dataclass
class _Checks:
    """The checks of one verdict, and what they read."""

    view: RecordView
    files: Any  # LiveFiles or RecordedFiles
    submit_seq: int
    submitting_cell: str | None
    advisory: bool = False
    items: list[Check] = field(default_factory=list)
    #: Declared source files that passed their checks: path → sha256 of the saved bytes.
    sources: dict[str, str] = field(default_factory=dict)
    #: Test evidence whose receipt was found: (command, workspace-relative cwd, duration).
    evidence: list[tuple[str, str, float | None]] = field(default_factory=list)

    def fail(self, code: str, message: str) -> None:
        self.items.append(Check(code, False, message, self.advisory))

    def ok(self, code: str, message: str = "") -> None:
        self.items.append(Check(code, True, message or CHECKS[code], self.advisory))

    def passed(self, code: str) -> bool:
        return not any(c.code == code and not c.ok for c in self.items)
