"""The emulator decides which reaction answers a request without replaying the request history."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import httpx
import kmock
import pytest

from testsupport.cluster import Cluster, running_cluster

PODS = "/api/v1/namespaces/ml/pods"


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as cluster:
        kmock_resources = cluster.emulator.resources
        kmock_resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True, verbs={"list", "get", "create"})
        yield cluster


def get(cluster: Cluster, path: str) -> httpx.Response:
    return httpx.get(cluster.url + path, timeout=10)


def test_a_filter_judges_each_request_once(cluster: Cluster) -> None:
    # kmock asks every reaction whether its view contains the request by replaying the whole
    # history through the view's filters: n requests cost n·(n+1)/2 filter calls.
    calls: list[str] = []

    def never(request: kmock.Request) -> bool:
        calls.append(request.url.path)
        return False

    cluster.emulator[never] << 418
    n = 60
    for _ in range(n):
        assert get(cluster, PODS).status_code == 200
    assert len(calls) == n


def test_a_slice_counts_requests_made_before_and_after_it(cluster: Cluster) -> None:
    # The first matching request was before the reaction existed: [:2] has one left.
    assert get(cluster, PODS).status_code == 200
    cluster.emulator["get", PODS][:2] << 503
    assert get(cluster, "/api/v1/namespaces/other/pods").status_code == 200  # not in the slice's source
    statuses = [get(cluster, PODS).status_code for _ in range(3)]
    assert statuses == [503, 200, 200]


def test_groups_exclusions_and_slices_see_what_kmock_would(cluster: Cluster) -> None:
    api = cluster.emulator
    views = {
        "or": api["get", PODS] | api["get", "/api/v1/namespaces/b/pods"],
        "and": api["get"] & api[PODS],
        "minus": api["get"] - api[PODS],
        "slice of or": (api["get", PODS] | api["get", "/api/v1/namespaces/b/pods"])[1:3],
        "negative slice": api["get", PODS][-2:],
        "stepped slice": api["get"][::2],
    }
    paths = [PODS, "/api/v1/namespaces/b/pods", PODS, "/api/v1/namespaces/c/pods", PODS, PODS]
    for path in paths:
        get(cluster, path)
        request = list(api)[-1]
        for what, view in views.items():
            assert api._sees(view, request, {}) == (request in view), what  # noqa: SLF001
