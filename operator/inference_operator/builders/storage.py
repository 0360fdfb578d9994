"""Where the model comes from: the model volume and the init container that fills it.

pvc:// mounts a claim read-only; oci:// copies a "modelcar" image's /models; s3://, http(s)://
and hf:// run the fetcher (`python -m model_server.storage URI DIR`) of the model-server
image. With `model.cachePvc` the fetched copy lands on that claim, under a directory named
after the URI and where and as whom it is fetched from (`cache_key`), so every replica and
restart after the first finds it there, and no other source's copy is ever taken for it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from ..jsontypes import JsonObject
from ..models import ModelSpec
from ..quantities import quantity_value
from .common import Owner

MODEL_DIR = "/mnt/models"
# Where the fetcher writes why it failed (model_server.storage reads the variable's name).
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LOG_ENV = "MODEL_FETCH_TERMINATION_LOG"
MODEL_VOLUME = "model-store"
FETCH_CONTAINER = "model-fetch"
TMP_VOLUME = "tmp"
# The fetcher's own /tmp: its HOME and every tool's configuration (TOOL_CONFIG_ENV), on no volume
# the serving container (the author's code) can write.
FETCH_HOME_VOLUME = "fetch-home"
FETCH_HOME_DIR = "/tmp"
# PEM certificates the fetcher trusts besides the public roots (model_server.storage reads it).
CA_BUNDLE_ENV = "MODEL_FETCH_CA_BUNDLE"
# What an s3:// fetch may take from the InferenceService's own variables: the credentials and
# the endpoint of the user's bucket, which the operator holds none of.
S3_USER_ENV = frozenset(
    {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    }
)
# Characters kept in a cache directory name; anything else becomes "_".
_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]+")


@dataclass
class ModelStorage:
    """The pod-level parts of the model's storage."""

    volumes: list[JsonObject]
    init_containers: list[JsonObject] = field(default_factory=list)
    # The serving container's mount of the model volume at MODEL_DIR (read-only).
    mount: JsonObject = field(default_factory=dict)


# The Hub's address when `model.huggingFace.endpoint` names no mirror (huggingface_hub's default).
DEFAULT_HUB_ENDPOINT = "https://huggingface.co"
# Of the S3 variables, those that say where a fetch reads from and as whom; never a secret's value.
S3_SOURCE_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID")
CACHE_NAME_CHARS = 80  # of the URI, in a cache directory's name; a digest tells the rest apart
CACHE_DIGEST_CHARS = 32


def cache_key(uri: str, source: JsonObject | None = None) -> str:
    """The directory for `uri` on a cache claim: SCHEME/READABLE-DIGEST, where the digest covers
    the URI and `source` (see `fetch_source`). Services sharing a claim share a directory only
    when they fetch the same URI from the same endpoint as the same principal: a mirror's
    hf://org/name is not the Hub's. One path part after the scheme, so no key is inside another."""
    scheme, rest = uri.split("://", 1)
    readable = _UNSAFE.sub("_", rest).strip("._-")[:CACHE_NAME_CHARS] or "_"
    identity = json.dumps({"uri": uri, "source": source or {}}, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(identity.encode()).hexdigest()[:CACHE_DIGEST_CHARS]
    return f"{scheme}/{readable}-{digest}"


def fetch_source(owner: Owner, user_env: list[JsonObject]) -> JsonObject:
    """Where the model's fetch reads from and as whom, with nothing secret in it: for hf://, the
    endpoint and the Secret and key the token comes from; for s3://, the endpoint variables, the
    access key id (a name, not the secret key) and the pod's service account (a web identity).
    No secret's value enters a path, hashed or not."""
    model = owner.spec.model
    scheme = model.uri.split("://", 1)[0]
    if scheme == "hf":
        hub = model.hugging_face
        endpoint = (hub.endpoint if hub and hub.endpoint else DEFAULT_HUB_ENDPOINT).rstrip("/")
        token = {"secret": hub.token_secret, "key": hub.token_key} if hub and hub.token_secret else None
        return {"endpoint": endpoint, "token": token}
    if scheme == "s3":
        env = {var["name"]: {k: v for k, v in var.items() if k != "name"} for var in user_env}
        return {
            **{name: env[name] for name in S3_SOURCE_ENV if name in env},
            "serviceAccount": owner.spec.scheduling.service_account_name,
        }
    return {}


def hub_env(owner: Owner) -> list[JsonObject]:
    """HF_TOKEN from the named Secret and HF_ENDPOINT for a mirror, as the spec asks."""
    hub = owner.spec.model.hugging_face
    env: list[JsonObject] = [
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        {"name": "HF_HOME", "value": "/tmp/hf"},
    ]
    if hub is None:
        return env
    if hub.token_secret:
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": hub.token_secret, "key": hub.token_key}}}
        )
    if hub.endpoint:
        env.append({"name": "HF_ENDPOINT", "value": hub.endpoint})
    return env


