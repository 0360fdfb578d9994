"""KubeApi.update_status decided on the copy a watch event brought (`known`): one read fewer when
the copy is current, never a stale write or a stale "nothing to change" (against the emulator,
which keeps resourceVersions and refuses a stale guard with 409 as the API server does)."""

from __future__ import annotations

import pytest

from inference_operator.k8s import Ref
from inference_operator.kinds import INFERENCE_SERVICE
from testsupport.cluster import Cluster, CountingApi

REF = Ref.to(INFERENCE_SERVICE, "ml", "m")


@pytest.fixture
def api(cluster: Cluster) -> CountingApi:
    obj = {"apiVersion": "inference.rocm.dev/v1alpha1", "kind": "InferenceService"}
    spec = {"model": {"uri": "pvc://models/m"}}
    response = cluster.apply_cr({**obj, "metadata": {"name": "m", "namespace": "ml"}, "spec": spec})
    assert response.status_code in (200, 201), response.text
    return CountingApi(cluster)


def set_url(url: str):
    return lambda obj: None if (obj.get("status") or {}).get("url") == url else {"url": url}


def test_a_current_copy_is_decided_on_without_a_read(api: CountingApi) -> None:
    known = api.get(REF)
    api.reads = 0
    _, written = api.update_status(REF, set_url("http://a"), known=known)
    assert written == {"url": "http://a"} and api.reads == 0
    assert api.get(REF)["status"]["url"] == "http://a"


def test_a_stale_copy_is_refused_by_the_guard_then_decided_again_on_a_read(api: CountingApi) -> None:
    stale = api.get(REF)
    api.update_status(REF, set_url("http://other-writer"))
    seen: list[str | None] = []

    def append_condition(obj: dict) -> dict:
        seen.append((obj.get("status") or {}).get("url"))
        return {"conditions": [{"type": "Ready", "status": "False"}]}

    api.reads = 0
    api.update_status(REF, append_condition, known=stale)
    assert seen == [None, "http://other-writer"] and api.reads == 1  # the 409, then a fresh decision
    status = api.get(REF)["status"]
    assert status["url"] == "http://other-writer" and status["conditions"][0]["type"] == "Ready"


def clear_url(obj: dict) -> dict | None:
    return {"url": None} if (obj.get("status") or {}).get("url") else None


def test_nothing_to_change_is_only_believed_of_a_current_copy(api: CountingApi) -> None:
    stale = api.get(REF)
    api.update_status(REF, set_url("http://b"))  # the cluster moved on
    # Nothing to clear in the stale copy; a read finds the url, and it is cleared.
    _, written = api.update_status(REF, clear_url, known=stale)
    assert written == {"url": None} and "url" not in (api.get(REF).get("status") or {})
    # Nothing to clear in a current copy: one read confirms it, nothing is written.
    current = api.get(REF)
    api.reads = 0
    _, written = api.update_status(REF, clear_url, known=current)
    assert written == {} and api.reads == 1
