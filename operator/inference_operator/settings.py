"""Every operator-wide setting, one section each, each field documented once (pure: `config.load()`
passes the environment in, once, at start; `config.OperatorConfig` holds one of each section).

The chart sets them as environment variables (its values name the section); `run` flags override
the images. A bad value raises `ValueError` (`SettingsError`, or a section's own message) naming
its variable, so the operator stops at start rather than run with half a setting.

    identity           MANAGER: the field manager of every apply, the `managed-by` of every object
    Images             the default image of each engine, of the endpoint picker and of the router
    GpuDefaults        what a spec leaves unset about GPUs
    FetchSettings      how model-fetch init containers reach model sources
    NetworkPolicySettings   whether services get a NetworkPolicy, whom it lets in
    TracingSettings    where the operator's reconcile spans go
    ActivatorSettings  where the activator of services at zero runs
    PeeringSettings    high availability: kopf peering's priority and lifetime
    PodPolicy          what an InferenceService may ask of its pods (policy.py applies it)
    CredentialPolicy   where a Prometheus or Hub credential may be sent (credentials.py applies it)
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

from .models import DEFAULT_ENGINE, ENGINES, Engine, GpuAllocation, ResourceNaming

if TYPE_CHECKING:  # `render` runs without kopf installed
    import kopf


class SettingsError(ValueError):
    """An operator setting with a value the operator cannot use; the message names the variable."""


# --- Identity -----------------------------------------------------------------------------------
# The operator's name as the API server knows it: the field manager of its server-side applies
# (ownership.py tells its fields from others' by it) and the managed-by label of what it creates.
MANAGER = "rocm-inference-operator"
# The field manager of the built-in autoscaler's and the wake's merge patches of an
# InferenceService's own spec (a role's replicas): the counts they own, apart from the user's.
SCALER_MANAGER = "rocm-inference-operator-autoscaler"


# --- Images -------------------------------------------------------------------------------------
# The operator's default images. Each engine's comes from its object (`ServingEngine.image`: a
# default, the variable the chart sets from its values, and the `run`/`render` flag that
# overrides it); the endpoint picker's and the router's are the platform's.
ENDPOINT_PICKER_IMAGE_ENV = "INFERENCE_OPERATOR_ENDPOINT_PICKER_IMAGE"
# llm-d's endpoint picker (the Gateway API Inference Extension's EPP with llm-d's plugins).
DEFAULT_ENDPOINT_PICKER_IMAGE = "ghcr.io/llm-d/llm-d-inference-scheduler:v0.8.0"
ROUTER_IMAGE_ENV = "INFERENCE_OPERATOR_ROUTER_IMAGE"
# The vLLM project's router (the vllm-router wheel; images/router/Dockerfile builds it).
DEFAULT_ROUTER_IMAGE = "ghcr.io/rocm-inference/vllm-router:0.1.17"


@dataclass(frozen=True)
class Images:
    """Images used where the spec names none: one per engine (`engines`; an engine it leaves out
    runs its built-in default). The default engine's image (the model server's) also runs the
    model-fetch init container and the sidecars the operator adds (it carries the fetcher, the
    front and the adapters sidecar), whatever the engine."""

    engines: Mapping[Engine, str] = field(default_factory=dict)
    # The endpoint picker of routing.inferencePool (the platform's, never the spec's).
    endpoint_picker: str = DEFAULT_ENDPOINT_PICKER_IMAGE
    # The router of routing.router (the platform's, never the spec's).
    router: str = DEFAULT_ROUTER_IMAGE

    def __post_init__(self) -> None:
        defaults = {engine: serving.image.default for engine, serving in ENGINES.items()}
        object.__setattr__(self, "engines", {**defaults, **self.engines})

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], flags: Mapping[Engine, str | None] = {}) -> Images:
        """The images `environ` names (the chart's values), each engine's overridden by its flag."""
        return cls(
            engines={
                engine: flags.get(engine) or environ.get(serving.image.env) or serving.image.default
                for engine, serving in ENGINES.items()
            },
            endpoint_picker=environ.get(ENDPOINT_PICKER_IMAGE_ENV) or DEFAULT_ENDPOINT_PICKER_IMAGE,
            router=environ.get(ROUTER_IMAGE_ENV) or DEFAULT_ROUTER_IMAGE,
        )

    def serving(self, engine: Engine) -> str:
        """The image an engine's serving container runs where the spec names none."""
        return self.engines.get(engine) or ENGINES[engine].image.default

    @property
    def fetcher(self) -> str:
        """The operator's own image: the model fetcher, the front, the adapters sidecar."""
        return self.serving(DEFAULT_ENGINE)

    @property
    def all(self) -> tuple[str, ...]:
        """Every engine's image."""
        return tuple(self.serving(engine) for engine in ENGINES)


# --- GPU defaults -------------------------------------------------------------------------------
# A cluster has one GPU stack: either the device plugin (with one resource naming strategy) or
# the DRA driver, and its hosts have one set of device-node groups. The chart states these once
# (values `gpu.*`, passed as the variables below); an InferenceService that sets the field itself
# wins.
#
#     INFERENCE_OPERATOR_GPU_ALLOCATION           devicePlugin | dra            (default devicePlugin)
#     INFERENCE_OPERATOR_GPU_RESOURCE_NAMING      single | mixed                (default single)
#     INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS  comma-separated GIDs, or ""   (default 44,109)

ALLOCATION_ENV = "INFERENCE_OPERATOR_GPU_ALLOCATION"
RESOURCE_NAMING_ENV = "INFERENCE_OPERATOR_GPU_RESOURCE_NAMING"
SUPPLEMENTAL_GROUPS_ENV = "INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS"
# video (44 on Debian and Ubuntu) and a common render GID. The render GID differs between hosts
# (109, 110 and 991 are all common): `stat -c %g /dev/kfd /dev/dri/renderD*` on a GPU node.
DEFAULT_SUPPLEMENTAL_GROUPS = (44, 109)
MAX_GID = 4294967295


E = TypeVar("E", GpuAllocation, ResourceNaming)


@dataclass(frozen=True)
class GpuDefaults:
    allocation: GpuAllocation = GpuAllocation.DEVICE_PLUGIN
    resource_naming: ResourceNaming = ResourceNaming.SINGLE
    supplemental_groups: tuple[int, ...] = DEFAULT_SUPPLEMENTAL_GROUPS

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> GpuDefaults:
        """Pure: the defaults the variables in `environ` describe; unset variables keep ours."""
        defaults = cls()
        allocation = _enum(environ, ALLOCATION_ENV, GpuAllocation, defaults.allocation)
        naming = _enum(environ, RESOURCE_NAMING_ENV, ResourceNaming, defaults.resource_naming)
        groups = defaults.supplemental_groups
        if SUPPLEMENTAL_GROUPS_ENV in environ:
            groups = parse_groups(environ[SUPPLEMENTAL_GROUPS_ENV], SUPPLEMENTAL_GROUPS_ENV)
        return cls(allocation=allocation, resource_naming=naming, supplemental_groups=groups)


def _enum(environ: Mapping[str, str], name: str, enum: type[E], default: E) -> E:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return enum(raw)
    except ValueError:
        allowed = " or ".join(e.value for e in enum)
        raise SettingsError(f"{name}={raw!r}: must be {allowed}") from None


def parse_groups(raw: str, name: str) -> tuple[int, ...]:
    """`44,992` → (44, 992); empty → no groups. Bad input names `name`."""
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    try:
        groups = tuple(int(p) for p in parts)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: must be comma-separated group IDs, e.g. 44,992") from None
    if any(g < 1 or g > MAX_GID for g in groups):  # 0, root's group, would reach every container
        raise SettingsError(f"{name}={raw!r}: group IDs must be between 1 and {MAX_GID}")
    return groups


# --- Model fetch --------------------------------------------------------------------------------
# How model-fetch init containers reach model sources (chart values `modelFetch.*`). These are the
# platform's, never the InferenceService's: a proxy or a CA is what decides who sees a Hub token.
#
#     INFERENCE_OPERATOR_FETCH_HTTPS_PROXY / _HTTP_PROXY / _NO_PROXY   proxy settings (default none)
#     INFERENCE_OPERATOR_FETCH_CA_BUNDLE   PEM certificates trusted besides the public roots

FETCH_HTTPS_PROXY_ENV = "INFERENCE_OPERATOR_FETCH_HTTPS_PROXY"
FETCH_HTTP_PROXY_ENV = "INFERENCE_OPERATOR_FETCH_HTTP_PROXY"
FETCH_NO_PROXY_ENV = "INFERENCE_OPERATOR_FETCH_NO_PROXY"
FETCH_CA_BUNDLE_ENV = "INFERENCE_OPERATOR_FETCH_CA_BUNDLE"
# An environment variable's value must fit the kernel's limit for one string (128 KiB).
MAX_CA_BUNDLE_BYTES = 64 * 1024
_PROXY = re.compile(r"^https?://[^\s/?#]+/?$")


@dataclass(frozen=True)
class FetchSettings:
    """Proxy and extra CA certificates for the model-fetch init containers."""

    https_proxy: str = ""
    http_proxy: str = ""
    no_proxy: str = ""
    ca_bundle: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> FetchSettings:
        """Pure: the settings the variables in `environ` describe; a bad value names its variable."""
        proxies = {}
        for name in (FETCH_HTTPS_PROXY_ENV, FETCH_HTTP_PROXY_ENV):
            value = environ.get(name, "").strip()
            if value and not _PROXY.match(value):
                raise SettingsError(f"{name}={value!r}: must be a proxy URL, http(s)://host[:port]")
            proxies[name] = value
        no_proxy = environ.get(FETCH_NO_PROXY_ENV, "").strip()
        if any(c.isspace() for c in no_proxy):
            raise SettingsError(f"{FETCH_NO_PROXY_ENV}: a comma-separated list of hosts, without spaces")
        bundle = environ.get(FETCH_CA_BUNDLE_ENV, "").strip()
        if bundle and ("-----BEGIN CERTIFICATE-----" not in bundle or len(bundle.encode()) > MAX_CA_BUNDLE_BYTES):
            raise SettingsError(f"{FETCH_CA_BUNDLE_ENV}: PEM certificates of at most {MAX_CA_BUNDLE_BYTES} bytes")
        return cls(
            https_proxy=proxies[FETCH_HTTPS_PROXY_ENV],
            http_proxy=proxies[FETCH_HTTP_PROXY_ENV],
            no_proxy=no_proxy,
            ca_bundle=bundle + "\n" if bundle else "",
        )


# --- NetworkPolicy ------------------------------------------------------------------------------
NETWORK_POLICY_ENV = "INFERENCE_OPERATOR_NETWORK_POLICY"
OPERATOR_NAMESPACE_ENV = "INFERENCE_OPERATOR_NAMESPACE"
PROMETHEUS_NAMESPACES_ENV = "INFERENCE_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
DEFAULT_PROMETHEUS_NAMESPACES: dict[str, object] = {"matchLabels": {NAMESPACE_NAME_LABEL: "monitoring"}}
_SELECTOR_KEYS = {"matchLabels", "matchExpressions"}
_OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist"}


@dataclass(frozen=True)
class NetworkPolicySettings:
    """Whether each InferenceService gets a NetworkPolicy (chart value networkPolicy.enabled),
    and who may reach its pods' non-serving ports: the operator's namespace (which asks the
    adapters sidecars how they stand) and Prometheus's (a namespace label selector).

        INFERENCE_OPERATOR_NETWORK_POLICY                    true | false    (default false; the
                                                             chart sets true)
        INFERENCE_OPERATOR_NAMESPACE                         the operator's namespace
        INFERENCE_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR     a LabelSelector as JSON (default:
                                                             the namespace named monitoring)
    """

    enabled: bool = False
    operator_namespace: str = ""
    prometheus_namespaces: dict[str, object] = field(default_factory=lambda: dict(DEFAULT_PROMETHEUS_NAMESPACES))

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> NetworkPolicySettings:
        """Pure: the settings `environ` describes; a bad value names its variable."""
        raw = environ.get(NETWORK_POLICY_ENV, "").strip().lower()
        if raw not in ("", "true", "false"):
            raise SettingsError(f"{NETWORK_POLICY_ENV}={raw!r}: must be true or false")
        namespace = environ.get(OPERATOR_NAMESPACE_ENV, "").strip()
        if raw == "true" and not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace):
            raise SettingsError(
                f"{OPERATOR_NAMESPACE_ENV}={namespace!r}: NetworkPolicies need the operator's namespace"
            )
        selector = dict(DEFAULT_PROMETHEUS_NAMESPACES)
        if text := environ.get(PROMETHEUS_NAMESPACES_ENV, "").strip():
            selector = parse_selector(text, PROMETHEUS_NAMESPACES_ENV)
        return cls(enabled=raw == "true", operator_namespace=namespace, prometheus_namespaces=selector)


