"""Prefect flows: the GRPO pipeline, the data watcher, and the `grpoflow` CLI."""

import os

# The Prefect server this project starts (ephemeral or `prefect server start`) must not phone home: grpoflow runs
# on closed networks. A user's explicit setting wins.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
