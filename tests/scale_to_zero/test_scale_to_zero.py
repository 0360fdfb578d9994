"""autoscaling.scaleToZero, the operator's side: the spec's rules, NAME-private and NAME-activator
(builders/activator.py), the slice kept as the ready count and the activator's pods change
(scale_to_zero.py, against the emulated API server), the wake, and Ready at zero."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import threading
from typing import Any

import kopf
import kubernetes
import kubernetes_validate
import pytest

from inference_operator import scale_to_zero
from inference_operator import status as st
from inference_operator.builders import Owner
from inference_operator.builders.activator import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    ROUTE_ANNOTATION,
    SERVICE_NAME_LABEL,
    WAKE_ANNOTATION,
    ActivatorEndpoints,
    Wake,
    build_activator_slice,
    check_names,
)
from inference_operator.handlers import shared
from inference_operator.handlers.scale_to_zero import NOTHING, activator_selector
from inference_operator.k8s import KubeApi, Ref
from inference_operator.kinds import ENDPOINT_SLICE, INFERENCE_SERVICE, SERVICE
from inference_operator.models import SpecError, parse_spec
from inference_operator.reasons import Reason
from inference_operator.reconcile import Action, reconcile
from inference_operator.settings import ActivatorSettings, SettingsError
from inference_operator.stages import rendered
from testsupport.cluster import Cluster
from testsupport.crd import addon_errors

SCALING = {"minReplicas": 0, "maxReplicas": 4, "target": 100, "scaleToZero": {"idleSeconds": 60, "maxWaitSeconds": 90}}
ACTIVATOR = ActivatorEndpoints(("10.244.0.7", "10.244.0.9"), 8012)


def owner(name: str = "mlp", uid: str = "u-1", replicas: int = 0, **scaling: Any) -> Owner:
    spec = {"model": {"uri": "pvc://models/mlp"}, "replicas": replicas, "autoscaling": {**SCALING, **scaling}}
    return Owner(name=name, namespace="ml", uid=uid, spec=parse_spec(spec))


def plain_owner(name: str = "mlp", uid: str = "u-1") -> Owner:
    return Owner(name=name, namespace="ml", uid=uid, spec=parse_spec({"model": {"uri": "pvc://models/mlp"}}))


def test_the_private_service_selects_the_pods_and_validates() -> None:
    built = [obj for obj in rendered(owner()) if obj["kind"] == "Service"]
    assert [s["metadata"]["name"] for s in built] == ["mlp", "mlp-private"]
    public, private = built
    assert private["spec"]["selector"] == public["spec"]["selector"]
    assert [p["name"] for p in private["spec"]["ports"]] == ["http"]
    kubernetes_validate.validate(private, "1.33", strict=True)
    assert not [obj for obj in rendered(plain_owner()) if obj["metadata"]["name"].endswith("-private")]


def test_the_activator_slice_routes_the_public_service_to_the_activator_and_validates() -> None:
    piece = build_activator_slice(owner(), ACTIVATOR)
    kubernetes_validate.validate(piece, "1.33", strict=True)
    labels = piece["metadata"]["labels"]
    assert labels[SERVICE_NAME_LABEL] == "mlp"  # kube-proxy adds it to mlp's endpoints
    assert labels[MANAGED_BY_LABEL] == MANAGED_BY  # the EndpointSlice controller leaves it alone
    assert [e["addresses"] for e in piece["endpoints"]] == [["10.244.0.7"], ["10.244.0.9"]]
    assert piece["ports"] == [{"name": "http", "port": 8012, "protocol": "TCP"}]  # the Service's port name
    assert piece["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    route = json.loads(piece["metadata"]["annotations"][ROUTE_ANNOTATION])
    assert route == {"maxWaitSeconds": 90, "maxHeld": 1000, "readyPath": "/health/ready"}
    assert "upstream" not in route and "hosts" not in route  # the activator reads those from Services


def test_a_route_to_a_service_that_scales_to_zero_names_it_as_the_activator_knows_it() -> None:
    routing = {"httpRoute": {"parentRefs": [{"name": "gw"}], "hostnames": ["mlp.example.com"]}}
    spec = {"model": {"uri": "pvc://models/mlp"}, "autoscaling": SCALING, "routing": routing}
    built = rendered(Owner(name="mlp", namespace="ml", uid="u-1", spec=parse_spec(spec)))
    (route,) = [obj for obj in built if obj["kind"] == "HTTPRoute"]
    assert addon_errors(route) == []  # the Gateway API's own schema and CEL rules
    (rule,) = route["spec"]["rules"]
    assert rule["filters"] == [{"type": "URLRewrite", "urlRewrite": {"hostname": "mlp.ml.svc.cluster.local"}}]
    plain = {**spec, "autoscaling": {**SCALING, "minReplicas": 1}}
    plain["autoscaling"].pop("scaleToZero")
    (route,) = [o for o in rendered(Owner("mlp", "ml", "u-1", parse_spec(plain))) if o["kind"] == "HTTPRoute"]
    assert "filters" not in route["spec"]["rules"][0]  # the gateway's Host is left alone


def test_the_activator_endpoints_are_its_ready_ipv4_addresses() -> None:
    slices = [
        {
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8012}, {"name": "metrics", "port": 9092}],
            "endpoints": [
                {"addresses": ["10.0.0.2"], "conditions": {"ready": True}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": False}},
                {"addresses": ["10.0.0.4"], "conditions": {"ready": True, "terminating": True}},
                {"addresses": ["10.0.0.1"]},  # no conditions: ready, as the API defines it
            ],
        },
        {"addressType": "IPv6", "ports": [{"name": "http", "port": 8012}], "endpoints": [{"addresses": ["fd00::2"]}]},
    ]
    found = ActivatorEndpoints.from_slices(slices)
    assert found == ActivatorEndpoints(("10.0.0.1", "10.0.0.2"), 8012)
    assert found.usable
    assert not ActivatorEndpoints.from_slices([]).usable


def grpc_owner(grpc_port: int | None = 9000) -> Owner:
    runtime = {} if grpc_port is None else {"grpcPort": grpc_port}
    spec = {"model": {"uri": "pvc://models/mlp"}, "replicas": 0, "autoscaling": SCALING, "runtime": runtime}
    return Owner(name="mlp", namespace="ml", uid="u-1", spec=parse_spec(spec))


def test_a_service_with_a_grpc_port_reaches_the_activators_grpc_port_at_zero() -> None:
    activator = ActivatorEndpoints(("10.244.0.7",), 8012, 8013)
    built = [obj for obj in rendered(grpc_owner()) if obj["kind"] == "Service"]
    public, private = built
    grpc = {"name": "grpc", "port": 9000, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"}
    assert private["spec"]["ports"][1] == grpc  # the activator's way to the replicas' gRPC port
    assert public["spec"]["ports"][-1]["name"] == "grpc"  # the name the slice's port pairs with
    kubernetes_validate.validate(private, "1.33", strict=True)
    piece = build_activator_slice(grpc_owner(), activator)
    kubernetes_validate.validate(piece, "1.33", strict=True)
    assert piece["ports"] == [
        {"name": "http", "port": 8012, "protocol": "TCP"},
        {"name": "grpc", "port": 8013, "protocol": "TCP", "appProtocol": "grpc"},
    ]
    # No gRPC port on the service, or none on the activator: the slice carries http alone.
    for without in (build_activator_slice(grpc_owner(None), activator), build_activator_slice(grpc_owner(), ACTIVATOR)):
        assert [p["name"] for p in without["ports"]] == ["http"]
    slices = [
        {
            "addressType": "IPv4",
            "ports": [
                {"name": "http", "port": 8012},
                {"name": "grpc", "port": 8013},
                {"name": "metrics", "port": 9090},
            ],
            "endpoints": [{"addresses": ["10.244.0.7"], "conditions": {"ready": True}}],
        }
    ]
    assert ActivatorEndpoints.from_slices(slices) == activator


def test_a_name_too_long_for_the_derived_names_is_refused() -> None:
    check_names("a" * 53)
    with pytest.raises(SpecError, match="longer than 53"):
        check_names("a" * 54)


def test_the_wake_annotation_is_read_and_a_hand_written_one_breaks_nothing() -> None:
    assert Wake.of({WAKE_ANNOTATION: "2026-12-04T21:00:00Z"}).at is not None
    assert Wake.of({WAKE_ANNOTATION: "soon"}).at is None
    assert Wake.of(None).at is None
    asked = Wake.of({WAKE_ANNOTATION: "2026-12-04T21:00:05Z"})
    zero_at = Wake.of({WAKE_ANNOTATION: "2026-12-04T21:00:00Z"}).at
    assert scale_to_zero.wake_replicas(owner(), 0, asked, zero_at) == 1
    assert scale_to_zero.wake_replicas(owner(), 0, asked, None) == 1  # never scaled by the loop
    assert scale_to_zero.wake_replicas(owner(), 2, asked, zero_at) is None  # awake (or waking)
    assert scale_to_zero.wake_replicas(plain_owner(), 0, asked, zero_at) is None  # zero by hand stays zero
    later = Wake.of({WAKE_ANNOTATION: "2026-12-04T21:00:10Z"}).at
    assert scale_to_zero.wake_replicas(owner(), 0, asked, later) is None  # an old wake is history
    # In the second of the decision: a request the activator took as the last pod went (whole seconds).
    assert scale_to_zero.wake_replicas(owner(), 0, asked, asked.at) == 1


def test_zero_replicas_is_ready_for_a_service_that_scales_to_zero_only() -> None:
    state = st.Rollout(desired=0, replicas=0, ready=0, updated=0, done=True, message="")
    at_zero = st.compute_status(None, state, 1, serves_at_zero=True)
    ready = st.find_condition(at_zero["conditions"], st.READY)
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", Reason.SCALED_TO_ZERO)
    by_hand = st.find_condition(st.compute_status(None, state, 1)["conditions"], st.READY)
    assert by_hand is not None and by_hand["status"] == "False"
    broken = st.compute_status(None, state, 1, st.Problem(Reason.INVALID_SPEC, "bad"), serves_at_zero=True)
    assert st.find_condition(broken["conditions"], st.READY)["status"] == "False"  # type: ignore[index]


def test_the_activator_setting_and_its_watch_selector() -> None:
    settings = ActivatorSettings.from_env({"INFERENCE_OPERATOR_ACTIVATOR_SERVICE": "inference-system/rio-activator"})
    assert (settings.namespace, settings.service) == ("inference-system", "rio-activator")
    assert activator_selector(settings) == "kubernetes.io/service-name=rio-activator"
    assert activator_selector(ActivatorSettings()) == NOTHING  # no activator: no slice watched
    with pytest.raises(SettingsError):
        ActivatorSettings.from_env({"INFERENCE_OPERATOR_ACTIVATOR_SERVICE": "rio-activator"})


def _api(cluster: Cluster) -> KubeApi:
    return KubeApi(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))


def _create(cluster: Cluster, name: str, spec: dict[str, Any]) -> str:
    obj = {"apiVersion": "inference.rocm.dev/v1alpha1", "kind": "InferenceService"}
    response = cluster.apply_cr({**obj, "metadata": {"name": name, "namespace": "ml"}, "spec": spec})
    assert response.status_code in (200, 201), response.text
    return str(response.json()["metadata"]["uid"])


def _created(cluster: Cluster, replicas: int = 0) -> Owner:
    """`owner()`'s service, created in the emulated API server (with the uid it gave)."""
    spec = {"model": {"uri": "pvc://models/mlp"}, "replicas": replicas, "autoscaling": SCALING}
    return owner(uid=_create(cluster, "mlp", spec), replicas=replicas)


