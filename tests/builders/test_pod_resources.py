"""What a model pod reserves and how long it may take to stop: the QoS class Kubernetes gives
it (README: Guaranteed), and a grace period sized from the server's own shutdown."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
import yaml

from inference_operator.builders import Owner
from inference_operator.builders.deployment import build_deployment
from inference_operator.builders.storage import FETCH_CPU, FETCH_MEMORY, quantity_value
from inference_operator.engines.model_server import (
    DRAIN_TIMEOUT_SECONDS,
    PRE_STOP_SLEEP_SECONDS,
    SHUTDOWN_DELAY_SECONDS,
    TERMINATION_GRACE_SECONDS,
)
from inference_operator.engines.vllm import (
    DRAIN_SECONDS,
    FRONT_CPU_MIN,
    PRE_STOP_SECONDS,
    VLLM_TERMINATION_GRACE_SECONDS,
    pre_stop_script,
)
from inference_operator.models import parse_spec
from tests.builders.test_render_cli import EXAMPLES, render

UID = "0d5e5c7a-8f6b-4a0e-9d59-3f3c6b1f2a10"
RESOURCES = ("cpu", "memory")


def owner(**spec: object) -> Owner:
    spec.setdefault("model", {"uri": "https://models.example/resnet/model.onnx"})
    return Owner(name="resnet", namespace="ml", uid=UID, spec=parse_spec(spec))


def qos_class(pod_spec: dict) -> str:
    """The pod's status.qosClass, by Kubernetes' rules (pkg/apis/core/helper/qos): Guaranteed
    when every container, init containers included, has cpu and memory limits and requests
    equal to them (a missing request defaults to the limit); BestEffort when none asks for any."""
    containers = [*pod_spec.get("initContainers", []), *pod_spec["containers"]]
    any_amount, guaranteed = False, True
    for c in containers:
        requests = (c.get("resources") or {}).get("requests") or {}
        limits = (c.get("resources") or {}).get("limits") or {}
        any_amount = any_amount or any(r in requests or r in limits for r in RESOURCES)
        for r in RESOURCES:
            if r not in limits:
                guaranteed = False
            elif quantity_value(str(requests.get(r, limits[r]))) != quantity_value(str(limits[r])):
                guaranteed = False
    if not any_amount:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def pod_request(pod_spec: dict, resource: str) -> float:
    """What the scheduler reserves: the larger of the biggest init container (a native sidecar
    counts with the containers) and the containers' sum."""
    amount = lambda c: float(quantity_value(str(((c.get("resources") or {}).get("requests") or {}).get(resource, "0"))))  # noqa: E731
    inits = pod_spec.get("initContainers", [])
    sidecars = [c for c in inits if c.get("restartPolicy") == "Always"]
    running = sum(amount(c) for c in [*pod_spec["containers"], *sidecars])
    return max([running, *(amount(c) for c in inits if c.get("restartPolicy") != "Always")])


