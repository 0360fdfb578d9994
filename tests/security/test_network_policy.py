"""Each InferenceService's NetworkPolicy: the serving port open to all, the metrics and adapters
sidecar port only from the operator's and Prometheus's namespaces, a multi-node group's ports
(vLLM's distributed port, whose message queues unpickle) only from the service's own pods.
Before it, every port of every model pod was open to the whole pod network."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import kubernetes
import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings

from inference_operator.builders import Owner, build_all
from inference_operator.builders.canary import canary_deployment
from inference_operator.builders.leader_worker_set import MASTER_PORT
from inference_operator.config import OperatorConfig
from inference_operator.k8s import KubeApi, Ref
from inference_operator.models import SpecError, parse_spec
from inference_operator.reconcile import Action, Change, reconcile
from inference_operator.settings import (
    NETWORK_POLICY_ENV,
    OPERATOR_NAMESPACE_ENV,
    PROMETHEUS_NAMESPACES_ENV,
    NetworkPolicySettings,
    SettingsError,
)
from tests.strategies import from_schema
from testsupport.cluster import Cluster
from testsupport.crd import apply_defaults, crd_schema

SPEC_SCHEMA = crd_schema()["properties"]["spec"]

ON = NetworkPolicySettings(enabled=True, operator_namespace="inference-system")
LORA = {
    "model": {"uri": "hf://org/llama"},
    "runtime": {"engine": "vllm", "port": 8000, "metricsPort": 8001},
    "adapters": [{"name": "sql", "uri": "hf://org/sql"}],
}
MULTI_NODE = {"model": {"uri": "hf://org/llama"}, "runtime": {"engine": "vllm"}, "resources": {"gpu": {"nodes": 2}}}
CANARY = {
    "model": {"uri": "pvc://models/m"},
    "resources": {"gpu": {"count": 0}},
    "rollout": {"strategy": "canary", "canary": {"steps": [10], "analysis": {"maxLatencyMs": 50}}},
}


def owner(spec: dict[str, Any], network: NetworkPolicySettings = ON, name: str = "llm") -> Owner:
    return Owner(name=name, namespace="ml", uid="u-1", spec=parse_spec(spec), network=network)


def network_policy(spec: dict[str, Any], network: NetworkPolicySettings = ON) -> dict[str, Any]:
    (found,) = [o for o in build_all(owner(spec, network)) if o["kind"] == "NetworkPolicy"]
    kubernetes_validate.validate(found, "1.33", strict=True)
    return found


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def admitted(policy: dict[str, Any], port: int, peer: dict[str, Any]) -> bool:
    """Whether `peer` ({namespace labels, pod labels, same namespace}) may reach `port`, as the
    network plugin reads the policy's ingress rules."""
    for rule in policy["spec"]["ingress"]:
        if "ports" in rule and port not in [p["port"] for p in rule["ports"]]:
            continue
        if "from" not in rule:
            return True
        for source in rule["from"]:
            pods = "podSelector" not in source or matches(source["podSelector"]["matchLabels"], peer["pod_labels"])
            if "namespaceSelector" in source:  # with a podSelector beside it: both must match
                if matches(source["namespaceSelector"]["matchLabels"], peer["namespace_labels"]) and pods:
                    return True
            elif peer["same_namespace"] and pods:
                return True
    return False


def peer(namespace: str, pod_labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "namespace_labels": {"kubernetes.io/metadata.name": namespace},
        "pod_labels": pod_labels or {},
        "same_namespace": namespace == "ml",
    }