def _well_formed(labels: object, expressions: object) -> bool:
    """Whether matchLabels maps strings to strings and each matchExpressions entry has a key and
    a known operator."""
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        return False
    return isinstance(expressions, list) and all(
        isinstance(e, dict) and isinstance(e.get("key"), str) and e.get("operator") in _OPERATORS for e in expressions
    )


def parse_selector(text: str, name: str) -> dict[str, object]:
    """A Kubernetes LabelSelector from JSON, its shape checked (the API server checks the rest);
    empty parts left out. One that selects every namespace is refused: say so with a list."""
    problem = f"{name}: must be a label selector as JSON, e.g. " + '{"matchLabels": {"name": "monitoring"}}'
    try:
        selector = json.loads(text)
    except ValueError:
        raise SettingsError(problem) from None
    if not isinstance(selector, dict) or set(selector) - _SELECTOR_KEYS:
        raise SettingsError(problem)
    selector = {k: v for k, v in selector.items() if v}  # Helm writes null and [] for unset parts
    if not selector:
        raise SettingsError(f"{name}: an empty selector would let every namespace in")
    labels = selector.get("matchLabels", {})
    expressions = selector.get("matchExpressions", [])
    if not _well_formed(labels, expressions):
        raise SettingsError(problem)
    return selector


