"""`helm lint` and `helm install` of the chart (Helm v4 engine) into the emulated cluster.

Every object the install creates goes through kubernetes-validate (built-in kinds) or the
schema of the CRD shipped beside it (kopf peerings); the Prometheus Operator kinds, whose
schemas are not available offline, are checked for the fields Prometheus needs.
"""

from __future__ import annotations

import copy
import pathlib
import textwrap

import jsonschema
import kubernetes_validate
import pytest
import yaml

from inference_operator.builders.endpoint_picker import CLUSTER_ROLE as PICKER_CLUSTER_ROLE
from inference_operator.builders.router import CLUSTER_ROLE as ROUTER_CLUSTER_ROLE
from inference_operator.models import parse_spec
from inference_operator.settings import DEFAULT_ALLOWED_URLS, Images
from tests.chart import helm as h
from testsupport.cluster import Cluster
from testsupport.crd import schema_errors


def operator_cluster_roles(objects: list[dict]) -> list[dict]:
    roles = h.by_kind(objects, "ClusterRole")
    return [
        r
        for r in roles
        if r["metadata"]["name"] not in (PICKER_CLUSTER_ROLE, ROUTER_CLUSTER_ROLE) and not h.is_activator(r)
    ]


KUBERNETES_VERSIONS = ("1.33", kubernetes_validate.latest_version())
BUILTIN_GROUPS = {
    "v1",
    "apps/v1",
    "policy/v1",
    "rbac.authorization.k8s.io/v1",
    "apiextensions.k8s.io/v1",
    "admissionregistration.k8s.io/v1",
}


