"""What the operator writes for a service beyond the work itself: kopf's diff base kept in the
process, no kopf marker, one event per kind of change, and no read for a workload event that
brings nothing new (handlers/bookkeeping.py, shared.py, repair.py)."""

from __future__ import annotations

import asyncio
import logging

import kopf
import pytest

from inference_operator import config
from inference_operator.builders.common import COMPONENT, SPEC_HASH_ANNOTATION
from inference_operator.handlers import repair, service, shared
from inference_operator.handlers.bookkeeping import (
    LEGACY_KEY,
    ProcessDiffBaseStorage,
    SeenWorkloads,
    UnmarkedProgressStorage,
)
from inference_operator.k8s import Ref
from inference_operator.kinds import INFERENCE_SERVICE
from inference_operator.reconcile import Action, Change
from inference_operator.settings import MANAGER
from testsupport.cluster import Cluster, CountingApi

PREFIX = "inference.rocm.dev"
ISVC_TYPE = {"apiVersion": f"{PREFIX}/v1alpha1", "kind": "InferenceService"}
DEPLOYMENTS = "apps/v1/deployments"


def body(uid: str = "u-1", annotations: dict[str, str] | None = None, replicas: int = 1) -> kopf.Body:
    return kopf.Body(
        {
            "apiVersion": f"{PREFIX}/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "m", "namespace": "ml", "uid": uid, "annotations": annotations or {}},
            "spec": {"replicas": replicas},
            "status": {"observedGeneration": 1},
        }
    )


def test_the_diff_base_is_the_spec_kopf_last_handled_kept_by_uid_until_forgotten() -> None:
    storage = ProcessDiffBaseStorage(PREFIX)
    assert storage.fetch(body=body()) is None  # never handled: kopf calls it new
    patch = kopf.Patch()
    storage.store(body=body(), patch=patch, essence=storage.build(body=body()))
    assert not patch  # nothing written to the object
    assert storage.fetch(body=body()) == {"spec": {"replicas": 1}}
    assert storage.fetch(body=body(uid="u-2")) is None
    assert storage.build(body=body(replicas=2)) != storage.fetch(body=body())  # a change kopf sees
    storage.forget("u-1")
    assert storage.fetch(body=body()) is None and len(storage) == 0


def test_the_operators_own_annotations_are_not_part_of_the_spec() -> None:
    """A rollout command, kopf's progress of a retry, an earlier version's diff base: none makes
    an update; a user's own annotation does."""
    storage = ProcessDiffBaseStorage(PREFIX)
    ours = {f"{PREFIX}/rollout": "promote", f"{PREFIX}/reconcile_service": "{}", f"{PREFIX}/{LEGACY_KEY}": "{}"}
    assert storage.build(body=body(annotations=ours)) == storage.build(body=body())
    assert storage.build(body=body(annotations={"team": "search"}))["metadata"] == {"annotations": {"team": "search"}}


def test_an_earlier_versions_diff_base_annotation_is_removed_with_the_first_handling() -> None:
    storage = ProcessDiffBaseStorage(PREFIX)
    old = body(annotations={f"{PREFIX}/{LEGACY_KEY}": '{"spec":{}}\n', "team": "search"})
    patch = kopf.Patch()
    storage.store(body=old, patch=patch, essence=storage.build(body=old))
    assert patch == {"metadata": {"annotations": {f"{PREFIX}/{LEGACY_KEY}": None}}}


def test_progress_is_stored_without_kopfs_marker() -> None:
    """kopf marks an object on every progress store, even one purged in the same patch: that
    marker alone was a write on every new service."""
    marked, unmarked = kopf.AnnotationsProgressStorage(prefix=PREFIX), UnmarkedProgressStorage(prefix=PREFIX)
    record: kopf.ProgressRecord = {"started": "2026-12-05T00:00:00", "retries": 1}
    patches = []
    for storage in (marked, unmarked):
        patch = kopf.Patch()
        storage.store(key=kopf.HandlerId("reconcile_service"), record=record, body=body(), patch=patch)
        patches.append(dict(patch["metadata"]["annotations"]))
    assert f"{PREFIX}/kopf-managed" in patches[0]  # what kopf alone would write
    assert patches[1] == {k: v for k, v in patches[0].items() if k != f"{PREFIX}/kopf-managed"} != {}


def test_a_reconcile_posts_one_event_per_kind_of_change_naming_every_object(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda _, *, type, reason, message: posted.append((reason, message)))
    shared.announce_writes(
        {"metadata": {}},
        [
            Change(Action.CREATED, "Deployment", "m"),
            Change(Action.UPDATED, "ConfigMap", "m-adapters"),
            Change(Action.CREATED, "Service", "m"),
        ],
    )
    assert posted == [
        ("Created", "Deployment m created, Service m created"),
        ("Updated", "ConfigMap m-adapters updated"),
    ]
    posted.clear()
    shared.announce_writes({"metadata": {}}, [])
    assert posted == []


