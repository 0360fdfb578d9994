"""Which services share a directory on a cache claim: only those that fetch the same URI from the
same endpoint as the same principal.

The directory was named after the URI alone, so a second service with the same hf://org/name
and its own mirror as `huggingFace.endpoint` fetched into the victim's directory. Content checks
make each fetch leave what its own endpoint publishes, but the victim's serving container reads
the directory after its fetch has ended: a later fetch from the mirror rewrote it under a running
model. The key now covers the endpoint and the credential's identity (never its value).
"""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import kubernetes_validate
import pytest

from inference_operator.builders import Owner, build_deployment
from inference_operator.models import parse_spec
from tests.llm.test_hf_fetch_wiring import mounted, rendered_pod, run_init_container
from tests.storage.test_model_fetch_hf import FILES, Hub, model_files, running_hub

K8S_VERSION = "1.33"


def subpath(model: dict[str, Any], env: list[dict[str, Any]] | None = None, service_account: str | None = None) -> str:
    spec: dict[str, Any] = {
        "model": {"name": "m", "cachePvc": "model-cache", **model},
        "runtime": {"engine": "vllm", "env": env or []},
        "resources": {"gpu": {"count": 1}},
    }
    if service_account:
        spec["scheduling"] = {"serviceAccountName": service_account}
    deployment = build_deployment(Owner(name="m", namespace="ml", uid="u-1", spec=parse_spec(copy.deepcopy(spec))))
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    init = next(c for c in pod["initContainers"] if c["name"] == "model-fetch")
    fetch = next(m for m in init["volumeMounts"] if m["name"] == "model-store")
    serve = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model-store")
    assert fetch["subPath"] == serve["subPath"]
    return str(serve["subPath"])


HF = {"uri": "hf://org/tiny"}
TOKEN = {"tokenSecret": "hf-token", "tokenKey": "token"}


def test_hub_services_share_a_directory_only_with_the_same_endpoint_and_token_secret() -> None:
    victim = subpath({**HF, "huggingFace": TOKEN})
    assert subpath({**HF, "huggingFace": {**TOKEN, "endpoint": "https://huggingface.co"}}) == victim  # the default
    others = [
        subpath({**HF, "huggingFace": {**TOKEN, "endpoint": "https://mirror.example"}}),
        subpath({**HF, "huggingFace": {**TOKEN, "tokenSecret": "other-token"}}),
        subpath({**HF, "huggingFace": {**TOKEN, "tokenKey": "other-key"}}),
        subpath(HF),  # anonymous
        subpath({"uri": "hf://org/tiny@v2", "huggingFace": TOKEN}),
    ]
    assert len({victim, *others}) == 1 + len(others)


S3 = {"uri": "s3://bucket/models/tiny"}
KEY_ID = {"name": "AWS_ACCESS_KEY_ID", "value": "AKIAVICTIM"}
SECRET = {"name": "AWS_SECRET_ACCESS_KEY", "value": "s3cr3t"}
ENDPOINT = {"name": "AWS_ENDPOINT_URL", "value": "https://minio.example"}


def test_s3_services_share_a_directory_only_with_the_same_endpoint_bucket_and_key_id() -> None:
    victim = subpath(S3, [KEY_ID, SECRET, ENDPOINT])
    assert subpath(S3, [ENDPOINT, KEY_ID, SECRET, {"name": "UNRELATED", "value": "x"}]) == victim
    # The secret key is no identity: another value of it names the same directory.
    assert subpath(S3, [KEY_ID, {"name": "AWS_SECRET_ACCESS_KEY", "value": "rotated"}, ENDPOINT]) == victim
    others = [
        subpath(S3, [KEY_ID, SECRET, {**ENDPOINT, "value": "https://attacker.example"}]),
        subpath(S3, [KEY_ID, SECRET, ENDPOINT, {"name": "AWS_ENDPOINT_URL_S3", "value": "https://attacker.example"}]),
        subpath(S3, [KEY_ID, SECRET]),  # AWS itself
        subpath(S3, [{"name": "AWS_ACCESS_KEY_ID", "value": "AKIAOTHER"}, SECRET, ENDPOINT]),
        subpath(S3, [KEY_ID, SECRET, ENDPOINT], service_account="reader"),  # a web identity
        subpath({"uri": "s3://other-bucket/models/tiny"}, [KEY_ID, SECRET, ENDPOINT]),
    ]
    assert len({victim, *others}) == 1 + len(others)
    assert "AKIA" not in victim and "s3cr3t" not in victim


@pytest.mark.parametrize(("outer", "inner"), [("s3://b/m", "s3://b/m/sub"), ("hf://org/a", "hf://org/a@main")])
def test_no_directory_is_inside_another(outer: str, inner: str) -> None:
    """A fetch removes what its source does not name: a key inside another's would be pruned."""
    a, b = subpath({"uri": outer}), subpath({"uri": inner})
    assert not b.startswith(a + "/") and not a.startswith(b + "/")


def test_a_mirrors_later_fetch_does_not_touch_the_model_the_victim_serves(hub: Hub, tmp_path: pathlib.Path) -> None:
    """The victim's init container fetched from the Hub and its model is being served; then the
    attacker's pod, same URI, same token Secret, its own mirror reporting the real commit, fetches
    onto the same claim. The victim's serving mount still holds exactly the Hub's files."""
    claim = tmp_path / "claim"
    victim = rendered_pod(hub.url)

    def run(pod: dict[str, Any], name: str) -> pathlib.Path:
        # The claim, and a directory of this pod's own for each of its other volumes.
        volumes = {v["name"]: tmp_path / f"{v['name']}-{name}" for v in pod["volumes"]} | {"model-store": claim}
        init = next(c for c in pod["initContainers"] if c["name"] == "model-fetch")
        result = run_init_container(init, volumes)
        assert result.returncode == 0, result.stderr[-2000:]
        serving = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model-store")
        return mounted(serving, volumes)

    served = run(victim, "victim")
    assert model_files(served) == FILES
    planted = {**FILES, "config.json": b'{"model_type": "evil!"}', "modeling_evil.py": b"import os"}
    with running_hub(planted) as mirror:
        attacker = run(rendered_pod(mirror.url), "attacker")
    assert model_files(attacker) == planted  # the attacker got what its own mirror publishes
    assert attacker != served
    assert model_files(served) == FILES
