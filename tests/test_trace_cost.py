"""What tracing costs the Host, and that paying less changes nothing it records.

The tracer stamps each read with the file's stat key at its open (host_kernel/
sandbox/trace.py), and the Host hashes a file once per content: a read whose
stamp is the key of a hash it already holds looks at nothing (docs/lineage.md,
"Hashes"). These tests hold that through real cells in a real confined, traced
kernel: which bytes an artifact's lineage names when a file changes between
cells, or between its read and the hash, how often the Host opened or stat'ed a
file, and that the stamps reach only the code they were taken for.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import run_ok
from _tracing_helpers import file_inputs, filtered_python, finished

from host_kernel import Host
from host_kernel.audit import audit
from host_kernel.host import _keep, _workspace
from host_kernel.host._workspace import SETTLED_NS, OpenStamps, stat_key
from host_kernel.sandbox import trace

pytestmark = pytest.mark.skipif(trace.unavailable() is not None,
                                reason=f"OS-level tracing cannot run here: {trace.unavailable()}")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def traced(workdir: Path) -> Iterator[Host]:
    with Host(workdir) as host:
        assert host.tracing == {"status": "seccomp"}, host.tracing
        yield host




def settle(path: Path) -> None:
    """Wait until ``path`` has settled: a hash of it taken from now on is cached."""
    left = path.stat().st_ctime_ns + SETTLED_NS + 5_000_000 - time.time_ns()
    if left > 0:
        time.sleep(left / 1e9)


class Looks:
    """Counts the Host's own opens and stats of one workspace file (by its name)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.name = name
        self.opens = 0
        self.stats = 0
        real_open_beneath = _keep.open_beneath
        real_open_for_hash = _workspace._open_for_hash
        real_stat = os.stat

        def open_beneath(root: Any, rel: Any, **kw: Any) -> Any:
            self._count_open(rel)
            return real_open_beneath(root, rel, **kw)

        def open_for_hash(path: Any, follow: bool, root: Any) -> Any:
            self._count_open(path)
            return real_open_for_hash(path, follow, root)

        def stat(path: Any, *a: Any, **kw: Any) -> os.stat_result:
            if isinstance(path, (str, os.PathLike)) and os.fspath(path).endswith(
                    "/" + name):
                self.stats += 1
            return real_stat(path, *a, **kw)

        monkeypatch.setattr(_keep, "open_beneath", open_beneath)
        monkeypatch.setattr(_workspace, "_open_for_hash", open_for_hash)
        monkeypatch.setattr(os, "stat", stat)

    def _count_open(self, path: Any) -> None:
        if os.fspath(path).endswith(self.name):
            self.opens += 1

    def reset(self) -> tuple[int, int]:
        seen, self.opens, self.stats = (self.opens, self.stats), 0, 0
        return seen


# ------------------------------------------------------------------ once per content


