"""vLLM on real pods: an `engine: vllm` InferenceService from the operator's Deployment, run by a
kubelet, in the vLLM image built from the shipped vllm/Dockerfile (its CPU variant).

A tiny random Llama and a LoRA adapter, made here, are served by a stand-in of the Hugging Face
Hub over https on the tier's bridge (a certificate from the tier's CA, which the chart's
model-fetch CA setting trusts) and fetched as a user's model would be: by the pod's model-fetch
init container and its adapters sidecar, with a Hub token from a Secret. The tests run in order on
one cluster and one InferenceService, in namespaces that enforce Pod Security `restricted`.
The last tests put the vLLM project's router (routing.router, its image built from the shipped
router/Dockerfile) in front of two replicas of that service, which a spec patch then takes to
zero (autoscaling.scaleToZero) and requests held at zero bring back through the router; then
in its P/D mode in front of one prefill and one decode replica (spec.disaggregation: vLLM's
NixlConnector over UCX, the KV blocks in host memory), whose answers are the aggregated
replicas'. Spec patches then take that pair to zero (disaggregation.scaleToZero) and back on
held requests, with two prefill replicas, one of which is deleted under load.
"""

from __future__ import annotations

import base64
import concurrent.futures
import datetime
import hashlib
import http.server
import json
import pathlib
import random
import re
import secrets
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import pytest

from inference_operator.builders.common import engine_port
from inference_operator.builders.router import METRICS_PORT as ROUTER_METRICS_PORT
from inference_operator.engines.vllm import PRE_STOP_SECONDS
from inference_operator.models import parse_spec
from tests.llm.tiny_lora import adapter_files
from tests.observability import dashboard
from tests.tiers.pods import (
    FIGURES,
    OPERATOR_NAMESPACE,
    PodPrometheus,
    activator_slices,
    apply,
    bridge_server,
    chart_values,
    helm_install,
    kubectl_json,
    namespace,
    pod_prometheus,
    pods,
    run_client_pod,
    tier,
    wait_ready_pods,
)
from tests.tiers.pods import ready as pod_ready
from testsupport import images
from testsupport.cluster import condition, wait_for
from testsupport.load import CompletionLoad
from testsupport.nodecluster import NODE_IP, NODE_NAME, NodeCluster
from testsupport.otlp import Receiver, otlp_receiver
from testsupport.pd import prompt_token_sources
from testsupport.router import VOCABULARY, replica_counters, shared_prefix_prompts

# The first test also waits for the tier: its images (the vLLM image is 2.7 GB to import) and cluster.
pytestmark = [pytest.mark.pods, pytest.mark.slow, pytest.mark.timeout(900)]

NS = "llm"
NAME = "tiny"
RELEASE = "rio-llm"
SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=predictor"
COMMIT = "5d0c1e4b2f7a9c3e8b6d4f2a0c9e7b5d3f1a8c6e"
# The Hub token: in a Secret, given to the model fetch and the adapters sidecar, never to vLLM.
TOKEN = f"hf_tier_{secrets.token_hex(16)}"
PROMPT = "the operator scales the model"
# Without one, vLLM refuses /v1/chat/completions for a model whose tokenizer has no template.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"


@dataclass
class Hub:
    """What the stand-in Hub serves (repository id -> files) and who asked for what."""

    repos: dict[str, dict[str, bytes]]
    url: str = ""
    ca: pathlib.Path = pathlib.Path()
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization)

    def tree(self, repo: str) -> list[dict[str, Any]]:
        """The tree the Hub publishes: each file's git blob id, and an LFS file's sha256."""
        entries = []
        for path, data in self.repos[repo].items():
            entry: dict[str, Any] = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
            if path.endswith(".safetensors"):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return entries


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hub_handler(hub: Hub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def do_HEAD(self) -> None:  # noqa: N802
            self.answer(body=False)

        def do_GET(self) -> None:  # noqa: N802
            self.answer(body=True)

        def reply(
            self, data: bytes, status: int = 200, headers: dict[str, str] | None = None, body: bool = True
        ) -> None:
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def answer(self, body: bool) -> None:
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            hub.requests.append((path, self.headers.get("Authorization")))
            api = re.match(r"^/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)", path)
            if api and api[1] in hub.repos:
                if api[2] == "revision":
                    siblings = [{"rfilename": f} for f in hub.repos[api[1]]]
                    info = {"id": api[1], "sha": COMMIT, "siblings": siblings}
                    return self.reply(json.dumps(info).encode(), body=body)
                return self.reply(json.dumps(hub.tree(api[1])).encode(), body=body)
            resolve = re.match(rf"^/([^/]+/[^/]+)/resolve/{COMMIT}/(.+)$", path)
            files = hub.repos.get(resolve[1], {}) if resolve else {}
            if resolve and resolve[2] in files:
                data = files[resolve[2]]
                lfs = resolve[2].endswith(".safetensors")
                etag = hashlib.sha256(data).hexdigest() if lfs else git_blob_id(data)
                headers = {"Content-Type": "application/octet-stream", "X-Repo-Commit": COMMIT, "ETag": f'"{etag}"'}
                return self.reply(data, headers=headers, body=body)
            self.reply(b'{"error": "Repository not found"}', status=404, body=body)

    return Handler


def hub_repos(model_dir: pathlib.Path) -> dict[str, dict[str, bytes]]:
    model = {p.name: p.read_bytes() for p in sorted(model_dir.iterdir()) if p.is_file()}
    tokenizer = json.loads(model["tokenizer_config.json"])
    model["tokenizer_config.json"] = json.dumps({**tokenizer, "chat_template": CHAT_TEMPLATE}).encode()
    # Room for completions long enough to outlast a pod's preStop sleep (the rolling update's streams).
    config = json.loads(model["config.json"])
    model["config.json"] = json.dumps({**config, "max_position_embeddings": MAX_MODEL_LEN}).encode()
    return {"org/tiny-llama": model, "org/sql-lora": adapter_files(seed=1), "org/chat-lora": adapter_files(seed=2)}


@pytest.fixture(scope="module")
def node(project_images: list[str], vllm_image: str, router_image: str) -> Iterator[NodeCluster]:
    with tier([*project_images, vllm_image, router_image], "test_vllm_pods") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def hub(node: NodeCluster, tiny_llama: pathlib.Path) -> Iterator[Hub]:  # noqa: F811
    state = Hub(hub_repos(tiny_llama))
    with bridge_server(hub_handler(state), node) as server:
        state.url, state.ca = server.url, server.ca
        yield state


@pytest.fixture(scope="module")
def traces(node: NodeCluster) -> Iterator[Receiver]:
    """Where the service's vLLM sends its traces: a receiver on the tier's bridge address."""
    with otlp_receiver(host=NODE_IP) as receiver:
        yield receiver


@pytest.fixture(scope="module")
def prometheus(node: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodPrometheus]:
    with pod_prometheus(node, tmp_path_factory.mktemp("prom"), [NS]) as prom:
        yield prom


@pytest.fixture(scope="module")
def release(node: NodeCluster, hub: Hub, prometheus: PodPrometheus, tmp_path_factory: pytest.TempPathFactory) -> dict:
    apply(node, namespace(OPERATOR_NAMESPACE), namespace(NS))
    values = chart_values(
        hub.ca.read_text(),
        images={"modelServer": images.MODEL_SERVER_IMAGE, "vllm": images.vllm_image(), "router": images.ROUTER_IMAGE},
        replicaCount=1,
        # The stand-in Hub is the platform's mirror: a token may be sent there.
        huggingFace={"tokenEndpoints": [hub.url]},
        # The autoscaler reads the tier's Prometheus, which scrapes the vLLM pods.
        prometheus={"allowedUrls": [prometheus.url]},
    )
    return helm_install(node, RELEASE, values, tmp_path_factory.mktemp("helm"))


# The node's 2 CPUs hold two vLLM pods only without the adapters sidecar: the service starts
# without LoRA at LIGHT_CPU, so that it can scale to two replicas (2 x (750m + the front's 200m),
# with the operator's and the activator's 50m each). Its rolling update to runtime.lora then puts a
# LORA_CPU pod (with the sidecar's 250m and the front's 200m) beside the light one.
LIGHT_CPU = "750m"
LORA_CPU = "500m"
# vLLM's batch on a GPU is bounded by its KV cache; the tiny model's is not, so a small batch
# stands in for it: beyond four sequences requests wait, and the time to first token grows with load.
MAX_NUM_SEQS = 4
TTFT_TARGET_MS = 400
MAX_MODEL_LEN = 2048
STEADY_MS = 1e6  # a target no load reaches: the replica count holds


def inference_service(
    hub: Hub,
    prometheus: PodPrometheus,
    adapters: list[dict[str, str]] | None,
    target_ms: float = STEADY_MS,
    traces: Receiver | None = None,
) -> dict:
    """The service; without LoRA when `adapters` is None (LIGHT_CPU), with it otherwise (LORA_CPU);
    vLLM's traces sent to `traces` (sampled only where a caller sampled its trace)."""
    runtime: dict[str, Any] = {
        "engine": "vllm",
        "imagePullPolicy": "Never",
        "maxModelLen": MAX_MODEL_LEN,
        # Eager: the tier's CPU image has no C++ compiler for torch.compile (with LoRA vLLM runs eager anyway).
        "args": [f"--max-num-seqs={MAX_NUM_SEQS}", "--enforce-eager"],
        "env": [
            # What a CPU node needs instead of a GPU's memory: the KV cache in host RAM (GiB).
            {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
            # S3 for s3:// adapters: the bridge, where nothing answers S3.
            {"name": "AWS_ENDPOINT_URL", "value": f"https://{NODE_IP}:9"},
            {"name": "AWS_REGION", "value": "us-east-1"},
        ],
    }
    spec: dict[str, Any] = {
        "model": {
            "uri": "hf://org/tiny-llama",
            "huggingFace": {"endpoint": hub.url, "tokenSecret": "hf"},
            # The model, and vLLM's compile cache, on a claim the replicas share.
            "cachePvc": CACHE_CLAIM,
        },
        "runtime": runtime,
        "resources": {"gpu": {"count": 0}, "cpu": LIGHT_CPU if adapters is None else LORA_CPU, "memory": "4Gi"},
        "autoscaling": {
            "minReplicas": 1,
            "maxReplicas": 2,
            "metric": "ttftP95Ms",
            "target": target_ms,
            "prometheusUrl": prometheus.url,
            "intervalSeconds": 1,
            "windowSeconds": 10,
            "scaleDownStabilizationSeconds": 3,
            "scaleUp": {"pods": 1, "percent": 1, "periodSeconds": 3},
            "scaleDown": {"pods": 4, "percent": 100, "periodSeconds": 1},
        },
    }
    if traces is not None:
        runtime["tracing"] = {"endpoint": traces.url, "samplingRatio": 0.0}
    if adapters is not None:
        runtime["lora"] = {"maxLoras": 2, "maxLoraRank": 8}
        spec["adapters"] = adapters
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": spec,
    }


SQL = {"name": "sql", "uri": "hf://org/sql-lora"}
CHAT = {"name": "chat", "uri": "hf://org/chat-lora"}
CACHE_CLAIM = "llm-cache"


def ris(node: NodeCluster) -> dict:
    return kubectl_json(node, "get", "ris", NAME, "-n", NS)


def service_address(node: NodeCluster) -> str:
    service = kubectl_json(node, "get", "service", NAME, "-n", NS)
    return f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"


def vllm_pod(node: NodeCluster) -> str:
    (pod,) = [p for p in pods(node, NS, SELECTOR) if not p["metadata"].get("deletionTimestamp")]
    return str(pod["metadata"]["name"])


def vllm_start_to_ready(node: NodeCluster, name: str | None = None) -> float:
    """Seconds from the vLLM container's start to its pod's Ready (the only pod's, or `name`'s), as
    the kubelet recorded them."""
    pod = kubectl_json(node, "get", "pod", name or vllm_pod(node), "-n", NS)
    (vllm,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "vllm"]
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    started = datetime.datetime.fromisoformat(vllm["state"]["running"]["startedAt"])
    return (datetime.datetime.fromisoformat(ready["lastTransitionTime"]) - started).total_seconds()


def in_vllm(node: NodeCluster, script: str, timeout: float = 120) -> str:
    """Run Python in the running vLLM container, as its process runs: its user, mounts and env."""
    done = node.kubectl("exec", "-n", NS, vllm_pod(node), "-c", "vllm", "--", "python3", "-c", script, check=False)
    assert done.returncode == 0, f"exec in the vLLM container failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def complete(address: str, model: str, chat: bool = False, stream: bool = False) -> str:
    """The text of one completion over the Service (streamed: the chunks' text joined)."""
    body: dict[str, Any] = {"model": model, "max_tokens": 8, "temperature": 0, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    path = "/v1/chat/completions" if chat else "/v1/completions"
    with httpx.stream("POST", f"http://{address}{path}", json=body, timeout=60) as response:
        raw = response.read().decode()
        assert response.status_code == 200, raw
    if not stream:
        choice = json.loads(raw)["choices"][0]
        return str(choice["message"]["content"] if chat else choice["text"])
    events = [line.removeprefix("data: ") for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", raw
    chunks = [json.loads(e)["choices"] for e in events[:-1]]
    return "".join(c[0]["delta"].get("content") or "" if chat else c[0]["text"] for c in chunks if c)


@pytest.fixture(scope="module")
def cache_volume(node: NodeCluster, release: dict, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A `local` PersistentVolume on the node (a kind whose files the kubelet hands to the pod's
    fsGroup, as a cloud disk's are) and the claim CACHE_CLAIM bound to it; its directory."""
    directory = tmp_path_factory.mktemp("llm-cache-volume")
    directory.chmod(0o755)  # root's, as a fresh disk is: only the fsGroup makes it the pod's
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{NS}-{CACHE_CLAIM}"},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "local-cache",
            "local": {"path": str(directory)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}
                            ]
                        }
                    ]
                }
            },
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CACHE_CLAIM, "namespace": NS},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "local-cache",
            "volumeName": volume["metadata"]["name"],
            "resources": {"requests": {"storage": "10Gi"}},
        },
    }
    apply(node, volume, claim)
    wait_for(
        lambda: kubectl_json(node, "get", "pvc", CACHE_CLAIM, "-n", NS).get("status", {}).get("phase") == "Bound",
        timeout=60,
        message="the cache claim bound",
    )
    return directory


