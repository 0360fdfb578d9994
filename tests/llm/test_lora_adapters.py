"""LoRA adapters on real vLLM (CPU), loaded and unloaded at runtime by the pod's adapters sidecar.

The test plays the kubelet for two replicas of one rendered Deployment: the `adapters` sidecar
(the operator's model-server image: `python -m model_server.adapters` from this checkout) and
the vLLM container, each from its rendered command line, volumes as local directories, and the
ConfigMap's file rewritten the way the kubelet updates a mounted ConfigMap (a new file swapped
in). The adapters come from a stand-in of the Hugging Face Hub on loopback.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from inference_operator.builders import Owner, build_all
from inference_operator.builders.adapters import CONFIG_KEY, FILES_DIR, LIST_DIR, PLUGINS_DIR, PRIVATE_DIR, SIDECAR
from inference_operator.models import parse_spec
from tests.llm.conftest import vllm_python
from tests.llm.tiny_lora import adapter_files
from tests.storage.test_model_fetch_hf import Hub, hub  # noqa: F401  (hub is a fixture)
from testsupport.processes import free_port, stop, wait_http
from testsupport.vllm import local_path, running_vllm
from testsupport.waiting import DEFAULT_TIMEOUT_S, eventually

pytestmark = pytest.mark.slow

MOUNT = "/mnt/models"
PROMPT = "the operator scales the model"
ADAPTERS = {"sql": "hf://org/sql-lora", "chat": "hf://org/chat-lora"}


def rendered(hub_url: str, adapters: list[str]) -> tuple[dict, dict, str]:
    """The vLLM container, the adapters sidecar and the ConfigMap's file for these adapters."""
    spec = parse_spec(
        {
            "model": {"uri": "hf://org/tiny-llama", "huggingFace": {"endpoint": hub_url}},
            "runtime": {"engine": "vllm", "maxModelLen": 256, "lora": {"maxLoras": 2, "maxLoraRank": 8}},
            "resources": {"gpu": {"count": 0}},
            "adapters": [{"name": name, "uri": ADAPTERS[name]} for name in adapters],
        }
    )
    objects = {obj["kind"]: obj for obj in build_all(Owner("tiny", "default", "uid-1", spec))}
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["initContainers"] if c["name"] == SIDECAR)
    return pod["containers"][0], sidecar, objects["ConfigMap"]["data"][CONFIG_KEY]


def publish(list_dir: pathlib.Path, document: str) -> None:
    """Write the ConfigMap's file as the kubelet does: whole, then swapped in."""
    partial = list_dir / f".{CONFIG_KEY}.new"
    partial.write_text(document)
    partial.rename(list_dir / CONFIG_KEY)


class Replica:
    """One pod: its volumes as directories, its sidecar's and vLLM's addresses."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.volumes = {d: root / d.strip("/").replace("/", "-") for d in (LIST_DIR, FILES_DIR, PLUGINS_DIR)}
        for local in self.volumes.values():
            local.mkdir(parents=True)
        self.vllm_port = free_port()
        self.sidecar_port = free_port()
        self.vllm = f"http://127.0.0.1:{self.vllm_port}"
        self.sidecar = f"http://127.0.0.1:{self.sidecar_port}"

    def adapters(self) -> dict[str, dict]:
        return {a["name"]: a for a in httpx.get(f"{self.sidecar}/adapters", timeout=5).json()["adapters"]}

    def served(self) -> set[str]:
        models = httpx.get(f"{self.vllm}/v1/models", timeout=5).json()["data"]
        return {m["id"] for m in models if m.get("parent")}

    def complete(self, model: str) -> httpx.Response:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
        return httpx.post(f"{self.vllm}/v1/completions", json=body, timeout=60)


@contextlib.contextmanager
def running_sidecar(container: dict, replica: Replica) -> Iterator[subprocess.Popen]:
    """The rendered sidecar, on this replica's directories and ports, with this checkout's code."""
    args = []
    for part in container["command"]:
        flag, _, value = part.partition("=")
        if flag == "--engine":
            value = replica.vllm
        elif flag == "--port":
            value = str(replica.sidecar_port)
        args.append(f"{flag}={local_path(value, replica.volumes)}" if value else part)
    args = [sys.executable if part == "python" else part for part in args] + ["--host=127.0.0.1", "--interval=0.5"]
    # The sidecar's own /tmp (its HOME and tools' configuration) is a volume vLLM does not mount.
    mounts = {**replica.volumes, PRIVATE_DIR: replica.root / "sidecar-home"}
    mounts[PRIVATE_DIR].mkdir(exist_ok=True)
    env = {var["name"]: local_path(var["value"], mounts) for var in container["env"] if "value" in var}
    env |= {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(sys.path)}
    log = replica.root / "sidecar.log"
    with log.open("wb") as out:
        process = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # vLLM starts once the sidecar is live (its startup probe): the guard is in place.
        wait_http(f"{replica.sidecar}/health/live", process, timeout=30, log=log)
        yield process
    finally:
        stop(process)


def wait(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until `condition` holds (a figure for the log: the bound is `eventually`'s)."""
    started = time.monotonic()
    eventually(condition, timeout=max(timeout, DEFAULT_TIMEOUT_S), interval=0.2, what=what)
    return time.monotonic() - started


