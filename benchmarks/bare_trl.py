"""The baseline: GRPO run by hand with a plain `trl.GRPOTrainer` script, no grpoflow in the training path.

    python -m benchmarks.bare_trl CONFIG.json RESULT.json

CONFIG.json names the model, the JSONL dataset, the reward (`package.module:callable`) and the same training
settings the grpoflow job gets (K, lengths, learning rate, steps, seed, dtype, LoRA/QLoRA). Everything else is
TRL's default, as in a script written by hand: logging every 10 steps, no checkpoint within a short run (unless
the config gives `save_steps`), a progress bar. RESULT.json gets TRL's own `train_runtime` and the tokens it
counted; the trained weights go to `<output_dir>/final`.
"""

import importlib
import json
import sys

import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoTokenizer, BitsAndBytesConfig
from trl import GRPOConfig, GRPOTrainer


def main(config_path: str, result_path: str) -> None:
    c = json.loads(open(config_path).read())
    module, name = c["reward"].split(":")
    reward = getattr(importlib.import_module(module), name)
    dataset = load_dataset("json", data_files=c["dataset"], split="train")
    tokenizer = AutoTokenizer.from_pretrained(c["model"])
    tokenizer.padding_side = "left"
    bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    dtype = torch.bfloat16 if bf16 else torch.float32
    quantization_config = None
    if c.get("load_in_4bit"):
        quantization_config = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=True
        )
    peft_config = None
    if c.get("lora_rank"):
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        rank = c["lora_rank"]
        peft_config = LoraConfig(
            r=rank, lora_alpha=rank, target_modules=targets, lora_dropout=0.0, task_type="CAUSAL_LM"
        )

    args = GRPOConfig(
        output_dir=c["output_dir"],
        learning_rate=c["learning_rate"],
        max_steps=c["max_steps"],
        num_generations=c["num_generations"],
        per_device_train_batch_size=c["num_generations"],
        max_completion_length=c["max_completion_length"],
        beta=0.0,
        seed=c["seed"],
        data_seed=c["seed"],
        bf16=bf16,
        model_init_kwargs={"dtype": dtype},
        gradient_checkpointing=False,  # the same compute as the grpoflow job (which turns TRL's default off)
        report_to="none",
        # TRL's defaults (a checkpoint every 500 steps) unless the config asks for a schedule.
        **({"save_steps": c["save_steps"], "save_total_limit": 2} if c.get("save_steps") else {}),
    )
    trainer = GRPOTrainer(
        model=c["model"],
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        quantization_config=quantization_config,
    )
    result = trainer.train()
    trainer.save_model(c["output_dir"] + "/final")

    with open(result_path, "w") as f:
        json.dump(
            {
                "train_runtime": result.metrics["train_runtime"],
                "global_step": trainer.state.global_step,
                "num_tokens": trainer.state.num_input_tokens_seen,
            },
            f,
        )


if __name__ == "__main__":
    main(*sys.argv[1:3])
