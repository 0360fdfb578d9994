"""Where a serving container keeps what it compiles, so that a restart or a second replica loads
it instead of compiling it again.

With `model.cachePvc` the cache is on the claim, in a directory of the InferenceService's own
(PREFIX/NAME: the cache holds code the server runs, so no other service may write it), shared by
its replicas and kept across rollouts. Otherwise it is in the pod's /tmp volume, which outlives
the container's restarts. The ROCm libraries that compile at start keep their caches under it:

- AITER (vLLM's kernels on MI300X/MI350X) builds its modules at first launch, for minutes;
- MIOpen keeps its tuned-kernel database and compiled kernels;
- Triton keeps the kernels it compiles (vLLM's attention and MoE on ROCm);
- ONNX Runtime's MIGraphX provider keeps its compiled programs (.mxr, ROCm 6.4 and later).

None of them runs on a CPU node: there, the directories are set and stay empty.
"""

from __future__ import annotations

from ..engines.base import AITER as AITER
from ..engines.base import MIGRAPHX as MIGRAPHX
from ..engines.base import MIOPEN as MIOPEN
from ..engines.base import TRITON as TRITON
from ..engines.base import CacheSite, CompileCache
from ..jsontypes import JsonObject
from .common import Owner
from .storage import MODEL_VOLUME, uses_cache_claim


def compile_cache(owner: Owner, site: CacheSite) -> CompileCache:
    """The cache at the site's mount path (PREFIX/NAME on the cache claim), or its directory in
    the pod's /tmp. Each engine names its site (`ServingEngine.compile_cache`)."""
    if uses_cache_claim(owner.spec.model):
        directory = site.mount_path
        mounts: list[JsonObject] = [
            {"name": MODEL_VOLUME, "mountPath": site.mount_path, "subPath": f"{site.prefix}/{owner.name}"}
        ]
    else:
        directory, mounts = site.pod_dir, []
    env: list[JsonObject] = [{"name": name, "value": f"{directory}/{sub}"} for name, sub in site.caches.items()]
    return CompileCache(directory, mounts, env)
