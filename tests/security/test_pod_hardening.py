"""Model-server pods carry no API token unless asked, and no container runs without a CPU limit."""

from __future__ import annotations

import pathlib

import kubernetes_validate
import pytest
import yaml

from inference_operator.builders import Owner, build_deployment
from inference_operator.models import SpecError, parse_spec
from testsupport.crd import ROOT, validate_custom_resource

UID = "7f1c3f9e-0000-4000-8000-000000000001"


def deployment(**spec) -> dict:
    spec.setdefault("model", {"uri": "s3://models/resnet50/"})
    obj = build_deployment(Owner(name="resnet", namespace="ml", uid=UID, spec=parse_spec(spec)))
    kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    return obj


def test_service_account_token_is_not_mounted_by_default() -> None:
    pod = deployment()["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False


def test_the_spec_can_ask_for_the_token() -> None:
    pod = deployment(scheduling={"automountServiceAccountToken": True})["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True


@pytest.mark.parametrize("uri", ["s3://models/resnet50/", "https://h/m/model.onnx", "oci://ghcr.io/m/resnet:1"])
def test_init_containers_have_cpu_and_memory_limits(uri: str) -> None:
    pod = deployment(model={"uri": uri})["spec"]["template"]["spec"]
    assert pod["initContainers"]
    for init in pod["initContainers"]:
        assert {"cpu", "memory"} <= set(init["resources"]["limits"]), init["name"]


def test_the_crd_knows_the_field_and_defaults_it_off() -> None:
    service = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "resnet", "namespace": "ml"},
        "spec": {"model": {"uri": "pvc://models/resnet50"}, "scheduling": {"automountServiceAccountToken": True}},
    }
    assert validate_custom_resource(service) == []


def test_model_sha256_reaches_the_fetcher_and_only_for_one_file() -> None:
    digest = "ab" * 32
    pod = deployment(model={"uri": "https://h/m/model.onnx", "sha256": digest})["spec"]["template"]["spec"]
    command = pod["initContainers"][0]["command"]
    assert command[-2:] == ["--sha256", digest]
    assert command[:3] == ["python", "-m", "model_server.storage"]
    # An S3 prefix may hold many files: refused by the schema (CEL) and by the model alike.
    service = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "resnet", "namespace": "ml"},
        "spec": {"model": {"uri": "s3://models/resnet50/", "sha256": digest}},
    }
    errors = validate_custom_resource(service)
    assert errors and "model.sha256 applies to http(s)" in errors[0]
    with pytest.raises(SpecError, match="model.sha256 applies"):
        parse_spec(service["spec"])
    with pytest.raises(SpecError):
        parse_spec({"model": {"uri": "https://h/m/model.onnx", "sha256": "not-hex"}})


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_pod_is_hardened(path: pathlib.Path) -> None:
    """Whatever the engine or GPU mode: no API token, and a CPU limit on every container."""
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") != "InferenceService":
            continue
        pod = deployment(**doc["spec"])["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"] + pod.get("initContainers", []):
            assert "cpu" in container["resources"]["limits"], container["name"]
