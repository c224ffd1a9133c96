"""GGUF files as base models (`base_model: models/SmolLM2-135M-Instruct.Q4_1.gguf`): the files llama.cpp and its
kin run, read by transformers' own GGUF loading (`from_pretrained(..., gguf_file=...)`, with the `gguf` package:
`pip install 'grpoflow[gguf]'`), which dequantizes the weights.

The first stage that loads the model (the SFT warm-up or GRPO, in its training child) converts the file once into an
ordinary model folder in the cache, `$GRPOFLOW_CACHE/gguf/<file name>-<key>/` (float32 safetensors, the tokenizer
and its chat template), and every stage after it (GRPO, evaluation, merge, serve, publish) loads that folder as it
loads any model: `resolve_model_path` gives it, as it gives builtin:tiny's. The key changes with the file (its path,
size and modification time) and with the transformers version, so a changed file or loader converts anew; the
jobs of a sweep or a benchmark share one conversion.

    python -m grpoflow.trainers.model.gguf model.gguf      # converts (if needed) and prints the folder
"""

import functools
import hashlib
import importlib.metadata
import importlib.util
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from grpoflow.trainers.child import say_phase
from grpoflow.trainers.model.tiny import cache_root

INSTALL = "pip install 'grpoflow[gguf]'"
MAGIC = b"GGUF"  # the first 4 bytes of every GGUF file


def is_gguf(model_id: str) -> bool:
    """Whether `base_model` names a GGUF file (`*.gguf`) rather than a model folder or a Hub id.

    >>> is_gguf("models/SmolLM2-135M-Instruct.Q4_1.gguf"), is_gguf("Qwen/Qwen2.5-0.5B-Instruct")
    (True, False)
    """
    return model_id.lower().endswith(".gguf")


@dataclass(frozen=True)
class GgufHeader:
    """What a GGUF file says of itself, read without its weights."""

    architecture: str  # as the file spells it (`general.architecture`)
    name: str | None  # `general.name`
    quantization: str  # the tensor type holding most of the weights, e.g. "Q4_1"
    parameters: int
    chat_template: bool
    metadata: dict  # the architecture's own keys (`llama.context_length` -> 8192)