@pytest.fixture(scope="module")
def hub_secret(node: NodeCluster, release: dict) -> None:
    """The Hub token's Secret, which model.huggingFace.tokenSecret names."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf", "namespace": NS, "labels": {"inference.rocm.dev/model-credentials": "true"}},
        "stringData": {"token": TOKEN},
    }
    apply(node, secret)


# What a client pod prints for completions and chat, streamed and not, over both APIs.
BOTH_APIS_ANSWERED = [
    "/v1/completions False 200 True",
    "/v1/completions True 200 True",
    "/v1/chat/completions False 200 True",
    "/v1/chat/completions True 200 True",
]


def both_apis_script(address: str) -> str:
    """A client pod's script: completions and chat, streamed and not, at `address`; a line each
    (BOTH_APIS_ANSWERED when every one answered whole)."""
    return (
        "import json, urllib.request\n"
        "for path, body in (('/v1/completions', {'prompt': 'the model'}),"
        " ('/v1/chat/completions', {'messages': [{'role': 'user', 'content': 'the model'}]})):\n"
        "    for stream in (False, True):\n"
        f"        data = json.dumps({{'model': '{NAME}', 'max_tokens': 4, 'stream': stream, **body}}).encode()\n"
        f"        request = urllib.request.Request('http://{address}' + path, data=data,"
        " headers={'Content-Type': 'application/json'})\n"
        "        with urllib.request.urlopen(request, timeout=60) as r:\n"
        "            text = r.read().decode()\n"
        "        print(path, stream, r.status, text.rstrip().endswith('[DONE]') if stream else 'choices' in text)\n"
    )


def test_a_vllm_service_fetches_its_model_from_the_hub_and_turns_ready(
    node: NodeCluster,
    release: dict,
    hub: Hub,
    prometheus: PodPrometheus,
    traces: Receiver,
    cache_volume: pathlib.Path,
    hub_secret: None,
) -> None:
    applied = time.monotonic()
    apply(node, inference_service(hub, prometheus, None, TTFT_TARGET_MS, traces=traces))
    wait_ready_pods(node, NS, SELECTOR, 1, timeout=420)
    FIGURES["vLLM InferenceService applied to Ready pod (s)"] = time.monotonic() - applied
    FIGURES[f"vLLM start to Ready, first replica, cold, {LIGHT_CPU} (s)"] = vllm_start_to_ready(node)
    FIGURES["images imported into the node's containerd, vLLM's included (s)"] = node.import_seconds
    wait_for(lambda: (condition(ris(node), "Ready") or {}).get("status") == "True", timeout=60, message="Ready")
    address = service_address(node)
    started = time.monotonic()
    complete(address, NAME)
    FIGURES["vLLM first completion over the ClusterIP (s)"] = time.monotonic() - started
    # The model came through the Hub with the Secret's token (the fetcher sent it).
    assert ("/api/models/org/tiny-llama/revision/main", f"Bearer {TOKEN}") in hub.requests


def test_openai_completions_and_chat_stream_and_not_from_the_host_and_from_a_pod(
    node: NodeCluster, hub: Hub, prometheus: PodPrometheus
) -> None:
    address = service_address(node)
    pod = kubectl_json(node, "get", "pod", vllm_pod(node), "-n", NS)
    engine = f"{pod['status']['podIP']}:{engine_port(parse_spec(inference_service(hub, prometheus, None)['spec']))}"
    answers = {
        (chat, stream): complete(address, NAME, chat, stream) for chat in (False, True) for stream in (False, True)
    }
    assert all(answers.values()), answers
    # Greedy decoding: streamed or not, the same text.
    assert answers[(False, False)] == answers[(False, True)] and answers[(True, False)] == answers[(True, True)]
    script = both_apis_script(address) + (
        "try:\n"
        f"    urllib.request.urlopen(urllib.request.Request('http://{address}/v1/load_lora_adapter',"
        " data=json.dumps({'lora_name': 'mine', 'lora_path': '/tmp'}).encode(),"
        " headers={'Content-Type': 'application/json'}), timeout=30)\n"
        "    print('load', 200)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print('load', e.code)\n"
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('{engine.split(':')[0]}', {engine.split(':')[1]}), timeout=10).close()\n"
        "    print('engine', 'open')\n"
        "except OSError as e:\n"
        "    print('engine', type(e).__name__)\n"
    )
    output = run_client_pod(node, NS, "client", script)
    assert output.split("\n") == [
        *BOTH_APIS_ANSWERED,
        # Only the pod itself may manage adapters: the front refuses another pod.
        "load 403",
        # vLLM's own port listens on the pod's loopback: only the front reaches it.
        "engine ConnectionRefusedError",
    ], output


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"


def test_vllm_continues_a_sampled_callers_trace_and_exports_it_where_the_spec_says(
    node: NodeCluster, traces: Receiver
) -> None:
    """runtime.tracing on a real pod: through the Service and the front, vLLM continues a caller's
    sampled trace and exports its span to the spec's endpoint; the unsampled requests before this
    one (every other in this module) start none, at samplingRatio 0."""
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 4, "ignore_eos": True}
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"}
    answer = httpx.post(f"http://{service_address(node)}/v1/completions", json=body, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    traces.wait_for(lambda got: any(s.name == "llm_request" for s in got), timeout=60)
    (span,) = traces.named("llm_request")
    assert (span.trace_id, span.parent_id) == (TRACE_ID, PARENT_SPAN_ID)
    assert span.attributes["gen_ai.usage.completion_tokens"] == 4


def new_ready_pod(node: NodeCluster, old: set[str]) -> dict | None:
    return next((p for p in pods(node, NS, SELECTOR) if p["metadata"]["name"] not in old and pod_ready(p)), None)


def test_time_to_first_token_under_load_scales_to_a_second_replica_from_the_claim_and_back(
    node: NodeCluster, hub: Hub, prometheus: PodPrometheus, cache_volume: pathlib.Path
) -> None:
    """The built-in autoscaler on vLLM's TTFT p95 from the tier's Prometheus: two replicas under
    load, one when it stops. The second starts from the claim, which holds the model and vLLM's
    cache directory (VLLM_CACHE_ROOT, under the service's own directory) in files the pod's fsGroup
    owns: it downloads nothing. (The tier's CPU image has no C++ compiler, so vLLM runs eager there
    and writes no compiled graphs; bench/vllm_start.py measures the compile cache's warm start as
    processes.)"""
    cache = cache_volume / "vllm-cache" / NAME
    assert (cache / "modelinfos").is_dir(), "vLLM wrote nothing to its cache directory on the claim"
    files = [path for path in cache_volume.rglob("*") if path.is_file()]
    assert files and all(path.stat().st_gid == 1000 for path in files)  # the pod's fsGroup
    wait_for(lambda: prometheus.value(f'sum(up{{namespace="{NS}"}})') == 1, timeout=30, message="vLLM scraped")
    first, downloads = vllm_pod(node), len(hub.requests)
    url = f"http://{service_address(node)}/v1/completions"
    load = CompletionLoad(url, NAME, concurrency=4 * MAX_NUM_SEQS, max_seconds=300, max_tokens=32).start()
    try:
        wait_for(
            lambda: ris(node)["spec"].get("replicas") == 2 == ris(node)["status"]["autoscaler"]["desiredReplicas"],
            timeout=90,
            interval=0.5,
            message="scale-up to two replicas",
        )
        scaled = time.monotonic()
        FIGURES["vLLM load start to scale-up on TTFT (s)"] = time.time() - load.started_at
        status = ris(node)["status"]["autoscaler"]
        assert status["metric"] == "ttftP95Ms" and status["currentValue"] > TTFT_TARGET_MS, status
        second = wait_for(lambda: new_ready_pod(node, {first}), timeout=300, interval=0.25, message="a second replica")
        FIGURES["vLLM scale-up to second replica Ready (s)"] = time.monotonic() - scaled
        name = second["metadata"]["name"]
        FIGURES[f"vLLM start to Ready, second replica, warm from the claim, {LIGHT_CPU} (s)"] = vllm_start_to_ready(
            node, name
        )
        # It serves: a completion sent to its own address.
        (front,) = [c for c in second["spec"]["initContainers"] if c["name"] == "front"]
        port = front["ports"][0]["containerPort"]
        body = {"model": NAME, "prompt": PROMPT, "max_tokens": 4}
        answer = httpx.post(f"http://{second['status']['podIP']}:{port}/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
    finally:
        load.stop()
    assert load.sent > 20 and load.failed == 0, (load.sent, load.failures)
    # The second replica's model came from the claim: nothing was downloaded.
    assert not [path for path, _ in hub.requests[downloads:] if "/resolve/" in path], hub.requests[downloads:]
    stopped = time.monotonic()
    wait_for(lambda: ris(node)["spec"].get("replicas") == 1, timeout=90, interval=0.5, message="scale-down")
    FIGURES["vLLM load stopped to scale-down to one replica (s)"] = time.monotonic() - stopped


@dataclass
class Stream:
    started: float
    ended: float = 0.0
    outcome: str = ""  # "ok", "failed: <why>" (no answer, or not 200) or "cut: <what>" (200, then short)


def stream_once(client: httpx.Client, url: str, max_tokens: int) -> Stream:
    """One streamed completion of `max_tokens`, checked whole: every token, the length finish, [DONE]."""
    body = {
        "model": NAME,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stream = Stream(started=time.time())
    tokens, finish, done, usage = 0, None, False, None
    try:
        with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                stream.outcome = f"failed: {response.status_code} {response.read()[:200]!r}"
            for line in response.iter_lines() if not stream.outcome else ():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line.removeprefix("data: "))
                    tokens += sum(1 for choice in event.get("choices") or [] if choice.get("text"))
                    finish = next(
                        (c["finish_reason"] for c in event.get("choices") or [] if c.get("finish_reason")), finish
                    )
                    usage = event.get("usage") or usage
    except httpx.HTTPError as exc:
        stream.outcome = f"{'cut' if tokens else 'failed'}: {type(exc).__name__} after {tokens} tokens"
    counted = (usage or {}).get("completion_tokens")
    if not stream.outcome:
        whole = done and finish == "length" and counted == max_tokens
        stream.outcome = "ok" if whole else f"cut: {tokens} tokens, usage {counted}, finish {finish}, [DONE] {done}"
    stream.ended = time.time()
    return stream


class StreamLoad:
    """`concurrency` clients, each streaming completions of `max_tokens` over the Service back to
    back (keeping its connection alive, as OpenAI's clients do), their starts spread over one
    stream's length `seconds_each`, so that a stream is always about to begin and others well under way."""

    def __init__(self, url: str, concurrency: int, max_tokens: int, seconds_each: float) -> None:
        self.url, self.max_tokens, self.seconds_each = url, max_tokens, seconds_each
        self.streams: list[Stream] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i / concurrency,)) for i in range(concurrency)]

    def _client(self, phase: float) -> None:
        if self._stop.wait(phase * self.seconds_each):
            return
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                self.streams.append(stream_once(client, self.url, self.max_tokens))

    def start(self) -> StreamLoad:
        for thread in self._threads:
            thread.start()
        return self

    def finish(self) -> None:
        """No new stream; those in flight go on."""
        self._stop.set()

    def stop(self) -> None:
        """No new stream; those in flight finish."""
        self.finish()
        for thread in self._threads:
            thread.join(150)

    def outcomes(self, prefix: str) -> list[str]:
        return [s.outcome for s in self.streams if s.outcome.startswith(prefix)]


