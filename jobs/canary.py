"""The canary: one GRPO step at full length on this machine's devices, before the job's GPU hour is spent.

    grpoflow canary SPEC.yaml [--set k=v]... [--json]        # here; the pipeline runs it as a stage (tasks/canary.py)

It checks the installed stack against the known-bad pairs grpoflow ships (`compat.yaml` beside this file, each with
the issue it comes from), then runs the job's own GRPO child (`grpoflow.trainers.grpo`, so the model loads exactly as
the job's will: dtype, quantization, LoRA, sharding, gradient checkpointing) in a folder of its own on the dataset's
longest prompts, for one step whose every completion is forced to `max_response_length` tokens, with the job's batch
shape: the worst step of the run. It records the step's peak memory (CUDA: the allocator's peak; CPU: the child's
peak RSS), its seconds, the tokens it generated per second, and the run's training hours projected from the job's
step count, into `canary.json`:

    {"status": "passed"|"failed", "reason": str|null, "device": str, "versions": {...}, "peak_memory_gb": x,
     "device_memory_gb": y, "step_seconds": s, "tokens_per_second": t, "projected_training_hours": h}

Failed (the step does not fit `canary.device_memory_gb`, the child cannot run, a known-bad stack): the reason names
what to change, in the order of what it saves. Nothing of the canary's run is kept in the job folder but canary.json.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from grpoflow.trainers.child import CANARY_ENV, visible_gpus
from grpoflow.trainers.jobdir import JobDir, write_json_atomic
from grpoflow.trainers.spec import JobSpec, resolved_dict

COMPAT_TABLE = Path(__file__).with_name("compat.yaml")
CANARY_FILE = "canary.json"
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "vllm", "deepspeed", "bitsandbytes", "flash-attn")
GB = 1e9


class CanaryFailed(RuntimeError):
    """The canary's verdict: the job would not run here as specified. The message says what to change."""


def installed_versions() -> dict[str, str]:
    """The versions of the packages a job runs on (those installed), torch's CUDA build and the NVIDIA driver."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    if "torch" in found:
        import torch

        if torch.version.cuda:
            found["torch-cuda"] = torch.version.cuda
    if driver := _driver_version():
        found["nvidia-driver"] = driver
    return found


def _driver_version() -> str | None:
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else None


def known_bad(versions: dict[str, str], table: Path | None = None) -> list[str]:
    """The known-bad pairs among `versions` (in `table`, default the shipped one), each as one line: what, the issue
    it comes from, the fix."""
    found = []
    for entry in yaml.safe_load((table or COMPAT_TABLE).read_text()):
        if all(_matches(versions.get(name), spec) for name, spec in entry["when"].items()):
            pair = ", ".join(f"{name} {versions[name]}" for name in entry["when"])
            found.append(f"{pair}: {entry['issue']}; install {entry['fix']}")
    return found


def _matches(installed: str | None, specifier: str) -> bool:
    if installed is None:
        return False
    try:
        return Version(installed.split("+")[0]) in SpecifierSet(specifier)
    except InvalidVersion:
        return False


def device_memory_gb(spec: JobSpec) -> tuple[str, float]:
    """The device the step runs on and the memory it must fit in: the spec's `canary.device_memory_gb`, else the
    smallest visible GPU's total memory, else the memory available now."""
    import psutil

    wanted = spec.canary.device_memory_gb
    if spec.gpu_count >= 1 and visible_gpus():
        import torch

        if torch.cuda.is_available():
            sizes = [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
            return torch.cuda.get_device_name(0), wanted or min(sizes) / GB
    return "cpu", wanted or psutil.virtual_memory().available / GB


# --- the canary's own job folder: the longest prompts, one step forced to full length ---------------------------


def canary_spec(spec: JobSpec) -> dict:
    """The job's spec for the canary's step: the same model, batch shape and settings; one step, each completion
    `max_response_length` tokens long (generation's `min_new_tokens`), no held-out evaluation, no SFT."""
    data = resolved_dict(spec)
    hp = data["hyperparameters"]
    hp["max_steps"] = 1
    trl = data.setdefault("trl", {}) or {}
    kwargs = dict(trl.get("generation_kwargs") or {})
    key = "min_tokens" if spec.generation.engine == "vllm" else "min_new_tokens"
    kwargs[key] = hp["max_response_length"]
    data["trl"] = {**trl, "generation_kwargs": kwargs}
    data["evaluation"] = {**data.get("evaluation", {}), "every": 0}
    data["sft"] = {**data.get("sft", {}), "enabled": False}
    return data


def longest_prompts(dataset_dir: Path, column: str, count: int):
    """The `count` longest prompts of the ingested training split (by characters; a chat by its messages'), as a
    DatasetDict with that one split."""
    import datasets
    from datasets import DatasetDict, load_from_disk

    datasets.disable_progress_bars()  # a bar for a copy of a few rows

    train = load_from_disk(str(dataset_dir))["train"]
    lengths = [len(p) if isinstance(p, str) else sum(len(str(m.get("content", ""))) for m in p) for p in train[column]]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])[: max(count, 1)]
    return DatasetDict({"train": train.select(order)})


