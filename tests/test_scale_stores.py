"""A Host whose record lives beyond one machine: the ledger in PostgreSQL, the blobs in an
S3 bucket (moto's server on loopback standing in for an object store), and a reviewer who
audits both from elsewhere.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from _pg import direct_sql
from _s3 import BUCKET

from host_kernel import Host
from host_kernel.audit import audit_ledger
from host_kernel.sandbox.landlock import abi_version
from host_kernel.store.fsblobs import FsspecBlobStore


@pytest.fixture
def stores(pg_url: str, s3_endpoint: str, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    # The standard way to point botocore (and so s3fs) at an S3-compatible endpoint.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    return pg_url, f"s3://{BUCKET}/{tmp_path.name}"


def _fs(endpoint: str) -> object:
    import s3fs  # type: ignore[import-untyped]

    return s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True,
                             use_listings_cache=False)


SAVE_RESULT = ("open('r.txt', 'w').write('result 42')\na = host.save_artifact('r.txt')\n"
               "print(a.artifact_id, a.sha256)\n"
               "import os\nprint(sorted(k for k in os.environ if k.startswith('AWS')))")


def _save_result(stores: tuple[str, str], tmp_path: Path) -> tuple[str, str, str, Path, str]:
    """A session that saves one artifact into the stores: its artifact id and sha256, its
    session id, its record folder, and the AWS variables its kernel saw."""
    ledger, blobs = stores
    ws = tmp_path / "ws"
    ws.mkdir()
    with Host(ws, ledger=ledger, blobs=blobs) as h:
        obs = h.execute(SAVE_RESULT)
        assert obs.status == "ok", obs.text
        ids, env = obs.text.split("\n")[:2]
        artifact, sha = ids.split()
        return artifact, sha, h.session_id, h.record_dir, env


def test_artifacts_reach_the_bucket_and_audit_checks_them_there(
        stores: tuple[str, str], s3_endpoint: str, tmp_path: Path) -> None:
    ledger, blobs = stores
    _, sha, session, record, env = _save_result(stores, tmp_path)
    # The bucket's credentials and address never reach the kernel.
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"} & set(
        json.loads(env.replace("'", '"')))
    fs = _fs(s3_endpoint)
    key = f"{blobs[len('s3://'):]}/blobs/sha256/{sha[:2]}/{sha}"
    assert fs.cat(key) == b"result 42"  # type: ignore[attr-defined]
    started = json.loads(json.dumps(_started(ledger, session)))
    assert started["blobs"] == blobs and started["ledger"].startswith("postgresql://")

    # The reviewer has the database and the bucket, not the worker's record folder.
    shutil.rmtree(record)
    report = audit_ledger(ledger)
    assert report.clean, [str(f) for f in report.findings]
    assert report.artifacts == 1 and report.blobs >= 1

    fs.pipe(key, b"result 43")  # type: ignore[attr-defined]
    codes = {f.code: f for f in audit_ledger(ledger).findings}
    assert "blob_altered" in codes and not audit_ledger(ledger).clean
    fs.rm(key)  # type: ignore[attr-defined]
    assert "blob_missing" in {f.code for f in audit_ledger(ledger).findings}


def _started(url: str, session: str) -> dict[str, object]:
    from host_kernel.store.pg import PostgresLedger

    with PostgresLedger.open_readonly(url) as reader:
        return next(e.body for e in reader.events(session) if e.kind == "session_started")


def test_audit_ledger_selects_sessions_and_says_what_it_cannot_find(
        pg_url: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    ids = []
    for _ in range(3):
        with Host(ws, ledger=pg_url) as h:
            h.execute("x = 1")
            ids.append(h.session_id)
    one = audit_ledger(pg_url, sessions=[ids[1][:10]])
    assert one.clean and 0 < one.events < audit_ledger(pg_url).events
    missing = audit_ledger(pg_url, sessions=["no-such-session"])
    assert not missing.clean and missing.findings[0].code == "record_missing"
    assert audit_ledger(pg_url, since=2e9).findings[0].code == "ledger_empty"


@pytest.mark.skipif(abi_version() < 1, reason="LOUD SKIP: Landlock is not available on this "
                    "kernel, so the kernel cannot be kept from the blob store's folder")
def test_a_blob_store_on_a_shared_folder_is_hidden_from_the_kernel() -> None:
    # Outside /tmp, which every confined kernel is kept from anyway and would mask this.
    base = Path(tempfile.mkdtemp(prefix="hk-shared-", dir=Path.home()))
    try:
        shared = base / "blobs"
        ws = base / "ws"
        ws.mkdir()
        # Another task's artifact, already in the shared store.
        theirs = FsspecBlobStore(f"file://{shared}").put_bytes(b"another task's result")
        with Host(ws, blobs=f"file://{shared}", require_confinement=True) as h:
            obs = h.execute(
                "open('r.txt', 'w').write('mine')\na = host.save_artifact('r.txt')\n"
                f"for p in ({str(shared)!r}, {str(shared / 'blobs' / 'sha256')!r}):\n"
                "    try:\n        print(sorted(__import__('os').listdir(p)))\n"
                "    except OSError as e:\n        print('refused', e.errno)\n"
                f"try:\n    print(open({FsspecBlobStore(f'file://{shared}').key(theirs.sha256)!r})"
                ".read())\nexcept OSError as e:\n    print('refused', e.errno)\n"
                "print(a.sha256)")
            assert obs.status == "ok", obs.text
            *tries, mine = obs.text.strip().split("\n")
        assert all(t.startswith("refused") for t in tries), tries
        # The Host itself still writes there.
        assert FsspecBlobStore(f"file://{shared}").read(mine) == b"mine"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_viewer_shows_a_ledger_and_serves_checked_bytes_from_its_bucket(
        stores: tuple[str, str], s3_endpoint: str, tmp_path: Path) -> None:
    import httpx

    from host_kernel.store.verified import LedgerRecord
    from host_kernel.viewer import ViewerServer

    ledger, blobs = stores
    artifact, sha, session, record, _ = _save_result(stores, tmp_path)
    shutil.rmtree(record)  # the reviewer has the database and the bucket only
    with ViewerServer(LedgerRecord(ledger)) as server, httpx.Client(
            base_url=f"http://127.0.0.1:{server.port}", params={"token": server.token},
            timeout=30) as client:
        assert session in client.get("/").text
        page = client.get(f"/artifact/{artifact}")
        assert page.status_code == 200 and sha in page.text
        got = client.get(f"/artifact/{artifact}/bytes")
        assert got.status_code == 200 and got.content == b"result 42"

        key = f"{blobs[len('s3://'):]}/blobs/sha256/{sha[:2]}/{sha}"
        _fs(s3_endpoint).pipe(key, b"result 43")  # type: ignore[attr-defined]
        got = client.get(f"/artifact/{artifact}/bytes")
        assert got.status_code == 409 and "not served" in got.text and b"43" not in got.content

        # An event edited in the database: every page is the red banner.
        direct_sql(ledger, "UPDATE events SET body = body || ' ' WHERE session = ? AND n = 2",
                   (session,))
        refused = client.get("/")
        assert refused.status_code == 409 and "chain_broken" in refused.text
        assert session not in refused.text


@pytest.mark.skipif(abi_version() < 1, reason="LOUD SKIP: Landlock is not available on this "
                    "kernel: without confinement the kernel could read the store anyway")
@pytest.mark.parametrize("inside", ["store in workspace", "workspace in store"])
def test_a_blob_store_folder_overlapping_the_workspace_is_refused(tmp_path: Path,
                                                                  inside: str) -> None:
    from host_kernel._errors import ConfinementError

    ws, shared = ((tmp_path / "ws", tmp_path / "ws" / "blobs") if inside == "store in workspace"
                  else (tmp_path / "blobs" / "ws", tmp_path / "blobs"))
    ws.mkdir(parents=True)
    with pytest.raises(ConfinementError, match="overlap"):
        Host(ws, blobs=str(shared)).start()
