"""Every CEL rule of the shipped CRD, compiled and run as the API server runs it.

A real API server evaluates each `x-kubernetes-validations` rule against every `default:` in the
schema as written (before nested defaults apply) when the CRD is installed, and on objects that
lack optional fields; a rule reading an absent field makes the whole CRD invalid (`no such key`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from inference_operator.models import parse_spec
from inference_operator.validation import apply_defaults, cel_errors, compile_rule, evaluate_rule
from testsupport.crd import ROOT, crd_schema

SCHEMA = crd_schema()
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from _nodes(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], path + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], path + "{}")


RULES = [(path, node, rule) for path, node in _nodes(SCHEMA) for rule in node.get("x-kubernetes-validations", [])]
DEFAULTS = [(path, node) for path, node in _nodes(SCHEMA) if "default" in node]


def _full_spec() -> dict[str, Any]:
    """A spec with every optional field set, valid, defaults filled."""
    spec = {
        "model": {"uri": "pvc://models/resnet", "version": "3", "name": "resnet"},
        "resources": {
            "gpu": {"count": 2, "productName": "AMD_Instinct_MI300X", "family": "AI", "vram": "192G"}
            | {"partition": "spx_nps1", "visibleDevices": "0,1"},
        },
        "runtime": {
            "env": [{"name": "A", "value": "b"}],
            "args": ["--log-level=info"],
            "tracing": {"endpoint": "http://otel-collector.observability:4318/v1/traces"},
        },
        "autoscaling": {
            "maxReplicas": 4,
            "target": 50,
            "prometheusAuth": {"bearerTokenSecret": {"name": "s", "key": "k"}},
        },
        "scheduling": {"nodeSelector": {"pool": "gpu"}, "priorityClassName": "high"},
        "routing": {"inferencePool": True, "endpointPicker": {"port": 9102, "weights": {"queue": 1}}},
        "rollout": {
            "strategy": "canary",
            "canary": {"steps": [10, 50], "analysis": {"maxLatencyMs": 80, "metric": "latencyP99Ms"}},
        },
    }
    return apply_defaults(SCHEMA["properties"]["spec"], spec)


def _full_pd_spec() -> dict[str, Any]:
    """A disaggregated spec with every optional field of spec.disaggregation set, valid, defaults
    filled (apart from _full_spec: a disaggregated service takes no canary, pool or autoscaling)."""
    role_resources = {"gpu": {"count": 2, "productName": "AMD_Instinct_MI300X", "supplementalGroups": [44]}}
    scaling = {"mode": "keda", "minReplicas": 1, "maxReplicas": 4, "target": 200}
    spec = {
        "model": {"uri": "hf://org/llm"},
        "runtime": {"engine": "vllm"},
        "routing": {"router": {}},
        "disaggregation": {
            "prefill": {"replicas": 2, "resources": role_resources, "autoscaling": scaling | {"metric": "ttftP95Ms"}},
            "decode": {"replicas": 1, "resources": role_resources, "autoscaling": scaling | {"metric": "kvCacheUsage"}},
            "kvTransfer": {"connector": "moriio"},
        },
    }
    return apply_defaults(SCHEMA["properties"]["spec"], spec)


def _cr(spec: dict[str, Any], name: str = "resnet") -> dict[str, Any]:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": spec,
    }


def _value_at(obj: Any, path: str) -> Any:
    for part in path.split(".") if path else []:
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def test_there_are_rules_and_defaults_to_check() -> None:
    assert len(RULES) >= 6
    assert len([d for d in DEFAULTS if d[1]["default"] == {}]) >= 5


@pytest.mark.parametrize(("path", "rule"), [(p, r) for p, _, r in RULES], ids=[p or "<root>" for p, _, _ in RULES])
def test_every_rule_compiles(path: str, rule: dict[str, Any]) -> None:
    compile_rule(rule["rule"])
    assert rule.get("message"), f"{path}: a rule needs a message naming the field"


@pytest.mark.parametrize(("path", "node"), DEFAULTS, ids=[p for p, _ in DEFAULTS])
def test_rules_hold_on_every_default_as_written(path: str, node: dict[str, Any]) -> None:
    """What the API server does when the CRD is installed: the default, before nested defaults."""
    assert cel_errors(node, copy.deepcopy(node["default"]), path) == []


def _partials(node: dict[str, Any], full: Any) -> Iterator[Any]:
    """`{}`, each single field of a full value alone, and the full value less each field."""
    yield {}
    if isinstance(full, dict):
        for key in full:
            yield {key: full[key]}
            yield {k: v for k, v in full.items() if k != key}


@pytest.mark.parametrize(("path", "node", "rule"), RULES, ids=[p or "<root>" for p, _, _ in RULES])
def test_rules_are_safe_on_partial_objects(path: str, node: dict[str, Any], rule: dict[str, Any]) -> None:
    full = _value_at(_cr(_full_spec()), path)
    if full is None:
        full = _value_at(_cr(_full_pd_spec()), path)
    assert full is not None, f"the full object has no {path}"
    for partial in _partials(node, full):
        problem = evaluate_rule(rule, partial, node)
        assert problem is None or "cannot be evaluated" not in problem, f"{path} on {partial}: {problem}"


@pytest.mark.parametrize(
    "document", [_cr(_full_spec()), _cr(_full_pd_spec()), *[yaml.safe_load(p.read_text()) for p in EXAMPLES]]
)
def test_rules_hold_on_full_objects(document: dict[str, Any]) -> None:
    assert cel_errors(SCHEMA, apply_defaults(SCHEMA, document)) == []


PD_SCALING = {"maxReplicas": 2, "target": 5}

VIOLATIONS = [
    ({"resources": {"gpu": {"nodes": 2}}}, "spec.resources.gpu.nodes", "needs runtime.engine vllm"),
    (
        {
            "runtime": {"engine": "vllm"},
            "resources": {"gpu": {"nodes": 2}},
            "adapters": [{"name": "a", "uri": "hf://o/a"}],
        },
        "spec.resources.gpu.nodes",
        "does not take a canary rollout or adapters",
    ),
    (
        {"runtime": {"engine": "vllm", "args": ["--master-addr=x"]}, "resources": {"gpu": {"nodes": 2}}},
        "spec.runtime.args",
        "what a multi-node replica sets",
    ),
    ({"adapters": [{"name": "a", "uri": "hf://o/a"}]}, "spec.adapters", "needs runtime.engine vllm"),
    ({"runtime": {"lora": {"maxLoras": 2}}}, "spec.runtime.lora", "engine vllm only"),
    (
        {"model": {"uri": "pvc://m", "huggingFace": {"tokenSecret": "t"}}, "runtime": {"engine": "vllm"}},
        "spec.model.huggingFace",
        "hf:// models and adapters only",
    ),
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2, "target": 1}}, "spec.autoscaling.minReplicas", "<="),
    ({"autoscaling": {"minReplicas": 0, "maxReplicas": 2, "target": 1}}, "spec.autoscaling.scaleToZero", "together"),
    (
        {"autoscaling": {"maxReplicas": 2, "target": 1, "scaleToZero": {"idleSeconds": 60}}},
        "spec.autoscaling.scaleToZero",
        "together",
    ),
    (
        {
            "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "target": 1, "scaleToZero": {}},
            "routing": {"inferencePool": True},
        },
        "spec.autoscaling.scaleToZero",
        "InferencePool",
    ),
    (
        {"autoscaling": {"mode": "keda", "minReplicas": 0, "maxReplicas": 2, "target": 1, "scaleToZero": {}}},
        "spec.autoscaling.mode",
        "needs mode builtin",
    ),
    ({"resources": {"gpu": {"count": 0, "productName": "X"}}}, "spec.resources.gpu", "count is 0"),
    ({"resources": {"gpu": {"count": 2, "visibleDevices": "0"}}}, "spec.resources.gpu.visibleDevices", "exactly"),
    ({"resources": {"gpu": {"count": 2, "visibleDevices": "0,2"}}}, "spec.resources.gpu.visibleDevices", "count-1"),
    ({"resources": {"gpu": {"count": 2, "visibleDevices": "1,1"}}}, "spec.resources.gpu.visibleDevices", "twice"),
    ({"runtime": {"port": 9090, "metricsPort": 9090}}, "spec.runtime", "must differ"),
    (
        {"runtime": {"tracing": {"endpoint": "http://169.254.169.254/latest/meta-data"}}},
        "spec.runtime.tracing.endpoint",
        "must not name the pod or its node",
    ),
    (
        {"runtime": {"tracing": {"endpoint": "http://otel:9090/v1/traces"}}},
        "spec.runtime.tracing.endpoint",
        "a port of the pod's own",
    ),
    (
        {"resources": {"gpu": {"count": 0}}, "runtime": {"executionProviders": ["ROCMExecutionProvider"]}},
        "spec.runtime.executionProviders",
        "CPUExecutionProvider",
    ),
    ({"scheduling": {"nodeSelector": {"bad key!": "x"}}}, "spec.scheduling.nodeSelector", "valid label key"),
    ({"model": {"uri": "pvc://m/x", "sha256": "0" * 64}}, "spec.model.sha256", "applies to http(s)://"),
    ({"runtime": {"args": ["--log-level=info", "--port=1"]}}, "spec.runtime.args", "must not set the flags"),
    ({"runtime": {"args": ["--po", "1"]}}, "spec.runtime.args", "must not set the flags"),
    ({"runtime": {"args": ["--host=127.0.0.1"]}}, "spec.runtime.args", "must not set the flags"),
    ({"runtime": {"args": ["--"]}}, "spec.runtime.args", "must not set the flags"),
    ({"runtime": {"env": [{"name": "ROCR_VISIBLE_DEVICES", "value": "3"}]}}, "spec.runtime.env", "must not set the"),
    ({"runtime": {"env": [{"name": "MODEL_SERVER_HOST", "value": "::1"}]}}, "spec.runtime.env", "must not set the"),
    ({"model": {"uri": "s3://b/m", "huggingFace": {"tokenSecret": "hf"}}}, "spec.model.huggingFace", "hf://"),
    ({"model": {"uri": "pvc://models/m", "cachePvc": "cache"}}, "spec.model.cachePvc", "fetched models"),
    ({"runtime": {"maxModelLen": 4096}}, "spec.runtime.maxModelLen", "engine vllm only"),
    ({"runtime": {"engine": "vllm", "grpcPort": 8081}}, "spec.runtime.grpcPort", "engine modelServer only"),
    ({"runtime": {"grpcPort": 9090}}, "spec.runtime.grpcPort", "must differ from runtime.port and runtime.metricsPort"),
    ({"runtime": {"engine": "vllm", "args": ["--served=x"]}}, "spec.runtime.args", "--served-model-name"),
    ({"runtime": {"engine": "vllm", "args": ["-tp", "8"]}}, "spec.runtime.args", "--flag=value"),
    (
        {"autoscaling": {"maxReplicas": 2, "target": 5, "metric": "ttftP95Ms"}},
        "spec.autoscaling.metric",
        "the engine exports",
    ),
    ({"routing": {"endpointPicker": {"name": "epp"}}}, "spec.routing.endpointPicker", "inferencePool: true"),
    (
        {"routing": {"inferencePool": True, "endpointPicker": {"name": "epp", "weights": {"queue": 1}}}},
        "spec.routing.endpointPicker.weights",
        "not an external one",
    ),
    (
        {"routing": {"inferencePool": True, "endpointPicker": {"port": 9090}}},
        "spec.routing.endpointPicker.port",
        "metrics port",
    ),
    ({"routing": {"router": {}}}, "spec.routing.router", "needs runtime.engine vllm"),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}, "inferencePool": True}},
        "spec.routing.router",
        "one or the other",
    ),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {"policy": "roundRobin"}},
            "rollout": {"strategy": "canary", "canary": {"steps": [10], "analysis": {"maxLatencyMs": 5}}},
        },
        "spec.routing.router",
        "canary's share of traffic",
    ),
    ({"routing": {}, "disaggregation": {}}, "spec.disaggregation", "needs runtime.engine vllm"),
    ({"runtime": {"engine": "vllm"}, "disaggregation": {}}, "spec.disaggregation", "needs routing.router"),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {},
            "rollout": {"strategy": "canary", "canary": {"steps": [10], "analysis": {"maxLatencyMs": 5}}},
        },
        # the router's refusal, which a disaggregated service always has
        "spec.routing.router",
        "canary's share of traffic",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}}, "disaggregation": {}}
        | {"autoscaling": PD_SCALING | {"metric": "ttftP95Ms"}},
        "spec.disaggregation",
        "scales each role on its own",
    ),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {},
            "adapters": [{"name": "a", "uri": "hf://o/a"}],
        },
        "spec.disaggregation",
        "does not take spec.adapters",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}}, "resources": {"gpu": {"nodes": 2}}}
        | {"disaggregation": {}},
        "spec.disaggregation",
        "a role's replica is one pod",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}}}
        | {"disaggregation": {"decode": {"resources": {"gpu": {"nodes": 2}}}}},
        "spec.disaggregation.decode.resources.gpu.nodes",
        "is not disaggregated yet",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}}}
        | {"disaggregation": {"prefill": {"autoscaling": PD_SCALING | {"metric": "itlP95Ms"}}}},
        "spec.disaggregation.prefill.autoscaling.metric",
        "ttftP95Ms, requestsWaiting",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}}}
        | {"disaggregation": {"decode": {"autoscaling": PD_SCALING | {"metric": "ttftP95Ms"}}}},
        "spec.disaggregation.decode.autoscaling.metric",
        "itlP95Ms, kvCacheUsage",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}}}
        | {"disaggregation": {"decode": {"autoscaling": PD_SCALING | {"mode": "builtin", "scaleToZero": {}}}}},
        "spec.disaggregation.decode.autoscaling.scaleToZero",
        "a role does not go to zero alone",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}}}
        | {"disaggregation": {"prefill": {"autoscaling": PD_SCALING | {"mode": "builtin", "minReplicas": 0}}}},
        "spec.disaggregation.prefill.autoscaling.minReplicas",
        "its floor while it serves, at least 1",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}}}
        | {
            "disaggregation": {
                "scaleToZero": {},
                "prefill": {"autoscaling": PD_SCALING | {"mode": "builtin"}},
                "decode": {"autoscaling": PD_SCALING | {"mode": "hpa"}},
            }
        },
        "spec.disaggregation.scaleToZero",
        "needs both roles' autoscaling with mode builtin",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}}}
        | {"disaggregation": {"scaleToZero": {}, "prefill": {"autoscaling": PD_SCALING | {"mode": "builtin"}}}},
        "spec.disaggregation.scaleToZero",
        "needs both roles' autoscaling with mode builtin",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}}}
        | {"disaggregation": {"prefill": {"autoscaling": PD_SCALING | {"minReplicas": 3}}}},
        "spec.disaggregation.prefill.autoscaling.minReplicas",
        "must be <= autoscaling.maxReplicas",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}, "inferencePool": True}, "disaggregation": {}},
        "spec.routing.router",
        "one or the other",
    ),
    (
        {"runtime": {"engine": "vllm", "args": ["--kv-transfer-c={}"]}, "routing": {"router": {}}}
        | {"disaggregation": {}},
        "spec.runtime.args",
        "may not set --kv-transfer-config",
    ),
    ({"model": {"uri": "s3://b/m/", "sha256": "ab" * 32}}, "spec.model.sha256", "applies to http(s)://"),
    ({"rollout": {"strategy": "canary"}}, "spec.rollout.canary", "required with strategy: canary"),
    (
        {"rollout": {"strategy": "canary", "canary": {"steps": [50, 10], "analysis": {"maxLatencyMs": 5}}}},
        "spec.rollout.canary.steps",
        "increasing",
    ),
    (
        {"rollout": {"strategy": "canary", "canary": {"steps": [10, 10], "analysis": {"maxLatencyMs": 5}}}},
        "spec.rollout.canary.steps",
        "increasing",
    ),
    (
        {"rollout": {"strategy": "canary", "canary": {"analysis": {"maxLatencyMs": 5, "metric": "ttftP95Ms"}}}},
        "spec.rollout.canary.analysis.metric",
        "a latency the engine exports",
    ),
]

# runtime.tracing.endpoint: hosts that are the pod itself or its node, in every spelling a
# resolver or URL parser accepts, and collectors that are not.
LOCAL_TRACING_ENDPOINTS = [
    "http://169.254.169.254/latest/meta-data",
    "http://169.254.0.1:4318/v1/traces",
    "http://127.0.0.1:8081/v1/load_lora_adapter",
    "http://127.9.8.7:4318/",
    "http://localhost:4318/v1/traces",
    "https://LocalHost.:4318",
    "http://otel.localhost/v1/traces",
    "http://localhost.localdomain/",
    "http://ip6-localhost:4318/",
    "http://ip6-loopback/",
    "http://0.0.0.0:4318/",
    "http://0.1.2.3/",
    "http://[::1]:4318/v1/traces",
    "http://[0:0:0:0:0:0:0:1]/",
    "http://[0000::0001]/",
    "http://[::]:4318/",
    "http://[::ffff:127.0.0.1]:8081/",
    "http://[::ffff:7f00:1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::127.0.0.1]/",
    "http://[fe80::1]:4318/",
    "http://[FEBF::a]/",
    "http://2130706433/",
    "http://0x7f000001/",
    "http://0x7F.0.0.1/",
    "http://0177.0.0.1/",
    "http://127.1:8081/",
    "http://127.0.1/",
    "http://127.0.0.1./",
    "http://017700000001/",
    "http://2852039166/",
]
COLLECTOR_ENDPOINTS = [
    "http://otel-collector.observability:4318/v1/traces",
    "https://otel-collector.observability.svc.cluster.local/v1/traces",
    "http://10.0.0.5:4318/v1/traces",
    "http://172.16.0.9:4318/",
    "http://126.0.0.1/",
    "http://128.0.0.1/",
    "http://169.253.1.1/",
    "http://[2001:db8::1]:4318/v1/traces",
    "http://[fd00::1]:4318/",
    "http://localhost-collector.observability:4318/",
    "http://collector.local:4318/",
    "http://3com.example:4318/",
]


def _traced(endpoint: str, **runtime: Any) -> dict[str, Any]:
    return {"model": {"uri": "pvc://models/m"}, "runtime": {**runtime, "tracing": {"endpoint": endpoint}}}


@pytest.mark.parametrize("endpoint", LOCAL_TRACING_ENDPOINTS)
def test_the_crd_refuses_a_tracing_endpoint_on_the_pod_or_its_node(endpoint: str) -> None:
    errors = cel_errors(SCHEMA, apply_defaults(SCHEMA, _cr(_traced(endpoint))))
    assert len(errors) == 1 and errors[0].startswith("spec.runtime.tracing.endpoint: "), errors
    assert "must not name the pod or its node" in errors[0]


@pytest.mark.parametrize("endpoint", COLLECTOR_ENDPOINTS)
def test_the_crd_admits_a_collector_elsewhere(endpoint: str) -> None:
    assert cel_errors(SCHEMA, apply_defaults(SCHEMA, _cr(_traced(endpoint)))) == []


@pytest.mark.parametrize(
    ("runtime", "port"),
    [({}, 8080), ({}, 9090), ({"port": 8000}, 8000), ({"metricsPort": 9100}, 9100), ({"grpcPort": 8500}, 8500)],
)
def test_the_crd_refuses_a_tracing_endpoint_on_a_port_of_the_pods_own(runtime: dict, port: int) -> None:
    for host in ("otel-collector.observability", "10.0.0.5", "[2001:db8::1]"):
        spec = _traced(f"http://{host}:{port}/v1/traces", **runtime)
        errors = cel_errors(SCHEMA, apply_defaults(SCHEMA, _cr(spec)))
        assert errors == [
            "spec.runtime.tracing.endpoint: runtime.tracing.endpoint must not be on a port of the pod's own "
            "(runtime.port, runtime.metricsPort, runtime.grpcPort)"
        ], errors
    other = _traced(f"http://otel:{port + 1}/v1/traces", **runtime)
    assert cel_errors(SCHEMA, apply_defaults(SCHEMA, _cr(other))) == []


VLLM_ARGS_ACCEPTED = ["--max-num-seqs=4", "--enforce-eager", "--dtype=bfloat16", "--hf-overrides.rope_scaling=x"]


def test_vllm_engine_arguments_that_set_no_operator_flag_pass() -> None:
    spec = {
        "model": {"uri": "hf://org/llm@main", "huggingFace": {"tokenSecret": "hf"}, "cachePvc": "cache"},
        "runtime": {"engine": "vllm", "maxModelLen": 4096, "args": VLLM_ARGS_ACCEPTED},
        "autoscaling": {"maxReplicas": 2, "target": 500, "metric": "ttftP95Ms"},
        "routing": {"inferencePool": True, "endpointPicker": {"name": "epp"}},
    }
    assert cel_errors(SCHEMA, apply_defaults(SCHEMA, _cr(spec))) == []


def test_a_routed_service_may_scale_to_zero() -> None:
    """The router goes to zero with its workers and the activator holds NAME-router's requests
    (builders/activator.py): the CRD and the model take the pair."""
    spec = {
        "model": {"uri": "hf://org/llm@main"},
        "runtime": {"engine": "vllm"},
        "routing": {"router": {}},
        "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "target": 1, "metric": "ttftP95Ms", "scaleToZero": {}},
    }
    assert cel_errors(SCHEMA, apply_defaults(SCHEMA, _cr(spec))) == []
    assert parse_spec(spec).autoscaling is not None


def test_a_pair_on_the_builtin_loop_may_scale_to_zero() -> None:
    """Both roles on the built-in loop, each on its own metric, and the pair's scaleToZero: the
    CRD and the model take it, and the roles' replicas may be the 0 the loop writes."""
    spec = {
        "model": {"uri": "hf://org/llm@main"},
        "runtime": {"engine": "vllm"},
        "routing": {"router": {}},
        "disaggregation": {
            "scaleToZero": {"idleSeconds": 60},
            "prefill": {"replicas": 0, "autoscaling": PD_SCALING | {"mode": "builtin", "metric": "requestsWaiting"}},
            "decode": {"replicas": 0, "autoscaling": PD_SCALING | {"mode": "builtin", "metric": "kvCacheUsage"}},
        },
    }
    assert cel_errors(SCHEMA, apply_defaults(SCHEMA, _cr(spec))) == []
    parsed = parse_spec(spec).disaggregation
    assert parsed is not None and parsed.scale_to_zero is not None and parsed.prefill.replicas == 0


