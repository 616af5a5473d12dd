"""An S3 API on loopback for the tests: moto's server mode, a real HTTP server in a child
process, standing in for an object store that cannot run here (docs/blobs.md).

:func:`moto_server` starts it with one bucket, :data:`BUCKET`, under dummy credentials
(set in the environment while it runs), and stops it; tests/conftest.py's
``s3_endpoint`` fixture hands its address to a test module.
"""

from __future__ import annotations

import contextlib
import importlib.util
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

HAVE_MOTO = importlib.util.find_spec("moto") is not None and \
    importlib.util.find_spec("s3fs") is not None
NO_MOTO = ("moto[server] or s3fs is not installed: the S3 cases did NOT run "
           "(pip install 'moto[server]>=5' 's3fs>=2024.2')")
BUCKET = "blobs"


@contextlib.contextmanager
def moto_server(scratch: Path) -> Iterator[str]:
    """moto's S3 served over HTTP on 127.0.0.1 by a child process, with one bucket; dummy
    credentials and no proxy for the module's tests; the server is stopped at the end."""
    import s3fs  # type: ignore[import-untyped]

    nowhere = scratch / "none"
    with pytest.MonkeyPatch.context() as mp:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                     "all_proxy", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                     "AWS_ENDPOINT_URL_S3"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(nowhere))
        mp.setenv("AWS_CONFIG_FILE", str(nowhere))
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

        def drain() -> None:  # keeps reading, so the server never blocks on a full pipe
            assert server.stdout is not None
            for line in server.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=drain, daemon=True).start()
        try:
            seen: list[str] = []
            while True:
                line = lines.get(timeout=30)
                if line is None:
                    raise RuntimeError(f"moto's server did not start: {''.join(seen)}")
                seen.append(line)
                if found := re.search(r"http://127\.0\.0\.1:(\d+)", line):
                    break
            endpoint = f"http://127.0.0.1:{found.group(1)}"
            s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).mkdir(BUCKET)
            yield endpoint
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            if server.stdout is not None:
                server.stdout.close()
