"""The operator's start and end: kopf's settings, the memo's shared clients, login, and what is
left to release at exit."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from typing import Any

import kopf

from .. import config, peering, scale_to_zero, tracing
from ..k8s import KubeApi, load_api_client
from ..kinds import INFERENCE_SERVICE
from .bookkeeping import ProcessDiffBaseStorage, SeenWorkloads, UnmarkedProgressStorage
from .repair import RepairTimes
from .scale_to_zero import watch_activator_only
from .shared import StatusLocks


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf's progress of a retried handler in annotations (status is ours, and the schema prunes
    # unknowns); the spec it last handled in this process, not on every object (bookkeeping.py).
    settings.persistence.progress_storage = UnmarkedProgressStorage(prefix=INFERENCE_SERVICE.group)
    if "diffbase" not in memo:
        memo.diffbase = ProcessDiffBaseStorage(prefix=INFERENCE_SERVICE.group)
    settings.persistence.diffbase_storage = memo.diffbase
    if "seen_workloads" not in memo:
        memo.seen_workloads = SeenWorkloads()
    # What handlers of different objects share is made here, before kopf copies the memo for
    # each object: an entry a handler added to its copy would be that object's alone.
    if "status_locks" not in memo:
        memo.status_locks = StatusLocks()
    if "repair_times" not in memo:
        memo.repair_times = RepairTimes(collections.deque)
    # Events are posted deliberately (one per change), not for every log line.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # `run` puts its configuration in the memo; `kopf run -m` (tests) gets it read here. Either
    # way it is read once: a bad value stops the operator now, not on every reconcile.
    if getattr(memo, "config", None) is None:
        memo.config = config.load()
    operator_config: config.OperatorConfig = memo.config
    # HA: a priority of this replica's own and the keep-alive lifetime (settings.PeeringSettings);
    # peers judged alive by when this replica saw their keep-alives, not by their clocks (peering.py).
    operator_config.peering.apply(settings)
    peering.install()
    if getattr(memo, "api", None) is None:
        memo.api = KubeApi(load_api_client(operator_config.kubeconfig))
    if "tracing" not in memo:
        memo.tracing = tracing.start(operator_config.tracing)
    watch_activator_only(settings, operator_config.activator)
    if "scale_to_zero" not in memo:
        memo.scale_to_zero = scale_to_zero.Registry()


@kopf.on.cleanup()
async def flush_traces(memo: kopf.Memo, **_: Any) -> None:
    """The last reconciles' spans leave before the process does (bounded: a stuck collector
    holds the exit for `tracing.SHUTDOWN_TIMEOUT_S` at most)."""
    traces: tracing.Tracing | None = memo.get("tracing")
    if traces is not None:
        await asyncio.to_thread(traces.shutdown)


# kopf (1.45) names the task that waits on a watch stream's pause toggle so.
PAUSE_WAITER_PREFIX = "pause-waiter for "


@kopf.on.cleanup()
async def release_abandoned_watch_waiters(logger: kopf.Logger, **_: Any) -> None:
    """Cancel the pause waiters of watch streams that kopf abandoned.

    A watcher cancelled while it waits for a free worker (`queueing.worker_limit`, busy with a
    backlog) leaves its watch stream suspended, and the stream's pause-waiter task alive; kopf
    then waits 5 s for such leftover tasks before cancelling them. Cleanup runs once every
    watcher is gone, so cancelling them here is what closing the stream would have done:
    SIGTERM with a backlog exits without that wait (bench/operator_scale.py).
    """
    current = asyncio.current_task()
    waiters = [
        task
        for task in asyncio.all_tasks()
        if task is not current and not task.done() and task.get_name().startswith(PAUSE_WAITER_PREFIX)
    ]
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    if waiters:
        logger.debug("released %d abandoned watch-stream waiters", len(waiters))


@kopf.on.login()
def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """The same sources as the kubernetes client: in-cluster account, else KUBECONFIG.

    In a pod the API server is reached at the address the kubelet puts in the environment, as
    client-go and the kubernetes client do (`OperatorConfig.api_server`): kopf's own choice,
    https://kubernetes.default.svc, needs cluster DNS, so an operator would stop with CoreDNS.
    Login runs after the startup handlers, so the memo has the configuration."""
    info = kopf.login_with_service_account(memo=memo, **kwargs)
    if info is None:
        return kopf.login_with_kubeconfig(memo=memo, **kwargs)
    server = memo.config.api_server
    return dataclasses.replace(info, server=server) if server else info
