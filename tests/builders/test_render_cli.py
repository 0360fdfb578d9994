"""`python -m inference_operator render`: the manifests a CR becomes, with no cluster."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from testsupport.crd import ROOT, schema_errors

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def render(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inference_operator", "render", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
        check=False,
    )


def test_two_gpu_example_renders_valid_deployment_and_service() -> None:
    result = render("-f", str(ROOT / "examples" / "resnet-2gpu.yaml"))
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    assert [o["kind"] for o in objects] == ["Deployment", "Service"]
    deployment = objects[0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["amd.com/gpu"] == "2"
    assert {"name": "ROCR_VISIBLE_DEVICES", "value": "0,1"} in container["env"]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.33", strict=True)


def test_several_files_and_stdin_make_one_stream(tmp_path: pathlib.Path) -> None:
    both = "\n---\n".join(p.read_text() for p in EXAMPLES[:2])
    result = render("-f", "-", "-f", str(EXAMPLES[2]), stdin=both)
    assert result.returncode == 0, result.stderr
    # Every object names its InferenceService (an endpoint picker's are NAME-epp).
    names = {o["metadata"]["labels"]["inference.rocm.dev/inference-service"] for o in yaml.safe_load_all(result.stdout)}
    expected = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in EXAMPLES[:3]}
    assert names == expected


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            "apiVersion: inference.rocm.dev/v1alpha1\nkind: InferenceService\nmetadata: {name: x}\n"
            "spec: {model: {uri: 'pvc://m'}, resources: {gpu: {count: 99}}}",
            "InferenceService x: spec.resources.gpu.count: 99 is greater than the maximum of 16",
        ),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "apiVersion/kind must be"),
        (
            "apiVersion: inference.rocm.dev/v1alpha1\nkind: InferenceService\nspec: {}\n",
            "metadata.name: a name is required",
        ),
        ("a: [unclosed", "not valid YAML"),
    ],
)
def test_errors_name_the_problem_and_exit_non_zero(document: str, message: str) -> None:
    result = render("-f", "-", stdin=document)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""


HEAD = "apiVersion: inference.rocm.dev/v1alpha1\nkind: InferenceService\n"
NAMED = HEAD + "metadata: {name: x}\n"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (NAMED + "spec: {replicas: true, model: {uri: 'pvc://m'}}", "spec.replicas: True is not of type 'integer'"),
        (NAMED + "spec: {replicas: '3', model: {uri: 'pvc://m'}}", "spec.replicas: '3' is not of type 'integer'"),
        (
            NAMED + "spec: {model: {uri: 'pvc://m'}, resources: {gpu: {count: '2'}}}",
            "spec.resources.gpu.count: '2' is not of type 'integer'",
        ),
        (
            NAMED + "spec: {model: {uri: 'pvc://m'}, runtime: {batching: {max_batch_size: 4}}}",
            "spec.runtime.batching.max_batch_size: unknown field (fields are camelCase: maxBatchSize)",
        ),
        (NAMED + "spec: {model: {uri: 'pvc://models/../../etc'}}", "spec.model.uri: 'pvc://models/../../etc' does not"),
        (HEAD + "metadata: hello\nspec: {model: {uri: 'pvc://m'}}", "metadata: 'hello' is not of type 'object'"),
        (HEAD + "metadata: [1]\nspec: {model: {uri: 'pvc://m'}}", "metadata: [1] is not of type 'object'"),
        (NAMED + "spec: {model: {uri: 'pvc://m'}, runtime: {args: " + "[" * 100 + "]" * 100 + "}}", "nested deeper"),
        (NAMED + "spec: {model: {uri: 'pvc://m'}, runtime: {args: " + "[" * 2000 + "]" * 2000 + "}}", "nested too"),
        (NAMED + "spec: {model: {uri: 'pvc://m'}, runtime: {port: 9090}}", "runtime.port and runtime.metricsPort must"),
        (
            NAMED + "spec: {model: {uri: 'pvc://m'}, runtime: {tracing: {endpoint: 'http://169.254.169.254/'}}}",
            "spec.runtime.tracing.endpoint: runtime.tracing.endpoint must not name the pod or its node",
        ),
        (
            NAMED + "spec: {model: {uri: 'pvc://m'}, runtime: {engine: vllm, tracing: "
            "{endpoint: 'http://127.0.0.1:8081/v1/load_lora_adapter'}}}",
            "spec.runtime.tracing.endpoint: runtime.tracing.endpoint must not name the pod or its node",
        ),
        (
            NAMED + "spec: {model: {uri: 'pvc://m'}, runtime: {tracing: {endpoint: 'http://[::ffff:7f00:1]:8081/'}}}",
            "runtime.tracing.endpoint must not name the pod or its node",
        ),
        (
            NAMED + "spec: {model: {uri: 'pvc://m'}, runtime: {tracing: {endpoint: 'http://otel:8080/v1/traces'}}}",
            "runtime.tracing.endpoint must not be on a port of the pod's own",
        ),
        (HEAD + "metadata: {name: 1model}\nspec: {model: {uri: 'pvc://m'}}", "metadata.name must be a DNS-1035 label"),
        (HEAD + "metadata: {name: a.b}\nspec: {model: {uri: 'pvc://m'}}", "metadata.name must be a DNS-1035 label"),
        (HEAD + f"metadata: {{name: {'x' * 64}}}\nspec: {{model: {{uri: 'pvc://m'}}}}", "at most 63 characters"),
        (NAMED + "spec: {model: {uri: 'pvc://m'}}\nsurprise: 1", "surprise: unknown field"),
        (NAMED + "spec: hello", "spec: 'hello' is not of type 'object'"),
    ],
    ids=lambda v: v if len(v) < 60 and "\n" not in v else None,
)
def test_render_gives_the_api_servers_verdict(document: str, message: str) -> None:
    """What the API server would refuse, render refuses: exit 2, the field named, no traceback."""
    result = render("-f", "-", stdin=document)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert len(result.stderr) < 2000


def test_missing_file_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    result = render("-f", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert "nope.yaml: No such file or directory" in result.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid_against_the_crd_schema(path: pathlib.Path) -> None:
    assert schema_errors(yaml.safe_load(path.read_text())) == []


def test_examples_cover_the_promised_shapes() -> None:
    specs = [yaml.safe_load(p.read_text())["spec"] for p in EXAMPLES]
    gpus = [s.get("resources", {}).get("gpu", {}) for s in specs]
    assert any(
        g.get("count") == 1 and s["model"].get("format", "onnx") == "onnx" for g, s in zip(gpus, specs, strict=True)
    )
    assert any(
        g.get("count") == 8 and g.get("productName") and s["model"].get("format") == "torchscript"
        for g, s in zip(gpus, specs, strict=True)
    )
    assert any(g.get("count") == 0 for g in gpus)
