"""reconcile() as named steps whose per-kind behaviour comes from the kinds table: the apply
order, the kinds dropped when a credential is refused, the kinds whose live replica count is
kept. Checked against a recording API, so the order of calls is seen exactly."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from inference_operator import reconcile as rc
from inference_operator.builders import Owner, build_all
from inference_operator.builders.common import Role
from inference_operator.k8s import Ref
from inference_operator.kinds import APPLY_ORDER, BY_KEY, KINDS, in_apply_order
from inference_operator.models import parse_spec
from inference_operator.settings import MANAGER, CredentialPolicy

KEDA_SPEC = {
    "model": {"uri": "pvc://models/resnet"},
    "resources": {"gpu": {"count": 1, "allocation": "dra"}},
    "autoscaling": {
        "mode": "keda",
        "minReplicas": 1,
        "maxReplicas": 4,
        "metric": "queueDepth",
        "target": 4,
        "prometheusUrl": "https://prometheus.example",
        "prometheusAuth": {"bearerTokenSecret": {"name": "prom", "key": "token"}},
    },
}


class RecordingApi:
    """Answers like an empty cluster that serves every kind; records writes in order."""

    def __init__(
        self, objects: dict[tuple[str, str], dict] | None = None, refuse: str = "", refusal: int = 422
    ) -> None:
        self.objects = objects or {}
        self.applied: list[tuple[str, bool]] = []
        self.deleted: list[str] = []
        self.read: list[tuple[str, str]] = []
        self.refuse, self.refusal = refuse, refusal  # a kind whose apply the API server refuses, and how

    def get(self, ref: Ref) -> dict | None:
        self.read.append((ref.kind, ref.name))
        return copy.deepcopy(self.objects.get((ref.kind, ref.name)))

    def list_objects(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict]:
        self.read.append((kind, ""))
        wanted = dict(term.split("=", 1) for term in selector.split(","))
        return [
            copy.deepcopy(obj)
            for (k, _), obj in self.objects.items()
            if k == kind and (obj["metadata"].get("labels") or {}).items() >= wanted.items()
        ]

    def serves(self, api_version: str, plural: str) -> bool:
        return True

    def apply(self, obj: dict, dry_run: bool = False) -> dict:
        self.applied.append((obj["kind"], dry_run))
        if obj["kind"] == self.refuse:
            raise ApiException(status=self.refusal, reason="refused")
        return obj

    def delete(self, ref: Ref) -> bool:
        self.deleted.append(ref.kind)
        return self.objects.pop((ref.kind, ref.name), None) is not None


def owner(spec: dict[str, Any] = KEDA_SPEC) -> Owner:
    return Owner(name="resnet", namespace="ml", uid="u-1", spec=parse_spec(spec))


SECRET = {"metadata": {"name": "prom", "labels": {"inference.rocm.dev/prometheus-credentials": "true"}}}


def test_objects_are_applied_in_the_order_of_the_kinds_table_whatever_build_all_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = build_all(owner())
    kinds = [o["kind"] for o in built]
    assert {"ResourceClaimTemplate", "Deployment", "TriggerAuthentication", "ScaledObject"} <= set(kinds)
    monkeypatch.setattr(rc, "build_all", lambda _: list(reversed(built)))  # the worst order
    api = RecordingApi({("Secret", "prom"): SECRET})
    rc.reconcile(api, owner(), CredentialPolicy(allowed_urls=("https://prometheus.example",)))
    expected = [k.kind for k in KINDS if k.kind in kinds]
    assert [kind for kind, dry in api.applied if dry] == expected  # the dry run too
    assert [kind for kind, dry in api.applied if not dry] == expected


def test_the_table_puts_what_is_referenced_before_what_references_it() -> None:
    position = {k.kind: APPLY_ORDER[k.key] for k in KINDS}
    assert position["ResourceClaimTemplate"] < position["Deployment"]  # the pods name the template
    assert position["TriggerAuthentication"] < position["ScaledObject"]  # the ScaledObject names it
    objects = [{"apiVersion": k.api_version, "kind": k.kind} for k in reversed(KINDS)]
    assert [o["kind"] for o in in_apply_order(objects)] == [k.kind for k in KINDS]


def test_a_refused_credential_drops_exactly_the_kinds_that_would_send_it() -> None:
    api = RecordingApi({("Secret", "prom"): {"metadata": {"name": "prom"}}})  # not labelled
    result = rc.reconcile(api, owner(), CredentialPolicy(allowed_urls=("https://prometheus.example",)))
    assert result.problem is not None and result.problem.reason == "PrometheusSecretNotLabelled"
    applied = {kind for kind, _ in api.applied}
    senders = {k.kind for k in KINDS if k.sends_credentials}
    assert senders == {"TriggerAuthentication", "ScaledObject"}
    assert applied.isdisjoint(senders) and {"Deployment", "Service"} <= applied


def test_the_live_replica_count_is_kept_only_for_kinds_that_say_so() -> None:
    desired = next(o for o in build_all(owner()) if o["kind"] == "Deployment")
    assert "replicas" not in desired["spec"]  # KEDA owns the count
    live = {"spec": {"replicas": 3}}
    assert rc.keep_foreign_replicas(desired, live)["spec"]["replicas"] == 3
    service = next(o for o in build_all(owner()) if o["kind"] == "Service")
    assert not BY_KEY["v1", "Service"].keeps_live_replicas
    assert rc.keep_foreign_replicas(service, live) is service


@pytest.mark.parametrize(
    ("generation", "status", "first"),
    [
        (1, None, True),
        (1, {"conditions": []}, True),  # another writer's status, no reconcile finished
        (1, {"observedGeneration": 1}, False),
        (2, None, False),  # the spec changed since it was created: the first spec's objects may be left
        (None, None, False),
    ],
)
def test_only_a_first_generation_no_reconcile_finished_is_a_first_reconcile(
    generation: int | None, status: dict | None, first: bool
) -> None:
    assert rc.never_reconciled(generation, status) is first


PLAIN = {"model": {"uri": "pvc://models/resnet"}, "replicas": 2}


def test_a_first_reconcile_reads_only_what_it_applies_and_prunes_nothing() -> None:
    api = RecordingApi()
    result = rc.reconcile(api, owner(PLAIN), first=True)
    applied = [(o["kind"], o["metadata"]["name"]) for o in build_all(owner(PLAIN))]
    assert sorted(api.read) == sorted(applied)
    assert {c.kind for c in result.writes} == {kind for kind, _ in applied}
    # Any later reconcile looks for what the service no longer wants, and deletes it.
    labels = {"app.kubernetes.io/instance": "resnet", "app.kubernetes.io/managed-by": MANAGER}
    stale = {"metadata": {"name": "resnet", "labels": labels, "ownerReferences": [{"uid": "u-1"}]}}
    api = RecordingApi({("HorizontalPodAutoscaler", "resnet"): stale})
    rc.reconcile(api, owner(PLAIN))
    assert len(api.read) > len(applied) and api.deleted == ["HorizontalPodAutoscaler"]


# A service with a Deployment, a Service, a PodDisruptionBudget and an HPA.
SCALED = {
    "model": PLAIN["model"],
    "autoscaling": {"mode": "hpa", "minReplicas": 2, "maxReplicas": 4, "metric": "rps", "target": 70},
}


def test_a_new_service_is_created_without_a_dry_run_its_deployment_last() -> None:
    api = RecordingApi()
    result = rc.reconcile(api, owner(SCALED), first=True)
    kinds = [o["kind"] for o in in_apply_order(build_all(owner(SCALED)))]
    assert {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"} <= set(kinds)
    assert not [kind for kind, dry in api.applied if dry]
    assert [kind for kind, _ in api.applied] == [k for k in kinds if k != "Deployment"] + ["Deployment"]
    assert [c.kind for c in result.writes] == kinds  # reported in the table's order
    assert result.workloads[Role.PREDICTOR]["kind"] == "Deployment"


@pytest.mark.parametrize("refused", ["PodDisruptionBudget", "Deployment"])
def test_a_refused_new_object_leaves_nothing_and_no_pod_ever_ran(refused: str) -> None:
    api = RecordingApi(refuse=refused)
    with pytest.raises(rc.ApplyRefused, match=refused):
        rc.reconcile(api, owner(SCALED), first=True)
    written = [kind for kind, _ in api.applied]
    assert written[-1] == refused
    if refused != "Deployment":
        assert "Deployment" not in written
    assert api.deleted == list(reversed(written[:-1]))  # every object created before it, newest first


def test_a_new_set_whose_workload_is_forbidden_is_deleted_again_and_the_403_retried() -> None:
    """An admission policy's or webhook's 403 (or RBAC's): a person has to act, so the handler
    retries it (raised as it came), and the objects created before it are deleted meanwhile."""
    api = RecordingApi(refuse="Deployment", refusal=403)
    with pytest.raises(ApiException) as raised:
        rc.reconcile(api, owner(SCALED), first=True)
    assert raised.value.status == 403
    written = [kind for kind, _ in api.applied]
    assert written[-1] == "Deployment" and api.deleted == list(reversed(written[:-1])) != []


@pytest.mark.parametrize("status", [409, 429, 500])
def test_a_new_set_whose_workload_fails_for_a_while_is_kept_for_the_retry(status: int) -> None:
    """A conflict, throttling, a 5xx: the retry finds what was created and creates nothing twice."""
    api = RecordingApi(refuse="Deployment", refusal=status)
    with pytest.raises(ApiException) as raised:
        rc.reconcile(api, owner(SCALED), first=True)
    assert raised.value.status == status and not api.deleted


def test_a_cleanup_leaves_an_object_someone_else_made_between_the_read_and_the_create() -> None:
    """The read found no Service, but another client created one before the apply, which took
    it over: its managedFields name that client. A later refusal deletes only what the operator
    alone made."""

    class Raced(RecordingApi):
        def apply(self, obj: dict, dry_run: bool = False) -> dict:
            answer = super().apply(obj, dry_run)
            managers = [{"manager": "someone", "operation": "Update"}] if obj["kind"] == "Service" else []
            managers.append({"manager": MANAGER, "operation": "Apply"})
            status = [{"manager": "kube-controller-manager", "operation": "Update", "subresource": "status"}]
            return {**answer, "metadata": {**answer["metadata"], "managedFields": managers + status}}

    api = Raced(refuse="Deployment")
    with pytest.raises(rc.ApplyRefused):
        rc.reconcile(api, owner(SCALED), first=True)
    written = [kind for kind, _ in api.applied]
    assert "Service" in written and "Service" not in api.deleted
    assert api.deleted == [kind for kind in reversed(written[:-1]) if kind != "Service"] != []


def test_a_set_of_which_something_exists_is_dry_run_first_even_on_a_first_reconcile() -> None:
    """A reconcile cut short after its first writes: the retry is no longer a pure create."""
    built = {o["kind"]: o for o in build_all(owner(SCALED))}
    service = {**built["Service"], "metadata": {**built["Service"]["metadata"], "ownerReferences": [{"uid": "u-1"}]}}
    api = RecordingApi({("Service", "resnet"): service}, refuse="PodDisruptionBudget")
    with pytest.raises(rc.ApplyRefused, match="PodDisruptionBudget"):
        rc.reconcile(api, owner(SCALED), first=True)
    assert all(dry for _, dry in api.applied) and not api.deleted  # refused by the dry run: nothing written
