"""Benchmark: grpoflow's training stage against a plain `trl.GRPOTrainer` script on a real model, side by side.

    python -m benchmarks.real_vs_trl [--quick] [--gguf PATH] [--repeats N] [--json PATH]

`benchmarks.trainer_vs_trl` on SmolLM2-135M-Instruct, the GGUF file `make demo-real` trains (`make
models/SmolLM2-135M-Instruct.Q4_1.gguf` puts it in models/), with LoRA: the same job on both sides (the demo's
prompts, 4 rollouts of up to 8 tokens, rank 8, learning rate, seed), no checkpoint within the run on either side,
in this process, alternating (A B, B A, ...), after one discarded warm-up step of each. grpoflow's spec names the GGUF
file, as a user's does; the script loads the folder grpoflow converted it to (`resolve_model_path`), so both train the
very same weights, and the trained adapters' checksums must match. The figure is the median of the per-pair ratios of
steps per CPU second inside `Trainer.train` (`train_cpu_seconds`): the tiny model's benchmark exposes a fixed cost per
step; this one says what it is worth on a model whose step is seconds, not 70 ms. Small on purpose (a pair is one to
two minutes on 2 CPU cores): a few steps, short completions.
"""

import tempfile
from dataclasses import replace
from pathlib import Path

from benchmarks.common import REPO_ROOT, finish, markdown_table, parser, pin_threads
from benchmarks.trainer_vs_trl import NO_CHECKPOINTS, compare, shaped_workload, with_range

GGUF = REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_RATIO = 0.99
STEPS, REPEATS = 4, 5


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--gguf", type=Path, default=GGUF, help=f"the SmolLM2 GGUF file (default {GGUF})")
    p.add_argument("--repeats", type=int, help=f"pairs (default {REPEATS}; 1 with --quick)")
    args = p.parse_args(argv)
    if not args.gguf.is_file():
        raise SystemExit(f"{args.gguf}: no such file; `make {GGUF.relative_to(REPO_ROOT)}` downloads it")
    pin_threads()
    steps, repeats = (2, 1) if args.quick else (STEPS, args.repeats or REPEATS)
    side = "grpoflow"  # LoRA, no checkpoint within the run (a longer name makes too long a job name)
    with tempfile.TemporaryDirectory(prefix="grpoflow-bench-real-") as tmp:
        root = Path(tmp)
        w = replace(
            shaped_workload("smollm2-lora", "demo-shaped", root, steps, zero_variance_share=0.0, model=str(args.gguf)),
            rollouts_per_prompt=4, max_response_length=8, lora_rank=8, **NO_CHECKPOINTS,
        )  # fmt: skip
        result = compare(w, root, repeats, variants={side: {}})
    s, t = result["sides"][side], result["sides"]["trl"]
    ratio = s["cpu_steps_per_s_ratio"]
    table = markdown_table(
        ["side", "steps per CPU-s", "ratio vs TRL (CPU) [range of pairs]", "steps/s (wall)", "ratio vs TRL (wall)",
         "target", "same weights as TRL"],
        [
            ["trl.GRPOTrainer script", t["cpu_steps_per_s"], 1.0, t["steps_per_s"], 1.0, "", ""],
            ["grpoflow (LoRA, no checkpoint within the run)", s["cpu_steps_per_s"],
             with_range(ratio, s["cpu_steps_per_s_ratio_range"]), s["steps_per_s"],
             with_range(s["steps_per_s_ratio"], s["steps_per_s_ratio_range"]), f">= {TARGET_RATIO}",
             s["same_weights_as_trl"]],
        ],
    )  # fmt: skip
    table += f"\n\nSmolLM2-135M-Instruct (GGUF Q4_1), LoRA rank 8, K=4, 8 tokens, {steps} steps, {repeats} pairs."
    return finish(
        "real_vs_trl",
        args,
        table,
        {
            "workload": {"model": "SmolLM2-135M-Instruct", "K": 4, "max_response_length": 8, "lora_rank": 8},
            "steps": steps,
            "repeats": repeats,
            "target_ratio": TARGET_RATIO,
            "target_met": ratio >= TARGET_RATIO,
            "in_process": result,
        },
    )


if __name__ == "__main__":
    main()
