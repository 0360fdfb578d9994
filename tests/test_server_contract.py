"""The operator's model-server command line, read by the model server's own parser.

The Deployment builder (operator) writes `serve` flags and the server's settings model reads
them; the two programs never import each other, so this test is where they are held to one
contract: every flag the builder writes must parse, land in the setting it means, and carry
the spec's value, for every example and for generated specs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, reject, settings

from inference_operator.builders import Owner
from inference_operator.builders.deployment import service_values
from inference_operator.builders.storage import MODEL_DIR
from inference_operator.engines.model_server import (
    DRAIN_TIMEOUT_SECONDS,
    PRE_STOP_SLEEP_SECONDS,
    SHUTDOWN_DELAY_SECONDS,
    server_args,
)
from inference_operator.models import OPERATOR_FLAGS, Engine, SpecError, parse_spec
from model_server.__main__ import build_parser, settings_from_args
from model_server.settings import ServerSettings, flag_name
from tests.strategies import from_schema
from testsupport.crd import ROOT, apply_defaults, crd_schema

# The model server's examples; a vllm-engine service runs vLLM, whose command line is held to
# vLLM's own parser (tests/llm).
EXAMPLES = [
    p
    for p in sorted((ROOT / "examples").glob("*.yaml"))
    if yaml.safe_load(p.read_text())["spec"].get("runtime", {}).get("engine", Engine.MODEL_SERVER)
    == Engine.MODEL_SERVER
]
SPEC_SCHEMA = crd_schema()["properties"]["spec"]


@pytest.fixture(autouse=True)
def no_server_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the command line may decide here, not MODEL_SERVER_* variables of the test run."""
    import os

    for key in list(os.environ):
        if key.startswith("MODEL_SERVER_") or key == "MODEL_NAME":
            monkeypatch.delenv(key)


def intended(owner: Owner) -> dict[str, object]:
    """The setting each part of the spec is meant to become in the server, by field name."""
    spec = owner.spec
    runtime, batching = spec.runtime, spec.runtime.batching
    values: dict[str, object] = {
        "model": Path(MODEL_DIR),
        "model_name": owner.model_name,
        "format": spec.model.format.value,
        "port": runtime.port,
        "metrics_port": runtime.metrics_port,
        "providers": [p.value for p in runtime.execution_providers],
        "max_batch_size": batching.max_batch_size,
        "max_delay_ms": batching.max_delay_ms,
        "max_queue": batching.max_queue,
        # The preStop sleep is the delay's first second (the kubelet's SIGTERM comes after it).
        "shutdown_delay_s": SHUTDOWN_DELAY_SECONDS - PRE_STOP_SLEEP_SECONDS,
        "drain_timeout_s": DRAIN_TIMEOUT_SECONDS,
    }
    if spec.model.version:
        values["model_version"] = spec.model.version
    if runtime.grpc_port is not None:
        values["grpc_port"] = runtime.grpc_port
    if runtime.tracing is not None:
        values["otlp_traces_endpoint"] = runtime.tracing.endpoint
        values["trace_sample_ratio"] = runtime.tracing.sampling_ratio
    return values


def parse(args: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"the model server refuses the operator's command line: {args}")


def assert_server_reads_what_the_operator_means(owner: Owner) -> ServerSettings:
    args = server_args(service_values(owner), MODEL_DIR)
    parsed = parse(args)
    expected = intended(owner)
    given_fields = {field for field in vars(parsed) if field != "command"}
    extra = {flag_name(f) for f in given_fields - set(expected)} | {flag_name(f) for f in set(expected) - given_fields}
    assert given_fields == set(expected), f"flags read as another setting, or missing: {sorted(extra)}"
    server = settings_from_args(parsed)
    for field, value in expected.items():
        assert getattr(server, field) == value, f"--{flag_name(field)}: {getattr(server, field)!r} != {value!r}"
    return server


def owner_for(spec: dict, name: str = "svc") -> Owner:
    return Owner(name=name, namespace="ml", uid="u-1", spec=parse_spec(apply_defaults(SPEC_SCHEMA, spec)))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_command_line_parses_to_the_intended_settings(path: Path) -> None:
    cr = yaml.safe_load(path.read_text())
    assert_server_reads_what_the_operator_means(owner_for(cr["spec"], cr["metadata"]["name"]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(from_schema(SPEC_SCHEMA))
def test_generated_specs_command_line_parses_to_the_intended_settings(spec: dict) -> None:
    spec.setdefault("runtime", {})["args"] = []  # the user's own extra flags are tested below
    try:
        owner = owner_for(spec)
    except SpecError:
        reject()  # refused by a CEL rule: never reaches the builder
    if owner.spec.runtime.engine != Engine.MODEL_SERVER:
        reject()  # runs vLLM, not the model server
    assert_server_reads_what_the_operator_means(owner)


def test_the_users_extra_args_reach_the_server() -> None:
    spec = yaml.safe_load((ROOT / "examples" / "resnet-2gpu.yaml").read_text())["spec"]
    spec["runtime"]["args"] = ["--batch-workers", "2", "--no-warmup"]
    server = settings_from_args(parse(server_args(service_values(owner_for(spec)), MODEL_DIR)))
    assert (server.batch_workers, server.warmup) == (2, False)


def test_the_user_may_not_override_a_flag_the_operator_writes() -> None:
    # runtime.args is refused (CEL and model) when it names one of OPERATOR_FLAGS: every flag
    # server_args writes must be on that list, or a user could silently override it.
    for path in EXAMPLES:
        cr = yaml.safe_load(path.read_text())
        written = {
            arg
            for arg in server_args(service_values(owner_for(cr["spec"], cr["metadata"]["name"])), MODEL_DIR)
            if arg.startswith("--")
        }
        assert written <= set(OPERATOR_FLAGS), sorted(written - set(OPERATOR_FLAGS))


def test_the_user_cannot_override_a_flag_the_operator_sets() -> None:
    """`--max-queue` is spec.runtime.batching.maxQueue: the schema refuses it in runtime.args."""
    spec = yaml.safe_load((ROOT / "examples" / "resnet-2gpu.yaml").read_text())["spec"]
    spec["runtime"]["args"] = ["--max-queue", "7"]
    with pytest.raises(SpecError, match="runtime.args must not set the flags the operator sets"):
        owner_for(spec)


def test_a_flag_the_server_does_not_know_is_refused() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "m.onnx", "--max-batch", "4"])
