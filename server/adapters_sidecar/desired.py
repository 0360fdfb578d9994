"""What the sidecar wants, decided without I/O: the adapters list the operator wrote (held to the
CRD's rules again, since names become directories), where each adapter's files go, and which
loads and unloads bring vLLM's adapters to the list."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("model_server.adapters")

# The CRD's rules for spec.adapters (operator/inference_operator/models/: model.py's AdapterSpec and
# service.py's InferenceServiceSpec.adapters; the two programs share no code, tests/server/test_adapters_sidecar.py
# holds these to them). The ConfigMap is the operator's, but a name goes into paths: checked again.
MAX_ADAPTERS = 64
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
NAME_MAX_LENGTH = 63
HF_URI_PATTERN = r"hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(@[A-Za-z0-9][-A-Za-z0-9_./]*)?"
URI_PATTERN = re.compile(rf"^({HF_URI_PATTERN}|s3://[a-z0-9][-a-z0-9.]*[a-z0-9](/\S*)?)$")
URI_MAX_LENGTH = 2048
_DIGEST_LENGTH = 12
RETRY_SECONDS = 30.0  # a failed adapter is tried again after this, unless its uri changes


class State(enum.StrEnum):
    PENDING = "Pending"
    LOADING = "Loading"
    READY = "Ready"
    FAILED = "Failed"


@dataclasses.dataclass
class Adapter:
    uri: str
    state: State = State.PENDING
    reason: str = ""
    failed_at: float = 0.0


@dataclasses.dataclass(frozen=True)
class Load:
    name: str
    uri: str


@dataclasses.dataclass(frozen=True)
class Unload:
    name: str


Action = Load | Unload


def valid_name(name: str) -> bool:
    return len(name) <= NAME_MAX_LENGTH and NAME_PATTERN.match(name) is not None


def valid_uri(uri: str) -> bool:
    return len(uri) <= URI_MAX_LENGTH and URI_PATTERN.match(uri) is not None


def read_desired(text: str) -> dict[str, str]:
    """name -> uri from the ConfigMap's file (`{"adapters": [{"name", "uri"}]}`); ValueError
    when it is not such a file (the caller keeps the list it had). An entry whose name breaks
    the CRD's rules is left out (a name becomes a directory); one whose uri does is kept, for
    `Sidecar.read` to report Failed without fetching it."""
    data = json.loads(text)
    entries = data.get("adapters") if isinstance(data, dict) else None
    if not isinstance(entries, list) or len(entries) > MAX_ADAPTERS:
        raise ValueError(f"expected {{'adapters': [...]}} with at most {MAX_ADAPTERS} entries")
    desired: dict[str, str] = {}
    for entry in entries:
        name, uri = (entry.get("name"), entry.get("uri")) if isinstance(entry, dict) else (None, None)
        if not isinstance(name, str) or not isinstance(uri, str) or name in desired:
            raise ValueError(f"bad or repeated adapter entry {entry!r:.100}")
        if not valid_name(name):
            log.warning("adapter name %r refused: not the CRD's pattern %s", name[:80], NAME_PATTERN.pattern)
            continue
        desired[name] = uri
    return desired


def digest(uri: str) -> str:
    """What tells two uris of one adapter apart, in its directory's name and in /adapters."""
    return hashlib.sha256(uri.encode()).hexdigest()[:_DIGEST_LENGTH]


def adapter_dir(root: Path, name: str, uri: str) -> Path:
    """Where an adapter's files go: a changed uri gets a new directory beside the old one."""
    return root / f"{name}-{digest(uri)}"


def adapter_of(directory: str) -> str | None:
    """The adapter whose directory (or partial fetch) this is: `sql-v2-<digest>` is sql-v2's,
    never sql's."""
    stem = directory.removesuffix(".partial")
    name, _, hashed = stem.rpartition("-")
    if len(hashed) == _DIGEST_LENGTH and all(c in "0123456789abcdef" for c in hashed) and valid_name(name):
        return name
    return None


def plan(
    desired: Mapping[str, str],
    served: Mapping[str, str],
    known: Mapping[str, Adapter],
    root: Path,
    now: float,
) -> list[Action]:
    """What brings vLLM's adapters (`served`: name -> path it loaded) to `desired`: unloads
    first (they free slots of --max-loras), then loads, in the list's order. A failed adapter
    waits RETRY_SECONDS before it is tried again with the same uri."""
    actions: list[Action] = [Unload(name) for name in served if name not in desired]
    for name, uri in desired.items():
        if served.get(name) == str(adapter_dir(root, name, uri)):
            continue
        adapter = known.get(name)
        if adapter and adapter.uri == uri and adapter.state == State.FAILED and now - adapter.failed_at < RETRY_SECONDS:
            continue
        actions.append(Load(name, uri))
    return actions


def served_adapters(models: Any) -> dict[str, str]:
    """name -> path of the LoRA adapters in vLLM's /v1/models answer (entries with a parent)."""
    data = models.get("data") if isinstance(models, dict) else None
    return {
        entry["id"]: str(entry.get("root") or "")
        for entry in data or []
        if isinstance(entry, dict) and entry.get("parent") and isinstance(entry.get("id"), str)
    }
