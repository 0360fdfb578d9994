"""The CRD is generated from the pydantic models: fresh on disk, a valid CRD, equal defaults, documented."""

from __future__ import annotations

import copy
import pathlib
import re

import kubernetes_validate
import pytest

from inference_operator import crd as crdgen
from inference_operator.models import NAME_MESSAGE, SpecError, check_name, parse_spec
from tests.crd.test_crd_cel import COLLECTOR_ENDPOINTS, LOCAL_TRACING_ENDPOINTS
from testsupport.crd import ROOT, apply_defaults, crd, crd_schema, schema_errors

K8S_VERSION = "1.33"

SPEC_SCHEMA = crd_schema()["properties"]["spec"]


def test_generated_crd_files_are_fresh() -> None:
    """crds/ and the chart's copy are exactly what the models generate (regenerate, compare)."""
    stale = crdgen.stale_files(ROOT)
    assert stale == [], f"stale: {[str(p.relative_to(ROOT)) for p in stale]}; run python -m inference_operator.crd"


def test_check_mode_names_a_stale_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crdgen.main(["--root", str(tmp_path)]) == 0
    assert crdgen.main(["--check", "--root", str(tmp_path)]) == 0
    target = tmp_path / crdgen.OUTPUTS[1]
    target.write_text(target.read_text().replace("maximum: 16", "maximum: 17"))
    assert crdgen.main(["--check", "--root", str(tmp_path)]) == 1
    assert str(target) in capsys.readouterr().err


def test_crd_is_a_valid_custom_resource_definition() -> None:
    kubernetes_validate.validate(crd(), K8S_VERSION, strict=True)


def test_every_spec_field_has_a_constraint_or_default_from_the_model() -> None:
    """The generator kept what pydantic knows: every leaf is typed, and the leaves with a
    default in the model carry the same default in the CRD."""
    leaves = _leaves(SPEC_SCHEMA, "spec")
    assert len(leaves) > 40  # the walk reached the leaves, it did not stop at the top
    untyped = [path for path, node in leaves if "type" not in node and "x-kubernetes-int-or-string" not in node]
    assert untyped == []
    defaults = parse_spec(WITH_AUTOSCALING).model_dump(by_alias=True, mode="json")
    checked = 0
    for path, node in leaves:
        value = defaults
        parts = path.split(".")[1:]
        for part in parts[:-1]:
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            continue  # an optional object left out: its fields' defaults apply once it is given
        value = value.get(parts[-1])
        if "default" in node:
            assert node["default"] == value, path
            checked += 1
    assert checked > 30


def _leaves(node: dict, path: str) -> list[tuple[str, dict]]:
    props = node.get("properties")
    if not props:
        return [(path, node)]
    return [leaf for name, sub in props.items() for leaf in _leaves(sub, f"{path}.{name}")]


def _guide_spec_fields() -> set[str]:
    """Field paths named in the spec table of docs/inferenceservice.md: `a.b` / `c` means a.b and a.c."""
    text = (ROOT / "docs" / "inferenceservice.md").read_text()
    table = text[text.index("| field | default | meaning |") :].split("\n\n", 1)[0]
    fields: set[str] = set()
    for row in table.splitlines()[2:]:
        names = re.findall(r"`([A-Za-z0-9.*]+)`", row.split("|")[1])
        parent = names[0].rsplit(".", 1)[0] if "." in names[0] else ""
        fields |= {name if "." in name or not parent else f"{parent}.{name}" for name in names}
    return fields


def test_the_guides_spec_table_matches_the_schema() -> None:
    """Every row names real fields, and every field is in a row (itself, a parent or `x.*`).
    (The generated docs/reference.md has every field too: tests/test_docs.py.)"""
    documented = _guide_spec_fields()
    paths = {path.removeprefix("spec.") for path, _ in _leaves(SPEC_SCHEMA, "spec")}
    prefixes = {p.rsplit(".", i)[0] for p in paths for i in range(p.count(".") + 1)}
    unknown = {f for f in documented if f.removesuffix(".*") not in prefixes}
    assert unknown == set(), f"docs/inferenceservice.md names fields the CRD does not have: {sorted(unknown)}"
    covered = {
        p for p in paths if any(p == f or p.startswith(f.removesuffix("*").rstrip(".") + ".") for f in documented)
    }
    assert paths - covered == set(), (
        f"spec fields missing from docs/inferenceservice.md's table: {sorted(paths - covered)}"
    )


