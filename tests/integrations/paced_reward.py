"""A reward that paces training at ~0.3 s a step, for tests that must stop a run mid-way however fast the machine
is (tests/integrations/test_checkpoint_sync.py: the machine is lost after a checkpoint reached S3, before the last)."""

import time

STEP_S = 0.3


def paced_reward(completions, **kwargs):
    time.sleep(STEP_S)
    return [0.0] * len(completions)
