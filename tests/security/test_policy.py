"""The platform's pod policy: an InferenceService author cannot run pods as another
ServiceAccount, at a system priority, with the API token mounted, or from an image outside the
platform's registries. Refused whole with Degraded=PolicyViolation; nothing rolled out."""

from __future__ import annotations

import time

import pytest

from inference_operator import policy as pol
from inference_operator import settings
from inference_operator.models import parse_spec
from testsupport.cluster import DEPLOYMENTS, Cluster, condition, inference_service, wait_for

OWN = ("ghcr.io/rocm-inference/model-server:0.1.0", "docker.io/vllm/vllm-openai-rocm:v0.32.0")
DEFAULT = settings.PodPolicy.from_env({}, OWN)


def spec(runtime: dict | None = None, scheduling: dict | None = None, uri: str = "pvc://models/m"):
    return parse_spec(
        {
            "model": {"uri": uri},
            "runtime": runtime or {},
            "scheduling": scheduling or {},
            "resources": {"gpu": {"count": 0}},
        }
    )


@pytest.mark.parametrize(
    ("hostile", "field"),
    [
        (
            spec(scheduling={"serviceAccountName": "cluster-admin-sa"}),
            "scheduling.serviceAccountName 'cluster-admin-sa'",
        ),
        (spec(scheduling={"priorityClassName": "system-node-critical"}), "scheduling.priorityClassName"),
        (spec(scheduling={"automountServiceAccountToken": True}), "scheduling.automountServiceAccountToken"),
        (spec(runtime={"image": "attacker/steal"}), "runtime.image 'attacker/steal'"),
        (spec(runtime={"image": "ghcr.io/rocm-inference-evil/x:1"}), "runtime.image"),
        (spec(runtime={"image": "ghcr.io/attacker/x:1"}), "runtime.image"),
        (spec(uri="oci://docker.io/attacker/modelcar:1"), "model.uri"),
    ],
)
def test_the_default_policy_refuses_what_would_escalate(hostile, field: str) -> None:
    (found,) = pol.violations(hostile, DEFAULT)
    assert found.startswith(field), found
    with pytest.raises(pol.PolicyViolation, match=field.split()[0]):
        pol.check(hostile, DEFAULT)


def test_the_default_policy_allows_the_ordinary_spec() -> None:
    assert pol.violations(spec(), DEFAULT) == []
    assert pol.violations(spec(scheduling={"serviceAccountName": "default"}), DEFAULT) == []
    assert pol.violations(spec(runtime={"image": "ghcr.io/rocm-inference/model-server:0.2.0"}), DEFAULT) == []
    assert pol.violations(spec(runtime={"image": "vllm/vllm-openai-rocm:v0.33.0"}), DEFAULT) == []  # Docker Hub


def test_the_platform_widens_the_policy() -> None:
    wide = settings.PodPolicy.from_env(
        {
            settings.SERVICE_ACCOUNTS_ENV: "default, model-reader",
            settings.PRIORITY_CLASSES_ENV: "inference-high",
            settings.IMAGE_REGISTRIES_ENV: "registry.corp/ml/",
            settings.ALLOW_TOKEN_ENV: "true",
        },
        OWN,
    )
    allowed = spec(
        runtime={"image": "registry.corp/ml/server@sha256:" + "a" * 64},
        scheduling={
            "serviceAccountName": "model-reader",
            "priorityClassName": "inference-high",
            "automountServiceAccountToken": True,
        },
    )
    assert pol.violations(allowed, wide) == []
    assert pol.violations(spec(runtime={"image": "registry.corp/mlx/server:1"}), wide)  # a prefix on a / only
    assert pol.violations(spec(scheduling={"priorityClassName": "system-node-critical"}), wide)
    anything = settings.PodPolicy.from_env({settings.IMAGE_REGISTRIES_ENV: "*"}, OWN)
    assert pol.violations(spec(runtime={"image": "attacker/steal"}), anything) == []
    with pytest.raises(ValueError, match=settings.ALLOW_TOKEN_ENV):
        settings.PodPolicy.from_env({settings.ALLOW_TOKEN_ENV: "yes please"}, OWN)


def test_images_name_their_registry() -> None:
    assert settings.normalized_image("ubuntu") == "docker.io/library/ubuntu"
    assert settings.normalized_image("attacker/steal") == "docker.io/attacker/steal"
    assert settings.normalized_image("localhost/x:dev") == "localhost/x:dev"
    assert settings.normalized_image("registry:5000/x") == "registry:5000/x"
    assert settings.repository_prefix("ghcr.io/rocm-inference/model-server:0.1.0") == "ghcr.io/rocm-inference/"


