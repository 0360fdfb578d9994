"""routing.router with autoscaling.scaleToZero, the operator's side: at zero the activator's slice
leads NAME-router (the clients' Service), its way on is NAME-router-private (the router's pods),
the router's replicas go to zero with the workers and come back with them, and the slice stays
until both the workers and the router have a ready replica. The objects the operator builds are
read here as the activator reads them (inference_activator.routes), so the two cannot drift apart."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import kubernetes
import kubernetes_validate
import pytest

from inference_activator.routes import HoldPolicy, ServiceKey, route_for
from inference_operator import scale_to_zero
from inference_operator import status as st
from inference_operator.builders import Owner
from inference_operator.builders.activator import (
    SERVICE_NAME_LABEL,
    ActivatorEndpoints,
    build_activator_slice,
    check_names,
)
from inference_operator.handlers import shared
from inference_operator.k8s import KubeApi, Ref
from inference_operator.kinds import ENDPOINT_SLICE, SERVICE
from inference_operator.models import SpecError, parse_spec
from inference_operator.reasons import Reason
from inference_operator.reconcile import Action, reconcile
from inference_operator.stages import rendered
from testsupport.cluster import Cluster

SCALING = {"minReplicas": 0, "maxReplicas": 4, "target": 500, "metric": "ttftP95Ms", "scaleToZero": {}}
ACTIVATOR = ActivatorEndpoints(("10.244.0.7", "10.244.0.9"), 8012, 8013)
CAPS = HoldPolicy(max_wait_seconds=600, max_held=100, max_held_bytes=64 << 20)


def spec(replicas: int = 0, router: bool = True) -> dict[str, Any]:
    return {
        "model": {"uri": "hf://org/llm@main"},
        "runtime": {"engine": "vllm"},
        "replicas": replicas,
        "autoscaling": SCALING,
        "routing": {"router": {"replicas": 2}} if router else {},
    }


def owner(replicas: int = 0, router: bool = True, uid: str = "u-1") -> Owner:
    return Owner(name="llm", namespace="ml", uid=uid, spec=parse_spec(spec(replicas, router)))


def by_name(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def test_the_activators_way_on_is_the_routers_pods_and_the_router_follows_its_workers_to_zero() -> None:
    at_zero = rendered(owner(0))
    services = by_name(at_zero, "Service")
    assert set(services) == {"llm", "llm-router", "llm-router-private"}  # no llm-private: not the way on
    private, router_service = services["llm-router-private"], services["llm-router"]
    assert private["spec"]["selector"] == router_service["spec"]["selector"]  # the router's pods
    assert private["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert private["metadata"]["labels"]["inference.rocm.dev/role"] == "activator"
    kubernetes_validate.validate(private, "1.33", strict=True)
    deployments = by_name(at_zero, "Deployment")
    assert deployments["llm"]["spec"]["replicas"] == 0
    assert deployments["llm-router"]["spec"]["replicas"] == 0  # nothing runs at zero
    woken = by_name(rendered(owner(1)), "Deployment")
    assert (woken["llm"]["spec"]["replicas"], woken["llm-router"]["spec"]["replicas"]) == (1, 2)
    # Without scale to zero nothing changes: the router keeps its replicas, no private Service.
    plain = parse_spec({**spec(1), "autoscaling": {"maxReplicas": 4, "target": 500, "metric": "ttftP95Ms"}})
    plain_objects = rendered(Owner(name="llm", namespace="ml", uid="u-1", spec=plain))
    assert by_name(plain_objects, "Deployment")["llm-router"]["spec"]["replicas"] == 2
    assert "llm-router-private" not in by_name(plain_objects, "Service")


def test_the_slice_leads_the_routers_service_and_asks_the_routers_readiness() -> None:
    piece = build_activator_slice(owner(), ACTIVATOR)
    kubernetes_validate.validate(piece, "1.33", strict=True)
    assert piece["metadata"]["name"] == "llm-activator"
    assert piece["metadata"]["labels"][SERVICE_NAME_LABEL] == "llm-router"  # kube-proxy: NAME-router's traffic
    assert [p["name"] for p in piece["ports"]] == ["http"]  # the router's Service has no gRPC port
    unrouted = build_activator_slice(owner(router=False), ACTIVATOR)
    assert unrouted["metadata"]["labels"][SERVICE_NAME_LABEL] == "llm"
    # A gateway's route leads the router's Service, under the name the activator answers at zero.
    routing = {"router": {}, "httpRoute": {"parentRefs": [{"name": "gw"}], "hostnames": ["llm.example.com"]}}
    routed = Owner(name="llm", namespace="ml", uid="u-1", spec=parse_spec({**spec(), "routing": routing}))
    (rule,) = by_name(rendered(routed), "HTTPRoute")["llm"]["spec"]["rules"]
    assert [b["name"] for b in rule["backendRefs"]] == ["llm-router"]
    assert rule["filters"] == [{"type": "URLRewrite", "urlRewrite": {"hostname": "llm-router.ml.svc.cluster.local"}}]


def test_the_activator_reads_the_operators_objects_as_a_route_to_the_router_that_wakes_the_service() -> None:
    """The Services and slice as built, with the cluster IPs the API server gives them, through
    the activator's own `route_for`: the router's hosts, its pods' private Service, the router's
    readiness path, and a wake of the InferenceService llm (not llm-router)."""
    services = by_name(rendered(owner()), "Service")
    for obj, ip in ((services["llm-router"], "10.96.0.20"), (services["llm-router-private"], "10.96.0.21")):
        obj["spec"]["clusterIP"], obj["spec"]["clusterIPs"] = ip, [ip]
    route = route_for(
        build_activator_slice(owner(), ACTIVATOR),
        services["llm-router"],
        services["llm-router-private"],
        CAPS,
        "cluster.local",
    )
    assert route.key == ServiceKey("ml", "llm-router")
    assert "llm-router.ml.svc.cluster.local" in route.hosts and "10.96.0.20" in route.hosts
    assert route.upstream == "http://10.96.0.21:80"
    assert route.policy.ready_path == "/readiness"
    assert route.wake_name == "llm"
    assert route.grpc_upstream is None


def test_a_name_too_long_for_the_routers_derived_names_is_refused() -> None:
    check_names("a" * 53)  # llm-private, llm-activator
    check_names("a" * 48, router=True)  # aaa-router-private: 63
    with pytest.raises(SpecError, match="longer than 48"):
        check_names("a" * 49, router=True)


def test_the_path_is_ready_when_every_role_on_it_has_a_ready_replica() -> None:
    assert scale_to_zero.ready_on_path({"readyReplicas": 2}) == 2
    assert scale_to_zero.ready_on_path({}) is None

    def roles(predictor: int, router: int) -> dict[str, Any]:
        return {
            "readyReplicas": predictor + router,
            "roles": [
                {"role": "predictor", "readyReplicas": predictor},
                {"role": "router", "readyReplicas": router},
            ],
        }

    assert scale_to_zero.ready_on_path(roles(1, 0)) == 0  # the worker is up, no router has found it
    assert scale_to_zero.ready_on_path(roles(0, 2)) == 0
    assert scale_to_zero.ready_on_path(roles(1, 1)) == 1


def test_a_routed_service_at_zero_is_ready_and_names_no_short_role() -> None:
    """The built Deployments at zero, as their controller reports them once it has seen them:
    the service is Ready (ScaledToZero), as a service of one workload is. A router kept at its
    replicas would read "router 0/2 replicas ready", not Ready, for as long as it is at zero."""
    deployments = by_name(rendered(owner(0)), "Deployment")
    states = {}
    for role, name in (("predictor", "llm"), ("router", "llm-router")):
        live = {**deployments[name], "metadata": {**deployments[name]["metadata"], "generation": 1}}
        live["status"] = {"observedGeneration": 1}  # no pod: no counts
        states[role] = st.deployment_rollout(live)
    status = st.compute_status(None, states, 1, serves_at_zero=True)
    ready = st.find_condition(status["conditions"], st.READY)
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", Reason.SCALED_TO_ZERO), ready
    assert {r["role"] for r in status["roles"]} == {"predictor", "router"}


def _api(cluster: Cluster) -> KubeApi:
    return KubeApi(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))


def _created(cluster: Cluster, replicas: int = 0) -> Owner:
    obj = {"apiVersion": "inference.rocm.dev/v1alpha1", "kind": "InferenceService"}
    response = cluster.apply_cr({**obj, "metadata": {"name": "llm", "namespace": "ml"}, "spec": spec(replicas)})
    assert response.status_code in (200, 201), response.text
    return owner(replicas, uid=str(response.json()["metadata"]["uid"]))


def _status(predictor: int, router: int) -> dict[str, Any]:
    return {
        "readyReplicas": predictor + router,
        "roles": [{"role": "predictor", "readyReplicas": predictor}, {"role": "router", "readyReplicas": router}],
    }


def test_the_slice_stays_until_a_router_pod_is_ready_too(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Woken: the worker is Ready before any router pod has found it; NAME-router then has no
    ready endpoint, so the activator keeps holding. Once a router pod is Ready, the slice goes.
    Counted by readyReplicas alone (the sum over roles) the slice went with the worker."""
    monkeypatch.setattr(shared, "normal_event", lambda *args: None)  # kopf posts events only in handlers
    api = _api(cluster)
    service = _created(cluster)
    reconcile(api, service)
    assert api.get(Ref.to(SERVICE, "ml", "llm-router-private")) is not None
    registry = scale_to_zero.Registry(activator=ACTIVATOR)
    memo = kopf.Memo(api=api, scale_to_zero=registry, status_locks=shared.StatusLocks())
    log = logging.getLogger("test")
    ref = Ref.to(ENDPOINT_SLICE, "ml", "llm-activator")

    shared.follow_activator(memo, {}, service, _status(0, 0), log)
    live = api.get(ref)
    assert live is not None and live["metadata"]["labels"][SERVICE_NAME_LABEL] == "llm-router"

    woken = owner(1, uid=service.uid)
    shared.follow_activator(memo, {}, woken, _status(1, 0), log)
    assert api.get(ref) is not None, "the slice went before any router pod was ready"
    shared.follow_activator(memo, {}, woken, _status(1, 1), log)
    assert api.get(ref) is None


def test_turning_the_router_on_at_zero_moves_the_one_slice_and_the_private_service(cluster: Cluster) -> None:
    api = _api(cluster)
    service = _created(cluster)
    unrouted = owner(0, router=False, uid=service.uid)
    reconcile(api, unrouted)
    assert api.get(Ref.to(SERVICE, "ml", "llm-private")) is not None
    change = scale_to_zero.sync_slice(api, unrouted, 0, ACTIVATOR)
    assert change is not None and change.action == Action.CREATED

    result = reconcile(api, service)
    deleted = [(c.kind, c.name) for c in result.writes if c.action == Action.DELETED]
    assert ("Service", "llm-private") in deleted
    assert api.get(Ref.to(SERVICE, "ml", "llm-router-private")) is not None
    change = scale_to_zero.sync_slice(api, service, 0, ACTIVATOR)
    assert change is not None and change.action == Action.UPDATED
    live = api.get(Ref.to(ENDPOINT_SLICE, "ml", "llm-activator"))
    assert live is not None and live["metadata"]["labels"][SERVICE_NAME_LABEL] == "llm-router"