# Where boto3, huggingface_hub, httpx and Python look for configuration, credentials and caches
# (a config file's credential_process, a .netrc, a user site-packages) unless told otherwise:
# under HOME. A container that holds a credential sets every one of them to its own directory.
TOOL_CONFIG_ENV = {
    "HOME": "",
    "TMPDIR": "",
    "AWS_CONFIG_FILE": ".aws/config",
    "AWS_SHARED_CREDENTIALS_FILE": ".aws/credentials",
    "HF_HOME": "hf",
    "NETRC": ".netrc",
    "XDG_CONFIG_HOME": ".config",
    "XDG_CACHE_HOME": ".cache",
    "XDG_DATA_HOME": ".local/share",
    "XDG_STATE_HOME": ".local/state",
}


def tool_config_env(home: str) -> list[JsonObject]:
    """HOME and every tool-configuration path under `home`, a directory no other container
    mounts (the author's code, in the serving container, must not be able to write any of
    them); no user site-packages either."""
    env: list[JsonObject] = [
        {"name": name, "value": f"{home}/{relative}" if relative else home}
        for name, relative in TOOL_CONFIG_ENV.items()
    ]
    return [*env, {"name": "PYTHONNOUSERSITE", "value": "1"}]


def fetch_env(owner: Owner, user_env: list[JsonObject]) -> list[JsonObject]:
    """The fetch container's environment: the operator's proxy and CA settings, the Hub's
    variables for hf://, and of the InferenceService's own variables only S3's, for s3://.

    Nothing else of `runtime.env` reaches it: a proxy, a CA file, a Python start-up hook or a
    preloaded library chosen by the InferenceService author would see or send elsewhere a
    credential the operator wires in."""
    return _fetch_env(owner, {owner.spec.model.uri.split("://", 1)[0]}, user_env)


def adapter_fetch_env(owner: Owner, user_env: list[JsonObject]) -> list[JsonObject]:
    """The same rules for the adapters sidecar, for every scheme an adapter may use whether or
    not one does yet: an adapter added later must not change the pod template (a restart)."""
    return _fetch_env(owner, {"hf", "s3"}, user_env)


def _fetch_env(owner: Owner, schemes: set[str], user_env: list[JsonObject]) -> list[JsonObject]:
    settings = owner.fetch
    env: list[JsonObject] = []
    for names, value in (
        (("HTTPS_PROXY", "https_proxy"), settings.https_proxy),
        (("HTTP_PROXY", "http_proxy"), settings.http_proxy),
        (("NO_PROXY", "no_proxy"), settings.no_proxy),
    ):
        env += [{"name": name, "value": value} for name in names if value]
    if settings.ca_bundle:
        env.append({"name": CA_BUNDLE_ENV, "value": settings.ca_bundle})
    if "hf" in schemes:
        env = [*hub_env(owner), *env]
    if "s3" in schemes:
        env += [var for var in user_env if var["name"] in S3_USER_ENV]
    return env