def test_a_registry_named_by_its_host_alone_allows_its_images() -> None:
    """`mirror.example/` was read as the Docker Hub image docker.io/library/mirror.example/."""
    own = ["registry.example.com/vllm-rocm:1"]  # the operator's image directly under a host
    mirrors = settings.PodPolicy.from_env({settings.IMAGE_REGISTRIES_ENV: "mirror.example/,localhost:5000,team/"}, own)
    allowed = ["mirror.example/x:1", "localhost:5000/a/b:2", "docker.io/team/x", "team/x"]
    refused = ["mirror.example.evil/x:1", "localhost:50000/a", "docker.io/library/mirror.example", "teams/x"]
    assert [mirrors.image_allowed(i) for i in allowed + refused] == [True] * 4 + [False] * 4
    default = settings.PodPolicy.from_env({}, own)
    assert default.image_allowed("registry.example.com/other:2")
    assert not default.image_allowed("registry.example.com.evil/x")


@pytest.fixture
def default_policy(monkeypatch):
    """The operator as the chart installs it by default (the test session widens the registries)."""
    monkeypatch.delenv(settings.IMAGE_REGISTRIES_ENV, raising=False)  # read when the operator starts


def test_the_operator_reports_a_violation_and_rolls_nothing_out(cluster: Cluster, default_policy, operator) -> None:
    body = inference_service(
        "rogue",
        "ml",
        {
            "model": {"uri": "pvc://models/m"},
            "resources": {"gpu": {"count": 0}},
            "scheduling": {"serviceAccountName": "cluster-admin-sa", "priorityClassName": "system-node-critical"},
        },
    )
    assert cluster.apply_cr(body).status_code in (200, 201)
    degraded = wait_for(
        lambda: (c := condition(cluster.get_cr("ml", "rogue"), "Degraded")) and c["status"] == "True" and c,
        timeout=30,
        message="Degraded=PolicyViolation",
    )
    assert degraded["reason"] == "PolicyViolation"
    assert "serviceAccountName 'cluster-admin-sa'" in degraded["message"]
    assert "priorityClassName 'system-node-critical'" in degraded["message"]
    assert cluster.get(DEPLOYMENTS, "ml", "rogue") is None


def test_a_deleted_deployment_is_not_repaired_into_a_refused_spec(cluster: Cluster, default_policy, operator) -> None:
    """The spec turned hostile after a rollout: the reconcile handler refuses it, and deleting
    the Deployment must not make the repair path roll it out."""
    body = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "turned", "namespace": "ml"},
        "spec": {"model": {"uri": "pvc://models/m"}, "resources": {"gpu": {"count": 0}}},
    }
    assert cluster.apply_cr(body).status_code in (200, 201)
    wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "turned"), timeout=30, message="the first rollout")
    cluster.patch_cr("ml", "turned", {"spec": {"scheduling": {"serviceAccountName": "cluster-admin-sa"}}})
    wait_for(
        lambda: (c := condition(cluster.get_cr("ml", "turned"), "Degraded")) and c["reason"] == "PolicyViolation",
        timeout=30,
        message="Degraded=PolicyViolation",
    )
    assert cluster.request("DELETE", "/apis/apps/v1/namespaces/ml/deployments/turned").status_code == 200
    time.sleep(3)  # the repair path had every chance to act
    deployment = cluster.get(DEPLOYMENTS, "ml", "turned")
    assert deployment is None or "serviceAccountName" not in deployment["spec"]["template"]["spec"]


def gpu_spec(groups: list[int]):
    return parse_spec({"model": {"uri": "pvc://m"}, "resources": {"gpu": {"count": 1, "supplementalGroups": groups}}})


