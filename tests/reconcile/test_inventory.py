"""Owned objects as an inventory: every object the operator makes for a service carries the
service's labels and a role, and one prune, by those labels and the service's uid, removes what
is owned and no longer wanted (whatever its kind, name or version), and nothing else."""

from __future__ import annotations

import copy

import kubernetes
import pytest
import yaml

from inference_operator.builders import Owner
from inference_operator.builders.activator import ActivatorEndpoints, build_activator_slice
from inference_operator.builders.canary import arm_service, canary_deployment
from inference_operator.builders.common import ROLE_LABEL, STATUS_ROLES, Role, inventory_selector, role_of
from inference_operator.handlers.shared import by_label, workload_refs
from inference_operator.k8s import KubeApi, Ref
from inference_operator.kinds import OWNED_BY_NAME, OWNED_KINDS
from inference_operator.models import parse_spec
from inference_operator.models.status import INVENTORY_ENTRY_LENGTH, INVENTORY_ITEMS
from inference_operator.reconcile import Action, previous_inventory, pruned_inventory, reconcile
from inference_operator.settings import MANAGER
from inference_operator.stages import rendered
from inference_operator.stages.base import with_hash
from inference_operator.status import READY, Rollout, compute_status, find_condition, status_changes
from inference_operator.validation import validate_custom_resource
from testsupport.cluster import Cluster
from testsupport.crd import ROOT, apply_defaults, crd_schema

NS, NAME = "ml", "llama"
SPEC_SCHEMA = crd_schema()["properties"]["spec"]


def owner(raw: dict, name: str = NAME, uid: str = "u-1") -> Owner:
    return Owner(name=name, namespace=NS, uid=uid, spec=parse_spec(apply_defaults(SPEC_SCHEMA, copy.deepcopy(raw))))


def spec(**extra: object) -> dict:
    return {"model": {"uri": "pvc://models/llama", "name": "llama"}, "runtime": {"engine": "vllm"}, **extra}


POOLED = spec(
    replicas=2,
    routing={"inferencePool": True, "httpRoute": {"parentRefs": [{"name": "gw"}]}},
    adapters=[{"name": "sql", "uri": "hf://org/sql-lora"}],
)
AT_ZERO = spec(
    routing={"httpRoute": {"parentRefs": [{"name": "gw"}]}},
    autoscaling={"minReplicas": 0, "maxReplicas": 3, "metric": "requestsWaiting", "target": 4, "scaleToZero": {}},
)


def roles(objects: list[dict]) -> dict[tuple[str, str], str]:
    return {(o["kind"], o["metadata"]["name"]): o["metadata"]["labels"][ROLE_LABEL] for o in objects}


def test_every_owned_object_carries_the_services_labels_and_its_role() -> None:
    built = rendered(owner(POOLED)) + rendered(owner(AT_ZERO))
    assert roles(built) == {
        ("ConfigMap", NAME): "predictor",
        ("Deployment", NAME): "predictor",
        ("Service", NAME): "predictor",
        ("Service", f"{NAME}-private"): "activator",
        ("PodDisruptionBudget", NAME): "predictor",
        ("ServiceAccount", f"{NAME}-epp"): "endpoint-picker",
        ("RoleBinding", f"{NAME}-epp"): "endpoint-picker",
        ("Deployment", f"{NAME}-epp"): "endpoint-picker",
        ("Service", f"{NAME}-epp"): "endpoint-picker",
        ("InferencePool", NAME): "predictor",
        ("HTTPRoute", NAME): "predictor",
    }
    selector = dict(term.split("=") for term in inventory_selector(NAME).split(","))
    for obj in built:
        labels = obj["metadata"]["labels"]
        assert labels.items() >= selector.items(), obj["metadata"]["name"]
        assert role_of(obj, NAME) == Role(labels[ROLE_LABEL])
    assert selector["app.kubernetes.io/managed-by"] == MANAGER


def test_a_canarys_objects_and_the_activators_slice_are_labelled_as_theirs() -> None:
    built = rendered(owner(AT_ZERO))
    deployment = next(o for o in built if o["kind"] == "Deployment" and o["metadata"]["name"] == NAME)
    service = next(o for o in built if o["kind"] == "Service" and o["metadata"]["name"] == NAME)
    arms = [canary_deployment(deployment, 1), arm_service(service, "stable"), arm_service(service, "canary")]
    assert roles(arms) == {
        ("Deployment", f"{NAME}-canary"): "canary",
        ("Service", f"{NAME}-stable"): "canary",
        ("Service", f"{NAME}-canary"): "canary",
    }
    # The stable Deployment's own label is untouched by the copy.
    assert deployment["metadata"]["labels"][ROLE_LABEL] == "predictor"
    endpoints = ActivatorEndpoints(("10.0.0.9",), 8080)
    assert roles([build_activator_slice(owner(AT_ZERO), endpoints)]) == {
        ("EndpointSlice", f"{NAME}-activator"): "activator"
    }


