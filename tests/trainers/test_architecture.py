"""LoRA on any causal LM (`grpoflow.trainers.model.architecture`): a matrix of architectures, each a tiny random model
built offline from its transformers config (tests/architectures.py), with its family's kind of tokenizer.

Fast: the default targets are every attention and MLP projection (a hand-written list per architecture), a missing
name is rejected naming the modules the model has, and a real PEFT wrap puts adapters on exactly those modules.
Slow: a 2-step LoRA GRPO run of every architecture through the training child's entry (`grpo.cli`; in this process,
which imports TRL once, but for one architecture run as the real child process), then the merge: every adapted
projection's merged weight moved, and merged/ loads and generates; a full fine-tune of a representative subset.
QLoRA (bitsandbytes' NF4 runs on CPU too) on one architecture per tokenizer kind.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from peft import get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.pytorch_utils import Conv1D

from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import load_spec, to_yaml
from grpoflow.trainers import grpo
from grpoflow.trainers.dataset import ingest_dataset
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.architecture import (
    adapter_line,
    adapter_summary,
    default_lora_targets,
    lora_target_problem,
    resolve_lora_targets,
)
from grpoflow.trainers.model.load import lora_config, weights_size
from grpoflow.trainers.model.merge import merge_adapter
from tests.architectures import ARCHITECTURES, tiny_model
from tests.conftest import arithmetic_rows, write_jsonl

REPO = Path(__file__).parents[2]
LLAMA = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
NEOX = ["dense", "dense_4h_to_h", "dense_h_to_4h", "query_key_value"]
ATTENTION = ["k_proj", "o_proj", "q_proj", "v_proj"]
EXPERTS = ["experts.down_proj", "experts.gate_up_proj"]  # one 3-D parameter per layer: every expert's projection

# (architecture, its default LoRA targets): every attention and MLP projection, by the names its code gives them.
EXPECTED = [
    pytest.param("gpt2", ["c_attn", "c_fc", "c_proj"], id="gpt2"),  # Conv1D: fused qkv c_attn, c_proj in both blocks
    pytest.param("gpt_neox", NEOX, id="gpt_neox"),  # Pythia: fused query_key_value, dense out, 4h MLP
    pytest.param("falcon", NEOX, id="falcon"),  # the same names as GPT-NeoX
    pytest.param("phi", ["dense", "fc1", "fc2", "k_proj", "q_proj", "v_proj"], id="phi"),  # dense out, fc1/fc2 MLP
    pytest.param("phi3", ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"], id="phi3"),  # fused qkv and gate_up
    pytest.param("opt", ["fc1", "fc2", "k_proj", "out_proj", "q_proj", "v_proj"], id="opt"),  # out_proj, fc1/fc2
    pytest.param("llama", LLAMA, id="llama"),  # q/k/v/o and gate/up/down
    pytest.param("mistral", LLAMA, id="mistral"),  # Llama's names
    pytest.param("gemma", LLAMA, id="gemma"),  # Llama's names (tied head, scaled embeddings)
    pytest.param("gemma2", LLAMA, id="gemma2"),  # Llama's names (soft-capped logits, sliding window)
    pytest.param("qwen2", LLAMA, id="qwen2"),  # Llama's names (builtin:tiny's family)
    pytest.param("qwen3", LLAMA, id="qwen3"),  # Llama's names; q_norm/k_norm are norms, not projections
    pytest.param("granite", LLAMA, id="granite"),  # Llama's names (scaled residuals and logits)
    pytest.param("stablelm", LLAMA, id="stablelm"),  # Llama's names (partial rotary, LayerNorm)
    pytest.param("olmo2", LLAMA, id="olmo2"),  # Llama's names (post-norms, q/k norms)
    pytest.param("starcoder2", ["c_fc", "c_proj", "k_proj", "o_proj", "q_proj", "v_proj"], id="starcoder2"),  # GPT MLP
    pytest.param("bloom", NEOX, id="bloom"),  # GPT-NeoX's names (ALiBi, no rotary)
    pytest.param("qwen3_moe", ATTENTION + EXPERTS, id="qwen3_moe"),  # attention, then the stacked experts
    pytest.param("mixtral", ATTENTION + EXPERTS, id="mixtral"),  # the same layout
]
MOE = ["qwen3_moe", "mixtral"]
ALL = [p.values[0] for p in EXPECTED]
assert sorted(ALL) == sorted(ARCHITECTURES), "every architecture of tests/architectures.py has a row"


def expert_parameters(model) -> set[str]:
    """Every 3-D parameter (a mixture of experts' stacked projections), found independently of grpoflow's rule."""
    return {n for n, p in model.named_parameters() if p.ndim == 3}


def linear_leaves(model) -> set[str]:
    """Every Linear/Conv1D module but the output head, found independently of PEFT's rule."""
    head = model.get_output_embeddings()
    return {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear | Conv1D) and m is not head}


