"""A Prefect home whose SQLite database is already migrated, for the tests whose Prefect server (`prefect server
start`, or grpoflow's temporary server) is not what they test the migration of.

A server on a fresh home first migrates a new database (~13 CPU s here); on a migrated one it starts in ~5.5 s. The
migrated database is made once per test run, with `prefect server database upgrade -y` on a home of its own, and
shared by the xdist workers (the first to ask makes it under a lock); `prefect_home(path)` gives each new home a copy,
so every server still has a database of its own, as `prefect server start` leaves it.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from filelock import FileLock

PREFECT = str(Path(sys.executable).parent / "prefect")
SHARED_ENV = "TESTS_MIGRATED_PREFECT_DB"  # where it is made: set by tests/conftest.py before the xdist workers start


def migrated_database() -> Path:
    """The SQLite database of a Prefect home that `prefect server database upgrade -y` migrated to the newest
    revision, made on first use."""
    database = Path(os.environ[SHARED_ENV])
    with FileLock(f"{database}.lock"):
        if not database.exists():
            home = database.parent / "home"
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
            env |= {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
            done = subprocess.run([PREFECT, "server", "database", "upgrade", "-y"], env=env, capture_output=True,
                                  text=True, timeout=600)  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            shutil.copyfile(home / "prefect.db", f"{database}.partial")
            os.replace(f"{database}.partial", database)
    return database


def prefect_home(home: Path) -> str:
    """Makes `home` a Prefect home holding a copy of the migrated database (Prefect's default place for it,
    `<PREFECT_HOME>/prefect.db`) unless it has a database already (a server may be using it); returns its path, for
    PREFECT_HOME."""
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "prefect.db").exists():
        shutil.copyfile(migrated_database(), home / "prefect.db.partial")
        os.replace(home / "prefect.db.partial", home / "prefect.db")
    return str(home)
