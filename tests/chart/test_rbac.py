"""The chart's RBAC covers every API call the operator makes, and grants nothing it does not.

What the operator needs is derived from the code, not listed by hand:

- kopf's registry (the handlers `inference_operator.handlers` registers): every watched
  resource needs list+watch; resources with change handlers or daemons/timers also patch
  (kopf keeps its progress and last-handled state in annotations);
- kopf's own machinery for the handlers registered: events create, CRDs and namespaces
  list+watch (discovery), the peering resource list+watch+patch;
- `k8s.PLURALS` (every kind the operator reads or writes): get; `builders.OWNED_KINDS`
  (what reconcile applies, which creates, and deletes): get+create+patch+delete; the CRD's
  subresources (status for conditions, scale for the autoscaler): patch;
- and, as a check on all of the above, the requests the operator really sends: the running
  operator (kopf, with peering) and `reconcile()` over every example in every autoscaling mode,
  against the emulated cluster, whose request log is turned into (verb, group, resource).

The rules live as plain YAML in charts/rocm-inference-operator/files/rbac/ and the templates
include them verbatim (tests/chart/test_helm.py checks the rendered roles).
"""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Iterable

import kmock
import kopf
import kubernetes
import pytest
import yaml
from kopf.testing import KopfRunner

from inference_operator import k8s
from inference_operator.builders import OWNED_KINDS, Owner
from inference_operator.builders.endpoint_picker import CLUSTER_ROLE as PICKER_CLUSTER_ROLE
from inference_operator.builders.router import CLUSTER_ROLE as ROUTER_CLUSTER_ROLE
from inference_operator.credentials import MODEL_SECRET_LABEL
from inference_operator.k8s import KubeApi, Ref
from inference_operator.kinds import kind_of
from inference_operator.models import AutoscalingMode, parse_spec
from inference_operator.reconcile import reconcile
from tests.chart import helm as h
from testsupport.cluster import Cluster, wait_for
from testsupport.crd import crd
from testsupport.emulator import declare

RBAC = h.CHART / "files" / "rbac"
EXAMPLES = sorted((h.ROOT / "examples").glob("*.yaml"))
Permission = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

# kopf's backbone resources and what kopf does with each (kopf/_cogs/structs/references.py).
KOPF_BACKBONE_VERBS = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): ("list", "watch"),
    ("", "namespaces"): ("list", "watch"),
    ("", "events"): ("create",),
}
KOPF_PEERING_VERBS = ("list", "watch", "patch")


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def rules_permissions(rules: Iterable[dict]) -> set[Permission]:
    granted = set()
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "*" not in rule.get("apiGroups", []), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted |= {(group, resource, verb) for verb in rule["verbs"]}
    return granted


def rule_file(name: str) -> list[dict]:
    return yaml.safe_load((RBAC / f"{name}.yaml").read_text())


def cluster_wide_grant() -> set[Permission]:
    files = ("operator", "discovery", "peering-cluster", "secrets")
    return rules_permissions([rule for name in files for rule in rule_file(name)])


def namespaced_grant() -> set[Permission]:
    return rules_permissions(rule_file("operator") + rule_file("peering-namespaced") + rule_file("secrets"))


def _registry_permissions() -> set[Permission]:
    import inference_operator.handlers  # noqa: F401  (registers the handlers with kopf)

    registry = kopf.get_default_registry()
    needed: set[Permission] = set()
    watchers = [*registry._watching.get_all_handlers(), *registry._indexing.get_all_handlers()]  # noqa: SLF001
    writers = [*registry._changing.get_all_handlers(), *registry._spawning.get_all_handlers()]  # noqa: SLF001
    assert writers, "no change handlers registered: the registry derivation found nothing"
    for handler in watchers + writers:
        selector = handler.selector
        needed |= {(selector.group, selector.plural or selector.any_name, verb) for verb in ("list", "watch")}
    for handler in writers:
        selector = handler.selector
        needed.add((selector.group, selector.plural or selector.any_name, "patch"))
    assert not registry._webhooks.get_all_handlers(), "webhooks need admissionregistration RBAC"  # noqa: SLF001
    return needed


def derived_from_code() -> set[Permission]:
    needed = _registry_permissions()
    for (group, resource), verbs in KOPF_BACKBONE_VERBS.items():
        needed |= {(group, resource, verb) for verb in verbs}
    for api_version, kind in k8s.PLURALS:
        verb = "list" if kind_of(api_version, kind).listed else "get"
        needed.add((group_of(api_version), k8s.PLURALS[api_version, kind], verb))
    for api_version, kind in OWNED_KINDS:
        plural = k8s.PLURALS[api_version, kind]
        needed |= {(group_of(api_version), plural, verb) for verb in ("get", "create", "patch", "delete")}
    # The endpoint picker's RoleBinding names a ClusterRole the operator does not hold: `bind`.
    needed.add(("rbac.authorization.k8s.io", "clusterroles", "bind"))
    definition = crd()
    plural = definition["spec"]["names"]["plural"]
    for sub in definition["spec"]["versions"][0].get("subresources") or {}:
        needed.add((definition["spec"]["group"], f"{plural}/{sub}", "patch"))
    return needed


