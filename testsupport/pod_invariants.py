"""The pod invariant every container the project ships must hold, as one pure checker.

A container that holds a credential (an env var from a Secret, a Secret volume, a projected
ServiceAccount token, the pod's automounted token) must never be reachable by the InferenceService
author's code: the author chooses the serving container's image, arguments, environment, model
and adapters, and a model or an adapter can carry code (trust-remote-code, pickles, PYTHONPATH).
So, in every pod:

- a credential container runs one of the operator's own programs (its image and entry point),
  not the author's image, arguments or variables;
- it has none of the author's variables but an allow-list (an s3:// fetch's AWS_* credentials);
- with an author container in the pod, it sets HOME and every tool-configuration path
  (TOOL_CONFIG_ENV) itself, so that no default of the image's points anywhere shared;
- its HOME and tool-configuration paths lie on no volume an author container can write;
- it shares a volume with an author container only where the author side mounts it read-only
  and the credential side keeps nothing it executes, imports or reads configuration from there
  (HOME, tool-configuration paths, PYTHONPATH, its working directory): it may only write into it.

`violations` returns what a pod breaks, each with a readable message; tests run it over every
rendered workload and over hand-made bad pods.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Variables naming where tools read their configuration and credentials from (boto3/botocore,
# huggingface_hub, XDG-following tools). Each must be set explicitly in a credential container.
TOOL_CONFIG_ENV = (
    "HOME",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "HF_HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "NETRC",
)
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
# Volume sources nobody in the pod can write (the kubelet fills them, read-only).
_READ_ONLY_SOURCES = ("configMap", "secret", "downwardAPI", "projected")

Json = Mapping[str, Any]


@dataclass(frozen=True)
class Trust:
    """What in a pod is the operator's and what is the author's.

    A container runs one of the operator's programs when its image is in `operator_images`, its
    command starts with one of `operator_commands` (any command when that is empty) and it
    carries none of the author's arguments or variables outside `allowed_author_env`. Every
    other container is taken to run the author's code.
    """

    operator_images: frozenset[str]
    operator_commands: tuple[tuple[str, ...], ...] = ()
    # The author's runtime.env, as (name, value) pairs, and runtime.args.
    author_env: frozenset[tuple[str, str]] = frozenset()
    author_args: tuple[str, ...] = ()
    # Author variables a credential container may be given (the s3:// fetch's own credentials).
    allowed_author_env: frozenset[str] = frozenset()
    # The pod's automounted token is the author's own: they named the ServiceAccount and asked
    # for it, within the platform's policy. It is then no credential the author must not reach.
    token_is_authors: bool = False


@dataclass(frozen=True)
class Violation:
    rule: str
    container: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.container}: {self.message}"


@dataclass(frozen=True)
class _Mount:
    volume: str
    path: str
    sub_path: str
    read_only: bool


@dataclass
class _Container:
    name: str
    raw: Json
    mounts: list[_Mount] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    credentials: list[str] = field(default_factory=list)
    authors: bool = False


def violations(pod_spec: Json, trust: Trust) -> list[Violation]:
    """Every way `pod_spec` (a PodSpec) breaks the invariant; empty when it holds."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    containers = [_read(c, pod_spec, volumes, trust) for c in _all_containers(pod_spec)]
    holders = [c for c in containers if c.credentials]
    authors = [c for c in containers if c.authors]
    found: list[Violation] = []
    for holder in holders:
        held = ", ".join(holder.credentials)
        if holder.authors:
            found.append(
                Violation(
                    "runs-author-code", holder.name, f"holds {held} but runs the author's code {_why(holder, trust)}"
                )
            )
        found += _author_env(holder, trust)
        if authors:
            found += _explicit_config(holder)
        for author in authors:
            if author is not holder:
                found += _shared(holder, author, volumes)
    return found


def _all_containers(pod_spec: Json) -> Iterator[Json]:
    yield from pod_spec.get("initContainers", [])
    yield from pod_spec.get("containers", [])
    yield from pod_spec.get("ephemeralContainers", [])


def _read(raw: Json, pod_spec: Json, volumes: Mapping[str, Json], trust: Trust) -> _Container:
    container = _Container(name=raw["name"], raw=raw)
    container.mounts = [
        _Mount(m["name"], posixpath.normpath(m["mountPath"]), m.get("subPath", ""), bool(m.get("readOnly")))
        for m in raw.get("volumeMounts", [])
    ]
    container.env = {e["name"]: e["value"] for e in raw.get("env", []) if "value" in e}
    container.credentials = list(_credentials(raw, pod_spec, volumes, container.mounts, trust))
    container.authors = bool(_why(container, trust))
    return container


def _credentials(
    raw: Json, pod_spec: Json, volumes: Mapping[str, Json], mounts: Sequence[_Mount], trust: Trust
) -> Iterator[str]:
    for var in raw.get("env", []):
        if "secretKeyRef" in var.get("valueFrom", {}):
            yield f"env {var['name']} from Secret {var['valueFrom']['secretKeyRef'].get('name')!r}"
    for source in raw.get("envFrom", []):
        if "secretRef" in source:
            yield f"envFrom Secret {source['secretRef'].get('name')!r}"
    for mount in mounts:
        volume = volumes.get(mount.volume, {})
        if "secret" in volume:
            yield f"Secret volume {mount.volume!r}"
        for projection in volume.get("projected", {}).get("sources", []):
            if "secret" in projection or "serviceAccountToken" in projection:
                yield f"projected credential volume {mount.volume!r}"
                break
    # The kubelet mounts the token into every container unless the pod opts out (the default is
    # the ServiceAccount's, which is true unless someone set it otherwise: assume true).
    token_mounted = pod_spec.get("automountServiceAccountToken", True) is not False
    shadowed = any(m.path == TOKEN_PATH for m in mounts)
    if token_mounted and not shadowed and not trust.token_is_authors:
        yield "the pod's ServiceAccount token"