def pod_templates(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    templates = [o["spec"]["template"] for o in objects if o["kind"] == "Deployment"]
    for o in objects:
        if o["kind"] == "LeaderWorkerSet":
            group = o["spec"]["leaderWorkerTemplate"]
            templates += [group["leaderTemplate"], group["workerTemplate"]]
    return templates


def test_the_sidecar_and_metrics_port_answer_only_the_operator_and_prometheus() -> None:
    policy = network_policy(LORA)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    anyone, tenant = peer("other-tenant"), peer("ml", {"app": "client"})
    operator = peer("inference-system", {"app.kubernetes.io/component": "operator"})
    prometheus = peer("monitoring")
    assert all(admitted(policy, 8000, p) for p in (anyone, tenant, operator, prometheus))  # serving: open
    assert [admitted(policy, 8001, p) for p in (anyone, tenant, operator, prometheus)] == [False, False, True, True]
    # The activator shares the operator's namespace and proxies to where tenants' Services lead.
    activator = peer("inference-system", {"app.kubernetes.io/component": "activator"})
    assert admitted(policy, 8000, activator) and not admitted(policy, 8001, activator)
    assert not admitted(policy, 9999, operator)  # any other port: closed
    objects = build_all(owner(LORA))
    (sidecar,) = [c for t in pod_templates(objects) for c in t["spec"]["initContainers"] if c["name"] == "adapters"]
    assert sidecar["ports"][0]["containerPort"] == 8001  # the port the policy closes is the sidecar's


def test_a_multi_node_groups_ports_answer_only_its_own_pods() -> None:
    policy = network_policy(MULTI_NODE)
    objects = build_all(owner(MULTI_NODE))
    templates = pod_templates(objects)
    assert len(templates) == 2
    for template in templates:  # the policy selects the leader and the workers
        assert matches(policy["spec"]["podSelector"]["matchLabels"], template["metadata"]["labels"])
    own = peer("ml", templates[1]["metadata"]["labels"])
    other = peer("ml", {**templates[1]["metadata"]["labels"], "app.kubernetes.io/instance": "other"})
    for port in (MASTER_PORT, 40000):  # the bootstrap, and the ports vLLM's queues and backends pick
        assert admitted(policy, port, own)
        assert not admitted(policy, port, other) and not admitted(policy, port, peer("elsewhere"))
    single = network_policy(LORA)
    assert not admitted(single, MASTER_PORT, peer("ml", templates[1]["metadata"]["labels"] | {"x": "y"}))


def test_the_canarys_pods_are_selected_too() -> None:
    objects = build_all(owner(CANARY))
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    candidate = canary_deployment(deployment, 1)
    assert matches(policy["spec"]["podSelector"]["matchLabels"], candidate["spec"]["template"]["metadata"]["labels"])


def test_a_custom_prometheus_selector_and_none_when_turned_off() -> None:
    selector = {"matchLabels": {"team": "observability"}}
    policy = network_policy(LORA, replace(ON, prometheus_namespaces=selector))
    assert {"namespaceSelector": selector} in policy["spec"]["ingress"][1]["from"]
    off = NetworkPolicySettings()
    assert not [o for o in build_all(owner(LORA, off)) if o["kind"] == "NetworkPolicy"]


def test_the_settings_come_from_the_environment() -> None:
    environ = {
        NETWORK_POLICY_ENV: "true",
        OPERATOR_NAMESPACE_ENV: "inference-system",
        PROMETHEUS_NAMESPACES_ENV: json.dumps({"matchExpressions": [{"key": "team", "operator": "Exists"}]}),
    }
    config = OperatorConfig.from_environ(environ)
    assert config.network.enabled and config.network.operator_namespace == "inference-system"
    assert config.owner("m", "ml", "u", parse_spec(LORA)).network == config.network
    assert not OperatorConfig.from_environ({}).network.enabled
    for bad in (
        {NETWORK_POLICY_ENV: "yes"},
        {NETWORK_POLICY_ENV: "true"},  # without the operator's namespace
        {PROMETHEUS_NAMESPACES_ENV: "monitoring"},
        {PROMETHEUS_NAMESPACES_ENV: '{"matchLabels": {"a": 1}}'},
        {PROMETHEUS_NAMESPACES_ENV: '{"namespace": "monitoring"}'},
        {PROMETHEUS_NAMESPACES_ENV: '{"matchLabels": {}, "matchExpressions": []}'},  # every namespace
    ):
        with pytest.raises(SettingsError):
            NetworkPolicySettings.from_env(bad)


@pytest.fixture
def api(cluster: Cluster) -> KubeApi:
    return KubeApi(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)), timeout=10)


def test_reconcile_applies_the_policy_and_prunes_it_when_turned_off(api: KubeApi) -> None:
    ref = Ref("networking.k8s.io/v1", "NetworkPolicy", "ml", "guarded")
    spec = {"model": {"uri": "pvc://models/m"}, "resources": {"gpu": {"count": 0}}}
    result = reconcile(api, owner(spec, name="guarded"))
    assert Change(Action.CREATED, "NetworkPolicy", "guarded") in result.changes
    live = api.get(ref)
    assert live is not None and live["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "guarded"
    result = reconcile(api, owner(spec, NetworkPolicySettings(), name="guarded"))
    assert Change(Action.DELETED, "NetworkPolicy", "guarded") in result.changes
    assert api.get(ref) is None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(from_schema(SPEC_SCHEMA))
def test_every_drawn_spec_gets_a_valid_policy_selecting_all_its_pods(drawn: dict[str, Any]) -> None:
    try:
        objects = build_all(
            Owner(name="fuzz", namespace="ml", uid="u", spec=parse_spec(apply_defaults(SPEC_SCHEMA, drawn)), network=ON)
        )
    except SpecError:
        return  # refused: nothing is rendered
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    kubernetes_validate.validate(policy, "1.33", strict=True)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    templates = pod_templates([o for o in objects if o["metadata"]["name"] == "fuzz"])
    assert templates and all(matches(selector, t["metadata"]["labels"]) for t in templates)
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])]
    assert ports[0] == parse_spec(apply_defaults(SPEC_SCHEMA, drawn)).runtime.port  # the serving port: open
