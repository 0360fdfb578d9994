"""What the handlers share: the one way a service's status is written, the events that tell
what changed, and the reconcile held to the platform's rules.

State lives in the objects (spec-hash annotations, field ownership, status), never in this
process, so any replica of the operator can pick up where another stopped. The only memory
kept here is what serialises status writes (and, in repair.py, what rate-limits repairs, in
bookkeeping.py, the spec kopf last handled); losing it is harmless.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import cast

import kopf
from kubernetes.client.exceptions import ApiException

from .. import config, credentials, policy, scale_to_zero, status_pods
from ..builders.common import ROUTER_SUFFIX, STATUS_ROLES, Owner, Role, inventory_selector, role_of
from ..builders.storage import FETCH_CONTAINER
from ..jsontypes import JsonObject
from ..k8s import KubeApi, Ref
from ..kinds import DEPLOYMENT, INFERENCE_SERVICE, LEADER_WORKER_SET, NODE, POD
from ..models import ENGINES, parse_spec
from ..reasons import Reason
from ..reconcile import (
    Action,
    Change,
    Result,
    never_reconciled,
    owned_by,
    previous_inventory,
    pruned_inventory,
    reconcile,
)
from ..rollout import Phase, RolloutState
from ..status import (
    DEGRADED,
    READY,
    SPEC_PROBLEMS,
    Problem,
    Rollout,
    compute_status,
    condition_status,
    deployment_rollout,
    find_condition,
    spec_problem,
    status_changes,
)

# Problems rollout news does not clear: only a spec change or the next re-check can (a canary
# rolled back stays Degraded until the spec changes; the stable revision serves meanwhile).
KEPT_PROBLEMS = (*SPEC_PROBLEMS, Reason.API_ERROR, *credentials.REFUSALS, Reason.ROLLED_BACK)
# The containers of a model pod whose failures status_pods tells apart.
POD_ROLES = status_pods.Roles(fetch=FETCH_CONTAINER, servers=tuple(engine.container for engine in ENGINES.values()))


def normal_event(body: kopf.Body | JsonObject, reason: Reason | Action, message: str) -> None:
    """A Normal event; kopf.info would obey posting.level, which keeps log lines out."""
    kopf.event(as_body(body), type="Normal", reason=str(reason), message=message)


def announce_writes(body: kopf.Body | JsonObject, writes: list[Change]) -> None:
    """One Normal event per kind of change a reconcile made, naming every object it touched
    ("Deployment m created, Service m created"): a new service costs one event, not one per object."""
    by_action: dict[Action, list[str]] = {}
    for change in writes:
        by_action.setdefault(change.action, []).append(change.describe())
    for action, described in by_action.items():
        normal_event(body, action, ", ".join(described))


def as_body(obj: kopf.Body | JsonObject) -> kopf.Body:
    """An object read through the API as kopf's events take it (kopf reads only its metadata)."""
    return cast(kopf.Body, obj)


def isvc_ref(namespace: str, name: str) -> Ref:
    return Ref.to(INFERENCE_SERVICE, namespace, name)


def publish(
    memo: kopf.Memo,
    ref: Ref,
    compute: Callable[[JsonObject], JsonObject | None],
    known: kopf.Body | JsonObject | None = None,
    then: Callable[[JsonObject], None] | None = None,
) -> tuple[JsonObject | None, JsonObject]:
    """Write only the status keys that changed, computed from the object as it is now.

    Several writers race (the reconcile handler, owned-object events, the autoscaler): each
    decides from a fresh read and writes guarded by its resourceVersion (KubeApi.update_status),
    so none puts back a stale conditions list and two never send the same patch twice.
    `known`, the object as a watch event brought it, saves that read when it is current (a new
    service's first status). `compute` may return None: nothing to say now. Returns (the
    previous status, the new status); an unchanged status costs no write. `then` acts on the new
    status before the next write can: what follows the status (the activator's slice) follows
    the writes in their order, never an earlier one's after a later one's.
    """
    api: KubeApi = memo.api
    computed: JsonObject = {}

    def changes(fresh: JsonObject) -> JsonObject | None:
        new_status = compute(fresh)
        computed["status"] = fresh.get("status") if new_status is None else new_status
        return None if new_status is None else status_changes(fresh.get("status"), new_status)

    with status_lock(memo, ref):
        fresh, _ = api.update_status(ref, changes, known=None if known is None else dict(known))
        if fresh is not None and then is not None:
            then(computed.get("status") or {})
    if fresh is None:
        return None, {}
    return fresh.get("status"), computed.get("status") or {}


