"""The operator's one configuration: read from flags and environment once, checked at start,
passed down; no other operator module reads the environment, and none writes it."""

from __future__ import annotations

import ast
import os
import pathlib

import kopf
import pytest

from inference_operator import config, settings
from inference_operator.__main__ import main
from inference_operator.models import DEFAULT_IMAGE, ENGINES, Engine, GpuAllocation, parse_spec
from inference_operator.settings import Images

MODEL_SERVER_IMAGE_ENV = ENGINES[Engine.MODEL_SERVER].image.env
VLLM_IMAGE_ENV = ENGINES[Engine.VLLM].image.env

PACKAGE = pathlib.Path(config.__file__).parent


def test_every_setting_comes_from_the_environment_it_is_given() -> None:
    environ = {
        VLLM_IMAGE_ENV: "mirror.example/vllm:1",
        settings.ALLOCATION_ENV: "dra",
        settings.FETCH_HTTPS_PROXY_ENV: "http://proxy.internal:3128",
        settings.PROMETHEUS_ALLOWED_URLS_ENV: "https://prom.example",
        settings.SERVICE_ACCOUNTS_ENV: "default,inference",
        settings.PEERING_LIFETIME_ENV: "15",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBECONFIG": "/etc/kube/config",
    }
    loaded = config.OperatorConfig.from_environ(environ, {Engine.MODEL_SERVER: "flag.example/ms:2", Engine.VLLM: None})
    # the flag wins
    assert loaded.images == Images({Engine.MODEL_SERVER: "flag.example/ms:2", Engine.VLLM: "mirror.example/vllm:1"})
    assert loaded.gpu.allocation == GpuAllocation.DRA
    assert loaded.fetch.https_proxy == "http://proxy.internal:3128"
    assert loaded.credentials.allowed_urls == ("https://prom.example",)
    assert loaded.pod_policy.service_accounts == ("default", "inference")
    # Registries default to those of the operator's images, the flag's included.
    assert loaded.pod_policy.image_registries == ("flag.example/", "mirror.example/")
    assert loaded.peering.lifetime == 15
    assert (loaded.api_server, loaded.kubeconfig) == ("https://10.96.0.1:443", "/etc/kube/config")

    owner = loaded.owner("m", "ml", "u-1", parse_spec({"model": {"uri": "pvc://m/x"}}))
    assert (owner.images, owner.gpu_defaults, owner.fetch) == (loaded.images, loaded.gpu, loaded.fetch)


def test_nothing_configured_is_the_built_in_defaults() -> None:
    empty = config.OperatorConfig.from_environ({})
    assert empty == config.OperatorConfig()
    assert empty.images.serving(Engine.MODEL_SERVER) == empty.images.fetcher == DEFAULT_IMAGE
    assert empty.pod_policy.image_registries == ("ghcr.io/rocm-inference/", "docker.io/vllm/")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (settings.ALLOCATION_ENV, "nvidia"),
        (settings.SUPPLEMENTAL_GROUPS_ENV, "video"),
        (settings.FETCH_HTTPS_PROXY_ENV, "socks5://proxy"),
        (settings.PROMETHEUS_ALLOWED_URLS_ENV, "https://user:pass@prometheus:9090"),
        (settings.ALLOW_TOKEN_ENV, "maybe"),
        (settings.PEERING_PRIORITY_ENV, "high"),
    ],
)
def test_a_bad_value_stops_run_at_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    monkeypatch.setattr(kopf, "run", lambda **_: pytest.fail("the operator started"))
    assert main(["run", "--all-namespaces"]) == 2
    assert variable in capsys.readouterr().err


def test_run_hands_its_configuration_to_the_handlers_without_touching_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(MODEL_SERVER_IMAGE_ENV, raising=False)
    started: dict = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: started.update(kwargs))
    monkeypatch.setattr("inference_operator.metrics.serve", lambda *_: None)
    assert main(["run", "--all-namespaces", "--model-server-image", "flag.example/ms:3"]) == 0
    assert started["memo"].config.images.serving(Engine.MODEL_SERVER) == "flag.example/ms:3"
    assert MODEL_SERVER_IMAGE_ENV not in os.environ


def _environment_uses(path: pathlib.Path) -> list[str]:
    """`os.environ` / `os.getenv` / `os.putenv` mentions in one module, as `file:line`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found.extend(f"{path.relative_to(PACKAGE)}:{node.lineno}" for alias in node.names if alias.name != "path")
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "putenv", "unsetenv")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_only_the_config_module_reads_the_environment() -> None:
    uses = [use for path in sorted(PACKAGE.rglob("*.py")) for use in _environment_uses(path)]
    assert [use.split(":")[0] for use in uses] == ["config.py"], uses
