"""Every GPU mode's objects created on a real kube-apiserver, and the CRD's GPU rules as it applies them.

kubernetes-validate checks the OpenAPI shape; the API server also compiles and type-checks the
CEL selectors of a ResourceClaimTemplate, validates pod claims against the pod's containers and
evaluates the CRD's CEL rules. Runs where kube-apiserver and etcd are installed (envtest's
/usr/local/kubebuilder/bin, or KUBEBUILDER_ASSETS); skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import copy
import os
import pathlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from inference_operator.builders import Owner, build_all
from inference_operator.models import GpuAllocation, ResourceNaming, parse_spec
from inference_operator.settings import GpuDefaults
from testsupport.crd import CRD_PATH, ROOT
from testsupport.processes import free_port, stop

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ASSETS = pathlib.Path(os.environ.get("KUBEBUILDER_ASSETS", "/usr/local/kubebuilder/bin"))
TOKEN = "gpu-modes-test"
NAMESPACE = "ml"
MI300X = "AMD_Instinct_MI300X_OAM"
PATHS = {
    "Deployment": f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
    "Service": f"/api/v1/namespaces/{NAMESPACE}/services",
    "PodDisruptionBudget": f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets",
    "ResourceClaimTemplate": f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
}
CRS = f"/apis/inference.rocm.dev/v1alpha1/namespaces/{NAMESPACE}/inferenceservices"


def _binary(name: str) -> str | None:
    candidate = ASSETS / name
    return str(candidate) if candidate.exists() else shutil.which(name)


@contextlib.contextmanager
def _process(args: list[str], log: pathlib.Path) -> Iterator[subprocess.Popen]:
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            stop(process)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    apiserver, etcd, openssl = _binary("kube-apiserver"), _binary("etcd"), shutil.which("openssl")
    if not (apiserver and etcd and openssl):
        pytest.skip("kube-apiserver, etcd or openssl not installed")
    work = tmp_path_factory.mktemp("apiserver")
    subprocess.run([openssl, "genrsa", "-out", str(work / "sa.key"), "2048"], check=True, capture_output=True)
    (work / "tokens.csv").write_text(f"{TOKEN},admin,admin,system:masters\n")
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    etcd_args = [
        etcd,
        f"--data-dir={work / 'etcd'}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
    ]
    api_args = [
        apiserver,
        f"--etcd-servers={etcd_url}",
        f"--secure-port={api_port}",
        "--bind-address=127.0.0.1",
        f"--cert-dir={work / 'certs'}",
        f"--token-auth-file={work / 'tokens.csv'}",
        "--authorization-mode=AlwaysAllow",
        f"--service-account-key-file={work / 'sa.key'}",
        f"--service-account-signing-key-file={work / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc",
        "--service-cluster-ip-range=10.0.0.0/24",
    ]
    with (
        _process(etcd_args, work / "etcd.log"),
        _process(api_args, work / "apiserver.log") as server,
        httpx.Client(
            base_url=f"https://127.0.0.1:{api_port}",
            verify=False,  # the API server's own self-signed serving certificate
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        ) as client,
    ):
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (work / "apiserver.log").read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if client.get("/readyz").status_code == 200:
                    break
            assert time.monotonic() < deadline, "kube-apiserver not ready in 120 s"
            time.sleep(0.5)
        create(client, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        create(client, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load(CRD_PATH.read_text()))
        while client.get(CRS).status_code != 200:  # the CRD is served a moment after it is created
            assert time.monotonic() < deadline, "the InferenceService CRD was never served"
            time.sleep(0.2)
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
def test_every_mode_is_created_by_the_api_server(api: httpx.Client, gpu: dict, defaults: GpuDefaults) -> None:
    name = f"gpu-{abs(hash(repr(gpu))) % 10**6}"
    spec = parse_spec({"model": {"uri": "pvc://models/m"}, "resources": {"gpu": gpu}})
    for obj in build_all(Owner(name=name, namespace=NAMESPACE, uid="u-1", spec=spec, gpu_defaults=defaults)):
        response = create(api, PATHS[obj["kind"]], obj)
        assert response.status_code == 201, (obj["kind"], response.text)
        assert not response.headers.get("warning"), response.headers["warning"]


def test_a_broken_selector_would_be_refused_so_the_check_is_real(api: httpx.Client) -> None:
    spec = parse_spec({"model": {"uri": "pvc://m"}, "resources": {"gpu": {"count": 1, "productName": MI300X}}})
    (template, *_) = build_all(Owner("broken", NAMESPACE, "u-1", spec, gpu_defaults=GpuDefaults(GpuAllocation.DRA)))
    broken = copy.deepcopy(template)
    selector = broken["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]
    selector["expression"] = selector["expression"].removesuffix(f'"{MI300X}"')  # `x ==` does not compile
    response = create(api, PATHS["ResourceClaimTemplate"], broken, dry_run=True)
    assert response.status_code == 422 and "compilation failed" in response.text


def test_a_claim_templates_spec_cannot_change(api: httpx.Client) -> None:
    """Why the operator replaces a changed template and rolls the pods by a hash annotation."""
    spec = parse_spec({"model": {"uri": "pvc://m"}, "resources": {"gpu": {"count": 1}}})
    (template, *_) = build_all(Owner("immutable", NAMESPACE, "u-1", spec, gpu_defaults=GpuDefaults(GpuAllocation.DRA)))
    live = create(api, PATHS["ResourceClaimTemplate"], template).json()
    live["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    response = api.put(f"{PATHS['ResourceClaimTemplate']}/immutable", json=live)
    assert response.status_code == 422 and "field is immutable" in response.text


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_the_examples_are_accepted(api: httpx.Client, path: pathlib.Path) -> None:
    document = yaml.safe_load(path.read_text())
    document["metadata"]["namespace"] = NAMESPACE
    response = create(api, CRS, document, dry_run=True)
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
def test_bad_visible_devices_are_refused_naming_the_field(api: httpx.Client, gpu: dict, message: Any) -> None:
    document = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "visible", "namespace": NAMESPACE},
        "spec": {"model": {"uri": "pvc://m"}, "resources": {"gpu": gpu}},
    }
    response = create(api, CRS, document, dry_run=True)
    assert response.status_code == 422
    ((field, text),) = causes(response)
    assert field == "spec.resources.gpu.visibleDevices" and message in text


@pytest.mark.parametrize(("partition", "accepted"), [("cpx_nps4", True), ("dpx_nps2", True), ("CPX_NPS4", False)])
def test_partition_names_are_those_the_device_plugin_advertises(
    api: httpx.Client, partition: str, accepted: bool
) -> None:
    document = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "partition", "namespace": NAMESPACE},
        "spec": {"model": {"uri": "pvc://m"}, "resources": {"gpu": {"partition": partition}}},
    }
    response = create(api, CRS, document, dry_run=True)
    assert (response.status_code == 201) is accepted, response.text
