"""What is wrong with a service's pods, from their status alone: pure, tested with plain pods.

A Deployment says only that replicas are unavailable (and, ten minutes on, that its progress
deadline passed). The pods say why within seconds: the model fetch failed, the model did not
load, a container crash-loops, runs out of memory, its image cannot be pulled, or no node can
take the pod. Each cause becomes a reason a script can match, as KServe's are, and a message
that names the pod and container.

Whatever a container wrote (its termination message) may quote a URL or a token: it is never
copied as it is. URLs lose their credentials, query and fragment, values that look like
tokens or keys are masked, and the whole is one line of bounded length (`redact`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .jsontypes import JsonObject
from .reasons import Reason
from .status import Problem

# Every reason this module gives: what pod news may set and clear in Degraded.
REASONS = (
    Reason.MODEL_FETCH_FAILED,
    Reason.MODEL_LOAD_FAILED,
    Reason.CRASH_LOOP_BACK_OFF,
    Reason.IMAGE_PULL_BACK_OFF,
    Reason.OOM_KILLED,
    Reason.UNSCHEDULABLE,
    Reason.CREATE_CONTAINER_CONFIG_ERROR,
)

# The kubelet's waiting reasons for an image it cannot get (one reason for all: they alternate).
IMAGE_PULL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
# Waiting reasons for a container that cannot be created from its spec (a missing Secret key).
CONFIG_WAITING = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")
MESSAGE_LIMIT = 512
PART_LIMIT = 300

_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^\s/@?#]*@)?([^\s/?#]*)([^\s?#]*)((?:\?[^\s#]*)?(?:#\S*)?)")
_TRAILING = re.compile(r"[:;,.)\]]+$")
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)\b((?:[a-z0-9]+[_-])*(?:token|password|passwd|secret|signature|credentials?|api[_-]?key|access[_-]?key)"
    r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&]+"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_KNOWN_TOKENS = re.compile(r"\b(?:hf_[A-Za-z0-9]{8,}|(?:AKIA|ASIA)[A-Z0-9]{12,}|gh[pousr]_[A-Za-z0-9]{20,})")
# Long runs that read as keys or signatures: upper and lower case and digits mixed (an image
# name or a path is words; a sha256 in hex is a digest: both kept).
_BLOB = re.compile(r"[A-Za-z0-9+/_=-]{32,}")
_KEY_LIKE = re.compile(r"^(?=.*[a-z])(?=.*[A-Z])(?=.*[0-9])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _bare_url(match: re.Match[str]) -> str:
    """A URL without its credentials, query and fragment (the sentence's punctuation kept)."""
    scheme, host, path, rest = match.groups()
    tail = _TRAILING.search(path if not rest else rest)
    path = _TRAILING.sub("", path) if not rest else path
    return scheme + host + path + (tail.group(0) if tail else "")


def redact(text: str, limit: int = PART_LIMIT) -> str:
    """`text` as one line of at most `limit` characters, with no URL credentials, query
    strings, fragments, or values that look like tokens, passwords or keys."""
    text = _URL.sub(_bare_url, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} ***", text)
    text = _SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1)}***", text)
    text = _KNOWN_TOKENS.sub("***", text)
    text = _BLOB.sub(lambda m: "***" if _KEY_LIKE.match(m.group(0)) else m.group(0), text)
    text = " ".join(_CONTROL.sub(" ", text).split())  # one line, no terminal escapes
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Roles:
    """Which of a pod's containers does what: the model fetch (an init container) and the
    server, whose failure after a clean start is the model's."""

    fetch: str
    servers: tuple[str, ...]


def _active(pod: JsonObject) -> bool:
    status = pod.get("status") or {}
    return not (pod.get("metadata") or {}).get("deletionTimestamp") and status.get("phase") not in (
        "Succeeded",
        "Failed",
    )


def _limit(pod: JsonObject, container: str) -> str | None:
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if c.get("name") == container:
            value = ((c.get("resources") or {}).get("limits") or {}).get("memory")
            return str(value) if value is not None else None
    return None


