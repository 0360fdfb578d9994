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
class ClusterEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with uid/resourceVersion/generation, status subresources and validation."""

    writes: collections.Counter = attrs.field(factory=collections.Counter, init=False)
    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)

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
