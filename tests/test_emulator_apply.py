"""The emulated API server writes objects the way a real one does: field ownership under
server-side apply, dry runs, optimistic concurrency and watches from a resourceVersion."""

from __future__ import annotations

import json

import httpx

from testsupport.cluster import Cluster

DEPLOYMENTS = "/apis/apps/v1/namespaces/ml/deployments"
SERVICES = "/api/v1/namespaces/ml/services"


def deployment(gpus: int = 0, metrics_port: int = 9090, name: str = "resnet") -> dict:
    container: dict = {
        "name": "server",
        "image": "ghcr.io/example/server:1",
        "ports": [
            {"name": "http", "containerPort": 8080, "protocol": "TCP"},
            {"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"},
        ],
        "env": [{"name": "MODEL_URI", "value": "pvc://models/resnet"}],
    }
    pod: dict = {"containers": [container]}
    if gpus:
        container["resources"] = {"limits": {"amd.com/gpu": str(gpus)}}
        container["env"].append({"name": "ROCR_VISIBLE_DEVICES", "value": ",".join(map(str, range(gpus)))})
        pod["tolerations"] = [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml", "labels": {"app.kubernetes.io/name": name}},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {"metadata": {"labels": {"app.kubernetes.io/name": name}}, "spec": pod},
        },
    }


def apply(
    cluster: Cluster, obj: dict, manager: str = "operator", base: str = DEPLOYMENTS, **params: str
) -> httpx.Response:
    query = {"fieldManager": manager, "force": "true", **params}
    return httpx.patch(
        f"{cluster.url}{base}/{obj['metadata']['name']}",
        params=query,
        content=json.dumps(obj),
        headers={"Content-Type": "application/apply-patch+yaml"},
        timeout=10,
    )


def post(cluster: Cluster, obj: dict, base: str = DEPLOYMENTS, **params: str) -> httpx.Response:
    return httpx.post(cluster.url + base, params=params, json=obj, timeout=10)


def stored(cluster: Cluster, name: str = "resnet", resource: str = "apps/v1/deployments") -> dict | None:
    return cluster.get(resource, "ml", name)


def container(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]["containers"][0]


def test_apply_creates_a_missing_object_owned_by_its_manager(cluster: Cluster) -> None:
    response = apply(cluster, deployment(gpus=2))
    assert response.status_code in (200, 201), response.text
    managed = stored(cluster)["metadata"]["managedFields"]
    assert [(m["manager"], m["operation"]) for m in managed] == [("operator", "Apply")]
    fields = managed[0]["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"server"}']
    assert '{"containerPort":9090,"protocol":"TCP"}' in "".join(fields["f:ports"])


def test_fields_a_manager_stops_applying_are_removed(cluster: Cluster) -> None:
    apply(cluster, deployment(gpus=2))
    assert apply(cluster, deployment(gpus=0)).status_code == 200
    live = stored(cluster)
    assert "resources" not in container(live)
    assert [e["name"] for e in container(live)["env"]] == ["MODEL_URI"]
    assert "tolerations" not in live["spec"]["template"]["spec"]


def test_a_changed_port_replaces_the_old_entry(cluster: Cluster) -> None:
    apply(cluster, deployment(metrics_port=9090))
    assert apply(cluster, deployment(metrics_port=9091)).status_code == 200
    ports = container(stored(cluster))["ports"]
    assert [(p["name"], p["containerPort"]) for p in ports] == [("http", 8080), ("metrics", 9091)]


def test_fields_set_by_post_survive_another_managers_apply(cluster: Cluster) -> None:
    # A real API server: the POSTing client's manager (operation Update) keeps owning what it
    # created; an apply by another manager never removes those fields.
    assert post(cluster, deployment(gpus=2)).status_code == 200
    managed = stored(cluster)["metadata"]["managedFields"]
    assert [(m["manager"], m["operation"]) for m in managed] == [("python-httpx", "Update")]
    assert apply(cluster, deployment(gpus=0)).status_code == 200
    live = stored(cluster)
    assert container(live)["resources"]["limits"]["amd.com/gpu"] == "2"
    assert "ROCR_VISIBLE_DEVICES" in [e["name"] for e in container(live)["env"]]
    assert live["spec"]["template"]["spec"]["tolerations"]


def test_a_port_change_after_post_piles_up_and_is_refused(cluster: Cluster) -> None:
    post(cluster, deployment(metrics_port=9090))
    response = apply(cluster, deployment(metrics_port=9091))
    assert response.status_code == 422
    assert 'spec.template.spec.containers[0].ports[2].name: Duplicate value: "metrics"' in response.json()["message"]
    assert container(stored(cluster))["ports"][1]["containerPort"] == 9090  # nothing stored


def test_a_field_another_manager_still_owns_stays(cluster: Cluster) -> None:
    apply(cluster, deployment(gpus=2), manager="operator")
    env = {
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "server", "env": [{"name": "ROCR_VISIBLE_DEVICES", "value": "0,1"}]}]}
            }
        }
    }
    assert apply(cluster, {**deployment(), **env, "metadata": {"name": "resnet"}}, manager="admin").status_code == 200
    apply(cluster, deployment(gpus=0), manager="operator")
    names = [e["name"] for e in container(stored(cluster))["env"]]
    assert names == ["MODEL_URI", "ROCR_VISIBLE_DEVICES"]
    assert "resources" not in container(stored(cluster))


