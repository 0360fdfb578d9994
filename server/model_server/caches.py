"""ROCm's compile caches for the model server: MIGraphX's compiled programs
(ORT_MIGRAPHX_MODEL_CACHE_PATH) and MIOpen's database and kernels. The operator points them into
the service's cache directory (on its cache claim, or the pod's /tmp); their directories are made
here, at start, before a session asks for them. A cache that cannot be made costs a compile at
every start, not the service: it is logged and left."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_VARIABLES = ("ORT_MIGRAPHX_MODEL_CACHE_PATH", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")


def prepare_compile_caches(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """Make the directories the cache variables in `environ` name; the ones that exist now."""
    ready = []
    for name in CACHE_VARIABLES:
        value = environ.get(name)
        if not value:
            continue
        path = Path(value)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("compile cache %s=%s cannot be made (%s): every start compiles afresh", name, value, exc)
            continue
        ready.append(path)
    return ready
