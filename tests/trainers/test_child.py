"""A training child's process plumbing (`grpoflow.trainers.child`): what a child started by `start_child` writes into
its log file."""

import sys

from grpoflow.trainers.child import start_child

# A child that loads and saves a model as the training children do: transformers draws "Loading weights" and "Writing
# model shards" bars, and imports bitsandbytes' warning with PEFT, unless grpoflow turns them off.
LOAD_AND_SAVE = """
import sys
from grpoflow.trainers.model import load
from grpoflow.trainers.model.tiny import build_tiny
import peft
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained(build_tiny()).save_pretrained(sys.argv[1])
print("saved")
"""


def test_a_child_log_holds_no_progress_bars(tmp_path):
    log = tmp_path / "logs" / "train.log"
    proc = start_child([sys.executable, "-c", LOAD_AND_SAVE, str(tmp_path / "saved")], log)
    assert proc.wait(300) == 0, log.read_text()[-2000:]
    text = log.read_text()
    assert "saved" in text and (tmp_path / "saved" / "model.safetensors").exists()
    noise = ("Loading weights", "Writing model shards", "it/s]", "\r", "No module named 'kernels'")
    assert [n for n in noise if n in text] == [], text[-2000:]


def test_a_runs_logs_hold_no_progress_bars_or_library_noise(trained_jobs):
    # The real pipeline's training children (`grpoflow run`, a LoRA job and a full fine-tune): each log held two
    # "Loading weights" bars, bitsandbytes' kernel warning and PEFT's FutureWarning at every step.
    noise = ("Loading weights", "Writing model shards", "it/s]", "No module named 'kernels'")
    noise += ("is_gradient_checkpointing",)
    for kind, root in trained_jobs.items():
        logs = {path.name: path.read_text() for path in (root / "logs").glob("*.log")}
        assert "train.log" in logs, kind
        assert {name: [n for n in noise if n in text] for name, text in logs.items()} == dict.fromkeys(logs, []), kind
