"""Load: 8 Hosts at once, 100 cells each (with receipts and artifacts), two per record folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from host_kernel.audit import audit
from host_kernel.store.ledger import SQLiteLedger, check_chain

SESSION = """
import sys, json
from host_kernel import Host
workdir, record, tag = sys.argv[1], sys.argv[2], sys.argv[3]
statuses = []
with Host(workdir, record_dir=record) as h:
    for i in range(100):
        if i % 10 == 3:
            code = f"host.bash('echo {tag}-{i} > out_{tag}_{i}.txt')"
        elif i % 10 == 7:
            code = f"host.save_artifact('out_{tag}_{i - 4}.txt')"
        elif i % 2:
            code = f"host.write_file('w_{tag}/{i}.txt', '{tag} {i}')"
        else:
            code = f"x_{i} = {i} * 2\\nprint(x_{i})"
        statuses.append(h.execute(code, timeout=120).status)
    print(json.dumps({"session": h.session_id, "statuses": statuses}))
"""


def test_eight_concurrent_sessions_record_every_event_and_audit_clean(tmp_path: Path) -> None:
    procs = []
    for i in range(8):
        work = tmp_path / f"ws{i}"
        work.mkdir()
        record = tmp_path / f"record{i // 2}"
        procs.append(subprocess.Popen([sys.executable, "-c", SESSION, str(work), str(record),
                                       f"s{i}"], stdout=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0
        results.append(json.loads(out.strip().splitlines()[-1]))
    for result in results:
        assert result["statuses"] == ["ok"] * 100
    for r in range(4):
        record = tmp_path / f"record{r}"
        with SQLiteLedger(record / "ledger.sqlite") as ledger:
            assert check_chain(ledger) == []
            for result in results[2 * r: 2 * r + 2]:
                sid = result["session"]
                cells = ledger.query("SELECT count(*) FROM cells WHERE session = ? AND "
                                     "status = 'ok'", (sid,))[0][0]
                receipts = ledger.query("SELECT count(*) FROM receipts WHERE session = ?",
                                        (sid,))[0][0]
                artifacts = ledger.query("SELECT count(*) FROM artifacts WHERE session = ?",
                                         (sid,))[0][0]
                writes = ledger.query("SELECT count(*) FROM writes WHERE session = ?",
                                      (sid,))[0][0]
                assert (cells, receipts, artifacts, writes) == (100, 10, 10, 30)
        report = audit(record)
        assert report.clean, [str(f) for f in report.findings]