def spec_for(name: str, **hyperparameters):
    spec, _ = load_spec(
        {
            "name": "arch",
            "base_model": str(tiny_model(name)),
            "dataset": {"uri": "d.jsonl"},
            "rewards": [{"name": "exact_answer"}],
            "hyperparameters": hyperparameters,
        }
    )
    return spec


# --- fast: the targets, the message, one real PEFT wrap per architecture -------------------------------------------


@pytest.mark.parametrize("name, expected", EXPECTED)
def test_default_targets_are_every_attention_and_mlp_projection(name, expected):
    path = str(tiny_model(name))
    assert default_lora_targets(path) == expected
    modules, parameters = resolve_lora_targets(path, None)  # null in the spec: the default
    assert modules + parameters == expected and parameters == (EXPERTS if name in MOE else [])
    assert resolve_lora_targets(path, "all-linear") == ("all-linear", [])  # PEFT's: linear modules only
    assert resolve_lora_targets(path, [expected[0]]) == ([expected[0]], [])  # a list is taken as given


@pytest.mark.parametrize("name, expected", EXPECTED)
def test_a_missing_name_is_rejected_naming_the_modules_there(name, expected):
    path = str(tiny_model(name))
    missing = "c_attn" if "q_proj" in expected else "q_proj"
    model_type = AutoConfig.from_pretrained(path).model_type
    linear = [name for name in expected if name not in EXPERTS]
    parameters = "; its expert and router parameters are experts.down_proj, experts.gate_up_proj, gate.weight"
    assert lora_target_problem(path, [expected[-1], missing]) == (
        f"hyperparameters.lora_target_modules: {missing!r} not in this model ({model_type}); "
        f"its linear modules are {', '.join(linear)}" + (parameters if name in MOE else "")
    )
    assert lora_target_problem(path, expected) is None  # every name there
    assert lora_target_problem(path, None) is None and lora_target_problem(path, "all-linear") is None


@pytest.mark.parametrize("name, expected", EXPECTED)
def test_peft_adapts_exactly_those_modules(name, expected):
    path = tiny_model(name)
    model = AutoModelForCausalLM.from_pretrained(path)
    projections, experts = linear_leaves(model), expert_parameters(model)
    peft_model = get_peft_model(model, lora_config(spec_for(name, lora_rank=4).hyperparameters, str(path)))

    adapted = {n for n, m in peft_model.base_model.model.named_modules() if isinstance(m, BaseTunerLayer)}
    holders = {n.rsplit(".", 1)[0] for n in experts}  # a ParamWrapper per parameter, nested on the experts module
    assert {n.removesuffix(".base_layer") for n in adapted} == projections | holders  # every projection, no more
    assert set(peft_model.base_model.targeted_parameter_names) == experts  # every layer's experts, in a MoE
    assert len(adapted) % model.config.num_hidden_layers == 0
    summary = adapter_summary(peft_model)
    lora = sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n)
    assert summary["lora_target_modules"] + summary["lora_target_parameters"] == expected
    assert summary["trainable_parameters"] == lora and 0 < lora < summary["total_parameters"]


def test_names_match_like_peft():
    path = str(tiny_model("llama"))
    assert lora_target_problem(path, ["self_attn.q_proj", "mlp.down_proj"]) is None  # a dotted tail of the name
    assert lora_target_problem(path, ["lm_head"]) is None  # the head is linear too, if asked for by name
    assert "'attn.q_proj' not in this model" in lora_target_problem(path, ["attn.q_proj"])  # tails end at a dot
    assert "'input_layernorm' not in this model" in lora_target_problem(path, ["input_layernorm"])  # not linear


