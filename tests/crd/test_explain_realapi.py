"""`kubectl explain` on a real API server with the shipped CRD: the API server publishes every
field's description (its OpenAPI v3 document for the group), and kubectl shows it, for
`spec.model`, `spec.runtime.batching.maxBatchSize` and the rest.
tests/crd/test_crd_descriptions.py holds the CRD file itself to the same rule."""

from __future__ import annotations

from typing import Any

import pytest

from tests.crd.test_crd_descriptions import properties
from testsupport.cluster import wait_for
from testsupport.crd import crd_schema
from testsupport.envtest import ApiServer

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]

OPENAPI = "/openapi/v3/apis/inference.rocm.dev/v1alpha1"


def published_schema(apiserver: ApiServer) -> dict[str, Any] | None:
    """The InferenceService's schema in the API server's OpenAPI v3 document, once it has one
    with its spec (the API server publishes a new CRD's schema shortly after it is Established)."""
    with apiserver.client() as client:
        response = client.get(OPENAPI)
    if response.status_code != 200:
        return None
    for schema in response.json().get("components", {}).get("schemas", {}).values():
        kinds = schema.get("x-kubernetes-group-version-kind") or []
        if any(k.get("kind") == "InferenceService" for k in kinds) and "spec" in schema.get("properties", {}):
            return dict(schema)
    return None


def shipped_description(path: str) -> str:
    node = crd_schema()
    for part in path.split("."):
        node = node["properties"][part]
    return str(node["description"])


def test_the_published_openapi_describes_every_field(apiserver: ApiServer) -> None:
    schema = wait_for(lambda: published_schema(apiserver), timeout=60, message="the CRD's published OpenAPI schema")
    found = dict(properties(schema))
    assert {"spec.model", "spec.runtime.batching.maxBatchSize", "status.conditions[].reason"} <= set(found)
    # metadata is Kubernetes' own ObjectMeta, published by reference: its fields are not the CRD's.
    undescribed = [
        path
        for path, node in found.items()
        if not path.startswith("metadata.") and not str(node.get("description") or "").strip()
    ]
    assert undescribed == [], f"published without a description: {undescribed}"
    for path in ("spec.model", "spec.runtime.batching.maxBatchSize"):
        assert found[path]["description"] == shipped_description(path)


def explained(apiserver: ApiServer, field: str) -> str | None:
    """`kubectl explain ris.FIELD`'s text, or None while the API server's discovery does not yet
    list the short name (a moment after the CRD is Established)."""
    result = apiserver.kubectl("explain", f"ris.{field}", check=False)
    if result.returncode != 0:
        assert "doesn't have a resource type" in result.stderr, result.stderr
        return None
    return result.stdout


@pytest.mark.parametrize("field", ["spec", "spec.model", "spec.runtime.batching.maxBatchSize"])
def test_kubectl_explain_shows_the_description(apiserver: ApiServer, field: str) -> None:
    out = wait_for(lambda: explained(apiserver, field), timeout=60, interval=1, message="kubectl explain ris")
    assert "<no description>" not in out and "<empty>" not in out, out
    # kubectl wraps the text to its width: compare word by word.
    assert " ".join(shipped_description(field).split()) in " ".join(out.split()), out
