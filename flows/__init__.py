"""Prefect flows: the GRPO pipeline, the data watcher, and the `grpoflow` CLI."""

import os

# The Prefect server this project starts (ephemeral or `prefect server start`) must not phone home: grpoflow runs
# on closed networks. A user's explicit setting wins.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The ephemeral server's first start creates its database; on a busy 2-core machine that outlasts Prefect's 20 s.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