def test_moe_names_go_to_modules_or_parameters():
    path = str(tiny_model("qwen3_moe"))
    # A Linear's name -> target_modules; a parameter's, or the module holding it (the router, the experts) ->
    # target_parameters.
    assert resolve_lora_targets(path, ["q_proj", "gate", "experts"]) == (
        ["q_proj"],
        ["gate.weight", "experts.down_proj", "experts.gate_up_proj"],
    )
    assert resolve_lora_targets(path, ["gate_up_proj", "mlp.gate.weight"]) == ([], ["gate_up_proj", "mlp.gate.weight"])
    assert lora_target_problem(path, ["gate", "experts.gate_up_proj", "mlp.gate.weight"]) is None
    assert "'up_proj' not in this model" in lora_target_problem(path, ["up_proj"])  # tails end at a dot


def moe_lora(path: Path, **hyperparameters):
    """A PEFT-wrapped tiny Qwen3-MoE whose adapters are non-zero, as after training (LoRA B starts at 0)."""
    model = AutoModelForCausalLM.from_pretrained(path)
    hp = spec_for("qwen3_moe", lora_rank=4, **hyperparameters).hyperparameters
    peft_model = get_peft_model(model, lora_config(hp, str(path)))
    torch.manual_seed(1)
    for name, parameter in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.1)
    return peft_model


def test_moe_experts_get_adapters_and_merge_exactly(tmp_path):
    path = tiny_model("qwen3_moe")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    base = AutoModelForCausalLM.from_pretrained(path)
    peft_model = moe_lora(path, lora_target_modules=["experts"])  # the experts alone
    assert adapter_summary(peft_model)["lora_target_parameters"] == EXPERTS
    with torch.no_grad():
        adapted = peft_model(ids).logits
        assert not torch.allclose(adapted, base(ids).logits)  # the experts' adapters change what the model says
    peft_model.save_pretrained(tmp_path / "adapter")
    AutoTokenizer.from_pretrained(path).save_pretrained(tmp_path / "adapter")

    merge_adapter(tmp_path / "adapter", tmp_path / "merged", dtype=torch.float32)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, adapted, atol=1e-5)  # PEFT's merge of target_parameters is exact
    # Saved in the checkpoint's own layout: one gate/up/down matrix per expert.
    before, after = load_file(path / "model.safetensors"), load_file(tmp_path / "merged" / "model.safetensors")
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    layers, experts = base.config.num_hidden_layers, base.config.num_experts
    assert len(moved) == layers * experts * 3 and all(".mlp.experts." in name for name in moved)  # nothing else


def test_the_log_says_what_moe_lora_adapts_and_leaves():
    path = tiny_model("qwen3_moe")
    assert adapter_line(adapter_summary(moe_lora(path)), str(path)) == (
        "LoRA adapters on k_proj, o_proj, q_proj, v_proj; on the parameters experts.down_proj, "
        "experts.gate_up_proj (PEFT target_parameters); not adapted: gate.weight (name them in lora_target_modules "
        "to adapt them)"
    )
    # PEFT converts "all-linear" on a transformers 5 MoE to the experts and the router too; the line says so.
    assert adapter_line(adapter_summary(moe_lora(path, lora_target_modules="all-linear")), str(path)) == (
        "LoRA adapters on k_proj, o_proj, q_proj, v_proj; on the parameters experts.down_proj, "
        "experts.gate_up_proj, gate.weight (PEFT target_parameters)"
    )
    assert adapter_line(adapter_summary(moe_lora(path, lora_target_modules=["q_proj"])), str(path)) == (
        "LoRA adapters on q_proj; not adapted: experts.down_proj, experts.gate_up_proj, gate.weight (name "
        "them in lora_target_modules to adapt them)"
    )
    summary = adapter_summary(moe_lora(path, lora_target_modules=["gate", "experts"]))
    assert adapter_line(summary, str(path)) == (
        "LoRA adapters on no module; on the parameters experts.down_proj, experts.gate_up_proj, "
        "gate.weight (PEFT target_parameters)"
    )


def test_full_finetune_summary_counts_every_parameter():
    model = AutoModelForCausalLM.from_pretrained(tiny_model("gpt2"))
    total = sum(p.numel() for p in model.parameters())
    summary = adapter_summary(model)
    assert summary == {
        "lora_target_modules": None,
        "lora_target_parameters": None,
        "trainable_parameters": total,
        "total_parameters": total,
    }


