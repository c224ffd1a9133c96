"""The stages' retry delay is a setting (`GRPOFLOW_RETRY_DELAY_S`, grpoflow.tasks): 5 s unless set, 0 in the tests."""

import json
import os
import subprocess
import sys

DELAYS = """
import json
from grpoflow.tasks.ingest import ingest_task
from grpoflow.tasks.bookkeeping import upload_job_task
from grpoflow.tasks.train import train_task
print(json.dumps([t.retry_delay_seconds for t in (ingest_task, train_task, upload_job_task)]))
"""


def delays(env: dict) -> list[float]:
    proc = subprocess.run([sys.executable, "-c", DELAYS], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_retry_delays_come_from_the_setting():
    unset = {k: v for k, v in os.environ.items() if k != "GRPOFLOW_RETRY_DELAY_S"}
    assert delays(unset) == [5.0, 5.0, 10.0]  # the default a user gets
    assert delays({**unset, "GRPOFLOW_RETRY_DELAY_S": "0.5"}) == [0.5, 0.5, 1.0]
    assert os.environ["GRPOFLOW_RETRY_DELAY_S"] == "0"  # this session's (tests/conftest.py)
