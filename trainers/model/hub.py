"""Where a model's files are, found without loading one: grpoflow's own cache, the Hugging Face Hub's local cache,
and whether the Hub can be asked at all. The preflight and the training children share these."""

import os
import socket
import urllib.parse
from pathlib import Path


def cache_root() -> Path:
    """Folder under which built-in models are cached (`GRPOFLOW_CACHE`, default `~/.cache/grpoflow`)."""
    return Path(os.environ.get("GRPOFLOW_CACHE", Path.home() / ".cache" / "grpoflow"))


WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def hub_offline() -> bool:
    """Whether the Hugging Face Hub must not be contacted (`HF_HUB_OFFLINE`, as huggingface_hub reads it)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def hub_not_answering(timeout_s: float = 5.0) -> OSError | None:
    """Why the Hub's host cannot be reached at all (its name does not resolve, or no TCP connection within
    `timeout_s`), found in one try where huggingface_hub would retry 5 times over ~24 s. None when it answers, when
    offline mode is on (said otherwise), or behind a proxy (the HTTP client's own settings decide then)."""
    from huggingface_hub import constants

    proxies = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    if hub_offline() or any(os.environ.get(name) for name in proxies):
        return None
    url = urllib.parse.urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError as e:
        return e
    return None


HUB_CHECK_TIMEOUT_S = 15.0  # each Hub question of validate, in all


def cached_hub_file(repo_id: str, filename: str) -> Path | None:
    """The file of a Hub repo in the local Hugging Face cache, or None when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename)
    return Path(found) if isinstance(found, str) else None