def test_supplemental_groups_are_those_the_platform_allows() -> None:
    """They reach every container of the pod, the credential holders too: any GID was accepted."""
    assert pol.violations(gpu_spec([44, 109, 992]), DEFAULT) == []  # system groups: video, render
    assert pol.violations(gpu_spec([]), DEFAULT) == []
    assert pol.violations(gpu_spec([44, 1000]), DEFAULT) == [
        "resources.gpu.supplementalGroups 1000 is not allowed (allowed: 1-999; never 0)"
    ]
    exact = settings.PodPolicy.from_env({settings.POLICY_SUPPLEMENTAL_GROUPS_ENV: "44,109"}, OWN)
    assert pol.violations(gpu_spec([44, 5]), exact) == [
        "resources.gpu.supplementalGroups 5 is not allowed (allowed: 44, 109; never 0)"
    ]
    none = settings.PodPolicy.from_env({settings.POLICY_SUPPLEMENTAL_GROUPS_ENV: ""}, OWN)
    assert pol.violations(gpu_spec([]), none) == [] and pol.violations(gpu_spec([44]), none)
    ranges = settings.PodPolicy.from_env({settings.POLICY_SUPPLEMENTAL_GROUPS_ENV: "44, 1000-1999"}, OWN)
    assert [ranges.group_allowed(g) for g in (44, 109, 999, 1000, 1999, 2000)] == [
        True,
        False,
        False,
        True,
        True,
        False,
    ]
    anything = settings.PodPolicy.from_env({settings.POLICY_SUPPLEMENTAL_GROUPS_ENV: "*"}, OWN)
    assert anything.group_allowed(4294967295) and not anything.group_allowed(0)
    for bad in ("0", "0-10", "20-10", "video", "1-4294967296"):
        with pytest.raises(ValueError, match=settings.POLICY_SUPPLEMENTAL_GROUPS_ENV):
            settings.PodPolicy.from_env({settings.POLICY_SUPPLEMENTAL_GROUPS_ENV: bad}, OWN)


def route_spec(parents: list[dict], hostnames: list[str] | None = None):
    route: dict = {"parentRefs": parents}
    if hostnames is not None:
        route["hostnames"] = hostnames
    return parse_spec({"model": {"uri": "pvc://m"}, "routing": {"httpRoute": route}})


def test_routes_only_to_the_platforms_gateways_and_host_names() -> None:
    """Any Gateway admitting the namespace took the author's route, for any host name."""
    assert pol.violations(route_spec([{"name": "gw", "namespace": "x"}]), DEFAULT) == []  # the default: any
    platform = settings.PodPolicy.from_env(
        {
            settings.GATEWAYS_ENV: "gateways/inference, team-a/*",
            settings.HOSTNAMES_ENV: "*.team-a.example.com,llm.example.com",
        },
        OWN,
    )
    ok = route_spec([{"name": "inference", "namespace": "gateways"}, {"name": "any", "namespace": "team-a"}])
    assert pol.violations(ok, platform, "ml") == [
        "routing.httpRoute.hostnames empty (every host) is not allowed (allowed: *.team-a.example.com, llm.example.com)"
    ]
    hosts = ["llm.example.com", "a.team-a.example.com", "*.team-a.example.com"]
    assert pol.violations(route_spec([{"name": "inference", "namespace": "gateways"}], hosts), platform, "ml") == []
    refused = pol.violations(
        route_spec([{"name": "inference"}], ["team-a.example.com"]), platform, "gateways"
    )  # a parentRef without a namespace is the service's: gateways/inference
    assert refused == [
        "routing.httpRoute.hostnames 'team-a.example.com' is not allowed "
        "(allowed: *.team-a.example.com, llm.example.com)"
    ]
    (found,) = pol.violations(route_spec([{"name": "inference"}], ["llm.example.com"]), platform, "ml")
    assert found.startswith("routing.httpRoute.parentRefs 'ml/inference' is not an allowed Gateway")
    for name, bad in (
        (settings.GATEWAYS_ENV, "inference"),
        (settings.HOSTNAMES_ENV, "Evil.example.com"),
        (settings.HOSTNAMES_ENV, "a.*"),
    ):
        with pytest.raises(ValueError, match=name):
            settings.PodPolicy.from_env({name: bad}, OWN)


@pytest.fixture
def route_policy(monkeypatch):
    monkeypatch.setenv(settings.GATEWAYS_ENV, "gateways/inference")
    monkeypatch.setenv(settings.HOSTNAMES_ENV, "*.ml.example.com")


def test_the_operator_refuses_a_route_outside_the_policy(cluster: Cluster, route_policy, operator) -> None:
    body = inference_service(
        "hijack",
        "ml",
        {
            "model": {"uri": "pvc://models/m"},
            "resources": {"gpu": {"count": 0}},
            "routing": {"httpRoute": {"parentRefs": [{"name": "shared"}], "hostnames": ["login.example.com"]}},
        },
    )
    assert cluster.apply_cr(body).status_code in (200, 201)
    degraded = wait_for(
        lambda: (c := condition(cluster.get_cr("ml", "hijack"), "Degraded")) and c["status"] == "True" and c,
        timeout=30,
        message="Degraded=PolicyViolation",
    )
    assert degraded["reason"] == "PolicyViolation"
    assert "parentRefs 'ml/shared'" in degraded["message"] and "'login.example.com'" in degraded["message"]
    assert cluster.get(DEPLOYMENTS, "ml", "hijack") is None