@pytest.mark.parametrize(
    "annotations",
    [
        {},
        {"team": "search", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
        {"other.example/kopf-managed": "yes", "other.example/last-handled-configuration": "{}", "a/b": "c"},
        {f"{PREFIX}/rollout": "abort", "example.com/owner": "ml"},
    ],
)
@pytest.mark.parametrize("labels", [None, {}, {"app": "m"}])
def test_the_essence_is_kopfs_own_less_the_operators_annotations(annotations: dict, labels: dict | None) -> None:
    """Built from the spec, labels and annotations alone, it equals what kopf builds from a copy
    of the whole object (status and managedFields included)."""
    raw = dict(body(annotations=annotations))
    raw["metadata"] = {**raw["metadata"], "managedFields": [{"manager": "kubectl"}], "resourceVersion": "7"}
    if labels is not None:
        raw["metadata"]["labels"] = labels
    raw["spec"] = {"model": {"uri": "pvc://m"}, "adapters": [{"name": "a"}]}
    whole = kopf.Body(raw)
    expected = dict(kopf.StatusDiffBaseStorage().build(body=whole))
    ours = {k for k in (expected.get("metadata") or {}).get("annotations", {}) if k.startswith(f"{PREFIX}/")}
    for key in ours:
        del expected["metadata"]["annotations"][key]
    UnmarkedProgressStorage.remove_empty_stanzas(expected)  # type: ignore[arg-type]
    built = ProcessDiffBaseStorage(PREFIX).build(body=whole)
    assert built == expected
    built["spec"]["model"]["uri"] = "changed"  # a copy, not the object's own
    assert raw["spec"]["model"]["uri"] == "pvc://m"


# --------------------------------------------------------------------------- seen workloads


def deployment(version: str, kind: str = "Deployment", name: str = "m") -> dict:
    return {"kind": kind, "metadata": {"name": name, "namespace": "ml", "resourceVersion": version}}


def test_a_workload_version_once_seen_is_no_news_until_it_changes_or_is_forgotten() -> None:
    seen = SeenWorkloads()
    assert seen.is_news(deployment("5"))
    seen.saw(deployment("5"))
    seen.saw(None)  # a reconcile that left no workload (a missing add-on) records nothing
    assert not seen.is_news(deployment("5"))
    assert seen.is_news(deployment("6"))
    assert seen.is_news(deployment("5", kind="LeaderWorkerSet"))  # the service moved to groups
    assert seen.is_news(deployment("5", name="other"))
    assert seen.is_news({"kind": "Deployment", "metadata": {"name": "m", "namespace": "ml"}})
    seen.forget("ml", "m")
    assert seen.is_news(deployment("5")) and len(seen) == 0


def owned_deployment_event(owner: dict, version: str, name: str = "m") -> dict:
    labels = {"app.kubernetes.io/component": COMPONENT, "app.kubernetes.io/managed-by": MANAGER}
    meta = {"name": name, "namespace": "ml", "resourceVersion": version, "ownerReferences": [owner]}
    meta |= {"labels": labels, "annotations": {SPEC_HASH_ANNOTATION: "h"}}
    return {"type": "MODIFIED", "object": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta}}


async def owned_event_reads(memo: kopf.Memo, event: dict) -> int:
    memo.api.reads = 0
    await repair.owned_event(event=event, body=kopf.Body(event["object"]), memo=memo, logger=logging.getLogger("t"))
    return memo.api.reads


async def test_a_workload_event_at_a_version_already_seen_costs_no_read(cluster: Cluster) -> None:
    """An event at the version a reconcile applied, and a relist's event of a workload whose last
    event was mirrored, read nothing; news, and a canary arm's event, are mirrored."""
    spec = {"model": {"uri": "pvc://models/m"}}
    assert cluster.apply_cr({**ISVC_TYPE, "metadata": {"name": "m", "namespace": "ml"}, "spec": spec}).status_code < 300
    api = CountingApi(cluster)
    uid = api.get(Ref.to(INFERENCE_SERVICE, "ml", "m"))["metadata"]["uid"]
    api.update_status(Ref.to(INFERENCE_SERVICE, "ml", "m"), lambda _: {"observedGeneration": 1, "selector": "a=b"})
    memo = kopf.Memo(api=api, seen_workloads=SeenWorkloads(), status_locks=shared.StatusLocks())
    owner = {**ISVC_TYPE, "name": "m", "uid": uid, "controller": True}

    memo.seen_workloads.saw(deployment("5"))  # as the reconcile that applied it records it
    assert await owned_event_reads(memo, owned_deployment_event(owner, "5")) == 0
    assert await owned_event_reads(memo, owned_deployment_event(owner, "6")) == 3  # the service, workload, pods
    assert await owned_event_reads(memo, owned_deployment_event(owner, "6")) == 0  # mirrored: a relist is no news
    assert await owned_event_reads(memo, owned_deployment_event(owner, "6", name="m-canary")) == 3  # always looked at


def test_a_reconcile_records_the_workload_it_applied_so_that_its_event_reads_nothing(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new service's Deployment's own event, once the reconcile that created it has run."""
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)  # no operator to post them
    spec = {"model": {"uri": "pvc://models/m"}}
    assert cluster.apply_cr({**ISVC_TYPE, "metadata": {"name": "m", "namespace": "ml"}, "spec": spec}).status_code < 300
    memo = kopf.Memo(
        api=CountingApi(cluster),
        config=config.load(),
        seen_workloads=SeenWorkloads(),
        status_locks=shared.StatusLocks(),
    )
    isvc = memo.api.get(Ref.to(INFERENCE_SERVICE, "ml", "m"))
    service._reconcile_service(memo, kopf.Body(isvc), isvc["metadata"], logging.getLogger("t"))
    created = cluster.get(DEPLOYMENTS, "ml", "m")
    assert created is not None and not memo.seen_workloads.is_news(created)
    owner = created["metadata"]["ownerReferences"][0]
    event = owned_deployment_event(owner, created["metadata"]["resourceVersion"])
    assert asyncio.run(owned_event_reads(memo, event)) == 0