def observed(requests: Iterable[kmock.Request]) -> set[Permission]:
    """(group, resource, verb) of the operator's resource requests in an emulator's log.

    The test's own requests (httpx, playing kubectl) are left out.
    """
    seen: set[Permission] = set()
    for request in requests:
        if request.headers.get("User-Agent", "").startswith("python-httpx"):
            continue
        resource = request.resource
        if resource is None or not resource.plural or request.action is None:
            continue  # discovery (/api, /apis/...): allowed to every authenticated user
        action = request.action
        if action == kmock.action.FETCH:
            verb = "get"
        elif action == kmock.action.UPDATE:
            verb = "update" if request.method == kmock.method.PUT else "patch"
        elif action == kmock.action.DELETE and request.name is None:
            verb = "deletecollection"
        else:
            verb = action.name.lower()
        name = resource.plural + (f"/{request.subresource}" if request.subresource else "")
        seen.add((resource.group or "", name, verb))
    return seen


def _kube_api(cluster: Cluster) -> KubeApi:
    client = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    return KubeApi(client, timeout=10)


def _drive_reconcile(cluster: Cluster) -> None:
    """Every builder path through real API calls: create, update, delete, status, scale."""
    api = _kube_api(cluster)
    # The Hub token an example names, opted in, so its Deployment is rendered (credentials.py).
    token = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf-token", "namespace": "ml", "labels": {MODEL_SECRET_LABEL: "true"}},
        "data": {"token": "aGZfeA=="},
    }
    assert cluster.request("POST", "/api/v1/namespaces/ml/secrets", token, content_type="application/json").is_success
    for number, path in enumerate(EXAMPLES):
        doc = yaml.safe_load(path.read_text())
        doc["metadata"] = {"name": f"isvc-{number}", "namespace": "ml"}
        response = cluster.apply_cr(doc)
        assert response.status_code in (200, 201), response.text
        uid = response.json()["metadata"]["uid"]
        variants = []
        # A disaggregated service scales each role on its own; spec.autoscaling is refused beside it.
        for mode in AutoscalingMode if "disaggregation" not in doc["spec"] else ():
            spec = copy.deepcopy(doc["spec"])
            spec["autoscaling"] = {
                **spec.get("autoscaling", {}),
                "mode": mode.value,
                "minReplicas": 2,
                "maxReplicas": 4,
                "target": 50,
            }
            variants.append(spec)
        plain = copy.deepcopy(doc["spec"])
        plain.pop("autoscaling", None)
        plain["replicas"] = 1
        for spec in [*variants, plain]:  # each step adds, changes and removes owned objects
            reconcile(api, Owner(name=f"isvc-{number}", namespace="ml", uid=uid, spec=parse_spec(spec)))
        ref = Ref("inference.rocm.dev/v1alpha1", "InferenceService", "ml", f"isvc-{number}")
        api.patch_status(ref, {"replicas": 1})
        api.patch(ref, {"spec": {"replicas": 2}}, subresource="scale")
        # Gone before the operator starts: it is left its own InferenceService to handle.
        path = f"/apis/inference.rocm.dev/v1alpha1/namespaces/ml/inferenceservices/isvc-{number}"
        assert cluster.request("DELETE", path).status_code == 200


def test_rbac_rule_files_are_valid_yaml_lists_of_rules() -> None:
    for path in RBAC.glob("*.yaml"):
        rules = yaml.safe_load(path.read_text())
        assert isinstance(rules, list) and rules, path
        for rule in rules:
            assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, (path, rule)


def test_cluster_role_grants_what_the_code_needs_and_no_more() -> None:
    needed = derived_from_code() | {("kopf.dev", "clusterkopfpeerings", v) for v in KOPF_PEERING_VERBS}
    granted = cluster_wide_grant()
    assert needed - granted == set(), "the ClusterRole misses permissions the operator uses"
    assert granted - needed == set(), "the ClusterRole grants permissions nothing uses"


