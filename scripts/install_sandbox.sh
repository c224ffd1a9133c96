#!/usr/bin/env bash
# Installs bubblewrap (`bwrap`), the sandbox python graders run in (trainers/graders/sandbox.py), where it is
# missing: with apt-get as root (CI's clean machine, a Debian or Ubuntu box); elsewhere it says what to install.
# `make install` runs it, and so does the Dockerfile (a project's of `grpoflow init` too). The test suite runs the
# real sandbox: without bwrap its tests fail. The seccomp filter is assembled by grpoflow itself (no libseccomp);
# bwrap 0.8 or newer (Debian 12, Ubuntu 24.04) also keeps user namespaces out of the sandbox (--disable-userns).
set -euo pipefail

warn_if_old() {
    if ! bwrap --help 2>&1 | grep -q -- --disable-userns; then
        echo "grpoflow: $(bwrap --version 2>&1 | head -n 1) has no --disable-userns (bubblewrap 0.8 or newer):" >&2
        echo "the sandbox's seccomp filter alone keeps user namespaces out; upgrade bubblewrap where you can." >&2
    fi
}

if command -v bwrap >/dev/null; then
    warn_if_old
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null
    rm -rf /var/lib/apt/lists/*
    warn_if_old
    exit 0
fi
echo "grpoflow: bubblewrap (bwrap) is not installed: python graders will run without a sandbox, and the sandbox's" >&2
echo "tests fail. Install it: sudo apt-get install bubblewrap (Debian/Ubuntu), sudo dnf install bubblewrap (Fedora)." >&2
