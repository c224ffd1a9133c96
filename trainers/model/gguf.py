"""GGUF files as base models (`base_model: models/SmolLM2-135M-Instruct.Q4_1.gguf`): the files llama.cpp and its
kin run, read by transformers' own GGUF loading (`from_pretrained(..., gguf_file=...)`, with the `gguf` package:
`pip install 'grpoflow[gguf]'`), which dequantizes the weights.

The first stage that loads the model (the SFT warm-up or GRPO, in its training child) converts the file once into an
ordinary model folder in the cache, `$GRPOFLOW_CACHE/gguf/<key>/` (float32 safetensors, the tokenizer and its chat
template), and every stage after it (GRPO, evaluation, merge, serve, publish) loads that folder as it loads any
model: `resolve_model_path` gives it, as it gives builtin:tiny's. The key is the file's content (its sha256, hashed
once per version of the file: `content_key`) and the transformers version, so a changed file or loader converts
anew, and every path to the same bytes (a copy in another project, a hard link, a symlink), the jobs of a sweep or
a benchmark share one conversion. One process converts at a time (a file lock), into a folder renamed into place.

Validate reads the header only (`scan_header`: the key-values and the tensors' types, the vocabulary stepped over)
and, until the file is converted, the config transformers builds from it, once per content (`gguf_config`).

A remote file is fetched first, once: `hf://<owner>/<name>[@<revision>]/<path>.gguf` (a file of a Hub model repo,
spelled as huggingface_hub's `parse_hf_uri` reads it) through `hf_hub_download`, into the Hub cache (HF_TOKEN,
HF_ENDPOINT and HF_HUB_OFFLINE apply); an object store's URL (`s3://bucket/key.gguf`, gs://, az://: `REMOTE_SCHEMES`;
its credentials from the worker's environment) into `$GRPOFLOW_CACHE/gguf/downloads/`. Validate asks for its
metadata only (the Hub's HEAD, fsspec's `info`), and reads its header once it is downloaded; its key holds its etag
instead of its modification time.

    python -m grpoflow.trainers.model.gguf model.gguf      # converts (if needed) and prints the folder
"""

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import mmap
import os
import shutil
import struct
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from grpoflow.core.uris import STORES, is_remote, unopenable, url_credentials, url_scheme
from grpoflow.trainers.child import say_phase
from grpoflow.trainers.model.hub import cache_root

