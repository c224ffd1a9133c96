"""Benchmark 6 (needs CUDA): grpoflow's training stage against a plain TRL script on a real-size model, full
fine-tune, LoRA and QLoRA (steps/s, tokens/s, peak GPU memory), and TRL's two transformers generation engines
(plain `generate` against continuous batching, the `paged` engine): generated tokens/s.

    python -m benchmarks.gpu [--quick] [--allow-cpu] [--json PATH] [--modes full,lora,qlora] [--steps N]
                             [--repeats N] [--budget-s S]

The model has Qwen2-0.5B's shape (24 layers, hidden 896, 14 heads / 2 KV heads, MLP 4864, vocabulary 151,936),
built from its config with random weights in bf16, so nothing is downloaded; the tokenizer is builtin:tiny's
byte-level one (ids it does not know decode to nothing, which the reward tolerates). The workload is the
`long-prompt` shape (~270-token prompts) with 64-token completions, K = 8, no zero-variance groups.

Training: as benchmark 1's first part, both sides run in this process, alternating (grpoflow's
`grpoflow.trainers.grpo.main` on a job folder prepared as the pipeline prepares it, and `benchmarks.bare_trl`), after a
discarded one-step run of each; grpoflow runs without a checkpoint within the run, like the script. steps/s is TRL's
own train_runtime on each side, tokens/s TRL's count of prompt and completion tokens over it, and peak GPU memory
`torch.cuda.max_memory_allocated` during the run less what was allocated before it started (the model's weights
count, as they load inside the run).

Generation: `trl.GRPOTrainer` with the same GRPOConfig, `use_transformers_continuous_batching` off
(`transformers`: `model.generate` on the padded group) and on (`paged`: `generate_batch`, transformers' continuous
batching over a paged KV cache), timing every `_generate_single_turn` call of a short run and counting the tokens it
returns; the first call of each run (cache allocation, warm-up) is left out.

Sized for one H200 in about 5 minutes (full: 2 repeats per side, LoRA and QLoRA: 1, 8 steps each). `--budget-s`
skips what would not end in time (named in the JSON's `skipped`), and the JSON is rewritten after each part, so a
run stopped from outside keeps what it measured. QLoRA needs bitsandbytes and CUDA; without them it is skipped and
says so. `--quick` builds a 4-layer model of the same width and runs 2 steps once per side; `--allow-cpu` checks the
script on a CPU (2 layers of a tiny width, fp32, 8-token completions); `--smoke` is both, about a minute on a CPU.
"""

import gc
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import alternate, finish, markdown_table, median, output_to, parser
from benchmarks.trainer_vs_trl import (
    NO_CHECKPOINTS,
    Workload,
    prepare_job,
    run_bare,
    run_project,
    shaped_workload,
    summarize,
)

QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
    vocab_size=151936,
)
# mode: (lora_rank, load_in_4bit, learning_rate, runs per side)
MODES = {"full": (None, False, 1e-6, 2), "lora": (16, False, 2e-5, 1), "qlora": (16, True, 2e-5, 1)}
ENGINES = {"transformers": False, "paged": True}  # engine: use_transformers_continuous_batching
TARGET_RATIO = 0.97
COMPLETION_LENGTH = 64


def model_shape(layers: int, cpu_check: bool) -> dict:
    """Qwen2-0.5B's shape with `layers` layers; on a CPU check, a tiny width and builtin:tiny's vocabulary."""
    shape = {**QWEN2_05B, "num_hidden_layers": layers}
    if cpu_check:  # only checks that the script works; a 0.5B model would take hours on a CPU
        shape |= {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 261}
    return shape


