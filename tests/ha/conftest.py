from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from tests.cluster import Cluster, running_cluster


@pytest.fixture
def cluster(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as cluster:
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield cluster
