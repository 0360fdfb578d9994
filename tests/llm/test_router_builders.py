"""routing.router: the objects the operator deploys for the vLLM router (valid as a current
Kubernetes judges them), what the router is told (its selector finds the service's serving pods
and nothing else, its bounds), its rights (pods read, through the chart's ClusterRole only), and
where status.url and the HTTPRoute lead once it is on."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml

from inference_operator.builders import Owner, build_all, service_url
from inference_operator.builders.canary import canary_deployment
from inference_operator.builders.common import selector_labels, serving_labels
from inference_operator.builders.router import (
    CLUSTER_ROLE,
    METRICS_PORT,
    POLICY_FLAGS,
    PORT,
    build_router,
    router_args,
    router_labels,
)
from inference_operator.models import RouterPolicy, SpecError, parse_spec
from inference_operator.settings import NetworkPolicySettings
from testsupport.crd import ROOT, apply_defaults, crd_schema, validate_custom_resource
from testsupport.router import PdWorkers, static_command

NS, NAME, ROUTER = "ml", "llama", "llama-router"
K8S_VERSIONS = ("1.33", kubernetes_validate.latest_version())
SPEC_SCHEMA = crd_schema()["properties"]["spec"]
ROUTE = {"parentRefs": [{"name": "inference", "namespace": "gateways"}], "hostnames": ["llm.example.com"]}


def spec(router: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "model": {"uri": "pvc://models/llama", "name": "llama"},
        "runtime": {"engine": "vllm"},
        "resources": {"gpu": {"count": 1}},
        "replicas": 2,
        "routing": {"router": {} if router is None else router},
        **extra,
    }


def owner(raw: dict[str, Any], name: str = NAME, network: bool = False) -> Owner:
    parsed = parse_spec(apply_defaults(SPEC_SCHEMA, copy.deepcopy(raw)))
    return Owner(name=name, namespace=NS, uid="u-1", spec=parsed, network=NetworkPolicySettings(enabled=network))


def router_objects(raw: dict[str, Any], network: bool = False) -> dict[str, dict[str, Any]]:
    objects = [o for o in build_all(owner(raw, network=network)) if o["metadata"]["name"] == ROUTER]
    kinds = [o["kind"] for o in objects]
    assert len(set(kinds)) == len(kinds), kinds
    return {o["kind"]: o for o in objects}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def selector_of(args: list[str]) -> dict[str, str]:
    """The --selector values of the router's command line, as a label map."""
    start = args.index("--selector") + 1
    values = []
    for arg in args[start:]:
        if arg.startswith("--"):
            break
        values.append(arg)
    return dict(value.split("=", 1) for value in values)


def flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    return value