def stream_rate(address: str, concurrency: int) -> float:
    """Tokens a second of one stream among `concurrency` at once, measured on 64-token streams."""

    def one(_: int) -> Stream:
        with httpx.Client(timeout=120) as client:
            return stream_once(client, f"http://{address}/v1/completions", 64)

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        streams = list(pool.map(one, range(concurrency)))
    assert all(s.outcome == "ok" for s in streams), [s.outcome for s in streams]
    return 64 / max(s.ended - s.started for s in streams)


def test_a_rolling_update_with_streams_in_flight_cuts_no_stream_and_fails_no_request(
    node: NodeCluster, hub: Hub, prometheus: PodPrometheus, traces: Receiver
) -> None:
    """A spec change (runtime.lora and an adapter, which the next tests use) rolls the Deployment
    while streamed completions run: the old pod's streams end whole (the preStop keeps it serving
    while endpoints drop it, vLLM drains what it streams within the grace period) and every
    request is answered. The new pod starts from the claim."""
    address = service_address(node)
    # The scale-down before may still be stopping its replica: the old pod is the one that stays.
    wait_for(lambda: len(pods(node, NS, SELECTOR)) == 1, timeout=120, message="the scaled-down replica gone")
    old = {p["metadata"]["name"] for p in pods(node, NS, SELECTOR)}
    downloads = len(hub.requests)
    rate = stream_rate(address, MAX_NUM_SEQS)
    # Each stream outlasts the preStop sleep after its pod is deleted, so some are in flight at SIGTERM:
    # three times it, since the rate is measured once and the other test worker's load comes and
    # goes (at twice, streams run faster than measured all ended before the SIGTERM once).
    seconds_each = 3 * PRE_STOP_SECONDS
    max_tokens = min(int(rate * seconds_each), MAX_MODEL_LEN - 64)
    load = StreamLoad(f"http://{address}/v1/completions", MAX_NUM_SEQS, max_tokens, seconds_each).start()
    deleted: dict[str, float] = {}

    def rolled() -> bool:
        current = pods(node, NS, SELECTOR)
        for pod in current:
            meta = pod["metadata"]
            if meta["name"] in old and meta.get("deletionTimestamp") and meta["name"] not in deleted:
                stamp = datetime.datetime.fromisoformat(meta["deletionTimestamp"]).timestamp()
                deleted[meta["name"]] = stamp - meta["deletionGracePeriodSeconds"]
        if deleted and time.time() > max(deleted.values()) + PRE_STOP_SECONDS + 1:
            load.finish()  # the clients that left the old pod have reconnected: enough
        return not {p["metadata"]["name"] for p in current} & old and all(pod_ready(p) for p in current)

    try:
        applied = time.monotonic()
        apply(node, inference_service(hub, prometheus, [SQL], traces=traces))
        wait_for(rolled, timeout=420, interval=0.25, message="the new pod Ready and the old ones gone")
        FIGURES["vLLM spec change to the rolled-out pod Ready and the old one gone, streaming (s)"] = (
            time.monotonic() - applied
        )
    finally:
        load.stop()
    (new,) = pods(node, NS, SELECTOR)
    ready_at = datetime.datetime.fromisoformat(
        next(c for c in new["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"]
    ).timestamp()
    FIGURES["vLLM rolling update: streams sent"] = len(load.streams)
    FIGURES["vLLM rolling update: streams failed"] = len(load.outcomes("failed"))
    FIGURES["vLLM rolling update: streams cut"] = len(load.outcomes("cut"))
    # A failure names its stream's start and end in seconds from the old pod's deletion (its
    # preStop drains the front at 0, closes idle connections at PRE_STOP_SECONDS - 1, and vLLM
    # gets SIGTERM at PRE_STOP_SECONDS) and from the new pod's Ready.
    gone = min(deleted.values())
    assert load.outcomes("ok") and len(load.outcomes("ok")) == len(load.streams), (
        Counter(s.outcome for s in load.streams),
        [(s.outcome, round(s.started - gone, 2), round(s.ended - gone, 2)) for s in load.streams if s.outcome != "ok"],
        {"new pod Ready": round(ready_at - gone, 2)},
    )
    # Streams the old pod was sending when its vLLM got SIGTERM (begun before the new pod was Ready,
    # so on the old one; still going after the deletion and the preStop sleep) ended whole.
    last = max(deleted.values())
    in_flight = [s for s in load.streams if s.started < ready_at and s.ended > last + PRE_STOP_SECONDS]
    FIGURES["vLLM rolling update: streams in flight at the old pod's SIGTERM"] = len(in_flight)
    assert in_flight, (ready_at, deleted, [(s.started, s.ended) for s in load.streams])
    assert not [path for path, _ in hub.requests[downloads:] if "/resolve/" in path and "tiny-llama" in path]
    FIGURES[f"vLLM start to Ready, rolled-out pod, warm from the claim, {LORA_CPU} (s)"] = vllm_start_to_ready(node)


def adapter_state(node: NodeCluster, name: str) -> str | None:
    entry = next((a for a in (ris(node).get("status") or {}).get("adapters") or [] if a["name"] == name), None)
    return entry["state"] if entry else None


def test_the_adapter_is_served_and_answers_differently_and_status_follows(node: NodeCluster, hub: Hub) -> None:
    wait_for(lambda: adapter_state(node, "sql") == "Ready", timeout=120, message="status.adapters sql Ready")
    ready = condition(ris(node), "AdaptersReady") or {}
    assert ready.get("status") == "True", ready
    address = service_address(node)
    models = httpx.get(f"http://{address}/v1/models", timeout=10).json()["data"]
    assert {m["id"] for m in models} == {NAME, "sql"}
    assert complete(address, "sql") != complete(address, NAME), "the adapter changed nothing"
    assert complete(address, "sql", chat=True, stream=True) == complete(address, "sql", chat=True)
    # The sidecar fetched it from the Hub with the token.
    assert ("/api/models/org/sql-lora/revision/main", f"Bearer {TOKEN}") in hub.requests


def test_the_dashboards_llm_panels_return_data(node: NodeCluster, prometheus: PodPrometheus) -> None:
    """The chart dashboard's vLLM queries (tests/observability/dashboard.py), as Grafana sends them
    for this namespace and model, on vLLM's own series after requests to the model and the
    adapter: a metric vLLM renamed leaves a panel empty here."""
    wait_for(lambda: prometheus.value(f'sum(up{{namespace="{NS}"}})') == 1, timeout=30, message="vLLM scraped")
    address = service_address(node)

    def requests() -> None:
        for model in (NAME, "sql", NAME):
            complete(address, model)

    dashboard.wait_for_data(prometheus.url, "vllm", NS, NAME, timeout=60, interval=0.5, before_each=requests)
    dashboard.save_snapshot("vllm", prometheus.url, "vllm", NS, NAME)  # for the docs' picture


def sidecar_restarts(node: NodeCluster) -> int:
    (pod,) = pods(node, NS, SELECTOR)
    statuses = pod["status"].get("initContainerStatuses") or []
    return sum(s.get("restartCount", 0) for s in statuses if s["name"] == "adapters")


# Run in the vLLM container: write an AWS config whose credential_process copies its environment
# (the sidecar's, with HF_TOKEN) into every directory the process running it can write, into
# every directory this container can write; print those directories.
PLANT = """
import base64, os
steal = base64.b64decode({steal!r}).decode()
config = "[default]\\ncredential_process = python3 -c \\"import base64; exec(base64.b64decode('%s'))\\"\\n" % (
    base64.b64encode(steal.encode()).decode())
mounts = sorted({{line.split()[4] for line in open("/proc/self/mountinfo")}} - {{"/"}})
written = []
for mount in mounts:
    for top, dirs, files in os.walk(mount):
        if top.startswith(("/proc", "/sys")):
            dirs.clear()
        elif os.access(top, os.W_OK):
            for name in (".aws", "aws", ".config/aws"):
                try:
                    os.makedirs(os.path.join(top, name), exist_ok=True)
                    for file in ("config", "credentials"):
                        with open(os.path.join(top, name, file), "w") as out:
                            out.write(config)
                    written.append(os.path.join(top, name))
                except OSError:
                    pass
print("\\n".join(written))
"""
STEAL = """
import os
for line in open("/proc/self/mountinfo"):
    point = line.split()[4]
    if os.access(point, os.W_OK) and not point.startswith(("/proc", "/sys")):
        try:
            with open(os.path.join(point, "stolen-%d" % os.getpid()), "w") as out:
                out.write(repr(dict(os.environ)))
        except OSError:
            pass
"""
# Run in the vLLM container: every file it can read under its mounts (its image's own files
# aside) and every /proc entry it can see; print the paths that hold `token`.
SEARCH = """
import os, stat
token = {reversed_token!r}[::-1].encode()  # not the token itself: this command line is readable too
roots = sorted({{line.split()[4] for line in open("/proc/self/mountinfo")}} - {{"/"}})
found, read = [], 0
def look(path, regular=True):
    global read
    try:
        if regular and not stat.S_ISREG(os.lstat(path).st_mode):
            return
        with open(path, "rb") as f:
            data = f.read(256 << 20)
    except OSError:
        return
    read += 1
    if token in data:
        found.append(path)
for root in roots:
    if root.startswith(("/proc", "/sys")):
        continue
    for top, dirs, files in os.walk(root):
        for name in files:
            look(os.path.join(top, name))
for pid in os.listdir("/proc"):
    if pid.isdigit() or pid == "self":
        for entry in ("environ", "cmdline", "mountinfo", "status"):
            look(os.path.join("/proc", pid, entry), regular=False)
print(read)
print("\\n".join(found))
"""


def test_the_hub_token_never_reaches_the_vllm_container(
    node: NodeCluster, hub: Hub, prometheus: PodPrometheus, traces: Receiver
) -> None:
    """Issue 25 H1: code the author runs in the vLLM container (their model's, or runtime.env's)
    plants an AWS config with a credential_process in every directory it can write, then an
    s3:// adapter makes the sidecar, which holds HF_TOKEN, resolve S3 credentials."""
    steal = base64.b64encode(STEAL.encode()).decode()
    planted = in_vllm(node, PLANT.format(steal=steal)).split()
    assert "/tmp/.aws" in planted, planted  # the vLLM container's HOME is writable
    apply(
        node, inference_service(hub, prometheus, [SQL, {"name": "stolen", "uri": "s3://bucket/adapter"}], traces=traces)
    )
    # The sidecar has tried the s3:// adapter (and resolved its credentials) once it reports it,
    # or once it has exited over it.
    wait_for(
        lambda: adapter_state(node, "stolen") in ("Ready", "Failed") or sidecar_restarts(node) > 0,
        timeout=120,
        message="the sidecar's verdict on the s3:// adapter",
    )
    # The token is live in the pod: the sidecar sent it to the Hub.
    assert any(auth == f"Bearer {TOKEN}" and "sql-lora" in path for path, auth in hub.requests)
    search = SEARCH.format(reversed_token=TOKEN[::-1])
    read, *found = in_vllm(node, search).split("\n")
    assert int(read) > 10, read
    assert [f for f in found if f] == [], f"the Hub token is readable in the vLLM container: {found}"
    # What the search reads would show it: the same search finds a planted copy.
    in_vllm(node, f"open('/tmp/canary', 'w').write({TOKEN[::-1]!r}[::-1])")
    assert "/tmp/canary" in in_vllm(node, search).split("\n"), "the search misses a readable file"
    in_vllm(node, "import os; os.remove('/tmp/canary')")
    wait_for(lambda: adapter_state(node, "sql") == "Ready", timeout=30, message="sql still Ready")


def test_an_added_adapter_is_loaded_into_the_running_replica(
    node: NodeCluster, hub: Hub, prometheus: PodPrometheus, traces: Receiver
) -> None:
    """A new entry in spec.adapters reaches the replica through its ConfigMap: loaded into the
    running vLLM, no pod rolled or restarted."""
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(node, NS, SELECTOR) if pod_ready(p)}
    address = service_address(node)
    apply(node, inference_service(hub, prometheus, [SQL, CHAT], traces=traces))
    started = time.monotonic()
    wait_for(lambda: adapter_state(node, "chat") == "Ready", timeout=180, message="status.adapters chat Ready")
    FIGURES["vLLM adapter added to the spec to Ready (s)"] = time.monotonic() - started
    models = httpx.get(f"http://{address}/v1/models", timeout=10).json()["data"]
    assert {m["id"] for m in models} == {NAME, "sql", "chat"}
    assert complete(address, "chat") != complete(address, "sql")
    after = [p for p in pods(node, NS, SELECTOR) if pod_ready(p)]
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in after} == before
    assert all(c["restartCount"] == 0 for p in after for c in p["status"]["containerStatuses"])


