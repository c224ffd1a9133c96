"""The fields of `trl.GRPOConfig` that a spec's `trl:` block may set, and the tracker names its `report_to` takes
(transformers' integrations), frozen in `trl_fields.json` so that validating a spec imports neither torch nor TRL.

`python -m grpoflow.trainers.trl_record` writes the file from the installed TRL after upgrading it
(tests/core/test_trl_fields.py fails until then).
"""

import functools
import json
from pathlib import Path

PATH = Path(__file__).with_name("trl_fields.json")


@functools.cache
def trl_fields() -> dict:
    """The frozen record (`trl_fields.json`), read once: `{"trl_version": ..., "fields": {name: {...}}}`."""
    return json.loads(PATH.read_text())