MINIMAL = {"model": {"uri": "pvc://models/m"}}
WITH_AUTOSCALING = {"model": {"uri": "s3://b/m"}, "autoscaling": {"maxReplicas": 4, "target": 50}}


@pytest.mark.parametrize("spec", [MINIMAL, WITH_AUTOSCALING], ids=["minimal", "autoscaling"])
def test_defaults_are_equal(spec: dict) -> None:
    from_crd = apply_defaults(SPEC_SCHEMA, copy.deepcopy(spec))
    from_model = parse_spec(spec).model_dump(by_alias=True, mode="json", exclude_none=True)
    assert from_crd == from_model


def test_crd_has_subresources_and_columns() -> None:
    version = crd()["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == ["READY", "REASON", "REPLICAS", "ROLLOUT", "GPUS", "LATENCY", "METRIC", "VALUE", "URL", "AGE"]
    names = crd()["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("InferenceService", "inferenceservices", ["ris"])


def test_every_printer_column_points_at_a_schema_field() -> None:
    version = crd()["spec"]["versions"][0]
    schema = crd_schema()
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"].split("[")[0].strip(".").split(".")
        if path[0] == "metadata":
            continue
        node = schema
        for part in path:
            assert part in node.get("properties", {}), f"{column['name']}: {column['jsonPath']}"
            node = node["properties"][part]


CEL_CASES = [
    ({"resources": {"gpu": {"nodes": 2}}}, "resources.gpu.nodes above 1 needs runtime.engine vllm"),
    (
        {
            "runtime": {"engine": "vllm"},
            "resources": {"gpu": {"nodes": 2}},
            "adapters": [{"name": "a", "uri": "hf://o/a"}],
        },
        "does not take a canary rollout or adapters yet",
    ),
    (
        {"runtime": {"engine": "vllm", "args": ["--nnodes=3"]}, "resources": {"gpu": {"nodes": 2}}},
        "runtime.args may not set what a multi-node replica sets",
    ),
    ({"adapters": [{"name": "a", "uri": "hf://o/a"}]}, "spec.adapters needs runtime.engine vllm"),
    ({"runtime": {"lora": {"maxLoras": 2}}}, "runtime.lora applies to engine vllm only"),
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2, "target": 1}}, "minReplicas"),
    ({"autoscaling": {"minReplicas": 0, "maxReplicas": 2, "target": 1}}, "autoscaling.scaleToZero go together"),
    (
        {
            "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "target": 1, "scaleToZero": {}},
            "routing": {"inferencePool": True},
        },
        "an InferencePool's gateway sends them",
    ),
    (
        {"autoscaling": {"mode": "hpa", "minReplicas": 0, "maxReplicas": 2, "target": 1, "scaleToZero": {}}},
        "autoscaling.scaleToZero needs mode builtin",
    ),
    ({"rollout": {"strategy": "canary"}}, "rollout.canary is required"),
    ({"rollout": {"strategy": "canary", "canary": {"steps": [20, 5], "analysis": {"maxLatencyMs": 5}}}}, "increasing"),
    (
        {
            "runtime": {"engine": "vllm"},
            "rollout": {"strategy": "canary", "canary": {"analysis": {"maxLatencyMs": 5, "metric": "latencyP95Ms"}}},
        },
        "rollout.canary.analysis.metric must be a latency the engine exports",
    ),
    ({"resources": {"gpu": {"count": 0, "productName": "X"}}}, "count is 0"),
    ({"resources": {"gpu": {"count": 2, "visibleDevices": "0"}}}, "visibleDevices"),
    ({"runtime": {"port": 9090, "metricsPort": 9090}}, "must differ"),
    (
        {"resources": {"gpu": {"count": 0}}, "runtime": {"executionProviders": ["ROCMExecutionProvider"]}},
        "CPUExecutionProvider",
    ),
    ({"scheduling": {"nodeSelector": {"bad key!": "x"}}}, "valid label key"),
    ({"runtime": {"args": ["--metrics-p=1"]}}, "runtime.args must not set the flags the operator sets"),
    ({"runtime": {"env": [{"name": "HIP_VISIBLE_DEVICES"}]}}, "runtime.env must not set the variables"),
    ({"model": {"uri": "s3://b/m/", "sha256": "ab" * 32}}, "model.sha256 applies to http(s)"),
    ({"model": {"uri": "s3://b/m", "huggingFace": {"tokenSecret": "hf"}}}, "huggingFace applies to hf://"),
    ({"model": {"uri": "pvc://models/m", "cachePvc": "cache"}}, "cachePvc applies to fetched models"),
    ({"runtime": {"maxModelLen": 4096}}, "maxModelLen applies to engine vllm only"),
    ({"runtime": {"engine": "vllm", "grpcPort": 8081}}, "grpcPort applies to engine modelServer only"),
    ({"runtime": {"grpcPort": 9090}}, "runtime.grpcPort must differ from runtime.port and runtime.metricsPort"),
    ({"runtime": {"engine": "vllm", "args": ["--served=x"]}}, "runtime.args for engine vllm"),
    ({"runtime": {"engine": "vllm", "args": ["-tp", "2"]}}, "runtime.args for engine vllm"),
    (
        {"runtime": {"engine": "vllm"}, "autoscaling": {"maxReplicas": 2, "target": 5, "metric": "latencyP95Ms"}},
        "must be one the engine exports",
    ),
    ({"autoscaling": {"maxReplicas": 2, "target": 5, "metric": "ttftP95Ms"}}, "must be one the engine exports"),
    ({"routing": {"endpointPicker": {"name": "epp"}}}, "endpointPicker needs routing.inferencePool"),
    ({"routing": {"router": {}}}, "routing.router needs runtime.engine vllm"),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}, "inferencePool": True}},
        "routing.router and routing.inferencePool each choose the replica",
    ),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "rollout": {"strategy": "canary", "canary": {"steps": [10], "analysis": {"maxLatencyMs": 5}}},
        },
        "routing.router does not take a canary rollout yet",
    ),
    ({"routing": {}, "disaggregation": {}}, "spec.disaggregation needs runtime.engine vllm"),
    ({"runtime": {"engine": "vllm"}, "disaggregation": {}}, "spec.disaggregation needs routing.router"),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {},
            "resources": {"gpu": {"nodes": 2}},
        },
        "spec.disaggregation does not take resources.gpu.nodes above 1",
    ),
    (
        {"runtime": {"engine": "vllm"}, "routing": {"router": {}}, "disaggregation": {}}
        | {"autoscaling": {"maxReplicas": 2, "target": 1, "metric": "ttftP95Ms"}},
        "spec.disaggregation scales each role on its own",
    ),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {},
            "adapters": [{"name": "a", "uri": "hf://o/a"}],
        },
        "spec.disaggregation does not take spec.adapters yet",
    ),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {"prefill": {"resources": {"gpu": {"nodes": 2}}}},
        },
        "a role's replica runs on one node",
    ),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {
                "decode": {"autoscaling": {"maxReplicas": 2, "target": 1, "mode": "builtin", "scaleToZero": {}}}
            },
        },
        "a role does not go to zero alone",
    ),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {"prefill": {"autoscaling": {"maxReplicas": 2, "target": 1, "minReplicas": 0}}},
        },
        "its floor while it serves, at least 1",
    ),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {
                "scaleToZero": {},
                "prefill": {"autoscaling": {"maxReplicas": 2, "target": 1, "mode": "builtin"}},
            },
        },
        "needs both roles' autoscaling with mode builtin",
    ),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {"prefill": {"autoscaling": {"maxReplicas": 2, "target": 1, "metric": "itlP95Ms"}}},
        },
        "disaggregation.prefill.autoscaling.metric must be one of ttftP95Ms, requestsWaiting",
    ),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {"decode": {"autoscaling": {"maxReplicas": 2, "target": 1, "metric": "ttftP95Ms"}}},
        },
        "disaggregation.decode.autoscaling.metric must be one of itlP95Ms, kvCacheUsage",
    ),
    (
        {
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {"decode": {"autoscaling": {"minReplicas": 3, "maxReplicas": 2, "target": 1}}},
        },
        "autoscaling.minReplicas must be <= autoscaling.maxReplicas",
    ),
    (
        {"runtime": {"engine": "vllm", "args": ["--kv-transfer-config.kv_role=kv_both"]}}
        | {"routing": {"router": {}}, "disaggregation": {}},
        "runtime.args may not set --kv-transfer-config with spec.disaggregation",
    ),
    (
        {"routing": {"inferencePool": True, "endpointPicker": {"name": "epp", "weights": {"queue": 1}}}},
        "weights configure the picker the operator deploys",
    ),
    ({"routing": {"inferencePool": True, "endpointPicker": {"port": 9090}}}, "the deployed picker's metrics port"),
    (
        {"runtime": {"tracing": {"endpoint": "http://127.0.0.1:8081/v1/load_lora_adapter"}}},
        "runtime.tracing.endpoint must not name the pod or its node",
    ),
    (
        {"runtime": {"grpcPort": 8500, "tracing": {"endpoint": "http://otel:8500/v1/traces"}}},
        "runtime.tracing.endpoint must not be on a port of the pod's own",
    ),
]