def test_a_removed_adapter_is_unloaded_and_a_request_for_it_is_a_404(
    node: NodeCluster, hub: Hub, prometheus: PodPrometheus, traces: Receiver
) -> None:
    address = service_address(node)
    apply(node, inference_service(hub, prometheus, [], traces=traces))
    started = time.monotonic()
    wait_for(
        lambda: {m["id"] for m in httpx.get(f"http://{address}/v1/models", timeout=10).json()["data"]} == {NAME},
        timeout=120,
        message="the adapters gone from /v1/models",
    )
    FIGURES["vLLM adapter removed from the spec to unloaded (s)"] = time.monotonic() - started
    body = {"model": "sql", "prompt": PROMPT, "max_tokens": 4}
    response = httpx.post(f"http://{address}/v1/completions", json=body, timeout=30)
    assert response.status_code == 404, response.text
    wait_for(lambda: adapter_state(node, "sql") is None, timeout=60, message="sql gone from status.adapters")
    assert complete(address, NAME)  # the base model serves on


# The router's tests: two replicas without LoRA (vLLM and the front's 200m each) and one router
# at ROUTER_CPU fit the node's 2 CPUs beside the operator and the activator.
ROUTED_CPU = "650m"
ROUTER_CPU = "100m"
ROUTER_SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=router"
# The shared-prefix workload: a few long system prompts, several users each.
PREFIXES, USERS, PREFIX_WORDS = 3, 4, 300