def prepare(spec: JobSpec, dataset_dir: Path, root: Path) -> JobDir:
    """A job folder for the canary's child under `root`: its spec and its dataset of the longest prompts."""
    job = JobDir(root / "canary")
    job.root.mkdir(parents=True)
    job.spec.write_text(yaml.safe_dump(canary_spec(spec), sort_keys=False))
    hp = spec.hyperparameters
    longest_prompts(dataset_dir, spec.dataset.prompt_column, hp.prompts_per_step * spec.processes).save_to_disk(
        str(job.dataset)
    )
    return job


# --- the run and the verdict ----------------------------------------------------------------------------------------


def run_canary(spec: JobSpec, dataset_dir: Path, out: Path | None = None) -> dict:
    """Runs the canary for `spec` on the ingested dataset in `dataset_dir`; returns canary.json's object (written to
    `out` when given). Never raises for a failed verdict: the object says it."""
    started = time.monotonic()
    versions = installed_versions()
    device, memory = device_memory_gb(spec)
    result = {"status": "passed", "reason": None, "device": device, "versions": versions}
    result |= {"peak_memory_gb": None, "device_memory_gb": round(memory, 3), "step_seconds": None}
    result |= {"tokens_per_second": None, "projected_training_hours": None}
    if bad := known_bad(versions):
        result |= {"status": "failed", "reason": "a known-bad stack: " + "; ".join(bad)}
    else:
        result |= _step(spec, dataset_dir, memory)
    result["canary_seconds"] = round(time.monotonic() - started, 2)
    if out is not None:
        write_json_atomic(out, result)
    return result


def _step(spec: JobSpec, dataset_dir: Path, memory: float) -> dict:
    """The measured step, and the verdict on it."""
    from grpoflow.jobs.launch import run_child

    with tempfile.TemporaryDirectory(prefix="grpoflow-canary-") as tmp:
        job = prepare(spec, dataset_dir, Path(tmp))
        try:
            run_child(
                "grpoflow.trainers.grpo", job, spec.gpu_count, "canary.log",
                result=job.training_result, strategy=spec.distributed.strategy, env={CANARY_ENV: "1"},
            )  # fmt: skip
        except Exception as exc:  # the child's own failure, named by launch: the verdict
            return {"status": "failed", "reason": f"the step did not run: {exc}"}
        measured = json.loads(job.training_result.read_text())
    return _verdict(spec, measured, memory)


def _verdict(spec: JobSpec, measured: dict, memory: float) -> dict:
    hp = spec.hyperparameters
    seconds = measured.get("train_runtime") or measured.get("train_seconds") or 0.0
    tokens = hp.prompts_per_step * hp.rollouts_per_prompt * hp.max_response_length
    peak = measured.get("peak_memory_gb")
    figures = {
        "peak_memory_gb": peak,
        "step_seconds": round(seconds, 3),
        "tokens_per_second": round(tokens / seconds, 1) if seconds else None,
        "projected_training_hours": round(seconds * hp.max_steps / 3600, 6),
    }
    if peak is not None and peak > memory:
        reason = f"the step needs {peak:.2f} GB at its peak, more than the {memory:.2f} GB it must fit in; " + advice(
            spec
        )
        return figures | {"status": "failed", "reason": reason}
    return figures | {"status": "passed", "reason": None}


def advice(spec: JobSpec) -> str:
    """What to change so the step fits, in the order of what it saves."""
    hp = spec.hyperparameters
    steps = [
        f"fewer hyperparameters.rollouts_per_prompt (now {hp.rollouts_per_prompt}) or prompts_per_step (now "
        f"{hp.prompts_per_step})",
        "trl: {gradient_checkpointing: true}",
        f"a smaller hyperparameters.max_response_length (now {hp.max_response_length})",
        "LoRA (hyperparameters.lora_rank)" if hp.lora_rank is None else "QLoRA (hyperparameters.load_in_4bit: true)",
        "a device with more memory, or distributed.strategy fsdp2/zero3 over several GPUs",
    ]
    return "try, in order: " + "; ".join(steps)


def summary_line(result: dict, spec: JobSpec) -> str:
    """canary.json in one line, for the terminal, the run's log and the state message."""
    if result["status"] != "passed":
        return f"canary failed: {result['reason']}"
    hours = result["projected_training_hours"]
    line = (
        f"canary passed on {result['device']}: peak {result['peak_memory_gb']} GB of {result['device_memory_gb']} GB, "
        f"a full-length step {result['step_seconds']} s ({result['tokens_per_second']} tokens/s); "
        f"{spec.hyperparameters.max_steps} steps project to {hours:.2f} h of training"
    )
    cap = spec.budget.max_training_hours
    if cap is not None and hours > cap:
        line += f", above budget.max_training_hours ({cap:g} h): training stops at the cap"
    return line


def wanted(spec: JobSpec) -> bool:
    """Whether the pipeline runs the canary stage: `canary.enabled` true, or auto with a GPU job or several
    machines."""
    enabled = spec.canary.enabled
    if enabled != "auto":
        return bool(enabled)
    return spec.distributed.num_machines > 1 or (spec.gpu_count >= 1 and bool(visible_gpus()))
