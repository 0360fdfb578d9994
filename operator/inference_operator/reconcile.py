"""Make the cluster match one InferenceService: apply what is wanted, delete what is not.

Writes are skipped when the live object already carries the hash of the desired manifest,
so a resync of an unchanged InferenceService costs reads only.
"""

from __future__ import annotations

import copy
import enum
import hashlib
import json
from dataclasses import dataclass, field

from .builders import OWNED_KINDS, Owner, build_all
from .builders.common import SPEC_HASH_ANNOTATION
from .builders.keda import KEDA_API_VERSION
from .credentials import CredentialPolicy, keda_refusal, model_refusal
from .k8s import KubeApi, Ref
from .kinds import kind_of
from .models import InferenceServiceSpec
from .status import Problem


class Action(enum.StrEnum):
    CREATED = "Created"
    UPDATED = "Updated"
    REPLACED = "Replaced"
    DELETED = "Deleted"
    UNCHANGED = "Unchanged"


@dataclass(frozen=True)
class Change:
    action: Action
    kind: str
    name: str

    def describe(self) -> str:
        return f"{self.kind} {self.name} {self.action.value.lower()}"


@dataclass
class Result:
    changes: list[Change] = field(default_factory=list)
    deployment: dict | None = None
    # Something left out on purpose (a refused Prometheus credential): reported, then retried.
    problem: Problem | None = None

    @property
    def writes(self) -> list[Change]:
        return [c for c in self.changes if c.action != Action.UNCHANGED]


class ForeignObjectError(Exception):
    """An object with our name exists but belongs to someone else: we never take it over."""


def manifest_hash(obj: dict) -> str:
    """A short digest of a desired manifest; any change to what we would send changes it."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def with_hash(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    digest = manifest_hash(obj)
    obj["metadata"].setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = digest
    return obj


def owned_by(obj: dict, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def apply_object(api: KubeApi, desired: dict, owner_uid: str) -> tuple[Action, dict]:
    """Create or server-side-apply one object unless its live hash already matches."""
    desired = with_hash(desired)
    ref = Ref.of(desired)
    live = api.get(ref)
    if live is None:
        return Action.CREATED, api.create(desired)
    if not owned_by(live, owner_uid):
        raise ForeignObjectError(f"{ref.kind} {ref.name} exists and is not owned by this InferenceService")
    live_hash = (live["metadata"].get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
    if live_hash == desired["metadata"]["annotations"][SPEC_HASH_ANNOTATION]:
        return Action.UNCHANGED, live
    if kind_of(ref.api_version, ref.kind).replaced_on_change:
        # An immutable spec (a ResourceClaimTemplate): the pods that use it roll by its hash.
        api.delete(ref)
        return Action.REPLACED, api.create(desired)
    return Action.UPDATED, api.apply(keep_foreign_replicas(desired, live))


def keep_foreign_replicas(desired: dict, live: dict) -> dict:
    """When an HPA or KEDA owns the replica count we send none; send back the live count
    instead, or server-side apply would drop the field and the Deployment fall to 1."""
    if desired["kind"] != "Deployment" or "replicas" in desired["spec"]:
        return desired
    replicas = (live.get("spec") or {}).get("replicas")
    if replicas is None:
        return desired
    return {**desired, "spec": {**desired["spec"], "replicas": replicas}}


def reconcile(
    api: KubeApi,
    name: str,
    namespace: str,
    uid: str,
    spec: InferenceServiceSpec,
    policy: CredentialPolicy | None = None,
) -> Result:
    owner = Owner(name=name, namespace=namespace, uid=uid, spec=spec)
    result = Result()
    policy = policy if policy is not None else CredentialPolicy.from_env()

    def read_secret(secret: str) -> dict | None:
        return api.get(Ref("v1", "Secret", namespace, secret))

    if refused := model_refusal(spec, policy, read_secret):
        raise refused  # no pod may carry this token: change nothing, the handler reports why
    wanted = build_all(owner)
    refusal = keda_refusal(spec.autoscaling, policy, read_secret)
    if refusal is not None:  # KEDA would send the Secret: emit none of its objects
        wanted = [o for o in wanted if o["apiVersion"] != KEDA_API_VERSION]
        result.problem = Problem(refusal.reason, refusal.message)
    for obj in wanted:
        action, live = apply_object(api, obj, uid)
        result.changes.append(Change(action, obj["kind"], name))
        if obj["kind"] == "Deployment":
            result.deployment = live
    wanted_kinds = {(o["apiVersion"], o["kind"]) for o in wanted}
    for api_version, kind in OWNED_KINDS:
        if (api_version, kind) in wanted_kinds:
            continue
        ref = Ref(api_version, kind, namespace, name)
        live = api.get(ref)
        if live is not None and owned_by(live, uid) and api.delete(ref):
            result.changes.append(Change(Action.DELETED, kind, name))
    return result
