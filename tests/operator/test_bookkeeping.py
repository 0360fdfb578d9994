"""What the operator writes for a service beyond the work itself: kopf's diff base kept in the
process, no kopf marker, one event per kind of change, and no read for a workload event that
brings nothing new (handlers/bookkeeping.py, shared.py, repair.py)."""

from __future__ import annotations

import logging

import kopf
import pytest

from inference_operator.builders.common import COMPONENT, OWNER_LABEL, SPEC_HASH_ANNOTATION
from inference_operator.handlers import pods, repair, service, shared
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


async def test_a_workload_event_at_a_version_already_seen_costs_no_read(cluster: Cluster) -> None:
    """The new Deployment's own ADDED event, after the reconcile recorded what it applied; and a
    relist's event of a workload whose last event was mirrored."""
    spec = {"model": {"uri": "pvc://models/m"}}
    isvc = {**ISVC_TYPE, "metadata": {"name": "m", "namespace": "ml"}}
    assert cluster.apply_cr({**isvc, "spec": spec}).status_code in (200, 201)
    api = CountingApi(cluster)
    uid = api.get(Ref.to(INFERENCE_SERVICE, "ml", "m"))["metadata"]["uid"]
    api.update_status(Ref.to(INFERENCE_SERVICE, "ml", "m"), lambda _: {"observedGeneration": 1, "selector": "a=b"})
    memo = kopf.Memo(api=api, seen_workloads=SeenWorkloads())
    owner = {**ISVC_TYPE, "name": "m", "uid": uid, "controller": True}
    labels = {"app.kubernetes.io/component": COMPONENT, "app.kubernetes.io/managed-by": MANAGER}
    annotations = {SPEC_HASH_ANNOTATION: "h"}

    async def event(version: str, name: str = "m") -> int:
        meta = {"name": name, "namespace": "ml", "resourceVersion": version, "ownerReferences": [owner]}
        body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**meta, "labels": labels}}
        body["metadata"]["annotations"] = annotations
        api.reads = 0
        await repair.owned_event(
            event={"type": "MODIFIED", "object": body}, body=kopf.Body(body), memo=memo, logger=logging.getLogger("t")
        )
        return api.reads

    memo.seen_workloads.saw(deployment("5"))  # as the reconcile that applied it records it
    assert await event("5") == 0
    assert await event("6") == 3  # news: the service, the workload and its pods are read
    assert await event("6") == 0  # mirrored: its relist is no news
    assert await event("6", name="m-canary") == 3  # a canary arm's event is always mirrored


def test_only_an_inference_services_essence_is_built_other_kinds_are_never_diffed() -> None:
    storage = ProcessDiffBaseStorage(prefix=PREFIX)
    deployment_body = kopf.Body({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {}, "spec": {"x": 1}})
    assert storage.build(body=deployment_body) == {}
    assert storage.build(body=body())["spec"] == {"replicas": 1}


def test_clearing_progress_returns_the_fresh_essence_it_was_given() -> None:
    storage = ProcessDiffBaseStorage(prefix=PREFIX)
    essence = storage.build(body=body(annotations={f"{PREFIX}/reconcile_service": "{}", "team": "a"}))
    assert UnmarkedProgressStorage(prefix=PREFIX).clear(essence=essence) is essence
    assert essence["metadata"]["annotations"] == {"team": "a"}  # progress was left out when built


def owned(kind: str, name: str = "m", version: str = "5", annotations: dict | None = None) -> kopf.Body:
    owner = {**ISVC_TYPE, "name": "m", "uid": "u", "controller": True}
    labels = {"app.kubernetes.io/component": COMPONENT}
    meta = {"name": name, "namespace": "ml", "resourceVersion": version, "ownerReferences": [owner], "labels": labels}
    meta["annotations"] = {SPEC_HASH_ANNOTATION: "h"} if annotations is None else annotations
    return kopf.Body({"apiVersion": "v1", "kind": kind, "metadata": meta})


def test_kopf_hands_owned_events_to_the_handler_only_when_they_need_a_look() -> None:
    memo = kopf.Memo(seen_workloads=SeenWorkloads())
    look = lambda kind, event="MODIFIED", **kw: repair.needs_a_look(event, owned(kind, **kw), memo)  # noqa: E731
    assert not look("Service")  # the operator's own write coming back
    assert look("Service", event="DELETED") and look("Service", annotations={})  # recreate; repair
    assert look("Deployment")  # a workload's news: mirrored
    memo.seen_workloads.saw(owned("Deployment"))
    assert not look("Deployment") and look("Deployment", version="6")
    assert look("Deployment", name="m-canary")  # a canary arm's news is always looked at
    assert not repair.needs_a_look("MODIFIED", kopf.Body({"kind": "Service", "metadata": {}}), memo)  # not ours


def test_only_a_deletion_of_an_inference_service_reaches_its_deleted_handler() -> None:
    assert service._deleted("DELETED") and not service._deleted("MODIFIED") and not service._deleted(None)


async def test_news_a_handler_leaves_to_the_reconcile_under_way_is_deferred_to_it(cluster: Cluster) -> None:
    """A pod's trouble (or a workload's news) seen while the service's status is not yet written
    for its generation: the reconcile under way must read the pods, not write what it created."""
    spec = {"model": {"uri": "pvc://models/m"}}
    assert cluster.apply_cr({**ISVC_TYPE, "metadata": {"name": "m", "namespace": "ml"}, "spec": spec}).status_code < 300
    memo = kopf.Memo(api=CountingApi(cluster), seen_workloads=SeenWorkloads())
    failing = {"name": "model-fetch", "ready": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    labels = {OWNER_LABEL: "m", "app.kubernetes.io/component": COMPONENT}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "m-abc", "namespace": "ml", "labels": labels},
        "spec": {"initContainers": [{"name": "model-fetch"}], "containers": [{"name": "model-server"}]},
        "status": {"phase": "Pending", "initContainerStatuses": [failing]},
    }
    event = {"type": "ADDED", "object": body}
    await pods.pod_event(event=event, body=kopf.Body(body), memo=memo, logger=logging.getLogger("t"))
    assert memo.seen_workloads.take_deferred("ml", "m")
    assert not memo.seen_workloads.take_deferred("ml", "m")  # taken once
    memo.seen_workloads.defer("ml", "m")
    memo.seen_workloads.forget("ml", "m")
    assert not memo.seen_workloads.take_deferred("ml", "m")
