"""A third engine, defined here alone: one object implementing `ServingEngine` (its pod part
included) and its registry entry. The same builders render it a valid Deployment, Service and
HPA without a line of theirs naming it: what differs between engines is asked of the engine
object.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import kubernetes_validate
import pytest

from inference_operator.builders import Owner, build_all
from inference_operator.builders.storage import MODEL_DIR
from inference_operator.config import OperatorConfig
from inference_operator.engines import ENGINES
from inference_operator.engines.base import (
    CacheSite,
    EnginePod,
    GroupMembers,
    ImageSetting,
    Metric,
    PodGauge,
    ReservedArgs,
    ScalingName,
    Series,
    ServiceValues,
    SharedPod,
    Traits,
)
from inference_operator.jsontypes import JsonObject
from inference_operator.models import parse_spec
from inference_operator.settings import Images

TOY = "toy"
QUEUE = "toy_queue_length"


@dataclass(frozen=True)
class Toy:
    """An engine that serves on its API port and exports one gauge, its queue."""

    engine: str = TOY
    traits: Traits = Traits(
        metrics=frozenset({Metric.QUEUE_DEPTH}), canary_metrics=(Metric.QUEUE_DEPTH,), metrics_on_api_port=True
    )
    series: Series = Series(
        model_label="served_model",
        request_latency="toy_latency_seconds",
        answered="toy_answers_total",
        holding=(QUEUE,),
        scraped=(QUEUE,),
        metrics={Metric.QUEUE_DEPTH: PodGauge(QUEUE)},
    )
    scaling_names: Mapping[Metric, ScalingName] = field(
        default_factory=lambda: {Metric.QUEUE_DEPTH: ScalingName(QUEUE, external=False)}
    )
    image: ImageSetting = ImageSetting("reg/toy:0", "TOY_IMAGE", "toy-image", "toy image")
    container: str = "toy-server"
    args: ReservedArgs | None = None
    multi_node_flags: tuple[str, ...] = ()
    group: GroupMembers | None = None
    termination_grace_seconds: int = 17
    compile_cache: CacheSite = CacheSite("/var/cache/toy", "toy-cache", "/tmp/toy-cache", {"TOY_CACHE": "kernels"})

    def multi_node_args(self, nodes: int, rank: str, master_address: str, master_port: int) -> list[str]:
        raise ValueError("one node")

    def ranks(self, service: ServiceValues) -> int:
        return 1

    def pod(self, service: ServiceValues, shared: SharedPod) -> EnginePod:
        container: JsonObject = {
            "name": self.container,
            "image": service.image,
            "args": [f"--model={shared.model_dir}", f"--port={service.port}"],
            "ports": [{"name": "http", "containerPort": service.port, "protocol": "TCP"}],
            "env": shared.env + shared.compile_cache.env,
            "resources": shared.resources,
            "volumeMounts": shared.mounts + shared.compile_cache.mounts,
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
        }
        return EnginePod(container)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Toy]:
    engine = Toy()
    monkeypatch.setitem(ENGINES, TOY, engine)  # type: ignore[arg-type]
    yield engine


def toy_owner(spec: dict[str, object]) -> Owner:
    """A spec of the toy engine: the CRD knows only the engines of `Engine`, so the spec is
    parsed as the default engine's and then given the toy one."""
    parsed = parse_spec(spec)
    runtime = parsed.runtime.model_copy(update={"engine": TOY})
    return Owner("svc", "ml", "u-1", parsed.model_copy(update={"runtime": runtime}), Images({TOY: "reg/toy:1"}))  # type: ignore[dict-item]


def test_a_toy_engine_renders_a_valid_deployment_through_the_same_builders(toy: Toy) -> None:
    owner = toy_owner({"model": {"uri": "pvc://models/m"}, "resources": {"gpu": {"count": 1}}})
    objects = {o["kind"]: o for o in build_all(owner)}
    deployment = objects["Deployment"]
    for obj in objects.values():
        kubernetes_validate.validate(obj, "1.33", strict=True)
    template = deployment["spec"]["template"]
    pod = template["spec"]
    (container,) = pod["containers"]
    assert container["name"] == toy.container and container["image"] == "reg/toy:1"
    assert container["args"] == [f"--model={MODEL_DIR}", "--port=8080"]
    assert pod["terminationGracePeriodSeconds"] == 17
    # Its compile cache, where it says, wired by the shared pod.
    assert {"name": "TOY_CACHE", "value": "/tmp/toy-cache/kernels"} in container["env"]
    assert "amd.com/gpu" in container["resources"]["limits"]  # the pod every engine shares: GPUs, model, security
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert any(c["name"] == "model-fetch" or "model" in c["name"] for c in pod.get("initContainers", [])) or any(
        v.get("persistentVolumeClaim") for v in pod["volumes"]
    )
    # Its trait: metrics on the API port, for the Service and the scrape annotation alike.
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(owner.spec.runtime.port)
    metrics = next(p for p in objects["Service"]["spec"]["ports"] if p["name"] == "metrics")
    assert metrics["targetPort"] == "http"


def test_a_toy_engine_scales_on_its_own_series(toy: Toy) -> None:
    owner = toy_owner(
        {
            "model": {"uri": "pvc://models/m"},
            "autoscaling": {"mode": "hpa", "metric": "queueDepth", "target": 4, "minReplicas": 1, "maxReplicas": 3},
        }
    )
    hpa = next(o for o in build_all(owner) if o["kind"] == "HorizontalPodAutoscaler")
    kubernetes_validate.validate(hpa, "1.33", strict=True)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"] == {"name": QUEUE, "selector": {"matchLabels": {"served_model": "svc"}}}
    assert f"{QUEUE}{{" in hpa["metadata"]["annotations"]["inference.rocm.dev/promql"]


def test_a_toy_engine_has_its_own_default_image_variable_and_flag(toy: Toy) -> None:
    from inference_operator.__main__ import _images, parser

    assert Images().serving(TOY) == "reg/toy:0"  # type: ignore[arg-type]
    assert Images.from_environment({"TOY_IMAGE": "env/toy:2"}).serving(TOY) == "env/toy:2"  # type: ignore[arg-type]
    args = parser().parse_args(["render", "-f", "x.yaml", "--toy-image", "flag/toy:3"])
    config = OperatorConfig.from_environ({"TOY_IMAGE": "env/toy:2"}, _images(args))
    assert config.images.serving(TOY) == "flag/toy:3"  # type: ignore[arg-type]  # the flag wins
    assert config.images.fetcher == Images().fetcher  # the operator's own image stays the default engine's
