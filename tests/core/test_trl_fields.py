"""The frozen record of trl.GRPOConfig's fields (core/spec/trl_fields.json) against the installed TRL, and the
spec's validation importing neither torch nor TRL."""

import subprocess
import sys

from grpoflow.core.spec.trl_fields import trl_fields
from grpoflow.trainers.trl_record import generate


def test_frozen_fields_match_the_installed_trl():
    # Fails after a TRL upgrade until `python -m grpoflow.trainers.trl_record` regenerates the file.
    assert generate() == trl_fields(), "trl_fields.json is stale: run python -m grpoflow.trainers.trl_record"


def test_record_knows_types_choices_and_help():
    fields = trl_fields()["fields"]
    assert fields["num_iterations"]["types"] == ["int"]
    assert fields["epsilon_high"]["types"] == ["float", "None"]
    assert "constant" in fields["lr_scheduler_type"]["choices"]  # an enum's values
    assert fields["loss_type"]["help"].startswith("Specifies the loss formulation")


def test_validating_a_trl_block_imports_neither_torch_nor_trl():
    code = (
        "import sys; from grpoflow.core.spec import load_spec; "
        "load_spec({'name': 't', 'base_model': 'builtin:tiny', 'dataset': {'uri': 'x.jsonl'}, "
        "'rewards': [{'function': 'm:f'}], 'trl': {'loss_type': 'dr_grpo', 'num_iterations': 2}}); "
        "print(sorted({'torch', 'trl'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_upload_the_trl_block_refuses_is_a_field_of_the_installed_trl():
    from grpoflow.core.spec.rules import TRL_UPLOADS

    # A field TRL renamed would slip past the refusal: each name must still be one of GRPOConfig's.
    assert set(TRL_UPLOADS) <= set(trl_fields()["fields"])
    hub = {name for name in trl_fields()["fields"] if name.startswith(("hub_", "push_to_hub", "trackio_"))}
    assert hub <= set(TRL_UPLOADS), hub - set(TRL_UPLOADS)  # and none of theirs is missed