def test_the_role_is_on_the_objects_never_on_their_pods_or_selectors() -> None:
    """A label added to a pod template would roll every service's pods on upgrade; one added to a
    selector would make its Deployment unappliable (selectors are immutable)."""
    for obj in rendered(owner(POOLED)) + rendered(owner(AT_ZERO)):
        template = (obj.get("spec") or {}).get("template") or {}
        assert ROLE_LABEL not in ((template.get("metadata") or {}).get("labels") or {})
        selector = (obj.get("spec") or {}).get("selector") or {}
        assert ROLE_LABEL not in (selector.get("matchLabels") or selector)


@pytest.mark.parametrize(
    ("name", "component", "role"),
    [
        (NAME, "predictor", Role.PREDICTOR),
        (f"{NAME}-epp", "endpoint-picker", Role.ENDPOINT_PICKER),
        (f"{NAME}-canary", "predictor", Role.CANARY),
        (f"{NAME}-private", "predictor", Role.ACTIVATOR),
        ("other", "predictor", None),
        (NAME, "operator", None),
    ],
)
def test_an_object_an_older_version_made_without_a_role_is_still_placed(
    name: str, component: str, role: Role | None
) -> None:
    legacy = {"metadata": {"name": name, "labels": {"app.kubernetes.io/component": component}}}
    assert role_of(legacy, NAME) == role


def test_the_status_counts_the_serving_roles_only() -> None:
    assert Role.PREDICTOR in STATUS_ROLES and Role.PREFILL in STATUS_ROLES and Role.DECODE in STATUS_ROLES
    assert Role.CANARY not in STATUS_ROLES and Role.ENDPOINT_PICKER not in STATUS_ROLES


# ---------------------------------------------------------------- the one prune, on the emulator


@pytest.fixture
def api(cluster: Cluster) -> KubeApi:
    return KubeApi(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)), timeout=10)


PLAIN = spec(replicas=1)
DEPLOYMENT = Ref("apps/v1", "Deployment", NS, NAME)
SERVICE = Ref("v1", "Service", NS, NAME)