def test_the_router_is_a_set_of_valid_objects_named_and_owned_after_the_service() -> None:
    objects = router_objects(spec(), network=True)
    assert set(objects) == {
        "ServiceAccount",
        "RoleBinding",
        "NetworkPolicy",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    }
    for obj in objects.values():
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
        assert obj["metadata"]["namespace"] == NS
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert obj["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
    assert router_objects(spec(), network=False).keys() == objects.keys() - {"NetworkPolicy"}


def test_the_router_finds_the_services_serving_pods_and_nothing_else() -> None:
    built = owner(spec())
    objects = build_all(built)
    deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == NAME)
    router = router_objects(spec())["Deployment"]
    (container,) = router["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    wanted = selector_of(args)
    assert wanted == serving_labels(built)
    # The model pods match, the canary's too (they serve the same model), the router's own do not.
    assert matches(wanted, deployment["spec"]["template"]["metadata"]["labels"])
    assert matches(wanted, canary_deployment(deployment, 1)["spec"]["template"]["metadata"]["labels"])
    assert not matches(wanted, router["spec"]["template"]["metadata"]["labels"])
    # Nor another service's pods in the namespace.
    other = next(o for o in build_all(owner(spec(), name="other")) if o["kind"] == "Deployment")
    assert not matches(wanted, other["spec"]["template"]["metadata"]["labels"])
    # In its namespace only (what a namespaced RoleBinding allows), on the pods' serving port.
    assert "--service-discovery" in args
    assert flag(args, "--service-discovery-namespace") == NS
    assert flag(args, "--service-discovery-port") == str(built.spec.runtime.port)
    # The Service and the PDB select the router's pods, not the model's.
    objects_by_kind = router_objects(spec())
    assert objects_by_kind["Service"]["spec"]["selector"] == router_labels(built)
    assert objects_by_kind["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == router_labels(built)
    assert not matches(router_labels(built), selector_labels(built))


@pytest.mark.parametrize("policy", list(RouterPolicy))
def test_the_policy_and_the_bounds_reach_the_command_line(policy: RouterPolicy) -> None:
    raw = spec({"policy": policy.value, "maxConcurrentRequests": 64, "queueSize": 0, "requestTimeoutSeconds": 90})
    args = router_args(owner(raw))
    assert flag(args, "--policy") == POLICY_FLAGS[policy]
    assert flag(args, "--max-concurrent-requests") == "64"
    assert flag(args, "--queue-size") == "0"
    assert flag(args, "--request-timeout-secs") == "90"
    assert int(flag(args, "--max-payload-size")) > 0
    assert flag(args, "--port") == str(PORT) and flag(args, "--prometheus-port") == str(METRICS_PORT)


def test_the_default_policy_is_cache_aware() -> None:
    assert flag(router_args(owner(spec())), "--policy") == "cache_aware"


def test_the_router_pod_is_hardened_probed_bounded_and_sleeps_before_its_sigterm() -> None:
    deployment = router_objects(spec({"resources": {"cpu": "2", "memory": "3Gi"}, "replicas": 3}))["Deployment"]
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == ROUTER and pod["enableServiceLinks"] is False
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "3Gi"},
        "limits": {"cpu": "2", "memory": "3Gi"},
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}
    # A start slower than the liveness probe's patience (measured on the pods tier: 52 s at 100m
    # beside two starting vLLM pods, restarted by the liveness probe at 30 s, again and again)
    # is waited for by the startup probe, and the liveness probe counts only after it.
    startup = container["startupProbe"]
    liveness = container["livenessProbe"]
    assert startup["httpGet"] == liveness["httpGet"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    assert (
        startup["periodSeconds"] * startup["failureThreshold"]
        > liveness["periodSeconds"] * liveness["failureThreshold"]
    )
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python", "-c"] and "sleep" in command[2]
    assert container["image"] == owner(spec()).images.router


def test_one_router_replica_gets_no_disruption_budget() -> None:
    assert "PodDisruptionBudget" not in router_objects(spec({"replicas": 1}))


def test_the_role_binding_names_only_the_charts_pod_reader_role() -> None:
    binding = router_objects(spec())["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ROUTER, "namespace": NS}]
    rules = yaml.safe_load((ROOT / "charts" / "rocm-inference-operator" / "files" / "rbac" / "router.yaml").read_text())
    assert rules == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def test_the_router_reaches_the_pods_serving_port_through_their_network_policy() -> None:
    built = owner(spec(), network=True)
    policy = next(o for o in build_all(built) if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == NAME)
    router_pod = router_objects(spec(), network=True)["Deployment"]["spec"]["template"]["metadata"]["labels"]
    port = built.spec.runtime.port

    def admits(rule: dict[str, Any]) -> bool:
        ports = {p["port"] for p in rule.get("ports", [])}
        peers = rule.get("from")
        from_router = peers is None or any(
            "namespaceSelector" not in peer and matches(peer["podSelector"]["matchLabels"], router_pod)
            for peer in peers
        )
        return port in ports and from_router

    assert any(admits(rule) for rule in policy["spec"]["ingress"])
    own = router_objects(spec(), network=True)["NetworkPolicy"]
    assert own["spec"]["podSelector"]["matchLabels"] == router_labels(built)
    assert {"ports": [{"protocol": "TCP", "port": PORT}]} in own["spec"]["ingress"]


def test_status_url_and_the_route_lead_to_the_router() -> None:
    with_router = owner({**spec(), "routing": {"router": {}, "httpRoute": ROUTE}})
    assert service_url(with_router) == f"http://{ROUTER}.{NS}.svc.cluster.local"
    route = next(o for o in build_all(with_router) if o["kind"] == "HTTPRoute")
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert backend["kind"] == "Service" and backend["name"] == ROUTER and backend["port"] == 80
    without = owner({**spec(), "routing": {"httpRoute": ROUTE}})
    assert service_url(without) == f"http://{NAME}.{NS}.svc.cluster.local"
    assert not [o for o in build_all(without) if o["metadata"]["name"] == ROUTER]


def test_a_name_too_long_for_the_routers_service_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="router"):
        build_router(owner(spec(), name="x" * 60))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"runtime": {"engine": "modelServer"}}, "needs runtime.engine vllm"),
        ({"routing": {"router": {}, "inferencePool": True}}, "one or the other"),
    ],
)
def test_the_crd_refuses_a_router_it_cannot_serve(extra: dict[str, Any], message: str) -> None:
    resource = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {**spec(), **extra},
    }
    errors = validate_custom_resource(resource)
    assert any(message in error for error in errors), errors


def test_the_example_renders_a_router_that_runs_here_with_static_workers() -> None:
    path = ROOT / "examples" / "llm-router.yaml"
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert validate_custom_resource(doc) == []
    built = Owner(doc["metadata"]["name"], doc["metadata"]["namespace"], "u-1", parse_spec(doc["spec"]))
    names = {(o["kind"], o["metadata"]["name"]) for o in build_all(built)}
    router = f"{doc['metadata']['name']}-router"
    assert {("Deployment", router), ("Service", router), ("RoleBinding", router)} <= names
    deployment = next(o for o in build_all(built) if o["kind"] == "Deployment" and o["metadata"]["name"] == router)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # The loopback stand-in keeps every flag but discovery (tests/llm/test_router_processes.py).
    command = static_command(container, ["http://127.0.0.1:1"], 2, 3)
    assert "--service-discovery" not in command and "--selector" not in command
    assert command[-2:] == ["--worker-urls", "http://127.0.0.1:1"]
    assert "--policy=cache_aware" in command and "--port=2" in command
    # In P/D mode the static prefill and decode URLs replace discovery instead of --worker-urls.
    pd = PdWorkers(prefill=["http://127.0.0.1:4"], decode=["http://127.0.0.1:5"])
    command = static_command(container, [], 2, 3, pd=pd)
    assert "--service-discovery" not in command and "--worker-urls" not in command
    assert command[-7:] == [
        "--vllm-pd-disaggregation", "--kv-connector", "nixl",
        "--prefill", "http://127.0.0.1:4", "--decode", "http://127.0.0.1:5",
    ]  # fmt: skip


def test_the_replicas_serve_the_render_endpoint_the_router_tokenizes_with_only_behind_a_router() -> None:
    """Cache-aware routing reads each prompt's tokens from vLLM's /v1/completions/render, which
    vLLM 0.32 answers 403 without --enable-scale-out (every request then went to one replica)."""

    def vllm_args(raw: dict[str, Any]) -> list[str]:
        (deployment,) = [
            o for o in build_all(owner(raw)) if o["kind"] == "Deployment" and o["metadata"]["name"] == NAME
        ]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        return list(container["args"])

    assert "--enable-scale-out" in vllm_args(spec())
    assert "--enable-scale-out" not in vllm_args({**spec(), "routing": {}})