def read_header(path: str | Path) -> GgufHeader:
    """The header of the GGUF file at `path` (the `gguf` package's reader; cached per file version)."""
    path = Path(path).expanduser().resolve()
    stat = path.stat()
    return _read_header(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_header(path: str, size: int, mtime_ns: int) -> GgufHeader:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    fields = reader.fields
    architecture = str(fields["general.architecture"].contents())
    elements = Counter()
    for tensor in reader.tensors:
        elements[tensor.tensor_type.name] += int(tensor.n_elements)
    prefix = f"{architecture}."
    return GgufHeader(
        architecture=architecture,
        name=str(fields["general.name"].contents()) if "general.name" in fields else None,
        quantization=elements.most_common(1)[0][0] if elements else "none",
        parameters=sum(elements.values()),
        chat_template="tokenizer.chat_template" in fields,
        metadata={key: fields[key].contents() for key in fields if key.startswith(prefix)},
    )


def gguf_problem(model_id: str, field: str = "base_model") -> str | None:
    """Why the GGUF file `model_id` cannot be a base model here, found without loading its weights: no such file, not
    a GGUF file, the `gguf` package missing, a file it cannot read, or an architecture transformers cannot load from
    GGUF. None when it can be converted (whether it is a causal LM is `gguf_config`'s model_type to check)."""
    path = Path(model_id).expanduser()
    if not path.exists():
        return f"{field}: {model_id} does not exist (a GGUF file; a model folder or a Hub model id also do)"
    if not path.is_file():
        return f"{field}: {model_id} is a folder, not a GGUF file"
    with path.open("rb") as f:
        if f.read(4) != MAGIC:
            return f"{field}: {model_id} is not a GGUF file (it does not start with the bytes GGUF); give a .gguf file"
    if importlib.util.find_spec("gguf") is None:
        return f"{field}: {model_id} is a GGUF file, and reading one needs the gguf package: {INSTALL}"
    try:
        architecture = read_header(path).architecture
    except (ValueError, KeyError, IndexError, OSError) as e:
        return f"{field}: cannot read {model_id} as a GGUF file ({type(e).__name__}: {e})"
    try:
        gguf_config(model_id)
    except ValueError as e:  # transformers' own word: "GGUF model with architecture X is not supported yet."
        version = importlib.metadata.version("transformers")
        return (
            f"{field}: {model_id} holds a {architecture!r} model, which transformers {version} cannot load from GGUF "
            f"({e}); give the model's safetensors folder or Hub id"
        )
    return None


def gguf_config(model_id: str) -> dict:
    """The config transformers builds from the GGUF file's header (`AutoConfig.from_pretrained(..., gguf_file=)`, its
    weights unread), as config.json would hold it.

    Raises:
        ValueError: an architecture transformers cannot load from GGUF.
    """
    from transformers import AutoConfig

    path = Path(model_id).expanduser()
    return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()


def gguf_folder(model_id: str) -> Path:
    """Where the GGUF file `model_id` is (or will be) converted to: `$GRPOFLOW_CACHE/gguf/<file name>-<key>/`."""
    path = Path(model_id).expanduser().resolve()
    stat = path.stat()
    version = importlib.metadata.version("transformers")
    key = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{version}".encode()).hexdigest()[:12]
    return cache_root() / "gguf" / f"{path.stem}-{key}"


def gguf_note(model_id: str, load_in_4bit: bool = False) -> str:
    """The line validate says once of a GGUF base model: what the file holds, that its weights are dequantized, where
    to, and the precision the job trains in."""
    header, folder = read_header(model_id), gguf_folder(model_id)
    count = header.parameters
    amount = f"{count / 1e6:.0f}M" if count >= 1e6 else f"{count / 1e3:.0f}K"
    amount = f"{count / 1e9:.1f}B" if count >= 1e9 else amount
    what = f"{header.architecture}, {header.quantization}, {amount} parameters"
    done = (folder / "config.json").is_file()
    when = "its weights were dequantized" if done else "the first stage that loads it dequantizes its weights"
    precision = "in 4-bit NF4 (load_in_4bit)" if load_in_4bit else "in float32 on CPU, bfloat16 on a GPU that has it"
    return (
        f"base_model: {Path(model_id).name} is a GGUF file ({what}): {when} once into a model folder, {folder} "
        f"({header.parameters * 4 / 1e9:.1f} GB of float32 safetensors, its tokenizer and chat template), which "
        f"every stage loads; training runs {precision}; merged/ and the Hub get safetensors"
    )


def convert_gguf(model_id: str, folder: Path | None = None) -> Path:
    """Converts the GGUF file `model_id` into an ordinary model folder (float32 safetensors, tokenizer, chat
    template, generation config) unless it is there already; returns the folder.

    transformers refuses `save_pretrained` on a model loaded with `gguf_file` (it counts as quantized), so the
    dequantized weights move into a model built from the same config, which saves as any model does.

    Args:
        model_id (`str`): the path of a .gguf file; `SetupError` with `gguf_problem`'s message when it cannot be one.
        folder (`Path`, *optional*): where to; defaults to `gguf_folder(model_id)`, the cache.
    """
    from grpoflow.trainers.model.load import SetupError

    path = Path(model_id).expanduser().resolve()
    folder = Path(folder) if folder else gguf_folder(model_id) if path.is_file() else None
    if folder is not None and (folder / "config.json").is_file():
        return folder
    if problem := gguf_problem(model_id):  # on a worker: a missing file or gguf package, said as validate says it
        raise SetupError(problem)
    folder = folder or gguf_folder(model_id)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    say_phase(f"converting {path.name} into {folder}: its weights dequantized to float32, once")
    kwargs = {"gguf_file": path.name}
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
    # dequantize=True: transformers' newer loader would otherwise keep the weights in GGUF blocks, untrainable.
    loaded = AutoModelForCausalLM.from_pretrained(
        str(path.parent), dtype=torch.float32, quantization_config=GgufConfig(dequantize=True), **kwargs
    )
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    with torch.device("meta"):  # no second copy of the weights: the loaded tensors are moved in
        model = AutoModelForCausalLM.from_config(type(loaded.config).from_dict(config), dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.generation_config = loaded.generation_config
    # Written beside the target and renamed, so a concurrent or interrupted conversion never leaves a half folder.
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(folder)
    except OSError:  # another process converted it first; its folder is the same
        shutil.rmtree(staging, ignore_errors=True)
    return folder


if __name__ == "__main__":
    if problem := gguf_problem(sys.argv[1]):
        sys.exit(problem)
    print(convert_gguf(sys.argv[1]))