@pytest.mark.parametrize(("patch", "message"), CEL_CASES)
def test_model_enforces_what_cel_rules_say(patch: dict, message: str) -> None:
    """Every cross-field CEL rule in the CRD has the same rule in the model, same message."""
    rules = [r["message"] for r in _cel_rules(crd_schema())]
    assert any(message in r for r in rules), f"no CEL rule mentions {message!r}"
    with pytest.raises(SpecError) as err:
        parse_spec({**MINIMAL, **patch})
    assert message in str(err.value)


def _cel_rules(node: dict) -> list[dict]:
    rules = list(node.get("x-kubernetes-validations", []))
    for child in (node.get("properties") or {}).values():
        rules += _cel_rules(child)
    if isinstance(node.get("items"), dict):
        rules += _cel_rules(node["items"])
    return rules


def test_every_cel_rule_has_a_case() -> None:
    messages = [r["message"] for r in _cel_rules(crd_schema()["properties"]["spec"])]
    covered = [m for m in messages if any(case_msg in m for _, case_msg in CEL_CASES)]
    assert covered == messages


@pytest.mark.parametrize(("name", "valid"), [("1model", False), ("a.b", False), ("x" * 64, False), ("r-2", True)])
def test_model_enforces_the_name_rule(name: str, valid: bool) -> None:
    """The CRD's root rule on metadata.name, in Python (render, objects created before the rule)."""
    root_rules = [r["message"] for r in crd_schema()["x-kubernetes-validations"]]
    assert root_rules == [NAME_MESSAGE]
    if valid:
        check_name(name)
        return
    with pytest.raises(SpecError) as err:
        check_name(name)
    assert err.value.field == "metadata.name" and "DNS-1035 label" in err.value.message


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"model": {"uri": "ftp://x"}}, "spec.model.uri"),
        ({"model": {"uri": "pvc://models/../../etc"}}, "spec.model.uri"),
        ({"model": {"uri": "pvc://m", "name": "-x"}}, "spec.model.name"),
        ({"model": {"uri": "pvc://m", "name": "a=b"}}, "spec.model.name"),
        ({"model": {"uri": "pvc://m", "version": "--host=0.0.0.0"}}, "spec.model.version"),
        ({"model": {"uri": "pvc://m", "version": "../1"}}, "spec.model.version"),
        ({"model": {"uri": "pvc://Not_A_Claim/m"}}, "spec.model.uri"),
        (
            {"model": {"uri": "pvc://m"}, "scheduling": {"nodeSelector": {"pool": "no spaces"}}},
            "spec.scheduling.nodeSelector.pool",
        ),
        ({"model": {"uri": "pvc://m", "format": "tensorflow"}}, "spec.model.format"),
        ({"model": {"uri": "pvc://m"}, "resources": {"gpu": {"count": 17}}}, "spec.resources.gpu.count"),
        ({"model": {"uri": "pvc://m"}, "resources": {"memory": "lots"}}, "spec.resources.memory"),
        (
            {"model": {"uri": "pvc://m"}, "runtime": {"batching": {"maxBatchSize": 0}}},
            "spec.runtime.batching.maxBatchSize",
        ),
        ({"model": {"uri": "pvc://m"}, "autoscaling": {"maxReplicas": 2, "target": 0}}, "spec.autoscaling.target"),
        (
            {"model": {"uri": "pvc://m"}, "autoscaling": {"maxReplicas": 2, "target": 5, "metric": "cpu"}},
            "spec.autoscaling.metric",
        ),
    ],
)
def test_schema_and_model_reject_the_same_field(spec: dict, field: str) -> None:
    errors = schema_errors(
        {
            "apiVersion": "inference.rocm.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "x"},
            "spec": spec,
        }
    )
    assert errors and errors[0].startswith(field.removeprefix("") + ":") or any(e.startswith(field) for e in errors), (
        errors
    )
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert err.value.field == field