# --- Tracing ------------------------------------------------------------------------------------
TRACES_ENDPOINT_ENV = "INFERENCE_OPERATOR_OTLP_TRACES_ENDPOINT"
TRACE_SAMPLE_RATIO_ENV = "INFERENCE_OPERATOR_TRACE_SAMPLE_RATIO"
_TRACES_URL = re.compile(r"^https?://[^\s/?#@]+(/[^\s?#]*)?$")


@dataclass(frozen=True)
class TracingSettings:
    """Where the operator sends the spans of its reconciles (chart values tracing.endpoint and
    tracing.samplingRatio): the platform's collector, never an address from an InferenceService.

        INFERENCE_OPERATOR_OTLP_TRACES_ENDPOINT   OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces
        INFERENCE_OPERATOR_TRACE_SAMPLE_RATIO     share of reconciles traced, 0..1 (default 1)
    """

    endpoint: str = ""  # "" = tracing off
    sampling_ratio: float = 1.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TracingSettings:
        """Pure: the settings the variables in `environ` describe; a bad value names its variable."""
        endpoint = environ.get(TRACES_ENDPOINT_ENV, "").strip()
        if endpoint and (len(endpoint) > 2048 or not _TRACES_URL.match(endpoint)):
            raise SettingsError(
                f"{TRACES_ENDPOINT_ENV}={endpoint!r}: must be an http(s) URL without user info or query"
            )
        text = environ.get(TRACE_SAMPLE_RATIO_ENV, "").strip() or "1"
        try:
            ratio = float(text)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise SettingsError(f"{TRACE_SAMPLE_RATIO_ENV}={text!r}: must be a number from 0 to 1")
        return cls(endpoint=endpoint, sampling_ratio=ratio)


