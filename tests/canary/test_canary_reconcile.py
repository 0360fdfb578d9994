"""A canary rollout's Deployments on the emulated API server: the stable one keeps the revision
it runs, the candidate runs beside it at its step's share, promotion rolls the stable one and
removes the candidate, a rollback removes the candidate and leaves the stable one alone."""

from __future__ import annotations

import json
from dataclasses import replace

import kubernetes
import kubernetes_validate
import pytest

from inference_operator.builders import Owner
from inference_operator.builders.canary import TRACK_LABEL
from inference_operator.builders.common import Role
from inference_operator.k8s import KubeApi, Ref
from inference_operator.models import parse_spec
from inference_operator.reconcile import Action, Change, reconcile
from inference_operator.rollout import (
    REVISION_ANNOTATION,
    STABLE_MANIFEST_ANNOTATION,
    Phase,
    RolloutState,
)
from testsupport.cluster import Cluster
from testsupport.crd import addon_errors
from testsupport.emulator import declare

NS, NAME = "ml", "resnet"
STABLE = Ref("apps/v1", "Deployment", NS, NAME)
CANARY = Ref("apps/v1", "Deployment", NS, f"{NAME}-canary")
T0 = 1_000_000.0


ROUTE = Ref("gateway.networking.k8s.io/v1", "HTTPRoute", NS, NAME)
GATEWAY = {"parentRefs": [{"name": "inference", "namespace": "gateways"}], "hostnames": ["resnet.example.com"]}


def owner(version: str, strategy: str = "canary", replicas: int = 3, route: dict | None = None) -> Owner:
    spec = {
        "replicas": replicas,
        "model": {"uri": "pvc://models/resnet", "version": version},
        "resources": {"gpu": {"count": 0}},
        "rollout": {
            "strategy": strategy,
            "canary": {"steps": [10, 50], "analysis": {"maxLatencyMs": 50}},
        },
    }
    if route is not None:
        spec["routing"] = {"httpRoute": route}
    return Owner(name=NAME, namespace=NS, uid="u-1", spec=parse_spec(spec))


@pytest.fixture
def api(cluster: Cluster) -> KubeApi:
    return KubeApi(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)), timeout=10)


def model_version(deployment: dict) -> str:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--model-version") + 1]