INSTALL = "pip install 'grpoflow[gguf]'"
MAGIC = b"GGUF"  # the first 4 bytes of every GGUF file
HF_SPELLING = "hf://<owner>/<name>[@<revision>]/<file>.gguf"
METADATA_TTL_S = 60.0  # how long one process reuses a remote file's metadata (validate asks for it several times)


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
    """The header of the GGUF file at `path`, its weights and vocabulary unread (cached per file version)."""
    path = Path(path).expanduser().resolve()
    stat = path.stat()
    return _read_header(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_header(path: str, size: int, mtime_ns: int) -> GgufHeader:
    fields, tensors = scan_header(path)
    architecture = str(fields["general.architecture"])
    elements = Counter()
    for tensor_type, count in tensors:
        elements[tensor_type] += count
    prefix = f"{architecture}."
    return GgufHeader(
        architecture=architecture,
        name=str(fields["general.name"]) if "general.name" in fields else None,
        quantization=elements.most_common(1)[0][0] if elements else "none",
        parameters=sum(elements.values()),
        chat_template="tokenizer.chat_template" in fields,
        metadata={key: value for key, value in fields.items() if key.startswith(prefix)},
    )


def scan_header(path: str | Path) -> tuple[dict, list[tuple[str, int]]]:
    """The key-values of a GGUF file and its tensors' (type name, element count), from the header alone.

    Why not `gguf.GGUFReader`: it makes a numpy view of every element of every array, and a real model's vocabulary
    (SmolLM2's 49,152 tokens, their types and 48,900 merges) is ~440k of them: 3.7 CPU seconds a reading. Here the
    arrays validate does not need (all but the architecture's own) are stepped over by their lengths, and the file is
    mapped, so only the header's pages are read. The layout is the GGUF spec's (ggml's docs/gguf.md), the value and
    tensor types are the `gguf` package's enums.

    Raises:
        ValueError: not a GGUF file of a version this reads, or one that ends inside its header.
    """
    from gguf import GGMLQuantizationType, GGUFValueType

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        header = _Header(data)
        fields = {}
        for _ in range(header.kv_count):
            key = header.string()
            kind = GGUFValueType(header.unpack("I"))
            fields[key] = header.value(kind, keep=key.startswith(f"{fields.get('general.architecture')}."))
        tensors = []
        for _ in range(header.tensor_count):
            header.string()
            dims = header.unpack(f"{header.unpack('I')}Q", many=True)
            tensor_type = GGMLQuantizationType(header.unpack("I")).name
            header.unpack("Q")  # where its data starts
            tensors.append((tensor_type, math.prod(dims)))
        return fields, tensors


class _Header:
    """A reading position in a mapped GGUF file's header."""

    # GGUFValueType's numbers -> struct codes: UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, (8: STRING,
    # 9: ARRAY), UINT64, INT64, FLOAT64.
    SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def __init__(self, data: mmap.mmap):
        self.data, self.offset, self.order = data, 0, "<"
        if data[:4] != MAGIC:
            raise ValueError("it does not start with the bytes GGUF")
        self.offset = 4
        version = self.unpack("I")
        if version & 0xFFFF == 0:  # written on a big-endian machine, as gguf's reader tells
            self.order, self.offset = ">", 4
            version = self.unpack("I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version}, which this cannot read (2 and 3 are)")
        self.tensor_count, self.kv_count = self.unpack("Q"), self.unpack("Q")

    def unpack(self, code: str, many: bool = False):
        layout = struct.Struct(self.order + code)
        if self.offset + layout.size > len(self.data):
            raise ValueError(f"the file ends inside its header (at byte {len(self.data)})")
        values = layout.unpack_from(self.data, self.offset)
        self.offset += layout.size
        return values if many else values[0]

    def string(self) -> str:
        size = self.unpack("Q")
        if self.offset + size > len(self.data):
            raise ValueError(f"the file ends inside its header (at byte {len(self.data)})")
        self.offset += size
        return self.data[self.offset - size : self.offset].decode("utf-8", errors="replace")

    def value(self, kind, keep: bool = True):
        """The next value, of GGUFValueType `kind`; an array not kept is stepped over and read as None."""
        if kind == 8:
            return self.string()
        if kind != 9:
            return self.unpack(self.SCALARS[kind])
        item, count = self.unpack("I"), self.unpack("Q")
        if keep:
            return [self.value(item) for _ in range(count)]
        if item in (8, 9):
            for _ in range(count):
                self.value(item, keep=False)
        else:
            self.offset += count * struct.calcsize(self.SCALARS[item])
        return None


def gguf_problem(model_id: str, field: str = "base_model") -> str | None:
    """Why the GGUF file `model_id` cannot be a base model here, found without loading its weights: no such file (or
    remote file), not a GGUF file, the `gguf` package missing, a file it cannot read, or an architecture transformers
    cannot load from GGUF. A remote file not downloaded yet is checked by its metadata only. None when it can be
    converted (whether it is a causal LM is `gguf_config`'s model_type to check)."""
    if not is_remote(model_id):
        return _file_problem(Path(model_id.removeprefix("file://")).expanduser(), model_id, field)
    try:
        remote = remote_gguf(model_id)
    except RemoteGgufError as e:
        return f"{field}: {e}"
    return _file_problem(remote.local, model_id, field) if remote.local is not None else None


def _file_problem(path: Path, model_id: str, field: str) -> str | None:
    """`gguf_problem` of the local file `path`, said of `model_id`."""
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
    if (gguf_folder(model_id) / "config.json").is_file():
        return None  # converted: transformers has read it, this version of it (the folder's key holds the version)
    try:
        gguf_config(str(path))
    except ValueError as e:  # transformers' own word: "GGUF model with architecture X is not supported yet."
        version = importlib.metadata.version("transformers")
        return (
            f"{field}: {model_id} holds a {architecture!r} model, which transformers {version} cannot load from GGUF "
            f"({e}); give the model's safetensors folder or Hub id"
        )
    return None


# --- remote files ----------------------------------------------------------------------------------------------------


# Where a remote GGUF may come from: the Hub and object stores (`uris.STORES`), never http(s).
REMOTE_SCHEMES = STORES


class RemoteGgufError(ValueError):
    """A remote GGUF file that cannot be had from here, in one line naming it (without the spec field)."""


@dataclass(frozen=True)
class RemoteGguf:
    """What a remote GGUF file's metadata says: enough to key its conversion and to find its local copy."""

    uri: str
    etag: str  # the content's version: the Hub's etag (sha256 for LFS files), the store's ETag or mtime
    size: int | None
    local: Path | None  # the downloaded copy, once there


_metadata: dict[tuple[str, ...], tuple[float, RemoteGguf]] = {}  # `remote_gguf`'s answers


def remote_gguf(uri: str) -> RemoteGguf:
    """The metadata of the remote GGUF file `uri`, asked once a minute at most (no bytes of the file itself).

    Raises:
        RemoteGgufError: no such repo, revision or file; a gated repo; the Hub offline with no cached copy; a store
            that cannot be reached or read.
    """
    import time

    now, key = time.monotonic(), _metadata_key(uri)
    held = _metadata.get(key)
    if held is not None and now - held[0] < METADATA_TTL_S and (held[1].local is None or held[1].local.is_file()):
        return held[1]
    if (where := url_credentials(uri)) is not None:
        raise RemoteGgufError(f"{uri} holds a credential ({where}); put it in the environment instead")
    if url_scheme(uri) not in REMOTE_SCHEMES:
        stores = ", ".join(f"{s}://" for s in sorted(REMOTE_SCHEMES - {"hf"}))
        raise RemoteGgufError(
            f"{uri}: a remote GGUF file is read from the Hub (hf://) or an object store ({stores}); download it "
            "yourself and give its path"
        )
    found = _hub_metadata(uri) if url_scheme(uri) == "hf" else _store_metadata(uri)
    _metadata[key] = (now, found)
    return found


def _metadata_key(uri: str) -> tuple[str, ...]:
    """What a remote file's metadata depends on besides its URI: the Hub asked and the caches its copy may be in."""
    from huggingface_hub import constants

    return (uri, constants.ENDPOINT, str(constants.HF_HUB_CACHE), str(cache_root()))


def _hub_file(uri: str):
    """`uri`'s repo, revision and path (huggingface_hub's own reading of hf:// URIs); a model repo's file only."""
    from huggingface_hub import parse_hf_uri
    from huggingface_hub.errors import HfUriError

    try:
        parsed = parse_hf_uri(uri)
    except HfUriError as e:
        raise RemoteGgufError(f"{uri} is not a Hub file URI ({e.msg}); write {HF_SPELLING}") from e
    if parsed.type != "model" or not parsed.path_in_repo:
        raise RemoteGgufError(f"{uri} is not a file of a Hub model repo; write {HF_SPELLING}")
    return parsed


def _hub_metadata(uri: str) -> RemoteGguf:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError

    from grpoflow.core.outbound import call_within, deadline_s
    from grpoflow.trainers.model.hub import HUB_CHECK_TIMEOUT_S, hub_offline

    hub = _hub_file(uri)
    if hub_offline():
        cached = try_to_load_from_cache(hub.id, hub.path_in_repo, revision=hub.revision)
        if not isinstance(cached, str):
            raise RemoteGgufError(
                f"{uri} is not in the local Hugging Face cache and the Hub is offline (HF_HUB_OFFLINE=1); download it "
                f"where the Hub is reachable (hf download {hub.id} {hub.path_in_repo}) or unset HF_HUB_OFFLINE"
            )
        local = Path(cached)  # its blob is named after its etag, as the Hub gave it
        return RemoteGguf(uri, local.resolve().name, local.stat().st_size, local)
    url = hf_hub_url(hub.id, hub.path_in_repo, revision=hub.revision)
    ask = lambda: get_hf_file_metadata(url, timeout=HUB_CHECK_TIMEOUT_S)  # noqa: E731 - its HEAD, no bytes of the file
    try:
        meta = call_within(deadline_s(HUB_CHECK_TIMEOUT_S), ask)
    except (HfHubHTTPError, OSError) as e:  # TimeoutError, the deadline, among them
        raise RemoteGgufError(_hub_refusal(uri, hub, e)) from e
    cached = try_to_load_from_cache(hub.id, hub.path_in_repo, revision=meta.commit_hash)
    local = Path(cached) if isinstance(cached, str) else None
    return RemoteGguf(uri, meta.etag or meta.commit_hash or "", meta.size, local)


def _hub_refusal(uri: str, hub, error: BaseException) -> str:
    """What the Hub's `error` about the file `uri` (`hub`, parsed) means, in one line."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"the Hub at {constants.ENDPOINT}"
    if isinstance(error, GatedRepoError):
        return f"{uri}: {hub.id} is a gated model: accept its terms with the account whose token is in HF_TOKEN"
    if isinstance(error, RepositoryNotFoundError):
        return (
            f"{uri}: {hub.id} is no model repo on {where} (or a private one this machine's token cannot see: HF_TOKEN)"
        )
    if isinstance(error, RevisionNotFoundError):
        return f"{uri}: {hub.id} has no revision {hub.revision!r} on {where}"
    if isinstance(error, EntryNotFoundError):
        return f"{uri}: {hub.id} has no file {hub.path_in_repo!r} (at {hub.revision or 'main'}) on {where}"
    return f"{uri}: cannot ask {where} for it ({type(error).__name__}: {error}); check the network and HF_ENDPOINT"


def _store_metadata(uri: str) -> RemoteGguf:
    """A file fsspec opens (`s3://...`): its `info` (size, ETag or modification time)."""
    import fsspec

    if (problem := unopenable(uri)) is not None:
        raise RemoteGgufError(f"{uri}: {problem}")
    fs, path = fsspec.core.url_to_fs(uri)
    try:
        info = fs.info(path)
    except FileNotFoundError as e:
        raise RemoteGgufError(f"{uri} does not exist (a GGUF file; a model folder or a Hub model id also do)") from e
    except OSError as e:  # PermissionError among them
        raise RemoteGgufError(f"{uri} cannot be read ({type(e).__name__}: {e}); check the worker's credentials") from e
    if info.get("type") == "directory":
        raise RemoteGgufError(f"{uri} is a folder, not a GGUF file")
    etag = str(info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") or "").strip('"')
    size = info.get("size")
    local = _download_path(uri, etag, size)
    return RemoteGguf(uri, etag, size, local if local.is_file() else None)


def _download_path(uri: str, etag: str, size: int | None) -> Path:
    """Where a store's file is downloaded to: `$GRPOFLOW_CACHE/gguf/downloads/<stem>-<key>.gguf`."""
    key = hashlib.sha256(f"{uri}\0{etag}\0{size}".encode()).hexdigest()[:12]
    name = Path(uri.rstrip("/").rsplit("/", 1)[-1])
    return cache_root() / "gguf" / "downloads" / f"{name.stem}-{key}.gguf"


def fetch_gguf(model_id: str) -> Path:
    """The local GGUF file `model_id` names: itself, or a remote one downloaded once (the Hub's cache, or grpoflow's).

    Raises:
        RemoteGgufError: as `remote_gguf`, or a download that failed.
    """
    if not is_remote(model_id):
        return Path(model_id.removeprefix("file://")).expanduser()
    remote = remote_gguf(model_id)
    if remote.local is not None:
        return remote.local
    say_phase(f"downloading {model_id} ({(remote.size or 0) / 1e6:.1f} MB), once")
    try:
        local = _download(remote)
    except OSError as e:
        raise RemoteGgufError(f"{model_id}: the download failed ({type(e).__name__}: {e})") from e
    _metadata.pop(_metadata_key(model_id), None)
    return local


def _download(remote: RemoteGguf) -> Path:
    if url_scheme(remote.uri) == "hf":
        from huggingface_hub import hf_hub_download

        hub = _hub_file(remote.uri)
        # The spec's revision (or main), as `hf download` asks: its ref is then in the cache for offline workers.
        return Path(hf_hub_download(hub.id, hub.path_in_repo, revision=hub.revision))
    import fsspec

    target = _download_path(remote.uri, remote.etag, remote.size)
    target.parent.mkdir(parents=True, exist_ok=True)
    fs, path = fsspec.core.url_to_fs(remote.uri)
    # Written beside the target and renamed: a download cut short never reads as the file.
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}-", delete=False) as staging:
        pass
    try:
        fs.get_file(path, staging.name)
        Path(staging.name).replace(target)
    finally:
        Path(staging.name).unlink(missing_ok=True)
    return target