# --- Activator ----------------------------------------------------------------------------------
ACTIVATOR_SERVICE_ENV = "INFERENCE_OPERATOR_ACTIVATOR_SERVICE"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class ActivatorSettings:
    """Where the chart installed the activator that holds requests of services at zero.

    INFERENCE_OPERATOR_ACTIVATOR_SERVICE   NAMESPACE/NAME of its Service; unset: no activator,
                                           and a service at zero refuses connections
    """

    namespace: str = ""
    service: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.service)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ActivatorSettings:
        text = environ.get(ACTIVATOR_SERVICE_ENV, "").strip()
        if not text:
            return cls()
        namespace, _, service = text.partition("/")
        if not (_DNS_LABEL.match(namespace) and _DNS_LABEL.match(service)):
            raise SettingsError(f"{ACTIVATOR_SERVICE_ENV}={text!r}: must be NAMESPACE/NAME of a Service")
        return cls(namespace, service)


# --- Peering ------------------------------------------------------------------------------------
# High availability: kopf peering settings from the environment.
#
# Replicas started with `inference-operator run --peering NAME` exchange keep-alives through a
# (Cluster)KopfPeering object; only the one with the highest priority handles events, the others
# pause. Replicas of one Deployment share their command line, and kopf pauses *every* replica
# when two share the highest priority, so each replica needs a priority of its own:
#
# - `INFERENCE_OPERATOR_PEERING_PRIORITY`: an integer, or `random` for a random one in
#   [1, 2**30) drawn at start (what the Helm chart sets). Overrides `--priority` when set.
# - `INFERENCE_OPERATOR_PEERING_LIFETIME`: seconds a replica's keep-alive stays valid (kopf's
#   default is 60). A replica that exits cleanly withdraws at once; one that is killed is
#   replaced by a paused peer when this runs out, so it bounds the takeover time.

