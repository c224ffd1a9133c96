"""A real PostgreSQL on 127.0.0.1 for the tests of a team's Prefect server (Debian's, which `make install` installs
as root: scripts/install_postgres.sh).

`postgres()` runs `initdb` in a fresh temporary folder (as the `postgres` user when this process is root, since
PostgreSQL refuses to run as root), starts the server on a free port, creates a `prefect` database and yields the
SQLAlchemy URL Prefect's server takes as `PREFECT_API_DATABASE_CONNECTION_URL`; on leaving, the server is stopped and
the folder removed. Loopback only, `trust` authentication: no password exists to leak.
"""

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

INSTALL_HINT = "install PostgreSQL: `make install` as root (Debian/Ubuntu), or `sudo apt-get install postgresql`"


def postgres_bin(program: str) -> str:
    """The path of one of PostgreSQL's server programs (`initdb`, `pg_ctl`, `createdb`): Debian keeps them in
    /usr/lib/postgresql/<version>/bin, off PATH; the newest version there, else PATH's."""
    found = glob.glob(f"/usr/lib/postgresql/*/bin/{program}")
    found.sort(key=lambda p: [int(n) for n in Path(p).parts[4].split(".")])
    path = found[-1] if found else shutil.which(program)
    if path is None:
        raise RuntimeError(f"PostgreSQL's {program} was not found: {INSTALL_HINT}")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1 for as long as the block runs; yields its `postgresql+asyncpg://` URL."""
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    folder = Path(tempfile.mkdtemp(prefix="grpoflow-tests-postgres-"))
    if as_postgres:
        shutil.chown(folder, "postgres", "postgres")
    data, port = folder / "data", _free_port()

    def run(program: str, *args: str) -> None:
        done = subprocess.run([*as_postgres, postgres_bin(program), *args], capture_output=True, text=True)
        assert done.returncode == 0, f"{program} {' '.join(args)}: {done.stdout}{done.stderr}"

    # --no-sync and fsync=off: a test database needs no durability across a power cut, and syncs cost seconds here
    run("initdb", "--pgdata", str(data), "--username", "grpoflow", "--auth", "trust", "-E", "UTF8", "--no-sync")
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off -c synchronous_commit=off"
    try:
        run("pg_ctl", "start", "--wait", "--pgdata", str(data), "--log", str(folder / "server.log"), "-o", options)
        run("createdb", "--host", "127.0.0.1", "--port", str(port), "--username", "grpoflow", "prefect")
        yield f"postgresql+asyncpg://grpoflow@127.0.0.1:{port}/prefect"
    finally:
        with contextlib.suppress(AssertionError):  # not started: nothing to stop
            run("pg_ctl", "stop", "--wait", "--pgdata", str(data), "--mode", "fast")
        shutil.rmtree(folder, ignore_errors=True)


# `make test-postgres` sets it: the Prefect stacks of tests/flows/test_deployments.py and tests/api/test_api.py then
# run on PostgreSQL instead of SQLite, as a team's server does (`make test` runs them on SQLite, and the concurrent
# submissions and one whole run on PostgreSQL as well).
DATABASE_ENV = "GRPOFLOW_TESTS_PREFECT_DATABASE"
DATABASES = ("sqlite", "postgresql")


@contextlib.contextmanager
def chosen_database() -> Iterator[dict[str, str]]:
    """The settings of a test stack's Prefect server for the database GRPOFLOW_TESTS_PREFECT_DATABASE names: none for
    SQLite (the default: the server's own file in its PREFECT_HOME), PREFECT_API_DATABASE_CONNECTION_URL of a
    PostgreSQL started for the block for `postgresql`."""
    chosen = os.environ.get(DATABASE_ENV) or "sqlite"
    if chosen not in DATABASES:
        raise ValueError(f"{DATABASE_ENV}={chosen!r}: choose one of {', '.join(DATABASES)}")
    if chosen == "sqlite":
        yield {}
        return
    with postgres() as database:
        yield {"PREFECT_API_DATABASE_CONNECTION_URL": database}