def test_the_slice_follows_the_ready_count_and_the_activator(cluster: Cluster) -> None:
    api = _api(cluster)
    service = _created(cluster)
    ref = Ref.to(ENDPOINT_SLICE, "ml", "mlp-activator")
    registry = scale_to_zero.Registry()

    assert registry.remember(service, 0)
    change = scale_to_zero.sync_slice(api, service, 0, ACTIVATOR)
    assert change is not None and change.action == Action.CREATED
    assert api.get(ref) is not None
    assert scale_to_zero.sync_slice(api, service, 0, ACTIVATOR) is None  # unchanged: no write

    registry.activator = ActivatorEndpoints(("10.244.0.8",), 8012)  # the activator rolled
    assert [c.action for c in registry.resync(api, lambda namespace, name: contextlib.nullcontext())] == [
        Action.UPDATED
    ]
    live = api.get(ref)
    assert live is not None and [e["addresses"] for e in live["endpoints"]] == [["10.244.0.8"]]

    # Zero asked for while the last replica is still ready (it drains): the activator stays in the
    # path, so no request finds the Service without an endpoint once the replica stops listening.
    assert scale_to_zero.sync_slice(api, service, 1, registry.activator) is None
    assert api.get(ref) is not None
    woken = owner(uid=service.uid, replicas=1)
    assert scale_to_zero.sync_slice(api, woken, 0, registry.activator) is None  # woken, not ready yet: held
    change = scale_to_zero.sync_slice(api, woken, 1, registry.activator)  # a replica is ready: out of the path
    assert change is not None and change.action == Action.DELETED
    assert api.get(ref) is None
    assert scale_to_zero.sync_slice(api, service, 0, None) is None  # no activator known: no slice
    assert scale_to_zero.sync_slice(api, service, 0, ActivatorEndpoints((), 8012)) is None


