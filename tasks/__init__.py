"""Prefect tasks, one per pipeline stage, each emitting its `grpoflow.*` event.

Their retries are in their decorators; the wait before a retry is `RETRY_DELAY_S` (`GRPOFLOW_RETRY_DELAY_S`, default
5 s, read as the tasks are defined): a setting rather than a literal, so that tests run their retries without waiting.
"""

import os

# See flows/__init__.py: no telemetry from a Prefect server started on behalf of grpoflow.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

RETRY_DELAY_S = float(os.environ.get("GRPOFLOW_RETRY_DELAY_S", "5"))
