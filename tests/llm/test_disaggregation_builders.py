"""spec.disaggregation: the prefill and decode workloads in place of NAME's (valid as a current
Kubernetes judges them), what vLLM is told per role and connector, the router in P/D mode over
exactly the two roles, the KV-transfer NetworkPolicy between the two roles of this service alone,
each role's resources, disruption budget and autoscaler, and the example."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes_validate
import pytest
import yaml

from inference_operator.builders import Owner, build_all
from inference_operator.builders.disaggregation import (
    BOOTSTRAP_PORT_ANNOTATION,
    CPU_KV_LEASE_SECONDS,
    MOONCAKE_BOOTSTRAP_PORT,
    MORIIO_HANDSHAKE_PORT,
    MORIIO_NOTIFY_PORT,
    NIXL_SIDE_CHANNEL_PORT,
    UCX_TCP_PORTS,
)
from inference_operator.engines import ENGINES
from inference_operator.engines.base import Engine, ServiceValues
from inference_operator.engines.vllm import Vllm
from inference_operator.models import SpecError, parse_spec
from inference_operator.settings import NetworkPolicySettings
from testsupport.crd import ROOT, apply_defaults, crd_schema, validate_custom_resource

NS, NAME = "ml", "llama"
PREFILL, DECODE, ROUTER = f"{NAME}-prefill", f"{NAME}-decode", f"{NAME}-router"
ROLE = "inference.rocm.dev/role"
K8S_VERSIONS = ("1.33", kubernetes_validate.latest_version())
SPEC_SCHEMA = crd_schema()["properties"]["spec"]


def spec(disaggregation: dict[str, Any] | None = None, gpus: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "model": {"uri": "pvc://models/llama", "name": "llama"},
        "runtime": {"engine": "vllm"},
        "resources": {"gpu": {"count": gpus}},
        "routing": {"router": {}},
        "disaggregation": {} if disaggregation is None else disaggregation,
        **extra,
    }


def owner(raw: dict[str, Any], name: str = NAME, network: bool = False) -> Owner:
    parsed = parse_spec(apply_defaults(SPEC_SCHEMA, copy.deepcopy(raw)))
    return Owner(name=name, namespace=NS, uid="u-1", spec=parsed, network=NetworkPolicySettings(enabled=network))


def objects(raw: dict[str, Any], network: bool = False) -> dict[tuple[str, str], dict[str, Any]]:
    built = build_all(owner(raw, network=network))
    keyed = {(o["kind"], o["metadata"]["name"]): o for o in built}
    assert len(keyed) == len(built)
    return keyed


def vllm(deployment: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")


def kv_config(deployment: dict[str, Any]) -> dict[str, Any]:
    (arg,) = [a for a in vllm(deployment)["args"] if a.startswith("--kv-transfer-config=")]
    config: dict[str, Any] = json.loads(arg.partition("=")[2])
    return config


def env(deployment: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in vllm(deployment)["env"]}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_two_roles_replace_the_services_workload_and_every_object_is_valid_and_owned() -> None:
    built = objects(spec(), network=True)
    assert ("Deployment", NAME) not in built and ("Service", NAME) not in built
    assert {("Deployment", PREFILL), ("Deployment", DECODE), ("Deployment", ROUTER)} <= built.keys()
    assert {("NetworkPolicy", PREFILL), ("NetworkPolicy", DECODE), ("NetworkPolicy", NAME)} <= built.keys()
    for (kind, name), obj in built.items():
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        if name in (PREFILL, DECODE):
            assert obj["metadata"]["labels"][ROLE] == name.rpartition("-")[2], kind
    # Without the setting, no policy of either role.
    assert not {k for k in objects(spec()) if k[0] == "NetworkPolicy"}


def test_removing_disaggregation_leaves_no_role_object_and_brings_back_the_services_workload() -> None:
    plain = spec()
    del plain["disaggregation"]
    names = {name for _, name in objects(plain, network=True)}
    assert PREFILL not in names and DECODE not in names
    assert ("Deployment", NAME) in objects(plain)


def test_each_roles_deployment_selects_its_own_pods_and_the_router_finds_each_role() -> None:
    built = objects(spec())
    prefill, decode = built["Deployment", PREFILL], built["Deployment", DECODE]
    pods = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in ((PREFILL, prefill), (DECODE, decode))}
    router = built["Deployment", ROUTER]
    router_pods = router["spec"]["template"]["metadata"]["labels"]
    assert matches(prefill["spec"]["selector"]["matchLabels"], pods[PREFILL])
    assert not matches(prefill["spec"]["selector"]["matchLabels"], pods[DECODE])
    assert not matches(decode["spec"]["selector"]["matchLabels"], pods[PREFILL])
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--vllm-pd-disaggregation" in args and "--selector" not in args
    assert "--kv-connector=nixl" in args

    def selector(flag: str) -> dict[str, str]:
        start = args.index(flag) + 1
        end = next(i for i in range(start, len(args)) if args[i].startswith("--"))
        return dict(a.split("=", 1) for a in args[start:end])

    assert matches(selector("--prefill-selector"), pods[PREFILL])
    assert not matches(selector("--prefill-selector"), pods[DECODE])
    assert matches(selector("--decode-selector"), pods[DECODE])
    assert not matches(selector("--decode-selector"), pods[PREFILL])
    for flag in ("--prefill-selector", "--decode-selector"):
        assert not matches(selector(flag), router_pods)


def test_nixl_on_cpu_pods_moves_the_cache_through_host_memory_with_the_side_channel_on_the_pod_ip() -> None:
    built = objects(spec())  # no GPU: the default connector is NIXL
    prefill, decode = built["Deployment", PREFILL], built["Deployment", DECODE]
    lease = {"kv_lease_duration": CPU_KV_LEASE_SECONDS}
    for deployment, role in ((prefill, "kv_producer"), (decode, "kv_consumer")):
        assert kv_config(deployment) == {
            "kv_connector": "NixlConnector",
            "kv_role": role,
            "kv_buffer_device": "cpu",
            "kv_connector_extra_config": lease,
        }
    assert CPU_KV_LEASE_SECONDS > 30  # vLLM's own default, too short for CPU step times
    for deployment in (prefill, decode):
        variables = env(deployment)
        assert variables["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert variables["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(NIXL_SIDE_CHANNEL_PORT)
        assert variables["UCX_TCP_PORT_RANGE"] == f"{UCX_TCP_PORTS[0]}-{UCX_TCP_PORTS[1]}"
        assert {"name": "kv-transfer", "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"} in vllm(deployment)[
            "ports"
        ]
    annotations = prefill["spec"]["template"]["metadata"]["annotations"]
    assert annotations[BOOTSTRAP_PORT_ANNOTATION] == str(NIXL_SIDE_CHANNEL_PORT)
    assert BOOTSTRAP_PORT_ANNOTATION not in decode["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.parametrize(("cpu", "threads"), [("1", 1), ("2500m", 1), ("4", 2), ("16", 14)])
def test_nixl_on_cpu_pods_runs_vllms_openmp_threads_unbound_and_sized_by_the_roles_cpu(cpu: str, threads: int) -> None:
    # vLLM's own binding pins a thread to every CPU of the node's affinity mask when the mask has
    # no more CPUs than it reserves beside a connector, under NIXL's always-polling progress thread.
    none = {"count": 0}
    roles = {"prefill": {"resources": {"gpu": none, "cpu": cpu}}, "decode": {"resources": {"gpu": none, "cpu": "8"}}}
    built = objects(spec(roles))
    assert {k: env(built["Deployment", PREFILL])[k] for k in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")} == {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(threads),
    }
    assert env(built["Deployment", DECODE])["OMP_NUM_THREADS"] == "6"  # each role by its own CPU
    # With GPUs vLLM's CPU threads are not the engine's: nothing to size.
    on_gpus = objects(spec({"kvTransfer": {"connector": "nixl"}}, gpus=2))
    for name in (PREFILL, DECODE):
        assert not {"VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS"} & env(on_gpus["Deployment", name]).keys()


def test_gpu_pods_default_to_amds_moriio_and_nixl_on_gpus_keeps_the_cache_on_the_device() -> None:
    built = objects(spec(gpus=2))
    prefill, decode = built["Deployment", PREFILL], built["Deployment", DECODE]
    extra = {"http_port": "8080", "handshake_port": str(MORIIO_HANDSHAKE_PORT), "notify_port": str(MORIIO_NOTIFY_PORT)}
    assert kv_config(prefill) == {
        "kv_connector": "MoRIIOConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": extra,
    }
    assert kv_config(decode)["kv_role"] == "kv_consumer"
    assert env(prefill)["VLLM_HOST_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert "--kv-connector=moriio" in built["Deployment", ROUTER]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert prefill["spec"]["template"]["metadata"]["annotations"][BOOTSTRAP_PORT_ANNOTATION] == str(
        MORIIO_HANDSHAKE_PORT
    )
    nixl = objects(spec({"kvTransfer": {"connector": "nixl"}}, gpus=2))
    assert kv_config(nixl["Deployment", PREFILL]) == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}


def test_moriio_opens_a_notify_port_per_rank_of_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The connector's notify ports are counted by the engine (`ServingEngine.ranks`), the fact its
    tensor parallel size is made of, not by a formula of the connector's own."""

    def notify_ports(built: dict[tuple[str, str], dict[str, Any]]) -> int:
        notify = built["NetworkPolicy", PREFILL]["spec"]["ingress"][0]["ports"][1]
        assert notify["port"] == MORIIO_NOTIFY_PORT
        return int(notify.get("endPort", notify["port"])) - MORIIO_NOTIFY_PORT + 1

    raw = spec({"kvTransfer": {"connector": "moriio"}}, gpus=3)
    built = objects(raw, network=True)
    (tensor_parallel,) = [a for a in vllm(built["Deployment", PREFILL])["args"] if a.startswith("--tensor-parallel")]
    assert tensor_parallel == "--tensor-parallel-size=3" and notify_ports(built) == 3

    class TwoRanksPerGpu(Vllm):
        def ranks(self, service: ServiceValues) -> int:
            return 2 * service.gpus

    monkeypatch.setitem(ENGINES, Engine.VLLM, TwoRanksPerGpu())
    assert notify_ports(objects(raw, network=True)) == 6