PEERING_PRIORITY_ENV = "INFERENCE_OPERATOR_PEERING_PRIORITY"
PEERING_LIFETIME_ENV = "INFERENCE_OPERATOR_PEERING_LIFETIME"
MAX_PRIORITY = 2**30


@dataclass(frozen=True)
class PeeringSettings:
    """Peering as the environment asks for it; None leaves kopf's value (or `--priority`)."""

    priority: int | None = None
    random_priority: bool = False
    lifetime: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> PeeringSettings:
        """Pure: the settings in `environ`; a bad value raises ValueError naming its variable."""
        text = environ.get(PEERING_PRIORITY_ENV, "").strip()
        priority = None
        if text and text != "random":
            try:
                priority = int(text)
            except ValueError:
                raise ValueError(f"{PEERING_PRIORITY_ENV} must be an integer or 'random', got {text!r}") from None
        lifetime = environ.get(PEERING_LIFETIME_ENV, "").strip()
        seconds = int(lifetime) if lifetime.isdigit() else 0
        if lifetime and seconds < 1:
            raise ValueError(f"{PEERING_LIFETIME_ENV} must be a whole number of seconds >= 1, got {lifetime!r}")
        return cls(priority=priority, random_priority=text == "random", lifetime=seconds or None)

    def apply(self, settings: kopf.OperatorSettings) -> None:
        """Set kopf's peering priority and lifetime; a random priority is drawn now."""
        if self.random_priority:
            settings.peering.priority = random.SystemRandom().randrange(1, MAX_PRIORITY)
        elif self.priority is not None:
            settings.peering.priority = self.priority
        if self.lifetime is not None:
            settings.peering.lifetime = self.lifetime