@contextlib.contextmanager
def pod(
    replica: Replica, hub_url: str, adapters: list[str], model_dir: pathlib.Path, workdir: pathlib.Path
) -> Iterator[subprocess.Popen]:
    vllm_container, sidecar, document = rendered(hub_url, adapters)
    publish(replica.volumes[LIST_DIR], document)
    with (
        running_sidecar(sidecar, replica),
        running_vllm(vllm_container, model_dir, MOUNT, replica.vllm_port, workdir, volumes=replica.volumes) as vllm,
    ):
        yield vllm


# On real pods (tests/llm/test_vllm_pods.py): an adapter served and answering differently, one
# added to the running replica and one removed, a rolled replica ready only with its adapter, the
# management endpoints refused to another pod through the front.
@pytest.mark.proven_on_pods("tests/llm/test_vllm_pods.py")
def test_adapters_load_and_unload_in_running_vllm_and_a_new_replica_starts_with_all(
    hub: Hub,  # noqa: F811
    tiny_llama: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    vllm_python()
    # The adapters live in a ConfigMap, not in the pod: changing them must not restart a pod.
    assert rendered(hub.url, ["sql"])[:2] == rendered(hub.url, ["chat", "sql"])[:2]
    hub.others |= {"org/sql-lora": adapter_files(seed=1), "org/chat-lora": adapter_files(seed=2)}
    first = Replica(tmp_path / "pod-1")
    (tmp_path / "vllm-1").mkdir()
    with pod(first, hub.url, ["sql"], tiny_llama, tmp_path / "vllm-1") as vllm:
        # The replica's first list is loaded before it reports ready.
        loaded = wait(lambda: httpx.get(f"{first.sidecar}/ready").status_code == 200, 120, "first list loaded")
        assert first.adapters()["sql"]["state"] == "Ready" and first.served() == {"sql"}
        base, sql = first.complete("tiny"), first.complete("sql")
        assert base.status_code == sql.status_code == 200, sql.text
        assert sql.json()["model"] == "sql"
        assert sql.json()["choices"][0]["text"] != base.json()["choices"][0]["text"], "the adapter changed nothing"

        # Added to the spec: loaded into the running server, no restart.
        _, _, both = rendered(hub.url, ["sql", "chat"])
        publish(first.volumes[LIST_DIR], both)
        added = wait(lambda: first.adapters().get("chat", {}).get("state") == "Ready", 120, "chat loaded")
        assert first.served() == {"sql", "chat"}
        assert first.complete("chat").status_code == 200

        # Only the pod itself may manage adapters: the guard vLLM loaded refuses anyone else.
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as outsider:
            refused = outsider.post(f"{first.vllm}/v1/unload_lora_adapter", json={"lora_name": "sql"})
            assert refused.status_code == 403, refused.text
            assert outsider.post(f"{first.vllm}/v1/completions", json={"model": "sql", "prompt": PROMPT}).is_success
        # Behind the pod's front every client comes from loopback; the front names the real one
        # (X-Forwarded-For, which vLLM's server trusts from loopback), and the guard refuses it too.
        behind_front = httpx.post(
            f"{first.vllm}/v1/unload_lora_adapter", json={"lora_name": "sql"}, headers={"X-Forwarded-For": "10.9.8.7"}
        )
        assert behind_front.status_code == 403, behind_front.text
        assert first.served() == {"sql", "chat"}

        # A new replica starts with both, and is ready only once both are loaded.
        second = Replica(tmp_path / "pod-2")
        (tmp_path / "vllm-2").mkdir()
        with pod(second, hub.url, ["sql", "chat"], tiny_llama, tmp_path / "vllm-2"):
            wait(lambda: httpx.get(f"{second.sidecar}/ready").status_code == 200, 120, "second replica ready")
            assert {n: a["state"] for n, a in second.adapters().items()} == {"sql": "Ready", "chat": "Ready"}
            assert second.served() == {"sql", "chat"}
            assert (
                second.complete("chat").json()["choices"][0]["text"]
                == first.complete("chat").json()["choices"][0]["text"]
            )

        # Removed from the spec: unloaded, its files gone, its name no longer served.
        _, _, chat_only = rendered(hub.url, ["chat"])
        publish(first.volumes[LIST_DIR], chat_only)
        removed = wait(lambda: first.served() == {"chat"}, 60, "sql unloaded")
        assert first.complete("sql").status_code == 404
        assert list(first.volumes[FILES_DIR].glob("sql-*")) == []
        assert set(first.adapters()) == {"chat"}
    print(
        f"\nLoRA on CPU vLLM: vLLM up in {vllm.startup_seconds:.1f} s, its first adapter ready {loaded:.1f} s later; "
        f"an added adapter served after {added:.1f} s, a removed one gone after {removed:.1f} s"
    )
