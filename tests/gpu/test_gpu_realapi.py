"""Every GPU mode on a real kube-apiserver: its objects, the CRD's GPU rules, the operator at work.

kubernetes-validate checks the OpenAPI shape; the API server also compiles and type-checks the
CEL selectors of a ResourceClaimTemplate, validates pod claims against the pod's containers and
evaluates the CRD's CEL rules; the operator, as its own user under the chart's RBAC, creates and
replaces claim templates.
"""

from __future__ import annotations

import copy
import itertools
import pathlib
import time
from typing import Any

import httpx
import pytest
import yaml

from inference_operator.builders import Owner, build_all
from inference_operator.builders.gpu import CLAIM_HASH_ANNOTATION
from inference_operator.models import GpuAllocation, ResourceNaming, parse_spec
from inference_operator.settings import GpuDefaults
from tests.tiers import realapi
from tests.tiers.realapi import Operator
from testsupport.cluster import inference_service, wait_for
from testsupport.envtest import ROOT, ApiServer

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]
operator = realapi.operator_fixture()  # the tier's operator process, not the emulator's

MI300X = "AMD_Instinct_MI300X_OAM"
CRS = "/apis/inference.rocm.dev/v1alpha1/namespaces/{ns}/inferenceservices"
PATHS = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Service": "/api/v1/namespaces/{ns}/services",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "ResourceClaimTemplate": "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
}
_namespaces = itertools.count()


@pytest.fixture
def ns(apiserver: ApiServer) -> str:
    name = f"gpu{next(_namespaces)}-{int(time.time() * 1000) % 100000}"
    apiserver.kubectl("create", "namespace", name)
    return name


@pytest.fixture
def api(apiserver: ApiServer) -> Any:
    with apiserver.client() as client:
        yield client


def create(client: httpx.Client, path: str, obj: dict, dry_run: bool = False) -> httpx.Response:
    params = {"fieldValidation": "Strict", **({"dryRun": "All"} if dry_run else {})}
    return client.post(path, json=obj, params=params)


def causes(response: httpx.Response) -> list[tuple[str, str]]:
    details = response.json().get("details") or {}
    return [(c.get("field", ""), c.get("message", "")) for c in details.get("causes", [])]


MODES = [
    pytest.param(
        {"count": 8, "productName": MI300X, "family": "AI", "vram": "192G", "partition": "spx_nps1"},
        GpuDefaults(),
        id="device-plugin-single",
    ),
    pytest.param(
        {"count": 4, "productName": MI300X, "partition": "cpx_nps4"},
        GpuDefaults(resource_naming=ResourceNaming.MIXED, supplemental_groups=(44, 992)),
        id="device-plugin-mixed",
    ),
    pytest.param(
        {"count": 2, "productName": MI300X, "family": "AI", "vram": "192G", "partition": "spx_nps1"},
        GpuDefaults(allocation=GpuAllocation.DRA),
        id="dra",
    ),
    pytest.param(
        {"count": 3, "allocation": "dra", "vram": "24G", "partition": "cpx_nps4", "visibleDevices": "2,0,1"},
        GpuDefaults(),
        id="dra-partitions",
    ),
]


@pytest.mark.parametrize(("gpu", "defaults"), MODES)
def test_every_mode_is_created_by_the_api_server(api: httpx.Client, ns: str, gpu: dict, defaults: GpuDefaults) -> None:
    spec = parse_spec({"model": {"uri": "pvc://models/m"}, "resources": {"gpu": gpu}})
    for obj in build_all(Owner(name="m", namespace=ns, uid="u-1", spec=spec, gpu_defaults=defaults)):
        response = create(api, PATHS[obj["kind"]].format(ns=ns), obj)
        assert response.status_code == 201, (obj["kind"], response.text)
        assert not response.headers.get("warning"), response.headers["warning"]