# --- Pod policy ---------------------------------------------------------------------------------
# What an InferenceService may ask of its pods, as the platform team allows it (chart `policy.*`).
#
# "May create InferenceServices" must not mean "may run pods as any ServiceAccount, at any
# priority, from any image": the operator renders those pods with its own rights. So a spec that
# names a ServiceAccount, a PriorityClass or an image outside the platform's lists, or asks for
# the ServiceAccount token to be mounted when the platform does not allow it, is refused whole:
# `Degraded=True`, reason `PolicyViolation`, naming the field and the value; nothing is rolled out
# (a running Deployment keeps its previous spec) until the spec changes or the platform widens
# the policy (an operator restart applies it to every InferenceService).
#
#     INFERENCE_OPERATOR_POLICY_SERVICE_ACCOUNTS   comma-separated names         (default: default)
#     INFERENCE_OPERATOR_POLICY_PRIORITY_CLASSES   comma-separated names         (default: none)
#     INFERENCE_OPERATOR_POLICY_IMAGE_REGISTRIES   comma-separated prefixes, *   (default: those of
#                                                  the operator's own images)
#     INFERENCE_OPERATOR_POLICY_ALLOW_TOKEN        true | false                  (default: false)
#     INFERENCE_OPERATOR_POLICY_SUPPLEMENTAL_GROUPS  comma-separated GIDs and     (default: 1-999,
#                                                  ranges (1-999), or *; empty    the system groups
#                                                  allows none                    hosts put video
#                                                                                 and render in)
#     INFERENCE_OPERATOR_POLICY_GATEWAYS           comma-separated namespace/name (default: *)
#                                                  of Gateways, namespace/*, or *
#     INFERENCE_OPERATOR_POLICY_HOSTNAMES          comma-separated host names     (default: *)
#                                                  and *.suffix patterns, or *
#
# Supplemental groups reach every container of the pod (the credential holders too): GID 0 is
# never allowed, and by default only system groups (below 1000, where distributions put video and
# render; user and project groups, which own shared files, start at 1000). An HTTPRoute's
# parentRefs decide which Gateway (so which listeners and addresses) serves the author's routes,
# and its hostnames which requests it takes: an exact name beats another tenant's wildcard. A
# parentRef without a namespace is the InferenceService's.

SERVICE_ACCOUNTS_ENV = "INFERENCE_OPERATOR_POLICY_SERVICE_ACCOUNTS"
PRIORITY_CLASSES_ENV = "INFERENCE_OPERATOR_POLICY_PRIORITY_CLASSES"
IMAGE_REGISTRIES_ENV = "INFERENCE_OPERATOR_POLICY_IMAGE_REGISTRIES"
ALLOW_TOKEN_ENV = "INFERENCE_OPERATOR_POLICY_ALLOW_TOKEN"
POLICY_SUPPLEMENTAL_GROUPS_ENV = "INFERENCE_OPERATOR_POLICY_SUPPLEMENTAL_GROUPS"
GATEWAYS_ENV = "INFERENCE_OPERATOR_POLICY_GATEWAYS"
HOSTNAMES_ENV = "INFERENCE_OPERATOR_POLICY_HOSTNAMES"
DEFAULT_POLICY_GROUPS = "1-999"
# namespace/name, namespace/*, or *; host names and *.suffix patterns, or * (as the chart's schema).
_GATEWAY = r"\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?/(\*|[a-z0-9]([-a-z0-9.]*[a-z0-9])?)"
_HOSTNAME = r"\*|(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
ANY = "*"


def normalized_image(image: str) -> str:
    """`attacker/steal` and `ubuntu` are Docker Hub images: name the registry they come from."""
    first, _, rest = image.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        return f"docker.io/{image if rest else 'library/' + image}"
    return image


def normalized_prefix(prefix: str) -> str:
    """A registry prefix as image names start: `mirror.example` and `ghcr.io/org/` name hosts
    (kept), `org/` a Docker Hub namespace (`docker.io/org/`); always ending in one `/`."""
    path = prefix.rstrip("/")
    first = path.split("/", 1)[0]
    return f"{path}/" if "." in first or ":" in first or first == "localhost" else f"docker.io/{path}/"