def test_a_7b_config_is_read_without_weights(tmp_path):
    # Built on the meta device: a real build would allocate 27 GB and take minutes (measured: ~0.1-0.3 s here).
    config = AutoConfig.for_model(
        "llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32
    )
    config.save_pretrained(tmp_path)
    assert default_lora_targets(str(tmp_path)) == LLAMA
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_a_config_that_cannot_be_read_offline_is_left_to_the_run(tmp_path):
    # The preflight's model checks report a missing model; the LoRA check does not guess.
    assert lora_target_problem("no-such-org/no-such-model", ["q_proj"]) is None
    assert lora_target_problem(str(tmp_path / "missing"), ["q_proj"]) is None


def test_a_missing_target_fails_the_training_child_as_a_setup_problem(make_job, capsys):
    job, _ = make_job("wrong", hyperparameters={"lora_rank": 4, "lora_target_modules": ["c_attn"]})
    assert grpo.cli([str(job.root)]) == 2  # exit code 2: the task does not retry
    assert (
        "grpoflow: hyperparameters.lora_target_modules: 'c_attn' not in this model (qwen2); its linear modules are "
        + ", ".join(LLAMA)
    ) in capsys.readouterr().err
    assert not job.metrics.exists() and not job.training_result.exists()


# --- slow: real 2-step GRPO runs through the training child's entry, then the merge --------------------------------

# Each training child spends ~10 CPU s importing torch, transformers and TRL, so the runs go through the child's entry
# (`grpo.cli`, what `python -m grpoflow.trainers.grpo` calls) in this process, which pays that once; one architecture
# (CHILD) runs as the real child process, as the training task starts it. The slow part trains LoRA on eleven
# architectures (the others get the fast PEFT wrap above; Mistral is Llama's layout), a mixture of experts, and the
# full fine-tune and QLoRA on a subset: Conv1D (GPT-2), fused qkv + gate_up (Phi-3), Llama-style with a SentencePiece
# tokenizer.
SLOW_LORA = ["gpt2", "gpt_neox", "falcon", "phi", "phi3", "opt", "llama", "gemma", "gemma2", "qwen2", "qwen3"]
CHILD = "qwen2"  # builtin:tiny's family
FULL_SUBSET = ["gpt2", "phi3", "gemma2"]
QLORA_SUBSET = ["gpt2", "llama"]  # bitsandbytes' NF4 runs on CPU: a Conv1D model and a Linear one


def grpo_job(tmp_path: Path, name: str, **hyperparameters) -> JobDir:
    data = write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(8))
    spec, _ = load_spec(
        {
            "name": "arch",
            "base_model": str(tiny_model(name)),
            "dataset": {"uri": str(data)},
            # Distinct rewards in every group: non-zero advantages, so each step moves the weights.
            "rewards": [{"function": "tests.architectures:rank_reward"}],
            "hyperparameters": {
                "max_steps": 2,
                "rollouts_per_prompt": 2,
                "max_response_length": 4,
                "learning_rate": 1e-2,
                **hyperparameters,
            },
            "checkpoint_every": 2,
            "evaluation": {"holdout": 0},
        }
    )
    job = JobDir(tmp_path / name)
    job.root.mkdir()
    job.spec.write_text(to_yaml(spec))
    ingest_dataset(spec.dataset.uri, job.dataset)
    return job


def train_child(job: JobDir, capsys, in_process: bool = True) -> tuple[dict, str]:
    """Runs the training child's entry on JOB: `grpo.cli` in this process, or with `in_process=False` the real
    `python -m grpoflow.trainers.grpo JOB` as the training task does; returns training.json and the child's log."""
    started = time.monotonic()
    if in_process:
        capsys.readouterr()
        code = grpo.cli([str(job.root)])
        out, err = capsys.readouterr()
    else:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        command = [sys.executable, "-m", "grpoflow.trainers.grpo", str(job.root)]
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 0, out[-3000:] + err[-3000:]
    print(f"{job.root.name}: training {'in process' if in_process else 'child'} {time.monotonic() - started:.1f} s")
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2]
    return json.loads(job.training_result.read_text()), out