def _why(container: _Container, trust: Trust) -> str:
    """Why `container` counts as running the author's code ('' when it runs the operator's)."""
    raw = container.raw
    image = raw.get("image", "")
    if image not in trust.operator_images:
        return f"(image {image!r} is not the operator's)"
    command = tuple(raw.get("command", ()))
    if trust.operator_commands and not any(command[: len(c)] == c for c in trust.operator_commands):
        return f"(command {list(command)} is none of the operator's programs)"
    args = tuple(raw.get("args", ()))
    tail = trust.author_args
    if tail and any(args[i : i + len(tail)] == tail for i in range(len(args) - len(tail) + 1)):
        return "(it is given the author's runtime.args)"
    if foreign := sorted(_authors_vars(container, trust)):
        return f"(it has the author's variables {', '.join(foreign)})"
    return ""


def _authors_vars(container: _Container, trust: Trust) -> set[str]:
    return {n for n, v in container.env.items() if (n, v) in trust.author_env and n not in trust.allowed_author_env}


def _author_env(holder: _Container, trust: Trust) -> list[Violation]:
    return [
        Violation("author-env", holder.name, f"holds a credential and has the author's variable {name}")
        for name in sorted(_authors_vars(holder, trust))
    ]


def _explicit_config(holder: _Container) -> list[Violation]:
    explicit = {e["name"] for e in holder.raw.get("env", []) if "value" in e}
    missing = [name for name in TOOL_CONFIG_ENV if name not in explicit]
    if not missing:
        return []
    return [
        Violation(
            "implicit-config",
            holder.name,
            f"holds a credential beside the author's code but leaves {', '.join(missing)} to the image's defaults",
        )
    ]


def _config_paths(holder: _Container) -> list[tuple[str, str]]:
    """(what, path) of everything the holder reads configuration or code from."""
    paths = [(name, holder.env[name]) for name in TOOL_CONFIG_ENV if holder.env.get(name, "").startswith("/")]
    paths += [("PYTHONPATH", p) for p in holder.env.get("PYTHONPATH", "").split(":") if p.startswith("/")]
    if holder.raw.get("workingDir"):
        paths.append(("workingDir", holder.raw["workingDir"]))
    return [(what, posixpath.normpath(path)) for what, path in paths]


def _shared(holder: _Container, author: _Container, volumes: Mapping[str, Json]) -> list[Violation]:
    found = []
    config = _config_paths(holder)
    for mine in holder.mounts:
        if not _writable(volumes.get(mine.volume, {})):
            continue
        for theirs in author.mounts:
            if theirs.volume != mine.volume or not _overlap(mine.sub_path, theirs.sub_path):
                continue
            where = f"volume {mine.volume!r} (at {mine.path}; {author.name} has it at {theirs.path})"
            if not theirs.read_only:
                found.append(
                    Violation("shared-writable", holder.name, f"shares {where}, which {author.name} can write")
                )
            read_here = [f"{what}={path}" for what, path in config if _under(path, mine.path)]
            if read_here:
                found.append(
                    Violation(
                        "config-on-shared",
                        holder.name,
                        f"reads {', '.join(read_here)} from {where}, which it shares with {author.name}",
                    )
                )
    return found


def _writable(volume: Json) -> bool:
    if any(source in volume for source in _READ_ONLY_SOURCES):
        return False
    claim = volume.get("persistentVolumeClaim")
    return not (claim is not None and claim.get("readOnly"))


def _overlap(a: str, b: str) -> bool:
    """Whether two subPaths of one volume can reach the same files ('' is the whole volume)."""
    a, b = posixpath.normpath(a or "."), posixpath.normpath(b or ".")
    return a == "." or b == "." or _under(a, b) or _under(b, a)


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def pod_specs(obj: Json) -> Iterator[tuple[str, Json]]:
    """(label, PodSpec) of every pod template in a rendered object (a Deployment, a
    LeaderWorkerSet's leader and worker templates, a bare Pod, a Job, ...)."""
    kind, name = obj.get("kind", "?"), obj.get("metadata", {}).get("name", "?")
    spec = obj.get("spec") or {}
    if kind == "Pod":
        yield f"Pod {name}", spec
    if "template" in spec:
        yield f"{kind} {name}", spec["template"].get("spec", {})
    group = spec.get("leaderWorkerTemplate") or {}
    for part in ("leaderTemplate", "workerTemplate"):
        if part in group:
            yield f"{kind} {name} {part}", group[part].get("spec", {})


def check_objects(objects: Iterable[Json], trust: Trust) -> list[str]:
    """Every violation in every pod template of `objects`, prefixed with where it is."""
    return [f"{where}: {v}" for obj in objects for where, pod in pod_specs(obj) for v in violations(pod, trust)]