def gguf_config(model_id: str) -> dict:
    """The config transformers builds from the GGUF file's header (`AutoConfig.from_pretrained(..., gguf_file=)`, its
    weights unread), as config.json holds it; `{}` for a remote file not downloaded yet. transformers reads the whole
    vocabulary for it (~6 CPU seconds on SmolLM2's file), so it is built once per content and transformers version
    and kept beside the content keys (`$GRPOFLOW_CACHE/gguf/keys/<folder key>.config.json`).

    Raises:
        ValueError: an architecture transformers cannot load from GGUF.
    """
    if (path := local_gguf(model_id)) is None:
        return {}
    memo = cache_root() / "gguf" / "keys" / f"{gguf_folder(str(path)).name}.config.json"
    try:
        config = json.loads(memo.read_text())
    except (OSError, ValueError):
        from transformers import AutoConfig

        built = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_json_string(use_diff=False)
        _write_whole(memo, built)
        config = json.loads(built)
    return config | {"_name_or_path": str(path.parent)}  # where this path's file is, as transformers says it


def local_gguf(model_id: str) -> Path | None:
    """The local file of the GGUF `model_id`: itself, or a remote one's downloaded copy; None when not downloaded."""
    if not is_remote(model_id):
        return Path(model_id.removeprefix("file://")).expanduser()
    return remote_gguf(model_id).local


