"""Cold against warm start of vLLM on CPU, from the operator's own rendered container.

The operator puts vLLM's compile cache (VLLM_CACHE_ROOT) on the model cache claim when the
InferenceService has one (the vLLM engine's compile_cache), so the second replica and every
restart find what the first compiled. This renders such a Deployment, plays the kubelet
(testsupport/vllm.running_vllm: the model volume and the cache claim become local
directories), starts the server twice on one empty cache directory, and prints the seconds
to a healthy /health of each start and their ratio.

    .venv/bin/python bench/vllm_start.py          # ~4 min on 2 cores; needs scripts/setup-vllm.sh
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

from inference_operator.builders import Owner, build_deployment
from inference_operator.builders.storage import MODEL_DIR
from inference_operator.engines.vllm import COMPILE_CACHE_DIR
from inference_operator.models import parse_spec
from testsupport.processes import free_port
from testsupport.vllm import build_tiny_llama, running_vllm

SPEC = {
    "model": {"uri": "hf://bench/tiny-llama", "name": "tiny", "cachePvc": "model-cache"},
    "runtime": {"engine": "vllm", "args": ["--max-num-seqs=4", "--seed=0"], "maxModelLen": 256},
    "resources": {"gpu": {"count": 0}},
}


def rendered_container() -> dict:
    owner = Owner(name="tiny", namespace="bench", uid="u-1", spec=parse_spec(SPEC))
    (container,) = build_deployment(owner)["spec"]["template"]["spec"]["containers"]
    return container


def start_seconds(container: dict, model: pathlib.Path, cache: pathlib.Path, work: pathlib.Path) -> float:
    """Seconds from exec to a healthy /health, with the claim's cache directory at `cache`."""
    with running_vllm(container, model, MODEL_DIR, free_port(), work, timeout=900, cache_root=cache) as process:
        return float(process.startup_seconds)  # type: ignore[attr-defined]


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    model = build_tiny_llama()
    container = rendered_container()
    env = {var["name"]: var.get("value") for var in container["env"]}
    assert env["VLLM_CACHE_ROOT"] == COMPILE_CACHE_DIR, "the rendered container keeps its cache on the claim"
    with tempfile.TemporaryDirectory(prefix="vllm-start-") as tmp:
        work, cache = pathlib.Path(tmp), pathlib.Path(tmp) / "claim" / "vllm-cache" / "tiny"
        cache.mkdir(parents=True)
        cold = start_seconds(container, model, cache, work)
        entries = sum(1 for _ in cache.rglob("*"))
        warm = start_seconds(container, model, cache, work)
    print(f"vLLM (CPU) start, rendered container, cache on the claim ({entries} files after the first start):")
    print(f"  cold {cold:6.1f} s   warm {warm:6.1f} s   warm/cold {warm / cold:.2f}")


if __name__ == "__main__":
    main()