def test_unknown_fields_are_named() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"model": {"uri": "pvc://m"}, "resources": {"gpus": 2}})
    assert err.value.field == "spec.resources.gpus"
    assert "not permitted" in err.value.message


def test_quantities_accept_numbers() -> None:
    spec = parse_spec({"model": {"uri": "pvc://m"}, "resources": {"cpu": 8, "memory": "64Gi"}})
    assert spec.resources.cpu == "8"


def _schema_nodes(node: dict, path: str) -> list[tuple[str, dict]]:
    found = [(path, node)]
    for name, child in (node.get("properties") or {}).items():
        found += _schema_nodes(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            found += _schema_nodes(node[key], f"{path}[{key}]")
    return found


def test_schema_is_structural() -> None:
    """What the API server demands of a CRD schema, checked before a field reaches a cluster:
    every node typed, objects either with declared fields or a value schema, no free `anyOf`."""
    for path, node in _schema_nodes(crd_schema(), "<root>"):
        if path == "<root>.metadata":
            assert node == {"type": "object"}, path
            continue
        assert "type" in node or node.get("x-kubernetes-int-or-string") is True, f"{path}: no type"
        assert not ("properties" in node and "additionalProperties" in node), f"{path}: properties and a value schema"
        assert not isinstance(node.get("additionalProperties"), bool), f"{path}: additionalProperties must be a schema"
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, f"{path}: anyOf outside int-or-string"
        if node.get("type") == "array":
            assert isinstance(node.get("items"), dict), f"{path}: an array needs items"


@pytest.mark.parametrize("endpoint", LOCAL_TRACING_ENDPOINTS)
def test_the_model_refuses_a_tracing_endpoint_on_the_pod_or_its_node(endpoint: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({**MINIMAL, "runtime": {"tracing": {"endpoint": endpoint}}})
    assert "runtime.tracing.endpoint must not name the pod or its node" in str(err.value)


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://%6cocalhost/",  # percent-encoded: a URL parser decodes the host
        "http://\u24dbocalhost/",  # a circled l: IDNA folds it into localhost
        "http://\uff11\uff12\uff17.0.0.1/",  # full-width digits: 127.0.0.1 after IDNA
        "http://[fe80::1%25eth0]/",  # an IPv6 zone
        "http://otel_collector/",
        "http://user@otel/",
        "http://otel/?q=1",
    ],
)
def test_a_tracing_endpoint_host_is_plain_ascii(endpoint: str) -> None:
    spec = {**MINIMAL, "runtime": {"tracing": {"endpoint": endpoint}}}
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert err.value.field == "spec.runtime.tracing.endpoint"
    obj = {"apiVersion": "inference.rocm.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": "m"}}
    assert [e for e in schema_errors({**obj, "spec": spec}) if e.startswith("spec.runtime.tracing.endpoint: ")]


@pytest.mark.parametrize("endpoint", COLLECTOR_ENDPOINTS)
def test_the_model_admits_a_collector_elsewhere(endpoint: str) -> None:
    assert parse_spec({**MINIMAL, "runtime": {"tracing": {"endpoint": endpoint}}}).runtime.tracing is not None