def follow_activator(
    memo: kopf.Memo, isvc: kopf.Body | JsonObject, owner: Owner, status: JsonObject, logger: kopf.Logger
) -> None:
    """NAME-activator as the service's ready count now asks (scale_to_zero.py). Called under the
    service's status lock (`publish(then=...)`) with the status just written or read there: run
    after the lock, a count read before a later write could land after that write's own."""
    ready = scale_to_zero.ready_on_path(status)
    registry: scale_to_zero.Registry | None = memo.get("scale_to_zero")
    if registry is None or not registry.remember(owner, ready):  # None: not started by `configure`
        return
    change = scale_to_zero.sync_slice(memo.api, owner, ready, registry.activator)
    if change is not None:
        normal_event(isvc, change.action, change.describe())
        logger.info("activator slice: %s (ready replicas %s)", change.describe(), ready)


def serves_at_zero(isvc: JsonObject) -> bool:
    """The service scales to zero (autoscaling.scaleToZero, or the prefill/decode pair's
    disaggregation.scaleToZero): at zero it is Ready (status.compute_status)."""
    spec = isvc.get("spec") or {}
    if (spec.get("disaggregation") or {}).get("scaleToZero"):
        return True
    scaling = spec.get("autoscaling") or {}
    return bool(scaling.get("scaleToZero")) and scaling.get("minReplicas") == 0


class StatusLocks:
    """One status lock per InferenceService, for every handler of every object. Made once, at
    startup (`startup.configure`): kopf hands each object's handlers a shallow copy of the memo,
    so locks a handler added to its own copy would be that object's alone, and a Deployment's
    mirror and its service's reconcile would each write under a lock of their own."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}

    def of(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """A deleted service's lock goes (one per service ever seen would otherwise stay); a
        write still holding it keeps its own reference."""
        with self._guard:
            self._locks.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._locks)


def status_lock(memo: kopf.Memo, ref: Ref) -> threading.Lock:
    """One InferenceService's status writes, one at a time (in this process; peering keeps
    other replicas paused). With `observe` inside, whichever write comes last read the cluster
    last: an event that arrives while another write is under way waits for it, then reads
    again, so no write can put back news older than the last event."""
    locks: StatusLocks = memo.status_locks
    return locks.of(ref.namespace, ref.name)


Workloads = Callable[[], Mapping[Role, JsonObject | None]]


def observe(
    api: KubeApi, workloads: Workloads, namespace: str, pod_selector: str | None
) -> tuple[dict[str, Rollout], Problem | None]:
    """The service's workloads (by role) and pods as they are now, read inside the status write
    (see `status_lock`): never the copies an apply answered, which predate their controllers' news."""
    live = workloads()
    pods = api.list_objects(*POD.key, namespace, pod_selector) if pod_selector else []
    states: dict[str, Rollout] = {role: deployment_rollout(obj) for role, obj in live.items()}
    # A lost node first: its pods' container statuses are the kubelet's last word, not news.
    nodes = {name: read_node(api, name) for name in status_pods.suspect_nodes(pods)}
    return states, status_pods.nodes_problem(pods, nodes) or status_pods.pods_problem(pods, POD_ROLES)


def read_node(api: KubeApi, name: str) -> JsonObject | None:
    """The Node `name`, or None where the operator may not read Nodes (a single-namespace
    install has no cluster-wide rights): its pods' problems are then said without it."""
    try:
        return api.get(Ref.to(NODE, "", name))
    except ApiException as exc:
        if exc.status == 403:
            return None
        raise


def refresh_status(
    api: KubeApi,
    fresh: JsonObject,
    workloads: Workloads,
    problem: Problem | None,
    *,
    generation: int | None = None,
    selector: str | None = None,
) -> JsonObject:
    """The status `fresh` (the service as its status write read it) should have now: its
    workloads and pods read here, inside the write (`status_lock`), and `problem` (the
    reconcile's, or `kept_problem`). The one way every handler makes a status; `generation` and
    `selector` are the reconcile's when it is writing its own (else the status's)."""
    status = fresh.get("status") or {}
    generation = fresh["metadata"].get("generation") if generation is None else generation
    state, pods = observe(api, workloads, fresh["metadata"]["namespace"], selector or status.get("selector"))
    return compute_status(status, state, generation, problem, pods=pods, serves_at_zero=serves_at_zero(fresh))


def kept_problem(fresh: JsonObject) -> Problem | None:
    """The problem `fresh`'s status holds that news of its workloads must not clear."""
    return spec_problem(fresh.get("status"), KEPT_PROBLEMS)


