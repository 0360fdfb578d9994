"""Compile caches (builders/compile_cache.py, model_server/caches.py): every cache a serving
container is told of is a directory it can write (its root filesystem is read-only), on the
cache claim in the service's own directory when there is one, and the model server makes them."""

from __future__ import annotations

import copy
import posixpath
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from inference_operator.builders import Owner, build_deployment
from inference_operator.builders.compile_cache import AITER, MIGRAPHX, MIOPEN, TRITON
from inference_operator.models import parse_spec
from model_server.caches import CACHE_VARIABLES, prepare_compile_caches
from testsupport.crd import apply_defaults, crd_schema

K8S_VERSION = "1.33.0"
CACHE_ENV = {**AITER, **MIOPEN, **TRITON, **MIGRAPHX}


def serving_container(engine: str, claim: bool, name: str = "svc") -> dict[str, Any]:
    uri = "hf://org/model" if engine == "vllm" else "s3://bucket/model/"
    spec: dict[str, Any] = {"model": {"uri": uri}, "runtime": {"engine": engine}, "resources": {"gpu": {"count": 1}}}
    if claim:
        spec["model"]["cachePvc"] = "models"
    parsed = parse_spec(apply_defaults(crd_schema()["properties"]["spec"], copy.deepcopy(spec)))
    deployment = build_deployment(Owner(name, "ml", "u-1", parsed))
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    container: dict[str, Any] = pod["containers"][0]
    container["_volumes"] = {v["name"]: v for v in pod["volumes"]}
    return container


def writable_mount(container: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The container's writable mount that holds `path`, if any (the deepest)."""
    holding = [
        m
        for m in container["volumeMounts"]
        if not m.get("readOnly") and (path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"))
    ]
    return max(holding, key=lambda m: len(m["mountPath"]), default=None)


@pytest.mark.parametrize("claim", [False, True], ids=["pod-tmp", "cache-claim"])
@pytest.mark.parametrize(
    ("engine", "expected"), [("vllm", AITER | MIOPEN | TRITON), ("modelServer", MIGRAPHX | MIOPEN)]
)
def test_every_compile_cache_is_a_writable_directory_of_the_service(engine: str, expected: dict, claim: bool) -> None:
    container = serving_container(engine, claim)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {name for name in env if name in CACHE_ENV} == set(expected)
    for name in expected:
        path = posixpath.normpath(env[name])
        mount = writable_mount(container, path)
        assert mount is not None, f"{name}={path} is on the read-only root filesystem"
        if claim:  # on the claim, in this service's own directory
            assert mount["name"] == "model-store" and mount["subPath"].endswith("-cache/svc"), mount
            assert "persistentVolumeClaim" in container["_volumes"][mount["name"]]
        else:
            assert mount["mountPath"] == "/tmp"  # the pod's volume: container restarts keep it


def test_two_services_on_one_claim_compile_into_directories_of_their_own() -> None:
    def sub_paths(name: str) -> set[str]:
        container = serving_container("vllm", True, name)
        return {
            m["subPath"] for m in container["volumeMounts"] if m["name"] == "model-store" and "cache" in m["subPath"]
        }

    assert sub_paths("a") and sub_paths("a").isdisjoint(sub_paths("b"))


def test_the_model_server_makes_its_cache_directories(tmp_path: Path) -> None:
    environ = {name: str(tmp_path / "cache" / name.lower()) for name in CACHE_VARIABLES}
    environ["MIOPEN_CUSTOM_CACHE_DIR"] = environ["MIOPEN_USER_DB_PATH"]  # the same, as the operator sets them
    made = prepare_compile_caches(environ)
    assert all(path.is_dir() for path in made) and len(made) == len(CACHE_VARIABLES)
    assert prepare_compile_caches(environ) == made  # again: nothing to do, nothing fails


def test_a_cache_that_cannot_be_made_is_skipped_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    made = prepare_compile_caches(
        {"ORT_MIGRAPHX_MODEL_CACHE_PATH": str(blocker / "migraphx"), "MIOPEN_USER_DB_PATH": str(tmp_path / "m")}
    )
    assert made == [tmp_path / "m"]
