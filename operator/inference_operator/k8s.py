"""A thin, generic REST layer over the official kubernetes client.

The operator owns objects of several kinds (and a custom resource); instead of one typed API
class per kind it addresses them all by apiVersion/kind through the client's own request
machinery, so auth, TLS and kubeconfig handling stay the library's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from .jsontypes import JsonObject
from .kinds import PLURALS, Kind
from .settings import MANAGER

# How long an add-on API found missing is believed missing before discovery is asked again.
MISSING_API_RECHECK_SECONDS = 60.0


@dataclass(frozen=True)
class Ref:
    """Where one object lives in the API."""

    api_version: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def to(cls, kind: Kind, namespace: str, name: str) -> Ref:
        return cls(kind.api_version, kind.kind, namespace, name)

    @classmethod
    def of(cls, obj: JsonObject) -> Ref:
        meta = obj["metadata"]
        return cls(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])

    def path(self, subresource: str | None = None, collection: bool = False) -> str:
        prefix = "/api" if "/" not in self.api_version else "/apis"
        plural = PLURALS[(self.api_version, self.kind)]
        # No namespace: a cluster-scoped object (a Node).
        where = f"/namespaces/{self.namespace}" if self.namespace else ""
        path = f"{prefix}/{self.api_version}{where}/{plural}"
        if not collection:
            path += f"/{self.name}"
            if subresource:
                path += f"/{subresource}"
        return path


CONNECTIONS = 64


def load_api_client(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """In-cluster service account when there is one, else the kubeconfig at `kubeconfig`
    (the operator passes its KUBECONFIG; the kubernetes package reads that variable only once,
    when it is imported)."""
    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    config = kubernetes.client.Configuration.get_default_copy()
    # One kept-alive connection per handler thread (2 x --concurrency, see __main__); the
    # client's default (5 per core) made the rest reconnect for every request.
    config.connection_pool_maxsize = max(config.connection_pool_maxsize or 0, CONNECTIONS)
    return kubernetes.client.ApiClient(config)


class KubeApi:
    """get / apply / delete / patch-status by reference, returning plain dicts."""

    def __init__(self, api_client: kubernetes.client.ApiClient, timeout: float = 30):
        self._client = api_client
        self._timeout = timeout
        self._served: dict[tuple[str, str], tuple[bool, float]] = {}

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        request = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._client.call_api(*request, _request_timeout=self._timeout)
        response.read()  # type: ignore[no-untyped-call]
        # Deserialised as "object", the body is a dict (the client's annotation says str).
        return cast(JsonObject, self._client.response_deserialize(response, {"2XX": "object"}).data)

    def get(self, ref: Ref) -> JsonObject | None:
        try:
            return self._call("GET", ref.path())
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_objects(self, api_version: str, kind: str, namespace: str, label_selector: str) -> list[JsonObject]:
        """The objects of a kind in `namespace` whose labels match `label_selector` (k=v,...)."""
        path = Ref(api_version, kind, namespace, "").path(collection=True)
        items = self._call("GET", path, query=[("labelSelector", label_selector)]).get("items")
        return list(items or [])

    def apply(self, obj: JsonObject, dry_run: bool = False) -> JsonObject:
        """Server-side apply, which also creates a missing object. One field manager owns
        exactly the fields we send (forcing conflicts: the operator is the authority on
        them); a field we stop sending is removed. `dry_run` validates the whole object with
        the API server's admission and schema and persists nothing."""
        query = [("fieldManager", MANAGER), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        return self._call(
            "PATCH",
            Ref.of(obj).path(),
            body=json.dumps(obj),
            query=query,
            content_type="application/apply-patch+yaml",
        )

    def replace_managed_fields(self, ref: Ref, managed_fields: list[JsonObject], resource_version: str) -> JsonObject:
        """Rewrite an object's field ownership (as client-go's csaupgrade does), guarded by
        its resourceVersion so a concurrent change makes this fail rather than be lost."""
        patch = {"metadata": {"managedFields": managed_fields, "resourceVersion": resource_version}}
        return self._call("PATCH", ref.path(), body=patch, content_type="application/merge-patch+json")

    def serves(self, api_version: str, plural: str) -> bool:
        """Whether the API server serves a resource (an add-on's CRD may be missing).

        A yes is remembered for good, a no for `MISSING_API_RECHECK_SECONDS`, so a cluster
        without the add-on costs one discovery request per interval, not one per reconcile.
        """
        key = (api_version, plural)
        known = self._served.get(key)
        if known is not None and (known[0] or time.monotonic() - known[1] < MISSING_API_RECHECK_SECONDS):
            return known[0]
        prefix = "/api" if "/" not in api_version else "/apis"
        try:
            listing = self._call("GET", f"{prefix}/{api_version}")
        except ApiException as exc:
            if exc.status != 404:
                raise
            listing = {}
        served = any(r.get("name") == plural for r in listing.get("resources") or [])
        self._served[key] = (served, time.monotonic())
        return served

    def delete(self, ref: Ref) -> bool:
        try:
            self._call("DELETE", ref.path(), body={"propagationPolicy": "Background"})
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def patch_status(self, ref: Ref, status: JsonObject, resource_version: str | None = None) -> JsonObject:
        """Merge-patch `status`; with `resource_version`, only if the object is still that one."""
        body: JsonObject = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        return self._call("PATCH", ref.path("status"), body=body, content_type="application/merge-patch+json")

    def update_status(
        self,
        ref: Ref,
        changes: Callable[[JsonObject], JsonObject | None],
        attempts: int = 5,
        known: JsonObject | None = None,
    ) -> tuple[JsonObject | None, JsonObject | None]:
        """Read the object, let `changes(obj)` say which status keys to set, write them guarded by
        the resourceVersion read; on a conflict, read and decide again.

        Status has several writers (reconcile, owned-object events, the autoscaler) and lists such
        as `conditions` are replaced whole by a merge patch: without the guard one writer could
        put back a list another had just changed. `known`, the object as the caller last saw it
        (a watch event's), is decided on first instead of a read: the guard refuses it if it is
        stale, and "nothing to change" is only believed of a fresh read. Returns (the object read
        last, the keys written), or (None, None) when the object is gone.
        """
        for _ in range(attempts):
            copy, known = known, None
            obj = self.get(ref) if copy is None else copy
            if obj is None:
                return None, None
            patch = changes(obj)
            if not patch and copy is not None:
                obj = self.get(ref)  # nothing to change, maybe only in a copy that is out of date
                if obj is None:
                    return None, None
                if _version(obj) != _version(copy):
                    patch = changes(obj)
            if not patch:
                return obj, {}
            try:
                self.patch_status(ref, patch, obj["metadata"].get("resourceVersion"))
            except ApiException as exc:
                if exc.status == 409:
                    continue
                if exc.status == 404:
                    return None, None
                raise
            return obj, patch
        raise ApiException(status=409, reason=f"status of {ref.kind} {ref.name} kept changing")

    def patch(
        self, ref: Ref, patch: JsonObject, subresource: str | None = None, field_manager: str | None = None
    ) -> JsonObject:
        """A merge patch; with `field_manager`, the fields it sets are that manager's."""
        query = [("fieldManager", field_manager)] if field_manager else None
        return self._call(
            "PATCH", ref.path(subresource), body=patch, query=query, content_type="application/merge-patch+json"
        )


def _version(obj: JsonObject) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")
