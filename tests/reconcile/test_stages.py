"""Reconcile's stages as pure functions (stages/): the pipeline's order, the canary's transform of
the desired set at a step's weight (its Deployment; behind a route that can split it, the arms'
Services and the route's weights) and scale to zero's (the private Service). Every test runs the
real pipeline over plain values, so it fails when its stage is left out of `PIPELINE`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate
import pytest

from inference_operator import stages
from inference_operator.builders import Owner, build_all
from inference_operator.builders.activator import build_private_service
from inference_operator.builders.canary import TRACK_LABEL
from inference_operator.builders.common import ROLE_LABEL, SPEC_HASH_ANNOTATION
from inference_operator.jsontypes import JsonObject
from inference_operator.kinds import HTTP_ROUTE, Kind
from inference_operator.models import parse_spec
from inference_operator.reconcile import spec_objects
from inference_operator.rollout import Phase, RolloutState, live_revision, manifest_digest
from inference_operator.stages.base import Context, with_hash

NAME, NS = "resnet", "ml"
T0 = 1_000_000.0
ROUTE = {"parentRefs": [{"name": "inference", "namespace": "gateways"}], "hostnames": ["resnet.example.com"]}
AT_ZERO = {"minReplicas": 0, "maxReplicas": 4, "target": 100, "scaleToZero": {"idleSeconds": 60}}


def owner(version: str, *, route: bool = False, replicas: int = 3, **extra: Any) -> Owner:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "model": {"uri": "pvc://models/resnet", "version": version},
        "resources": {"gpu": {"count": 0}},
        "rollout": {"strategy": "canary", "canary": {"steps": [10, 50], "analysis": {"maxLatencyMs": 50}}},
        **extra,
    }
    if route:
        spec["routing"] = {"httpRoute": ROUTE}
    return Owner(name=NAME, namespace=NS, uid="u-1", spec=parse_spec(spec))


@dataclass
class Cluster:
    """The cluster a stage reads: live objects by (kind, name), the kinds it serves, the reads made."""

    objects: dict[tuple[str, str], JsonObject] = field(default_factory=dict)
    unserved: set[str] = field(default_factory=set)
    reads: list[tuple[str, str]] = field(default_factory=list)

    def live(self, desired: JsonObject) -> JsonObject | None:
        key = (desired["kind"], desired["metadata"]["name"])
        self.reads.append(key)
        return self.objects.get(key)

    def serves(self, kind: Kind) -> bool:
        return kind.kind not in self.unserved


def predictor(objects: list[JsonObject]) -> JsonObject:
    return next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == NAME)


def running(stable: Owner) -> Cluster:
    """A cluster whose stable Deployment runs `stable`'s revision, as a reconcile applied it."""
    return Cluster({("Deployment", NAME): predictor(spec_objects(stable))})


def progressing(desired: Owner, cluster: Cluster, weight: int) -> RolloutState:
    """status.rollout of a canary of `desired`'s revision at `weight`% beside what `cluster` runs."""
    live = cluster.objects["Deployment", NAME]
    return RolloutState(
        Phase.PROGRESSING,
        revision=live_revision(predictor(spec_objects(desired))),
        stable_revision=live_revision(live),
        weight=weight,
        step_started=T0,
        stable_digest=manifest_digest(live),
    )


def by_name(objects: list[JsonObject], kind: str) -> dict[str, JsonObject]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def model_version(deployment: JsonObject) -> str:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return str(args[args.index("--model-version") + 1])


def test_a_canary_at_its_weight_adds_its_deployment_beside_the_stable_revision() -> None:
    new, cluster = owner("2"), running(owner("1"))
    staged = stages.run(cluster, new, spec_objects(new), Context(progressing(new, cluster, 10), T0))

    deployments = by_name(staged.objects, "Deployment")
    assert set(deployments) == {NAME, f"{NAME}-canary"}
    assert model_version(deployments[NAME]) == "1"  # the stable arm keeps the revision it runs
    candidate = deployments[f"{NAME}-canary"]
    assert model_version(candidate) == "2" and candidate["spec"]["replicas"] == 1  # ~10% beside 3
    assert candidate["metadata"]["labels"][ROLE_LABEL] == "canary"
    assert candidate["spec"]["template"]["metadata"]["labels"][TRACK_LABEL] == "canary"
    assert SPEC_HASH_ANNOTATION in candidate["metadata"]["annotations"]  # marked as reconcile marks
    kubernetes_validate.validate(candidate, "1.33", strict=True)
    assert [name for name in by_name(staged.objects, "Service")] == [NAME]  # no route: one Service, both arms
    assert staged.rollout is not None and (staged.rollout.phase, staged.rollout.weight) == (Phase.PROGRESSING, 10)
    assert staged.rollout.traffic == "replicas"
    assert cluster.reads == [("Deployment", NAME)]  # its one read: the stable Deployment as it runs