def _crd_schema(kind: str) -> dict:
    for path in (h.CHART / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    raise LookupError(kind)


def validate(obj: dict) -> None:
    if obj["apiVersion"] in BUILTIN_GROUPS:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    elif obj["apiVersion"] == "kopf.dev/v1":
        jsonschema.Draft4Validator(_crd_schema(obj["kind"])).validate(obj)
    elif obj["apiVersion"] == "monitoring.coreos.com/v1":
        assert obj["spec"], obj
    else:
        raise AssertionError(f"unexpected object {obj['apiVersion']} {obj['kind']}")


def test_helm_lint_passes(helm) -> None:
    result = h.lint()
    assert result["TotalChartsLinted"] == 1
    assert not result["Errors"], result
    # INFO messages (e.g. "icon is recommended") are fine; nothing at WARNING (2) or ERROR (3).
    assert all(m["Severity"] < 2 for m in result["Messages"]), result


def test_helm_lint_catches_a_broken_template(helm, tmp_path: pathlib.Path) -> None:
    """The lint above is meaningful: the same engine flags a bad template and a typo'd value."""
    import shutil

    broken = tmp_path / "chart"
    shutil.copytree(h.CHART, broken)
    (broken / "templates" / "broken.yaml").write_text("{{ .Values.nope.missing }}\n")
    (broken / "values.yaml").write_text((broken / "values.yaml").read_text() + "replicaCuont: 3\n")
    result = h.lint(broken)
    paths = {m["Path"] for m in result["Messages"] if m["Severity"] == 3}
    assert {"templates/", "values.yaml"} <= paths, result


@pytest.mark.slow
@pytest.mark.parametrize("values_file", h.CI_VALUES, ids=lambda p: p.stem)
def test_install_renders_valid_objects(chart_cluster: Cluster, values_file: pathlib.Path) -> None:
    release = h.install(chart_cluster, h.values_of(values_file))
    assert release["info"]["status"] == "deployed", release["info"]
    objects = h.installed_objects(chart_cluster)
    kinds = {o["kind"] for o in objects}
    assert {"CustomResourceDefinition", "ServiceAccount", "Deployment"} <= kinds
    for obj in objects:
        validate(obj)


def test_default_install(chart_cluster: Cluster) -> None:
    release = h.install(chart_cluster, None)
    objects = h.installed_objects(chart_cluster)

    crds = {o["metadata"]["name"] for o in h.by_kind(objects, "CustomResourceDefinition")}
    assert crds == {"inferenceservices.inference.rocm.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}

    deployment = h.one(objects, "Deployment")
    assert deployment["metadata"]["namespace"] == h.RELEASE_NAMESPACE
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"ghcr.io/rocm-inference/operator:{release['chart']['metadata']['appVersion']}"
    args = container["args"]
    assert args[0] == "run" and "--all-namespaces" in args
    assert "--peering=rio-rocm-inference-operator" in args
    assert "--liveness=http://0.0.0.0:8080/healthz" in args
    assert "--metrics-port=8000" in args
    env = {e["name"]: e for e in container["env"]}
    assert env["INFERENCE_OPERATOR_PEERING_PRIORITY"]["value"] == "random"
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # Non-root, read-only root filesystem, no privileges; probes on kopf's liveness endpoint.
    assert pod["securityContext"]["runAsNonRoot"] is True
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert ports == {"liveness": 8080, "metrics": 8000}

    sa = h.one(objects, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    binding = h.one(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": h.RELEASE_NAMESPACE}
    ]
    assert (
        binding["roleRef"]["name"] == h.one(objects, "ClusterRole", "rio-rocm-inference-operator")["metadata"]["name"]
    )
    assert not h.by_kind(objects, "Role")
    # The endpoint pickers' ClusterRole: read-only, bound by nothing the chart makes, and the
    # image the operator deploys them with.
    picker = h.one(objects, "ClusterRole", PICKER_CLUSTER_ROLE)
    assert picker["rules"] == yaml.safe_load((h.CHART / "files" / "rbac" / "endpoint-picker.yaml").read_text())
    assert {v for rule in picker["rules"] for v in rule["verbs"]} == {"get", "list", "watch"}
    assert PICKER_CLUSTER_ROLE not in {b["roleRef"]["name"] for b in h.by_kind(objects, "ClusterRoleBinding")}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["INFERENCE_OPERATOR_ENDPOINT_PICKER_IMAGE"] == Images().endpoint_picker
    # The routers' ClusterRole: pods read, nothing else, bound by nothing the chart makes.
    router = h.one(objects, "ClusterRole", ROUTER_CLUSTER_ROLE)
    assert router["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert ROUTER_CLUSTER_ROLE not in {b["roleRef"]["name"] for b in h.by_kind(objects, "ClusterRoleBinding")}
    assert env["INFERENCE_OPERATOR_ROUTER_IMAGE"] == Images().router

    peering = h.one(objects, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "rio-rocm-inference-operator"
    assert h.one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    dashboard = h.one(objects, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "model_server_request_duration_seconds_bucket" in dashboard["data"]["rocm-inference.json"]
    service = h.one(objects, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert not [o for o in objects if o["apiVersion"] == "monitoring.coreos.com/v1"]
    notes = release["info"]["notes"]
    assert "kubectl get clusterkopfpeering rio-rocm-inference-operator" in notes
    # The InferenceService NOTES.txt suggests is one the CRD and the operator accept.
    example = yaml.safe_load(textwrap.dedent(notes.split("resnet.yaml`")[1].split("\n\n", 2)[1]))
    assert example["kind"] == "InferenceService"
    assert schema_errors(example) == []
    parse_spec(example["spec"])


def test_the_activators_cluster_role_grants_the_calls_it_makes_and_no_more(chart_cluster: Cluster) -> None:
    h.install(chart_cluster, None)
    (role,) = [r for r in h.by_kind(h.installed_objects(chart_cluster), "ClusterRole") if h.is_activator(r)]
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("discovery.k8s.io", "endpointslices", "list"),
        ("discovery.k8s.io", "endpointslices", "watch"),
        ("", "services", "get"),
        # Whose a client is (the namespace of the pod with its address), for a short host that
        # several namespaces' services at zero claim: a list by status.podIP, no get, no watch.
        ("", "pods", "list"),
        ("inference.rocm.dev", "inferenceservices", "patch"),
    }


def test_namespaced_install_uses_roles_in_the_watched_namespaces(chart_cluster: Cluster) -> None:
    values = h.values_of(h.CHART / "ci" / "multi-namespace-ha-values.yaml")
    h.install(chart_cluster, values)
    objects = h.installed_objects(chart_cluster)

    args = h.one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace=")] == ["--namespace=ml-team-a", "--namespace=ml-team-b"]
    assert "--peering=inference-operator" in args
    roles = h.by_kind(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ml-team-a", "ml-team-b"]
    bindings = h.by_kind(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ml-team-a", "ml-team-b"]
    assert all(b["subjects"][0]["namespace"] == h.RELEASE_NAMESPACE for b in bindings)
    peerings = h.by_kind(objects, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["ml-team-a", "ml-team-b"]
    assert not h.by_kind(objects, "ClusterKopfPeering")
    # Only the discovery reads and a lost node's are cluster-wide: no write verb in any ClusterRole.
    (cluster_role,) = operator_cluster_roles(objects)
    assert {v for r in cluster_role["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    resources = {res for r in cluster_role["rules"] for res in r["resources"]}
    assert resources == {"customresourcedefinitions", "namespaces", "nodes"}


def test_single_namespace_install_has_no_cluster_scoped_rbac(chart_cluster: Cluster) -> None:
    h.install(chart_cluster, h.values_of(h.CHART / "ci" / "namespaced-values.yaml"))
    objects = h.installed_objects(chart_cluster)
    # Only the pickers' and routers' ClusterRoles, which grant nothing until a RoleBinding names them.
    assert not operator_cluster_roles(objects) and not h.by_kind(objects, "ClusterRoleBinding")
    assert h.one(objects, "ClusterRole", PICKER_CLUSTER_ROLE) and h.one(objects, "ClusterRole", ROUTER_CLUSTER_ROLE)
    (role,) = h.by_kind(objects, "Role")
    assert role["metadata"]["namespace"] == "ml-team-a"
    assert "kopfpeerings" not in {res for r in role["rules"] for res in r["resources"]}
    deployment = h.one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--peering")]
    assert not h.by_kind(objects, "PodDisruptionBudget")
    assert not h.by_kind(objects, "KopfPeering") and not h.by_kind(objects, "ConfigMap")


def test_monitoring_install(chart_cluster: Cluster) -> None:
    h.install(chart_cluster, h.values_of(h.CHART / "ci" / "monitoring-values.yaml"))
    objects = h.installed_objects(chart_cluster)

    service_monitor = h.one(objects, "ServiceMonitor")
    assert service_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = h.one(objects, "Service")
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service_monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    # The operator's per-InferenceService series keep their own namespace label (the dashboard
    # filters on it; tests/observability/test_observability_pods.py runs its queries on real series).
    assert service_monitor["spec"]["endpoints"][0]["honorLabels"] is True

    pod_monitor = h.one(objects, "PodMonitor")
    # The labels and port name the operator's builders give model-server pods.
    assert pod_monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "model-server",
        "app.kubernetes.io/managed-by": "rocm-inference-operator",
    }
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "10s"
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    # The activator's pods, terminating ones included (a PodMonitor's), on their metrics port.
    (activator,) = [d for d in h.by_kind(objects, "Deployment") if h.is_activator(d)]
    (activator_monitor,) = [m for m in h.by_kind(objects, "PodMonitor") if h.is_activator(m)]
    template = activator["spec"]["template"]
    assert activator_monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (endpoint,) = activator_monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in template["spec"]["containers"][0]["ports"]}
    assert endpoint["honorLabels"] is True

    rule = h.one(objects, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"InferenceLatencySLOBreach", "InferenceOperatorDown", "InferenceAutoscalerAtMaxReplicas"} <= set(alerts)
    assert "> 0.25" in alerts["InferenceLatencySLOBreach"]["expr"]
    assert all(a["labels"]["team"] == "ml-platform" for a in alerts.values())
    # The operator-down alert watches the scrape job the ServiceMonitor creates (named after
    # the Service) in the release namespace.
    assert f'job="{service["metadata"]["name"]}"' in alerts["InferenceOperatorDown"]["expr"]
    assert f'namespace="{h.RELEASE_NAMESPACE}"' in alerts["InferenceOperatorDown"]["expr"]
    # The activator-down alert, the job a PodMonitor creates: its namespace/name.
    job = f"{h.RELEASE_NAMESPACE}/{activator_monitor['metadata']['name']}"
    assert f'up{{job="{job}", namespace="{h.RELEASE_NAMESPACE}"}}' in alerts["InferenceActivatorDown"]["expr"]
    assert "{{ $labels.model }}" in alerts["InferenceLatencySLOBreach"]["annotations"]["summary"]

    dashboard = h.one(objects, "ConfigMap")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["annotations"]["grafana_folder"] == "Inference"


@pytest.mark.parametrize(
    "bad, where",
    [
        ({"replicaCuont": 3}, "typo at the top level"),
        ({"image": {"tga": "1.0"}}, "typo in a nested key"),
        ({"replicaCount": 2, "ha": {"enabled": False}}, "two active operators"),
        (
            {"monitoring": {"serviceMonitor": {"enabled": True}}, "metrics": {"enabled": False}},
            "ServiceMonitor without metrics",
        ),
    ],
)
def test_install_refuses_invalid_values(chart_cluster: Cluster, bad: dict, where: str) -> None:
    with pytest.raises(h.HelmError, match="values don't meet the specifications of the schema"):
        h.install(chart_cluster, copy.deepcopy(bad))
    assert not h.by_kind(h.installed_objects(chart_cluster), "Deployment"), where


def _secret_grants(objects: list[dict]) -> dict[tuple[str, str | None], set[str]]:
    """(kind, namespace) of every role that grants something on Secrets → the verbs."""
    found: dict[tuple[str, str | None], set[str]] = {}
    for obj in h.by_kind(objects, "ClusterRole") + h.by_kind(objects, "Role"):
        for rule in obj["rules"]:
            if "" in rule["apiGroups"] and "secrets" in rule["resources"]:
                found.setdefault((obj["kind"], obj["metadata"].get("namespace")), set()).update(rule["verbs"])
    return found


def _operator_env(objects: list[dict]) -> dict[str, str]:
    container = h.one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize(
    ("values", "grants", "env"),
    [
        (
            {},
            {("ClusterRole", None): {"get"}},
            {
                "AUTH": "true",
                "ALLOW_HTTP": "false",
                "ALLOWED_URLS": ",".join(DEFAULT_ALLOWED_URLS),
                "HUB_TOKENS": "true",
                "HUB_TOKEN_ENDPOINTS": "https://huggingface.co",
            },
        ),
        (
            {
                "prometheus": {
                    "allowedUrls": ["https://prometheus.monitoring:9090", "https://thanos/tenant-a"],
                    "credentials": {"enabled": False},
                },
                "huggingFace": {"tokens": False},
            },
            {},
            {
                "AUTH": "false",
                "ALLOWED_URLS": "https://prometheus.monitoring:9090,https://thanos/tenant-a",
                "HUB_TOKENS": "false",
            },
        ),
        (
            {
                "prometheus": {"credentials": {"enabled": False}},
                "huggingFace": {"tokenEndpoints": ["https://huggingface.co", "https://hf-mirror.internal"]},
            },
            {("ClusterRole", None): {"get"}},
            {"AUTH": "false", "HUB_TOKENS": "true"},
        ),
        (
            {"rbac": {"secretNamespaces": ["ml-team-a"]}, "prometheus": {"credentials": {"allowHttp": True}}},
            {("Role", "ml-team-a"): {"get"}},
            {"AUTH": "true", "ALLOW_HTTP": "true"},
        ),
        (
            {
                "watch": {"allNamespaces": False, "namespaces": ["ml-team-a", "ml-team-b"]},
                "rbac": {"secretNamespaces": ["ml-team-b"]},
            },
            {("Role", "ml-team-b"): {"get"}},
            {"AUTH": "true"},
        ),
    ],
    ids=["default", "disabled-with-allow-list", "hub-tokens-only", "one-namespace", "namespaced-install"],
)
def test_credential_values_set_rbac_and_operator_env(
    chart_cluster: Cluster, values: dict, grants: dict, env: dict
) -> None:
    """Secrets are readable only where some credential is on; the operator is told the same rules."""
    h.install(chart_cluster, values)
    objects = h.installed_objects(chart_cluster)
    for obj in objects:
        validate(obj)
    assert _secret_grants(objects) == grants
    operator_env = _operator_env(objects)
    for key, value in env.items():
        name = f"INFERENCE_OPERATOR_{key}" if key.startswith("HUB_") else f"INFERENCE_OPERATOR_PROMETHEUS_{key}"
        assert operator_env[name] == value


def test_operator_container_has_a_cpu_limit(chart_cluster: Cluster) -> None:
    h.install(chart_cluster, {})
    container = h.one(h.installed_objects(chart_cluster), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["cpu"] == "1"
