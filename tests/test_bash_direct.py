"""host.bash runs one plain command without starting bash first (host/_direct.py), and
the command sees what it would have seen under bash: the same environment, folder,
exit status and output. Every other line still goes through bash.

The equivalence tests run each plain line twice through a real Host and a real
confined kernel: as written (exec'd directly) and with its first word quoted, which
bash reads as the same command but which is not plain, so bash runs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import bash_receipt, run_ok

from host_kernel import Host
from host_kernel.host import _bash
from host_kernel.host._direct import direct_argv

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}


# ------------------------------------------------------------------ which lines are plain


@pytest.mark.parametrize("line", [
    "true", "false", "ls", "ls -la data", "python3 -m pytest -q tests/x.py::t",
    "env -u HOME", "/usr/bin/env", "git log --format=%H -n 1", "cat a,b user@host:x +1",
    "  ls\t-l  ",
])
def test_a_plain_line_is_execd_as_its_words(tmp_path: Path, line: str) -> None:
    found = direct_argv(line, str(tmp_path), ENV)
    assert found is not None, line
    argv, env = found
    assert argv == line.split()
    assert env["_"].endswith("/" + argv[0].rsplit("/", 1)[-1])
    assert env["SHLVL"] == "0" and env["PWD"] == os.path.realpath(tmp_path)


@pytest.mark.parametrize("line", [
    # expansions, quoting, globbing, redirection, lists, comments, escapes
    "echo $HOME", "ls *.py", "ls a?", "ls [ab]", "cat 'a b'", 'cat "a"', "ls ~",
    "ls {a,b}", "true > out", "true < in", "true | cat", "true && true", "true; true",
    "true &", "(true)", "true # c", "cat a\\ b", "echo `id`", "ls\nrm x", "! true",
    # an assignment, builtins and keywords
    "A=1 env", "cd data", "echo hi", "pwd", "test -f x", "exec ls", "source x",
    "true --help", "false x", "time ls", "if", "kill 1", "printf x",
    # whitespace to Python, part of a word to bash
    "ls\xa0-l", "ls\x1c-l", "ls -l\u2003x", "ls\u3000data",
    # nothing to run, or nothing bash would exec
    "", "   ", "no-such-command-here", "./missing.sh",
])
def test_anything_else_goes_through_bash(tmp_path: Path, line: str) -> None:
    assert direct_argv(line, str(tmp_path), ENV) is None, line


@pytest.mark.parametrize("extra", [
    {"BASH_ENV": "/tmp/x"}, {"BASH_FUNC_ls%%": "() { echo no; }"}, {"BASHOPTS": "x"},
    {"IFS": ":"}, {"PS4": "> "}, {"OPTIND": "3"}, {"SHELLOPTS": "xtrace"},
    {"SHLVL": "999"}, {"SHLVL": "-1"}, {"SHLVL": "x"}, {"PATH": "bin:/usr/bin"},
    {"PATH": ":/usr/bin"},
])
def test_an_environment_bash_would_act_on_goes_through_bash(
        tmp_path: Path, extra: dict[str, str]) -> None:
    assert direct_argv("ls", str(tmp_path), ENV | extra) is None, extra


def test_no_path_goes_through_bash(tmp_path: Path) -> None:
    """Bash's own PATH when none is set differs from Python's default (it ends in ".")."""
    assert direct_argv("ls", str(tmp_path), {"HOME": "/root"}) is None


def test_a_file_bash_would_read_as_a_script_or_could_not_run_goes_through_bash(
        tmp_path: Path) -> None:
    script = tmp_path / "noshebang"
    script.write_text("echo from bash\n")
    script.chmod(0o755)
    assert direct_argv("./noshebang", str(tmp_path), ENV) is None
    shebang = tmp_path / "withshebang"
    shebang.write_text("#!/bin/sh\necho hi\n")
    shebang.chmod(0o755)
    assert direct_argv("./withshebang", str(tmp_path), ENV) is not None
    (tmp_path / "folder").mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fifo.chmod(0o755)
    for line in ("./folder", "./fifo", "/dev/zero", "/dev/null"):
        # Nothing but a regular file is opened to look (a FIFO would block, a device
        # could act on being opened): these go through bash, which says why.
        assert direct_argv(line, str(tmp_path), ENV) is None, line


def test_bash_start_changes_to_the_environment_are_made(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    cwd = str(tmp_path / "real")
    env = ENV | {"PS1": "$ ", "PS2": "> ", "SHLVL": "007", "OLDPWD": "/no/such/folder",
                 "PWD": str(tmp_path / "link")}
    found = direct_argv("ls", cwd, env)
    assert found is not None
    _, out = found
    assert "PS1" not in out and "PS2" not in out and "OLDPWD" not in out
    assert out["SHLVL"] == "7"
    assert out["PWD"] == str(tmp_path / "link")  # names the folder: kept, as bash keeps it
    assert out["_"] == "/usr/bin/ls"
    _, moved = direct_argv("ls", cwd, env | {"PWD": "/", "OLDPWD": "/"}) or ((), {})
    assert moved["PWD"] == os.path.realpath(cwd) and moved["OLDPWD"] == "/"


# ------------------------------------------------------------------ through a real Host


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    ws = tmp_path_factory.mktemp("direct")
    (ws / "data").mkdir()
    (ws / "data" / "a.txt").write_text("a\n")
    (ws / "show").write_text("#!/bin/sh\necho \"$0 $# $*\"\nexit 3\n")
    (ws / "show").chmod(0o755)
    (ws / "plain").write_text("echo plain script\n")
    (ws / "plain").chmod(0o755)
    (ws / "noexec").write_text("#!/bin/sh\necho no\n")
    with Host(ws) as h:
        yield h


def _run(host: Host, line: str) -> tuple[dict[str, Any], str, str]:
    """Run ``line`` with host.bash; its receipt body, stdout and stderr (whole)."""
    body = bash_receipt(host, line)
    assert host.blobs is not None
    out = host.blobs.read(body["stdout_sha256"]).decode()
    err = host.blobs.read(body["stderr_sha256"]).decode()
    return body, out, err


def _quoted(line: str) -> str:
    first, _, rest = line.partition(" ")
    return f"'{first}' {rest}".rstrip()


@pytest.mark.parametrize("line", [
    "env", "env -u HOME", "/usr/bin/env", "realpath .", "ls -a data", "./show one two",
    "true", "false", "cat data/a.txt data/missing.txt", "python3 -c print",
])
def test_a_plain_line_does_what_bash_would(host: Host, line: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    decided: list[object] = []
    real = _bash.direct_argv

    def watched(*args: Any) -> object:
        decided.append(real(*args))
        return decided[-1]

    monkeypatch.setattr(_bash, "direct_argv", watched)
    direct, out, err = _run(host, line)
    assert decided[-1] is not None, "the line was not run directly"
    bashed, bash_out, bash_err = _run(host, _quoted(line))
    assert decided[-1] is None, "the quoted line was not left to bash"
    assert (direct["via"], bashed["via"]) == ("exec", "bash")
    assert (direct["exit_status"], direct["signal"]) == (bashed["exit_status"],
                                                          bashed["signal"])
    # env prints in its environment's order, which bash chooses: compare the lines.
    assert sorted(out.splitlines()) == sorted(bash_out.splitlines())
    assert err.replace("'", "") == bash_err.replace("'", "")
    for key in ("executable", "executable_sha256", "changes", "path_differs"):
        assert direct[key] == bashed[key], key


@pytest.mark.parametrize(("line", "status"), [
    ("./plain", 0),  # executable, no #!: bash runs it as a script of its own
    ("./noexec", 126), ("./missing", 127), ("no-such-command-here", 127),
])
def test_what_only_bash_can_run_or_report_still_goes_through_bash(
        host: Host, line: str, status: int) -> None:
    body, out, err = _run(host, line)
    assert body["exit_status"] == status, (out, err)
    assert body["via"] == "bash"
    assert ("plain script" in out) == (line == "./plain")
    assert status == 0 or "bash" in err


def test_a_space_only_python_splits_on_is_part_of_the_word_as_bash_reads_it(
        host: Host) -> None:
    """``ls<U+00A0>data`` is one word to bash, a command that does not exist; run as
    Python splits it, it would list data and the receipt would say exit 0 for a line
    that fails."""
    body, out, err = _run(host, "ls\xa0data")
    assert body["exit_status"] == 127, (out, err)
    assert "a.txt" not in out and "command not found" in err


def test_a_changed_environment_in_the_kernel_decides_per_call(host: Host) -> None:
    """A cell that exports a function named like the command gets bash's answer (the
    function), not the program's."""
    text = run_ok(host, "import os\nos.environ['BASH_FUNC_ls%%'] = '() { echo shadowed; }'\n"
                        "try:\n    r = host.bash('ls data')\n"
                        "finally:\n    del os.environ['BASH_FUNC_ls%%']\n"
                        "print('OUT', r.stdout_tail.strip())\n"
                        "print('AFTER', host.bash('ls data').stdout_tail.strip())")
    assert "OUT shadowed" in text and "AFTER a.txt" in text
