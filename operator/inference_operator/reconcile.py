"""Make the cluster match one InferenceService: apply what is wanted, delete what is not.

A reconcile is a pipeline over one desired set: what the spec asks (`desired_objects`), each
stage's transform of it (`stages/`: scale to zero's private Service, a canary's arms), the
applies, then one label-selected prune of what the service owns and no longer wants.

Every write is a server-side apply under the operator's one field manager, so a field the
spec stops asking for is really removed. A live object is left alone when it carries the
hash of the desired manifest, its labels and annotations are ours and no other manager owns
part of its spec; a resync of an unchanged InferenceService therefore costs reads only.
Before anything is written, the whole set is applied with `dryRun=All`: when the API server
refuses one object, none is written and the refusal is reported. A new service's set, none of
whose objects exists yet, is created without the dry run (half of its applies): its workload
last, and what was created before a refusal is deleted again, so no pod ever runs and nothing
is left (`create_all`).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
from dataclasses import dataclass, field

from kubernetes.client.exceptions import ApiException

from . import stages
from .builders import Owner, build_all
from .builders.common import SPEC_HASH_ANNOTATION, STATUS_ROLES, Role, inventory_selector, role_of
from .credentials import CredentialsRefused, keda_refusal, model_refusal
from .jsontypes import JsonObject
from .k8s import KubeApi, Ref
from .kinds import (
    APPLY_ORDER,
    KINDS,
    OWNED_BY_NAME,
    SECRET,
    WORKLOAD_KINDS,
    Kind,
    in_apply_order,
    kind_of_object,
)
from .ownership import Drift, drift, metadata_differs
from .rollout import RolloutState, with_revision
from .settings import MANAGER, CredentialPolicy
from .stages.base import with_hash
from .stages.canary import is_predictor_deployment
from .status import Problem

# The credential rules with nothing configured (the operator passes its own).
DEFAULT_POLICY = CredentialPolicy()


class Action(enum.StrEnum):
    CREATED = "Created"
    UPDATED = "Updated"
    REPAIRED = "Repaired"
    REPLACED = "Replaced"
    DELETED = "Deleted"
    UNCHANGED = "Unchanged"


@dataclass(frozen=True)
class Change:
    action: Action
    kind: str
    name: str
    detail: str = ""

    def describe(self) -> str:
        text = f"{self.kind} {self.name} {self.action.value.lower()}"
        return f"{text} ({self.detail})" if self.detail else text


@dataclass
class Result:
    changes: list[Change] = field(default_factory=list)
    # The live workloads (Deployments, LeaderWorkerSets) by role, as their applies answered.
    workloads: dict[Role, JsonObject] = field(default_factory=dict)
    # Wanted kinds the cluster does not serve (an add-on is missing): not applied.
    unavailable: list[Kind] = field(default_factory=list)
    # Something left out on purpose (a refused Prometheus credential): reported, then retried.
    problem: Problem | None = None
    # Where a canary rollout stands (None: the service rolls its Deployment the usual way).
    rollout: RolloutState | None = None
    # What the service owns once this reconcile is done (`inventory`): status.inventory.
    inventory: list[str] = field(default_factory=list)

    @property
    def writes(self) -> list[Change]:
        return [c for c in self.changes if c.action != Action.UNCHANGED]

    @property
    def serving(self) -> dict[Role, JsonObject]:
        """The workloads the service's status counts (`STATUS_ROLES`): not a canary's, nor the picker's."""
        return {role: obj for role, obj in self.workloads.items() if role in STATUS_ROLES}


class ForeignObjectError(Exception):
    """An object with our name exists but belongs to someone else: we never take it over."""


class ApplyRefused(Exception):
    """The API server refused an object of the desired set (checked by a dry run first)."""


@dataclass(frozen=True)
class WritePlan:
    """What to do with one desired object given its live state."""

    desired: JsonObject
    live: JsonObject | None
    action: Action
    drift: Drift | None = None

    @property
    def ref(self) -> Ref:
        return Ref.of(self.desired)


