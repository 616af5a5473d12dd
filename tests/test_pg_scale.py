"""Many Hosts, one PostgreSQL ledger: eight Host processes run a hundred cells each, at
the same time, into one database; nothing is lost, every chain is whole, audit is clean.

Real processes (each with its own kernel and its own connection), a real server
(tests/_pg.py), the real ``host-kernel audit --ledger`` command.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from host_kernel.store.ledger import check_chain
from host_kernel.store.pg import PostgresLedger

HOSTS = 8
CELLS = 100

_WORKER = textwrap.dedent("""
    import sys
    from host_kernel import Host

    workdir, url, cells = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Host(workdir, ledger=url) as host:
        failed = 0
        for i in range(cells):
            code = f"host.write_file('f{i}.txt', 'cell {i}')" if i % 10 == 0 else f"x = {i}"
            failed += host.execute(code).status != "ok"
        print(host.session_id, failed, flush=True)
""")


def test_eight_hosts_times_a_hundred_cells_into_one_ledger_lose_nothing(
        pg_url: str, tmp_path: Path) -> None:
    procs = []
    for n in range(HOSTS):
        ws = tmp_path / f"ws{n}"
        ws.mkdir()
        procs.append(subprocess.Popen([sys.executable, "-c", _WORKER, str(ws), pg_url,
                                       str(CELLS)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    sessions: dict[str, int] = {}
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        session, failed = out.split()
        sessions[session] = int(failed)
    assert len(sessions) == HOSTS and set(sessions.values()) == {0}

    with PostgresLedger.open_readonly(pg_url) as ledger:
        assert check_chain(ledger) == []
        for session in sessions:
            cells = ledger.query("SELECT status, count(*) FROM cells WHERE session = ? "
                                 "GROUP BY status", (session,))
            assert [tuple(r) for r in cells] == [("ok", CELLS)]
            writes = ledger.query("SELECT count(*) FROM writes WHERE session = ?", (session,))
            assert writes[0][0] == CELLS // 10
            ns = [r[0] for r in ledger.query("SELECT n FROM events WHERE session = ? ORDER BY "
                                             "seq", (session,))]
            assert ns == list(range(1, len(ns) + 1))  # linear: seq order is chain order
        # The sessions really interleaved: some session's events are not one run of seqs.
        runs = ledger.query("SELECT session FROM events ORDER BY seq")
        changes = sum(1 for a, b in zip(runs, runs[1:], strict=False) if a[0] != b[0])
        assert changes > HOSTS

    done = subprocess.run([sys.executable, "-m", "host_kernel", "audit", "--ledger", pg_url,
                           "--json"], capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["clean"], done.stdout[-3000:] + done.stderr[-2000:]
    assert report["events"] >= HOSTS * CELLS * 2
