"""Merge stage: folds a LoRA adapter into its base model with PEFT (`merge_and_unload`) and writes `model.json`.

    python -m grpoflow.trainers.model.merge runs/<job_id>

The base is loaded unquantized even for QLoRA jobs, so `merged/` holds ordinary 16/32-bit weights that load with
`AutoModelForCausalLM.from_pretrained`. A full fine-tune already saved `merged/`; only `model.json` is written.
"""

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from grpoflow.core.jobdir import JobDir, parent_of, replace_dir, write_json_atomic


def list_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def merge_adapter(
    adapter_dir: Path, out_dir: Path, dtype=None, say: Callable[[str], None] = lambda text: None
) -> None:
    """Loads the adapter's base model, merges the adapter into it and saves the result with the tokenizer.

    Args:
        adapter_dir (`Path`): a PEFT adapter folder (adapter_config.json names the base model).
        out_dir (`Path`): where the merged model goes; written beside it first and renamed into place.
        dtype (`torch.dtype`, *optional*): dtype to load the base in; defaults to the trainer's dtype.
        say (`Callable[[str], None]`, *optional*): gets each phase as it starts (default: print).
    """
    from grpoflow.trainers.model.load import quiet_progress_bars, weights_size

    quiet_progress_bars()
    base = json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    say(f"loading the base model {base} ({weights_size(base)}) with {adapter_dir.name}/")
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    from grpoflow.trainers.model.load import torch_dtype

    model = AutoPeftModelForCausalLM.from_pretrained(str(adapter_dir), dtype=dtype or torch_dtype())
    say("folding the adapter into the weights")
    merged = model.merge_and_unload()
    staging = out_dir.parent / f".{out_dir.name}-staging"
    shutil.rmtree(staging, ignore_errors=True)
    say(f"writing {out_dir.name}/")
    merged.save_pretrained(str(staging))
    AutoTokenizer.from_pretrained(str(adapter_dir)).save_pretrained(str(staging))
    replace_dir(staging, out_dir)


def save_start_model(start: str, out_dir: Path) -> None:
    """Writes the model GRPO started from into `out_dir` as merged/ holds any model (weights and tokenizer): what a
    job keeps when no checkpoint beat the start on the held-out metric (`evaluation.select: best`).

    Args:
        start (`str`): the start model's folder or Hub id (the SFT output, or the base model).
        out_dir (`Path`): where it goes; written beside it first and renamed into place.
    """
    from transformers import AutoModelForCausalLM

    from grpoflow.trainers.model.load import load_tokenizer, quiet_progress_bars, torch_dtype

    quiet_progress_bars()
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch_dtype())
    staging = out_dir.parent / f".{out_dir.name}-staging"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(str(staging))
    load_tokenizer(start).save_pretrained(str(staging))
    replace_dir(staging, out_dir)


def write_model_json(job: JobDir) -> dict:
    """Describes the trained artifact as the job folder's model.json: adapter or full, the files of each, and for a
    job that started from an earlier job's merged model, that job's id (`parent`, read from spec.yaml's base_model)."""
    is_adapter = (job.adapter / "adapter_config.json").exists()
    info = {
        "artifact_type": "adapter" if is_adapter else "full",
        "files": list_files(job.adapter if is_adapter else job.merged),
        "merged_files": list_files(job.merged),
    }
    spec = yaml.safe_load(job.spec.read_text()) if job.spec.is_file() else None
    if parent := parent_of((spec or {}).get("base_model")):
        info["parent"] = parent
    write_json_atomic(job.model_json, info)
    return info


def main(job_root: str) -> int:
    job = JobDir(Path(job_root))
    if (job.adapter / "adapter_config.json").exists():
        merge_adapter(job.adapter, job.merged)
    write_model_json(job)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir")
    sys.exit(main(parser.parse_args().job_dir))
