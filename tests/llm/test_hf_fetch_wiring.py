"""The rendered model-fetch init container, run as a kubelet would, against a stand-in Hub.

Its command line and environment come from the Deployment the operator renders for an hf://
model with a token Secret, a mirror endpoint and a cache claim; the test resolves the
`secretKeyRef` and the claim's `subPath` as the kubelet does and runs the fetcher. The first
replica downloads the repository onto the claim; the second finds it there and downloads
nothing; the serving container's mount of the same claim sees the model.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from inference_operator.builders import Owner, build_deployment
from inference_operator.models import parse_spec
from tests.storage.test_model_fetch_hf import FILES, Hub, hub, model_files  # noqa: F401  (hub is a fixture)

SECRETS = {("hf-token", "token"): "hf_test_token"}


def rendered_pod(endpoint: str) -> dict:
    spec = parse_spec(
        {
            "model": {
                "uri": "hf://org/tiny@main",
                "name": "tiny",
                "huggingFace": {"tokenSecret": "hf-token", "endpoint": endpoint},
                "cachePvc": "model-cache",
            },
            "runtime": {"engine": "vllm"},
            "resources": {"gpu": {"count": 1}},
        }
    )
    return build_deployment(Owner(name="tiny", namespace="ml", uid="u-1", spec=spec))["spec"]["template"]["spec"]


def mounted(mount: dict, volumes: dict[str, pathlib.Path]) -> pathlib.Path:
    """Where a volumeMount lands on this machine: the volume's directory plus its subPath."""
    root = volumes[mount["name"]]
    return root / mount["subPath"] if mount.get("subPath") else root


def run_init_container(container: dict, volumes: dict[str, pathlib.Path]) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(sys.path)}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = SECRETS[ref["name"], ref["key"]]
    # The stand-in Hub speaks plain http on loopback: the fetcher sends a token there only when
    # told to (a spec cannot tell it; this is the test's own concession).
    env["MODEL_FETCH_ALLOW_HTTP_TOKEN"] = "true"
    paths = {m["mountPath"]: mounted(m, volumes) for m in container["volumeMounts"]}
    for path in paths.values():
        path.mkdir(parents=True, exist_ok=True)  # the kubelet creates a missing subPath
    # The pod's paths (/mnt/models, /tmp: HOME, HF_HOME and the other tools' paths) are this
    # machine's directories.
    env = {name: str(paths["/tmp"]) + value[4:] if value.startswith("/tmp") else value for name, value in env.items()}
    command = [sys.executable if part == "python" else paths.get(part, part) for part in container["command"]]
    return subprocess.run([str(c) for c in command], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_replicas_fetch_an_hf_model_once_onto_the_cache_claim(hub: Hub, tmp_path: pathlib.Path) -> None:  # noqa: F811
    pod = rendered_pod(hub.url)
    claim = tmp_path / "claim"  # the ReadWriteMany volume both replicas mount
    for replica in range(2):
        volumes = {v["name"]: tmp_path / f"{v['name']}-{replica}" for v in pod["volumes"]} | {"model-store": claim}
        init = next(c for c in pod["initContainers"] if c["name"] == "model-fetch")
        hub.requests.clear()
        result = run_init_container(init, volumes)
        assert result.returncode == 0, result.stderr[-2000:]
        downloads = hub.resolves("GET")
        assert len(downloads) == (len(FILES) if replica == 0 else 0), downloads
        # Every call to the Hub carried the Secret's token.
        assert {auth for _, _, auth in hub.requests} == {"Bearer hf_test_token"}
        serving_mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model-store")
        assert serving_mount["readOnly"] is True
        assert model_files(mounted(serving_mount, volumes)) == FILES