def gguf_folder(model_id: str) -> Path:
    """Where the GGUF file `model_id` is (or will be) converted to, keyed by its content and transformers' version: a
    local file's `$GRPOFLOW_CACHE/gguf/<key>/` (`content_key`: every path to the same bytes shares it), a remote one's
    `$GRPOFLOW_CACHE/gguf/<file name>-<key>/` (its URI, size and etag)."""
    version = importlib.metadata.version("transformers")
    if is_remote(model_id):
        remote = remote_gguf(model_id)
        what = f"{model_id}\0{remote.size}\0{remote.etag}\0{version}"
        key = hashlib.sha256(what.encode()).hexdigest()[:12]
        return cache_root() / "gguf" / f"{Path(model_id.rsplit('/', 1)[-1]).stem}-{key}"
    digest = content_key(Path(model_id.removeprefix("file://")))
    return cache_root() / "gguf" / hashlib.sha256(f"{digest}\0{version}".encode()).hexdigest()[:16]


def content_key(path: Path) -> str:
    """The sha256 of the file at `path`, hashed once per version of the file (~1 s a 0.5 GB file): remembered in
    `$GRPOFLOW_CACHE/gguf/keys/`, under its real path, device, inode, size, modification and change times. A file
    written anew (other bytes, or the same ones) is hashed anew; a copy or a hard link is hashed once more, under its
    own path, and gets the same key; a symlink is its target."""
    path = path.expanduser().resolve()
    before = _version(path)
    memo = cache_root() / "gguf" / "keys" / hashlib.sha256(before.encode()).hexdigest()[:32]
    try:
        held = memo.read_text()
    except OSError:
        held = ""
    if len(held) == 64:
        return held
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if _version(path) == before:  # not written to while hashed: worth remembering
        _write_whole(memo, digest)
    return digest


