"""Reward models: a sequence-classification model on the Hub or on disk, scored as a reward."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# --- reward models ---------------------------------------------------------------------------------------------------


def reward_model_folder(model: str) -> Path | None:
    """The folder holding a reward model's config.json: the local folder, or its snapshot in the local Hugging Face
    cache; None when neither holds it. Nothing is downloaded."""
    from grpoflow.core.uris import is_local_model
    from grpoflow.trainers.model.hub import cached_hub_file

    if is_local_model(model):
        folder = Path(model).expanduser()
        return folder if (folder / "config.json").is_file() else None
    config = cached_hub_file(model, "config.json")
    return config.parent if config is not None else None


def reward_model_problem(model: str) -> str | None:
    """Why `model` cannot be a reward model here, found offline from its files (no weights loaded, no download): a
    missing folder or uncached Hub id, no weights or tokenizer, or a config.json whose `architectures` is not a
    `...ForSequenceClassification` (TRL would bolt an untrained score head onto it). None when it is fine."""
    from grpoflow.core.uris import is_local_model
    from grpoflow.trainers.model.hub import WEIGHT_FILES

    folder = reward_model_folder(model)
    if folder is None:
        if not is_local_model(model):
            return (
                f"{model!r} is not in the local Hugging Face cache (validate does not download): fetch it first "
                f"(hf download {model}) or give a local folder"
            )
        if not Path(model).expanduser().exists():
            return f"{model} does not exist (a local reward model folder; a Hub model id is owner/name)"
        return f"{model} has no config.json: give a folder saved with save_pretrained"
    try:
        config = json.loads((folder / "config.json").read_text())
        architectures = config.get("architectures") or []
    except (OSError, ValueError, AttributeError) as exc:
        return f"cannot read {folder / 'config.json'}: {exc}"
    if not any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in architectures):
        found = ", ".join(map(str, architectures)) or "none"
        return (
            f"{model} is not a sequence classifier (config.json architectures: {found}); give a reward model saved "
            "from AutoModelForSequenceClassification with num_labels=1"
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        return f"{model} has a config.json but no weights ({', '.join(WEIGHT_FILES[:2])}, ...)"
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return f"{model} has no tokenizer (TRL scores with the reward model's own tokenizer): save it alongside"
    return None


def reward_model_bytes(model: str) -> int:
    """Bytes of weights a reward model's folder (or cache snapshot) holds; 0 when it is not here."""
    folder = reward_model_folder(model)
    if folder is None:
        return 0
    return sum(f.stat().st_size for f in folder.iterdir() if f.suffix in (".safetensors", ".bin") and f.is_file())


@functools.cache
def load_reward_model(model: str) -> tuple[Any, Any]:
    """The reward model and its tokenizer on CPU, loaded as TRL's GRPOTrainer loads a model-id reward:
    `AutoModelForSequenceClassification(num_labels=1)`, the model's own tokenizer, its eos as pad token when it has
    none, and that pad id in the config (the score is read at the last non-pad token)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    classifier = AutoModelForSequenceClassification.from_pretrained(model, num_labels=1).eval()
    tokenizer = AutoTokenizer.from_pretrained(model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    classifier.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    return classifier, tokenizer


def get_reward_model_reward(model: str) -> Callable[..., list[float | None]]:
    """Return `reward_model_reward`: the sequence classifier `model`'s score (`logits[:, 0]`) of each prompt +
    completion, computed as TRL's `GRPOTrainer._calculate_rewards` does for a model-id reward (a chat through the
    reward model's chat template, text concatenated). The model loads on first call, on CPU; the dry run and the
    held-out evaluation use this, training hands `model` to TRL itself.

    Args:
        model (`str`): a local folder or a Hub id in the local cache.
    """

    def reward_model_reward(completions: list, prompts: list, **kwargs) -> list[float | None]:
        import torch
        from trl.data_utils import apply_chat_template, is_conversational

        classifier, tokenizer = load_reward_model(model)
        if is_conversational({"prompt": prompts[0]}):
            messages = [{"messages": p + c} for p, c in zip(prompts, completions, strict=True)]
            texts = [apply_chat_template(m, tokenizer)["text"] for m in messages]
        else:
            texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        inputs = tokenizer(
            text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
        )
        with torch.inference_mode():
            return classifier(**inputs).logits[:, 0].float().tolist()

    return reward_model_reward
