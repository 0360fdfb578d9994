"""A service's pods: what is wrong with them in its status within seconds, cleared once they
are well."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from .. import metrics, status_pods
from ..builders.common import COMPONENT, OWNER_LABEL
from ..jsontypes import JsonObject
from ..k8s import KubeApi
from ..kinds import POD
from ..settings import MANAGER
from ..status import DEGRADED, find_condition
from .shared import (
    POD_ROLES,
    announce_pods,
    announce_readiness,
    by_ref,
    isvc_ref,
    kept_problem,
    publish,
    refresh_status,
    workload_refs,
)


@kopf.on.event(
    POD.group,
    POD.version,
    POD.plural,
    labels={"app.kubernetes.io/managed-by": MANAGER, "app.kubernetes.io/component": COMPONENT},
    id="service-pods",
)
@metrics.instrumented("pod_event")
async def pod_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Say within seconds what is wrong with a service's pods (status_pods), and clear it once
    they are well: a Deployment says only that replicas are unavailable, and ten minutes on."""
    meta = body["metadata"]
    name = (meta.get("labels") or {}).get(OWNER_LABEL)
    if not name:
        return
    pod = dict(body)
    troubled = event["type"] != "DELETED" and (
        status_pods.pod_problem_of(pod, POD_ROLES) is not None or status_pods.marked_not_ready(pod)
    )
    api: KubeApi = memo.api
    ref = isvc_ref(meta["namespace"], name)

    def compute(fresh: JsonObject) -> JsonObject | None:
        status, generation = fresh.get("status") or {}, fresh["metadata"].get("generation")
        degraded = find_condition(status.get("conditions"), DEGRADED) or {}
        shown = degraded.get("status") == "True" and degraded.get("reason") in status_pods.REASONS
        if not (troubled or shown) or fresh["metadata"].get("deletionTimestamp"):
            return None  # nothing to say and nothing to clear: one read, no write
        if status.get("observedGeneration") != generation:
            return None  # a reconcile of this generation is under way and reads the pods itself
        return refresh_status(api, fresh, by_ref(api, workload_refs(fresh)), kept_problem(fresh))

    try:
        previous, new_status = await asyncio.to_thread(publish, memo, ref, compute)
        isvc = await asyncio.to_thread(api.get, ref) if new_status != previous else None
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        logger.warning("pod event not handled: %s", exc)
        return
    if isvc is not None:
        announce_readiness(isvc, previous, new_status)
        announce_pods(isvc, previous, new_status)