def model_pods(objects: list[dict]) -> Iterator[tuple[str, dict]]:
    for obj in objects:
        labels = obj["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/component") != "predictor":
            continue
        if obj["kind"] == "Deployment":
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]
        elif obj["kind"] == "LeaderWorkerSet":
            template = obj["spec"]["leaderWorkerTemplate"]
            for key in ("leaderTemplate", "workerTemplate"):
                if key in template:
                    yield f"{obj['metadata']['name']}/{key}", template[key]["spec"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_renders_guaranteed_model_pods(example: pathlib.Path) -> None:
    result = render("-f", str(example))
    assert result.returncode == 0, result.stderr
    found = list(model_pods(list(yaml.safe_load_all(result.stdout))))
    assert found, "no model pod rendered"
    for name, pod_spec in found:
        assert qos_class(pod_spec) == "Guaranteed", (
            name,
            [c.get("resources") for c in pod_spec.get("initContainers", [])],
        )


@pytest.mark.parametrize(
    ("cpu", "memory", "fetch"),
    [
        ("300m", "1Gi", {"cpu": "300m", "memory": "1Gi"}),  # a small model: the fetch no bigger
        ("8", "64Gi", {"cpu": FETCH_CPU, "memory": FETCH_MEMORY}),  # a big one: the fetch's own cap
        ("1.5", "1536Mi", {"cpu": "1.5", "memory": "1536Mi"}),
    ],
)
def test_the_fetch_reserves_no_more_than_the_server(cpu: str, memory: str, fetch: dict) -> None:
    spec = build_deployment(owner(resources={"gpu": {"count": 0}, "cpu": cpu, "memory": memory}))["spec"]
    pod_spec = spec["template"]["spec"]
    (init,) = pod_spec["initContainers"]
    assert init["resources"] == {"requests": fetch, "limits": fetch}
    assert qos_class(pod_spec) == "Guaranteed"
    for resource, value in (("cpu", cpu), ("memory", memory)):
        assert pod_request(pod_spec, resource) == float(quantity_value(value))


@pytest.mark.parametrize("uri", ["oci://registry.example/models/resnet:1", "s3://bucket/resnet/", "hf://org/model"])
def test_every_fetch_scheme_keeps_the_pod_guaranteed(uri: str) -> None:
    spec: dict = {"model": {"uri": uri}, "resources": {"gpu": {"count": 1}, "cpu": "250m", "memory": "512Mi"}}
    if uri.startswith("hf://"):
        spec["runtime"] = {"engine": "vllm"}
    pod_spec = build_deployment(owner(**spec))["spec"]["template"]["spec"]
    assert qos_class(pod_spec) == "Guaranteed"
    front = float(FRONT_CPU_MIN) if uri.startswith("hf://") else 0.0  # vLLM's front: a sidecar beside it
    assert pod_request(pod_spec, "cpu") == 0.25 + front


def test_the_grace_period_is_the_servers_shutdown_and_little_more() -> None:
    """The namespace controller waits out the longest grace period of a namespace's pods before
    it looks again: a grace period the server never uses makes every namespace deletion wait."""
    pod_spec = build_deployment(owner())["spec"]["template"]["spec"]
    args = pod_spec["containers"][0]["args"]
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    need = PRE_STOP_SLEEP_SECONDS + float(flags["--shutdown-delay"]) + float(flags["--drain-timeout"])
    assert (float(flags["--shutdown-delay"]), float(flags["--drain-timeout"])) == (
        SHUTDOWN_DELAY_SECONDS - PRE_STOP_SLEEP_SECONDS,
        DRAIN_TIMEOUT_SECONDS,
    )
    assert need < pod_spec["terminationGracePeriodSeconds"] == TERMINATION_GRACE_SECONDS <= need + 5
    assert TERMINATION_GRACE_SECONDS <= 30  # Kubernetes' default; it was 60


def test_the_sigterm_waits_for_a_pre_stop_sleep_in_the_servers_own_python() -> None:
    """As PID 1 a starting server drops a SIGTERM that comes before its first line: the preStop
    sleep holds the kubelet's SIGTERM back past the interpreter's start."""
    (container,) = build_deployment(owner())["spec"]["template"]["spec"]["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == container["command"][0] == "python"
    script = command[-1]
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)  # it runs as it is
    # What it waits for, in its own words: each sleep it asks of the interpreter.
    recording = f"import time\nasked = []\ntime.sleep = asked.append\nexec({script!r})\nprint(asked)"
    asked = subprocess.run([sys.executable, "-c", recording], check=True, timeout=60, capture_output=True, text=True)
    assert asked.stdout.strip() == f"[{PRE_STOP_SLEEP_SECONDS}]" and PRE_STOP_SLEEP_SECONDS >= 1


def test_vllm_keeps_a_generous_grace_period_for_its_streams_and_drains_them_within_it() -> None:
    """vLLM aborts what it generates at SIGTERM unless --shutdown-timeout says how long it may finish
    (the tier's rolling update cut 4 of 121 streams without it): after the preStop sleep, within the
    grace period."""
    spec = {"model": {"uri": "hf://org/model"}, "runtime": {"engine": "vllm"}, "resources": {"gpu": {"count": 1}}}
    pod_spec = build_deployment(owner(**spec))["spec"]["template"]["spec"]
    assert pod_spec["terminationGracePeriodSeconds"] == VLLM_TERMINATION_GRACE_SECONDS >= 60
    (vllm,) = pod_spec["containers"]
    drain = [int(a.removeprefix("--shutdown-timeout=")) for a in vllm["args"] if a.startswith("--shutdown-timeout=")]
    assert drain == [DRAIN_SECONDS] and DRAIN_SECONDS >= 30
    assert vllm["lifecycle"]["preStop"]["exec"]["command"][-1] == pre_stop_script(8080, PRE_STOP_SECONDS)
    assert PRE_STOP_SECONDS + DRAIN_SECONDS < VLLM_TERMINATION_GRACE_SECONDS


@pytest.mark.parametrize(
    ("small", "large"),
    [
        (".0E2000000000000000000", "1m"),  # zero, whatever its exponent
        ("1e999999999", "1E2000000000000000000"),  # past Decimal's largest exponent
        ("1E-2000000000000000000", "1e-999999999"),
        ("500m", "1"),
        ("1Gi", "2e9"),
    ],
)
def test_quantities_of_any_exponent_the_schema_admits_compare(small: str, large: str) -> None:
    """Found by the fuzz test: an exponent beyond Decimal's range raised InvalidOperation in the
    builder, for a spec the schema had admitted."""
    assert quantity_value(small) < quantity_value(large)
