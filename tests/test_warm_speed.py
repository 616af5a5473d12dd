"""What a standby does ahead of its session leaves its kernel as a cold one would be.

A standby parses its own command line and makes the session's IPython profile folder
before the orders (host_kernel/kernel/standby.py ``ahead``), so that a warm start does
less after them. These tests show the kernel that results is configured as a cold one:
the same parsed command line, the same profile folder, the same configuration.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from host_kernel import Host, HostPool
from host_kernel.host._generations import PRIVATE_DIRS
from host_kernel.host._kernel import standby_argv
from host_kernel.kernel.standby import IPYTHON_DIR

#: Prints, as JSON, IPKernelApp's own parse of the kernel's command line and the parse
#: made ahead, each applied to a fresh application.
PARSE = textwrap.dedent("""
    import json, sys
    from ipykernel.kernelapp import IPKernelApp
    from host_kernel.kernel.standby import apply_parsed, parse_ahead
    argv = sys.argv[1:]
    own = IPKernelApp()
    own.parse_command_line(argv)
    ahead = IPKernelApp()
    apply_parsed(ahead, parse_ahead(argv))
    print(json.dumps([[repr(a.config), a.argv, a.extra_args, repr(a.cli_config),
                       a.connection_file, a.extra_extensions] for a in (own, ahead)]))
""")

#: Run first in a kernel: its count, inputs and outputs so far.
FIRST = "print(get_ipython().execution_count, In, Out)"

#: Run in a kernel: what its start made of its configuration and profile folder.
PROBE = textwrap.dedent("""
    import json, os
    from ipykernel.kernelapp import IPKernelApp
    app = IPKernelApp.instance()
    shell = get_ipython()
    home = os.environ["IPYTHONDIR"]
    tree = sorted([os.path.relpath(os.path.join(d, n), home), oct(os.stat(os.path.join(d, n)).st_mode)]
                  for d, dirs, files in os.walk(home) for n in dirs + files)
    config = {k: dict(v) for k, v in app.config.items() if k != "IPKernelApp"}
    print(json.dumps({"argv": app.argv[2:], "extra": app.extra_args, "config": repr(config),
                      "profile": os.path.relpath(shell.profile_dir.location, home),
                      "tree": tree, "extensions": app.extra_extensions,
                      "hist": shell.history_manager.hist_file,
                      "log": [app.log.name, app.log.level,
                              [type(h).__name__ for h in app.log.handlers]]}))
""")


def test_a_command_line_parsed_ahead_is_parsed_as_the_kernel_parses_it() -> None:
    argv = standby_argv(None)
    tail = argv[argv.index("-c") + 2:]
    out = subprocess.run([sys.executable, "-c", PARSE, *tail], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    own, ahead = json.loads(out)
    assert own == ahead
    assert own[4] == "{connection_file}"


def test_the_standby_makes_the_profile_folder_where_the_session_keeps_it() -> None:
    assert IPYTHON_DIR.split("/") == ["s", PRIVATE_DIRS["IPYTHONDIR"]]


def test_a_warm_kernel_is_configured_as_a_cold_one(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    (root / "warm").mkdir(parents=True)
    (root / "cold").mkdir()
    with HostPool(size=1, roots=[root], refill=False) as pool:
        assert pool.wait_ready(90), pool.broken
        with Host(root / "warm", pool=pool, factory=False) as host:
            assert host.ledger is not None
            rows = host.ledger.query("SELECT body FROM events WHERE kind = "
                                     "'generation_started' AND session = ?",
                                     (host.session_id,))
            assert json.loads(rows[0]["body"])["warm"]["used"] is True
            # The standby built its first cell's patterns ahead, but ran no cell.
            first_warm = host.execute(FIRST).text
            obs = host.execute(PROBE)
            assert obs.status == "ok", obs.text
            warm = json.loads(obs.text)
    with Host(root / "cold", factory=False) as host:
        first_cold = host.execute(FIRST).text
        obs = host.execute(PROBE)
        assert obs.status == "ok", obs.text
        cold = json.loads(obs.text)
    assert warm == cold
    assert first_warm == first_cold
    assert first_warm.endswith(f" ['', {FIRST!r}] {{}}\n")
    assert "profile_default/startup/README" in [path for path, _ in warm["tree"]]


def test_warming_the_first_cell_builds_its_patterns_and_runs_nothing() -> None:
    code = textwrap.dedent("""
        import tokenize
        from host_kernel.kernel.standby import warm
        before = tokenize._compile.cache_info().currsize
        warm()
        from IPython.core.interactiveshell import InteractiveShell
        print(before, tokenize._compile.cache_info().currsize > 0, InteractiveShell.initialized())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True", "False"]