def test_a_broken_selector_would_be_refused_so_the_check_is_real(api: httpx.Client, ns: str) -> None:
    spec = parse_spec({"model": {"uri": "pvc://m"}, "resources": {"gpu": {"count": 1, "productName": MI300X}}})
    (template, *_) = build_all(Owner("broken", ns, "u-1", spec, gpu_defaults=GpuDefaults(GpuAllocation.DRA)))
    broken = copy.deepcopy(template)
    selector = broken["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]
    selector["expression"] = selector["expression"].removesuffix(f'"{MI300X}"')  # `x ==` does not compile
    response = create(api, PATHS["ResourceClaimTemplate"].format(ns=ns), broken, dry_run=True)
    assert response.status_code == 422 and "compilation failed" in response.text


def test_a_claim_templates_spec_cannot_change(api: httpx.Client, ns: str) -> None:
    """Why the operator replaces a changed template and rolls the pods by a hash annotation."""
    spec = parse_spec({"model": {"uri": "pvc://m"}, "resources": {"gpu": {"count": 1}}})
    (template, *_) = build_all(Owner("immutable", ns, "u-1", spec, gpu_defaults=GpuDefaults(GpuAllocation.DRA)))
    path = PATHS["ResourceClaimTemplate"].format(ns=ns)
    live = create(api, path, template).json()
    live["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    response = api.put(f"{path}/immutable", json=live)
    assert response.status_code == 422 and "field is immutable" in response.text


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_the_examples_are_accepted(api: httpx.Client, ns: str, path: pathlib.Path) -> None:
    document = yaml.safe_load(path.read_text())
    document["metadata"]["namespace"] = ns
    response = create(api, CRS.format(ns=ns), document, dry_run=True)
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ({"count": 2, "visibleDevices": "0,2"}, "may only name devices 0 to resources.gpu.count-1"),
        ({"count": 2, "visibleDevices": "1,1"}, "must not name a device twice"),
        ({"count": 2, "visibleDevices": "1,01"}, "must not name a device twice"),
        ({"count": 2, "visibleDevices": "0"}, "must list exactly resources.gpu.count devices"),
    ],
)
def test_bad_visible_devices_are_refused_naming_the_field(api: httpx.Client, ns: str, gpu: dict, message: Any) -> None:
    document = inference_service("visible", ns, {"model": {"uri": "pvc://m"}, "resources": {"gpu": gpu}})
    response = create(api, CRS.format(ns=ns), document, dry_run=True)
    assert response.status_code == 422
    ((field, text),) = causes(response)
    assert field == "spec.resources.gpu.visibleDevices" and message in text


@pytest.mark.parametrize(("partition", "accepted"), [("cpx_nps4", True), ("dpx_nps2", True), ("CPX_NPS4", False)])
def test_partition_names_are_those_the_device_plugin_advertises(
    api: httpx.Client, ns: str, partition: str, accepted: bool
) -> None:
    spec = {"model": {"uri": "pvc://m"}, "resources": {"gpu": {"partition": partition}}}
    response = create(api, CRS.format(ns=ns), inference_service("partition", ns, spec), dry_run=True)
    assert (response.status_code == 201) is accepted, response.text


def test_the_operator_creates_and_replaces_a_claim_template(apiserver: ApiServer, operator: Operator, ns: str) -> None:
    """As its own user under the chart's RBAC: the template, a pod that claims from it, and a
    new template (and pod template) when the claim changes, though the API server refuses edits."""
    templates = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates/dra"
    deployments = f"/apis/apps/v1/namespaces/{ns}/deployments/dra"

    def apply(gpu: dict) -> None:
        spec = {"model": {"uri": "pvc://models/m"}, "resources": {"gpu": {"allocation": "dra", **gpu}}}
        apiserver.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(inference_service("dra", ns, spec)))

    def read(path: str) -> dict | None:
        with apiserver.client() as client:
            response = client.get(path)
        return response.json() if response.status_code == 200 else None

    def count(template: dict | None) -> int | None:
        return template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] if template else None

    apply({"count": 1, "productName": MI300X})
    first = wait_for(lambda: read(templates), timeout=60, message="the claim template")
    pod = wait_for(lambda: read(deployments), timeout=60, message="the Deployment")["spec"]["template"]
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "dra"}]
    limits = pod["spec"]["containers"][0]["resources"].get("limits", {})
    assert not [k for k in limits if k.startswith("amd.com/")]
    rolled_from = pod["metadata"]["annotations"][CLAIM_HASH_ANNOTATION]

    apply({"count": 2, "productName": MI300X})
    try:
        second = wait_for(lambda: (t := read(templates)) and count(t) == 2 and t, timeout=60, message="a new template")
    except AssertionError as exc:  # say why: the status and the operator's last words
        status = read(CRS.format(ns=ns) + "/dra")
        raise AssertionError(f"{exc}; status {status}; operator log:\n{operator.text()[-4000:]}") from exc
    assert second["metadata"]["uid"] != first["metadata"]["uid"]  # deleted and created, not edited
    pod = wait_for(
        lambda: (
            (d := read(deployments))
            and d["spec"]["template"]["metadata"]["annotations"][CLAIM_HASH_ANNOTATION] != rolled_from
            and d
        ),
        timeout=60,
        message="the pods rolled onto the new claim",
    )["spec"]["template"]
    assert pod["spec"]["containers"][0]["env"][:2] == [
        {"name": "ROCR_VISIBLE_DEVICES", "value": "0,1"},
        {"name": "HIP_VISIBLE_DEVICES", "value": "0,1"},
    ]