def routed_service(hub: Hub, prometheus: PodPrometheus) -> dict:
    """The service with two replicas behind the router (cache-aware, its default policy)."""
    service = inference_service(hub, prometheus, None)
    spec = service["spec"]
    del spec["autoscaling"]
    spec["replicas"] = 2
    spec["resources"]["cpu"] = ROUTED_CPU
    spec["routing"] = {"router": {"replicas": 1, "resources": {"cpu": ROUTER_CPU, "memory": "256Mi"}}}
    return service


def router_address(node: NodeCluster) -> str:
    service = kubectl_json(node, "get", "service", f"{NAME}-router", "-n", NS)
    return f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"


def replica_addresses(node: NodeCluster) -> dict[str, str]:
    """Each ready vLLM pod's name and its front's address (pod IP and port)."""
    addresses = {}
    for pod in pods(node, NS, SELECTOR):
        if pod_ready(pod):
            (front,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "front"]
            addresses[pod["metadata"]["name"]] = f"{pod['status']['podIP']}:{front['ports'][0]['containerPort']}"
    return addresses


def routed_replicas_ready(node: NodeCluster) -> dict[str, str] | None:
    """The two replicas of the routed spec, Ready, no other vLLM pod left; and the router Ready."""
    current = pods(node, NS, SELECTOR)
    cpus = {
        next(c for c in p["spec"]["containers"] if c["name"] == "vllm")["resources"]["limits"]["cpu"] for p in current
    }
    routers = [p for p in pods(node, NS, ROUTER_SELECTOR) if pod_ready(p)]
    if len(current) == 2 and all(pod_ready(p) for p in current) and cpus == {ROUTED_CPU} and len(routers) == 1:
        return replica_addresses(node)
    return None


T = TypeVar("T")


def remake_service(node: NodeCluster, service: dict, gone: str, ready: Callable[[], T | None], what: str) -> T:
    """The service deleted (its pods `gone` selects all gone), `service` applied in its place (a
    rolling update would need room for a third vLLM pod on the node's 2 CPUs), and `ready()`'s
    answer once it has one; the time from apply to ready is the figure `what` names."""
    node.kubectl("delete", "ris", NAME, "-n", NS, "--wait=true", "--timeout=180s", "--ignore-not-found")
    wait_for(lambda: not pods(node, NS, gone), timeout=180, message="the service's pods gone")
    applied = time.monotonic()
    apply(node, service)
    found: T = wait_for(ready, timeout=600, interval=0.5, message=what)
    FIGURES[f"{what}: applied to Ready (s)"] = time.monotonic() - applied
    return found


def wait_router_workers(address: str, ips: list[str], what: str) -> None:
    """Until the router at `address` lists a worker at each of `ips`. A Ready router is reached
    through its Service once kube-proxy has its endpoint, a moment later: until then the
    ClusterIP refuses, as it would for any client."""

    def workers() -> str | None:
        listed = httpx.get(f"http://{address}/list_workers", timeout=10)
        return listed.text if listed.status_code == 200 and all(ip in listed.text for ip in ips) else None

    wait_for(workers, timeout=60, interval=0.5, message=f"the router's workers: {what}", ignore=(httpx.TransportError,))


def replica_metrics(replicas: dict[str, str]) -> dict[str, dict[str, float]]:
    return {name: replica_counters(httpx.get(f"http://{a}/metrics", timeout=10).text) for name, a in replicas.items()}


def test_the_router_takes_the_service_with_two_replicas_and_its_url(
    node: NodeCluster, hub: Hub, prometheus: PodPrometheus, cache_volume: pathlib.Path, hub_secret: None
) -> None:
    """routing.router on the running service: the service is deleted and made again with two
    replicas and a router (a rolling update would need room for a third vLLM pod on the node's 2
    CPUs); the router, from the image router/Dockerfile builds, watches the namespace's pods with
    the chart's ClusterRole and takes both replicas; status.url names it."""
    replicas = remake_service(
        node,
        routed_service(hub, prometheus),
        SELECTOR,
        lambda: routed_replicas_ready(node),
        f"vLLM router: two replicas ({ROUTED_CPU}) and the router",
    )
    wait_router_workers(router_address(node), [a.split(":")[0] for a in replicas.values()], "both replicas")
    assert ris(node)["status"]["url"] == f"http://{NAME}-router.{NS}.svc.cluster.local"


def test_completions_and_chat_answer_through_the_router_from_the_host_and_a_pod(node: NodeCluster) -> None:
    """Completions and chat, streamed and not, over the router's Service: from the host and from
    a pod."""
    address = router_address(node)
    answers = {
        (chat, stream): complete(address, NAME, chat, stream) for chat in (False, True) for stream in (False, True)
    }
    assert all(answers.values()), answers
    assert answers[(False, False)] == answers[(False, True)] and answers[(True, False)] == answers[(True, True)]
    # Greedy decoding: the replicas answer alike, so the router's answer is the replica's.
    (direct, *_) = replica_addresses(node).values()
    assert complete(direct, NAME) == answers[(False, False)]
    # The disaggregated service's requests (the tests below), answered by these aggregated replicas.
    AGGREGATED.update({name: generated(address, *request) for name, request in pd_requests().items()})
    assert any(text.strip() for text, _ in AGGREGATED.values()), AGGREGATED
    script = both_apis_script(address)
    output = run_client_pod(node, NS, "router-client", script)
    assert output.split("\n") == BOTH_APIS_ANSWERED, output


