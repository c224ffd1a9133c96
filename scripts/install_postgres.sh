#!/usr/bin/env bash
# Installs PostgreSQL's server programs (Debian's `postgresql`) where they are missing: with apt-get as root (CI's clean
# machine, a Debian or Ubuntu box); elsewhere it says what to install. `make install` runs it. The tests of a team's
# Prefect server on PostgreSQL (tests/postgres_server.py) start a PostgreSQL of their own from these programs (initdb
# in a temporary folder, as the `postgres` user the package creates): without them those tests fail. Nothing here
# starts a server or makes a database; the Prefect guide says how a team's server uses one.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    rm -rf /var/lib/apt/lists/*
    exit 0
fi
echo "grpoflow: PostgreSQL is not installed: the tests of a Prefect server on PostgreSQL fail without it. Install it:" >&2
echo "sudo apt-get install postgresql (Debian/Ubuntu), sudo dnf install postgresql-server (Fedora)." >&2
