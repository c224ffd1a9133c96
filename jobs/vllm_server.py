"""The vLLM server of a job whose spec asks for `generation: {engine: vllm, vllm_mode: server}` without a URL.

The training task starts `trl vllm-serve` (TRL's own server, `python -m trl.scripts.vllm_serve`) on GPUs set aside
for it: the training child keeps the first `gpu_count` visible GPUs, the server gets the next
`tensor_parallel_size`. TRL's trainer then waits for the server (`vllm_server_timeout`) and pushes each step's
weights to it. No Prefect here and no torch: the task process only counts GPUs and starts processes.

    with vllm_server(spec, job) as env:   # {} for every other spec
        run_child("grpoflow.trainers.grpo", job, ..., env=env)
"""

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from grpoflow.core.errors import TrainingSetupError
from grpoflow.core.jobdir import JobDir
from grpoflow.trainers.child import VLLM_SERVER_URL_ENV, free_port, start_child, stop_child, visible_gpus
from grpoflow.trainers.model.load import start_model


def starts_server(spec) -> bool:
    """Whether this job's training task starts a vLLM server of its own."""
    generation = spec.generation
    return generation.engine == "vllm" and generation.vllm_mode == "server" and not generation.vllm_server_url


def split_gpus(spec, gpus: list[str]) -> tuple[list[str], list[str]]:
    """The training GPUs and the server's, or a setup error naming how many are needed."""
    training, serving = spec.gpu_count, spec.generation.tensor_parallel_size
    if len(gpus) < training + serving:
        raise TrainingSetupError(
            f"grpoflow: generation.vllm_mode: server without vllm_server_url starts a vLLM server on GPUs set aside "
            f"for it: gpu_count + tensor_parallel_size = {training} + {serving} GPUs are needed, {len(gpus)} "
            "visible; give vllm_server_url, use vllm_mode: colocate, or lower gpu_count"
        )
    return gpus[:training], gpus[training : training + serving]


def server_command(spec, model_path: str, port: int) -> list[str]:
    """`trl vllm-serve` for the start model, on this machine's loopback."""
    generation = spec.generation
    return [
        sys.executable,
        "-m",
        "trl.scripts.vllm_serve",
        "--model",
        model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tensor_parallel_size",
        str(generation.tensor_parallel_size),
        "--gpu_memory_utilization",
        str(generation.gpu_memory_utilization),
    ]


@contextmanager
def vllm_server(spec, job: JobDir) -> Iterator[dict]:
    """Runs the job's vLLM server while the block runs; yields the environment the training child needs (its GPUs
    and the server's URL), `{}` when the spec starts no server."""
    if not starts_server(spec):
        yield {}
        return
    if importlib.util.find_spec("vllm") is None:
        raise TrainingSetupError(
            "grpoflow: generation.engine: vllm needs the vllm package: pip install 'grpoflow[vllm]'"
        )
    training, serving = split_gpus(spec, visible_gpus())
    port = free_port()
    server_env = {"CUDA_VISIBLE_DEVICES": ",".join(serving)}
    proc = start_child(server_command(spec, start_model(spec, job), port), job.logs / "vllm.log", server_env)
    try:
        yield {"CUDA_VISIBLE_DEVICES": ",".join(training), VLLM_SERVER_URL_ENV: f"http://127.0.0.1:{port}"}
    finally:
        stop_child(proc)