def generates(folder: Path) -> None:
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer("What is 1+2?", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert out.shape[1] == prompt.input_ids.shape[1] + 3


def adapted_weights(adapter: Path) -> set[str]:
    """The base model's weight names of the modules the saved adapter adapts."""
    keys = load_file(adapter / "adapter_model.safetensors")
    modules = {k.removeprefix("base_model.model.").split(".lora_A")[0] for k in keys if ".lora_A" in k}
    return {f"{module}.weight" for module in modules}


def check_lora_run(tmp_path: Path, capsys, name: str, expected: list[str], **hyperparameters) -> str:
    job = grpo_job(tmp_path, name, lora_rank=4, **hyperparameters)
    result, log = train_child(job, capsys, in_process=name != CHILD)
    assert result["lora_target_modules"] == expected  # what the report shows
    assert f"grpoflow: phase: LoRA adapters on {', '.join(expected)}\n" in log
    # The phases outside the steps, which the training task shows while no step comes.
    size = weights_size(str(tiny_model(name)))
    assert f"grpoflow: phase: loading the model {tiny_model(name)} ({size}" in log  # ", in 4-bit)" for QLoRA
    assert "grpoflow: phase: model loaded in " in log and "; step 1: generating 2 completions of up to 4 tokens" in log
    assert "grpoflow: phase: (after step 2) saving the adapter to adapter/\n" in log  # shown after step 2
    assert 0 < result["trainable_parameters"] < result["total_parameters"]

    merge_adapter(job.adapter, job.merged, dtype=torch.float32)
    base, merged = load_file(tiny_model(name) / "model.safetensors"), load_file(job.merged / "model.safetensors")
    weights = adapted_weights(job.adapter)
    assert {w.rsplit(".", 2)[-2] for w in weights} == set(expected)
    assert len(weights) == len(linear_leaves(AutoModelForCausalLM.from_pretrained(tiny_model(name))))
    unchanged = sorted(w for w in weights if torch.equal(base[w], merged[w]))
    assert unchanged == []  # every adapted projection moved
    generates(job.merged)
    return log


@pytest.mark.slow
@pytest.mark.parametrize("name, expected", [p for p in EXPECTED if p.values[0] in SLOW_LORA])
def test_lora_grpo_trains_every_projection_and_merges(tmp_path, capsys, name, expected):
    check_lora_run(tmp_path, capsys, name, expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL_SUBSET)
def test_full_finetune_trains_and_loads(tmp_path, capsys, name):
    job = grpo_job(tmp_path, name)
    result, _ = train_child(job, capsys)
    assert result["lora_target_modules"] is None and result["trainable_parameters"] == result["total_parameters"]
    base, trained = load_file(tiny_model(name) / "model.safetensors"), load_file(job.merged / "model.safetensors")
    projections = {f"{m}.weight" for m in linear_leaves(AutoModelForCausalLM.from_pretrained(tiny_model(name)))}
    assert sorted(w for w in projections if torch.equal(base[w], trained[w])) == []
    generates(job.merged)


@pytest.mark.slow
@pytest.mark.parametrize("name", QLORA_SUBSET)
def test_qlora_grpo_trains_and_merges(tmp_path, capsys, name):
    pytest.importorskip("bitsandbytes")
    expected = next(p.values[1] for p in EXPECTED if p.values[0] == name)
    log = check_lora_run(tmp_path, capsys, name, expected, load_in_4bit=True)
    assert "loaded in 4-bit: True" in log  # NF4 on CPU: bitsandbytes' CPU backend


@pytest.mark.slow
def test_moe_lora_grpo_trains_the_experts_and_merges(tmp_path, capsys):
    job = grpo_job(tmp_path, "qwen3_moe", lora_rank=4)
    result, log = train_child(job, capsys)
    assert result["lora_target_modules"] == ATTENTION and result["lora_target_parameters"] == EXPERTS
    assert "(PEFT target_parameters); not adapted: gate.weight (name them in lora_target_modules" in log

    merge_adapter(job.adapter, job.merged, dtype=torch.float32)
    base = load_file(tiny_model("qwen3_moe") / "model.safetensors")
    merged = load_file(job.merged / "model.safetensors")
    moved = {name for name in base if not torch.equal(base[name], merged[name])}
    config = AutoConfig.from_pretrained(job.merged)
    experts = {name for name in base if ".mlp.experts." in name}
    assert len(experts) == config.num_hidden_layers * config.num_experts * 3 and experts <= moved  # every expert
    assert {name.rsplit(".", 2)[-2] for name in moved - experts} == set(ATTENTION)  # and attention, no router
    generates(job.merged)
