"""What the stages of a reconcile share: the cluster a stage may read, what it is given, what it
gives back, and the hash that marks every desired manifest.

A reconcile is a pipeline over one desired set: what the spec asks (`reconcile.desired_objects`),
then each stage's transform of that set (`stages.PIPELINE`), then the applies and the one
label-selected prune. A stage is a function of (the cluster's reads, the service, the desired
set, the context) that returns a new desired set and what it reports. It writes nothing: the
reads it needs are the `Cluster` it is handed, so its transforms are tested with plain values
and the writes stay reconcile's.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..builders.common import SPEC_HASH_ANNOTATION, Owner
from ..jsontypes import JsonObject
from ..kinds import Kind
from ..rollout import RolloutState


def manifest_hash(obj: JsonObject) -> str:
    """A short digest of a desired manifest; any change to what we would send changes it."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def with_hash(obj: JsonObject) -> JsonObject:
    """`obj` carrying its manifest's hash: a live object with the same hash needs no write."""
    obj = copy.deepcopy(obj)
    digest = manifest_hash(obj)
    obj["metadata"].setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = digest
    return obj


def unhashed(obj: JsonObject) -> JsonObject:
    """A copy of `obj` without its hash, to be changed and marked again."""
    manifest = copy.deepcopy(obj)
    manifest["metadata"].get("annotations", {}).pop(SPEC_HASH_ANNOTATION, None)
    return manifest


def unmarked(obj: JsonObject) -> JsonObject:
    """The mark of a set that carries none (`render`): the object as it is."""
    return obj


class Cluster(Protocol):
    """What a stage may read of the cluster: the live object a desired one names, and whether
    an add-on's kind is served. Reconcile passes its API client's reads; a test, plain values."""

    def live(self, desired: JsonObject) -> JsonObject | None: ...

    def serves(self, kind: Kind) -> bool: ...


class NothingLive:
    """A cluster where nothing exists yet and every kind is served: what `render` and a new
    service's first reconcile see."""

    def live(self, desired: JsonObject) -> JsonObject | None:
        return None

    def serves(self, kind: Kind) -> bool:
        return True


@dataclass(frozen=True)
class Context:
    """What a stage is told besides the spec: the rollout as the status recorded it, the time,
    and the mark every object it makes or changes gets before it joins the set (the manifest's
    hash for a reconcile; `unmarked` for `render`)."""

    rollout: RolloutState | None = None
    now: float = 0.0
    mark: Callable[[JsonObject], JsonObject] = with_hash


@dataclass(frozen=True)
class Staged:
    """A stage's answer: the desired set after it, and what it reports (a canary: where its
    rollout stands, None where it has nothing to say)."""

    objects: list[JsonObject]
    rollout: RolloutState | None = None


Stage = Callable[[Cluster, Owner, list[JsonObject], Context], Staged]