def test_mooncake_gets_its_bootstrap_port() -> None:
    built = objects(spec({"kvTransfer": {"connector": "mooncake"}}, gpus=1))
    prefill = built["Deployment", PREFILL]
    assert kv_config(prefill) == {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}
    assert env(prefill)["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == str(MOONCAKE_BOOTSTRAP_PORT)
    assert prefill["spec"]["template"]["metadata"]["annotations"][BOOTSTRAP_PORT_ANNOTATION] == str(
        MOONCAKE_BOOTSTRAP_PORT
    )


@pytest.mark.parametrize(
    ("connector", "gpus", "ports"),
    [
        ("nixl", 0, [{"port": NIXL_SIDE_CHANNEL_PORT}, {"port": UCX_TCP_PORTS[0], "endPort": UCX_TCP_PORTS[1]}]),
        (
            "moriio",
            4,
            [{"port": MORIIO_HANDSHAKE_PORT}, {"port": MORIIO_NOTIFY_PORT, "endPort": MORIIO_NOTIFY_PORT + 3}],
        ),
        ("mooncake", 1, [{"port": MOONCAKE_BOOTSTRAP_PORT}]),
    ],
)
def test_the_kv_ports_are_open_to_the_other_role_of_this_service_alone(
    connector: str, gpus: int, ports: list[dict[str, int]]
) -> None:
    built = objects(spec({"kvTransfer": {"connector": connector}}, gpus=gpus), network=True)
    # The same spec under another name: another service's pods, which the policies must not name.
    stranger = build_all(owner(spec({"kvTransfer": {"connector": connector}}, gpus=gpus), name="other"))
    stranger_pods = [o["spec"]["template"]["metadata"]["labels"] for o in stranger if o["kind"] == "Deployment"]
    pods = {
        role: built["Deployment", f"{NAME}-{role}"]["spec"]["template"]["metadata"]["labels"]
        for role in ("prefill", "decode")
    }
    router_pods = built["Deployment", ROUTER]["spec"]["template"]["metadata"]["labels"]
    stranger_router = next(o for o in stranger if o["kind"] == "Deployment" and o["metadata"]["name"] == "other-router")
    assert not matches(
        built["NetworkPolicy", PREFILL]["spec"]["ingress"][1]["from"][0]["podSelector"]["matchLabels"],
        stranger_router["spec"]["template"]["metadata"]["labels"],
    )
    for role, other in (("prefill", "decode"), ("decode", "prefill")):
        policy = built["NetworkPolicy", f"{NAME}-{role}"]["spec"]
        assert matches(policy["podSelector"]["matchLabels"], pods[role])
        assert not matches(policy["podSelector"]["matchLabels"], pods[other])
        rule, *router_rules = policy["ingress"]
        (peer,) = rule["from"]
        assert set(peer) == {"podSelector"}, "no namespaceSelector: the policy's own namespace alone"
        assert matches(peer["podSelector"]["matchLabels"], pods[other])
        assert not matches(peer["podSelector"]["matchLabels"], pods[role])
        assert not any(matches(peer["podSelector"]["matchLabels"], labels) for labels in stranger_pods)
        assert rule["ports"] == [{"protocol": "TCP", **p} for p in ports]
        assert policy["policyTypes"] == ["Ingress"]
        if role == "prefill":  # the bootstrap port, to this service's router alone
            (router_rule,) = router_rules
            (router_peer,) = router_rule["from"]
            assert set(router_peer) == {"podSelector"}
            assert matches(router_peer["podSelector"]["matchLabels"], router_pods)
            assert not any(matches(router_peer["podSelector"]["matchLabels"], labels) for labels in pods.values())
            assert router_rule["ports"] == [{"protocol": "TCP", **ports[0]}]
        else:
            assert router_rules == []


def test_each_role_gets_its_own_gpus_replicas_tensor_parallelism_and_budget() -> None:
    raw = spec(
        {
            "prefill": {"replicas": 2, "resources": {"gpu": {"count": 2}, "cpu": "8", "memory": "64Gi"}},
            "decode": {"replicas": 1, "resources": {"gpu": {"count": 4}, "cpu": "16", "memory": "128Gi"}},
        },
        gpus=1,
    )
    built = objects(raw)
    for name, gpus, replicas in ((PREFILL, "2", 2), (DECODE, "4", 1)):
        deployment = built["Deployment", name]
        assert deployment["spec"]["replicas"] == replicas
        assert vllm(deployment)["resources"]["limits"]["amd.com/gpu"] == gpus
        assert f"--tensor-parallel-size={gpus}" in vllm(deployment)["args"]
        assert vllm(deployment)["readinessProbe"]["httpGet"]["path"] == "/health"
        assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    pdb = built["PodDisruptionBudget", PREFILL]
    assert matches(
        pdb["spec"]["selector"]["matchLabels"], built["Deployment", PREFILL]["spec"]["template"]["metadata"]["labels"]
    )
    assert not matches(
        pdb["spec"]["selector"]["matchLabels"], built["Deployment", DECODE]["spec"]["template"]["metadata"]["labels"]
    )
    assert ("PodDisruptionBudget", DECODE) not in built  # one replica: a budget would block every drain
    # A role without resources of its own takes spec.resources.
    assert vllm(objects(spec(gpus=1))["Deployment", DECODE])["resources"]["limits"]["amd.com/gpu"] == "1"


def test_dra_roles_each_claim_their_own_devices() -> None:
    raw = spec(
        {"prefill": {"resources": {"gpu": {"count": 2, "allocation": "dra"}}}, "decode": {}},
        gpus=0,
    )
    built = objects(raw)
    template = built["ResourceClaimTemplate", PREFILL]
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    pod = built["Deployment", PREFILL]["spec"]["template"]["spec"]
    assert pod["resourceClaims"][0]["resourceClaimTemplateName"] == PREFILL
    assert ("ResourceClaimTemplate", DECODE) not in built and ("ResourceClaimTemplate", NAME) not in built


@pytest.mark.parametrize("mode", ["hpa", "keda"])
def test_each_role_scales_on_its_own_pods_metric(mode: str) -> None:
    scaling = {"mode": mode, "minReplicas": 1, "maxReplicas": 4}
    raw = spec(
        {
            "prefill": {"autoscaling": scaling | {"metric": "ttftP95Ms", "target": 500}},
            "decode": {"autoscaling": scaling | {"metric": "kvCacheUsage", "target": 70}},
        }
    )
    built = objects(raw)
    kind = "HorizontalPodAutoscaler" if mode == "hpa" else "ScaledObject"
    for name, series in ((PREFILL, "vllm:time_to_first_token_seconds"), (DECODE, "vllm:kv_cache_usage_perc")):
        scaler = built[kind, name]
        assert scaler["spec"]["scaleTargetRef"]["name"] == name
        assert "replicas" not in built["Deployment", name]["spec"], "the scaler owns the count"
        query = (
            scaler["metadata"]["annotations"]["inference.rocm.dev/promql"]
            if mode == "hpa"
            else scaler["spec"]["triggers"][0]["metadata"]["query"]
        )
        assert series in query
        assert f'pod=~"{name}-[a-z0-9]+-[a-z0-9]+"' in query, "the role's pods alone"
        if mode == "hpa":
            kubernetes_validate.validate(scaler, K8S_VERSIONS[-1], strict=True)
    assert (kind, NAME) not in built


def test_a_connector_port_that_is_one_of_the_pods_own_is_a_spec_error() -> None:
    raw = spec(runtime={"engine": "vllm", "port": NIXL_SIDE_CHANNEL_PORT})
    with pytest.raises(SpecError, match="port 5600 on the prefill pods"):
        build_all(owner(raw))


def test_a_name_too_long_for_the_roles_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="shorten metadata.name"):
        build_all(owner(spec(), name="x" * 60))


