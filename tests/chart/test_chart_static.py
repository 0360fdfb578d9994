"""What can be checked of the chart without rendering it: metadata, values and their schema,
CRDs, plain YAML/JSON files, and the metric names the dashboard and alerts query."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Iterator

import jsonschema
import pytest
import yaml
from kopf._cogs.structs import references
from prometheus_client import CollectorRegistry

import inference_operator
from inference_activator.metrics import ActivatorMetrics
from inference_operator import metrics
from inference_operator.engines import vllm as vllm_engine
from tests.chart import helm as h

SCHEMA = json.loads((h.CHART / "values.schema.json").read_text())
DEFAULTS = h.values_of(h.CHART / "values.yaml")
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)

# The model server's metrics (its fixed contract) and the operator's (from its registry).
MODEL_SERVER_METRICS = {
    "model_server_request_duration_seconds",
    "model_server_queue_wait_seconds",
    "model_server_compute_seconds",
    "model_server_batch_size",
    "model_server_requests_total",
    "model_server_inflight_requests",
    "model_server_queue_depth",
    "model_server_gpu_utilization_percent",
    "model_server_gpu_memory_used_bytes",
}
HISTOGRAMS = {
    "model_server_request_duration_seconds",
    "model_server_queue_wait_seconds",
    "model_server_compute_seconds",
    "model_server_batch_size",
}


def operator_metric_names() -> set[str]:
    return registry_series(metrics.REGISTRY)


def registry_series(registry: CollectorRegistry) -> set[str]:
    """The series names a registry's families expose."""
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def vllm_series() -> set[str]:
    """vLLM's series as the operator's own queries name them (engines/vllm.py)."""
    series = {vllm_engine.VLLM_WAITING, vllm_engine.VLLM_RUNNING, vllm_engine.VLLM_KV_CACHE}
    for name in (vllm_engine.VLLM_TTFT, vllm_engine.VLLM_ITL, vllm_engine.VLLM_E2E):
        series |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return series


# vLLM's own series the dashboard reads and the operator does not (the real vLLM pod on the
# real-pods tier answers the dashboard's query of it).
VLLM_DASHBOARD_ONLY = {"vllm:lora_requests_info"}


def known_series() -> set[str]:
    series = set(MODEL_SERVER_METRICS) | operator_metric_names() | vllm_series() | VLLM_DASHBOARD_ONLY | {"up"}
    series |= registry_series(ActivatorMetrics().registry)  # the scale-to-zero activator's
    for name in HISTOGRAMS:
        series |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return series


PROMQL_WORDS = {
    "sum",
    "by",
    "rate",
    "increase",
    "histogram_quantile",
    "max",
    "min",
    "count",
    "avg",
    "and",
    "or",
    "on",
    "without",
    "absent",
    "le",
    "namespace",
    "model",
    "model_name",
    "version",
    "handler",
    "name",
    "code",
    "job",
    "result",
    "pod",
    "gpu",
    "metric",
    "direction",
    "humanizeDuration",
    "humanizePercentage",
    "labels",
    "value",
    "reason",
    "service",
    "outcome",
}


def metric_names(promql: str) -> set[str]:
    """Series names in a PromQL expression (identifiers followed by `{`, `[`, `)` or spaces)."""
    promql = re.sub(r'"[^"]*"', '""', promql)  # label values and strings
    promql = re.sub(r"\{[^}]*\}", "{}", promql)  # label matchers
    words = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", promql))
    return {w for w in words if "_" in w and w not in PROMQL_WORDS and not w.startswith("__")}


