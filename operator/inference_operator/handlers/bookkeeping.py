"""Where kopf keeps what it knows of each InferenceService: as little as possible on the object.

A new service cost 6 writes, 1 of them kopf's own patch of two annotations (bench/operator_scale.py):
- the diff base, the essence of the spec kopf last handled (what tells an update from a resume),
  a copy of the whole spec in the object's metadata. Kept in this process instead, it is lost when
  the process stops, harmlessly: kopf then sees every service as new, and the reconcile, which
  compares the cluster with the spec and not with a remembered spec, writes nothing where nothing
  changed. A spec changed while no operator ran is found the same way.
- `PREFIX/kopf-managed`, a marker kopf adds to every object it stores handler progress for, even
  when the handler succeeded at once and the progress is purged in the same patch. It tells other
  kopf operators to leave our annotations out of their diffs; none handles InferenceServices, and
  the diff base here leaves them out of ours. Progress itself stays in annotations: it is written
  only while a handler is retried.

And what the operator already knows of each service's workload (`SeenWorkloads`), so that a
Deployment's event it caused itself costs no read.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any, cast

import kopf

from ..jsontypes import JsonObject

# What earlier versions kept on every object; removed once, with the first handling after an upgrade.
LEGACY_KEY = "last-handled-configuration"
# Not part of an essence, as kopf builds it.
NOT_ESSENCE = frozenset({"apiVersion", "kind", "metadata", "status"})
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


class UnmarkedProgressStorage(kopf.AnnotationsProgressStorage):
    """kopf's annotations progress storage without the marker (see the module's doc)."""

    def _store_marker(self, prefix: str, patch: kopf.Patch, body: kopf.Body) -> None:
        return None


class ProcessDiffBaseStorage(kopf.DiffBaseStorage):
    """Essences by object uid, as compact JSON (a few hundred bytes per service)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self._legacy = kopf.AnnotationsDiffBaseStorage(prefix=prefix, key=LEGACY_KEY)
        self._essences: dict[str, str] = {}

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        """kopf's essence (all but metadata and status, with the labels and annotations) less the
        operator's own annotations (a rollout command, kopf's progress on a retry, an earlier
        version's diff base): none of them is the spec. Built from those parts alone: kopf's own
        build copies the whole object first, status and managedFields too, on every event."""
        essence: dict[str, Any]
        if extra_fields or self.ignored_fields:  # no handler of ours asks for either
            essence = dict(super().build(body=body, extra_fields=extra_fields))
        else:
            essence = {key: copy.deepcopy(value) for key, value in body.items() if key not in NOT_ESSENCE}
            metadata = body.get("metadata") or {}
            kept = {name: dict(metadata[name]) for name in ("labels", "annotations") if metadata.get(name)}
            if kept:
                essence["metadata"] = kept
        annotations = essence.get("metadata", {}).get("annotations", {})
        ignored = {*self._detect_marked_prefixes(annotations), self.prefix}
        dropped = {key for key in annotations if key == LAST_APPLIED or key.partition("/")[0] in ignored and "/" in key}
        result = cast(kopf.BodyEssence, essence)
        self.remove_annotations(result, dropped)
        self.remove_empty_stanzas(result)
        return result

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        stored = self._essences.get(body.metadata.uid or "")
        return None if stored is None else json.loads(stored)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        self._essences[body.metadata.uid or ""] = json.dumps(essence, separators=(",", ":"))
        for key in self._legacy.make_keys(LEGACY_KEY, body=body):
            if key in body.metadata.annotations:
                patch.metadata.annotations[key] = None

    def forget(self, uid: str) -> None:
        """The object is gone: its essence goes too (one per service ever seen would stay)."""
        self._essences.pop(uid, None)

    def __len__(self) -> int:
        return len(self._essences)


class SeenWorkloads:
    """The resourceVersion of each service's workload (Deployment or LeaderWorkerSet) as the
    operator last applied it or mirrored it into the service's status.

    A workload event at that version has no news: the reconcile that applied it reads the workload
    again for its status write (and is retried until that write is done), and a mirrored event's
    write is done. Skipping it saves the service read a mirror starts with (a new service's
    Deployment's ADDED event, bench/operator_scale.py) and, on a watch's relist, every unchanged
    workload's. Lost on restart, harmlessly: every event is news again.
    """

    def __init__(self) -> None:
        # (namespace, name) -> (kind, resourceVersion): one workload per service at a time.
        self._versions: dict[tuple[str, str], tuple[str, str]] = {}

    def saw(self, workload: JsonObject | None) -> None:
        """The status has (or the write under way will read) `workload` at its version."""
        if workload is not None and (version := workload["metadata"].get("resourceVersion")):
            meta = workload["metadata"]
            self._versions[meta["namespace"], meta["name"]] = (workload["kind"], version)

    def is_news(self, workload: JsonObject) -> bool:
        meta = workload["metadata"]
        version = meta.get("resourceVersion")
        return version is None or self._versions.get((meta["namespace"], meta["name"])) != (workload["kind"], version)

    def forget(self, namespace: str, name: str) -> None:
        """The service is gone: so is its workload's version."""
        self._versions.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._versions)
