"""Chart fixtures: the Helm engine, and an emulated cluster (tests/conftest.py) ready for it."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.chart import helm as helm_module
from testsupport.cluster import Cluster


@pytest.fixture
def helm() -> Any:
    """The Helm engine; its absence skips locally but fails in CI (CI is set there)."""
    if not helm_module.available():
        message = (
            "Helm is not installed: pip install --ignore-requires-python 'helm-sdkpy==0.1.32' (scripts/setup.sh does)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return helm_module


@pytest.fixture
def chart_cluster(cluster: Cluster, helm: Any) -> Cluster:
    """An emulated cluster ready for `helm install` of the chart."""
    helm_module.prepare(cluster)
    return cluster
