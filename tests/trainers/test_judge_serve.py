"""`llm_judge` end to end with `grpoflow serve` on loopback as the judge: validate's preflight dry-runs it, a GRPO
run logs its metric next to a reward model's and OpenAI graders' (a score_model asking the same endpoint, a multi with
a python grader), and the key (passed by its variable's name) is nowhere in the job
folder, the logs or the CLI's output."""

import threading

import pytest
import yaml

from grpoflow.trainers.rewards.build import build_reward
from grpoflow.trainers.rewards.dry_run import call_reward
from tests.conftest import cli
from tests.trainers.test_reward_models import build_tiny_classifier

KEY = "sk-grpoflow-judge-secret-4f1c9e"
RUBRIC = "Question: {prompt}\nAnswer: {completion}\nExpected: {answer}\nScore 0-10:"


def build_digit_judge(folder):
    """A tiny causal LM that answers every prompt with the digits 7 or 3, greedily: its final norm keeps one hidden
    dimension and the untied output head maps that dimension's sign to "7" (+) or "3" (-), every other token 0. A
    real model for `grpoflow serve` to run, whose replies a judge can parse (a random tiny model writes no digits)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    from grpoflow.trainers.model.tiny import TINY_CONFIG, build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**TINY_CONFIG, "tie_word_embeddings": False},
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[tokenizer.convert_tokens_to_ids("7"), 0] = 1.0
        model.lm_head.weight[tokenizer.convert_tokens_to_ids("3"), 0] = -1.0
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def judge_url(tmp_path_factory):
    from grpoflow.trainers.model.serve import make_server

    judge = build_digit_judge(tmp_path_factory.mktemp("judge") / "digit-judge")
    server = make_server(str(judge), "tiny-judge", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()
    server.server_close()


def judge_kwargs(url: str) -> dict:
    return {
        "base_url": url,
        "model": "tiny-judge",
        "api_key_env": "GRPOFLOW_TEST_JUDGE_KEY",
        "rubric": RUBRIC,
        "max_score": 10,
        "max_tokens": 1,
        "retries": 0,
    }


def test_serve_answers_the_judge(judge_url, monkeypatch):
    from grpoflow.trainers.rewards.judge import ask, endpoint_client, reply_text

    monkeypatch.setenv("GRPOFLOW_TEST_JUDGE_KEY", KEY)
    reward = build_reward("llm_judge", kwargs=judge_kwargs(judge_url))
    scores = call_reward(reward, ["What is 2+2?"] * 3, ["4", "5", ""], [[0]] * 3, {"answer": ["4"] * 3})
    assert len(scores) == 3 and set(scores) <= {0.3, 0.7}  # "3" or "7" of 10

    import asyncio

    async def reply() -> str:
        async with endpoint_client(judge_url, None, 60, 0) as client:
            body = {
                "model": "tiny-judge",
                "max_tokens": 1,
                "temperature": 0,
                "messages": [{"role": "user", "content": "hi"}],
            }
            return reply_text(
                await ask(client.chat.completions.with_raw_response.create(**body), judge_url), judge_url
            )

    assert asyncio.run(reply()) in ("3", "7")  # choices[0].message.content, as the OpenAI protocol has it


@pytest.mark.slow
def test_grpo_with_a_judge_and_a_reward_model_keeps_the_key_secret(
    judge_url, make_job, make_spec, tmp_path, monkeypatch
):
    from grpoflow.jobs.launch import run_child
    from grpoflow.trainers.metrics import read_metrics

    monkeypatch.setenv("GRPOFLOW_TEST_JUDGE_KEY", KEY)
    classifier = build_tiny_classifier(tmp_path / "tiny-rm")
    score_model = {  # an OpenAI grader against the same endpoint: the digit judge answers 3 or 7
        "type": "score_model",
        "name": "graded",
        "model": "gpt-4o-2024-08-06",
        "input": [{"role": "user", "content": "Answer: {{ sample.output_text }} Expected: {{ item.answer }}"}],
        "range": [0, 10],
        "sampling_params": {"max_completions_tokens": 1, "temperature": 0},
    }
    multi = {  # a python grader (its own process) and a string_check, combined
        "type": "multi",
        "name": "blend",
        "graders": {
            "py": {"type": "python", "name": "py", "source": "def grade(sample, item):\n    return 0.5\n"},
            "exact": {
                "type": "string_check",
                "name": "exact",
                "operation": "eq",
                "input": "{{ sample.output_text }}",
                "reference": "{{ item.answer }}",
            },
        },
        "calculate_output": "py + exact",
    }
    endpoint = {"base_url": judge_url, "model": "tiny-judge", "api_key_env": "GRPOFLOW_TEST_JUDGE_KEY", "retries": 0}
    rewards = [
        {"name": "exact_answer"},
        {"name": "llm_judge", "kwargs": judge_kwargs(judge_url), "weight": 0.5},
        {"model": str(classifier), "weight": 0.1},
        {"grader": score_model, "kwargs": endpoint, "weight": 0.05},
        {"grader": multi, "weight": 0.1},
    ]
    changes = {
        "rewards": rewards,
        "hyperparameters": {"max_steps": 2, "rollouts_per_prompt": 2, "max_response_length": 4},
        "evaluation": {"holdout": 0},
    }
    code, out, err = cli("validate", make_spec("judged", **changes))  # preflight: builds and dry-runs the judge
    assert code == 0, err
    job, _ = make_job("judged", **changes)
    run_child("grpoflow.trainers.grpo", job, 1, "train.log", result=job.training_result)

    rows = read_metrics(job.metrics)
    assert len(rows) == 2
    keys = {"rewards/llm_judge/mean", "rewards/tiny-rm/mean", "rewards/exact_answer/mean", "rewards/graded/mean"}
    assert keys | {"rewards/blend/mean"} <= set(rows[-1]["values"])
    assert all(0.3 <= row["values"]["rewards/llm_judge/mean"] <= 0.7 for row in rows)  # the judge's parsed scores
    assert all(3 <= row["values"]["rewards/graded/mean"] <= 7 for row in rows)  # the grader's, within its range
    assert all(0.5 <= row["values"]["rewards/blend/mean"] <= 1.5 for row in rows)
    assert yaml.safe_load(job.spec.read_text())["rewards"][1]["kwargs"]["api_key_env"] == "GRPOFLOW_TEST_JUDGE_KEY"
    leaked = [p for p in job.root.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert leaked == [] and KEY not in out + err