def build_model(path: Path, shape: dict, cpu_check: bool) -> Path:
    """A Qwen2 of `shape` with random weights (bf16 on a GPU), saved with builtin:tiny's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    from grpoflow.trainers.model.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    if cpu_check:
        shape = {**shape, "vocab_size": len(tokenizer)}
    config = Qwen2Config(
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **shape
    )
    torch.manual_seed(0)
    dtype = torch.float32 if cpu_check else torch.bfloat16
    with torch.device("cpu" if cpu_check else "cuda"):  # 0.5B random weights: seconds on the GPU, not on the CPU
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def with_peak_gpu(run) -> dict:
    """Calls `run()` and adds `peak_gpu_mb` to its result: the most GPU memory allocated during it, less what was
    allocated before it (what earlier runs in this process left), in MiB."""
    import torch

    gc.collect()
    if not torch.cuda.is_available():
        return run()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = run()
    result["peak_gpu_mb"] = (torch.cuda.max_memory_allocated() - before) / 2**20
    gc.collect()
    torch.cuda.empty_cache()
    return result


class Budget:
    """Says whether a part of `runs` runs still ends before the deadline, from the longest run seen so far."""

    def __init__(self, seconds: float | None):
        self.deadline = time.monotonic() + seconds if seconds else None
        self.longest_run_s = 0.0

    def allows(self, runs: int) -> bool:
        return self.deadline is None or time.monotonic() + runs * self.longest_run_s < self.deadline

    def timed(self, run):
        def wrapper(*args):
            started = time.monotonic()
            try:
                return run(*args)
            finally:
                self.longest_run_s = max(self.longest_run_s, time.monotonic() - started)

        return wrapper


# --- training: grpoflow against the TRL script -----------------------------------------------------------------------


def mode_workload(mode: str, root: Path, model: Path, steps: int, length: int, name: str | None = None) -> Workload:
    rank, four_bit, lr, _ = MODES[mode]
    w = shaped_workload(
        name or f"gpu-{mode}", "long-prompt", root, steps, 0.0, model=str(model), lora_rank=rank,
        load_in_4bit=four_bit, learning_rate=lr, checkpoint_every=NO_CHECKPOINTS["checkpoint_every"],
    )  # fmt: skip
    w.max_response_length = length
    return w


def compare_training(w: Workload, root: Path, repeats: int, budget: Budget) -> dict:
    """Both sides in this process, alternating, each run with its peak GPU memory; `summarize`'s figures."""
    template = prepare_job(w, root)
    log = root / f"{w.name}.log"

    def grpoflow(i):
        with output_to(log):
            return with_peak_gpu(lambda: run_project(template, root, f"{w.name}-grpoflow-{i}", None))

    def trl(i):
        with output_to(log):
            return with_peak_gpu(lambda: run_bare(w, root, f"{w.name}-trl-{i}", None))

    return summarize(alternate({"trl": budget.timed(trl), "grpoflow": budget.timed(grpoflow)}, repeats))


# --- generation: TRL's transformers engines --------------------------------------------------------------------------


def generation_speed(model: Path, dataset: Path, out: Path, paged: bool, steps: int, length: int) -> dict:
    """A `steps`-step TRL run with `use_transformers_continuous_batching=paged`, timing each generation call."""
    import torch
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.workloads import graded_variety_reward
    from grpoflow.trainers.grpo import paged_cache_blocks

    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.padding_side = "left"
    bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    # On a CPU (the smoke), the paged cache sized as grpoflow sizes it there (trainers/grpo.py's paged_cache_default,
    # 8 completions of prompts up to 1024 tokens): unsized, each step allocates half the RAM
    cpu_cache = None if torch.cuda.is_available() else {"num_blocks": paged_cache_blocks(8, 1024, length)}
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=steps,
        num_generations=8,
        per_device_train_batch_size=8,
        max_completion_length=length,
        beta=0.0,
        seed=42,
        bf16=bf16,
        model_init_kwargs={"dtype": torch.bfloat16 if bf16 else torch.float32},
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        use_transformers_continuous_batching=paged,
        transformers_continuous_batching_config=cpu_cache,
    )
    dataset = load_dataset("json", data_files=str(dataset), split="train")
    trainer = GRPOTrainer(
        model=str(model), reward_funcs=graded_variety_reward, args=args, train_dataset=dataset,
        processing_class=tokenizer,
    )  # fmt: skip
    calls, generate = [], trainer._generate_single_turn

    def timed(*a, **kw):
        started = time.perf_counter()
        completion_ids, logprobs = generate(*a, **kw)  # token lists: the device work is done
        calls.append((time.perf_counter() - started, sum(len(c) for c in completion_ids)))
        return completion_ids, logprobs

    trainer._generate_single_turn = timed
    trainer.train()
    measured = calls[1:] or calls
    seconds, tokens = sum(c[0] for c in measured), sum(c[1] for c in measured)
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds, "calls_timed": len(measured)}


def compare_generation(model: Path, root: Path, steps: int, length: int, budget: Budget) -> dict:
    dataset = shaped_workload("gpu-generation", "long-prompt", root, steps, 0.0).dataset
    log = root / "generation.log"
    sides = {
        engine: budget.timed(
            lambda i, e=engine, paged=paged: _logged(
                log,
                lambda: with_peak_gpu(
                    lambda: generation_speed(model, dataset, root / f"gen-{e}-{i}", paged, steps, length)
                ),
            )
        )
        for engine, paged in ENGINES.items()
    }
    runs = alternate(sides, 1)
    engines = {e: {k: median(r.get(k) for r in rs) for k in ("tokens_per_s", "peak_gpu_mb")} for e, rs in runs.items()}
    ratio = engines["paged"]["tokens_per_s"] / engines["transformers"]["tokens_per_s"]
    return {"engines": engines, "paged_vs_transformers": ratio, "runs": runs}


def _logged(log: Path, run):
    with output_to(log):
        return run()


# --- the run ---------------------------------------------------------------------------------------------------------


def unavailable(mode: str) -> str | None:
    """Why `mode` cannot run here, or None."""
    import torch

    if mode == "qlora" and not torch.cuda.is_available():
        return "needs CUDA (bitsandbytes' 4-bit kernels)"
    if mode == "qlora" and importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed"
    return None


