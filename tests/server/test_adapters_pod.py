"""The adapters sidecar as the rendered pod runs it: the test plays the kubelet (each volume a
local directory, the container's env and command from the Deployment, the image's own ENV
underneath) and plays the author's code in the vLLM container, which writes wherever vLLM may.

The sidecar holds the Hub token and the S3 keys: nothing the vLLM container can write may steer
it. boto3 is the real one (the image's `s3` extra); it cannot share the test venv with the
kubernetes client (their python-dateutil pins), so it is installed once beside the vLLM venv and
put on the sidecar's PYTHONPATH only.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from inference_operator.builders import Owner, build_all
from inference_operator.builders.adapters import CONFIG_KEY, LIST_VOLUME, SIDECAR
from inference_operator.models import parse_spec
from tests.http_stub import QuietHandler, serving
from testsupport.processes import free_port, stop, wait_http
from testsupport.vllm import local_path
from testsupport.waiting import eventually

ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "rocm-inference-operator"
S3_LIBS = CACHE / "s3-libs"
TOKEN = "hf_the_services_own_token"


@pytest.fixture(scope="session")
def s3_libs() -> pathlib.Path:
    """boto3 and its own packages (the rest are in the test venv already), installed once."""
    if not (S3_LIBS / "boto3" / "__init__.py").exists():
        packages = ["boto3", "botocore", "s3transfer", "jmespath"]
        install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(S3_LIBS)]
        subprocess.run([*install, *packages], check=True, timeout=600, capture_output=True)
    return S3_LIBS


def image_env() -> dict[str, str]:
    """The model-server image's ENV HOME (server/Dockerfile): what a container gets unless its
    own env says otherwise."""
    found = re.search(r"^\s*ENV HOME=(\S+)", (ROOT / "server" / "Dockerfile").read_text(), re.MULTILINE)
    assert found, "server/Dockerfile sets no HOME"
    return {"HOME": found.group(1)}


@dataclass
class Pod:
    volumes: dict[str, pathlib.Path]
    vllm: dict
    sidecar: dict
    sidecar_url: str
    process: subprocess.Popen[bytes]
    log: pathlib.Path

    def adapters(self) -> dict[str, dict]:
        answer = httpx.get(f"{self.sidecar_url}/adapters", timeout=5).json()
        return {a["name"]: a for a in answer["adapters"]}


@contextlib.contextmanager
def empty_vllm() -> Iterator[str]:
    """vLLM's /v1/models with no adapter loaded (nothing gets as far as loading here)."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            self.reply(json.dumps({"object": "list", "data": [{"id": "base", "parent": None}]}).encode())

    with serving(Handler) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}"


@contextlib.contextmanager
def pod(
    root: pathlib.Path,
    spec: dict,
    s3_libs: pathlib.Path,
    before_start: Callable[[list[pathlib.Path]], None] = lambda writable: None,
) -> Iterator[Pod]:
    """The rendered pod's adapters sidecar, started the way a kubelet would after
    `before_start` had the directories the vLLM container may write (the author's code runs in
    vLLM later, but what it writes stays: the sidecar restarts, reads again)."""
    objects = {obj["kind"]: obj for obj in build_all(Owner("llm", "ml", "uid-1", parse_spec(spec)))}
    template = objects["Deployment"]["spec"]["template"]["spec"]
    sidecar = next(c for c in template["initContainers"] if c["name"] == SIDECAR)
    volumes = {v["name"]: root / "volumes" / v["name"] for v in template["volumes"]}
    for local in volumes.values():
        local.mkdir(parents=True)
    (volumes[LIST_VOLUME] / CONFIG_KEY).write_text(objects["ConfigMap"]["data"][CONFIG_KEY])
    mounts = {m["mountPath"]: volumes[m["name"]] for m in sidecar["volumeMounts"]}
    env = image_env()
    for var in sidecar["env"]:
        env[var["name"]] = var["value"] if "value" in var else TOKEN  # a Secret's key: the token
    env = {name: local_path(value, mounts) for name, value in env.items()}
    env |= {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join([*sys.path, str(s3_libs)]),
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance metadata service to ask here
    }
    port = free_port()
    with empty_vllm() as engine_url:
        command = []
        for part in sidecar["command"]:
            flag, _, value = part.partition("=")
            if flag == "--engine":
                value = engine_url
            elif flag == "--port":
                value = str(port)
            command.append(f"{flag}={local_path(value, mounts)}" if value else part)
        command = [sys.executable if part == "python" else part for part in command]
        command += ["--host=127.0.0.1", "--interval=0.2"]
        vllm = template["containers"][0]
        before_start([volumes[m["name"]] for m in vllm["volumeMounts"] if not m.get("readOnly")])
        log = root / "sidecar.log"
        with log.open("wb") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        started = Pod(volumes, vllm, sidecar, f"http://127.0.0.1:{port}", process, log)
        try:
            wait_http(f"{started.sidecar_url}/health/live", started.process, timeout=30, log=started.log)
            yield started
        finally:
            stop(started.process)


def wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    eventually(condition, timeout=timeout, interval=0.1, what=what)


def s3_service(endpoint: str, adapters: dict[str, str]) -> dict:
    return {
        "model": {"uri": "hf://org/llama", "huggingFace": {"tokenSecret": "hub"}},
        "runtime": {
            "engine": "vllm",
            "env": [
                {"name": "AWS_ENDPOINT_URL", "value": endpoint},
                {"name": "AWS_REGION", "value": "us-east-1"},
            ],
        },
        "resources": {"gpu": {"count": 0}},
        "adapters": [{"name": name, "uri": uri} for name, uri in adapters.items()],
    }


def test_a_tool_configuration_planted_where_vllm_can_write_is_never_read_by_the_sidecar(
    tmp_path: pathlib.Path, s3_libs: pathlib.Path
) -> None:
    """The author's code writes an AWS config with a credential_process into every directory the
    vLLM container may write; the sidecar's S3 client must not run it (it would, with the Hub
    token in its environment)."""
    stolen = tmp_path / "stolen"
    thief = tmp_path / "thief.py"
    credentials = {"Version": 1, "AccessKeyId": "AKIAFAKE", "SecretAccessKey": "fake"}
    thief.write_text(
        "import os, pathlib, json\n"
        f"pathlib.Path({str(stolen)!r}).write_text(os.environ.get('HF_TOKEN', 'no token'))\n"
        f"print(json.dumps({credentials!r}))\n"
    )

    def plant(writable: list[pathlib.Path]) -> None:
        assert writable  # vLLM writes its /tmp, its caches
        for directory in writable:
            (directory / ".aws").mkdir()
            (directory / ".aws" / "config").write_text(f"[default]\ncredential_process = {sys.executable} {thief}\n")

    unreachable = f"http://127.0.0.1:{free_port()}"
    with pod(tmp_path, s3_service(unreachable, {"chat": "s3://bucket/chat"}), s3_libs, plant) as started:
        wait(
            lambda: started.process.poll() is not None or started.adapters()["chat"]["state"] == "Failed",
            60,
            "the s3:// adapter tried",
        )
        assert not stolen.exists(), f"the sidecar ran the planted credential_process: {stolen.read_text()!r}"
        assert started.process.poll() is None
        reason = started.adapters()["chat"]["reason"]
        assert "NoCredentialsError" in reason, reason  # it found no credentials: it read no planted config


@contextlib.contextmanager
def s3_refusing() -> Iterator[str]:
    """An S3 endpoint that knows no bucket `nobucket-*` and lets nobody read `denied-*`."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            bucket = self.path.lstrip("/").split("/", 1)[0].split("?", 1)[0]
            code, status = ("NoSuchBucket", 404) if bucket.startswith("nobucket") else ("AccessDenied", 403)
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{code} for '
                f"{bucket} at {html.escape(self.path)}: INTERNAL-ANSWER</Message><BucketName>{bucket}</BucketName>"
                "</Error>"
            )
            self.reply(body.encode(), "application/xml", status)

    with serving(Handler) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}"


def test_real_s3_errors_fail_their_adapter_with_a_reason_that_names_no_bucket_or_endpoint(
    tmp_path: pathlib.Path, s3_libs: pathlib.Path
) -> None:
    """botocore's ClientError (NoSuchBucket, AccessDenied) ended the sidecar's process; its
    message quotes the endpoint's answer, which the author (who picks the endpoint) must not
    read in status: only the error's code is kept."""
    with s3_refusing() as endpoint:
        spec = s3_service(endpoint, {"a": "s3://nobucket-corp/team-x/a", "b": "s3://denied-corp/team-x/b"})
        spec["runtime"]["env"] += [
            {"name": "AWS_ACCESS_KEY_ID", "value": "AKIAEXAMPLE"},
            {"name": "AWS_SECRET_ACCESS_KEY", "value": "secret"},
        ]
        with pod(tmp_path, spec, s3_libs) as started:
            wait(
                lambda: (
                    started.process.poll() is not None
                    or {a["state"] for a in started.adapters().values()} == {"Failed"}
                ),
                60,
                "both adapters tried",
            )
            assert started.process.poll() is None, started.log.read_text()[-2000:]
            reasons = {name: adapter["reason"] for name, adapter in started.adapters().items()}
    assert "NoSuchBucket" in reasons["a"] and "AccessDenied" in reasons["b"], reasons
    for reason in reasons.values():
        assert not any(leak in reason for leak in ("corp", "team-x", "127.0.0.1", endpoint, "INTERNAL")), reason