def test_the_router_sends_each_shared_prefix_to_the_replica_that_holds_it(node: NodeCluster) -> None:
    """A shared-prefix workload (PREFIXES long system prompts, USERS users each) through the
    router's Service: each prefix's requests all go to one replica, whose vLLM prefix cache then
    hits (its own /metrics); the other replica never sees that prefix."""
    address = router_address(node)
    replicas = replica_addresses(node)
    assert len(replicas) == 2, replicas
    served: Counter[str] = Counter()
    started = time.monotonic()
    for index, prompts in enumerate(shared_prefix_prompts(PREFIXES, USERS, PREFIX_WORDS, seed=3)):
        before = replica_metrics(replicas)
        for prompt in prompts:
            body = {"model": NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0}
            answer = httpx.post(f"http://{address}/v1/completions", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
        after = replica_metrics(replicas)
        delta = {name: {k: after[name][k] - before[name][k] for k in after[name]} for name in replicas}
        holders = [name for name, d in delta.items() if d["requests"]]
        assert len(holders) == 1, delta
        holder = holders[0]
        assert delta[holder]["requests"] == USERS and delta[holder]["hits"] > 0, delta
        (other,) = set(replicas) - {holder}
        assert delta[other]["queries"] == 0, delta
        served[holder] += 1
        FIGURES[f"vLLM router: prefix {index}, prefix-cache hit rate on its replica"] = (
            delta[holder]["hits"] / delta[holder]["queries"]
        )
    FIGURES["vLLM router: shared-prefix workload through the router (s)"] = time.monotonic() - started
    # Where new prefixes go is the policy's choice (one at a time, the load never uneven enough
    # for its balance thresholds): recorded, not judged.
    FIGURES[f"vLLM router: replicas the {PREFIXES} prefixes went to"] = len(served)
    (router,) = [p for p in pods(node, NS, ROUTER_SELECTOR) if pod_ready(p)]
    decisions = httpx.get(f"http://{router['status']['podIP']}:{ROUTER_METRICS_PORT}/metrics", timeout=10).text
    # Every prompt's tokens were read from a replica through its front (without them the router
    # counts outcome="missing_tokens" and sends everything to its first worker).
    assert 'policy="cache_aware"' in decisions and 'outcome="missing_tokens"' not in decisions, decisions


# The routed service at zero and back: autoscaling.scaleToZero patched onto its two replicas
# (the built-in loop at a target no load reaches, one replica at most, so the wake's one is all
# that starts), then requests held at zero answered through the router.
ROUTED_IDLE_SECONDS = 10


def routed_service_pods(node: NodeCluster) -> dict[str, list[dict]] | None:
    """The routed service's pods once they are one Ready worker and one Ready router, and no
    other: by component."""
    current = pods(node, NS, INSTANCE_SELECTOR)
    by_component: dict[str, list[dict]] = {}
    for pod in current:
        by_component.setdefault(pod["metadata"]["labels"]["app.kubernetes.io/component"], []).append(pod)
    counts = {component: len(found) for component, found in by_component.items()}
    if counts == {"predictor": 1, "router": 1} and all(pod_ready(p) for p in current):
        return by_component
    return None


def at_zero_behind_the_activator(node: NodeCluster, workloads: Iterable[str], pods_of: str) -> None:
    """The service at zero: every pod of it gone (`pods_of` names them), each Deployment of
    `workloads` at zero replicas, NAME-router's Service led to the activator (its slice, port
    http), and the service Ready with reason ScaledToZero."""
    wait_for(lambda: not pods(node, NS, INSTANCE_SELECTOR), timeout=180, message=f"{pods_of} gone")
    for workload in workloads:
        assert kubectl_json(node, "get", "deployment", workload, "-n", NS)["spec"]["replicas"] == 0, workload
    (piece,) = activator_slices(node, NS, f"{NAME}-router")
    assert piece["endpoints"] and piece["ports"][0]["name"] == "http", piece
    ready_condition = wait_for(
        lambda: (c := condition(ris(node), "Ready")) and c.get("reason") == "ScaledToZero" and c,
        timeout=60,
        message="Ready, ScaledToZero",
    )
    assert ready_condition["status"] == "True", ready_condition


def test_the_idle_routed_service_goes_to_zero_with_its_router_and_its_routers_service_leads_to_the_activator(
    node: NodeCluster, prometheus: PodPrometheus
) -> None:
    """autoscaling.scaleToZero patched onto the running routed service (the built-in loop, at
    most one replica): after idleSeconds without a request the workers go to zero, the router
    with them, and NAME-router's Service (status.url) leads to the activator; the service says
    Ready, ScaledToZero."""
    patch_service(
        node,
        {
            "autoscaling": {
                "mode": "builtin",
                "metric": "ttftP95Ms",
                "target": STEADY_MS,
                "prometheusUrl": prometheus.url,
                "intervalSeconds": 1,
                "windowSeconds": 10,
                "minReplicas": 0,
                "maxReplicas": 1,
                "scaleToZero": {"idleSeconds": ROUTED_IDLE_SECONDS, "maxWaitSeconds": HOLD_SECONDS},
            }
        },
    )
    patched = time.monotonic()
    wait_for(lambda: ris(node)["spec"]["replicas"] == 0, timeout=180, interval=0.5, message="the service at zero")
    FIGURES[
        f"vLLM router: scaleToZero set on the idle routed service to zero, idleSeconds {ROUTED_IDLE_SECONDS} (s)"
    ] = time.monotonic() - patched
    at_zero_behind_the_activator(node, (NAME, f"{NAME}-router"), "the workers' and the router's pods")
    assert ris(node)["status"]["url"] == f"http://{NAME}-router.{NS}.svc.cluster.local"


@pytest.mark.timeout(1200)
def test_requests_held_at_zero_wake_the_routed_service_and_its_router_and_are_all_answered(
    node: NodeCluster,
) -> None:
    """Completions and chat, streamed and not, sent to the router's Service at zero: the
    activator holds them, the wake brings back one worker and the router, and every one is
    answered 200 with its whole completion, over the prompt the replicas counted before; the
    activator then leaves the path."""
    # Awake from here on, whatever the pauses before the slice is checked.
    patch_service(node, {"autoscaling": {"scaleToZero": {"idleSeconds": 3600}}})
    assert AGGREGATED, "the replicas' answers are recorded by the router's tests of this module: run it whole"
    assert ris(node)["spec"]["replicas"] == 0 and not pods(node, NS, INSTANCE_SELECTOR)
    assert activator_slices(node, NS, f"{NAME}-router"), "the activator left the path before any request"
    address = router_address(node)

    def woken() -> None:
        # Held, not refused: the workers asked for, and the router with them.
        wait_for(lambda: ris(node)["spec"]["replicas"] == 1, timeout=60, interval=0.5, message="the service woken")
        wait_for(
            lambda: kubectl_json(node, "get", "deployment", f"{NAME}-router", "-n", NS)["spec"]["replicas"] == 1,
            timeout=60,
            message="the router woken",
        )

    answered = held_requests_answered(address, woken)
    FIGURES["vLLM router: requests held at zero (completions and chat, 2 streamed)"] = HELD
    FIGURES[f"vLLM router: first held request to all {HELD} answered, one worker at {ROUTED_CPU} (s)"] = answered
    # One worker (the wake's) and the router, both Ready; the activator out of the path.
    wait_for(lambda: routed_service_pods(node), timeout=120, interval=0.5, message="one worker and the router")
    wait_for(lambda: not activator_slices(node, NS, f"{NAME}-router"), timeout=60, message="the activator's slice gone")
    FIGURES[f"vLLM start to Ready, woken replica, warm from the claim, {ROUTED_CPU} (s)"] = vllm_start_to_ready(node)
    assert complete(address, NAME)  # through the router, the activator out of the path


# Prefill/decode disaggregation: the routed service made again as one prefill and one decode
# replica, each at ROUTED_CPU as the routed replicas were (the same threads, so the same sums
# at temperature 0), and the router in P/D mode over both. The connector is the operator's
# default for roles without GPUs: NIXL over UCX, the KV blocks in host memory.
ROLE_LABEL = "inference.rocm.dev/role"
INSTANCE_SELECTOR = f"app.kubernetes.io/instance={NAME}"
# A KV block on vLLM's CPU build, in tokens (its default; the decode pod's cache_config_info is
# checked against it): the prompts below span several, so that most of each can only arrive
# over NIXL.
BLOCK = 128
# What the aggregated service (the routed replicas) answered to pd_requests(), by request.
AGGREGATED: dict[str, tuple[str, int]] = {}
# UCX prints the transports it chose for each peer (its protocol tables): the test reads them
# from the decode pod's log.
UCX_PROTO_INFO = {"name": "UCX_PROTO_INFO", "value": "1"}


def pd_requests() -> dict[str, tuple[str, dict[str, Any]]]:
    """Completions and chat, streamed and not, each with a prompt of its own of several blocks (a
    repeated prompt would be the decode pod's own prefix-cache hit): (path, body) by name."""
    requests = {}
    for index, (chat, stream) in enumerate(((False, False), (False, True), (True, False), (True, True))):
        draw = random.Random(index)

        def words(count: int, draw: random.Random = draw) -> str:
            return " ".join(draw.choice(VOCABULARY) for _ in range(count))

        body: dict[str, Any] = {"model": NAME, "max_tokens": 8, "temperature": 0, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if chat:
            body["messages"] = [
                {"role": "system", "content": words(2 * BLOCK)},
                {"role": "user", "content": words(9)},
            ]
        else:
            body["prompt"] = words(3 * BLOCK + 5)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        requests[f"{'chat' if chat else 'completion'}{' streamed' if stream else ''}"] = (path, body)
    return requests


def answer(address: str, path: str, body: dict[str, Any], timeout: float = 120) -> tuple[str, dict[str, int]]:
    """The text one request generates (streamed: its chunks joined) and its usage, answered 200."""
    with httpx.stream("POST", f"http://{address}{path}", json=body, timeout=timeout) as response:
        raw = response.read().decode()
        assert response.status_code == 200, raw
    if not body["stream"]:
        whole = json.loads(raw)
        choice = whole["choices"][0]
        return str(choice["message"]["content"] if "message" in choice else choice["text"]), whole["usage"]
    events = [line.removeprefix("data: ") for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", raw
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(
        c.get("text") or (c.get("delta") or {}).get("content") or "" for chunk in chunks for c in chunk["choices"]
    )
    (usage,) = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    return text, usage


def generated(address: str, path: str, body: dict[str, Any]) -> tuple[str, int]:
    """The text one request generates (streamed: its chunks joined) and its prompt's tokens."""
    text, usage = answer(address, path, body)
    return text, usage["prompt_tokens"]


def pd_service(hub: Hub, prometheus: PodPrometheus) -> dict:
    """The routed service as one prefill and one decode replica behind the router."""
    service = routed_service(hub, prometheus)
    spec = service["spec"]
    del spec["replicas"]
    spec["runtime"]["env"].append(UCX_PROTO_INFO)
    spec["disaggregation"] = {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}
    return service


def role_pods(node: NodeCluster, role: str) -> list[dict]:
    return pods(node, NS, f"{SELECTOR},{ROLE_LABEL}={role}")


def front_address(pod: dict) -> str:
    (front,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "front"]
    return f"{pod['status']['podIP']}:{front['ports'][0]['containerPort']}"


def pair_pods(node: NodeCluster, prefill: int = 1) -> dict[str, list[dict]] | None:
    """The service's pods once they are `prefill` Ready prefill pods, one Ready decode pod and
    one Ready router, and no other: by role."""
    current = pods(node, NS, INSTANCE_SELECTOR)
    by_role: dict[str, list[dict]] = {}
    for pod in current:
        labels = pod["metadata"]["labels"]
        by_role.setdefault(labels.get(ROLE_LABEL) or labels["app.kubernetes.io/component"], []).append(pod)
    counts = {role: len(found) for role, found in by_role.items()}
    if counts == {"prefill": prefill, "decode": 1, "router": 1} and all(pod_ready(p) for p in current):
        return by_role
    return None


def pd_pods_ready(node: NodeCluster) -> dict[str, dict] | None:
    """The service's pods once they are one Ready pod of each role and one Ready router, and no
    other: by role."""
    found = pair_pods(node)
    return None if found is None else {role: one for role, (one,) in found.items()}


def ris_status(node: NodeCluster) -> dict:
    """The service's status, read from the API server (no kubectl process: polled)."""
    with node.client() as client:
        answer = client.get(f"/apis/inference.rocm.dev/v1alpha1/namespaces/{NS}/inferenceservices/{NAME}")
    answer.raise_for_status()
    return dict(answer.json().get("status") or {})


def roles_ready(status: dict) -> dict[str, bool]:
    return {entry["role"]: bool(entry.get("ready")) for entry in status.get("roles") or []}


def pd_sources(pod: dict) -> dict[str, float]:
    return prompt_token_sources(httpx.get(f"http://{front_address(pod)}/metrics", timeout=30).text)


def test_disaggregation_makes_the_service_a_prefill_and_a_decode_replica_the_router_finds(
    node: NodeCluster, hub: Hub, prometheus: PodPrometheus, cache_volume: pathlib.Path, hub_secret: None
) -> None:
    """spec.disaggregation on the real pods: the routed service deleted and made again with one
    prefill and one decode replica (room on the node's 2 CPUs); the router finds each role by
    label, and status.roles names both roles Ready."""
    ready = remake_service(
        node,
        pd_service(hub, prometheus),
        INSTANCE_SELECTOR,
        lambda: pd_pods_ready(node),
        f"vLLM P/D: prefill and decode ({ROUTED_CPU} each) and the router",
    )
    wait_router_workers(
        router_address(node), [ready[role]["status"]["podIP"] for role in ("prefill", "decode")], "both roles"
    )
    status = wait_for(
        lambda: (s := ris_status(node)) and roles_ready(s) == {"prefill": True, "decode": True, "router": True} and s,
        timeout=60,
        interval=0.5,
        message="status.roles: prefill, decode and router ready",
    )
    assert (condition({"status": status}, "Ready") or {}).get("status") == "True", status
    assert status["url"] == f"http://{NAME}-router.{NS}.svc.cluster.local", status


def test_through_the_router_pd_answers_equal_the_aggregated_services_and_decode_computes_no_prompt(
    node: NodeCluster,
) -> None:
    """Completions and chat, streamed and not, through the router's Service: the text the
    aggregated replicas generated for the same requests at temperature 0. vLLM's own counters on
    the decode pod: of each prompt it computed at most the last, partial block; the rest came
    over NIXL."""
    assert AGGREGATED, "the aggregated answers are recorded by the router's tests of this module: run it whole"
    ready = pd_pods_ready(node)
    assert ready is not None
    decode, prefill = ready["decode"], ready["prefill"]
    decode_metrics = httpx.get(f"http://{front_address(decode)}/metrics", timeout=30).text
    assert f'block_size="{BLOCK}"' in decode_metrics, "the prompts assume vLLM's CPU block size"
    decode_before, prefill_before = prompt_token_sources(decode_metrics), pd_sources(prefill)
    address = router_address(node)
    answers = {name: generated(address, *request) for name, request in pd_requests().items()}
    assert {name: text for name, (text, _) in answers.items()} == {name: text for name, (text, _) in AGGREGATED.items()}
    decode_after, prefill_after = pd_sources(decode), pd_sources(prefill)
    moved = {key: decode_after[key] - decode_before[key] for key in decode_after}
    computed = {key: prefill_after[key] - prefill_before[key] for key in prefill_after}
    prompt_tokens = sum(tokens for _, tokens in answers.values())
    requests = len(answers)
    FIGURES["vLLM P/D: prompt tokens computed on the decode pod, of all sent"] = moved["local_compute"] / prompt_tokens
    assert computed["local_compute"] + computed["local_cache_hit"] == prompt_tokens, (computed, prompt_tokens)
    assert moved["local_compute"] <= BLOCK * requests, (moved, prompt_tokens)
    assert moved["external_kv_transfer"] >= prompt_tokens - BLOCK * requests, (moved, prompt_tokens)
    assert moved["nixl_transfers"] >= requests and moved["nixl_bytes"] > 0, moved


def ucx_transports(log: str) -> dict[str, set[str]]:
    """The transports UCX chose (`tcp/eth0`, `posix/memory`, `cma/memory`, ...) from its protocol
    tables in a log (UCX_PROTO_INFO): by each table's title, the peer ("<agent> inter-node
    cfg#1") and what the table is for ("remote memory read by ucp_get* ...")."""
    chosen: dict[str, set[str]] = {}
    title: list[str] = []
    rows = False
    for line in log.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) == 1:
            if rows:
                title, rows = [], False
            title.append(cells[0])
        elif len(cells) == 3 and title and cells[0] != "Range":
            rows = True
            chosen.setdefault(" / ".join(title), set()).update(re.findall(r"\b([a-z_0-9]+/[A-Za-z_0-9.:-]+)", cells[2]))
    return chosen


def test_the_kv_cache_crosses_the_pod_network_over_ucxs_tcp(node: NodeCluster) -> None:
    """The KV blocks went from pod to pod over UCX's TCP transport on the pods' network. UCX's
    own tables on the decode pod: the prefill pod is an inter-node peer to it, and reading its
    memory, and every message to it, goes over tcp on eth0, the pod's interface: not over shared
    memory or cross-memory attach (posix and cma need the peer's PID namespace, which the pods do
    not share), nor over loopback, which is each pod's own."""
    ready = pd_pods_ready(node)
    assert ready is not None
    log = node.kubectl("logs", "-n", NS, ready["decode"]["metadata"]["name"], "-c", "vllm").stdout
    tables = ucx_transports(log)
    peer = {title: chosen for title, chosen in tables.items() if " inter-node " in title}
    reads = {t for title, chosen in peer.items() if "remote memory read" in title for t in chosen}
    assert reads == {"tcp/eth0"}, tables
    assert set().union(*peer.values()) == {"tcp/eth0"}, peer


@dataclass
class Outcome:
    started: float
    ended: float
    status: int | str  # the HTTP status, or the client's error when no answer came
    detail: str = ""


class PacedLoad:
    """`clients` clients, each sending a completion through the router every `period` seconds
    (back to back when one takes longer), each request's outcome kept."""

    def __init__(self, url: str, clients: int, period: float) -> None:
        self.url, self.period = url, period
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,)) for i in range(clients)]

    def _client(self, index: int) -> None:
        draw = random.Random(100 + index)
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                body = {"model": NAME, "prompt": " ".join(draw.choice(VOCABULARY) for _ in range(BLOCK + 9))}
                started = time.time()
                try:
                    answer = client.post(self.url, json={**body, "max_tokens": 8, "temperature": 0})
                    outcome = Outcome(started, time.time(), answer.status_code, answer.text[:200])
                except httpx.HTTPError as error:
                    outcome = Outcome(started, time.time(), type(error).__name__, str(error)[:200])
                self.outcomes.append(outcome)
                self._stop.wait(max(0.0, started + self.period - time.time()))

    def start(self) -> PacedLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(150)

    def answered(self, status: int, since: float = 0.0) -> int:
        return sum(1 for o in self.outcomes if o.status == status and o.started >= since)


