"""kopf handlers of scale to zero: the activator's addresses, and the wake (scale_to_zero.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from ..builders.activator import SERVICE_NAME_LABEL, WAKE_ANNOTATION, ActivatorEndpoints, Wake, asked_replicas
from ..k8s import KubeApi
from ..kinds import ENDPOINT_SLICE, INFERENCE_SERVICE
from ..models import SpecError, parse_spec
from ..reasons import Reason
from ..scale_to_zero import Registry, wake_replicas
from ..scale_to_zero import wake as scale_to_zero_wake
from ..settings import ActivatorSettings
from .shared import isvc_ref, status_lock

# A label selector no object matches: without an activator, no EndpointSlice is watched at all.
NOTHING = f"{SERVICE_NAME_LABEL},!{SERVICE_NAME_LABEL}"


def activator_selector(settings: ActivatorSettings) -> str:
    """The server-side selector of the slices the operator watches: the activator Service's."""
    return f"{SERVICE_NAME_LABEL}={settings.service}" if settings.enabled else NOTHING


def watch_activator_only(settings: kopf.OperatorSettings, activator: ActivatorSettings) -> None:
    """Called at startup: the cluster's EndpointSlices are many, the activator's one or two."""
    settings.watching.label_selectors[ENDPOINT_SLICE.group, ENDPOINT_SLICE.plural] = activator_selector(activator)


@kopf.on.event(ENDPOINT_SLICE.group, ENDPOINT_SLICE.version, ENDPOINT_SLICE.plural, id="activator-endpoints")
async def activator_endpoints(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """The activator's ready pods changed (a rollout, a restart): every service at zero follows."""
    settings: ActivatorSettings = memo.config.activator
    if not settings.enabled or body["metadata"].get("namespace") != settings.namespace:
        return
    api: KubeApi = memo.api
    selector = activator_selector(settings)
    try:
        slices = await asyncio.to_thread(api.list_objects, *ENDPOINT_SLICE.key, settings.namespace, selector)
        endpoints = ActivatorEndpoints.from_slices(slices)
        registry: Registry = memo.scale_to_zero
        if endpoints == registry.activator:
            return
        registry.activator = endpoints
        changes = await asyncio.to_thread(
            registry.resync, api, lambda namespace, name: status_lock(memo, isvc_ref(namespace, name))
        )
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        logger.warning("activator endpoints not followed: %s", exc)
        return
    logger.info(
        "activator at %s:%d (gRPC :%d); %d slice(s) written",
        ",".join(endpoints.addresses) or "-",
        endpoints.port,
        endpoints.grpc_port,
        len(changes),
    )


@kopf.on.event(
    INFERENCE_SERVICE.group,
    INFERENCE_SERVICE.version,
    INFERENCE_SERVICE.plural,
    id="wake",
    annotations={WAKE_ANNOTATION: kopf.PRESENT},
)
def wake_on_request(body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """A request waits at zero (the activator wrote the annotation): one replica, now. An event
    handler, since kopf leaves annotations under its own prefix out of the changes it reports."""
    if meta.get("deletionTimestamp"):
        return
    try:
        spec = parse_spec(dict(body.get("spec") or {}))
        owner = memo.config.owner(meta["name"], meta["namespace"], meta["uid"], spec)
    except SpecError:
        return  # the reconcile handler reports it
    wake = Wake.of(meta.get("annotations"))
    zero_since = Wake.of({WAKE_ANNOTATION: ((body.get("status") or {}).get("autoscaler") or {}).get("lastScaleTime")})
    replicas = wake_replicas(owner, asked_replicas(spec), wake, zero_since.at)
    if replicas is None:
        return  # not at zero, or a wake from before the service last went to zero
    try:
        scale_to_zero_wake(memo.api, owner.namespace, owner.name, spec, replicas)
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        logger.warning("wake not written: %s", exc)  # the activator asks again within seconds
        return
    kopf.event(body, type="Normal", reason=Reason.WOKEN, message=f"replicas 0 -> {replicas}: a request is waiting")
    logger.info("woken: replicas 0 -> %d for a request waiting since %s", replicas, wake.at)
