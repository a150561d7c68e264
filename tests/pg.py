"""A throwaway PostgreSQL cluster for the tests: initdb in a temp dir, as a non-root user, on a
loopback port, fsync off. One cluster per test session; one fresh database per test, copied
from a template that is migrated once (CREATE DATABASE ... TEMPLATE is a file copy).

Used by tests/conftest.py (fixtures `pg_cluster`, `db_backend`, `db_url`). When the Debian
`postgresql` binaries are missing (scripts/setup.d/40-postgres.sh could not install them) the
postgres variants SKIP with that reason; when they are present but the cluster fails to start,
the tests ERROR with the server log (a real problem, never hidden).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.ports import free_port

PG_USER = "kvscope"
TEMPLATE_DB = "kvscope_template"


def find_pg_bin() -> Path | None:
    """The folder with initdb/pg_ctl/postgres (Debian keeps them off PATH), or None."""
    env = os.environ.get("KVSCOPE_PG_BIN")
    if env and (Path(env) / "initdb").exists():
        return Path(env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version_key)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).resolve().parent if on_path else None


def _version_key(path: str) -> int:
    try:
        return int(Path(path).parent.parent.name)
    except ValueError:
        return 0


def _run_as() -> tuple[int, int] | None:
    """(uid, gid) of a non-root user to run the server as when we are root (initdb refuses root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return pw.pw_uid, pw.pw_gid
    raise RuntimeError("running as root and no 'postgres' or 'nobody' user to run PostgreSQL as")


class PgCluster:
    """A PostgreSQL server in a temp dir. start() / stop(); url(db) for SQLAlchemy."""

    def __init__(self, bin_dir: Path, host: str = "127.0.0.1") -> None:
        self.bin_dir = bin_dir
        self.host = host
        self.port = 0
        self.base = Path(tempfile.mkdtemp(prefix="kvscope-pg-"))
        self.data = self.base / "data"
        self.sock = self.base / "sock"
        self.log = self.base / "server.log"
        self._ids = itertools.count(1)
        self._as = _run_as()
        self.started = False

    # ------------------------------------------------------------------ lifecycle
    def _sub(self, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self._as is not None:
            kwargs["user"], kwargs["group"] = self._as
            kwargs["extra_groups"] = []
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, "LC_ALL": "C", "LANG": "C"},
            cwd=str(self.base),
            **kwargs,
        )

    def start(self) -> None:
        self.sock.mkdir()
        if self._as is not None:
            for p in (self.base, self.sock):
                os.chown(p, *self._as)
        r = self._sub(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                PG_USER,
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ]
        )
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {r.stderr.strip()[-2000:]}")
        last = ""
        for _attempt in range(3):  # the free port may be taken between probe and bind
            self.port = free_port(self.host)
            opts = (
                f"-p {self.port} -k {self.sock} -c listen_addresses={self.host} -F "
                "-c full_page_writes=off -c synchronous_commit=off -c max_connections=200 "
                "-c shared_buffers=64MB"
            )
            r = self._sub(
                [
                    str(self.bin_dir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-o",
                    opts,
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            )
            if r.returncode == 0:
                self.started = True
                return
            last = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else r.stderr
        raise RuntimeError(f"pg_ctl start failed: {last}")

    def stop(self) -> None:
        try:
            if self.started:
                self._sub(
                    [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop"],
                    timeout=60,
                )
                self.started = False
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------------ databases
    def url(self, db: str) -> str:
        return f"postgresql+psycopg://{PG_USER}@{self.host}:{self.port}/{db}"

    def admin(self, sql: str) -> None:
        """Run one statement outside a transaction (CREATE/DROP DATABASE) on the `postgres` db."""
        import psycopg

        with psycopg.connect(host=self.host, port=self.port, user=PG_USER, dbname="postgres", autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def create_template(self) -> None:
        """A database migrated to all heads; every test database is a copy of it."""
        from app.storage.engine import make_engine, upgrade

        self.admin(f"DROP DATABASE IF EXISTS {TEMPLATE_DB}")
        self.admin(f"CREATE DATABASE {TEMPLATE_DB}")
        eng = make_engine(self.url(TEMPLATE_DB))
        try:
            upgrade(eng)
        finally:
            eng.dispose()

    def new_database(self, prefix: str = "t", template: str = TEMPLATE_DB) -> str:
        """A fresh database copied from `template` (by default the migrated, empty one); returns its
        name. tests/fed_databases.py passes a fed database as the template."""
        name = f"{prefix}_{os.getpid()}_{next(self._ids)}"
        for attempt in range(10):
            try:
                self.admin(f"CREATE DATABASE {name} TEMPLATE {template}")
                return name
            except Exception as exc:  # the template is briefly busy right after another copy
                if "being accessed by other users" not in str(exc) or attempt == 9:
                    raise
                time.sleep(0.2)
        return name

    def drop_database(self, name: str) -> None:
        try:
            self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        except Exception:
            pass


def start_cluster() -> PgCluster:
    """Start a cluster with a migrated template, or raise RuntimeError (LookupError when missing)."""
    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise LookupError(
            "PostgreSQL server binaries not found (apt-get install postgresql; scripts/setup.d/40-postgres.sh)"
        )
    cluster = PgCluster(bin_dir)
    try:
        cluster.start()
        cluster.create_template()
    except BaseException:
        cluster.stop()
        raise
    return cluster
