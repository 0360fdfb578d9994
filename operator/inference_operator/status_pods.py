"""What is wrong with a service's pods, from their status alone: pure, tested with plain pods.

A Deployment says only that replicas are unavailable (and, ten minutes on, that its progress
deadline passed). The pods say why within seconds: the model fetch failed, the model did not
load, a container crash-loops, runs out of memory, its image cannot be pulled, or no node can
take the pod. Each cause becomes a reason a script can match, as KServe's are, and a message
that names the pod and container.

Whatever a container wrote (its termination message) may quote a URL or a token: it is never
copied as it is. URLs lose their credentials, query and fragment; values that look like
tokens, passwords or keys are masked, found by detect-secrets' detectors (the maintained set of
credential shapes, its keywords and its entropy limits) and the few shapes it lacks; and the
whole is one line of bounded length (`redact`). The detectors are regular expressions run on a
string: nothing here reads a file or calls their vendors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.plugins.base import BasePlugin, RegexBasedDetector
from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString, HexHighEntropyString
from detect_secrets.plugins.ip_public import IPPublicDetector
from detect_secrets.plugins.keyword import CONFIG_DENYLIST_REGEX_TO_GROUP, KeywordDetector
from detect_secrets.plugins.keyword import DENYLIST as KEYWORD_DENYLIST

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
    Reason.NODE_NOT_READY,
)

# The kubelet's waiting reasons for an image it cannot get (one reason for all: they alternate).
IMAGE_PULL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
# Waiting reasons for a container that cannot be created from its spec (a missing Secret key).
CONFIG_WAITING = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")
MESSAGE_LIMIT = 512
PART_LIMIT = 300

_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^\s/@?#]*@)?([^\s/?#]*)([^\s?#]*)((?:\?[^\s#]*)?(?:#\S*)?)")
_TRAILING = re.compile(r"[:;,.)\]]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MASK = "***"

# detect-secrets' detectors: each known credential's shape (cloud keys, Git hosts' and chat
# tokens, JWTs, private keys, URL passwords...), kept up to date upstream. A public IP address is
# no secret here: it is what an unreachable endpoint's message should name.
_PLUGINS: list[type[BasePlugin]] = list(get_mapping_from_secret_type_to_class().values())
_DETECTORS: tuple[RegexBasedDetector, ...] = tuple(
    plugin() for plugin in _PLUGINS if issubclass(plugin, RegexBasedDetector) and plugin is not IPPublicDetector
)
_KEYWORDS = KeywordDetector()
_HEX = HexHighEntropyString()
_BASE64 = Base64HighEntropyString()
# What detect-secrets lacks: Hugging Face tokens (the model fetch's own), an Authorization
# header's value, and the keywords its list leaves out (`token=`, a URL signature), or a value
# said in words (`password is hunter2`).
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}")
_AUTHORIZATION = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_WORDS = "|".join((*KEYWORD_DENYLIST, "token", "signature", "credentials?", "access[_-]?key"))
_ASSIGNMENT = re.compile(
    rf"(?i)\b((?:[a-z0-9]+[_-])*(?:{_WORDS})[\"']?\s*(?:[:=]|\s(?:is|was)\s)\s*[\"']?)[^\s\"',;&]+"
)
# Runs a high-entropy detector judges: hex of 20 digits or more (a digest labelled as one is
# kept), and base64 segments of 20 characters or more between slashes, so a path or an image
# name is judged word by word.
_HEX_RUN = re.compile(r"(?<![A-Za-z0-9+=_-])(?<!sha256:)(?<!sha512:)[0-9a-fA-F]{20,}(?![A-Za-z0-9+=_-])")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+=_-]{20,}")
# An encoded value whose plain text repeats can stay under the entropy limit: a long run that
# mixes upper and lower case and digits is masked all the same.
_KEY_LIKE = re.compile(r"^(?=.{32})(?=.*[a-z])(?=.*[A-Z])(?=.*[0-9])")


def _bare_url(match: re.Match[str]) -> str:
    """A URL without its credentials, query and fragment (the sentence's punctuation kept)."""
    scheme, host, path, rest = match.groups()
    tail = _TRAILING.search(path if not rest else rest)
    path = _TRAILING.sub("", path) if not rest else path
    return scheme + host + path + (tail.group(0) if tail else "")


def _found(text: str) -> set[str]:
    """Every value in `text` that a detector takes for a secret."""
    found = {secret for detector in _DETECTORS for secret in detector.analyze_string(text)}
    # The keyword detector names the first value of each form; masked, the next one shows.
    seen = text
    for _ in range(16):
        more = set(_KEYWORDS.analyze_string(seen, denylist_regex_to_group=CONFIG_DENYLIST_REGEX_TO_GROUP))
        more -= {MASK}
        if not more:
            break
        found |= more
        for secret in more:
            seen = seen.replace(secret, MASK)
    found.update(run for run in _HEX_RUN.findall(text) if _HEX.calculate_shannon_entropy(run) > _HEX.entropy_limit)
    found.update(
        run
        for run in _BASE64_RUN.findall(text)
        if _BASE64.calculate_shannon_entropy(run) > _BASE64.entropy_limit or _KEY_LIKE.match(run)
    )
    return {secret for secret in found if secret}


def redact(text: str, limit: int = PART_LIMIT) -> str:
    """`text` as one line of at most `limit` characters, with no URL credentials, query
    strings, fragments, or values that look like tokens, passwords or keys."""
    text = " ".join(_CONTROL.sub(" ", text).split())  # one line, no terminal escapes
    text = _URL.sub(_bare_url, text)
    text = _AUTHORIZATION.sub(lambda m: f"{m.group(1)} {MASK}", text)
    text = _ASSIGNMENT.sub(lambda m: m.group(1) + MASK, text)
    text = _HF_TOKEN.sub(MASK, text)
    for secret in sorted(_found(text), key=len, reverse=True):
        # Where it stands as a word of its own: a short value must not mask the letters of others.
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", MASK, text)
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


def _waiting_problem(name: str, waiting: JsonObject) -> Problem | None:
    """A container that cannot start at all: its image cannot be pulled, or its config is wrong."""
    reason = waiting.get("reason")
    if reason in IMAGE_PULL_WAITING:
        detail = redact(str(waiting.get("message") or ""))
        return Problem(Reason.IMAGE_PULL_BACK_OFF, f"container {name}: {reason}" + (f": {detail}" if detail else ""))
    if reason in CONFIG_WAITING:
        detail = redact(str(waiting.get("message") or ""))
        return Problem(
            Reason.CREATE_CONTAINER_CONFIG_ERROR, f"container {name}: {reason}" + (f": {detail}" if detail else "")
        )
    return None


def _container_problem(pod: JsonObject, status: JsonObject, roles: Roles) -> Problem | None:
    name = status.get("name", "")
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    reason = waiting.get("reason")
    if (problem := _waiting_problem(name, waiting)) is not None:
        return problem
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


# --- Lost nodes -----------------------------------------------------------------------------------
# A node whose kubelet stops reporting turns `Ready=Unknown` after the node controller's grace
# period; the controller then marks the node's pods not ready (their containers' statuses, the
# kubelet's last word, still say ready) and the EndpointSlice controller takes them out of the
# service. The pods alone do not say why: the node does.


def _condition(obj: JsonObject | None, kind: str) -> JsonObject | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def marked_not_ready(pod: JsonObject) -> bool:
    """The pod is bound, not ready, and its containers' last reported state is ready: how the
    node controller leaves the pods of a node it lost (a kubelet would have said why)."""
    ready = _condition(pod, "Ready")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(
        _active(pod)
        and (pod.get("spec") or {}).get("nodeName")
        and ready is not None
        and ready.get("status") != "True"
        and statuses
        and all(s.get("ready") for s in statuses)
    )


def suspect_nodes(pods: list[JsonObject]) -> list[str]:
    """The nodes to read: those of pods marked not ready (`marked_not_ready`), sorted."""
    return sorted({str(p["spec"]["nodeName"]) for p in pods if marked_not_ready(p)})


def node_not_ready(node: JsonObject | None) -> str | None:
    """Why `node` is not ready (its Ready condition's status and message), or None when it is
    ready or unknown to us (a node that is gone is the pod garbage collector's to clean)."""
    ready = _condition(node, "Ready")
    if node is None or ready is None or ready.get("status") == "True":
        return None
    message = redact(str(ready.get("message") or ready.get("reason") or ""), limit=120)
    return f"Ready={ready.get('status')}" + (f" ({message})" if message else "")


def nodes_problem(pods: list[JsonObject], nodes: dict[str, JsonObject | None]) -> Problem | None:
    """Which of `nodes` (read by `suspect_nodes`) are not ready, and how many of the service's
    active pods are on each: its replicas there serve nothing."""
    active = [p for p in pods if _active(p)]
    lost = []
    for name, node in sorted(nodes.items()):
        why = node_not_ready(node)
        if why is not None:
            on = sum(1 for p in active if (p.get("spec") or {}).get("nodeName") == name)
            lost.append(f"node {name} is not ready, {why}: {on} of {len(active)} replicas on it")
    if not lost:
        return None
    message = "; ".join(lost)
    return Problem(
        Reason.NODE_NOT_READY, message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."
    )