def _write_whole(path: Path, text: str) -> None:
    """Writes `text` to `path` whole or not at all (beside it, then renamed), whichever of two processes is last; a
    cache that cannot be written to (read-only, full) only means computing it again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}-", delete=False) as staging:
            staging.write(text)
        os.replace(staging.name, path)
    except OSError:
        pass


def _version(path: Path) -> str:
    """What changes when the file at `path` does. Its change time too: `cp -p` onto it keeps its inode, size and
    modification time, and the kernel alone sets ctime."""
    stat = path.stat()
    return f"{path}\0{stat.st_dev}\0{stat.st_ino}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ctime_ns}"


def gguf_note(model_id: str, load_in_4bit: bool = False) -> str:
    """The line validate says once of a GGUF base model: what the file holds, that its weights are dequantized, where
    to, and the precision the job trains in. A remote file not downloaded yet: its size, and where it will go."""
    folder, local = gguf_folder(model_id), local_gguf(model_id)
    precision = "in 4-bit NF4 (load_in_4bit)" if load_in_4bit else "in float32 on CPU, bfloat16 on a GPU that has it"
    if local is None:
        size = remote_gguf(model_id).size
        return (
            f"base_model: {model_id} is a remote GGUF file ({(size or 0) / 1e6:.1f} MB, not downloaded yet): the "
            f"first stage that loads it downloads it once, checks its architecture and dequantizes its weights once "
            f"into a model folder, {folder}, which every stage loads; training runs {precision}; merged/ and the Hub "
            "get safetensors"
        )
    header = read_header(local)
    count = header.parameters
    amount = f"{count / 1e6:.0f}M" if count >= 1e6 else f"{count / 1e3:.0f}K"
    amount = f"{count / 1e9:.1f}B" if count >= 1e9 else amount
    what = f"{header.architecture}, {header.quantization}, {amount} parameters"
    done = (folder / "config.json").is_file()
    when = "its weights were dequantized" if done else "the first stage that loads it dequantizes its weights"
    shown = model_id if is_remote(model_id) else Path(model_id).name
    return (
        f"base_model: {shown} is a GGUF file ({what}): {when} once into a model folder, {folder} "
        f"({header.parameters * 4 / 1e9:.1f} GB of float32 safetensors, its tokenizer and chat template), which "
        f"every stage loads; training runs {precision}; merged/ and the Hub get safetensors"
    )


def convert_gguf(model_id: str, folder: Path | None = None) -> Path:
    """Converts the GGUF file `model_id` (a remote one downloaded first, once) into an ordinary model folder (float32
    safetensors, tokenizer, chat template, generation config) unless it is there already; returns the folder.

    transformers refuses `save_pretrained` on a model loaded with `gguf_file` (it counts as quantized), so the
    dequantized weights move into a model built from the same config, which saves as any model does.

    Args:
        model_id (`str`): the path or URI of a .gguf file; `SetupError` with `gguf_problem`'s message when it cannot
            be one.
        folder (`Path`, *optional*): where to; defaults to `gguf_folder(model_id)`, the cache.
    """
    from grpoflow.core.errors import SetupError

    try:
        target = folder
        if target is None and (is_remote(model_id) or Path(model_id).expanduser().is_file()):
            target = gguf_folder(model_id)
        if target is not None and (target / "config.json").is_file():
            return Path(target)
        path = fetch_gguf(model_id)
        # Keyed anew once downloaded: the etag of the version that came, should one have been pushed meanwhile.
        target = Path(folder) if folder else gguf_folder(model_id)
    except RemoteGgufError as e:  # on a worker: said as validate says it
        raise SetupError(f"base_model: {e}") from e
    if problem := gguf_problem(model_id):  # on a worker: a missing file or gguf package, said as validate says it
        raise SetupError(problem)
    return target if (target / "config.json").is_file() else _convert(path.absolute(), target)


def _convert(path: Path, folder: Path) -> Path:
    """`convert_gguf`'s work: the local GGUF file `path` into `folder`. One process at a time converts into a folder
    (a file lock beside it, `.<folder>.lock`): the next finds it done."""
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(folder.parent / f".{folder.name}.lock"):
        if not (folder / "config.json").is_file():
            _write_folder(path, folder)
    return folder


def _write_folder(path: Path, folder: Path) -> None:
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
    # Written beside the target and renamed, so an interrupted conversion never leaves a half folder (nor, where the
    # lock does not hold, e.g. on NFS, a concurrent one: the second rename fails and its copy goes).
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(folder)
    except OSError:
        if not (folder / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    if problem := gguf_problem(sys.argv[1]):
        sys.exit(problem)
    print(convert_gguf(sys.argv[1]))
