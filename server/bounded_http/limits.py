"""The bounds every port starts from: the connection limits' defaults (each program's flags
default to them, so the model server's, the front's and the activator's ports agree unless told
otherwise) and the memory limit that their budgets are shares of."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TypeVar

#: Seconds for a request's headers to arrive.
HEADER_TIMEOUT_S = 10.0
#: Seconds for a request's body to arrive.
BODY_TIMEOUT_S = 60.0
#: Seconds a client may leave an answer undrained before its connection is dropped.
WRITE_TIMEOUT_S = 30.0
#: Seconds an idle kept-alive connection stays open: longer than the idle timeout of proxies and
#: clients in front (nginx's is 60 s), so that they close it, never while sending it a request.
KEEP_ALIVE_TIMEOUT_S = 75
#: Bytes of a request's header block (431 above).
MAX_HEADER_BYTES = 64 * 1024
#: Connections at once; beyond them, probes only.
MAX_CONNECTIONS = 1024

CGROUP_MEMORY_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def detect_memory_limit(files: Sequence[str] = CGROUP_MEMORY_FILES) -> int:
    """The container's memory limit (cgroup v2, then v1), else the machine's RAM."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for name in files:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < ram:
            return int(text)
    return ram


@dataclass(frozen=True, kw_only=True)
class PortLimits:
    """The flags every proxying program's port takes (the vLLM front's, the activator's): its
    memory limit and largest body, its connections and how long a peer may take. A program's
    config adds its own fields to these."""

    memory_limit_bytes: int = 0  # 0: the cgroup limit
    max_body_bytes: int = 0  # 0: from the memory limit
    max_connections: int = MAX_CONNECTIONS
    max_header_bytes: int = MAX_HEADER_BYTES
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    write_timeout_s: float = WRITE_TIMEOUT_S
    keep_alive_timeout_s: int = KEEP_ALIVE_TIMEOUT_S
    body_wait_s: float = 10.0
    connect_timeout_s: float = 2.0


Config = TypeVar("Config", bound=PortLimits)


def flag(field_name: str) -> str:
    """`max_body_bytes` -> `--max-body-bytes`; seconds drop their `_s` (`--write-timeout`)."""
    return "--" + field_name.removesuffix("_s").replace("_", "-")


def add_config_arguments(
    parser: argparse.ArgumentParser, config: type[PortLimits], help_text: Mapping[str, str]
) -> None:
    """One flag per field of the dataclass `config`, of the field's type and default; a field
    without a default is a required flag."""
    for field in fields(config):
        text = help_text.get(field.name, "")
        if field.default is MISSING:
            parser.add_argument(flag(field.name), dest=field.name, required=True, help=text)
            continue
        default = field.default
        text = f"{text} (default {default!r})" if text else f"default {default!r}"
        parser.add_argument(flag(field.name), dest=field.name, type=type(default), default=default, help=text)


def config_from_arguments(config: type[Config], args: argparse.Namespace) -> Config:
    """The dataclass `config` from the flags `add_config_arguments` added."""
    return config(**{field.name: getattr(args, field.name) for field in fields(config)})
