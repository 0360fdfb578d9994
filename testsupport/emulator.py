"""A Kubernetes API emulator for integration tests: kmock's, plus what this operator relies on.

kmock's `KubernetesEmulator` stores objects and serves list/watch/get/create/patch/delete, but
keeps objects as plain merged JSON. Real API servers do more, and the operator depends on it:

- `metadata.uid`, `creationTimestamp` and `resourceVersion` on every write;
- `metadata.generation`, bumped only when `spec` changes (observedGeneration depends on it);
- the status subresource: a PATCH of the object ignores `status`, a PATCH of `/status` only
  changes `status`, and neither bumps the generation;
- `metadata.generateName` on create (kopf names its events that way);
- validation of InferenceServices against the CRD's openAPIV3Schema (jsonschema; CEL rules
  are not evaluated), so an invalid object is refused with 422 as a real API server would.

It also counts writes per resource, which the tests use to prove that a resync writes nothing.

Request handling costs O(1) in the length of the request history (`HistoryFreeDispatch`).
kmock keeps every request for assertions, and decides which reaction answers a request by
asking each reaction's view whether it contains the request — which replays the whole history
through the view's filters, for every reaction, on every request. With ~20 reactions (the
emulator's own fallbacks) a run of 50 InferenceServices took 26 s and 200 took 358 s. Here a
request is matched against the view chain directly: a filter checks its criteria on this one
request, a slice keeps a running count of the requests its source has seen (counted once from
history when first met, then incremented), groups and exclusions combine their parts; only a
view kind this module does not know falls back to kmock's history replay. The history itself
is still kept, so `len(view)` and assertions on requests work as before. Reads, patches and
deletes find their object by key instead of scanning every stored object.
"""

from __future__ import annotations

import collections
import copy
import datetime
import itertools
import uuid
from typing import Any

import attrs
import kmock
from kmock._internal import dicts

from testsupport.crd import schema_errors

CR_RESOURCE = "inference.rocm.dev/v1alpha1/inferenceservices"


class HistoryFreeDispatch(kmock.RawHandler):
    """kmock's request → reaction matching, with the cost independent of the request history.

    Placed between kmock's KubernetesEmulator and RawHandler in the MRO, so the emulator's
    storage runs as before and only the matching step is replaced. Same answers as kmock's
    `request in reaction._source`: see the module docstring for how each view kind is decided.
    The concrete (attrs, slotted) class provides the state: `_slice_counts` (id of a slice
    view → (view, requests its source has seen)) and `_order_cache` (payload ids, their order).
    """

    _slice_counts: dict[int, tuple[kmock.View, int]]
    _order_cache: tuple[tuple[int, ...], list[kmock.Reaction]]

    __slots__ = ()

    async def _handle(self, request: kmock.Request) -> Any:
        seen: dict[int, bool] = {}
        payloads: list[kmock.Reaction] = list(self._payloads)
        # Every slice must count every request its source sees, whichever reaction answers it.
        for payload in payloads:
            self._sees(payload._source, request, seen)
        for payload in self._ordered(payloads):
            if self._sees(payload._source, request, seen) and not payload._disabled.is_set():
                try:
                    return await payload(request)
                except kmock.ReactionMismatchError:  # mismatch or depletion, as in kmock
                    payload._disabled.set()
                except NotImplementedError:  # matched, nothing to respond with
                    pass
        raise NotImplementedError("no reaction matches the request; add a fallback: `kmock.fallback << 404`")

    def _ordered(self, payloads: list[kmock.Reaction]) -> list[kmock.Reaction]:
        """kmock's priority order (higher first, zero-padded tuples, stable), cached per payload set."""
        ids = tuple(map(id, payloads))
        if self._order_cache[0] == ids:
            return self._order_cache[1]
        priorities = [tuple(-p for p in payload.priorities) for payload in payloads]
        width = max((len(p) for p in priorities), default=0)
        padded = [p + (0,) * (width - len(p)) for p in priorities]
        order = sorted(range(len(payloads)), key=lambda i: padded[i])
        result = [payloads[i] for i in order]
        self._order_cache = (ids, result)
        return result

    def _sees(self, view: kmock.View, request: kmock.Request, seen: dict[int, bool]) -> bool:
        """Whether `request` (the newest in history) is among the requests `view` yields."""
        key = id(view)
        if key in seen:
            return seen[key]
        result: bool
        if isinstance(view, kmock.Root):
            result = view is self
        elif type(view) is kmock.Filter:
            result = self._sees(view._source, request, seen) and bool(view.criteria(request))
        elif type(view) is kmock.Priority:
            result = self._sees(view._source, request, seen)
        elif type(view) is kmock.Slicer:
            inner = self._sees(view._source, request, seen)
            counted = self._slice_counts.get(key)
            if counted is None or counted[0] is not view:
                count = len(list(view._source))  # once per slice: history up to and including this request
            else:
                count = counted[1] + inner
            self._slice_counts[key] = (view, count)
            result = inner and (count - 1) in range(count)[view.s]
        elif type(view) is kmock.OrGroup:
            result = any([self._sees(source, request, seen) for source in view._sources])
        elif type(view) is kmock.AndGroup:
            result = all([self._sees(source, request, seen) for source in view._sources])
        elif type(view) is kmock.Exclusion:
            excluded = any([self._sees(source, request, seen) for source in view._exclusions])
            result = self._sees(view._source, request, seen) and not excluded
        elif type(view) is kmock.Stream:
            result = self._sees(view._source, request, seen) and bool(request._stream_bus.consumer_count)
        else:  # a view kind not known here: kmock's own (history-replaying) answer
            result = request in view
        seen[key] = result
        return result


