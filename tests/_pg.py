"""A real PostgreSQL server for the tests: ``initdb`` and ``pg_ctl`` in a temporary folder.

PostgreSQL refuses to run as root, so when the suite runs as root the server runs as the
unprivileged user ``nobody`` (the folder is handed to it). It listens on 127.0.0.1 on a
free port and on a Unix socket in its own folder, with ``trust`` authentication for the
one superuser ``hk``; nothing outside the test run knows it is there. :func:`find_bin`
looks for Debian's ``postgresql`` package (``/usr/lib/postgresql/<major>/bin``) and
``PATH``; :func:`unavailable` says why no server can run here, or None.

:meth:`PgServer.halt` and :meth:`PgServer.resume` stop and start the same server (its data
kept, on its port) and :meth:`PgServer.outage` does both in a thread, for the tests of a
ledger that goes away under a running Host (tests/test_store_outage.py).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

SUPERUSER = "hk"


def find_bin(name: str) -> str | None:
    """``name`` (initdb, pg_ctl) from Debian's postgresql package or PATH; None if absent."""
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        majors = sorted((p for p in root.iterdir() if p.name.isdigit()),
                        key=lambda p: int(p.name), reverse=True)
        for major in majors:
            if (major / "bin" / name).is_file():
                return str(major / "bin" / name)
    return shutil.which(name)


def unavailable() -> str | None:
    """Why no PostgreSQL server can run here (None when one can)."""
    for name in ("initdb", "pg_ctl"):
        if find_bin(name) is None:
            return (f"PostgreSQL's {name} is not installed (Debian: apt-get install "
                    f"postgresql; .ci/run installs it)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("nobody")
        except KeyError:
            return "running as root and there is no unprivileged user 'nobody' to run it as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One PostgreSQL cluster, started by :meth:`start`, gone after :meth:`stop`."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="hk-pg-", dir="/tmp"))
        self.data = self.folder / "data"
        self.port = _free_port()
        self._as: dict[str, int] = {}
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            self._as = {"user": nobody.pw_uid, "group": nobody.pw_gid}
            os.chown(self.folder, nobody.pw_uid, nobody.pw_gid)
        self.started = False

    def _run(self, *argv: str, timeout: float = 120) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              cwd=self.folder, env={**os.environ, "LC_ALL": "C.UTF-8"},
                              **self._as)  # type: ignore[arg-type]
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout)[-2000:]}")

    def start(self) -> PgServer:
        initdb = find_bin("initdb")
        assert initdb is not None
        self._run(initdb, "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                  "--encoding=UTF8", "--no-instructions", "-N")
        self._launch()
        return self

    def _pg_ctl(self, *args: str, timeout: float = 120) -> None:
        pg_ctl = find_bin("pg_ctl")
        assert pg_ctl is not None
        self._run(pg_ctl, "-D", str(self.data), *args, timeout=timeout)

    def _launch(self) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-c unix_socket_directories={self.folder} -c fsync=on "
                   f"-c max_connections=200 -c shared_buffers=64MB")
        self._pg_ctl("-l", str(self.folder / "server.log"), "-o", options, "-w", "-t", "60",
                     "start")
        self.started = True

    def halt(self, mode: str = "fast") -> None:
        """Stop the server and keep its data (``fast``: sessions are told, 57P01;
        ``immediate``: as a crash); :meth:`resume` starts it again on the same port."""
        self._pg_ctl("-m", mode, "-w", "stop", timeout=60)
        self.started = False

    def resume(self) -> None:
        """Start again the server :meth:`halt` stopped, with its data, on the same port."""
        self._launch()

    def outage(self, seconds: float, mode: str = "fast") -> threading.Thread:
        """A thread, started, that halts the server, waits ``seconds`` and resumes it; join
        it to know the server is back. What it raises is kept in ``thread.error``, and
        when the server was down in ``thread.halted`` (wall clock)."""
        def run() -> None:
            try:
                self.halt(mode)
                thread.halted = time.time()  # type: ignore[attr-defined]
                time.sleep(seconds)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                thread.error = exc  # type: ignore[attr-defined]
            finally:
                try:
                    if not self.started:
                        self.resume()
                except BaseException as exc:  # noqa: BLE001
                    thread.error = exc  # type: ignore[attr-defined]

        thread = threading.Thread(target=run, name="pg-outage", daemon=True)
        thread.error = None  # type: ignore[attr-defined]
        thread.halted = None  # type: ignore[attr-defined]
        thread.start()
        return thread

    def password_role(self, name: str, password: str) -> str:
        """A login role that must give ``password`` over TCP (scram-sha-256, set in
        pg_hba.conf ahead of the trust lines); the URL that names it, without a password."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{password}'")
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"host all {name} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        self._pg_ctl("reload")
        return f"postgresql://{name}@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        if self.started:
            try:
                self._pg_ctl("-m", "immediate", "-w", "stop", timeout=60)
            finally:
                self.started = False
        shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def direct_sql(url: str, statement: str,
               params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """SQL run on a ledger's database directly (``?`` placeholders, in the ledger's
    schema), as a writer who holds no record key would; the rows it returns."""
    import psycopg

    from host_kernel.store.pg import PG_SCHEMA, _pg_sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET search_path = {PG_SCHEMA}")
        cur = conn.execute(_pg_sql(statement), params)
        return cur.fetchall() if cur.description else []
