"""A credential the operator wires into a pod reaches only the platform's code, configured by
the platform: the model-fetch init container runs the operator's image, never the spec's, and
gets none of the spec's variables that steer where or how it connects or what it runs (only
AWS_* for the user's own bucket). Proxies and extra CAs come from the operator's settings."""

from __future__ import annotations

import pytest

from inference_operator.builders import Owner, build_deployment
from inference_operator.models import Engine, parse_spec
from inference_operator.settings import FetchSettings, Images, SettingsError

OPERATOR_IMAGE = "registry.example/platform/model-server:1.0"
HOSTILE_ENV = {
    "HTTPS_PROXY": "http://attacker:8080",
    "https_proxy": "http://attacker:8080",
    "HTTP_PROXY": "http://attacker:8080",
    "ALL_PROXY": "socks5://attacker:1080",
    "NO_PROXY": "",
    "SSL_CERT_FILE": "/mnt/models/evil-ca.pem",
    "SSL_CERT_DIR": "/mnt/models",
    "REQUESTS_CA_BUNDLE": "/mnt/models/evil-ca.pem",
    "CURL_CA_BUNDLE": "/mnt/models/evil-ca.pem",
    "PYTHONPATH": "/mnt/models",
    "PYTHONSTARTUP": "/mnt/models/steal.py",
    "LD_PRELOAD": "/mnt/models/steal.so",
    "HF_HUB_ENABLE_HF_TRANSFER": "1",
}


def pod(uri: str, image: str | None = "attacker/steal:latest", fetch: FetchSettings | None = None, **model) -> dict:
    spec = parse_spec(
        {
            "model": {"uri": uri, "name": "m", **model},
            "runtime": {
                **({"image": image} if image else {}),
                "env": [{"name": k, "value": v} for k, v in HOSTILE_ENV.items()]
                + [
                    {"name": "AWS_ACCESS_KEY_ID", "value": "AKIA-own"},
                    {"name": "TOKENIZERS_PARALLELISM", "value": "0"},
                ],
            },
            "resources": {"gpu": {"count": 0}},
        }
    )
    owner = Owner(
        name="m",
        namespace="ml",
        uid="u",
        spec=spec,
        images=Images({Engine.MODEL_SERVER: OPERATOR_IMAGE}),
        fetch=fetch or FetchSettings(),
    )
    return build_deployment(owner)["spec"]["template"]["spec"]


def fetch_container(spec: dict) -> dict:
    (init,) = spec["initContainers"]
    assert init["name"] == "model-fetch"
    return init


def env_names(container: dict) -> set[str]:
    return {var["name"] for var in container.get("env", [])}


@pytest.mark.parametrize(
    ("uri", "model"),
    [
        ("hf://org/tiny@main", {"huggingFace": {"tokenSecret": "hf-token"}}),
        ("https://models.example.com/m/model.onnx", {}),
        ("s3://bucket/m/", {}),
    ],
)
def test_the_fetch_container_runs_the_operators_image_without_the_specs_variables(uri: str, model: dict) -> None:
    spec = pod(uri, **model)
    fetch = fetch_container(spec)
    assert fetch["image"] == OPERATOR_IMAGE  # not attacker/steal
    assert not env_names(fetch) & set(HOSTILE_ENV), env_names(fetch)
    # The serving container is the author's own: their image and their variables, no credential.
    (serving,) = spec["containers"]
    assert serving["image"] == "attacker/steal:latest"
    assert set(HOSTILE_ENV) <= env_names(serving)
    assert not any("valueFrom" in var for var in serving["env"])


def test_only_the_fetch_container_gets_the_hub_token_and_only_there() -> None:
    spec = pod("hf://org/tiny@main", huggingFace={"tokenSecret": "hf-token"})
    holders = [
        c for c in spec["initContainers"] + spec["containers"] if any("valueFrom" in var for var in c.get("env", []))
    ]
    assert [c["name"] for c in holders] == ["model-fetch"]
    assert holders[0]["image"] == OPERATOR_IMAGE
    assert {"HF_TOKEN"} == {var["name"] for var in holders[0]["env"] if "valueFrom" in var}


def test_an_s3_fetch_takes_the_users_own_aws_variables_and_nothing_else() -> None:
    names = env_names(fetch_container(pod("s3://bucket/m/")))
    assert "AWS_ACCESS_KEY_ID" in names
    assert "TOKENIZERS_PARALLELISM" not in names
    assert "AWS_ACCESS_KEY_ID" not in env_names(fetch_container(pod("https://h/m.onnx")))


def test_the_platforms_proxy_and_ca_reach_the_fetch_container() -> None:
    settings = FetchSettings(
        https_proxy="http://proxy.infra:3128",
        no_proxy="minio.infra,.svc",
        ca_bundle="-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    env = {var["name"]: var["value"] for var in fetch_container(pod("https://h/m.onnx", fetch=settings))["env"]}
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://proxy.infra:3128"
    assert env["NO_PROXY"] == "minio.infra,.svc"
    assert env["MODEL_FETCH_CA_BUNDLE"] == settings.ca_bundle
    assert "HTTP_PROXY" not in env


def test_fetch_settings_from_the_environment() -> None:
    assert FetchSettings.from_env({}) == FetchSettings()
    settings = FetchSettings.from_env(
        {
            "INFERENCE_OPERATOR_FETCH_HTTPS_PROXY": "http://proxy:3128",
            "INFERENCE_OPERATOR_FETCH_NO_PROXY": "a,b",
            "INFERENCE_OPERATOR_FETCH_CA_BUNDLE": "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----",
        }
    )
    assert settings.https_proxy == "http://proxy:3128" and settings.no_proxy == "a,b"
    assert settings.ca_bundle.endswith("-----END CERTIFICATE-----\n")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("INFERENCE_OPERATOR_FETCH_HTTPS_PROXY", "proxy:3128"),
        ("INFERENCE_OPERATOR_FETCH_HTTP_PROXY", "http://proxy/path?x"),
        ("INFERENCE_OPERATOR_FETCH_NO_PROXY", "a, b"),
        ("INFERENCE_OPERATOR_FETCH_CA_BUNDLE", "not a certificate"),
        ("INFERENCE_OPERATOR_FETCH_CA_BUNDLE", "-----BEGIN CERTIFICATE-----" + "x" * 70_000),
    ],
)
def test_a_bad_fetch_setting_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        FetchSettings.from_env({name: value})