def _restarts(status: JsonObject) -> str:
    count = int(status.get("restartCount") or 0)
    return f" (restarted {count} time{'s' if count != 1 else ''})" if count else ""


def _failure(terminated: JsonObject | None) -> bool:
    if not terminated:
        return False
    return terminated.get("reason") == Reason.OOM_KILLED or int(terminated.get("exitCode") or 0) != 0


def _terminated_problem(pod: JsonObject, status: JsonObject, terminated: JsonObject, roles: Roles) -> Problem:
    name = status.get("name", "")
    where = f"container {name}"
    restarts = _restarts(status)
    if terminated.get("reason") == Reason.OOM_KILLED:
        limit = _limit(pod, name)
        within = f" of {limit}" if limit else ""
        return Problem(Reason.OOM_KILLED, f"{where} ran out of its memory limit{within} and was killed{restarts}")
    code = terminated.get("exitCode")
    said = redact(str(terminated.get("message") or ""))
    if name == roles.fetch:
        what = said or f"the fetch exited with code {code}; see kubectl logs -c {name}"
        return Problem(Reason.MODEL_FETCH_FAILED, f"{where}: {what}{restarts}")
    if name in roles.servers and said:
        return Problem(Reason.MODEL_LOAD_FAILED, f"{where}: {said}{restarts}")
    return Problem(
        Reason.CRASH_LOOP_BACK_OFF, f"{where} exited with code {code}{restarts}; see kubectl logs -c {name} --previous"
    )


def _container_problem(pod: JsonObject, status: JsonObject, roles: Roles) -> Problem | None:
    name = status.get("name", "")
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    reason = waiting.get("reason")
    if reason in IMAGE_PULL_WAITING:
        detail = redact(str(waiting.get("message") or ""))
        return Problem(Reason.IMAGE_PULL_BACK_OFF, f"container {name}: {reason}" + (f": {detail}" if detail else ""))
    if reason in CONFIG_WAITING:
        detail = redact(str(waiting.get("message") or ""))
        return Problem(
            Reason.CREATE_CONTAINER_CONFIG_ERROR, f"container {name}: {reason}" + (f": {detail}" if detail else "")
        )
    if _failure(state.get("terminated")):
        return _terminated_problem(pod, status, state["terminated"], roles)
    last: JsonObject = (status.get("lastState") or {}).get("terminated") or {}
    # Crashed and waiting to start again, or started again and not yet ready: still failing.
    if _failure(last) and (
        reason == Reason.CRASH_LOOP_BACK_OFF or (state.get("running") is not None and not status.get("ready"))
    ):
        return _terminated_problem(pod, status, last, roles)
    if reason == Reason.CRASH_LOOP_BACK_OFF:
        return Problem(
            Reason.CRASH_LOOP_BACK_OFF, f"container {name}: {redact(str(waiting.get('message') or 'back-off'))}"
        )
    return None


def pod_problem_of(pod: JsonObject, roles: Roles) -> Problem | None:
    """Why one pod does not serve, or None (running, starting, or loading the model)."""
    status = pod.get("status") or {}
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == Reason.UNSCHEDULABLE:
        return Problem(Reason.UNSCHEDULABLE, redact(str(scheduled.get("message") or "no node can run it")))
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            problem = _container_problem(pod, container, roles)
            if problem is not None:
                return problem
    return None


def _created(pod: JsonObject) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def pods_problem(pods: list[JsonObject], roles: Roles) -> Problem | None:
    """The problem of the newest failing pod (a rollout's new pods first), naming the pod; how
    many others fail too."""
    found = []
    for pod in sorted(pods, key=lambda p: (_created(p), (p.get("metadata") or {}).get("name", "")), reverse=True):
        if _active(pod) and (problem := pod_problem_of(pod, roles)) is not None:
            found.append((pod["metadata"].get("name", ""), problem))
    if not found:
        return None
    name, problem = found[0]
    others = len(found) - 1
    more = f" (and {others} more pod{'s' if others != 1 else ''})" if others else ""
    message = f"pod {name}: {problem.message}{more}"
    return Problem(problem.reason, message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "...")
