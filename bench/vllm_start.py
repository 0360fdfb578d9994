"""Cold against warm start of vLLM on CPU, from the operator's own rendered container.

The operator puts vLLM's compile cache (VLLM_CACHE_ROOT) on the model cache claim when the
InferenceService has one (builders/vllm.compile_cache), so the second replica and every
restart find what the first compiled. This renders such a Deployment, plays the kubelet
(tests/llm/conftest.kubelet_command: the model volume and the cache claim become local
directories), starts the server twice on one empty cache directory, and prints the seconds
to a healthy /health of each start and their ratio.

    .venv/bin/python bench/vllm_start.py          # ~4 min on 2 cores; needs scripts/setup-vllm.sh
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inference_operator.builders import Owner, build_deployment  # noqa: E402
from inference_operator.builders.storage import MODEL_DIR  # noqa: E402
from inference_operator.builders.vllm import COMPILE_CACHE_DIR  # noqa: E402
from inference_operator.models import parse_spec  # noqa: E402
from tests.llm.conftest import CPU_BACKEND_ENV, VENV, kubelet_command, vllm_python  # noqa: E402
from testsupport.processes import free_port, wait_http  # noqa: E402

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
    port = free_port()
    command = kubelet_command(container, {MODEL_DIR: model}, "127.0.0.1", port)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **CPU_BACKEND_ENV, "HOME": str(work)}
    for var in container["env"]:
        if "value" in var and not var["name"].endswith("VISIBLE_DEVICES"):
            env[var["name"]] = var["value"]
    assert env["VLLM_CACHE_ROOT"] == COMPILE_CACHE_DIR, "the rendered container keeps its cache on the claim"
    env["VLLM_CACHE_ROOT"] = str(cache)  # the claim's vllm-cache/NAME directory, on this machine
    log = work / f"vllm-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env=env, cwd=work, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    started = time.monotonic()
    try:
        wait_http(f"http://127.0.0.1:{port}/health", process, timeout=900, log=log)
        return time.monotonic() - started
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    python = vllm_python()
    model = VENV.parent / "tiny-llama"
    subprocess.run([str(python), str(ROOT / "tests" / "llm" / "tiny_llama.py"), str(model)], check=True, timeout=300)
    container = rendered_container()
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