def owned_by(obj: JsonObject, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def keep_foreign_replicas(desired: JsonObject, live: JsonObject | None) -> JsonObject:
    """When an HPA or KEDA owns the replica count we send none; send back the live count
    instead (for the kinds whose table entry says so: `Kind.keeps_live_replicas`)."""
    if live is None or not kind_of_object(desired).keeps_live_replicas or "replicas" in desired["spec"]:
        return desired
    replicas = (live.get("spec") or {}).get("replicas")
    if replicas is None:
        return desired
    return {**desired, "spec": {**desired["spec"], "replicas": replicas}}


def plan_write(desired: JsonObject, live: JsonObject | None, owner_uid: str) -> WritePlan:
    """Pure: whether `live` needs a write to become `desired` (which carries its hash)."""
    if live is None:
        return WritePlan(desired, None, Action.CREATED)
    if not owned_by(live, owner_uid):
        raise ForeignObjectError(
            f"{desired['kind']} {desired['metadata']['name']} exists and is not owned by this InferenceService"
        )
    found = drift(live, desired, owner_uid, MANAGER)
    live_hash = (live["metadata"].get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
    changed = live_hash != desired["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    if (found is not None or changed) and kind_of_object(desired).replaced_on_change:
        # An immutable spec (a ResourceClaimTemplate): the pods that use it roll by its hash.
        return WritePlan(desired, live, Action.REPLACED)
    if found is not None:
        return WritePlan(desired, live, Action.REPAIRED, found)
    if changed:
        return WritePlan(desired, live, Action.UPDATED)
    if metadata_differs(live, desired):
        return WritePlan(desired, live, Action.REPAIRED)
    return WritePlan(desired, live, Action.UNCHANGED)


def _take_over(api: KubeApi, step: WritePlan) -> WritePlan:
    """Move foreign managers' fields into the operator's own (client-go's csaupgrade)."""
    if step.drift is None or step.live is None:
        return step
    live = api.replace_managed_fields(step.ref, step.drift.managed_fields, step.live["metadata"]["resourceVersion"])
    return dataclasses.replace(step, live=live)


def _dry_run_body(step: WritePlan) -> JsonObject:
    """What the dry run applies. A replaced object becomes a create, so it is judged as one: the
    same object under a name nothing has (over the live one, its immutable spec is refused)."""
    if step.action == Action.REPLACED:
        meta = step.desired["metadata"]
        return {**step.desired, "metadata": {**meta, "name": f"{meta['name']}-replacement-dry-run"}}
    return keep_foreign_replicas(step.desired, step.live)


def api_message(exc: ApiException) -> str:
    """The API server's own explanation of a refusal (its Status message), else the reason."""
    try:
        return str(json.loads(exc.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(exc.body or exc.reason)


def _served(api: KubeApi, kind: Kind) -> bool:
    return kind.addon is None or api.serves(kind.api_version, kind.plural)


def reconcile(
    api: KubeApi,
    owner: Owner,
    policy: CredentialPolicy = DEFAULT_POLICY,
    rollout: RolloutState | None = None,
    now: float | None = None,
    *,
    first: bool = False,
    pruned: list[str] | None = None,
    previous: list[str] | None = None,
) -> Result:
    """Apply the desired set if anything differs; delete owned kinds no longer wanted.

    Wanted kinds the cluster does not serve are skipped and listed in the result; the rest
    is still applied, so a service whose autoscaler add-on is missing still serves. With a
    canary strategy, `rollout` (status.rollout) says which revision each Deployment runs.
    `first` (see `never_reconciled`): nothing to prune, and no read looks for it. `pruned` (see
    `pruned_inventory`): what a finished reconcile of this generation left; when the desired set
    is that, there is nothing to prune either. `previous` (see `previous_inventory`): what the
    reconcile of the generation before left. With either record the prune deletes by name what
    the record has and the desired set lacks (`prune_recorded`), and lists nothing; without one
    it lists every owned kind by label (`prune`).
    """
    wanted, refusal = desired_objects(api, owner, policy)
    context = stages.Context(rollout, time.time() if now is None else now)
    staged = stages.run(ClusterReads(api), owner, wanted, context)
    wanted = staged.objects
    missing = unserved_kinds(api, wanted)
    wanted = [obj for obj in wanted if kind_of_object(obj) not in missing]
    # Foreign fields become ours first (ownership only: no spec changes), so the dry run judges
    # the object as the apply will leave it: without a hand-added `privileged: true`, say, that
    # would otherwise still be merged in and make our own fields invalid beside it.
    steps = [_take_over(api, plan_write(obj, api.get(Ref.of(obj)), owner.uid)) for obj in wanted]
    result = Result(unavailable=missing, problem=Problem(refusal.reason, refusal.message) if refusal else None)
    result.rollout = staged.rollout
    result.inventory = inventory(wanted)
    if first and all(step.action == Action.CREATED for step in steps):
        create_all(api, steps, result, owner.name)
        return result
    dry_run(api, steps)
    for step in steps:
        result.changes.append(apply_step(api, step, result, owner.name)[0])
    if first or pruned == result.inventory:
        return result
    recorded = pruned if pruned is not None else previous
    if recorded is None:
        result.changes.extend(prune(api, owner, wanted))
    else:
        result.changes.extend(prune_recorded(api, owner, recorded, result.inventory))
    return result


def inventory(wanted: list[JsonObject]) -> list[str]:
    """The desired set as `Kind/name`, sorted: what the service owns once a reconcile is done."""
    return sorted(f"{obj['kind']}/{obj['metadata']['name']}" for obj in wanted)


def pruned_inventory(generation: int | None, status: JsonObject | None) -> list[str] | None:
    """What a finished reconcile of this generation left (status.inventory), when that is all
    the service can own: then a resync whose desired set is the same has nothing to prune, and
    lists nothing (a restart of the operator costs no list per owned kind and service).

    None, so the prune lists the inventory by label, when the status records none (an older
    version's, or none finished: whatever was made since is not in it), when it is of another
    generation (a reconcile cut short after its applies and before its status, then the spec
    changed back, would otherwise leave what it made), or while a canary rollout is recorded
    (its analysis reconciles arms in and out without writing this record)."""
    status = status or {}
    recorded = status.get("inventory")
    if recorded is None or generation is None or status.get("observedGeneration") != generation:
        return None
    if status.get("rollout") is not None:
        return None
    return [str(entry) for entry in recorded]


def previous_inventory(generation: int | None, status: JsonObject | None) -> list[str] | None:
    """What the reconcile of the generation just before this one left (status.inventory), when
    it finished: a spec change then need only look among that record's kinds and the new
    desired set's. Every write since the record came from a reconcile of that generation (whose
    objects it names) or of this one (whose objects are desired now), so nothing owned is of
    another kind, but for an object someone else made with the labels and ownerReference: the
    next full prune (a record of another generation or none, a resync whose set differs from
    the record, a canary) removes that one.

    None, so the prune lists every owned kind, for a gap of more than one generation (a
    reconcile in between may have been cut short after its applies) and the cases
    `pruned_inventory` refuses."""
    if generation is None:
        return None
    return pruned_inventory(generation - 1, status)


def never_reconciled(generation: int | None, status: JsonObject | None) -> bool:
    """A service at its first generation that no reconcile has finished (no observedGeneration):
    whatever the operator wrote for it (a reconcile cut short before its status) came from this
    same spec, so it owns nothing a reconcile would prune. Its reconcile skips the prune's reads:
    ten of the 25 requests a new service cost (bench/operator_scale.py)."""
    return generation == 1 and (status or {}).get("observedGeneration") is None


def spec_objects(owner: Owner) -> list[JsonObject]:
    """What the spec asks for, hashed and in the table's apply order (pure). The predictor's
    Deployment carries its revision and a copy of its manifest (what a canary keeps stable),
    whatever the strategy: a switch to canary then finds them."""
    built = (with_revision(obj) if is_predictor_deployment(obj, owner.name) else obj for obj in build_all(owner))
    return in_apply_order(with_hash(obj) for obj in built)


def desired_objects(
    api: KubeApi, owner: Owner, policy: CredentialPolicy
) -> tuple[list[JsonObject], CredentialsRefused | None]:
    """`spec_objects`, less the kinds that would hand out a credential the policy refuses (and
    that refusal, to report): the set the stages transform."""
    wanted = spec_objects(owner)
    secret = lambda name: api.get(Ref.to(SECRET, owner.namespace, name))  # noqa: E731
    if refused := model_refusal(owner.spec, policy, secret):
        raise refused  # no pod may carry this token: change nothing, the handler reports why
    refusal = keda_refusal(owner.spec.autoscaling, policy, secret)
    if refusal is not None:  # KEDA would send the Secret: emit none of its objects
        wanted = [obj for obj in wanted if not kind_of_object(obj).sends_credentials]
    return wanted, refusal


@dataclass(frozen=True)
class ClusterReads:
    """The reads a stage may make (`stages.Cluster`), through the API client."""

    api: KubeApi

    def live(self, desired: JsonObject) -> JsonObject | None:
        return self.api.get(Ref.of(desired))

    def serves(self, kind: Kind) -> bool:
        return _served(self.api, kind)


def unserved_kinds(api: KubeApi, objects: list[JsonObject]) -> list[Kind]:
    """The kinds among `objects` whose add-on this cluster does not serve, once each."""
    kinds = dict.fromkeys(kind_of_object(obj) for obj in objects)
    return [kind for kind in kinds if not _served(api, kind)]


# What the API server answers an object it will not take, however often it is asked: invalid
# (the refusal a dry run reports), and, to a create, forbidden as well.
INVALID = (400, 422)
REFUSALS = (*INVALID, 403)


def _refused(step: WritePlan, exc: ApiException) -> ApplyRefused:
    return ApplyRefused(f"{step.ref.kind} {step.ref.name}: {api_message(exc)}")


def dry_run(api: KubeApi, steps: list[WritePlan]) -> None:
    """Apply every pending step with `dryRun=All`; the first refusal stops all writes."""
    for step in steps:
        if step.action == Action.UNCHANGED:
            continue
        try:
            api.apply(_dry_run_body(step), dry_run=True)
        except ApiException as exc:
            if exc.status not in INVALID:  # others (conflicts, RBAC, throttling) are retried
                raise
            raise _refused(step, exc) from exc


def create_all(api: KubeApi, steps: list[WritePlan], result: Result, owner_name: str) -> None:
    """Create a new service's objects, none of which exists, without a dry run: the workload last,
    so that when the API server refuses any object no pod has run. After a refusal the objects
    created before it are deleted again (newest first), so nothing is left half-applied: an
    invalid object (400, 422) is raised as the dry run would have raised it, a forbidden one
    (403: an admission policy or webhook, RBAC; a person has to act) as it came, for the
    handler to retry from the start. A transient failure (a conflict, throttling, a 5xx) leaves
    them: the retry finds them and takes the dry-run path, creating nothing twice. The changes
    are reported in the table's order."""
    created: dict[int, tuple[Change, JsonObject | None]] = {}
    for index in sorted(range(len(steps)), key=lambda i: steps[i].ref.kind in WORKLOAD_KINDS):
        step = steps[index]
        try:
            created[index] = apply_step(api, step, result, owner_name)
        except ApiException as exc:
            if exc.status not in REFUSALS:
                raise
            for done in reversed(created):
                if _made_by_this_apply(created[done][1]):
                    api.delete(steps[done].ref)
            if exc.status not in INVALID:  # forbidden: retried
                raise
            raise _refused(step, exc) from exc
    result.changes.extend(created[index][0] for index in sorted(created))


def _made_by_this_apply(live: JsonObject | None) -> bool:
    """No one but the operator has set fields of `live` (a controller's status aside): the object
    its apply created, not one that someone else made in the instant between the read that found
    none and that apply (the apply took it over), which a cleanup must leave alone."""
    entries = ((live or {}).get("metadata") or {}).get("managedFields") or []
    return all(entry.get("manager") == MANAGER for entry in entries if not entry.get("subresource"))


def apply_step(api: KubeApi, step: WritePlan, result: Result, owner_name: str) -> tuple[Change, JsonObject | None]:
    """Carry out one step (a replaced object is deleted first); record a workload by its role.
    Returns the change and the object as the API server answered it."""
    live = step.live
    if step.action == Action.REPLACED:
        api.delete(step.ref)
        live = None
    if step.action != Action.UNCHANGED:
        live = api.apply(keep_foreign_replicas(step.desired, live))
    role = role_of(step.desired, owner_name) if step.ref.kind in WORKLOAD_KINDS else None
    if role is not None and live is not None:
        result.workloads[role] = live
    return Change(step.action, step.ref.kind, step.ref.name, step.drift.describe() if step.drift else ""), live


def prune(api: KubeApi, owner: Owner, wanted: list[JsonObject]) -> list[Change]:
    """Delete what this InferenceService owns and no longer wants, whatever its role or name.

    The inventory is read by label, one list per owned kind: every object the operator makes for
    a service carries its instance and managed-by labels (every version has set both, so an
    object made before roles were labelled is found too), and is judged by (kind, name) against
    the desired set. Only an object whose ownerReferences name this service's uid is deleted:
    one a person made with the same labels, or another service's, never is. Kinds another path
    keeps (`Kind.reconciled`: the activator's slices) and kinds the cluster does not serve are
    not listed. Deleted in the reverse of the apply order: a route before the Service it leads
    to, the pods before the rights they use.

    Each list reads every object of its kind in the namespace (the selector is applied by the
    API server, after the read): the full prune is for a service without a record to trust.
    """
    keep = {(obj["kind"], obj["metadata"]["name"]) for obj in wanted}
    selector = inventory_selector(owner.name)
    deleted = []
    for kind in reversed(KINDS):
        if not kind.owned or not _prunable(api, kind):
            continue
        for live in api.list_objects(kind.api_version, kind.kind, owner.namespace, selector):
            if (kind.kind, live["metadata"]["name"]) not in keep:
                deleted.extend(_delete_owned(api, owner, kind, live))
    return deleted


def _prunable(api: KubeApi, kind: Kind) -> bool:
    """Whether a prune may delete objects of an owned `kind`: one this reconcile keeps (not the
    activator's slices) and the cluster serves."""
    return kind.reconciled and _served(api, kind)


def _delete_owned(api: KubeApi, owner: Owner, kind: Kind, live: JsonObject | None) -> list[Change]:
    """Delete `live` if this service owns it (its uid in the ownerReferences): the deletion made,
    or none (gone already, not this service's, or deleted meanwhile)."""
    if live is None or not owned_by(live, owner.uid):
        return []
    name = live["metadata"]["name"]
    return [Change(Action.DELETED, kind.kind, name)] if api.delete(Ref.to(kind, owner.namespace, name)) else []


def prune_recorded(api: KubeApi, owner: Owner, recorded: list[str], kept: list[str]) -> list[Change]:
    """Delete, by name, what a record of a finished reconcile (status.inventory) names and the
    desired set (`kept`, an inventory too) no longer does: one read and one delete per object
    gone, and no list, so a spec change costs the same among ten thousand services as among
    ten. The same ownership test and order as `prune`; an entry of a kind this version does not
    own, keep or serve is passed over (a full prune, without a record, would not list it
    either)."""
    deleted = []
    gone = (entry.split("/", 1) for entry in set(recorded) - set(kept))
    named = [(OWNED_BY_NAME[kind_name], name) for kind_name, name in gone if kind_name in OWNED_BY_NAME]
    for kind, name in sorted(named, key=lambda item: (APPLY_ORDER[item[0].key], item[1]), reverse=True):
        if _prunable(api, kind):
            deleted.extend(_delete_owned(api, owner, kind, api.get(Ref.to(kind, owner.namespace, name))))
    return deleted
