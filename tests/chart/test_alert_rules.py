"""The chart's alerts evaluated as Prometheus evaluates them: `promtool check rules` on the
PrometheusRule rendered from every values file the chart tests use, and `promtool test rules`
(alert_tests.yaml: input series, the `for` windows, the labels and annotations a receiver gets)
on the one rendered from ci/monitoring-values.yaml; and every dashboard query parsed by promtool
(as a recording rule, its Grafana variables filled in). promtool comes with Debian's
`prometheus`, which scripts/setup.sh installs."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest
import yaml

from tests.chart import helm as h
from tests.observability import dashboard as grafana

HERE = pathlib.Path(__file__).parent
UNIT_TESTS = HERE / "alert_tests.yaml"
MONITORING_VALUES = h.CHART / "ci" / "monitoring-values.yaml"

pytestmark = [
    pytest.mark.skipif(not h.available(), reason="helm-sdkpy (the Helm engine) is not installed"),
    pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) is not installed"),
]


def rule_groups(values: dict) -> list[dict]:
    """The rule groups of the PrometheusRule the chart renders for `values` (rule on)."""
    monitoring = values.setdefault("monitoring", {})
    monitoring["prometheusRule"] = {**monitoring.get("prometheusRule", {}), "enabled": True}
    return h.one(h.render(values), "PrometheusRule")["spec"]["groups"]


def promtool(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def run_unit_tests(groups: list[dict], work: pathlib.Path) -> subprocess.CompletedProcess[str]:
    (work / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(UNIT_TESTS, work / UNIT_TESTS.name)
    return promtool("test", "rules", UNIT_TESTS.name, cwd=work)


@pytest.fixture(scope="module")
def monitoring_groups() -> list[dict]:
    return rule_groups(h.values_of(MONITORING_VALUES))


@pytest.mark.parametrize("values_file", h.CI_VALUES, ids=lambda p: p.name)
def test_rendered_rules_pass_promtool_check(values_file: pathlib.Path, tmp_path: pathlib.Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups(h.values_of(values_file))}))
    checked = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_every_shipped_alert_has_a_unit_test(monitoring_groups: list[dict]) -> None:
    shipped = {rule["alert"] for group in monitoring_groups for rule in group["rules"] if "alert" in rule}
    cases = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    tested = {step["alertname"] for case in cases for step in case.get("alert_rule_test", []) if step.get("exp_alerts")}
    assert shipped == tested, f"alerts without a firing test: {shipped - tested}; tests of no alert: {tested - shipped}"


def test_alerts_fire_and_stay_silent_as_prometheus_evaluates_them(
    monitoring_groups: list[dict], tmp_path: pathlib.Path
) -> None:
    tested = run_unit_tests(monitoring_groups, tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_unit_tests_catch_a_threshold_that_drifts(tmp_path: pathlib.Path) -> None:
    """A latency threshold above the slow model's p95 (0.48 s) silences the breach the unit tests
    expect, and promtool says so: they test the rendered rules, not a copy of them."""
    values = h.values_of(MONITORING_VALUES)
    values["monitoring"]["prometheusRule"]["latencyP95Seconds"] = 0.6
    tested = run_unit_tests(rule_groups(values), tmp_path)
    assert tested.returncode != 0
    assert "InferenceLatencySLOBreach" in tested.stdout + tested.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path: pathlib.Path) -> None:
    dashboard = json.loads((h.CHART / "dashboards" / "rocm-inference.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]
    # The variables' own queries, inside Grafana's query_result(...), list model servers' and vLLM's
    # namespaces and models alike.
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            assert query.startswith("query_result(") and "vllm:" in query and "model_server_" in query
            exprs.append(query.removeprefix("query_result(").removesuffix(")"))
    filled = [grafana.filled(e, namespace=".*", model=".*") for e in exprs]
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(filled)]
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool("check", "rules", "dashboard.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{len(rules)} rules found" in checked.stdout