def declare(
    emulator: kmock.KubernetesEmulator,
    key: str,
    kind: str,
    namespaced: bool = True,
    verbs: tuple[str, ...] = ("list", "watch", "get", "create", "patch", "update", "delete"),
    subresources: tuple[str, ...] = (),
) -> None:
    emulator.resources[key] = kmock.ResourceInfo(
        kind=kind, namespaced=namespaced, verbs=set(verbs), subresources=set(subresources)
    )


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator, HistoryFreeDispatch):
    """kmock's emulator with uid/resourceVersion/generation, status subresources and validation."""

    writes: collections.Counter = attrs.field(factory=collections.Counter, init=False)
    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _slice_counts: dict[int, tuple[kmock.View, int]] = attrs.field(factory=dict, init=False)
    _order_cache: tuple[tuple[int, ...], list[kmock.Reaction]] = attrs.field(default=((), []), init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # kopf's backbone, then everything the operator owns or posts.
        declare(self, "v1/namespaces", "Namespace", namespaced=False, verbs=("list", "watch", "get"))
        declare(
            self,
            "apiextensions.k8s.io/v1/customresourcedefinitions",
            "CustomResourceDefinition",
            namespaced=False,
            verbs=("list", "watch", "get"),
        )
        declare(self, "v1/events", "Event", verbs=("create",))
        declare(self, CR_RESOURCE, "InferenceService", subresources=("status", "scale"))
        declare(self, "apps/v1/deployments", "Deployment", subresources=("status", "scale"))
        declare(self, "v1/services", "Service", subresources=("status",))
        declare(self, "policy/v1/poddisruptionbudgets", "PodDisruptionBudget", subresources=("status",))
        declare(self, "coordination.k8s.io/v1/leases", "Lease")
        declare(self, "autoscaling/v2/horizontalpodautoscalers", "HorizontalPodAutoscaler", subresources=("status",))
        declare(self, "keda.sh/v1alpha1/scaledobjects", "ScaledObject", subresources=("status",))
        declare(self, "v1/secrets", "Secret")

    def _has_status(self, resource: Any) -> bool:
        info = self.resources.get(resource) if resource in self.resources else None
        return bool(info and "status" in info.subresources)

    async def _handle(self, request: kmock.Request) -> Any:
        action = request.action
        if request.resource is not None and action in (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE):
            sub = f"/{request.subresource}" if request.subresource else ""
            self.writes[f"{request.resource.plural}{sub}:{action.name.lower()}"] += 1
        if request.resource is not None and isinstance(request.data, dict):
            if action == kmock.action.CREATE:
                error = self._on_create(request)
                if error:
                    return await self._render_error(error)
            elif action == kmock.action.UPDATE and request.name is not None:
                error = self._on_update(request)
                if error:
                    return await self._render_error(error)
        return await super()._handle(request)

    def _stored(self, request: kmock.Request, name: str | None = None) -> Any:
        """The stored object a request addresses, by key (kmock scans every object)."""
        key = (request.resource, request.namespace, name or request.name)
        obj = self._objects._objects.get(key)  # noqa: SLF001
        return obj

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        obj = self._stored(request)
        if obj is None or obj.deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return obj.raw

    async def _serve_create(self, request: kmock.Request) -> Any:
        meta = request.data.get("metadata", {})
        key = (request.resource, request.namespace or meta.get("namespace"), meta.get("name"))
        return self._objects._objects[key].last.raw  # noqa: SLF001

    async def _serve_update(self, request: kmock.Request) -> Any:
        return self._stored(request).last.raw

    async def _serve_delete(self, request: kmock.Request) -> Any:
        return self._stored(request).last.raw

    def _stamp(self, data: dict) -> dict:
        meta = data.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._versions))
        return meta

    def _invalid(self, resource: Any, obj: dict) -> kmock.KubernetesError | None:
        if str(resource.plural) != "inferenceservices":
            return None
        errors = schema_errors(obj)
        if not errors:
            return None
        return kmock.KubernetesError(status=422, reason="Invalid", message=f"InferenceService is invalid: {errors[0]}")

    def _on_create(self, request: kmock.Request) -> kmock.KubernetesError | None:
        data = request.data
        if error := self._invalid(request.resource, data):
            return error
        meta = self._stamp(data)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta["generation"] = 1
        if self._has_status(request.resource):
            data.pop("status", None)
        return None

    def _on_update(self, request: kmock.Request) -> kmock.KubernetesError | None:
        data = request.data
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return None  # the emulator answers 404 itself
        current = copy.deepcopy(self.objects[key].raw)
        if self._has_status(request.resource):
            if request.subresource == "status":
                for field in list(data):
                    if field not in ("status", "metadata", "apiVersion", "kind"):
                        del data[field]
            else:
                data.pop("status", None)
        for field in ("uid", "creationTimestamp", "generation"):
            data.get("metadata", {}).pop(field, None)
        merged = dicts.patch_dict(current, data)
        # Like API servers with validation ratcheting, a status write is not refused for a
        # spec that was already stored: only what this request changes is judged.
        if request.subresource != "status" and (error := self._invalid(request.resource, merged)):
            return error
        meta = self._stamp(data)
        if merged.get("spec") != current.get("spec"):
            meta["generation"] = current.get("metadata", {}).get("generation", 1) + 1
        return None