def test_namespaced_role_grants_what_the_code_needs_inside_namespaces() -> None:
    cluster_scoped = {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces"), ("", "nodes")}
    needed = {p for p in derived_from_code() if p[:2] not in cluster_scoped}
    needed |= {("kopf.dev", "kopfpeerings", v) for v in KOPF_PEERING_VERBS}
    granted = namespaced_grant()
    assert needed - granted == set()
    assert granted - needed == set()
    assert not {p for p in granted if p[:2] in cluster_scoped}
    assert rules_permissions(rule_file("discovery")) <= {
        (g, r, v) for g, r in cluster_scoped for v in ("get", "list", "watch")
    }


def test_the_operator_binds_only_the_pickers_and_routers_cluster_roles_and_holds_none_of_their_rights() -> None:
    binds = [rule for rule in rule_file("operator") if "bind" in rule["verbs"]]
    assert binds == [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "resourceNames": [role],
            "verbs": ["bind"],
        }
        for role in (PICKER_CLUSTER_ROLE, ROUTER_CLUSTER_ROLE)
    ]
    assert not [
        r for f in RBAC.glob("*.yaml") for r in rule_file(f.stem) if {"escalate", "impersonate"} & set(r["verbs"])
    ]
    picker = rules_permissions(rule_file("endpoint-picker"))
    assert {v for _, _, v in picker} == {"get", "list", "watch"}
    assert ("", "pods", "watch") in picker and ("inference.networking.k8s.io", "inferencepools", "watch") in picker
    # The pickers read pods; the operator watches pods too, but its own (its services' pods,
    # for status), which the derived-needs tests above hold it to: never for the pickers.
    template = (h.CHART / "templates" / "endpoint-picker-rbac.yaml").read_text()
    assert f"name: {PICKER_CLUSTER_ROLE}\n" in template and '(list "endpoint-picker")' in template
    # The routers: get, list and watch pods, nothing else (they find the replicas by label).
    assert rules_permissions(rule_file("router")) == {("", "pods", verb) for verb in ("get", "list", "watch")}
    template = (h.CHART / "templates" / "router-rbac.yaml").read_text()
    assert f"name: {ROUTER_CLUSTER_ROLE}\n" in template and '(list "router")' in template


def test_secrets_are_only_read_by_name() -> None:
    for grant in (cluster_wide_grant(), namespaced_grant()):
        assert {v for g, r, v in grant if (g, r) == ("", "secrets")} == {"get"}
    # Secrets have a rule file of their own, granted only where Prometheus credentials are on.
    assert rules_permissions(rule_file("secrets")) == {("", "secrets", "get")}
    assert not {p for p in rules_permissions(rule_file("operator")) if p[1] == "secrets"}


@pytest.mark.slow
@pytest.mark.integration
def test_every_request_the_operator_sends_is_granted(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    """The real operator, cluster-wide with peering, and reconcile() over all examples."""
    for key, kind, namespaced in [
        ("kopf.dev/v1/clusterkopfpeerings", "ClusterKopfPeering", False),
        ("kopf.dev/v1/kopfpeerings", "KopfPeering", True),
    ]:
        declare(cluster.emulator, key, kind, namespaced=namespaced, verbs=("list", "watch", "get", "create", "patch"))
    assert cluster.request(
        "POST",
        "/apis/kopf.dev/v1/clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "rbac-check"}},
        content_type="application/json",
    ).status_code in (200, 201)
    first_request = len(list(cluster.emulator))

    _drive_reconcile(cluster)

    args = ["run", "--all-namespaces", "--peering", "rbac-check", "--verbose", "-m", "inference_operator.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        service = yaml.safe_load(EXAMPLES[0].read_text())
        service["metadata"] = {"name": "watched", "namespace": "ml"}
        service["spec"].pop("autoscaling", None)
        assert cluster.apply_cr(service).status_code in (200, 201)
        wait_for(
            lambda: (cluster.get_cr("ml", "watched").get("status") or {}).get("url"),
            timeout=45,
            message="the operator (once it holds the peering) to reconcile",
        )
        # A deleted Deployment is put back (the event handler's read-and-restore path).
        assert cluster.request("DELETE", "/apis/apps/v1/namespaces/ml/deployments/watched").status_code == 200
        wait_for(
            lambda: cluster.get("apps/v1/deployments", "ml", "watched"), timeout=30, message="the Deployment restored"
        )
    assert runner.exception is None, runner.exception

    used = observed(list(cluster.emulator)[first_request:])
    # Owned objects are only ever server-side applied (PATCH); an apply that creates an object
    # is authorized as `create` as well by a real API server, hence both verbs in the grant.
    assert ("apps", "deployments", "patch") in used and ("", "events", "create") in used
    assert ("apps", "deployments", "create") not in used
    assert any(r.startswith("inferenceservices/") for _, r, _ in used)
    granted = cluster_wide_grant()
    assert used - granted == set(), "the operator sent requests its ClusterRole would forbid"
