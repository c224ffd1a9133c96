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

(`"share"` too, when `grpoflow canary` here tried one machine's share of a job over several: `machine_share`.)

With `generation.vllm_mode: server` the server is checked before the step (`check_vllm_server`: its health
endpoint, then TRL's handshake, `VLLMClient.init_communicator`, where vllm and a GPU are), and the step's first
generation syncs the weights to it once, as the job's first step will. On several machines
(`distributed.num_machines` > 1) the step runs as the job's TrainJob shape (`grpoflow.cluster.canary.on_machines`
as `run_step`), whose nodes first meet in one collective across all ranks.

Failed (the step does not fit `canary.device_memory_gb`, the child cannot run, a known-bad stack, the vLLM server
does not answer, a rank cannot join): the reason names what to change, in the order of what it saves. Nothing of the
canary's run is kept in the job folder but canary.json and `logs/canary.log` (the step's log, then the verdict).
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from grpoflow.core.jobdir import JobDir, write_json_atomic
from grpoflow.core.spec import JobSpec, resolved_dict
from grpoflow.jobs.launch import run_child
from grpoflow.jobs.vllm_server import vllm_server
from grpoflow.trainers.child import CANARY_ENV, VLLM_SERVER_URL_ENV, visible_gpus

COMPAT_TABLE = Path(__file__).with_name("compat.yaml")
CANARY_FILE = "canary.json"
DEVICE_FILE = "canary-device.json"  # where a step run elsewhere (a TrainJob's rank 0) says its device and memory
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "vllm", "deepspeed", "bitsandbytes", "flash-attn")
GB = 1e9
VLLM_TIMEOUT_S = 240.0  # TRL's vllm_server_timeout default


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
    data["evaluation"] = {**data.get("evaluation", {}), "every": 0, "select": "last"}  # "best" needs every > 0
    data["sft"] = {**data.get("sft", {}), "enabled": False}
    return data