def test_turning_scale_to_zero_off_removes_the_private_service_and_the_slice(cluster: Cluster) -> None:
    api = _api(cluster)
    service = _created(cluster)
    reconcile(api, service)
    assert api.get(Ref.to(SERVICE, "ml", "mlp-private")) is not None
    registry = scale_to_zero.Registry()
    registry.remember(service, 0)
    scale_to_zero.sync_slice(api, service, 0, ACTIVATOR)

    plain = plain_owner(uid=service.uid)
    result = reconcile(api, plain)
    assert ("Service", "mlp-private") in [(c.kind, c.name) for c in result.writes if c.action == Action.DELETED]
    assert registry.remember(plain, None)  # it was known: its slice is looked at once more
    change = scale_to_zero.sync_slice(api, plain, None, ACTIVATOR)
    assert change is not None and change.action == Action.DELETED
    assert not registry.remember(plain, None)  # and then no more


def test_the_slice_follows_status_writes_in_their_order(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two status writes race (a Deployment event's mirror and the reconcile): the first saw the
    service at zero, the second a ready replica. The first's follow of the slice is held up (a
    slow API call): it still lands before the second write, never after its follow, so the
    service's traffic goes to its replica. Followed after the status lock, the held-up follow put
    the slice back to the activator, and the activator's next resync kept it there."""
    monkeypatch.setattr(shared, "normal_event", lambda *args: None)  # kopf posts events only in handlers
    api = _api(cluster)
    service = _created(cluster, replicas=1)  # woken: one replica asked for
    registry = scale_to_zero.Registry(activator=ACTIVATOR)
    memo = kopf.Memo(api=api, scale_to_zero=registry, status_locks=shared.StatusLocks())
    holding, second_done = threading.Event(), threading.Event()
    followed: list[tuple[int, bool]] = []

    def write(ready: int, held: bool) -> None:
        memo_of_its_object = copy.copy(memo)  # as kopf gives each object's handlers (a mirror's, a reconcile's)

        def follow(status: dict[str, Any]) -> None:
            followed.append((status["readyReplicas"], shared.status_lock(memo_of_its_object, REF).locked()))
            if held:
                holding.set()
                second_done.wait(1)  # what the second write would have done by now, were it able to
            shared.follow_activator(memo_of_its_object, {}, service, status, logging.getLogger("test"))

        shared.publish(memo_of_its_object, REF, lambda fresh: {"readyReplicas": ready}, then=follow)
        if not held:
            second_done.set()

    first = threading.Thread(target=write, args=(0, True))
    first.start()
    assert holding.wait(10)
    second = threading.Thread(target=write, args=(1, False))
    second.start()
    first.join(10)
    second.join(10)
    assert registry.services[("ml", "mlp")][1] == 1
    assert api.get(Ref.to(ENDPOINT_SLICE, "ml", "mlp-activator")) is None, "traffic still led to the activator"
    assert (cluster.get_cr("ml", "mlp") or {})["status"]["readyReplicas"] == 1
    assert followed == [(0, True), (1, True)]  # each under the lock, in the writes' order


class AskedLock:
    """A lock that says when someone asks for it."""

    def __init__(self) -> None:
        self.lock, self.asked = threading.Lock(), threading.Event()

    def __enter__(self) -> None:
        self.asked.set()
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_resync_reads_each_services_ready_count_under_its_status_lock(cluster: Cluster) -> None:
    """The activator rolled while a status write, holding the service's lock, found a ready
    replica: the resync waits for the write and syncs from its count (no slice: traffic to the
    replica), not from the count it could have read before."""
    api = _api(cluster)
    service = _created(cluster, replicas=1)  # woken: one replica asked for
    registry = scale_to_zero.Registry(activator=ACTIVATOR)
    registry.remember(service, 0)
    lock = AskedLock()
    changes: list[Any] = []
    with lock.lock:
        resync = threading.Thread(target=lambda: changes.extend(registry.resync(api, lambda namespace, name: lock)))
        resync.start()
        assert lock.asked.wait(10)
        registry.remember(service, 1)  # the status write under way saw a ready replica
    resync.join(10)
    assert changes == [] and api.get(Ref.to(ENDPOINT_SLICE, "ml", "mlp-activator")) is None


REF = Ref.to(INFERENCE_SERVICE, "ml", "mlp")
ACTIVATOR_SLICES = "/apis/discovery.k8s.io/v1/namespaces/inference-system/endpointslices"


def _activator_slice(address: str) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "rio-activator-abcde", "namespace": "inference-system",
                     "labels": {SERVICE_NAME_LABEL: "rio-activator"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": 8012, "protocol": "TCP"}],
    }  # fmt: skip


@pytest.mark.integration
def test_the_operator_follows_the_activator_and_wakes_a_service_at_once(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kopf.testing import KopfRunner

    from testsupport.cluster import inference_service, wait_for

    monkeypatch.setenv("INFERENCE_OPERATOR_ACTIVATOR_SERVICE", "inference-system/rio-activator")
    created = cluster.request("POST", ACTIVATOR_SLICES, _activator_slice("10.244.0.7"), content_type="application/json")
    assert created.status_code in (200, 201), created.text
    slice_path = "/apis/discovery.k8s.io/v1/namespaces/ml/endpointslices/mlp-activator"

    def addresses() -> list[list[str]] | None:
        found = cluster.request("GET", slice_path)
        return [e["addresses"] for e in found.json()["endpoints"]] if found.status_code == 200 else None

    spec = {"model": {"uri": "pvc://models/mlp"}, "replicas": 0, "autoscaling": {**SCALING, "intervalSeconds": 60}}
    args = ["run", "--all-namespaces", "--standalone", "-m", "inference_operator.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        assert cluster.apply_cr(inference_service("mlp", "ml", spec)).status_code in (200, 201)
        wait_for(lambda: addresses() == [["10.244.0.7"]], message="the service's traffic to the activator")
        ready = wait_for(lambda: condition_of(cluster, "Ready"), message="Ready at zero")
        assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero")

        moved = _activator_slice("10.244.0.8")  # the activator rolled to a new pod
        path = f"{ACTIVATOR_SLICES}/rio-activator-abcde"
        assert cluster.request("PUT", path, moved, content_type="application/json").status_code == 200
        wait_for(lambda: addresses() == [["10.244.0.8"]], message="the slice following the activator")

        wake = {"metadata": {"annotations": {WAKE_ANNOTATION: "2026-12-04T21:00:00Z"}}}
        assert cluster.patch(CR_PATH, "ml", "mlp", wake).status_code == 200
        wait_for(lambda: (cluster.get_cr("ml", "mlp") or {}).get("spec", {}).get("replicas") == 1, message="woken")
    assert runner.exception is None, runner.exception


CR_PATH = "inference.rocm.dev/v1alpha1/inferenceservices"


def condition_of(cluster: Cluster, kind: str) -> dict[str, Any] | None:
    status = (cluster.get_cr("ml", "mlp") or {}).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


def test_both_engines_pods_answer_the_ready_path_the_activator_polls() -> None:
    """The activator asks NAME-private for READY_PATH: the model server and a vLLM pod's front
    both answer it, so a vLLM service scales to zero the same way."""
    from inference_operator.builders.activator import READY_PATH
    from vllm_front.server import READY_PATH as FRONT_READY

    assert FRONT_READY == READY_PATH
    server_paths = {getattr(route, "path", None) for route in _server_routes()}
    assert READY_PATH in server_paths
    scaling = {**SCALING, "metric": "ttftP95Ms"}
    spec = {"model": {"uri": "hf://org/llm"}, "runtime": {"engine": "vllm"}, "autoscaling": scaling}
    built = rendered(Owner(name="llm", namespace="ml", uid="u-1", spec=parse_spec(spec)))
    assert "llm-private" in [obj["metadata"]["name"] for obj in built if obj["kind"] == "Service"]


def _server_routes() -> list[Any]:
    from model_server.api.health import router

    return list(router.routes)
