"""Prefect tasks, one per pipeline stage, each emitting its `grpoflow.*` event."""

import os

# See flows/__init__.py: no telemetry from a Prefect server started on behalf of grpoflow.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