def test_the_example_is_valid_and_renders_two_prefill_pods_of_2_gpus_and_one_decode_pod_of_4_on_moriio() -> None:
    path = ROOT / "examples" / "llm-pd-mi300x.yaml"
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert validate_custom_resource(doc) == []
    name = doc["metadata"]["name"]
    built_owner = Owner(name, doc["metadata"]["namespace"], "u-1", parse_spec(apply_defaults(SPEC_SCHEMA, doc["spec"])))
    built = {(o["kind"], o["metadata"]["name"]): o for o in build_all(built_owner)}
    for obj in built.values():
        if obj["kind"] != "ScaledObject":  # KEDA's kind: not in Kubernetes' schemas
            kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)
    prefill, decode = built["Deployment", f"{name}-prefill"], built["Deployment", f"{name}-decode"]
    assert vllm(prefill)["resources"]["limits"]["amd.com/gpu"] == "2"
    assert vllm(decode)["resources"]["limits"]["amd.com/gpu"] == "4"
    assert built["ScaledObject", f"{name}-prefill"]["spec"]["minReplicaCount"] == 2
    assert kv_config(prefill)["kv_connector"] == "MoRIIOConnector"
    assert 2 * int(vllm(prefill)["resources"]["limits"]["amd.com/gpu"]) + 4 == 8  # one 8-GPU node


def test_the_authors_args_keep_what_the_operator_sets_and_its_connector_env_wins() -> None:
    raw = spec(
        runtime={"engine": "vllm", "args": ["--enable-prefix-caching"], "env": [{"name": "UCX_TLS", "value": "tcp"}]}
    )
    prefill = objects(raw)["Deployment", PREFILL]
    args = vllm(prefill)["args"]
    assert args.index("--enable-prefix-caching") < args.index(next(a for a in args if a.startswith("--kv-transfer")))
    assert env(prefill)["UCX_TLS"] == "tcp"
    with pytest.raises(SpecError, match="may not set --kv-transfer-config"):
        owner(spec(runtime={"engine": "vllm", "args": ["--kv-transfer-config={}"]}))