@pytest.mark.parametrize("args", [["--intra-op-threads=4"], ["--io-binding", "on"], ["--profiling"], ["value"]])
def test_other_server_flags_are_allowed(args: list[str]) -> None:
    spec = {"model": {"uri": "pvc://models/m"}, "runtime": {"args": args, "env": [{"name": "OMP_NUM_THREADS"}]}}
    assert cel_errors(SCHEMA, apply_defaults(SCHEMA, _cr(spec))) == []


@pytest.mark.parametrize(("patch", "field", "message"), VIOLATIONS)
def test_rules_refuse_what_they_should_and_name_the_field(patch: dict, field: str, message: str) -> None:
    spec = {"model": {"uri": "pvc://models/m"}} | patch
    errors = cel_errors(SCHEMA, apply_defaults(SCHEMA, _cr(spec)))
    assert len(errors) == 1, errors
    assert errors[0].startswith(field + ":") and message in errors[0], errors


BAD_NAMES = ["a.b", "1model", "x" * 64, "Resnet", "-a", "a-", "a_b"]
GOOD_NAMES = ["a", "x" * 63, "resnet-50", "r2"]


@pytest.mark.parametrize("name", BAD_NAMES + GOOD_NAMES)
def test_names_a_service_cannot_take_are_refused(name: str) -> None:
    """`1model`, `a.b` or 64 characters are valid object names, but a Service refuses them."""
    errors = cel_errors(SCHEMA, apply_defaults(SCHEMA, _cr({"model": {"uri": "pvc://m/x"}}, name=name)))
    if name in BAD_NAMES:
        assert len(errors) == 1 and errors[0].startswith("metadata.name must be a DNS-1035 label"), errors
    else:
        assert errors == []


def test_every_rule_has_a_violation_case() -> None:
    """Each rule is seen refusing something (so none is vacuous)."""
    refused = set(cel_errors(SCHEMA, _cr({"model": {"uri": "pvc://m"}}, name="1model")))
    for patch, _, _ in VIOLATIONS:
        spec = {"model": {"uri": "pvc://models/m"}, **patch}
        refused |= {e.split(": ", 1)[1] for e in cel_errors(SCHEMA, apply_defaults(SCHEMA, _cr(spec)))}
    assert {r["message"] for _, _, r in RULES} <= refused | {e.split(": ", 1)[-1] for e in refused}