def test_conflicting_apply_without_force_is_409(cluster: Cluster) -> None:
    apply(cluster, deployment(), manager="operator")
    changed = deployment()
    container(changed)["image"] = "ghcr.io/example/server:2"
    response = apply(cluster, changed, manager="admin", force="false")
    assert response.status_code == 409
    assert 'conflict with "operator"' in response.json()["message"]
    assert apply(cluster, changed, manager="admin").status_code == 200  # force takes it over
    owners = {m["manager"]: json.dumps(m["fieldsV1"]) for m in stored(cluster)["metadata"]["managedFields"]}
    assert "f:image" in owners["admin"] and "f:image" not in owners["operator"]


def test_merge_patch_takes_ownership_and_rewritten_managed_fields_are_kept(cluster: Cluster) -> None:
    post(cluster, deployment(gpus=2))
    # What client-go's csaupgrade does: hand the creator's fields to the apply manager.
    live = stored(cluster)
    entry = live["metadata"]["managedFields"][0]
    upgraded = [{**entry, "manager": "operator", "operation": "Apply"}]
    patch = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": live["metadata"]["resourceVersion"]},
        {"op": "replace", "path": "/metadata/managedFields", "value": upgraded},
    ]
    response = httpx.patch(
        f"{cluster.url}{DEPLOYMENTS}/resnet",
        content=json.dumps(patch),
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert response.status_code == 200, response.text
    assert apply(cluster, deployment(gpus=0)).status_code == 200
    assert "resources" not in container(stored(cluster))


def test_dry_run_validates_and_answers_without_storing(cluster: Cluster) -> None:
    response = apply(cluster, deployment(gpus=2), dryRun="All")
    assert response.status_code in (200, 201)
    assert container(response.json())["resources"]["limits"]["amd.com/gpu"] == "2"
    assert stored(cluster) is None
    assert post(cluster, deployment(), dryRun="All").status_code == 200
    assert stored(cluster) is None
    apply(cluster, deployment())
    version = stored(cluster)["metadata"]["resourceVersion"]
    assert apply(cluster, deployment(gpus=1), dryRun="All").status_code == 200
    assert stored(cluster)["metadata"]["resourceVersion"] == version
    assert cluster.emulator.dry_runs["deployments:update"] == 2
    assert cluster.emulator.writes["deployments:create"] == 1  # the apply that created it
    assert cluster.emulator.writes["deployments:update"] == 0


def test_a_no_op_write_stores_nothing(cluster: Cluster) -> None:
    apply(cluster, deployment())
    version = stored(cluster)["metadata"]["resourceVersion"]
    assert apply(cluster, deployment()).status_code == 200
    assert stored(cluster)["metadata"]["resourceVersion"] == version
    assert len(cluster.emulator.objects["apps/v1/deployments", "ml", "resnet"].history) == 1


def test_a_stale_resource_version_is_a_conflict(cluster: Cluster) -> None:
    apply(cluster, deployment())
    patch = {"metadata": {"resourceVersion": "0", "labels": {"x": "y"}}}
    assert cluster.patch("apps/v1/deployments", "ml", "resnet", patch).status_code == 409


def test_strategic_merge_patch_merges_containers_by_name(cluster: Cluster) -> None:
    apply(cluster, deployment(gpus=1))
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "server", "image": "other:1"}]}}}}
    response = cluster.request(
        "PATCH", f"{DEPLOYMENTS}/resnet", patch, content_type="application/strategic-merge-patch+json"
    )
    assert response.status_code == 200
    live = container(stored(cluster))
    assert live["image"] == "other:1" and live["resources"]["limits"]["amd.com/gpu"] == "1"


def test_a_watch_from_a_list_sends_only_later_changes(cluster: Cluster) -> None:
    apply(cluster, deployment(name="a"))
    listed = httpx.get(f"{cluster.url}{DEPLOYMENTS}").json()
    version = listed["metadata"]["resourceVersion"]
    assert version == stored(cluster, "a")["metadata"]["resourceVersion"]
    apply(cluster, deployment(name="b"))
    with httpx.stream(
        "GET", f"{cluster.url}{DEPLOYMENTS}", params={"watch": "true", "resourceVersion": version}, timeout=5
    ) as stream:
        first = json.loads(next(stream.iter_lines()))
    assert first["object"]["metadata"]["name"] == "b"