def test_a_canary_runs_beside_the_stable_revision_and_is_promoted(api: KubeApi) -> None:
    first = reconcile(api, owner("1"), now=T0)
    assert first.rollout is not None and first.rollout.phase == Phase.STABLE
    stable = api.get(STABLE)
    assert model_version(stable) == "1" and api.get(CANARY) is None
    old_revision = stable["metadata"]["annotations"][REVISION_ANNOTATION]

    started = reconcile(api, owner("2"), rollout=first.rollout, now=T0)
    state = started.rollout
    assert state is not None and (state.phase, state.weight, state.stable_revision) == (
        Phase.PROGRESSING,
        10,
        old_revision,
    )
    assert Change(Action.CREATED, "Deployment", f"{NAME}-canary") in started.changes
    assert model_version(api.get(STABLE)) == "1"  # the stable arm is left on its revision
    canary = api.get(CANARY)
    assert model_version(canary) == "2" and canary["spec"]["replicas"] == 1  # ~10% beside 3 (25%, said so)
    assert canary["spec"]["selector"]["matchLabels"][TRACK_LABEL] == "canary"
    assert canary["spec"]["template"]["metadata"]["labels"][TRACK_LABEL] == "canary"
    assert canary["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    kubernetes_validate.validate(canary, "1.33", strict=True)
    # The Service selects both arms (its selector is the stable Deployment's, without the track).
    service = api.get(Ref("v1", "Service", NS, NAME))
    assert TRACK_LABEL not in service["spec"]["selector"]
    assert set(service["spec"]["selector"].items()) <= set(canary["spec"]["template"]["metadata"]["labels"].items())
    assert started.workloads[Role.PREDICTOR]["metadata"]["name"] == NAME

    # The autoscaler resizes the stable arm during the canary; the stable template stays.
    grown = reconcile(api, owner("2", replicas=9), rollout=replace(state, step=1, weight=50), now=T0 + 30)
    assert model_version(api.get(STABLE)) == "1" and api.get(STABLE)["spec"]["replicas"] == 9
    assert api.get(CANARY)["spec"]["replicas"] == 9  # 50% beside 9
    assert grown.rollout is not None and grown.rollout.weight == 50

    again = reconcile(api, owner("2", replicas=9), rollout=grown.rollout, now=T0 + 31)
    assert again.writes == []  # nothing changes while the step lasts

    promoted = reconcile(api, owner("2", replicas=9), rollout=replace(state, phase=Phase.PROMOTED), now=T0 + 60)
    assert model_version(api.get(STABLE)) == "2" and api.get(CANARY) is None
    assert Change(Action.DELETED, "Deployment", f"{NAME}-canary") in promoted.changes
    settled = reconcile(api, owner("2", replicas=9), rollout=promoted.rollout, now=T0 + 61)
    assert settled.rollout is not None and settled.rollout.stage == "promoted" and settled.writes == []
    # The promoted revision is the stable one now: the next change is a canary of it.
    nxt = reconcile(api, owner("3", replicas=9), rollout=settled.rollout, now=T0 + 90)
    assert nxt.rollout is not None and nxt.rollout.phase == Phase.PROGRESSING
    assert model_version(api.get(STABLE)) == "2" and model_version(api.get(CANARY)) == "3"


def test_a_rolled_back_canary_is_removed_and_the_stable_revision_kept_until_the_next_change(api: KubeApi) -> None:
    first = reconcile(api, owner("1"), now=T0)
    started = reconcile(api, owner("2"), rollout=first.rollout, now=T0)
    assert started.rollout is not None and api.get(CANARY) is not None
    back = replace(started.rollout, phase=Phase.ROLLED_BACK, weight=0)
    rolled_back = reconcile(api, owner("2"), rollout=back, now=T0 + 5)
    assert api.get(CANARY) is None and model_version(api.get(STABLE)) == "1"
    assert rolled_back.rollout is not None and rolled_back.rollout.stage == "rolled back"
    assert reconcile(api, owner("2"), rollout=rolled_back.rollout, now=T0 + 6).writes == []  # it stays so
    # A new change starts a new canary.
    third = reconcile(api, owner("3"), rollout=rolled_back.rollout, now=T0 + 7)
    assert third.rollout is not None and third.rollout.phase == Phase.PROGRESSING
    assert model_version(api.get(CANARY)) == "3" and model_version(api.get(STABLE)) == "1"


def test_back_to_rolling_removes_the_canary_and_rolls_the_stable_arm(api: KubeApi) -> None:
    first = reconcile(api, owner("1"), now=T0)
    started = reconcile(api, owner("2"), rollout=first.rollout, now=T0)
    rolling = reconcile(api, owner("2", strategy="rolling"), rollout=started.rollout, now=T0 + 1)
    assert rolling.rollout is None and api.get(CANARY) is None and model_version(api.get(STABLE)) == "2"


def test_without_a_record_of_the_stable_manifest_the_change_rolls_without_a_canary(api: KubeApi) -> None:
    """A service switched to canary together with a change: nothing in status vouches for the
    stable Deployment's copy of its manifest, so it is not used."""
    reconcile(api, owner("1", strategy="rolling"), now=T0)
    result = reconcile(api, owner("2"), rollout=None, now=T0)
    assert api.get(CANARY) is None and model_version(api.get(STABLE)) == "2"
    assert result.rollout is not None and "rolled without a canary" in result.rollout.message


def test_an_edited_copy_of_the_stable_manifest_is_never_applied(api: KubeApi, cluster: Cluster) -> None:
    """Whoever may edit Deployments must not reach the operator's rights through the copy it keeps:
    a privileged container written into the annotation is not rolled out."""
    first = reconcile(api, owner("1"), now=T0)
    started = reconcile(api, owner("2"), rollout=first.rollout, now=T0)
    live = api.get(STABLE)
    copy_ = json.loads(live["metadata"]["annotations"][STABLE_MANIFEST_ANNOTATION])
    copy_["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    tampered = json.dumps(copy_, sort_keys=True, separators=(",", ":"))
    patch = {"metadata": {"annotations": {STABLE_MANIFEST_ANNOTATION: tampered}}}
    assert cluster.patch("apps/v1/deployments", NS, NAME, patch).status_code == 200
    result = reconcile(api, owner("2", replicas=4), rollout=started.rollout, now=T0 + 1)
    containers = api.get(STABLE)["spec"]["template"]["spec"]["containers"]
    assert not containers[0].get("securityContext", {}).get("privileged")
    assert result.rollout is not None and "edited annotation" in result.rollout.message
    assert api.get(CANARY) is None and model_version(api.get(STABLE)) == "2"  # the spec, from the builders


def test_a_rolling_service_reads_nothing_more(api: KubeApi, cluster: Cluster) -> None:
    reconcile(api, owner("1", strategy="rolling"), now=T0)
    before = len(list(cluster.emulator))
    result = reconcile(api, owner("1", strategy="rolling"), rollout=None, now=T0 + 1)
    reads = [r for r in list(cluster.emulator)[before:] if r.resource and r.resource.plural == "deployments"]
    assert result.writes == [] and result.rollout is None
    # The one Deployment by name (not a canary as well), and the inventory's one list of them.
    assert [r.name for r in reads] == [NAME, None]


def test_the_state_is_kept_by_status_alone() -> None:
    state = RolloutState(Phase.PROGRESSING, "b", "a", 1, 50, T0, 1, "m")
    assert RolloutState.from_status({"rollout": state.to_status()}) == state


def backends(api: KubeApi) -> list[tuple[str, int]]:
    route = api.get(ROUTE)
    assert addon_errors(route) == []  # valid for the HTTPRoute CRD (the stand-in of its v1 schema)
    return [(ref["name"], ref["weight"]) for ref in route["spec"]["rules"][0]["backendRefs"]]


def test_behind_a_route_the_canary_gets_the_weight_of_its_step_exactly(api: KubeApi, cluster: Cluster) -> None:
    declare(cluster.emulator, "gateway.networking.k8s.io/v1/httproutes", "HTTPRoute")  # Gateway API installed
    first = reconcile(api, owner("1", route=GATEWAY), now=T0)
    route = api.get(ROUTE)
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference", "namespace": "gateways"}
    ]
    assert route["spec"]["hostnames"] == ["resnet.example.com"]
    assert route["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert backends(api) == [(NAME, 1)]  # no canary: the one Service
    assert api.get(STABLE)["spec"]["template"]["metadata"]["labels"][TRACK_LABEL] == "stable"

    started = reconcile(api, owner("2", route=GATEWAY), rollout=first.rollout, now=T0)
    assert started.rollout is not None and started.rollout.traffic == "httpRoute"
    assert started.rollout.to_status()["traffic"] == "httpRoute"
    assert backends(api) == [(f"{NAME}-stable", 90), (f"{NAME}-canary", 10)]
    for track in ("stable", "canary"):
        arm = api.get(Ref("v1", "Service", NS, f"{NAME}-{track}"))
        assert arm["spec"]["selector"][TRACK_LABEL] == track
        assert arm["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        kubernetes_validate.validate(arm, "1.33", strict=True)
    # Each arm's pods carry their own track: each Service selects one arm alone.
    assert api.get(STABLE)["spec"]["template"]["metadata"]["labels"][TRACK_LABEL] == "stable"
    assert api.get(CANARY)["spec"]["template"]["metadata"]["labels"][TRACK_LABEL] == "canary"
    # Sized for its share of what the stable arm serves (10% of 3 pods' load: 1), not by proportion.
    assert api.get(CANARY)["spec"]["replicas"] == 1

    half = reconcile(api, owner("2", replicas=5, route=GATEWAY), rollout=replace(started.rollout, step=1, weight=50))
    assert backends(api) == [(f"{NAME}-stable", 50), (f"{NAME}-canary", 50)]
    assert api.get(CANARY)["spec"]["replicas"] == 3 and api.get(STABLE)["spec"]["replicas"] == 5
    assert half.rollout is not None

    promoted = reconcile(
        api, owner("2", replicas=5, route=GATEWAY), rollout=replace(half.rollout, phase=Phase.PROMOTED)
    )
    assert backends(api) == [(NAME, 1)]
    for gone in (CANARY, Ref("v1", "Service", NS, f"{NAME}-stable"), Ref("v1", "Service", NS, f"{NAME}-canary")):
        assert api.get(gone) is None
        assert Change(Action.DELETED, gone.kind, gone.name) in promoted.changes


def test_a_route_added_with_the_change_splits_that_canary_by_replicas(api: KubeApi, cluster: Cluster) -> None:
    """The stable pods from before the route have no `track: stable`: a Service of the stable arm
    would select none of them, so this canary is split by replicas, and says so."""
    declare(cluster.emulator, "gateway.networking.k8s.io/v1/httproutes", "HTTPRoute")
    first = reconcile(api, owner("1"), now=T0)
    started = reconcile(api, owner("2", route=GATEWAY), rollout=first.rollout, now=T0)
    assert started.rollout is not None and started.rollout.traffic == "replicas"
    assert backends(api) == [(NAME, 1)] and api.get(Ref("v1", "Service", NS, f"{NAME}-stable")) is None
    assert TRACK_LABEL not in api.get(STABLE)["spec"]["template"]["metadata"]["labels"]


def test_without_the_gateway_api_the_canary_is_split_by_replicas_and_the_route_reported(api: KubeApi) -> None:
    first = reconcile(api, owner("1", route=GATEWAY), now=T0)
    assert [kind.kind for kind in first.unavailable] == ["HTTPRoute"]
    started = reconcile(api, owner("2", route=GATEWAY), rollout=first.rollout, now=T0)
    assert started.rollout is not None and started.rollout.traffic == "replicas"
    assert api.get(CANARY) is not None and api.get(Ref("v1", "Service", NS, f"{NAME}-canary")) is None