def machine_share(spec: JobSpec) -> tuple[dict, str | None]:
    """The canary's spec for a run here of a job over several machines, and what it measures: one machine's share of
    the step (`num_machines` 1, `prompts_per_step` divided among the machines, rounded up so that each prompt's
    group stays whole on this machine's processes). A spec on one machine comes back as `canary_spec`'s, with None.

    Raises:
        CanaryFailed: a job sharded across machines on one GPU each, whose share cannot be sharded here.
    """
    data, machines = canary_spec(spec), spec.distributed.num_machines
    if machines == 1:
        return data, None
    if spec.distributed.strategy != "ddp" and spec.gpu_count < 2:
        raise CanaryFailed(
            f"distributed.strategy {spec.distributed.strategy} shards this job across its {machines} machines' single "
            "GPUs: one machine cannot take its share here; the pipeline's canary stage tries it on the machines, as "
            "a TrainJob"
        )
    hp, prompts = data["hyperparameters"], spec.hyperparameters.prompts_per_step
    hp["prompts_per_step"] = -(-prompts // machines)
    data["distributed"] = {"strategy": spec.distributed.strategy, "num_machines": 1}
    each = hp["prompts_per_step"]
    exact = "" if prompts % machines == 0 else f" ({each} prompts for its {prompts}/{machines}: groups kept whole)"
    share = (
        f"one machine's share of the job's {machines}{exact}: its memory and step time, without the collective across "
        "machines, which the pipeline's canary stage tries as a TrainJob"
    )
    return data, share


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


def prepare(spec: JobSpec, dataset_dir: Path, root: Path, data: dict | None = None) -> JobDir:
    """A job folder for the canary's child under `root`: its spec (`data`, default `canary_spec`'s) and its dataset
    of the longest prompts."""
    job = JobDir(root / "canary")
    job.root.mkdir(parents=True)
    job.spec.write_text(yaml.safe_dump(data or canary_spec(spec), sort_keys=False))
    hp = spec.hyperparameters
    longest_prompts(dataset_dir, spec.dataset.prompt_column, hp.prompts_per_step * spec.processes).save_to_disk(
        str(job.dataset)
    )
    return job


# --- the run and the verdict ----------------------------------------------------------------------------------------


def run_canary(
    spec: JobSpec,
    dataset_dir: Path,
    out: Path | None = None,
    run_step: Callable[[JobSpec, JobDir], None] | None = None,
    scratch: Path | None = None,
    log: Path | None = None,
) -> dict:
    """Runs the canary for `spec` on the ingested dataset in `dataset_dir`; returns canary.json's object. Never raises
    for a failed verdict: the object says it.

    Args:
        spec (`JobSpec`): the job's spec.
        dataset_dir (`Path`): the ingested dataset.
        out (`Path`, *optional*): where to write canary.json.
        run_step (`Callable`, *optional*): runs the step's child on the canary's folder (default: here, as the
            training stage's one-machine child); `grpoflow.cluster.canary.on_machines` runs it as a TrainJob.
        scratch (`Path`, *optional*): the folder the canary's own folder is made (and removed) in; the nodes of a
            TrainJob see it there (the job folder, on the shared volume). Default: the system's temporary folder.
        log (`Path`, *optional*): where the step's log is kept (the job's `logs/canary.log`), its last line the
            verdict. Default: a temporary file, kept only when the step failed (its reason names it).

    Run here (no `run_step`) for a job over several machines, the step is one machine's share (`machine_share`):
    canary.json's `share` says so.
    """
    started = time.monotonic()
    versions = installed_versions()
    device, memory = device_memory_gb(spec)
    result = {"status": "passed", "reason": None, "device": device, "versions": versions}
    result |= {"peak_memory_gb": None, "device_memory_gb": round(memory, 3), "step_seconds": None}
    result |= {"tokens_per_second": None, "projected_training_hours": None}
    if bad := known_bad(versions):
        result |= {"status": "failed", "reason": "a known-bad stack: " + "; ".join(bad)}
    else:
        result |= _step(spec, dataset_dir, memory, run_step, scratch, log)
    result["canary_seconds"] = round(time.monotonic() - started, 2)
    if out is not None:
        write_json_atomic(out, result)
    if log is not None:
        _log_verdict(log, result)
    return result


def run_here(spec: JobSpec, job: JobDir) -> None:
    """The canary's step on this machine's devices: the job's GRPO child, as the training stage starts it (with the
    vLLM server it starts, and that server checked first)."""
    with vllm_server(spec, job) as env:
        if spec.generation.engine == "vllm" and spec.generation.vllm_mode == "server":
            check_vllm_server(spec.generation.vllm_server_url or env[VLLM_SERVER_URL_ENV], vllm_timeout(spec), env)
        run_child(
            "grpoflow.trainers.grpo", job, spec.gpu_count, "canary.log",
            result=job.training_result, strategy=spec.distributed.strategy, env={**env, CANARY_ENV: "1"},
        )  # fmt: skip


# --- the vLLM server (generation.vllm_mode: server): its health, TRL's handshake; the step then syncs weights once ---


def vllm_timeout(spec: JobSpec) -> float:
    """The seconds the server may take to answer: TRL's `vllm_server_timeout` (the job's, else TRL's 240)."""
    return float(spec.trl.get("vllm_server_timeout") or VLLM_TIMEOUT_S)


def check_vllm_server(url: str, timeout: float, env: dict | None = None) -> str:
    """Checks the job's vLLM server before the step: its health endpoint (`GET /health`, as TRL's `VLLMClient` asks
    it) answers 200 within `timeout` seconds, then, where vllm and a GPU are here, TRL's handshake
    (`VLLMClient.init_communicator`, the NCCL group weights are synced through) in a process of its own on the
    training GPU (`env`'s CUDA_VISIBLE_DEVICES). The step's first generation then syncs the weights once through it,
    as the job's first step will. Returns a line saying what was checked.

    Raises:
        `CanaryFailed`: the server did not answer, or the handshake failed, naming the server.
    """
    _health(url, timeout)
    if importlib.util.find_spec("vllm") is None or not visible_gpus():
        return f"vLLM server at {url}: healthy; TRL's handshake not tried (no vllm or no GPU here)"
    _handshake_in_own_process(url, timeout, env or {})
    return f"vLLM server at {url}: healthy; TRL's handshake (init_communicator) done"


def _health(url: str, timeout: float) -> None:
    health, deadline, why = url.rstrip("/") + "/health", time.monotonic() + timeout, "no answer"
    while True:
        try:
            with urllib.request.urlopen(health, timeout=max(1.0, min(10.0, timeout))) as response:
                if response.status == 200:
                    return
                why = f"HTTP {response.status}"
        except urllib.error.HTTPError as e:
            why = f"HTTP {e.code}"
        except (OSError, ValueError) as e:
            why = str(getattr(e, "reason", e))
        if time.monotonic() >= deadline:
            raise CanaryFailed(
                f"the vLLM server at {url} did not answer its health check (GET {health}) within {timeout:.0f} s "
                f"({why}): start it (trl vllm-serve), fix generation.vllm_server_url, or give it longer with trl: "
                "{vllm_server_timeout: SECONDS}"
            )
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))


