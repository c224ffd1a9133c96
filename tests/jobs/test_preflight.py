"""jobs/preflight.py: every offline check before a job starts, each problem one line naming its field, all at once;
and the training children's side of the same mistakes (trainers/model/load.py's setup problems, exit code 2)."""

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest

from grpoflow.core.errors import DatasetError, SetupError
from grpoflow.core.spec import SpecError, load_spec
from grpoflow.jobs.preflight import CHECKS, preflight
from grpoflow.trainers.dataset import check_dataset
from grpoflow.trainers.model.load import check_chat_template, check_model, load_tokenizer, model_problem, setup_problem
from grpoflow.trainers.model.tiny import build_tiny
from tests.hostile_server import HostileServer, timed
from tests.hub_server import HubServer

REPO = Path(__file__).resolve().parents[2]
ROWS = [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(6)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def data(tmp_path):
    """A text-prompt and a chat-prompt dataset."""
    chats = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in ROWS]
    return {"text": write_jsonl(tmp_path / "text.jsonl", ROWS), "chat": write_jsonl(tmp_path / "chat.jsonl", chats)}


def tiny_copy(tmp_path: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """builtin:tiny's folder, less `leave_out` (chat_template.jinja: a base model's tokenizer)."""
    dest = tmp_path / f"model-{len(list(tmp_path.glob('model-*')))}"
    shutil.copytree(build_tiny(), dest, ignore=lambda folder, names: [n for n in names if n in leave_out])
    return dest


def seq2seq_copy(tmp_path: Path) -> Path:
    """A tiny T5 (an encoder-decoder) saved with save_pretrained, with builtin:tiny's tokenizer beside it."""
    from transformers import AutoModelForSeq2SeqLM, T5Config

    dest = tiny_copy(tmp_path, ("config.json", "model.safetensors"))
    config = T5Config(vocab_size=64, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2)
    AutoModelForSeq2SeqLM.from_config(config).save_pretrained(dest)
    return dest


def spec_for(data, **changes):
    spec = {
        "name": "preflight",
        "base_model": "builtin:tiny",
        "dataset": {"uri": str(data["text"])},
        "rewards": [{"name": "exact_answer"}],
        "hyperparameters": {"max_steps": 1, "rollouts_per_prompt": 2},
        "evaluation": {"holdout": 0},
    }
    for key, value in changes.items():
        if isinstance(value, dict):
            spec[key] = {**spec.get(key, {}), **value}
        else:
            spec[key] = value
    return load_spec(spec)[0]


def fake_hub_cache(root: Path, repo_id: str, files: dict[str, str]) -> None:
    """A Hugging Face cache holding `files` of `repo_id` (the layout `try_to_load_from_cache` reads)."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def online(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")


# --- the shape


def test_the_demo_spec_passes(monkeypatch):
    monkeypatch.chdir(REPO)  # its dataset path is relative to the repo
    spec, _ = load_spec(REPO / "examples" / "arithmetic.yaml")
    assert preflight(spec) == []


def test_the_checks_are_a_list_a_new_one_is_one_more_entry():
    names = [check.__name__ for check in CHECKS]
    assert names[0] == "check_model" and "check_dataset" in names and names[-1] == "check_rewards_dry_run"


def test_every_problem_at_once_each_naming_its_field(tmp_path, data):
    spec = spec_for(
        data,
        base_model=str(tmp_path / "no-such-model"),
        dataset={"uri": str(tmp_path / "missing.jsonl")},
        rewards=[{"name": "exact_answer"}, {"name": "mine", "function": "tests.bad_inputs.rewards.nope:nope_reward"}],
    )
    problems = preflight(spec)
    assert [p.split(":")[0] for p in problems] == ["base_model", "rewards[1]", "dataset"], problems
    assert f"{tmp_path / 'no-such-model'} does not exist" in problems[0]
    assert "dataset not found" in problems[2]


@pytest.mark.parametrize(
    "train, validation, problem",
    [
        ("text", "text", None),  # the same format: it passes
        ("text", "chat", "evaluation.dataset.prompt_column: the validation set's prompts"),  # chats against text
        ("chat", "text", "evaluation.dataset.prompt_column: the validation set's prompts"),  # text against chats
    ],
)
def test_a_validation_set_of_another_prompt_format_is_refused(data, train, validation, problem):
    spec = spec_for(data, dataset={"uri": str(data[train])}, evaluation={"dataset": {"uri": str(data[validation])}})
    problems = preflight(spec)
    assert problems == [] if problem is None else len(problems) == 1 and problems[0].startswith(problem), problems


def test_it_loads_no_weights_and_no_torch():
    # No torch, no weights: what it reads is config.json, the tokenizer's config, the dataset and the rewards.
    code = (
        "import sys; from grpoflow.core.spec import load_spec; from grpoflow.jobs.preflight import preflight; "
        "assert preflight(load_spec('examples/arithmetic.yaml')[0]) == []; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# --- the model (a rule table: base_model as given -> the problem, or none)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda tmp: "builtin:tiny", None),  # the shipped model
        (lambda tmp: str(tiny_copy(tmp)), None),  # a folder saved with save_pretrained
        (lambda tmp: str(tmp / "nope"), "does not exist"),  # the run failed with "Repo id must be in the form..."
        (lambda tmp: str(tiny_copy(tmp, ("config.json",))), "has no config.json"),  # weights, no config
        (lambda tmp: str(tiny_copy(tmp) / "config.json"), "is a file"),  # the config file, not its folder
        # config and tokenizer without weights: the training child failed to load it, three times
        (
            lambda tmp: str(tiny_copy(tmp, ("model.safetensors",))),
            "holds config.json but no weights (looked for model",
        ),
        # a seq2seq model: validate passed it, then training crashed three times (T5 generates from an encoder)
        (lambda tmp: str(seq2seq_copy(tmp)), "is T5ForConditionalGeneration (config.json), an encoder-decoder"),
        (lambda tmp: "grpoflow-tests/not-cached", "is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"),
        (lambda tmp: "builtin:huge", "unknown built-in model 'builtin:huge'"),  # only builtin:tiny is shipped
    ],
)
def test_model(tmp_path, data, offline, make, expected):
    problems = preflight(spec_for(data, base_model=make(tmp_path)))
    if expected is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith("base_model: ") and expected in problems[0], problems


@pytest.fixture
def hub(online, monkeypatch):
    """The loopback Hub as `huggingface_hub.constants.ENDPOINT`, with a token it accepts."""
    with HubServer(accepted_token="hf_PreflightTestToken0000") as server:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", "hf_PreflightTestToken0000")
        yield server


def test_a_hub_id_not_cached_online_is_a_warning(data, hub):
    hub._create("grpoflow-tests/not-cached", private=False)
    warnings = []
    assert preflight(spec_for(data, base_model="grpoflow-tests/not-cached"), warnings) == []
    assert warnings == [
        "base_model: 'grpoflow-tests/not-cached' is not in the local Hugging Face cache; it will be downloaded"
    ]
    assert hub.hits("GET", "/api/models/grpoflow-tests/not-cached") == 1  # its info once, no file downloaded


def test_a_hub_id_the_hub_lacks_or_gates_is_refused(data, hub, tmp_path, monkeypatch):
    hub._create("grpoflow-tests/gated", private=False)
    hub.repos["grpoflow-tests/gated"].gated = True
    [gated] = preflight(spec_for(data, base_model="grpoflow-tests/gated"))
    assert (
        gated.startswith("base_model: 'grpoflow-tests/gated' is a gated model: accept its terms")
        and "HF_TOKEN" in gated
    )
    [missing] = preflight(spec_for(data, base_model="grpoflow-tests/no-such-model"))
    assert missing == (
        f"base_model: 'grpoflow-tests/no-such-model' is no model on the Hub at {hub.url} (or a private one this "
        "machine's token cannot see: HF_TOKEN)"
    )
    # A typo in a local folder's name reads as a Hub id: the message says what the folder beside it holds.
    (tmp_path / "models" / "tiny-llama").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    [typo] = preflight(spec_for(data, base_model="models/tiny-lama"))
    assert typo.startswith(
        "base_model: 'models/tiny-lama' is no folder here (models/ holds: tiny-llama), and no model"
    )


def test_a_hub_id_not_cached_with_the_hub_unreachable_is_refused_at_once(data, online, monkeypatch):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once closed
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    [problem] = preflight(spec_for(data, base_model="grpoflow-tests/not-cached"))  # one try, not the client's 5
    assert problem.startswith(
        f"base_model: 'grpoflow-tests/not-cached' is not in the local Hugging Face cache, and the Hub at "
        f"http://127.0.0.1:{port} cannot be reached to download it (ConnectionRefusedError"
    )


def test_a_trickling_hub_holds_the_check_no_longer_than_the_deadline(data, online, monkeypatch):
    # The Hub's client bounds each read (15 s), not the answer: one byte every 0.3 s would hold validate ~40 s.
    monkeypatch.setenv("GRPOFLOW_HTTP_DEADLINE_S", "0.5")
    with HostileServer("trickle", every_s=0.3) as server:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", server.url)
        warnings = []
        problems, seconds = timed(lambda: preflight(spec_for(data, base_model="grpoflow-tests/slow"), warnings))
    assert problems == [] and seconds < 2.0  # no sure answer: the download will tell, as when the Hub errs
    assert warnings == [
        "base_model: 'grpoflow-tests/slow' is not in the local Hugging Face cache; it will be downloaded"
    ]


def test_a_cached_hub_model_is_read_from_the_cache(tmp_path, data, offline, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    files = {"config.json": json.dumps({"model_type": "gpt_neox"}), "tokenizer_config.json": "{}"}
    fake_hub_cache(tmp_path / "hub", "org/small", {**files, "model.safetensors": ""})
    fake_hub_cache(tmp_path / "hub", "org/config-only", files)
    assert preflight(spec_for(data, base_model="org/small")) == []
    # The architecture's rules read the family from the cached config.json, not from the name "org/small".
    liger = preflight(spec_for(data, base_model="org/small", hyperparameters={"use_liger": True}))
    assert liger == [
        "hyperparameters.use_liger: not supported for gpt_neox models (config.json's model_type) such as 'org/small' "
        "(Liger's kernels give wrong log-probs); set use_liger: false"
    ]
    # Its tokenizer has no chat template, which chat prompts need.
    chats = preflight(spec_for(data, base_model="org/small", dataset={"uri": str(data["chat"])}))
    assert len(chats) == 1 and chats[0].startswith("dataset.prompt_column: the prompts are chats")
    assert preflight(spec_for(data, base_model="org/config-only")) == [
        "base_model: 'org/config-only' has its config but no weights in the local Hugging Face cache (HF_HUB_OFFLINE)"
    ]


# --- the chat template (prompts, system_prompt, tokenizer -> the problem's field, or none)


@pytest.mark.parametrize(
    "prompts, system_prompt, template, field",
    [
        ("text", None, False, None),  # string prompts need no template
        ("chat", None, True, None),  # chats through the tokenizer's template
        ("chat", None, False, "dataset.prompt_column"),  # the run failed after 49 s: "Cannot use chat template..."
        ("text", "Be brief.", False, "hyperparameters.system_prompt"),  # the system prompt makes chats
        ("text", "Be brief.", True, None),
        ("chat", "Be brief.", False, "hyperparameters.system_prompt"),  # named once, by its system prompt
    ],
)
def test_chat_template(tmp_path, data, prompts, system_prompt, template, field):
    model = tiny_copy(tmp_path, () if template else ("chat_template.jinja",))
    hp = {"system_prompt": system_prompt} if system_prompt else {}
    problems = preflight(
        spec_for(data, base_model=str(model), dataset={"uri": str(data[prompts])}, hyperparameters=hp)
    )
    if field is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(f"{field}: ") and "has no chat template" in problems[0]


def test_a_template_in_tokenizer_config_counts(tmp_path, data):
    model = tiny_copy(tmp_path, ("chat_template.jinja",))
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages }}"}))
    assert preflight(spec_for(data, base_model=str(model), dataset={"uri": str(data["chat"])})) == []


# --- the dataset and the rewards


def test_dataset_problems_are_the_ingests(data, tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "x"}])
    problems = preflight(spec_for(data, dataset={"uri": str(bad)}))
    # each of the dataset's problems is a line of its own, as the ingest names it
    assert len(problems) == 2 and all(p.startswith("dataset: dataset ") for p in problems)
    assert "prompt column 'prompt' not found" in problems[0] and "column 'answer'" in problems[1]


def test_check_dataset_saves_nothing_and_returns_the_ingests_rows(data, tmp_path):
    before = set(tmp_path.rglob("*"))
    prompt_format, sample = check_dataset(str(data["chat"]), holdout=2, seed=42)
    assert prompt_format == "chat" and len(sample) == 4 and set(sample.column_names) == {"prompt", "answer"}
    assert set(tmp_path.rglob("*")) == before
    with pytest.raises(DatasetError, match="leaves no training rows"):
        check_dataset(str(data["text"]), holdout=6)


def test_rewards_dry_run_names_the_reward_field(data):
    spec = spec_for(
        data,
        rewards=[
            {"name": "exact_answer"},
            {"name": "mine", "function": "tests.bad_inputs.rewards.raises:raises_reward"},
        ],
    )
    problems = preflight(spec)
    assert len(problems) == 1 and problems[0].startswith("rewards[1]: reward 'mine' raised KeyError: 'solution'")


# --- the training children: the same mistakes met there are setup problems (exit code 2), not crashes


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda tmp: str(tmp / "nope"), "does not exist"),
        (lambda tmp: str(tiny_copy(tmp, ("config.json",))), "has no config.json"),
        (lambda tmp: "grpoflow-tests/not-cached", "is not in the local Hugging Face cache"),
        (lambda tmp: str(tiny_copy(tmp, ("model.safetensors",))), "holds config.json but no weights"),
        (lambda tmp: str(seq2seq_copy(tmp)), "GRPO needs a causal LM"),
    ],
)
def test_the_child_checks_the_model_before_loading_it(tmp_path, offline, make, expected):
    with pytest.raises(SetupError, match=expected) as caught:
        check_model(make(tmp_path))
    assert str(caught.value).startswith("base_model: ")


def test_load_tokenizer_offline_hub_miss_is_a_setup_error(offline):
    # transformers' OSError ("couldn't connect ... couldn't find them in the cached files") will not go away offline.
    with pytest.raises(SetupError, match="^base_model: cannot load grpoflow-tests/not-cached: "):
        load_tokenizer("grpoflow-tests/not-cached")


def test_setup_problem_tells_final_from_transient(online, monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError

    assert (
        setup_problem(SetupError("hyperparameters.use_liger: needs CUDA")) == "hyperparameters.use_liger: needs CUDA"
    )
    assert setup_problem(RuntimeError("a crash")) is None
    assert setup_problem(OSError("disk full")) is None
    # a spec valid where it was validated, not on the worker (bitsandbytes missing there): no retry installs it
    missing = SpecError(["hyperparameters.load_in_4bit: needs the bitsandbytes package, which is not installed"])
    assert setup_problem(missing) == (
        "the job's spec.yaml is rejected on this machine: hyperparameters.load_in_4bit: needs the bitsandbytes "
        "package, which is not installed"
    )
    try:  # transformers turns a cache miss into an OSError from the hub's error
        raise OSError("cannot find the files") from LocalEntryNotFoundError("not in the cache")
    except OSError as e:
        miss = e
    assert setup_problem(miss) is None  # online: a connection that may come back
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert setup_problem(miss) == "base_model: cannot find the files"  # offline: it will miss again


def test_check_chat_template_in_the_child(tmp_path, data):
    import datasets

    model = tiny_copy(tmp_path, ("chat_template.jinja",))
    tokenizer = load_tokenizer(str(model))
    chats = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}])
    check_chat_template(tokenizer, datasets.Dataset.from_list([{"prompt": "hi"}]), None, str(model))  # no error
    with pytest.raises(SetupError, match=r"^dataset.prompt_column: the prompts are chats"):
        check_chat_template(tokenizer, chats, None, str(model))
    assert model_problem(str(model)) is None


# --- LoRA targets (a rule table: the model, the requested modules -> the problem, or none)


@pytest.mark.parametrize(
    "model, targets, expected",
    [
        ("gpt2", ["q_proj", "v_proj"], "'q_proj', 'v_proj' not in this model (gpt2); its linear modules are c_attn"),
        ("gpt2", ["c_attn"], None),  # GPT-2's own name for its fused attention projection
        ("gpt2", "all-linear", None),  # PEFT expands it: nothing to check by name
        ("llama", ["c_attn"], "'c_attn' not in this model (llama)"),
    ],
)
def test_lora_targets(data, model, targets, expected):
    from tests.architectures import tiny_model

    spec = spec_for(
        data, base_model=str(tiny_model(model)), hyperparameters={"lora_rank": 4, "lora_target_modules": targets}
    )
    problems = [p for p in preflight(spec) if p.startswith("hyperparameters.lora_target_modules")]
    assert len(problems) == (expected is not None) and all(expected in p for p in problems), problems


# --- what the model can do with the prompts (issue 12, item 8)


def test_response_beyond_the_positions_of_a_rotary_model_is_a_warning(data):
    warnings = []
    assert preflight(spec_for(data, hyperparameters={"max_response_length": 600}), warnings) == []
    # builtin:tiny: 512 rotary positions; the prompts counted with its byte-level tokenizer
    assert any(
        "beyond the 512 positions of builtin:tiny" in w and "counted with the model's tokenizer" in w for w in warnings
    )


def test_a_role_chat_templates_do_not_know_is_a_warning(tmp_path, data):
    rows = [{"prompt": [{"role": "wizard", "content": "What is 1+1?"}], "answer": "2"}] * 4
    spec = spec_for(data, dataset={"uri": str(write_jsonl(tmp_path / "wizard.jsonl", rows))})
    warnings = []
    assert preflight(spec, warnings) == []
    assert any("the role 'wizard'" in w for w in warnings), warnings


def test_a_json_document_over_the_row_guard_is_rejected(tmp_path, data):
    big = tmp_path / "big.json"
    big.write_text(json.dumps([{"prompt": "x" * 1000, "answer": "1"}] * 100))  # ~100 KB, one line
    problems = preflight(spec_for(data, dataset={"uri": str(big), "max_row_bytes": 4096}))
    assert len(problems) == 1 and "a JSON document (one [...] array) is read whole" in problems[0], problems
    assert "16 x max_row_bytes = 65,536 bytes" in problems[0]


# --- causal LMs only (issue 28, item 2): a rule table of config.json -> the problem, or none


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}, None),  # the usual case, no import
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, None),  # in AutoModelForCausalLM's table
        ({"model_type": "gpt_neox"}, None),  # no architectures: the table says
        ({"model_type": "mine", "auto_map": {"AutoModelForCausalLM": "m.MyLM"}}, None),  # remote code for a causal LM
        ({"architectures": ["Whatever"]}, None),  # no model_type: transformers says, in the child
        (
            {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "is_encoder_decoder": True},
            "is T5ForConditionalGeneration (config.json), an encoder-decoder (seq2seq) model; GRPO needs a causal LM",
        ),
        (  # BART's model_type is in the causal table (its decoder alone), but the model is an encoder-decoder
            {"model_type": "bart", "architectures": ["BartForConditionalGeneration"], "is_encoder_decoder": True},
            "an encoder-decoder (seq2seq) model",
        ),
        (
            {"model_type": "vit", "architectures": ["ViTForImageClassification"]},
            "is ViTForImageClassification (config.json), not a causal language model; GRPO needs a causal LM",
        ),
    ],
)
def test_causal_lm_problem(config, expected):
    from grpoflow.trainers.model.load import causal_lm_problem

    problem = causal_lm_problem(config, "org/model")
    assert (
        problem is None if expected is None else problem.startswith("base_model: org/model ") and expected in problem
    )


def test_a_seq2seq_model_with_lora_targets_is_one_problem_not_a_traceback(tmp_path, data):
    # lora_target_modules made validate build the model with AutoModelForCausalLM, which raised on a T5 config.
    model = str(seq2seq_copy(tmp_path))
    spec = spec_for(data, base_model=model, hyperparameters={"lora_rank": 4, "lora_target_modules": ["q"]})
    problems = preflight(spec)
    assert len(problems) == 1 and "GRPO needs a causal LM" in problems[0], problems


# --- the output root (issue 28, item 8): writable, with room for a checkpoint and the trained model


def root_problems(data, root) -> list[str]:
    return [p for p in preflight(spec_for(data, output_uri=str(root))) if p.startswith("output_uri")]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_read_only_output_root_is_refused(tmp_path, data):
    (tmp_path / "runs").mkdir(mode=0o555)
    assert root_problems(data, tmp_path / "runs" / "new") == [
        f"output_uri: {tmp_path / 'runs' / 'new'}: {tmp_path / 'runs'} cannot be written (Permission denied); make it "
        "writable, or choose another output_uri"
    ]


def test_an_output_root_that_cannot_be_written_is_refused_as_root_too(tmp_path, data):
    # Root writes anywhere chmod forbids it, but not in a file system without files (/sys) nor inside a file.
    (tmp_path / "runs.txt").write_text("a file\n")
    assert root_problems(data, tmp_path / "runs.txt" / "runs") == [
        f"output_uri: {tmp_path / 'runs.txt' / 'runs'}: {tmp_path / 'runs.txt'} is not a folder; give a folder (or a "
        "path one can be made at)"
    ]
    if not os.path.isdir("/sys/kernel"):
        pytest.skip("no sysfs here")  # where no one, root included, can make a file
    [problem] = root_problems(data, "/sys/grpoflow-runs")
    assert problem.startswith("output_uri: /sys/grpoflow-runs: /sys cannot be written (") and "Errno" not in problem


def test_a_full_disk_is_refused_naming_the_space(tmp_path, data, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    free = {"bytes": 3_000_000}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=free["bytes"]))
    # builtin:tiny: 1.3 MB of float32 weights, so a checkpoint of 4.0 MB (+ Adam's 8 bytes a weight) and the model
    [problem] = root_problems(data, tmp_path / "runs")
    assert problem.startswith(f"output_uri: {tmp_path / 'runs'}: {tmp_path} has 3.0 MB free of ")
    assert "less than the 5.3 MB the job needs at least: one checkpoint of 4.0 MB" in problem
    assert "estimated from builtin:tiny's 1.3 MB of weights; free space there, or choose another output_uri" in problem
    lora = spec_for(data, output_uri=str(tmp_path / "runs"), hyperparameters={"lora_rank": 4, "learning_rate": 2e-5})
    assert preflight(lora) == []  # LoRA: the merged model alone, 1.3 MB
    free["bytes"] = 6_000_000
    assert root_problems(data, tmp_path / "runs") == []
    assert sorted(os.listdir(tmp_path)) == ["chat.jsonl", "text.jsonl"]  # the probe files are gone, no runs/ made


# --- a write that fails in training (issue 28, item 8): once, naming the path and the space, not retried


@pytest.mark.parametrize(
    "make, low, expected",
    [
        # the disk filled while a checkpoint was written
        (
            lambda job: OSError(errno.ENOSPC, "No space left on device", str(job / "checkpoints" / "c-2" / "o.pt")),
            False,
            "output_uri: cannot write {job}/checkpoints/c-2/o.pt: no space left on the device (",
        ),
        (
            lambda job: OSError(errno.EROFS, "Read-only file system", str(job / "metrics.jsonl")),
            False,
            "output_uri: cannot write {job}/metrics.jsonl: read-only file system (",
        ),
        # torch.save's C++ stream says no more than this; the disk being full says why
        (
            lambda job: RuntimeError("basic_ios::clear: iostream error"),
            True,
            "output_uri: cannot write into {job}: the disk is full",
        ),
        (lambda job: RuntimeError("basic_ios::clear: iostream error"), False, None),  # room left: some other failure
        # a permission problem outside the job folder (the model's): not the job folder's to fix
        (lambda job: PermissionError(errno.EACCES, "Permission denied", "/models/llama/config.json"), False, None),
        (lambda job: OSError("disk full"), True, None),  # no errno, no library's words: a crash
    ],
)
def test_a_failed_write_is_a_setup_problem(tmp_path, monkeypatch, make, low, expected):
    job = tmp_path / "runs" / "j-20261130-000000-abcdef"
    job.mkdir(parents=True)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1000 if low else usage.free))
    problem = setup_problem(make(job), job)
    if expected is None:
        assert problem is None
    else:
        assert problem.startswith(expected.format(job=job)) and " free of " in problem, problem
        assert problem.endswith(f"then resume: grpoflow run SPEC --resume {job.name}")


def test_the_child_reports_a_full_disk_once_and_removes_the_torn_checkpoint(tmp_path, monkeypatch):
    import grpoflow.trainers.grpo as grpo
    from grpoflow.core.errors import EXIT_RECORD
    from grpoflow.core.jobdir import JobDir

    job = JobDir(tmp_path / "runs" / "j-20261130-000000-abcdef")
    (job.checkpoints / "checkpoint-1").mkdir(parents=True)
    (job.checkpoints / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    (job.checkpoints / "checkpoint-2").mkdir()  # torn: the disk filled before trainer_state.json
    full = OSError(errno.ENOSPC, "No space left on device", str(job.checkpoints / "checkpoint-2" / "optimizer.pt"))
    monkeypatch.setattr(grpo, "main", lambda root: (_ for _ in ()).throw(full))
    monkeypatch.delenv("RANK", raising=False)

    assert grpo.cli([str(job.root)]) == 2  # a setup problem: the task does not retry it
    record = json.loads((job.root / EXIT_RECORD).read_text())
    assert record["code"] == 2 and record["message"].startswith("output_uri: cannot write ")
    assert sorted(p.name for p in job.checkpoints.iterdir()) == ["checkpoint-1"]


# --- a GGUF file as base_model (issue 42, item 1; the file's own rules: tests/trainers/test_gguf.py)


def test_a_gguf_base_model_validates_saying_once_that_its_weights_are_dequantized(tmp_path, data, monkeypatch):
    from grpoflow.trainers.model.gguf import convert_gguf, gguf_folder
    from tests.conftest import cli
    from tests.gguf_files import write_gguf

    monkeypatch.setenv("GRPOFLOW_CACHE", str(tmp_path / "cache"))
    gguf = write_gguf(tmp_path / "tiny.Q8_0.gguf")
    spec = {"base_model": str(gguf), "dataset": {"uri": str(data["chat"])}}
    written = {"name": "gguf", **spec, "rewards": [{"name": "exact_answer"}], "evaluation": {"holdout": 0}}
    (tmp_path / "spec.yaml").write_text(json.dumps(written))
    code, _, err = cli("validate", tmp_path / "spec.yaml")
    assert code == 0, err
    [note] = [line for line in err.splitlines() if "GGUF" in line]
    assert note.startswith("warning: base_model: tiny.Q8_0.gguf is a GGUF file (llama, Q8_0, 91K parameters): ")
    where = gguf_folder(str(gguf))
    assert f"the first stage that loads it dequantizes its weights once into a model folder, {where} " in note
    assert "training runs in float32 on CPU, bfloat16 on a GPU that has it" in note

    # The header's config is checked as config.json would be: 256 positions (a rotary model: a warning).
    warnings = []
    assert preflight(spec_for(data, **spec, hyperparameters={"max_response_length": 300}), warnings) == []
    assert any("beyond the 256 positions" in w for w in warnings), warnings
    # Converted (by an earlier job), its folder is checked as any model folder; the note says where it is.
    convert_gguf(str(gguf))
    warnings = []
    assert preflight(spec_for(data, **spec), warnings) == []
    assert any(f"its weights were dequantized once into a model folder, {where} " in w for w in warnings)


def test_gguf_files_validate_refuses_each_naming_base_model(tmp_path, data, monkeypatch):
    from tests.gguf_files import write_gguf

    monkeypatch.setenv("GRPOFLOW_CACHE", str(tmp_path / "cache"))
    rwkv = write_gguf(tmp_path / "rwkv.gguf", "rwkv6")
    assert [p[:60] for p in preflight(spec_for(data, base_model=str(rwkv)))] == [
        f"base_model: {rwkv} holds a 'rwkv6' model, an architecture"[:60]
    ]
    # Chat prompts, and a file without a chat template: said before the conversion, from the header.
    bare = write_gguf(tmp_path / "bare.gguf", chat_template=False)
    problems = preflight(spec_for(data, base_model=str(bare), dataset={"uri": str(data["chat"])}))
    assert problems == [
        f"dataset.prompt_column: the prompts are chats (lists of messages), but the tokenizer of {bare} has no chat "
        "template to render them; give string prompts, or use a model whose tokenizer has one (a chat or instruct "
        "model), or add one to its tokenizer_config.json"
    ]
