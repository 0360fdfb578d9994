"""The bounds every port starts from: the connection limits' defaults (each program's flags
default to them, so the model server's, the front's and the activator's ports agree unless told
otherwise) and the memory limit that their budgets are shares of."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

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