def _handshake_in_own_process(url: str, timeout: float, env: dict) -> None:
    """TRL's `init_communicator` in a spawned process, so that its CUDA context does not stay on the training GPU;
    one that hangs (an NCCL rendezvous the server never joins) is stopped after `timeout` seconds."""
    context = multiprocessing.get_context("spawn")
    errors = context.Queue()
    process = context.Process(target=_handshake, args=(url, timeout, env, errors), daemon=True)
    process.start()
    limit = timeout + 60  # the client's own wait for the server, then the NCCL rendezvous
    process.join(limit)
    if process.is_alive():
        process.terminate()
        raise CanaryFailed(
            f"TRL's handshake with the vLLM server at {url} (init_communicator) did not finish within {limit:.0f} s: "
            "may this machine and the server reach each other on TRL's group port (51216) for NCCL?"
        )
    if process.exitcode != 0:
        why = errors.get() if not errors.empty() else f"exit code {process.exitcode}"
        raise CanaryFailed(f"TRL's handshake with the vLLM server at {url} (init_communicator) failed: {why}")


def _handshake(url: str, timeout: float, env: dict, errors) -> None:
    os.environ.update({k: v for k, v in env.items() if k == "CUDA_VISIBLE_DEVICES"})
    try:
        from trl.generation.vllm_client import VLLMClient

        client = VLLMClient(base_url=url, connection_timeout=timeout)
        client.init_communicator(device=0)
        client.close_communicator()
    except Exception as e:
        errors.put(f"{type(e).__name__}: {e}")
        raise SystemExit(1) from e


def _step(spec: JobSpec, dataset_dir: Path, memory: float, run_step, scratch: Path | None, log: Path | None) -> dict:
    """The measured step (here: for a job over several machines, one machine's share), and the verdict on it."""
    try:
        data, share = machine_share(spec) if run_step is None else (canary_spec(spec), None)
    except CanaryFailed as exc:
        return {"status": "failed", "reason": str(exc)}
    said = {"share": share} if share else {}
    return said | _measured(spec, data, dataset_dir, memory, run_step or run_here, scratch, log)


def _measured(
    spec: JobSpec, data: dict, dataset_dir: Path, memory: float, run_step, scratch: Path | None, log: Path | None
) -> dict:
    """The step of the canary's spec `data`, measured, and the verdict on it (its advice in `spec`'s terms)."""
    with tempfile.TemporaryDirectory(prefix="grpoflow-canary-", dir=scratch) as tmp:
        job = prepare(spec, dataset_dir, Path(tmp), data)
        try:
            run_step(spec, job)
        except CanaryFailed as exc:  # a check before the step (the vLLM server) said why itself
            return {"status": "failed", "reason": str(exc)}
        except Exception as exc:  # the child's own failure (or a rank's), named by launch: the verdict
            reason = getattr(exc, "ended", str(exc)).removeprefix("grpoflow: ")
            if kept := _keep_log(job.logs / "canary.log", log, failed=True):  # the canary's folder goes: not its log
                child_log = str(job.logs / "canary.log")
                reason = reason.replace(child_log, str(kept)) if child_log in reason else f"{reason}; its log: {kept}"
            return {"status": "failed", "reason": f"the step did not run: {reason}"}
        _keep_log(job.logs / "canary.log", log, failed=False)
        measured = json.loads(job.training_result.read_text()) | _step_time(job)
        elsewhere = job.root / DEVICE_FILE  # the step ran on other machines: their device, their memory
        device = json.loads(elsewhere.read_text()) if elsewhere.exists() else {}
    memory = spec.canary.device_memory_gb or device.get("device_memory_gb") or memory
    figures = {"device": device["device"], "device_memory_gb": round(memory, 3)} if device else {}
    return figures | _verdict(spec, measured, memory, data["hyperparameters"]["prompts_per_step"])