def repository_prefix(image: str) -> str:
    """`ghcr.io/org/model-server:1.0` → `ghcr.io/org/`: where the operator's own images live."""
    name = normalized_image(image).split("@", 1)[0]
    return name.rsplit("/", 1)[0] + "/"


def _names(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


@dataclass(frozen=True)
class PodPolicy:
    """The platform's limits on what a spec may ask of its pods (`policy.violations` applies
    them): one field per variable above, in their order."""

    service_accounts: tuple[str, ...] = ("default",)
    priority_classes: tuple[str, ...] = ()
    image_registries: tuple[str, ...] = (ANY,)
    allow_token: bool = False
    # Inclusive GID ranges; ANY_GROUP allows every GID but 0.
    supplemental_groups: tuple[tuple[int, int], ...] = ()
    gateways: tuple[str, ...] = (ANY,)
    hostnames: tuple[str, ...] = (ANY,)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], own_images: Iterable[str]) -> PodPolicy:
        """The platform's policy; registries default to those of the operator's own images."""
        registries = _names(environ.get(IMAGE_REGISTRIES_ENV)) or tuple(
            dict.fromkeys(repository_prefix(i) for i in own_images)
        )
        token = environ.get(ALLOW_TOKEN_ENV, "").strip().lower()
        if token not in ("", "true", "false"):
            raise ValueError(f"{ALLOW_TOKEN_ENV}={token!r}: must be true or false")
        return cls(
            service_accounts=_names(environ.get(SERVICE_ACCOUNTS_ENV)) or ("default",),
            priority_classes=_names(environ.get(PRIORITY_CLASSES_ENV)) or (),
            image_registries=registries,
            allow_token=token == "true",
            supplemental_groups=_gid_ranges(environ.get(POLICY_SUPPLEMENTAL_GROUPS_ENV, DEFAULT_POLICY_GROUPS)),
            gateways=_patterns(environ, GATEWAYS_ENV, _GATEWAY),
            hostnames=_patterns(environ, HOSTNAMES_ENV, _HOSTNAME),
        )

    def image_allowed(self, image: str) -> bool:
        if ANY in self.image_registries:
            return True
        name = normalized_image(image)
        return any(name.startswith(normalized_prefix(prefix)) for prefix in self.image_registries)

    def group_allowed(self, gid: int) -> bool:
        return gid != 0 and any(low <= gid <= high for low, high in self.supplemental_groups)

    def gateway_allowed(self, namespace: str, name: str) -> bool:
        return any(p in (ANY, f"{namespace}/{name}", f"{namespace}/{ANY}") for p in self.gateways)

    def hostname_allowed(self, hostname: str) -> bool:
        """An exact name, or any name (a wildcard one too) under a `*.suffix` pattern."""
        return any(p in (ANY, hostname) or (p.startswith("*.") and hostname.endswith(p[1:])) for p in self.hostnames)


ANY_GROUP = (1, MAX_GID)


def _gid_ranges(text: str) -> tuple[tuple[int, int], ...]:
    """`44,109,1000-1999` → ((44, 44), (109, 109), (1000, 1999)); `*` → every GID but 0."""
    ranges = []
    for part in _names(text) or ():
        if part == ANY:
            ranges.append(ANY_GROUP)
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or not (high or low).isdigit() or not 0 < int(low) <= int(high or low) <= MAX_GID:
            raise ValueError(
                f"{POLICY_SUPPLEMENTAL_GROUPS_ENV}={text!r}: GIDs (1-{MAX_GID}), ranges such as 1000-1999, or *"
            )
        ranges.append((int(low), int(high or low)))
    return tuple(ranges)


def _patterns(environ: Mapping[str, str], name: str, pattern: str) -> tuple[str, ...]:
    values = _names(environ.get(name)) or (ANY,)
    if bad := [v for v in values if not re.fullmatch(pattern, v)]:
        raise ValueError(f"{name}: {', '.join(bad)} is not a valid entry")
    return values