def test_a_file_read_in_three_cells_is_hashed_once_per_content_and_named_as_read(
        traced: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    v1, v2 = b"first version\n", b"second version, longer\n"
    data = traced.workdir / "data.txt"
    data.write_bytes(v1)
    settle(data)  # a hash taken sooner is not cached (host/_workspace.py, ``settled``)
    looks = Looks(monkeypatch, "data.txt")
    run_ok(traced, "x1 = open('data.txt').read()")
    assert looks.reset()[0] == 1  # read, hashed and kept: once
    run_ok(traced, "x2 = open('data.txt').read()")
    assert looks.reset() == (0, 0)  # the stamp matched the hash's key: nothing looked at
    data.write_bytes(v2)  # changed outside the session, between the 2nd and 3rd cells
    settle(data)
    looks.reset()  # the wait's own stat
    run_ok(traced, "x3 = open('data.txt').read()")
    assert looks.reset()[0] == 1  # a new content: hashed once
    run_ok(traced, "open('out.txt', 'w').write(x1 + x2 + x3)\n"
                   "_a = host.save_artifact('out.txt')")
    named = {(i["path"], i["sha256"]) for i in file_inputs(traced, "out.txt")}
    assert named == {("data.txt", sha(v1)), ("data.txt", sha(v2))}
    assert not any(i.get("changed_after_read") for i in file_inputs(traced, "out.txt"))


def test_a_file_read_then_changed_before_any_artifact_names_the_bytes_read(
        traced: Host) -> None:
    v1, v2 = b"read by the first cell\n", b"written after it\n"
    (traced.workdir / "src.txt").write_bytes(v1)
    run_ok(traced, "kept = open('src.txt').read()")
    run_ok(traced, f"open('src.txt', 'wb').write({v2!r})")
    run_ok(traced, "open('made.txt', 'w').write(kept.upper())\n"
                   "_a = host.save_artifact('made.txt')")
    [item] = file_inputs(traced, "made.txt")
    assert (item["path"], item["sha256"], item["hashed_at"]) == ("src.txt", sha(v1), "cell_end")
    assert traced.record.blobs.read(sha(v1)) == v1  # the bytes read are kept
    traced.close()
    drift = [f for f in audit(traced.record_dir).findings if f.code == "lineage_drift"]
    assert drift and "src.txt" in drift[0].where  # and the file now differs: audit says so


def test_a_file_changed_between_its_open_and_its_hash_says_so(traced: Host) -> None:
    (traced.workdir / "moving.txt").write_bytes(b"as opened\n")
    # The command (another owner) rewrites it after the cell's open and before the cell's
    # end, when the Host hashes what the cell read: the bytes the open found are gone.
    run_ok(traced, "seen = open('moving.txt').read()\n"
                   "_r = host.bash('echo rewritten > moving.txt')")
    run_ok(traced, "open('from_moving.txt', 'w').write(seen)\n"
                   "_a = host.save_artifact('from_moving.txt')")
    [item] = file_inputs(traced, "from_moving.txt")
    assert item["sha256"] == sha(b"rewritten\n")
    assert item["changed_after_read"] is True


def test_a_read_whose_file_is_unchanged_keeps_no_stat_per_cell(
        traced: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    (traced.workdir / "many").mkdir()
    for i in range(200):
        (traced.workdir / "many" / f"f{i:03d}.txt").write_text(f"file {i}\n")
    run_ok(traced, "import os\n"
                   "names = sorted(os.path.join('many', p) for p in os.listdir('many'))\n"
                   "for p in names: open(p).read()")
    looks = Looks(monkeypatch, "f007.txt")
    obs = traced.execute("for p in names: open(p).read()", timeout=60)
    assert obs.status == "ok", obs.text
    assert looks.reset() == (0, 0)
    body = finished(traced, obs)
    assert len(body["traced"]["reads"]) == 200
    assert len(body["inputs_kept"]["kept"]) == 200 and not body["inputs_kept"]["by_hash_only"]


def test_new_small_inputs_are_kept_in_one_batch_without_an_fsync_each(
        traced: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    (traced.workdir / "batch").mkdir()
    contents = {f"batch/f{i:03d}.txt": f"batch file {i}\n".encode() for i in range(150)}
    contents["batch/dup.txt"] = contents["batch/f000.txt"]  # the same bytes twice
    for rel, data in contents.items():
        (traced.workdir / rel).write_bytes(data)
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    obs = traced.execute("import glob\nfor p in sorted(glob.glob('batch/*')): open(p).read()",
                         timeout=60)
    assert obs.status == "ok", obs.text
    kept = finished(traced, obs)["inputs_kept"]
    assert sorted(kept["kept"]) == sorted([rel, sha(data), len(data)]
                                          for rel, data in contents.items())
    assert kept["used"] == sum(len(d) for r, d in contents.items() if r != "batch/dup.txt")
    assert len(fsyncs) < 10  # the store's own puts would have made two per file
    for data in contents.values():
        assert traced.record.blobs.read(sha(data)) == data
    assert list(traced.record.blobs.tmp.iterdir()) == []
    traced.close()
    report = audit(traced.record_dir)
    assert report.clean, [str(f) for f in report.findings]


# ------------------------------------------------------------------ the stamps themselves


def test_stamps_go_only_to_the_reads_they_were_taken_for() -> None:
    def text(s: str) -> str:
        return json.loads(json.dumps(s))  # equal text, a new object (as the kernel's JSON)

    stamps = OpenStamps()
    reads = [text("a.txt"), text("b.txt")]
    stamps.put(reads, {reads[0]: (1, 2, 3, 4)})
    assert stamps.for_reads(reads) == {"a.txt": (1, 2, 3, 4)}
    assert stamps.for_reads([*reads, "host_read.txt"]) == {"a.txt": (1, 2, 3, 4)}
    # Equal text, other objects: a list the kernel reported, or another owner's.
    assert stamps.for_reads([text("a.txt"), text("b.txt")]) == {}
    assert stamps.for_reads(reads[:1]) == {}


def _supervised(code: str, cwd: Path, compiled: bool = True) -> list[tuple[Any, ...]]:
    """Run ``python -c code`` under the filter, served by a Supervisor that stamps reads
    (through the compiled module when there is one, unless ``compiled`` is false)."""
    pid, listener, out_r = filtered_python(code, cwd)
    supervisor = trace.Supervisor([str(cwd)], stamp_reads=True, compiled=compiled)
    supervisor.add(listener, 0)
    poller = select.poll()
    poller.register(out_r, select.POLLIN)
    poller.register(listener, select.POLLIN)
    while True:
        for fd, mask in poller.poll(10_000):
            if fd == out_r:
                if not os.read(out_r, 65536):
                    os.close(out_r)
                    os.waitpid(pid, 0)
                    accesses, _ = supervisor.take()
                    supervisor.close()
                    return accesses
            elif not (mask & select.POLLIN and supervisor.serve(fd)):
                poller.unregister(fd)
                supervisor.remove(fd)


def test_the_supervisor_stamps_each_read_with_the_key_its_open_found(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\n")
    os.symlink("a.txt", tmp_path / "link")
    code = ("import os\n"
            "open('a.txt').read()\n"
            "open('a.txt', 'a').write('two\\n')\n"
            "open('a.txt').read()\n"
            "open('link').read()\n"
            "try:\n    open('missing.txt').read()\nexcept OSError:\n    pass\n")
    accesses = _supervised(code, tmp_path)
    root = str(tmp_path)
    reads = [a for a in accesses if a[2] == trace.READ]
    now = stat_key(os.stat(tmp_path / "a.txt"))
    stamped = {a[3]: a[4] for a in sorted(reads, key=lambda a: a[0])}
    assert stamped[f"{root}/a.txt"] == now  # the latest open's (after the append)
    assert stamped[f"{root}/link"] == now  # followed, as the open follows it
    assert stamped[f"{root}/missing.txt"] is None
    first = min((a for a in reads if a[3] == f"{root}/a.txt"), key=lambda a: a[0])
    assert first[4][0] == len("one\n")  # the first open's, before the append
    writes = [a for a in accesses if a[2] == trace.READ_WRITE or a[2] == trace.WRITE]
    assert writes and all(len(a) == 4 for a in writes)  # only reads carry a stamp



# ------------------------------------------------------------------ the compiled supervisor

#: A program whose calls take every way through the supervisor: reads relative to the
#: working folder, to a folder descriptor and absolute; O_PATH; reads after a chdir and an
#: fchdir; paths with ".", ".." and "//" (left to Python); writes, renames, links and
#: removes (Python); a read outside the roots; a thread's reads; a read through
#: /proc/self/cwd; execs of a program in the roots (relative, with and without "./",
#: absolute, with "..", through /proc/self/cwd) and of one outside them.
_EVERY_WAY = """\
import os, subprocess, threading
open('a.txt').read()
open('sub/b.txt').read()
open(os.path.abspath('a.txt')).read()
d = os.open('sub', os.O_RDONLY | os.O_DIRECTORY)
os.close(os.open('b.txt', os.O_RDONLY, dir_fd=d))
os.close(os.open('b.txt', os.O_PATH, dir_fd=d))
os.close(os.open('a.txt', os.O_RDONLY | os.O_CREAT))
open('./sub/../a.txt').read()
open('sub//b.txt').read()
open('.hidden/c.txt').read()
open('long/' + 'x' * 200 + '/' + 'y' * 150 + '.txt').read()
open('..odd/d.txt').read()
os.close(os.open('sub/', os.O_RDONLY | os.O_DIRECTORY))
os.close(os.open('.hidden/', os.O_RDONLY | os.O_DIRECTORY))
open('/proc/self/cwd/a.txt').read()
open('new.txt', 'w').write('n')
os.rename('new.txt', 'moved.txt')
os.link('moved.txt', 'linked.txt')
os.unlink('linked.txt')
open('/etc/hostname').read()
t = threading.Thread(target=lambda: open('sub/b.txt').read())
t.start(); t.join()
subprocess.run(['./run.sh'], check=True)
subprocess.run(['bin/run.sh'], check=True)
subprocess.run([os.path.abspath('run.sh')], check=True)
subprocess.run(['./sub/../run.sh'], check=True)
subprocess.run(['/proc/self/cwd/run.sh'], check=True)
subprocess.run(['/bin/true'], check=True)
os.fchdir(d)
open('b.txt').read()
os.chdir('..')
os.chdir('sub')
open('b.txt').read()
open('../a.txt').read()
"""


def _every_way(root: Path, compiled: bool) -> list[tuple[Any, ...]]:
    for folder in ("sub", ".hidden", "..odd"):
        (root / folder).mkdir(parents=True)
    (root / "a.txt").write_text("a\n")
    (root / "sub" / "b.txt").write_text("b\n")
    (root / ".hidden" / "c.txt").write_text("c\n")
    (root / "..odd" / "d.txt").write_text("d\n")
    (root / "long" / ("x" * 200)).mkdir(parents=True)  # a path longer than a first read
    (root / "long" / ("x" * 200) / ("y" * 150 + ".txt")).write_text("long\n")
    for script in (root / "run.sh", root / "bin" / "run.sh"):
        script.parent.mkdir(exist_ok=True)
        script.write_text("#!/bin/sh\n:\n")
        script.chmod(0o755)
    seen = _supervised(_EVERY_WAY, root, compiled)
    # Times and stamps' values differ between two runs; kinds, paths and which reads were
    # stamped must not. Paths are made relative to each run's root.
    stamped = (trace.READ, trace.EXEC)
    return sorted({(a[2], *(p.replace(str(root), "ROOT") for p in a[3:5] if isinstance(p, str)),
                    a[2] in stamped and a[4] is not None) for a in seen})


@pytest.mark.skipif(trace.native() is None, reason="the compiled supervisor is not built here "
                    f"(pip install . builds it), or {trace.SUPERVISOR_ENV}=python")
def test_the_compiled_and_python_supervisors_record_the_same_accesses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    in_python: list[str | None] = []
    note = trace.Supervisor._note

    def counted(self: trace.Supervisor, source: int, tid: int, name: str | None,
                *args: int) -> None:
        in_python.append(name)
        note(self, source, tid, name, *args)

    monkeypatch.setattr(trace.Supervisor, "_note", counted)
    compiled = _every_way(tmp_path / "c", compiled=True)
    served_in_python = list(in_python)
    in_python.clear()
    python = _every_way(tmp_path / "python", compiled=False)
    assert compiled == python
    # The plain reads (and the interpreter's own opens) were served in C; execs and
    # changes of folder are Python's in both runs.
    assert len(served_in_python) + 10 < len(in_python)
    assert (trace.EXEC, "ROOT/run.sh", True) in compiled
    assert (trace.EXEC, "ROOT/bin/run.sh", True) in compiled
    assert not any(a[0] == trace.EXEC and "true" in a[1] for a in compiled)
    assert (trace.READ, "ROOT/a.txt", True) in compiled
    assert (trace.READ, "ROOT/sub/b.txt", True) in compiled
    assert (trace.READ, "ROOT/.hidden/c.txt", True) in compiled
    assert (trace.READ, "ROOT/..odd/d.txt", True) in compiled
    assert (trace.READ, f"ROOT/long/{'x' * 200}/{'y' * 150}.txt", True) in compiled
    assert (trace.READ, "ROOT/sub/", True) in compiled
    assert (trace.READ_WRITE, "ROOT/a.txt", False) in compiled
    assert (trace.RENAME, "ROOT/new.txt", "ROOT/moved.txt", False) in compiled
    assert not any("hostname" in str(a) for a in compiled)


@pytest.mark.parametrize("wanted", ["c", "python"])
def test_a_traced_kernel_says_which_supervisor_served_it(
        workdir: Path, monkeypatch: pytest.MonkeyPatch, wanted: str) -> None:
    if wanted == "python":
        monkeypatch.setenv(trace.SUPERVISOR_ENV, "python")
    else:
        monkeypatch.delenv(trace.SUPERVISOR_ENV, raising=False)
        if trace.native() is None:
            # CI installs the package (.ci/run: pip install '.[test]'), which builds it:
            # there a missing compiled supervisor is a failure, not a skip.
            if os.environ.get("CI") == "true":
                pytest.fail("CI=true but the compiled supervisor (_host_kernel_notify) is "
                            "not importable: the package's build of it failed")
            pytest.skip("the compiled supervisor is not built here (pip install . builds it)")
    (workdir / "read_me.txt").write_text("either way\n")
    with Host(workdir) as host:
        assert host.generations.kernel.hello["supervisor"] == wanted
        obs = host.execute("_t = open('read_me.txt').read()", timeout=60)
        assert obs.status == "ok", obs.text
        assert "read_me.txt" in finished(host, obs)["traced"]["reads"]
