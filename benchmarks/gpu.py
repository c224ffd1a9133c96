"""Benchmark 6 (needs CUDA): grpoflow's training stage against a plain TRL script on a real-size model, full
fine-tune, LoRA and QLoRA: steps/s, tokens/s and peak GPU memory.

    python -m benchmarks.gpu [--quick] [--json PATH] [--modes full,lora,qlora] [--steps N] [--repeats N]

The model has Qwen2-0.5B's shape (24 layers, hidden 896, 14 heads / 2 KV heads, MLP 4864, vocabulary 151,936),
built from its config with random weights in bf16, so nothing is downloaded; the tokenizer is builtin:tiny's
byte-level one (ids it does not know decode to nothing, which the reward tolerates). The workload is the
`long-prompt` shape (~256-token prompts) with 64-token completions, K = 8, no zero-variance groups. As in
benchmark 1 both sides are child processes, alternating, each started through `benchmarks.peak_gpu`, which reports
`torch.cuda.max_memory_allocated`. grpoflow runs without a checkpoint within the run, like the script (a 0.5B
checkpoint with Adam state is several GB; benchmark 1 prices checkpoints). tokens/s is TRL's own count of prompt
and completion tokens over train_runtime.

Sized for one H200 in about 6 minutes: 3 modes x 2 sides x 2 repeats x (startup + 8 steps). `--quick` builds a
4-layer model of the same width and runs 2 steps once per side.
"""

import sys
import tempfile
from pathlib import Path

from benchmarks.common import finish, markdown_table, parser
from benchmarks.trainer_vs_trl import NO_CHECKPOINTS, compare, shaped_workload

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
# mode: (lora_rank, load_in_4bit, learning_rate)
MODES = {"full": (None, False, 1e-6), "lora": (16, False, 2e-5), "qlora": (16, True, 2e-5)}
LAUNCHER = [sys.executable, "-m", "benchmarks.peak_gpu"]


def build_model(path: Path, layers: int, cpu_check: bool) -> Path:
    """A Qwen2 with 0.5B's shape (or `layers` of it) and random weights, saved with builtin:tiny's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    from trainers.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    shape = {**QWEN2_05B, "num_hidden_layers": layers}
    if cpu_check:  # only checks that the script works; a 0.5B model would take hours on a CPU
        shape |= {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": len(tokenizer)}
    config = Qwen2Config(
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **shape
    )
    torch.manual_seed(0)
    dtype = torch.float32 if cpu_check else torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--modes", default="full,lora,qlora", help="comma-separated: full, lora, qlora")
    p.add_argument("--steps", type=int, help="training steps per run (default 8; 2 with --quick)")
    p.add_argument("--repeats", type=int, help="runs per side (default 2; 1 with --quick)")
    p.add_argument("--allow-cpu", action="store_true", help="check the script on a CPU (tiny width, fp32, no QLoRA)")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        sys.exit("benchmarks.gpu needs a CUDA GPU (none is visible); --allow-cpu checks the script on a CPU")
    steps = args.steps or (2 if args.quick else 8)
    repeats = args.repeats or (1 if args.quick else 2)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.allow_cpu and not torch.cuda.is_available():
        modes = [m for m in modes if m != "qlora"]  # bitsandbytes' 4-bit kernels need CUDA
    results, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="grpoflow-bench-gpu-") as tmp:
        root = Path(tmp)
        cpu_check = not torch.cuda.is_available()
        model = build_model(root / "qwen2-0.5b-shape", 4 if args.quick else 24, cpu_check)
        for mode in modes:
            rank, four_bit, lr = MODES[mode]
            w = shaped_workload(
                f"gpu-{mode}",
                "long-prompt",
                root,
                steps,
                zero_variance_share=0.0,
                model=str(model),
                lora_rank=rank,
                load_in_4bit=four_bit,
                learning_rate=lr,
            )
            w.max_response_length = 64
            result = compare(w, root, repeats, variants={"grpoflow": NO_CHECKPOINTS}, launcher=LAUNCHER)
            results[mode] = result
            g, t = result["sides"]["grpoflow"], result["sides"]["trl"]
            for name, s in (("trl.GRPOTrainer script", t), ("grpoflow training stage", g)):
                ratio = s.get("steps_per_s_ratio", 1.0)
                same = s.get("same_weights_as_trl", "")
                rows.append(
                    [mode, name, s["steps_per_s"], s["tokens_per_s"], s["peak_gpu_mb"], s["startup_s"], ratio, same]
                )
    table = markdown_table(
        ["mode", "side", "steps/s", "tokens/s", "peak GPU MiB", "startup s", "steps/s vs TRL", "same weights"], rows
    )
    return finish(
        "gpu",
        args,
        table,
        {
            "model_shape": {**QWEN2_05B, "num_hidden_layers": 4 if args.quick else 24},
            "cpu_check": not torch.cuda.is_available(),
            "steps": steps,
            "repeats": repeats,
            "K": w.rollouts_per_prompt,
            "max_response_length": w.max_response_length,
            "modes": results,
        },
    )


if __name__ == "__main__":
    main()
