"""Fixtures shared by every test directory: an emulated cluster and the real operator on it."""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Iterator

import pytest
from kopf.testing import KopfRunner

from inference_operator.settings import ANY_URL, IMAGE_REGISTRIES_ENV, PROMETHEUS_ALLOWED_URLS_ENV
from testsupport import nodecluster
from testsupport.cluster import Cluster, running_cluster

# The tests' Prometheus servers listen on loopback ports, which the operator's default allow-list
# (in-cluster Services) refuses; tests of the list itself set it or pass a policy explicitly.
os.environ.setdefault(PROMETHEUS_ALLOWED_URLS_ENV, ANY_URL)
# The platform's registries as the examples need them (their modelcars come from ghcr.io/example/);
# tests of the policy set their own.
os.environ.setdefault(IMAGE_REGISTRIES_ENV, "ghcr.io/rocm-inference/,ghcr.io/example/,docker.io/vllm/")


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what will not run
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked `proven_on_pods(module)` skips when that real-pods module runs in the same
    session: the same behaviour proven on real pods, without a second minute-long engine start
    on a 2-core machine. Wherever the tier cannot run, or is left out, the twin runs."""
    twins = [item for item in items if item.get_closest_marker("proven_on_pods")]
    if not twins or nodecluster.missing() is not None:
        return
    running = {str(item.path.relative_to(item.config.rootpath)) for item in items}
    for item in twins:
        (module,) = item.get_closest_marker("proven_on_pods").args  # type: ignore[union-attr]
        if module in running:
            item.add_marker(pytest.mark.skip(reason=f"proven on real pods in this run: {module}"))


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


@pytest.fixture(autouse=True)
def root_logger_as_it_was() -> Iterator[None]:
    """Each test leaves the root logger as it found it. A KopfRunner (kopf's `configure`) sets it
    to DEBUG or INFO with a stderr handler of its own, for the rest of the process: every later
    test then formatted every library's debug lines (300 gRPC heads took 177 s in hpack's)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = [h for h in root.handlers if h in handlers or type(h).__module__.startswith("_pytest")]
