"""status.adapters and the AdaptersReady condition, from what each replica's sidecar reports.

Every pod of a service with spec.adapters runs an `adapters` sidecar that answers
`GET /adapters` with each adapter's state on that replica (Pending, Loading, Ready, Failed and
why), and the digest of the uri that state is for (the uri itself is not on a port other pods
can reach). The operator asks every running replica and sums up here, per adapter: Ready when every
replica that answered has loaded it, Failed when one could not (with that replica's reason),
else Loading. A replica that does not answer is counted, never guessed.

What the operator asks is bounded by who could have made the pod: only pods of the service's
own selector, with a pod IP of their own (never a hostNetwork pod: its IP is the node's), on the
sidecar's port and path; only the fields below are read from the answer, each bounded, and a
reason comes from the pod's own sidecar about the service's own adapters.

Pure: the caller does the requests.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .jsontypes import JsonObject
from .models import InferenceServiceSpec
from .reasons import Reason

CONDITION = "AdaptersReady"
STATES = ("Pending", "Loading", "Ready", "Failed")
MAX_REPLICAS_LISTED = 16  # per adapter in status: a 100-replica service keeps a small status
REASON_LENGTH = 300
MAX_ANSWER_BYTES = 256 * 1024
# An answer is {"engine": ..., "adapters": [{...}]}: three levels. Deeper is not the sidecar's,
# and json.loads recurses once per level (a body of 100,000 "[" raised RecursionError).
MAX_ANSWER_DEPTH = 8
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(rb"[\[\]{}]")


@dataclass(frozen=True)
class Target:
    pod: str
    url: str


def targets(pods: list[JsonObject], port: int, path: str) -> list[Target]:
    """The replicas to ask: running, not being deleted, with a pod IP that is not the node's."""
    found = []
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if (
            not ip
            or spec.get("hostNetwork")
            or status.get("phase") != "Running"
            or meta.get("deletionTimestamp")
            or ip == status.get("hostIP")
        ):
            continue
        host = f"[{ip}]" if ":" in ip else ip
        found.append(Target(meta["name"], f"http://{host}:{port}{path}"))
    return sorted(found, key=lambda t: t.pod)


def uri_digest(uri: str) -> str:
    """The sidecar's name for a uri (adapters_sidecar.desired.digest; tests hold the two equal)."""
    return hashlib.sha256(uri.encode()).hexdigest()[:12]


def parse_answer(body: bytes) -> JsonObject | None:
    """A sidecar's answer as a JSON object, or None: not JSON, not an object, too large, or
    nested deeper than MAX_ANSWER_DEPTH (checked before the parser recurses into it)."""
    if len(body) > MAX_ANSWER_BYTES:
        return None
    depth = deepest = 0
    for bracket in _BRACKET.finditer(_STRING.sub(b'""', body)):
        depth += 1 if bracket.group() in (b"[", b"{") else -1
        deepest = max(deepest, depth)
        if deepest > MAX_ANSWER_DEPTH:
            return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _bounded(text: object) -> str:
    value = " ".join(str(text).split())
    return value if len(value) <= REASON_LENGTH else value[: REASON_LENGTH - 3] + "..."


def replica_states(answer: JsonObject | None, wanted: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """name -> (state, reason) on one replica, for the adapters the spec wants: an adapter the
    sidecar has not read yet (the kubelet updates the ConfigMap within a minute) or with
    another uri (another digest) is Pending; an unanswered or unreadable replica has every
    adapter Pending."""
    digests = {name: uri_digest(uri) for name, uri in wanted.items()}
    entries = (answer or {}).get("adapters")
    reported: dict[str, tuple[str, str]] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        name, hashed, state = entry.get("name"), entry.get("digest"), entry.get("state")
        if isinstance(name, str) and name in wanted and hashed == digests[name] and state in STATES:
            reported[name] = (str(state), _bounded(entry.get("reason") or ""))
    return {name: reported.get(name, ("Pending", "")) for name in wanted}


def reduced(answer: JsonObject | None, wanted: Mapping[str, str]) -> JsonObject | None:
    """Of one replica's answer, only what `replica_states` reads (the wanted adapters, each
    field bounded): what the operator keeps while it asks the other replicas."""
    if answer is None:
        return None
    states = replica_states(answer, wanted)
    return {
        "adapters": [
            {"name": name, "digest": uri_digest(wanted[name]), "state": state, "reason": reason}
            for name, (state, reason) in states.items()
        ]
    }


def _adapter_entry(name: str, states: dict[str, tuple[str, str]]) -> tuple[JsonObject, str]:
    """One adapter's status.adapters entry from each replica's (state, reason), and why it
    failed ("" unless it did)."""
    ready = sum(1 for state, _ in states.values() if state == "Ready")
    failures = [(pod, reason) for pod, (state, reason) in states.items() if state == "Failed"]
    failure = ""
    if failures:
        overall = "Failed"
        failure = f"{name} on {failures[0][0]}: {failures[0][1] or 'failed'}"
    elif states and ready == len(states):
        overall = "Ready"
    else:
        overall = "Loading"
    replicas = [
        {"pod": pod, "state": state, **({"reason": reason} if reason else {})}
        for pod, (state, reason) in list(states.items())[:MAX_REPLICAS_LISTED]
    ]
    entry = {"name": name, "state": overall, "readyReplicas": ready, "replicas": len(states), "pods": replicas}
    return entry, failure


def summarize(
    spec: InferenceServiceSpec, answers: Mapping[str, JsonObject | None]
) -> tuple[list[JsonObject], bool, Reason, str]:
    """status.adapters, and the AdaptersReady condition's (status, reason, message), from each
    replica's answer (pod name -> its /adapters JSON, None when it did not answer)."""
    wanted = {a.name: a.uri for a in spec.adapters}
    per_pod = {pod: replica_states(answer, wanted) for pod, answer in sorted(answers.items())}
    entries: list[JsonObject] = []
    failed, loading = [], []
    for name in wanted:
        entry, failure = _adapter_entry(name, {pod: states[name] for pod, states in per_pod.items()})
        if failure:
            failed.append(failure)
        elif entry["state"] == "Loading":
            loading.append(name)
        entries.append(entry)
    if failed:
        return entries, False, Reason.ADAPTER_FAILED, _bounded("; ".join(failed))
    if not per_pod and wanted:
        return entries, False, Reason.NO_REPLICAS, "no running replica to load the adapters into"
    if loading:
        return entries, False, Reason.LOADING, f"loading {', '.join(loading)}"
    return entries, True, Reason.LOADED, f"{len(wanted)} adapter(s) loaded on {len(per_pod)} replica(s)"