def training_rows(results: dict) -> list[list]:
    rows = []
    full_peak = results.get("full", {}).get("sides", {}).get("grpoflow", {}).get("peak_gpu_mb")
    for mode, result in results.items():
        g, t = result["sides"]["grpoflow"], result["sides"]["trl"]
        for name, s in (("trl.GRPOTrainer script", t), ("grpoflow training stage", g)):
            vs_full = s["peak_gpu_mb"] / full_peak if full_peak and s.get("peak_gpu_mb") else None
            rows.append(
                [mode, name, s["steps_per_s"], s["tokens_per_s"], s.get("steps_per_s_ratio", 1.0),
                 s.get("peak_gpu_mb"), vs_full, s.get("same_weights_as_trl", "")]
            )  # fmt: skip
    return rows


def tables(data: dict) -> str:
    text = markdown_table(
        ["mode", "side", "steps/s", "tokens/s", f"steps/s vs TRL (target >= {TARGET_RATIO})", "peak GPU MiB",
         "peak vs full", "same weights as TRL"],
        training_rows(data["modes"]),
    )  # fmt: skip
    generation = data.get("generation")
    if generation:
        rows = [[e, s["tokens_per_s"], s["peak_gpu_mb"]] for e, s in generation["engines"].items()]
        rows.append(["paged / transformers", generation["paged_vs_transformers"], None])
        text += "\n\n" + markdown_table(["generation engine", "generated tokens/s", "peak GPU MiB"], rows)
    if data["skipped"]:
        text += "\n\nSkipped: " + "; ".join(f"{part}: {why}" for part, why in data["skipped"].items()) + "."
    return text


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--modes", default="full,lora,qlora", help="comma-separated: full, lora, qlora")
    p.add_argument("--steps", type=int, help="training steps per run (default 8; 2 with --quick)")
    p.add_argument("--repeats", type=int, help="runs per side (default: full 2, LoRA and QLoRA 1; 1 with --quick)")
    p.add_argument("--budget-s", type=float, help="skip the parts that would end after this many seconds")
    p.add_argument("--no-generation", action="store_true", help="leave out the generation engines' comparison")
    p.add_argument("--allow-cpu", action="store_true", help="check the script on a CPU (tiny width, fp32, no QLoRA)")
    p.add_argument("--smoke", action="store_true", help="--quick --allow-cpu: the CPU check of the code path")
    args = p.parse_args(argv)
    args.quick, args.allow_cpu = args.quick or args.smoke, args.allow_cpu or args.smoke
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        sys.exit("benchmarks.gpu needs a CUDA GPU (none is visible); --allow-cpu checks the script on a CPU")
    budget = Budget(args.budget_s)
    steps = args.steps or (2 if args.quick else 8)
    cpu_check = not torch.cuda.is_available()
    layers = 2 if cpu_check else 4 if args.quick else 24
    shape, length = model_shape(layers, cpu_check), 8 if cpu_check else COMPLETION_LENGTH
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    data = {
        "model_shape": shape,
        "cpu_check": cpu_check,
        "steps": steps,
        "K": 8,
        "max_response_length": length,
        "target_ratio": TARGET_RATIO,
        "modes": {},
        "skipped": {},
    }
    path = args.json or Path(__file__).parent / "results" / "gpu.json"
    with tempfile.TemporaryDirectory(prefix="grpoflow-bench-gpu-") as tmp:
        root = Path(tmp)
        model = build_model(root / "qwen2-0.5b-shape", shape, cpu_check)
        # One-off costs (CUDA context, kernels' first launch, imports) on discarded one-step runs of each side; the
        # CPU smoke (--smoke) measures nothing, and skips them.
        if not (args.quick and cpu_check):
            compare_training(mode_workload("full", root, model, 1, length, "gpu-warm-up"), root, 1, budget)
        for mode in modes:
            repeats = args.repeats or (1 if args.quick else MODES[mode][3])
            why = unavailable(mode) or (None if budget.allows(2 * repeats) else "over the time budget")
            if why:
                data["skipped"][mode] = why
                continue
            w = mode_workload(mode, root, model, steps, length)
            data["modes"][mode] = compare_training(w, root, repeats, budget)
            write_partial(path, data)
        if args.no_generation:
            pass
        elif budget.allows(2):
            # the CPU smoke generates 2 batches (paged generation on a CPU is slow); a GPU run at least 3
            gen_steps = 2 if cpu_check else max(steps // 2, 3)
            data["generation"] = compare_generation(model, root, gen_steps, length, budget)
        else:
            data["skipped"]["generation"] = "over the time budget"
    full = data["modes"].get("full", {}).get("sides", {}).get("grpoflow", {})
    data["target_met"] = None if not full else full["steps_per_s_ratio"] >= TARGET_RATIO
    table = tables(data)
    result = finish("gpu", args, table, data)
    path.with_suffix(".md").write_text(table + "\n")
    return result


def write_partial(path: Path, data: dict) -> None:
    """What was measured so far, in case the run is stopped before `finish` writes the whole JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "gpu", "partial": True, **data, "table": tables(data)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