def left_behind(kind: str, name: str, owner_uid: str | None, role: str | None = None) -> dict:
    """An object of this service's labels, as another version, another service or a person left it."""
    base = next(o for o in rendered(owner(PLAIN)) if o["kind"] == ("Deployment" if kind == "Deployment" else "Service"))
    obj = copy.deepcopy(base)
    if kind == "ServiceAccount":
        obj = {"apiVersion": "v1", "kind": kind, "metadata": obj["metadata"]}
    obj["metadata"]["name"] = name
    if owner_uid is None:
        del obj["metadata"]["ownerReferences"]
    else:
        obj["metadata"]["ownerReferences"][0]["uid"] = owner_uid
    if role is None:
        del obj["metadata"]["labels"][ROLE_LABEL]
    else:
        obj["metadata"]["labels"][ROLE_LABEL] = role
    if kind == "Deployment":
        obj["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = name  # its own pods
        obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = name
    return obj


def names(api: KubeApi, kind: str, api_version: str) -> set[str]:
    return {o["metadata"]["name"] for o in api.list_objects(api_version, kind, NS, inventory_selector(NAME))}


def test_an_owned_object_no_longer_wanted_is_pruned_whatever_its_role_or_name(api: KubeApi) -> None:
    """A canary Deployment while no rollout is recorded, and a workload of a role this version
    does not build (a router a later version made): one prune removes both."""
    reconcile(api, owner(PLAIN))
    for obj in (
        left_behind("Deployment", f"{NAME}-canary", "u-1", "canary"),
        left_behind("Deployment", f"{NAME}-router", "u-1", "router"),
        left_behind("Service", f"{NAME}-router", "u-1", "router"),
    ):
        api.apply(obj)
    result = reconcile(api, owner(PLAIN))
    assert {(c.kind, c.name) for c in result.writes if c.action == Action.DELETED} == {
        ("Deployment", f"{NAME}-canary"),
        ("Deployment", f"{NAME}-router"),
        ("Service", f"{NAME}-router"),
    }
    assert names(api, "Deployment", "apps/v1") == {NAME} and names(api, "Service", "v1") == {NAME}
    assert reconcile(api, owner(PLAIN)).writes == []


def test_another_services_object_or_one_made_by_hand_is_never_touched(api: KubeApi) -> None:
    """Same labels and the names the operator would give them: not owned by this uid, not ours."""
    reconcile(api, owner(PLAIN))
    foreign = [
        left_behind("Deployment", f"{NAME}-canary", None, "canary"),  # made by hand
        left_behind("Service", f"{NAME}-private", "u-2", "activator"),  # another service's
        left_behind("ServiceAccount", f"{NAME}-epp", None, None),
        left_behind("Deployment", f"{NAME}-epp", "u-2", None),
    ]
    for obj in foreign:
        api.apply(obj)
    result = reconcile(api, owner(PLAIN))
    assert result.writes == []
    for obj in foreign:
        assert api.get(Ref.of(obj)) is not None, obj["metadata"]["name"]


def test_an_object_an_older_version_made_without_a_role_is_adopted_or_pruned(api: KubeApi) -> None:
    """What the service still wants is labelled by the next apply (and then left alone); what it
    no longer wants is found by its ownerReference and deleted, role or no role."""
    older = [with_hash(left_behind(kind, NAME, "u-1", None)) for kind in ("Deployment", "Service")]
    older[0]["spec"]["selector"] = rendered(owner(PLAIN))[0]["spec"]["selector"]  # the selector it had
    older[0]["spec"]["template"]["metadata"]["labels"] = rendered(owner(PLAIN))[0]["spec"]["template"]["metadata"][
        "labels"
    ]
    for obj in older:
        api.apply(obj)
    old_picker = left_behind("Deployment", f"{NAME}-epp", "u-1", None)
    api.apply(old_picker)
    assert ROLE_LABEL not in api.get(DEPLOYMENT)["metadata"]["labels"]
    result = reconcile(api, owner(PLAIN))
    assert {(c.kind, c.name, c.action) for c in result.writes} == {
        ("Deployment", NAME, Action.UPDATED),
        ("Service", NAME, Action.UPDATED),
        ("Deployment", f"{NAME}-epp", Action.DELETED),
    }
    assert api.get(DEPLOYMENT)["metadata"]["labels"][ROLE_LABEL] == "predictor"
    assert api.get(SERVICE)["metadata"]["labels"][ROLE_LABEL] == "predictor"
    assert reconcile(api, owner(PLAIN)).writes == []


# ---------------------------------------------------------------- status and repair by role


def rollout(ready: int, desired: int = 1) -> Rollout:
    done = ready >= desired
    return Rollout(done, "successfully rolled out" if done else "waiting", desired, desired, ready, desired, ready)


def test_the_status_of_several_workloads_is_ready_only_when_each_role_is_and_names_the_short_one() -> None:
    short = compute_status(None, {"prefill": rollout(1), "decode": rollout(0, 2)}, 3, now="t")
    ready = find_condition(short["conditions"], READY)
    assert ready is not None and ready["status"] == "False"
    assert "decode 0/2 replicas ready" in ready["message"] and "prefill 1/1 replicas ready" in ready["message"]
    assert (short["replicas"], short["readyReplicas"]) == (3, 1)  # one line in kubectl get ris
    assert [(r["role"], r["ready"]) for r in short["roles"]] == [("decode", False), ("prefill", True)]
    assert "decode: waiting" in (find_condition(short["conditions"], "Progressing") or {})["message"]
    both = compute_status(short, {"prefill": rollout(1), "decode": rollout(2, 2)}, 3, now="t")
    assert (find_condition(both["conditions"], READY) or {})["status"] == "True"


def test_a_service_of_one_workload_reads_as_it_always_has() -> None:
    alone = compute_status(None, {"predictor": rollout(1, 2)}, 1, now="t")
    assert alone == compute_status(None, rollout(1, 2), 1, now="t")
    assert alone["roles"] is None  # absent: a merge patch of None writes nothing new
    assert status_changes({"replicas": 2}, alone).keys() == {"conditions", "readyReplicas", "updatedReplicas"}


def test_repair_finds_the_workloads_the_status_counts_by_label(api: KubeApi) -> None:
    """Not by the owner's name: a canary's, another service's and a hand-made one are not counted."""
    reconcile(api, owner(PLAIN))
    for obj in (
        left_behind("Deployment", f"{NAME}-canary", "u-1", "canary"),
        left_behind("Deployment", f"{NAME}-decode", "u-1", "decode"),
        left_behind("Deployment", f"{NAME}-prefill", "u-2", "prefill"),
        left_behind("Deployment", f"{NAME}-router", None, "router"),
    ):
        api.apply(obj)
    found = by_label(api, ("apps/v1", "Deployment"), NS, NAME, "u-1")()
    assert {role: obj["metadata"]["name"] for role, obj in found.items() if obj} == {
        Role.PREDICTOR: NAME,
        Role.DECODE: f"{NAME}-decode",
    }


@pytest.mark.parametrize(
    "raw",
    [
        spec(),
        spec(routing={"router": {}}),
        spec(routing={"router": {}}, disaggregation={}),
        spec(resources={"gpu": {"count": 8, "nodes": 2}}),
    ],
    ids=["predictor", "router", "prefill-decode", "multi-node"],
)
def test_a_pods_event_reads_every_workload_the_status_counts_by_the_builders_names(raw: dict) -> None:
    """The pods' handler reads the workloads by name (workload_refs): each one the builders make
    that the status counts, no other. With the predictor's alone a P/D service's status lost
    its roles and was Ready on one of them (the real-pods tier showed "1/1 replicas ready")."""
    isvc = {"metadata": {"name": NAME, "namespace": NS}, "spec": raw}
    counted = {
        Role(o["metadata"]["labels"][ROLE_LABEL]): (o["apiVersion"], o["kind"], o["metadata"]["name"])
        for o in rendered(owner(raw))
        if o["kind"] in ("Deployment", "LeaderWorkerSet") and role_of(o, NAME) in STATUS_ROLES
    }
    refs = workload_refs(isvc)
    assert {role: (ref.api_version, ref.kind, ref.name) for role, ref in refs.items()} == counted
    assert all(ref.namespace == NS for ref in refs.values())


# ---------------------------------------------------------------- what a finished reconcile left


def test_a_resync_of_what_a_finished_reconcile_left_lists_nothing(api: KubeApi, cluster: Cluster) -> None:
    """status.inventory says what the last reconcile of this generation left: the same desired
    set again has nothing to prune, and costs no list; a different one (the operator upgraded)
    deletes by name what the record has and the set lacks, and lists nothing either."""
    done = reconcile(api, owner(spec(replicas=2)))
    assert done.inventory == [f"Deployment/{NAME}", f"PodDisruptionBudget/{NAME}", f"Service/{NAME}"]
    before = len(list(cluster.emulator))
    assert reconcile(api, owner(spec(replicas=2)), pruned=done.inventory).writes == []
    assert not [r for r in list(cluster.emulator)[before:] if r.name is None]  # no list
    before = len(list(cluster.emulator))
    shrunk = reconcile(api, owner(PLAIN), pruned=done.inventory)  # another set: no PDB
    assert [(c.kind, c.name) for c in shrunk.writes if c.action == Action.DELETED] == [("PodDisruptionBudget", NAME)]
    assert not [r for r in list(cluster.emulator)[before:] if r.name is None]


@pytest.mark.parametrize(
    ("status", "pruned"),
    [
        ({"observedGeneration": 3, "inventory": ["Service/x"]}, ["Service/x"]),
        ({"observedGeneration": 3}, None),  # an older version's status: list by label
        ({"observedGeneration": 2, "inventory": ["Service/x"]}, None),  # not this generation's
        ({"observedGeneration": 3, "inventory": ["Service/x"], "rollout": {"phase": "Stable"}}, None),  # a canary
        (None, None),
    ],
)
def test_only_a_record_of_this_generation_without_a_canary_spares_the_lists(
    status: dict | None, pruned: list[str] | None
) -> None:
    assert pruned_inventory(3, status) == pruned


def test_a_spec_change_deletes_by_name_what_the_record_has_and_lists_nothing(api: KubeApi, cluster: Cluster) -> None:
    """After a spec change the prune reads the record of the reconcile before: what it names
    and the new set lacks goes at once, by name, with no list (among N services a list reads
    all N services' objects of its kind). One the record names that is not this service's (its
    uid), or of a kind this version does not own, is never touched. An object made by hand with
    the labels and ownerReference is named by no record: the next full prune removes it."""
    done = reconcile(api, owner(spec(replicas=2)))
    api.apply(left_behind("Deployment", f"{NAME}-canary", "u-1", "canary"))
    api.apply(left_behind("ServiceAccount", f"{NAME}-stray", "u-1", "router"))
    api.apply(left_behind("Service", f"{NAME}-theirs", "u-2"))
    record = [*done.inventory, f"Service/{NAME}-theirs", "Widget/w"]
    before = len(list(cluster.emulator))
    shrunk = reconcile(api, owner(PLAIN), previous=record)  # another set: no PDB
    requests = list(cluster.emulator)[before:]
    assert not [r for r in requests if r.name is None]
    assert [(c.kind, c.name) for c in shrunk.writes if c.action == Action.DELETED] == [("PodDisruptionBudget", NAME)]
    assert api.get(Ref("v1", "Service", NS, f"{NAME}-theirs")) is not None
    assert api.get(Ref("apps/v1", "Deployment", NS, f"{NAME}-canary")) is not None
    full = reconcile(api, owner(PLAIN))  # no record to trust: every owned kind, by label
    assert {(c.kind, c.name) for c in full.writes if c.action == Action.DELETED} == {
        ("Deployment", f"{NAME}-canary"),
        ("ServiceAccount", f"{NAME}-stray"),
    }


def test_the_record_is_deleted_from_in_the_reverse_of_the_apply_order(api: KubeApi) -> None:
    """The Service before the pods it leads to, the pods before the rights they use: the order
    a full prune keeps."""
    done = reconcile(api, owner(POOLED))
    shrunk = reconcile(api, owner(PLAIN), previous=done.inventory)
    deleted = [(c.kind, c.name) for c in shrunk.writes if c.action == Action.DELETED]
    position = {entry: index for index, entry in enumerate(deleted)}
    assert position["Service", f"{NAME}-epp"] < position["Deployment", f"{NAME}-epp"]
    assert position["Deployment", f"{NAME}-epp"] < position["RoleBinding", f"{NAME}-epp"]
    assert position["RoleBinding", f"{NAME}-epp"] < position["ServiceAccount", f"{NAME}-epp"]


def test_every_owned_kind_has_a_name_of_its_own() -> None:
    """status.inventory records `Kind/name`: two owned kinds of one name would be confused."""
    assert len(OWNED_BY_NAME) == len(OWNED_KINDS)


@pytest.mark.parametrize(
    ("status", "previous"),
    [
        ({"observedGeneration": 2, "inventory": ["Service/x"]}, ["Service/x"]),
        ({"observedGeneration": 3, "inventory": ["Service/x"]}, None),  # this generation's: pruned_inventory
        ({"observedGeneration": 1, "inventory": ["Service/x"]}, None),  # a generation in between
        ({"observedGeneration": 2}, None),  # an older version's status
        ({"observedGeneration": 2, "inventory": ["Service/x"], "rollout": {"phase": "Stable"}}, None),
        (None, None),
    ],
)
def test_only_the_record_of_the_generation_before_narrows_a_spec_changes_prune(
    status: dict | None, previous: list[str] | None
) -> None:
    assert previous_inventory(3, status) == previous


def test_the_record_is_bounded_and_every_examples_set_fits_in_it() -> None:
    """A reconcile reads each recorded entry it no longer wants: the schema bounds the record, so a
    status edited by hand cannot make one spec change thousands of reads; the largest desired set
    of the examples is far below that bound."""
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    largest = max(len(rendered(owner(yaml.safe_load(path.read_text())["spec"]))) for path in examples)
    assert 0 < largest * 2 <= INVENTORY_ITEMS, largest
    service = {"apiVersion": "inference.rocm.dev/v1alpha1", "kind": "InferenceService"}
    service |= {"metadata": {"name": NAME, "namespace": NS}, "spec": spec()}
    fits = service | {"status": {"inventory": [f"Deployment/{NAME}-{n}" for n in range(INVENTORY_ITEMS)]}}
    assert validate_custom_resource(fits) == []
    too_many = service | {"status": {"inventory": [f"Deployment/{NAME}-{n}" for n in range(INVENTORY_ITEMS + 1)]}}
    assert any("inventory" in error for error in validate_custom_resource(too_many))
    too_long = service | {"status": {"inventory": ["Deployment/" + "x" * INVENTORY_ENTRY_LENGTH]}}
    assert any("inventory" in error for error in validate_custom_resource(too_long))
