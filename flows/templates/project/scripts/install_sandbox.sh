#!/usr/bin/env bash
# Installs bubblewrap (`bwrap`), the sandbox python graders run in (trainers/graders/sandbox.py), where it is
# missing: with apt-get as root (CI's clean machine, a Debian or Ubuntu box); elsewhere it says what to install.
# `make install` runs it, and so does the Dockerfile (a project's of `grpoflow init` too). The test suite runs the
# real sandbox: without bwrap its tests fail.
set -euo pipefail

if command -v bwrap >/dev/null; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null
    rm -rf /var/lib/apt/lists/*
    exit 0
fi
echo "grpoflow: bubblewrap (bwrap) is not installed: python graders will run without a sandbox, and the sandbox's" >&2
echo "tests fail. Install it: sudo apt-get install bubblewrap (Debian/Ubuntu), sudo dnf install bubblewrap (Fedora)." >&2
