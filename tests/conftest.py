"""Fixtures shared by every test directory: an emulated cluster and the real operator on it."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest
from kopf.testing import KopfRunner

from inference_operator.credentials import ANY_URL, ENV_ALLOWED_URLS
from inference_operator.policy import IMAGE_REGISTRIES_ENV
from testsupport.cluster import Cluster, running_cluster

# The tests' Prometheus servers listen on loopback ports, which the operator's default allow-list
# (in-cluster Services) refuses; tests of the list itself set it or pass a policy explicitly.
os.environ.setdefault(ENV_ALLOWED_URLS, ANY_URL)
# The platform's registries as the examples need them (their modelcars come from ghcr.io/example/);
# tests of the policy set their own.
os.environ.setdefault(IMAGE_REGISTRIES_ENV, "ghcr.io/rocm-inference/,ghcr.io/example/,docker.io/vllm/")


@pytest.fixture
def cluster(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as cluster:
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield cluster


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[KopfRunner]:
    """The real operator (kopf run) against the emulated cluster."""
    args = ["run", "--all-namespaces", "--standalone", "--verbose", "-m", "inference_operator.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        yield runner
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None, runner.exception