def by_ref(api: KubeApi, refs: Mapping[Role, Ref]) -> Workloads:
    """The workloads read by name (one read each), where a reconcile has just applied them."""
    return lambda: {role: api.get(ref) for role, ref in refs.items()}


def by_label(api: KubeApi, kind: tuple[str, str], namespace: str, owner_name: str, owner_uid: str) -> Workloads:
    """The service's workloads of one kind that its status counts, found by the inventory's
    labels and its role (one list): whatever their names, never another service's."""

    def read() -> Mapping[Role, JsonObject | None]:
        found: dict[Role, JsonObject | None] = {}
        for obj in api.list_objects(*kind, namespace, inventory_selector(owner_name)):
            role = role_of(obj, owner_name)
            if role in STATUS_ROLES and owned_by(obj, owner_uid):
                found[role] = {**obj, "apiVersion": kind[0], "kind": kind[1]}
        return found

    return read


def workload_refs(isvc: JsonObject) -> dict[Role, Ref]:
    """Every workload the status counts, by role, named as the builders name them: the
    predictor's Deployment (its LeaderWorkerSet when it spans nodes), or with
    spec.disaggregation NAME-prefill's and NAME-decode's in its place; NAME-router's with
    routing.router. All of them: a status made from fewer would drop `status.roles` and call
    the service Ready on the one it read."""
    meta, spec = isvc["metadata"], isvc.get("spec") or {}
    namespace, name = meta["namespace"], meta["name"]
    refs: dict[Role, Ref] = {}
    if spec.get("disaggregation") is not None:
        for role in (Role.PREFILL, Role.DECODE):
            refs[role] = Ref.to(DEPLOYMENT, namespace, f"{name}-{role}")
    else:
        nodes = (((spec.get("resources") or {}).get("gpu")) or {}).get("nodes") or 1
        refs[Role.PREDICTOR] = Ref.to(LEADER_WORKER_SET if int(nodes) > 1 else DEPLOYMENT, namespace, name)
    if (spec.get("routing") or {}).get("router") is not None:
        refs[Role.ROUTER] = Ref.to(DEPLOYMENT, namespace, name + ROUTER_SUFFIX)
    return refs


def announce_pods(isvc: kopf.Body | JsonObject, previous: JsonObject | None, new: JsonObject) -> None:
    """A Warning event when the pods' problem appears or changes (kubectl describe shows it)."""
    condition = find_condition(new.get("conditions"), DEGRADED)
    if condition is None or condition.get("status") != "True" or condition.get("reason") not in status_pods.REASONS:
        return
    before = find_condition((previous or {}).get("conditions"), DEGRADED) or {}
    if (before.get("status"), before.get("reason"), before.get("message")) == (
        "True",
        condition.get("reason"),
        condition.get("message"),
    ):
        return
    kopf.warn(as_body(isvc), reason=condition["reason"], message=condition.get("message", ""))


def announce_readiness(isvc: JsonObject, previous: JsonObject | None, new: JsonObject) -> None:
    """An event when the service becomes ready, a warning when a ready one stops being so."""
    before, after = condition_status(previous, READY), condition_status(new, READY)
    if before == after or (after != "True" and before != "True"):
        return
    condition = find_condition(new["conditions"], READY)
    assert condition is not None
    if after == "True":
        normal_event(isvc, Reason.READY, condition["message"])
    else:
        kopf.warn(as_body(isvc), reason=condition["reason"], message=condition["message"])


def reconcile_checked(memo: kopf.Memo, isvc: kopf.Body | JsonObject) -> tuple[Owner, Result]:
    """Parse the spec, hold it to the platform's pod policy, then reconcile it (a canary
    rollout where its status left it)."""
    meta, status = isvc["metadata"], isvc.get("status")
    operator_config: config.OperatorConfig = memo.config
    owner = operator_config.owner(meta["name"], meta["namespace"], meta["uid"], parse_spec(dict(isvc["spec"])))
    policy.check(owner.spec, operator_config.pod_policy, owner.namespace)
    state = RolloutState.from_status(status)
    first = never_reconciled(meta.get("generation"), status)
    pruned = pruned_inventory(meta.get("generation"), status)
    previous = previous_inventory(meta.get("generation"), status)
    return owner, reconcile(
        memo.api, owner, operator_config.credentials, state, first=first, pruned=pruned, previous=previous
    )


def rollout_problem(rollout: RolloutState | None) -> Problem | None:
    if rollout is None or rollout.phase != Phase.ROLLED_BACK:
        return None
    return Problem(Reason.ROLLED_BACK, f"revision {rollout.revision}: {rollout.message}")