def _keep_log(child_log: Path, log: Path | None, failed: bool) -> Path | None:
    """Copies the step's log out of the canary's folder (removed after the step) to `log`, or, when the step failed
    and no `log` is given, to a temporary file; returns where it went."""
    if not child_log.exists() or (log is None and not failed):
        return None
    if log is None:
        fd, name = tempfile.mkstemp(prefix="grpoflow-canary-", suffix=".log")
        os.close(fd)
        log = Path(name)
    log.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(child_log, log)
    return log


def _log_verdict(log: Path, result: dict) -> None:
    """Ends `log` with the verdict, so that the log of a refused job says why on its own (a known-bad stack, or a check
    before the step, ran no child: the verdict is then its only line)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    reason = f": {result['reason']}" if result["reason"] else ""
    with log.open("a") as f:
        f.write(f"grpoflow canary: {result['status']}{reason}\n")


def _step_time(job: JobDir) -> dict:
    """TRL's own `step_time` of the canary's step (its metrics.jsonl line), when it logged one."""
    from grpoflow.trainers.metrics import read_metrics

    records = read_metrics(job.metrics)
    step_time = records[-1]["values"].get("step_time") if records else None
    return {"step_time": step_time} if step_time else {}


def _verdict(spec: JobSpec, measured: dict, memory: float, prompts: int) -> dict:
    """The step's figures and whether it fits; `prompts` is the step's own `prompts_per_step` (a machine's share)."""
    hp = spec.hyperparameters
    runtime = measured.get("train_runtime") or measured.get("train_seconds") or 0.0
    # The step alone (TRL's step_time); what train() spent around it (its setup) a run spends once, not per step.
    seconds = min(measured.get("step_time") or runtime, runtime or float("inf"))
    tokens = prompts * hp.rollouts_per_prompt * hp.max_response_length
    peak = measured.get("peak_memory_gb")
    figures = {
        "peak_memory_gb": peak,
        "step_seconds": round(seconds, 3),
        "tokens_per_second": round(tokens / seconds, 1) if seconds else None,
        "projected_training_hours": round((runtime - seconds + seconds * hp.max_steps) / 3600, 6),
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
        "trl: {activation_checkpointing: true}",
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
        f"{spec.hyperparameters.max_steps} steps project to {_seconds(hours * 3600)} of training"
    )
    if share := result.get("share"):
        line += f"; measured: {share}"
    cap = spec.budget.max_training_hours
    if cap is not None and hours > cap:
        line += f", above budget.max_training_hours ({cap:g} h): training stops at the cap"
    return line


def projection_line(job: JobDir) -> str | None:
    """The passed canary's projection beside the training time the run took, in one line (the report's summary and
    the flow run's final state message); None where no canary passed in `job`."""
    canary, trained = _read_json(job.root / CANARY_FILE), _read_json(job.training_result)
    projected, took = canary.get("projected_training_hours"), trained.get("train_runtime")
    if canary.get("status") != "passed" or not _is_number(projected):
        return None  # no canary ran or it failed; or a file someone edited: the end of the job says nothing of it
    projected *= 3600
    line = (
        f"the canary projected {_seconds(projected)} of training (its full-length step {canary.get('step_seconds')} s"
    )
    line += f", peak {canary.get('peak_memory_gb')} GB)"
    if _is_number(took) and took > 0:
        line += f"; training took {_seconds(took)}" + (f" ({took / projected:.2f}x)" if projected else "")
    return line


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value and abs(value) < 1e12


def _seconds(seconds: float) -> str:
    """`0.4 s`, `42 s`, `12.5 min` or `3.2 h`."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def wanted(spec: JobSpec) -> bool:
    """Whether the pipeline runs the canary stage: `canary.enabled` true, or auto with a GPU job or several
    machines."""
    enabled = spec.canary.enabled
    if enabled != "auto":
        return bool(enabled)
    return spec.distributed.num_machines > 1 or (spec.gpu_count >= 1 and bool(visible_gpus()))