# The pair at zero and back, then two prefill replicas: the P/D service above switched by spec
# patches (no new service, no pod started but the wake's). Both roles on the built-in loop at a
# target no load reaches, so their counts hold at each role's floor.
PAIR_IDLE_SECONDS = 10
# A cold start of the pair on the node's busy 2 CPUs is minutes: the activator holds that long.
HOLD_SECONDS = 600
HELD = 4
# Two prefill replicas and one decode (vLLM and its front's 200m each) and the router fit the
# node's 2 CPUs beside the operator and the activator at PAIR_CPU; one OpenMP thread each, as
# at ROUTED_CPU.
PAIR_CPU = "375m"
PAIR_PREFILL = 2


def patch_service(node: NodeCluster, spec: dict[str, Any]) -> None:
    """A JSON merge patch of the service's spec: only what it names changes (the roles' replicas,
    which the autoscaler owns, stay as they are)."""
    node.kubectl("patch", "ris", NAME, "-n", NS, "--type=merge", "-p", json.dumps({"spec": spec}))


def role_scaling(prometheus: PodPrometheus, metric: str, replicas: int) -> dict[str, Any]:
    return {
        "mode": "builtin",
        "metric": metric,
        "target": STEADY_MS,
        "prometheusUrl": prometheus.url,
        "intervalSeconds": 1,
        "windowSeconds": 10,
        "minReplicas": replicas,
        "maxReplicas": replicas,
    }