# --- Credentials --------------------------------------------------------------------------------
# Where the operator may send a Prometheus or Hub credential (credentials.py's module docstring
# gives the rules these settings feed).
#
#     INFERENCE_OPERATOR_PROMETHEUS_AUTH           true | false: credentials at all (default true)
#     INFERENCE_OPERATOR_PROMETHEUS_ALLOW_HTTP     true | false: plain http URLs (default false)
#     INFERENCE_OPERATOR_PROMETHEUS_ALLOWED_URLS   comma-separated URL prefixes, or * (default
#                                                  DEFAULT_ALLOWED_URLS; empty allows none)
#     INFERENCE_OPERATOR_HUB_TOKENS                true | false: Hub tokens at all (default true)
#     INFERENCE_OPERATOR_HUB_TOKEN_ENDPOINTS       https Hub endpoints (default the public Hub)

PROMETHEUS_AUTH_ENV = "INFERENCE_OPERATOR_PROMETHEUS_AUTH"
PROMETHEUS_ALLOW_HTTP_ENV = "INFERENCE_OPERATOR_PROMETHEUS_ALLOW_HTTP"
PROMETHEUS_ALLOWED_URLS_ENV = "INFERENCE_OPERATOR_PROMETHEUS_ALLOWED_URLS"
HUB_TOKENS_ENV = "INFERENCE_OPERATOR_HUB_TOKENS"
HUB_ENDPOINTS_ENV = "INFERENCE_OPERATOR_HUB_TOKEN_ENDPOINTS"
PUBLIC_HUB = "https://huggingface.co"


def _truthy(text: str | None, default: bool) -> bool:
    if text is None or not text.strip():
        return default
    return text.strip().lower() in ("1", "true", "yes", "on")


ANY_URL = "*"
# The Prometheus Operator's and kube-prometheus-stack's in-cluster Services, namespace monitoring:
# what the operator allows when nothing is configured (the chart's prometheus.allowedUrls too).
DEFAULT_ALLOWED_URLS = tuple(
    f"http://{service}.monitoring{suffix}:9090"
    for service in ("prometheus-operated", "kube-prometheus-stack-prometheus")
    for suffix in ("", ".svc", ".svc.cluster.local")
)


def _url_list(env: Mapping[str, str], name: str, default: str, schemes: tuple[str, ...]) -> tuple[str, ...]:
    text = env.get(name)
    text = default if text is None else text
    urls = tuple(u.strip() for u in text.replace("\n", ",").split(",") if u.strip())
    for url in urls:
        if url == ANY_URL and "http" in schemes:
            continue
        parts = urlsplit(url)
        if parts.scheme not in schemes or not parts.hostname or parts.username is not None:
            raise ValueError(f"{name}: {url!r} is not an {'/'.join(schemes)} URL without user info")
    return urls


@dataclass(frozen=True)
class CredentialPolicy:
    """Where a credential may go (`credentials.check_url` and the refusals apply it): one field
    per variable above, in their order."""

    enabled: bool = True
    allow_http: bool = False
    allowed_urls: tuple[str, ...] = DEFAULT_ALLOWED_URLS
    hub_tokens: bool = True
    hub_endpoints: tuple[str, ...] = (PUBLIC_HUB,)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CredentialPolicy:
        """Pure: the policy the variables in `env` describe; a malformed list raises ValueError."""
        return cls(
            enabled=_truthy(env.get(PROMETHEUS_AUTH_ENV), True),
            allow_http=_truthy(env.get(PROMETHEUS_ALLOW_HTTP_ENV), False),
            allowed_urls=_url_list(env, PROMETHEUS_ALLOWED_URLS_ENV, ",".join(DEFAULT_ALLOWED_URLS), ("http", "https")),
            hub_tokens=_truthy(env.get(HUB_TOKENS_ENV), True),
            hub_endpoints=_url_list(env, HUB_ENDPOINTS_ENV, PUBLIC_HUB, ("https",)),
        )
