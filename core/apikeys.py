"""The jobs API's keys (`grpoflow api keys add`, `grpoflow api`): a YAML file of SHA-256 digests, never the keys.

    keys:
      - {sha256: 9f86d0..., team: a, name: ci}

A key is `gf-` and 32 random bytes (URL-safe base64), printed once when it is made. The file is the operator's,
written with mode 0600 and replaced atomically; a request's key is found by comparing its digest with each stored
one in constant time, so a key's prefix shows nothing through the time a refusal takes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

DEFAULT_KEYS_FILE = Path(".grpoflow") / "api-keys.yaml"
KEY_PREFIX = "gf-"
# `<output_uri>/files/<team>/` holds uploaded files, beside the teams' `<output_uri>/<team>/`: no team is named so.
FILES_FOLDER = "files"


class KeysError(ValueError):
    """The keys file cannot be read or holds a mistake, or a team's name is no slug: the user's to fix."""


@dataclass(frozen=True)
class KeyRecord:
    sha256: str
    team: str
    name: str


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_keys(path: Path) -> list[KeyRecord]:
    """The records of the keys file at `path` (none when it does not exist)."""
    if not path.exists():
        return []
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return [KeyRecord(str(k["sha256"]), str(k["team"]), str(k.get("name") or "")) for k in data.get("keys") or []]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as e:
        raise KeysError(f"keys file {path}: cannot read it ({e}); each entry is {{sha256, team, name}}") from None


def add_key(path: Path, team: str, name: str = "") -> str:
    """Makes a new key of `team`, stores its digest in the keys file at `path` (created with mode 0600), and returns
    the key itself, which nothing keeps.

    Args:
        path (`Path`): the keys file.
        team (`str`): the team the key belongs to (a slug, as the team's folder under the output URI is named).
        name (`str`, *optional*): a label to tell the team's keys apart.
    """
    from grpoflow.core.spec import SLUG_PATTERN  # here: the CLI imports this module, and the spec's models are slow

    if not re.fullmatch(SLUG_PATTERN, team):
        raise KeysError(
            f"--team {team!r}: a team is a slug (lowercase letters, digits, '-', '_', '.'), its folder's name"
        )
    if team == FILES_FOLDER:
        raise KeysError(f"--team {team!r}: the uploaded files' folder (<output-uri>/files/); choose another")
    records = read_keys(path)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    records.append(KeyRecord(digest(key), team, name))
    text = yaml.safe_dump({"keys": [vars(r) for r in records]}, sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return key


def team_of(key: str, records: list[KeyRecord]) -> str | None:
    """The team whose key `key` is, or None; every stored digest is compared, each in constant time."""
    wanted, found = digest(key), None
    for record in records:
        if hmac.compare_digest(wanted, record.sha256):
            found = record.team
    return found