def uses_cache_claim(model: ModelSpec) -> bool:
    """Whether the model volume is the writable cache claim (`model.cachePvc`; a pvc:// model
    is mounted from its own claim, read-only, and has no cache)."""
    return bool(model.cache_pvc) and not model.uri.startswith("pvc://")


# What a fetch may use at most: it streams to disk, so more only helps TLS and checksums.
FETCH_CPU = "2"
FETCH_MEMORY = "2Gi"


def fetch_resources(cpu: str, memory: str) -> JsonObject:
    """The fetch container's requests and limits: equal (a pod is Guaranteed only when every
    container, init containers included, asks for what it is limited to) and never more than
    the serving container's, so the fetch does not raise what the pod reserves (a pod reserves
    the larger of its biggest init container and its containers' sum)."""
    amounts = {
        "cpu": min(cpu, FETCH_CPU, key=quantity_value),
        "memory": min(memory, FETCH_MEMORY, key=quantity_value),
    }
    return {"requests": dict(amounts), "limits": dict(amounts)}


def model_storage(owner: Owner, user_env: list[JsonObject], security_context: JsonObject) -> ModelStorage:
    """Volumes, init container and mount that put the model at MODEL_DIR, by URI scheme.

    `user_env` is the serving container's environment; see `fetch_env` for what of it the
    init container gets.
    """
    model = owner.spec.model
    uri = model.uri
    scheme, rest = uri.split("://", 1)
    mount = {"name": MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True}
    if scheme == "pvc":
        claim, _, sub_path = rest.partition("/")
        volume = {"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        if sub_path:
            mount["subPath"] = sub_path
        return ModelStorage([volume], [], mount)

    volumes: list[JsonObject] = []
    fetch_mount = {"name": MODEL_VOLUME, "mountPath": MODEL_DIR}
    if uses_cache_claim(model):
        volumes.append({"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": model.cache_pvc}})
        fetch_mount["subPath"] = mount["subPath"] = cache_key(uri, fetch_source(owner, user_env))
    else:
        volumes.append({"name": MODEL_VOLUME, "emptyDir": {}})
    init: dict[str, object] = {"name": FETCH_CONTAINER}
    init_env: list[JsonObject] = []
    # /tmp: huggingface_hub's lock files and token, and the fetcher's CA bundle file; the pod's
    # shared one for a modelcar's copy, which holds no credential, else the fetcher's own.
    mounts = [fetch_mount, {"name": TMP_VOLUME, "mountPath": "/tmp"}]
    if scheme == "oci":
        # A "modelcar" image: the model lives under /models of the image named by the URI. Its
        # `cp` says what went wrong only in its log: the kubelet keeps the log's end.
        init |= {"image": rest, "command": ["sh", "-c", f"cp -R /models/. {MODEL_DIR}/"]}
        init |= {"terminationMessagePolicy": "FallbackToLogsOnError"}
    else:
        command = ["python", "-m", "model_server.storage", uri, MODEL_DIR]
        if model.sha256:  # checked before the file is renamed into place
            command += ["--sha256", model.sha256]
        init |= {"image": owner.fetcher_image, "command": command}
        # The fetcher writes one line on why it failed there; the pod's status carries it.
        init |= {"terminationMessagePath": TERMINATION_LOG, "terminationMessagePolicy": "File"}
        init_env = [e for e in fetch_env(owner, user_env) if e["name"] not in TOOL_CONFIG_ENV]
        init_env += [*tool_config_env(FETCH_HOME_DIR), {"name": TERMINATION_LOG_ENV, "value": TERMINATION_LOG}]
        volumes.append({"name": FETCH_HOME_VOLUME, "emptyDir": {}})
        mounts[1] = {"name": FETCH_HOME_VOLUME, "mountPath": FETCH_HOME_DIR}
    init |= {
        "volumeMounts": mounts,
        "resources": fetch_resources(owner.spec.resources.cpu, owner.spec.resources.memory),
        "securityContext": security_context,
        "env": init_env,
    }
    return ModelStorage(volumes, [init], mount)
