"""A pool's standby runs nothing from the user's site folder before it narrows.

A standby starts in the pool's broad domain, which writes beneath every workspace root the
pool serves. Python runs the ``.pth`` files of the user's site folder at start-up, and a
session whose workspace covers that folder (a workspace at ``$HOME``) could leave one
there. Started without ``-s``, the next standby would run it before narrowing, and a
process it forked would keep the pool's rights. So standbys start with ``-s`` and add the
user site once narrowed, as a fresh kernel would have it (host_kernel/kernel/standby.py).

The suite runs in a virtual environment, where Python leaves the user site out; the test
makes an interpreter that uses one: a venv with system site-packages that reaches this
environment's packages through a ``.pth``, with ``PYTHONUSERBASE`` in the test's folder.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from host_kernel.host._kernel import standby_argv
from host_kernel.sandbox.landlock import abi_version

needs_landlock = pytest.mark.skipif(
    abi_version() < 1, reason="LOUD SKIP: Landlock is not available on this kernel, so a "
                              "standby's narrowing cannot be shown here")

#: Runs in the user-site interpreter: one warm session and one cold, each reporting what
#: its kernel saw. The pool's roots cover both workspaces and the folder "other".
CHILD = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from host_kernel import Host, HostPool
    root = Path(sys.argv[1])
    probe = ("import os, sys, site; print(__import__('json').dumps({"
             "'ran': os.environ.get('UPTH_RAN'), 'pid': os.getpid(),"
             "'path': [p for p in sys.path if p], 'user': site.ENABLE_USER_SITE}))")
    seen = {}
    with HostPool(size=1, roots=[root], refill=False) as pool:
        assert pool.wait_ready(90), pool.broken
        with Host(root / "warm", pool=pool) as host:
            rows = host.ledger.query("SELECT body FROM events WHERE kind = "
                                     "'generation_started' AND session = ?", (host.session_id,))
            warm = json.loads(rows[0]["body"])["warm"]
            assert warm["used"] is True, warm
            seen["warm"] = json.loads(host.execute(probe).text)
    with Host(root / "cold", factory=False) as host:
        seen["cold"] = json.loads(host.execute(probe).text)
    from host_kernel.sandbox.policy import Policy
    home = Policy.for_session(os.environ["PYTHONUSERBASE"], root / "cold", ())
    seen["writable"] = home.interpreter_writable()
    print(json.dumps(seen))
""")

#: The planted file: sets a variable the session's environment then holds only if it ran
#: after the standby took that environment, and tries to write where only the pool may.
PTH = ("import os, sys; exec(\"os.environ['UPTH_RAN'] = '1'\\nrole = 'standby' if "
       "'host_kernel.kernel.standby' in ' '.join(sys.orig_argv) else 'other'\\ntry:\\n "
       "open(os.path.join(os.environ['UPTH_OTHER'], f'{role}-{os.getpid()}'), 'w').close()"
       "\\nexcept OSError:\\n pass\")\n")


def test_a_standby_starts_without_the_user_site() -> None:
    argv = standby_argv(None)
    at = argv.index(sys.executable)
    assert argv[at + 1:at + 3] == ["-s", "-c"], argv


def _user_site_python(tmp_path: Path) -> Path:
    """A venv that keeps the user site, with this environment's packages on its path."""
    venv = tmp_path / "usersite-venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, capture_output=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c",
                              "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    ours = [p for p in site.getsitepackages() if os.path.isdir(p)]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in ours)
    Path(purelib, "zz-parent.pth").write_text(lines)
    return python


@needs_landlock
def test_a_user_site_pth_runs_only_after_narrowing(tmp_path: Path) -> None:
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs to run in a virtual environment, to make one that keeps the user site")
    python = _user_site_python(tmp_path)
    root = tmp_path / "roots"
    for name in ("warm", "cold", "other"):
        (root / name).mkdir(parents=True)
    userbase = tmp_path / "userbase"
    user_site = Path(sysconfig.get_path("purelib", f"{os.name}_user",
                                        vars={"userbase": str(userbase)}))
    user_site.mkdir(parents=True)
    (user_site / "planted.pth").write_text(PTH)
    # A broken usercustomize is said and passed over, as a fresh start does: both start.
    (user_site / "usercustomize.py").write_text("raise RuntimeError('broken on purpose')\n")
    env = {**os.environ, "PYTHONUSERBASE": str(userbase), "UPTH_OTHER": str(root / "other"),
           "HOST_KERNEL_FACTORY": "off"}
    env.pop("PYTHONNOUSERSITE", None)
    done = subprocess.run([str(python), "-c", CHILD, str(root)], check=False, env=env,
                          capture_output=True,
                          text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    warm, cold = seen["warm"], seen["cold"]
    # The planted file ran in both kernels, and in the warm one only once it had the
    # session's environment: after narrowing.
    assert cold["ran"] == "1" and warm["ran"] == "1", seen
    assert warm["user"] is True and cold["user"] is True
    # Nothing it tried in the standby reached the folder the pool's domain could write.
    # (The Host's own interpreter runs it too, unconfined, as every Python of the user
    # would: a session that can write the user site is reported as able to change the
    # interpreter, docs/security.md.)
    assert [n for n in os.listdir(root / "other") if n.startswith("standby")] == [], seen
    # A session whose workspace holds the user site is told it can change the interpreter.
    assert seen["writable"] == [os.path.realpath(user_site)], seen
    # The warm kernel's path has the user site where a fresh start puts it: before the
    # interpreter's own site-packages, in the same order as the cold kernel's.
    assert str(user_site) in warm["path"]
    relevant = [p for p in cold["path"] if p == str(user_site) or "site-packages" in p]
    assert [p for p in warm["path"] if p in relevant] == relevant, seen
