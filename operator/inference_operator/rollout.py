"""Canary rollouts, as pure functions: which Deployments a revision gets, and the step machine.

A change of the pods (a new pod template: model, image, engine flags, resources) is a new
revision. With `rollout.strategy: canary` it does not roll over the stable Deployment: a second
Deployment, NAME-canary, runs it beside the stable one. Behind a `routing.httpRoute` it takes
the step's share of the requests by the route's weights (exact); otherwise both arms are
behind the one Service and it takes a share by its share of the replicas (approximate). The
status says which (`traffic`).
Every `analysis.intervalSeconds` the canary's own pods are judged from Prometheus: its latency
quantile against `maxLatencyMs` and its 5xx share against `maxErrorRatio`, once it has served
`minRequests` in the window; data older than two intervals gives no verdict. A step lasts at
least `stepSeconds` and ends on a passing check; after the last step the revision is promoted
(the stable Deployment rolls to it, the canary goes). `failureLimit` failed checks roll it back
(the canary goes, the stable Deployment is untouched) until the spec changes again. The
annotation `inference.rocm.dev/rollout: promote` or `abort` decides by hand.

The state lives in `status.rollout`, so any operator replica can carry on where another stopped.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum

from .jsontypes import JsonObject
from .kinds import DEPLOYMENT
from .models import CanarySpec
from .reasons import Reason

REVISION_ANNOTATION = "inference.rocm.dev/revision"
# The manifest last applied to the stable Deployment: what it keeps while a canary runs.
STABLE_MANIFEST_ANNOTATION = "inference.rocm.dev/stable-manifest"
COMMAND_ANNOTATION = "inference.rocm.dev/rollout"


class Phase(StrEnum):
    STABLE = "Stable"
    PROGRESSING = "Progressing"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"


class Command(StrEnum):
    PROMOTE = "promote"
    ABORT = "abort"


@dataclass(frozen=True)
class RolloutState:
    """`status.rollout`: the candidate revision and where its rollout stands."""

    phase: Phase = Phase.STABLE
    revision: str | None = None
    stable_revision: str | None = None
    step: int = 0
    weight: int = 0
    step_started: float = 0.0  # seconds since the epoch
    failures: int = 0
    message: str = ""
    # Digest of the manifest last applied to the stable Deployment. Its copy on the Deployment
    # is used only when it matches: status is the operator's, annotations are anyone's who may
    # edit Deployments, and the operator applies that copy with its own rights.
    stable_digest: str | None = None
    # How the canary gets its share: "httpRoute" (weights) or "replicas" (approximate).
    traffic: str = ""

    @classmethod
    def from_status(cls, status: JsonObject | None) -> RolloutState | None:
        rollout = (status or {}).get("rollout")
        if not isinstance(rollout, dict) or rollout.get("phase") not in {p.value for p in Phase}:
            return None
        started = rollout.get("stepStarted")
        return cls(
            phase=Phase(rollout["phase"]),
            revision=rollout.get("revision"),
            stable_revision=rollout.get("stableRevision"),
            step=int(rollout.get("step") or 0),
            weight=int(rollout.get("weight") or 0),
            step_started=_epoch(started) if isinstance(started, str) else 0.0,
            failures=int(rollout.get("failures") or 0),
            message=str(rollout.get("message") or ""),
            stable_digest=rollout.get("stableDigest"),
            traffic=str(rollout.get("traffic") or ""),
        )

    @property
    def stage(self) -> str:
        """What `kubectl get` shows in the ROLLOUT column."""
        return {
            Phase.STABLE: "stable",
            Phase.PROGRESSING: f"canary {self.weight}%",
            Phase.PROMOTED: "promoted",
            Phase.ROLLED_BACK: "rolled back",
        }[self.phase]

    def to_status(self) -> JsonObject:
        """The `status.rollout` mapping (as `models.RolloutStatus` describes it)."""
        status: JsonObject = {
            "phase": self.phase.value,
            "stage": self.stage,
            "revision": self.revision,
            "stableRevision": self.stable_revision,
            "step": self.step,
            "weight": self.weight,
            "failures": self.failures,
            "message": self.message,
            "stableDigest": self.stable_digest,
        }
        if self.traffic:
            status["traffic"] = self.traffic
        if self.step_started:
            status["stepStarted"] = datetime.fromtimestamp(self.step_started, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return status


def _epoch(text: str) -> float:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def revision(deployment: JsonObject) -> str:
    """A short digest of a Deployment's pod template: what a new revision changes."""
    template = json.dumps(deployment["spec"]["template"], sort_keys=True)
    return hashlib.sha256(template.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Arms:
    """What reconcile applies for a revision: the stable Deployment's manifest (the desired one,
    or the one it already runs) and the canary's replicas (None: no canary Deployment)."""

    stable_follows_spec: bool
    canary_weight: int | None
    state: RolloutState


def arms(
    canary: CanarySpec | None,
    desired_revision: str,
    stable_revision: str | None,
    state: RolloutState | None,
    now: float,
    desired_digest: str | None = None,
) -> Arms:
    """Pure: where each arm stands for `desired_revision` (whose manifest has `desired_digest`)
    given the stable Deployment's revision (None: no stable Deployment yet) and the recorded
    state; a new revision starts at `now`."""
    if state is not None and state.revision == desired_revision and state.phase == Phase.PROMOTED:
        # Rolling the stable Deployment to it, or done: it stays "promoted" until the next change.
        promoted = replace(state, stable_revision=stable_revision or desired_revision, stable_digest=desired_digest)
        return Arms(True, None, promoted)
    if canary is None or stable_revision is None or stable_revision == desired_revision:
        return Arms(
            True, None, RolloutState(Phase.STABLE, desired_revision, desired_revision, stable_digest=desired_digest)
        )
    if state is not None and state.revision == desired_revision:
        if state.phase == Phase.ROLLED_BACK:
            return Arms(False, None, state)
        if state.phase == Phase.PROGRESSING:
            return Arms(False, state.weight, state)
    started = RolloutState(
        Phase.PROGRESSING,
        desired_revision,
        stable_revision,
        step=0,
        weight=canary.steps[0],
        step_started=now,
        message=f"canary of revision {desired_revision} started at {canary.steps[0]}% of the traffic",
        stable_digest=state.stable_digest if state is not None else None,
    )
    return Arms(False, canary.steps[0], started)


def unverified(desired_revision: str, desired_digest: str | None) -> Arms:
    """No trusted record of what the stable Deployment runs (it was made before the service
    used canaries, or its copy was edited): roll the new revision the usual way, and say so."""
    message = (
        f"revision {desired_revision} rolled without a canary: the stable Deployment's manifest has no "
        "matching record in status (a first canary after switching strategy, or an edited annotation)"
    )
    state = RolloutState(
        Phase.STABLE, desired_revision, desired_revision, message=message, stable_digest=desired_digest
    )
    return Arms(True, None, state)


def manifest_digest(deployment: JsonObject) -> str | None:
    """The digest of the manifest copy `deployment` carries (see `with_revision`)."""
    annotations = (deployment.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(STABLE_MANIFEST_ANNOTATION)
    return hashlib.sha256(text.encode()).hexdigest() if isinstance(text, str) else None


def canary_replicas(stable_replicas: int, weight: int, *, exact_split: bool = False) -> int:
    """The canary's replicas beside `stable_replicas` (which keep their size, so capacity never
    drops); at least one. Split by replicas, they give it about `weight`% of the traffic; split
    exactly (route weights), they serve `weight`% of what the stable ones serve now."""
    if stable_replicas <= 0:
        return 1
    if exact_split:
        return max(1, math.ceil(stable_replicas * weight / 100))
    return max(1, round(stable_replicas * weight / (100 - weight)))


def traffic_share(stable_replicas: int, canary: int) -> float:
    """The canary's share of the traffic when the Service spreads it evenly over the pods."""
    return 100.0 * canary / max(1, stable_replicas + canary)


@dataclass(frozen=True)
class Check:
    """One analysis of the canary's pods: None where Prometheus had no answer."""

    latency_ms: float | None
    error_ratio: float | None
    requests: float | None
    age_seconds: float


@dataclass(frozen=True)
class Progress:
    """The state after one analysis tick, the check's verdict, and an event to post (if any)."""

    state: RolloutState
    verdict: str
    event: tuple[Reason, str] | None = None


def judge(check: Check | None, canary: CanarySpec) -> tuple[str, str]:
    """("pass" | "fail" | "inconclusive", why) of one check."""
    analysis = canary.analysis
    if check is None or check.requests is None:
        return "inconclusive", "no data from Prometheus for the canary's pods"
    if check.age_seconds > 2 * analysis.interval_seconds:
        return "inconclusive", f"data {check.age_seconds:.0f}s old"
    if check.requests < analysis.min_requests:
        return "inconclusive", f"{check.requests:.0f} requests in the window, fewer than {analysis.min_requests}"
    latency, errors = check.latency_ms, check.error_ratio or 0.0
    if latency is None or not math.isfinite(latency):
        # Requests but no latency: the query failed (Prometheus busy, timed out) or came back
        # NaN. Never a pass: a slow canary would be promoted unjudged.
        return "inconclusive", f"no latency for the canary's pods over {check.requests:.0f} requests"
    problems = []
    if latency > analysis.max_latency_ms:
        problems.append(f"latency {latency:.1f} ms over {analysis.max_latency_ms:g} ms")
    if errors > analysis.max_error_ratio:
        problems.append(f"error ratio {errors:.3f} over {analysis.max_error_ratio:g}")
    if problems:
        return "fail", "; ".join(problems)
    return "pass", f"latency {latency:.1f} ms, error ratio {errors:.3f} over {check.requests:.0f} requests"


def advance(state: RolloutState, canary: CanarySpec, check: Check | None, now: float, command: str | None) -> Progress:
    """Pure: the rollout after one analysis of a progressing canary (or a command by hand)."""
    if state.phase != Phase.PROGRESSING:
        return Progress(state, "idle")
    if command == Command.ABORT:
        return _rolled_back(state, "aborted by hand (annotation inference.rocm.dev/rollout: abort)", "aborted")
    if command == Command.PROMOTE:
        return _promoted(state, "promoted by hand (annotation inference.rocm.dev/rollout: promote)", "promoted")
    verdict, why = judge(check, canary)
    if verdict == "fail":
        failures = state.failures + 1
        if failures >= canary.analysis.failure_limit:
            message = (
                f"rolled back at step {state.step + 1} ({state.weight}%): {why}; "
                f"{failures} failed checks, limit {canary.analysis.failure_limit}"
            )
            return _rolled_back(replace(state, failures=failures), message, verdict)
        return Progress(replace(state, failures=failures, message=f"check failed ({failures}): {why}"), verdict)
    if verdict == "inconclusive" or now - state.step_started < canary.step_seconds:
        return Progress(replace(state, message=f"step {state.step + 1} at {state.weight}%: {why}"), verdict)
    nxt = state.step + 1
    if nxt >= len(canary.steps):
        return _promoted(state, f"promoted after {len(canary.steps)} steps: {why}", verdict)
    weight = canary.steps[nxt]
    message = f"step {nxt + 1} of {len(canary.steps)}: {weight}% of the traffic ({why})"
    return Progress(
        replace(state, step=nxt, weight=weight, step_started=now, message=message),
        verdict,
        (Reason.CANARY_STEP, message),
    )


def _promoted(state: RolloutState, message: str, verdict: str) -> Progress:
    return Progress(
        replace(state, phase=Phase.PROMOTED, weight=100, message=message), verdict, (Reason.CANARY_PROMOTED, message)
    )


def _rolled_back(state: RolloutState, message: str, verdict: str) -> Progress:
    return Progress(
        replace(state, phase=Phase.ROLLED_BACK, weight=0, message=message),
        verdict,
        (Reason.CANARY_ROLLED_BACK, message),
    )


def with_revision(deployment: JsonObject) -> JsonObject:
    """`deployment` carrying its revision and a copy of its own manifest: what the stable
    Deployment keeps (replicas aside) while a canary of the next revision runs."""
    manifest = copy.deepcopy(deployment)
    annotations = manifest["metadata"].setdefault("annotations", {})
    annotations[REVISION_ANNOTATION] = revision(deployment)
    annotations[STABLE_MANIFEST_ANNOTATION] = json.dumps(deployment, sort_keys=True, separators=(",", ":"))
    return manifest


def live_revision(live: JsonObject | None) -> str | None:
    annotations = ((live or {}).get("metadata") or {}).get("annotations") or {}
    value = annotations.get(REVISION_ANNOTATION)
    return value if isinstance(value, str) else None


def kept_stable(live: JsonObject, desired: JsonObject, digest: str | None) -> JsonObject | None:
    """The manifest the stable Deployment `live` was last given, with `desired`'s replicas
    (the autoscaler goes on sizing it); None when `live` carries none or its copy does not
    have the recorded `digest`."""
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    if digest is None or manifest_digest(live) != digest:
        return None
    try:
        stored = json.loads(annotations[STABLE_MANIFEST_ANNOTATION])
    except (KeyError, TypeError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("kind") != DEPLOYMENT.kind:
        return None
    kept = with_revision(stored)
    kept["spec"].pop("replicas", None)
    if "replicas" in desired["spec"]:
        kept["spec"]["replicas"] = desired["spec"]["replicas"]
    return kept