@pytest.mark.parametrize("weight", [10, 50])
def test_behind_a_route_the_canary_adds_the_arms_services_and_weights_the_route(weight: int) -> None:
    new, cluster = owner("2", route=True), running(owner("1", route=True))
    staged = stages.run(cluster, new, spec_objects(new), Context(progressing(new, cluster, weight), T0))

    services = by_name(staged.objects, "Service")
    assert list(services) == [NAME, f"{NAME}-stable", f"{NAME}-canary"]
    for track in ("stable", "canary"):
        arm = services[f"{NAME}-{track}"]
        assert arm["spec"]["selector"] == {**services[NAME]["spec"]["selector"], TRACK_LABEL: track}
        kubernetes_validate.validate(arm, "1.33", strict=True)
    (route,) = by_name(staged.objects, "HTTPRoute").values()
    backends = [(b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]]
    assert backends == [(f"{NAME}-stable", 100 - weight), (f"{NAME}-canary", weight)]
    # Split exactly: the canary's replicas serve `weight`% of what the stable ones serve.
    assert by_name(staged.objects, "Deployment")[f"{NAME}-canary"]["spec"]["replicas"] == -(-3 * weight // 100)
    assert staged.rollout is not None and staged.rollout.traffic == "httpRoute"


def test_a_route_the_cluster_does_not_serve_splits_the_canary_by_replicas() -> None:
    new, cluster = owner("2", route=True), running(owner("1", route=True))
    cluster.unserved.add(HTTP_ROUTE.kind)
    staged = stages.run(cluster, new, spec_objects(new), Context(progressing(new, cluster, 10), T0))
    assert f"{NAME}-canary" in by_name(staged.objects, "Deployment")
    assert list(by_name(staged.objects, "Service")) == [NAME]
    assert staged.rollout is not None and staged.rollout.traffic == "replicas"


def test_without_a_change_the_canary_stage_reports_the_stable_revision_and_adds_nothing() -> None:
    same, cluster = owner("1"), running(owner("1"))
    objects = spec_objects(same)
    staged = stages.run(cluster, same, objects, Context(None, T0))
    assert staged.objects == objects
    assert staged.rollout is not None and staged.rollout.phase == Phase.STABLE
    assert staged.rollout.revision == live_revision(predictor(objects))


def test_scale_to_zero_adds_the_private_service_after_the_services_own() -> None:
    at_zero = owner("1", replicas=0, autoscaling=AT_ZERO, rollout={"strategy": "rolling"})
    objects = spec_objects(at_zero)
    staged = stages.run(Cluster(), at_zero, objects, Context(None, T0))

    assert [o["metadata"]["name"] for o in staged.objects if o["kind"] == "Service"] == [NAME, f"{NAME}-private"]
    assert by_name(staged.objects, "Service")[f"{NAME}-private"] == with_hash(build_private_service(at_zero))
    assert [o for o in staged.objects if o["metadata"]["name"] != f"{NAME}-private"] == objects  # nothing else
    # What render shows: the builders' set through the same stage, unmarked.
    assert [o["metadata"]["name"] for o in stages.rendered(at_zero) if o["kind"] == "Service"] == [
        NAME,
        f"{NAME}-private",
    ]
    assert SPEC_HASH_ANNOTATION not in str(stages.rendered(at_zero))
    # Without scale to zero, nothing: the private Service is the stage's alone.
    plain = owner("1")
    assert [o["metadata"]["name"] for o in stages.rendered(plain)] == [o["metadata"]["name"] for o in build_all(plain)]


def test_the_pipeline_runs_scale_to_zero_before_the_canary() -> None:
    """The canary transforms the set scale to zero has made: its arms go beside NAME's Service,
    before NAME-private, the order reconcile applied them in before the stages; each report
    stands (the canary's rollout)."""
    at_zero: dict[str, Any] = {"replicas": 2, "autoscaling": AT_ZERO, "route": True}
    new, cluster = owner("2", **at_zero), running(owner("1", **at_zero))
    staged = stages.run(cluster, new, spec_objects(new), Context(progressing(new, cluster, 10), T0))

    services = [o["metadata"]["name"] for o in staged.objects if o["kind"] == "Service"]
    assert services == [NAME, f"{NAME}-stable", f"{NAME}-canary", f"{NAME}-private"]
    assert staged.rollout is not None and staged.rollout.weight == 10
