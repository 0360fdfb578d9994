"""What the operator writes for a service beyond the work itself: kopf's diff base kept in the
process, no kopf marker, and one event per kind of change (handlers/bookkeeping.py, shared.py)."""

from __future__ import annotations

import kopf
import pytest

from inference_operator.handlers import shared
from inference_operator.handlers.bookkeeping import LEGACY_KEY, ProcessDiffBaseStorage, UnmarkedProgressStorage
from inference_operator.reconcile import Action, Change

PREFIX = "inference.rocm.dev"


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
