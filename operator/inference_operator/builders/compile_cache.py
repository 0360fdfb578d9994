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

from dataclasses import dataclass

from ..jsontypes import JsonObject
from .common import Owner
from .storage import MODEL_VOLUME, uses_cache_claim

#: ROCm's compile caches: variable -> directory under the container's cache directory.
AITER = {"AITER_JIT_DIR": "aiter"}
MIOPEN = {"MIOPEN_USER_DB_PATH": "miopen", "MIOPEN_CUSTOM_CACHE_DIR": "miopen"}
TRITON = {"TRITON_CACHE_DIR": "triton"}
MIGRAPHX = {"ORT_MIGRAPHX_MODEL_CACHE_PATH": "migraphx"}


@dataclass(frozen=True)
class CompileCache:
    """A container's cache directory, the mounts that put it there, and the variables that send
    its libraries' caches into it."""

    directory: str
    mounts: list[JsonObject]
    env: list[JsonObject]


def compile_cache(owner: Owner, mount_path: str, prefix: str, pod_dir: str, caches: dict[str, str]) -> CompileCache:
    """The cache at `mount_path` (PREFIX/NAME on the cache claim), or `pod_dir` in the pod's /tmp."""
    if uses_cache_claim(owner.spec.model):
        directory = mount_path
        mounts: list[JsonObject] = [
            {"name": MODEL_VOLUME, "mountPath": mount_path, "subPath": f"{prefix}/{owner.name}"}
        ]
    else:
        directory, mounts = pod_dir, []
    env: list[JsonObject] = [{"name": name, "value": f"{directory}/{sub}"} for name, sub in caches.items()]
    return CompileCache(directory, mounts, env)
