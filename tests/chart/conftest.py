"""Chart fixtures: the Helm engine, and an emulated cluster (tests/conftest.py) ready for it."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.chart import helm as helm_module
from testsupport.cluster import Cluster


def require_helm() -> None:
    """The Helm engine's absence skips locally but fails in CI (CI is set there)."""
    if not helm_module.available():
        message = (
            "Helm is not installed: pip install --ignore-requires-python 'helm-sdkpy==0.1.32' (scripts/setup.sh does)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def helm() -> Any:
    """The Helm engine (or a skip, or in CI a failure)."""
    require_helm()
    return helm_module


@pytest.fixture
def chart_cluster(cluster: Cluster, helm: Any) -> Cluster:
    """An emulated cluster ready for `helm install` of the chart."""
    helm_module.prepare(cluster)
    return cluster