def role_cpu(pod: dict) -> str:
    """The vLLM container's CPU in a pod (or a pod template)."""
    (vllm,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
    return str(vllm["resources"]["limits"]["cpu"])


def role_counts(service: dict) -> tuple[int, int]:
    pd = service["spec"]["disaggregation"]
    return pd["prefill"]["replicas"], pd["decode"]["replicas"]


def test_the_idle_pair_goes_to_zero_and_its_routers_service_leads_to_the_activator(
    node: NodeCluster, prometheus: PodPrometheus
) -> None:
    """disaggregation.scaleToZero patched onto the running pair (both roles on the built-in loop):
    after idleSeconds without a request both roles go to zero in one write, the router with
    them, and NAME-router's Service leads to the activator; the service says Ready,
    ScaledToZero."""
    patch_service(
        node,
        {
            "disaggregation": {
                "scaleToZero": {"idleSeconds": PAIR_IDLE_SECONDS, "maxWaitSeconds": HOLD_SECONDS},
                "prefill": {"autoscaling": role_scaling(prometheus, "ttftP95Ms", 1)},
                "decode": {"autoscaling": role_scaling(prometheus, "itlP95Ms", 1)},
            }
        },
    )
    patched = time.monotonic()
    wait_for(lambda: role_counts(ris(node)) == (0, 0), timeout=180, interval=0.5, message="the pair at zero")
    FIGURES[
        f"vLLM P/D: scaleToZero set on the idle pair to both roles at zero, idleSeconds {PAIR_IDLE_SECONDS} (s)"
    ] = time.monotonic() - patched
    workloads = [f"{NAME}-{role}" for role in ("prefill", "decode", "router")]
    at_zero_behind_the_activator(node, workloads, "the pair's and the router's pods")


def held_requests_answered(address: str, woken: Callable[[], object]) -> float:
    """The module's requests (completions and chat, two streamed, `ignore_eos`) sent at once to
    the router's Service at `address` while the service is at zero: the activator holds them
    while `woken()` waits for the wake (held, not refused), and every one is answered 200 with
    its whole completion over the prompt the replicas counted before. The seconds from sending
    them to the last answer."""
    requests = {name: (path, {**body, "ignore_eos": True}) for name, (path, body) in pd_requests().items()}
    assert len(requests) == HELD

    def held(request: tuple[str, dict[str, Any]]) -> tuple[float, str, dict[str, int]]:
        text, usage = answer(address, *request, timeout=HOLD_SECONDS + 60)
        return time.monotonic(), text, usage

    sent = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(HELD) as pool:
        replies = pool.map(held, requests.values())
        woken()
        answers = dict(zip(requests, replies, strict=True))
    for name, (_, text, usage) in answers.items():
        assert usage["completion_tokens"] == requests[name][1]["max_tokens"] and text, (name, text, usage)
        assert usage["prompt_tokens"] == AGGREGATED[name][1], (name, usage)
    return max(ended for ended, _, _ in answers.values()) - sent


@pytest.mark.timeout(1200)
def test_requests_held_at_zero_wake_the_pair_and_are_all_answered(node: NodeCluster, prometheus: PodPrometheus) -> None:
    """At zero the roles are made smaller (PAIR_CPU) and prefill's floor two (no pod starts:
    their Deployments are at zero), then completions and chat, streamed and not, are sent to
    the router's Service: the activator holds them, both roles and the router wake, and every
    one is answered 200 with its whole completion; the activator then leaves the path."""
    resources = {"gpu": {"count": 0}, "cpu": PAIR_CPU, "memory": "4Gi"}
    patch_service(
        node,
        {
            "disaggregation": {
                # Awake from here on for the module's last test, whatever its pauses.
                "scaleToZero": {"idleSeconds": 3600},
                "prefill": {
                    "resources": resources,
                    "autoscaling": {"minReplicas": PAIR_PREFILL, "maxReplicas": PAIR_PREFILL},
                },
                "decode": {"resources": resources},
            }
        },
    )
    wait_for(
        lambda: (
            role_cpu(kubectl_json(node, "get", "deployment", f"{NAME}-prefill", "-n", NS)["spec"]["template"])
            == PAIR_CPU
        ),
        timeout=60,
        message=f"the prefill Deployment at {PAIR_CPU}",
    )
    assert role_counts(ris(node)) == (0, 0) and not pods(node, NS, INSTANCE_SELECTOR)
    assert activator_slices(node, NS, f"{NAME}-router"), "the activator left the path before any request"
    # Held, not refused: both roles asked for at once, the router with them.
    answered = held_requests_answered(
        router_address(node),
        lambda: wait_for(lambda: role_counts(ris(node)) != (0, 0), timeout=60, interval=0.5, message="the pair woken"),
    )
    FIGURES["vLLM P/D: requests held at zero (completions and chat, 2 streamed)"] = HELD
    FIGURES[f"vLLM P/D: first held request to all {HELD} answered, prefill and decode at {PAIR_CPU} (s)"] = answered
    # The pair whole again: two prefill pods (prefill's floor), the decode pod and the router;
    # the activator out of the path.
    found = wait_for(lambda: pair_pods(node, PAIR_PREFILL), timeout=600, interval=0.5, message="the pair whole")
    wait_for(lambda: not activator_slices(node, NS, f"{NAME}-router"), timeout=60, message="the activator's slice gone")
    assert {role_cpu(p) for role in ("prefill", "decode") for p in found[role]} == {PAIR_CPU}


@pytest.mark.timeout(1200)
def test_a_prefill_pod_deleted_under_load_fails_no_request_and_the_status_names_the_short_role(
    node: NodeCluster,
) -> None:
    """One of the two prefill pods deleted while requests run through the router: the router
    drops it when its watch sees the deletion, before the pod's preStop ends and vLLM stops
    taking requests, and sends the rest to the other prefill pod: no request fails.
    status.roles and the Ready condition name prefill short until its replacement is Ready,
    then the router serves again with both."""
    ready = wait_for(lambda: pair_pods(node, PAIR_PREFILL), timeout=600, interval=0.5, message="the pair whole")
    wait_router_workers(
        router_address(node),
        [p["status"]["podIP"] for role in ("prefill", "decode") for p in ready[role]],
        "both prefill pods and the decode pod",
    )
    prefills = {p["metadata"]["name"]: front_address(p) for p in ready["prefill"]}
    before = replica_metrics(prefills)
    load = PacedLoad(f"http://{router_address(node)}/v1/completions", clients=2, period=1.0).start()
    short: list[dict] = []  # the status read while no new prefill pod was Ready
    try:
        wait_for(lambda: load.answered(200) >= 4, timeout=120, interval=0.5, message="requests served before")
        # The pod deleted is the one the router has been sending prompts to (its policy may send
        # them all to one): the other has to take them over.
        served = {
            name: after["requests"] - before[name]["requests"] for name, after in replica_metrics(prefills).items()
        }
        old = max(served, key=lambda name: served[name])
        (kept,) = set(prefills) - {old}
        assert served[old] > 0, served
        kept_before = replica_metrics({kept: prefills[kept]})[kept]["requests"]
        deleted = time.time()
        node.kubectl("delete", "pod", old, "-n", NS, "--wait=false")

        def replacement() -> dict | None:
            status = ris_status(node)  # read first: the status may not run ahead of the pods
            new = next(
                (p for p in role_pods(node, "prefill") if p["metadata"]["name"] not in (old, kept) and pod_ready(p)),
                None,
            )
            if new is None:
                short.append(status)
            return new

        new = wait_for(replacement, timeout=900, interval=0.5, message="a new prefill pod Ready")
        back = time.time()
        took_over = replica_metrics({kept: prefills[kept]})[kept]["requests"] - kept_before
        FIGURES[f"vLLM P/D: one of {PAIR_PREFILL} prefill pods deleted to its replacement Ready (s)"] = back - deleted
        wait_for(lambda: load.answered(200, since=back) >= 2, timeout=120, interval=0.5, message="served again")
    finally:
        load.stop()
    during = [o for o in load.outcomes if deleted <= o.ended and o.started <= back]
    failed = [o for o in during if o.status != 200]
    FIGURES[f"vLLM P/D: requests sent while one of {PAIR_PREFILL} prefill pods was replaced"] = len(during)
    FIGURES[f"vLLM P/D: of those, failed (with {PAIR_PREFILL} prefill pods)"] = len(failed)
    for status, count in Counter(str(o.status) for o in failed).items():
        FIGURES[f"vLLM P/D: of those, failed with {status}"] = count
    # The status said so: prefill short (its role not ready, the Ready condition false and naming
    # it) once the old pod was gone, and never ready while no new prefill pod was.
    named = [s for s in short if not roles_ready(s).get("prefill", True)]
    assert named, short[-3:]
    ready_condition = condition({"status": named[-1]}, "Ready") or {}
    assert ready_condition.get("status") == "False" and "prefill" in ready_condition.get("message", ""), named[-1]
    assert not [s for s in short[short.index(named[0]) :] if roles_ready(s).get("prefill")], short
    # The router had the other prefill pod all along: it took the prompts, and nothing failed.
    FIGURES["vLLM P/D: prompts the other prefill pod computed meanwhile"] = took_over
    assert len(during) > 10 and took_over >= len(during) - 4, (len(during), took_over, served)
    if failed:
        log = node.kubectl("logs", "-n", NS, "-l", ROUTER_SELECTOR, "--tail=-1", check=False).stdout
        told = [line for line in log.splitlines() if re.search(r"Removing pod|Adding pod|fail|error", line, re.I)]
        seen = [(o.status, o.detail, round(o.started - deleted, 1), round(o.ended - o.started, 1)) for o in failed]
        raise AssertionError(
            f"{len(failed)} of {len(during)} failed: {seen}\nthe router said:\n" + "\n".join(told[-60:])
        )
    assert new["metadata"]["name"] not in (old, kept)