def deep_merge(base: dict, override: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def strict_objects(schema: dict, path: tuple = ()) -> Iterator[tuple]:
    """Paths of the schema's objects that reject unknown keys."""
    if schema.get("type") == "object" and schema.get("additionalProperties") is False:
        yield path
    for key, sub in (schema.get("properties") or {}).items():
        yield from strict_objects(sub, (*path, key))


def test_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((h.CHART / "Chart.yaml").read_text())
    project = tomllib.loads((h.ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"] == inference_operator.__version__
    assert chart["name"] == h.CHART.name


def test_schema_is_draft_07_and_accepts_the_defaults() -> None:
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    assert list(VALIDATOR.iter_errors(DEFAULTS)) == []


@pytest.mark.parametrize("values_file", h.CI_VALUES, ids=lambda p: p.stem)
def test_ci_values_files_are_valid(values_file) -> None:
    values = deep_merge(DEFAULTS, h.values_of(values_file))
    assert [e.message for e in VALIDATOR.iter_errors(values)] == []


@pytest.mark.parametrize("path", list(strict_objects(SCHEMA)), ids=lambda p: ".".join(p) or "<root>")
def test_schema_rejects_a_typo_anywhere(path: tuple) -> None:
    values = copy.deepcopy(DEFAULTS)
    target = values
    for key in path:
        target = target.setdefault(key, {})
    target["replicaCuont"] = 1
    errors = list(VALIDATOR.iter_errors(values))
    assert errors and "replicaCuont" in errors[0].message


def test_schema_and_values_describe_the_same_keys() -> None:
    """Every key in values.yaml is in the schema and every schema key has a default there."""

    def walk(schema: dict, values: dict, path: str) -> None:
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is False:
            assert set(values) <= set(props), f"{path}: {set(values) - set(props)} not in the schema"
            missing = set(props) - set(values) - {"global"}
            assert not missing, f"{path}: {missing} have no default in values.yaml"
        for key, value in values.items():
            if isinstance(value, dict) and key in props and props[key].get("type") == "object":
                walk(props[key], value, f"{path}.{key}")

    walk(SCHEMA, DEFAULTS, "values")


@pytest.mark.parametrize(
    "bad",
    [
        {"replicaCount": 2, "ha": {"enabled": False}},
        {"monitoring": {"serviceMonitor": {"enabled": True}}, "service": {"enabled": False}},
        {"image": {"pullPolicy": "Sometimes"}},
        {"image": {"digest": "latest"}},
        {"monitoring": {"prometheusRule": {"latencyFor": "ten minutes"}}},
        {"watch": {"namespaces": ["Not_A_Namespace"]}},
    ],
)
def test_schema_rejects_bad_combinations_and_formats(bad: dict) -> None:
    assert list(VALIDATOR.iter_errors(deep_merge(DEFAULTS, bad)))


def test_every_value_is_documented() -> None:
    """Each key in values.yaml has a comment on the line above, or is a group of keys that do.

    Keys inside free-form Kubernetes structures (resources, securityContext, ...) are
    documented by the comment on the structure.
    """
    lines = (h.CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing keys
    for index, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][\w-]*):(.*)$", line)
        if not match:
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        schema = SCHEMA
        for _, parent in stack:
            schema = (schema.get("properties") or {}).get(parent, {})
        stack.append((indent, key))
        if "properties" not in schema:
            continue  # inside a free-form structure
        following = next((line for line in lines[index + 1 :] if line.strip()), "")
        is_group = not rest.strip() and len(following) - len(following.lstrip()) > indent
        above = lines[index - 1].strip() if index else ""
        if not is_group and not above.startswith("#"):
            undocumented.append(".".join(k for _, k in stack))
    assert undocumented == []


def test_chart_crds_are_the_projects_crds() -> None:
    for path in (h.ROOT / "crds").glob("*.yaml"):
        copy_ = h.CHART / "crds" / path.name
        assert copy_.exists(), f"{path.name} is missing from the chart's crds/"
        assert copy_.read_bytes() == path.read_bytes(), (
            f"charts/rocm-inference-operator/crds/{path.name} differs from crds/{path.name}: "
            f"cp crds/{path.name} charts/rocm-inference-operator/crds/"
        )


def test_chart_ships_the_peering_crds_kopf_looks_for() -> None:
    shipped = {}
    for path in (h.CHART / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        shipped[(spec["group"], spec["names"]["plural"])] = spec["scope"]
        assert crd["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
    for selector, scope in [
        (references.CLUSTER_PEERINGS_K, "Cluster"),
        (references.NAMESPACED_PEERINGS_K, "Namespaced"),
    ]:
        group = selector.group.split("/")[0]
        assert shipped.get((group, selector.plural or selector.any_name)) == scope


def test_plain_files_parse() -> None:
    for path in [
        h.CHART / "Chart.yaml",
        h.CHART / "values.yaml",
        *(h.CHART / "crds").glob("*.yaml"),
        *(h.CHART / "files").rglob("*.yaml"),
        *(h.CHART / "ci").glob("*.yaml"),
    ]:
        list(yaml.safe_load_all(path.read_text()))
    for path in (h.CHART / "dashboards").glob("*.json"):
        json.loads(path.read_text())


def test_dashboard_queries_known_metrics_and_shows_what_operators_need() -> None:
    dashboard = json.loads((h.CHART / "dashboards" / "rocm-inference.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    used = set().union(*(metric_names(e) for e in exprs))
    assert used - known_series() == set()
    # latency p50/p95/p99, rps, queue, batch size, replicas, GPU utilisation
    latency = " ".join(t["expr"] for p in panels if "latency" in p["title"].lower() for t in p["targets"])
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}, " in latency
        assert "model_server_request_duration_seconds_bucket" in latency
    for series in (
        "model_server_requests_total",
        "model_server_queue_depth",
        "model_server_batch_size_bucket",
        "model_server_gpu_utilization_percent",
        "inference_operator_autoscaler_desired_replicas",
    ):
        assert series in used, series
    # the LLM path (time to first token, inter-token latency, queue, KV cache) and rollouts
    assert (
        vllm_series()
        - {f"{vllm_engine.VLLM_E2E}_{s}" for s in ("bucket", "sum", "count")}
        - {f"{h}_{s}" for h in (vllm_engine.VLLM_TTFT, vllm_engine.VLLM_ITL) for s in ("sum", "count")}
        <= used
    )
    assert "inference_operator_rollouts_total" in used
    # scale to zero: requests held, their wait, wakes
    assert {"activator_held_requests", "activator_wait_seconds_bucket", "activator_wakes_total"} <= used


def test_the_dashboard_is_valid_grafana_json() -> None:
    """What Grafana needs to import it as is: a schema version, unique panel ids, every query on
    the datasource variable, and panels that do not overlap."""
    dashboard = json.loads((h.CHART / "dashboards" / "rocm-inference.json").read_text())
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "model"}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    cells: dict[tuple[int, int], int] = {}
    for panel in dashboard["panels"]:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        for x in range(box["x"], box["x"] + box["w"]):
            for y in range(box["y"], box["y"] + box["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps panel {cells[(x, y)]}"
                cells[(x, y)] = panel["id"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"], panel["title"]


def test_alert_rules_query_known_metrics() -> None:
    text = (h.CHART / "templates" / "prometheusrule.yaml").read_text()
    exprs = re.findall(r"expr: \|-\n((?:\s{12}.*\n)+)|expr: (.+)", text)
    flat = [block or line for block, line in exprs]
    assert len(flat) >= 8
    used = set().union(*(metric_names(re.sub(r"\{\{.*?\}\}", "0", e)) for e in flat))
    recorded = set(re.findall(r"record: (\S+?)(?:\{\{.*?\}\}_5m)?\n", text)) | {
        f"inference:model_server_request_duration_seconds:{p}_5m" for p in ("p50", "p95", "p99")
    }
    assert used - known_series() - recorded == set()


def test_operator_metrics_the_chart_relies_on_exist() -> None:
    names = operator_metric_names()
    for needed in (
        "inference_operator_reconciles_total",
        "inference_operator_reconcile_errors_total",
        "inference_operator_reconcile_duration_seconds_bucket",
        "inference_operator_autoscaler_decisions_total",
        "inference_operator_autoscaler_max_replicas",
        "inference_operator_build_info",
    ):
        assert needed in names, needed
