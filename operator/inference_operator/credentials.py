"""Who may make the operator hand out a credential, and where to: Prometheus and the Hub.

`autoscaling.prometheusAuth` names Secrets in the InferenceService's namespace, and the
operator reads them with its own service account. Without rules, anyone who may write an
InferenceService could name any Secret of the namespace and a `prometheusUrl` of their own,
and receive that Secret as a bearer token. So a credential is used only when all of these hold:

- the operator allows Prometheus credentials at all (`INFERENCE_OPERATOR_PROMETHEUS_AUTH`,
  chart `prometheusAuth.enabled`; when off the chart grants no access to Secrets);
- the Secret opts in: it carries the label `inference.rocm.dev/prometheus-credentials: "true"`,
  which only someone who may write Secrets can set;
- the URL is https, unless the operator allows plain http (`..._PROMETHEUS_ALLOW_HTTP`);
- the URL is on the operator's allow-list (`..._PROMETHEUS_ALLOWED_URLS`, a comma-separated
  list of URL prefixes; every query, with or without a credential, must match it). Unset, it
  names the usual in-cluster Prometheus Services (`DEFAULT_ALLOWED_URLS`, also the chart's
  default); empty, it allows nothing; only an explicit `*` allows any URL. A URL of the
  author's choosing is a request from inside the cluster (SSRF): the list decides where.

Kubernetes RBAC cannot restrict `get` by label, so the label is checked after the read; a
Secret without it is neither sent nor kept. The same rules decide whether the operator emits a
KEDA TriggerAuthentication, since KEDA would send the Secret to the same URL.

`model.huggingFace.tokenSecret` is the same hole one step removed: the model-fetch init
container gets the Secret as HF_TOKEN and sends it to `model.huggingFace.endpoint`. So the
operator renders no pod with it unless the Secret carries `inference.rocm.dev/model-credentials:
"true"` and the endpoint is https and on the operator's list of Hub endpoints
(`INFERENCE_OPERATOR_HUB_TOKEN_ENDPOINTS`, default the public Hub only); `runtime.env` cannot
set HF_TOKEN or HF_ENDPOINT (models.OPERATOR_ENV).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from .jsontypes import JsonObject
from .models import AutoscalingMode, AutoscalingSpec, InferenceServiceSpec, SecretKeyRef
from .reasons import Reason
from .settings import ANY_URL, PUBLIC_HUB, CredentialPolicy

SECRET_LABEL = "inference.rocm.dev/prometheus-credentials"
MODEL_SECRET_LABEL = "inference.rocm.dev/model-credentials"


class CredentialsRefused(Exception):
    """The spec asks for something the rules above forbid; `reason` says which (one of REFUSALS)."""

    def __init__(self, reason: Reason, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def _origin_and_path(url: str) -> tuple[str, str | None, int | None, str]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower() or None, port, parts.path.rstrip("/")


def url_allowed(url: str, allowed: tuple[str, ...]) -> bool:
    """Same scheme, host and port as an entry, and a path under the entry's on a `/` boundary;
    any URL only with an explicit `*` entry, none with an empty list."""
    if ANY_URL in allowed:
        return True
    if urlsplit(url).username is not None:
        return False  # `https://allowed@elsewhere` names elsewhere
    scheme, host, port, path = _origin_and_path(url)
    for entry in allowed:
        e_scheme, e_host, e_port, e_path = _origin_and_path(entry)
        if (scheme, host, port) == (e_scheme, e_host, e_port) and (path == e_path or path.startswith(e_path + "/")):
            return True
    return False


def check_url(scaling: AutoscalingSpec, policy: CredentialPolicy) -> None:
    """Refuse a URL off the allow-list, or one that would carry a credential in the clear."""
    url = scaling.prometheus_url
    if not url_allowed(url, policy.allowed_urls):
        raise CredentialsRefused(
            Reason.PROMETHEUS_URL_NOT_ALLOWED,
            f"prometheusUrl {url} is not among the operator's allowed Prometheus URLs",
        )
    auth = scaling.prometheus_auth
    if not auth or not (auth.bearer_token_secret or auth.ca_secret):
        return
    if not policy.enabled:
        raise CredentialsRefused(
            Reason.PROMETHEUS_CREDENTIALS_DISABLED, "this operator is not configured to use Prometheus credentials"
        )
    if auth.bearer_token_secret and urlsplit(url).scheme != "https" and not policy.allow_http:
        raise CredentialsRefused(
            Reason.PROMETHEUS_CREDENTIALS_OVER_HTTP,
            f"a bearer token is only sent over https; prometheusUrl is {urlsplit(url).scheme}://",
        )


def check_secret(secret: JsonObject, ref: SecretKeyRef) -> None:
    """Refuse a Secret that has not opted in with the label."""
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(SECRET_LABEL) != "true":
        raise CredentialsRefused(
            Reason.PROMETHEUS_SECRET_NOT_LABELLED,
            f'secret {ref.name} is not labelled {SECRET_LABEL}: "true"; it is not used',
        )


def secret_refs(scaling: AutoscalingSpec) -> list[SecretKeyRef]:
    auth = scaling.prometheus_auth
    if not auth:
        return []
    return [ref for ref in (auth.bearer_token_secret, auth.ca_secret) if ref is not None]


def check(
    scaling: AutoscalingSpec, policy: CredentialPolicy, read_secret: Callable[[str], JsonObject | None]
) -> dict[str, JsonObject]:
    """Every rule for one spec; the Secrets it names (by name) when all pass.

    `read_secret(name)` returns the Secret or None when it does not exist; a missing Secret is
    not a refusal (it may yet be created), so it is simply absent from the answer.
    """
    check_url(scaling, policy)
    secrets: dict[str, JsonObject] = {}
    for ref in secret_refs(scaling):
        secret = read_secret(ref.name)
        if secret is None:
            continue
        check_secret(secret, ref)
        secrets[ref.name] = secret
    return secrets


# How often the operator looks again at a refused KEDA credential: labelling the Secret is
# not a change of the InferenceService, so no event would tell it.
RECHECK_SECONDS = 60
REFUSALS = (
    Reason.PROMETHEUS_CREDENTIALS_DISABLED,
    Reason.PROMETHEUS_SECRET_NOT_LABELLED,
    Reason.PROMETHEUS_CREDENTIALS_OVER_HTTP,
    Reason.PROMETHEUS_URL_NOT_ALLOWED,
    Reason.PROMETHEUS_SECRET_NOT_FOUND,
    Reason.HUB_TOKENS_DISABLED,
    Reason.HUB_ENDPOINT_NOT_ALLOWED,
    Reason.MODEL_SECRET_NOT_LABELLED,
    Reason.MODEL_SECRET_NOT_FOUND,
)


def keda_refusal(
    scaling: AutoscalingSpec | None, policy: CredentialPolicy, read_secret: Callable[[str], JsonObject | None]
) -> CredentialsRefused | None:
    """Why the KEDA objects must not be emitted, or None. KEDA reads the Secret itself and
    sends it to the same URL, so a Secret that does not exist yet is refused too: it could
    appear later without the label."""
    if scaling is None or scaling.mode != AutoscalingMode.KEDA:
        return None
    try:
        found = check(scaling, policy, read_secret)
    except CredentialsRefused as exc:
        return exc
    for ref in secret_refs(scaling):
        if ref.name not in found:
            return CredentialsRefused(Reason.PROMETHEUS_SECRET_NOT_FOUND, f"secret {ref.name} not found")
    return None


def model_refusal(
    spec: InferenceServiceSpec, policy: CredentialPolicy, read_secret: Callable[[str], JsonObject | None]
) -> CredentialsRefused | None:
    """Why no pod may carry the spec's Hub token, or None (also when there is no token)."""
    hub = spec.model.hugging_face
    if hub is None or not hub.token_secret:
        return None
    if not policy.hub_tokens:
        return CredentialsRefused(Reason.HUB_TOKENS_DISABLED, "this operator is not configured to pass Hub tokens")
    endpoint = hub.endpoint or PUBLIC_HUB
    if urlsplit(endpoint).scheme != "https" or not url_allowed(endpoint, policy.hub_endpoints):
        return CredentialsRefused(
            Reason.HUB_ENDPOINT_NOT_ALLOWED,
            f"model.huggingFace.endpoint {endpoint} is not among the operator's Hub endpoints for tokens "
            f"({', '.join(policy.hub_endpoints) or 'none'})",
        )
    secret = read_secret(hub.token_secret)
    if secret is None:  # refused too: it could appear later without the label
        return CredentialsRefused(Reason.MODEL_SECRET_NOT_FOUND, f"secret {hub.token_secret} not found")
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(MODEL_SECRET_LABEL) != "true":
        return CredentialsRefused(
            Reason.MODEL_SECRET_NOT_LABELLED,
            f'secret {hub.token_secret} is not labelled {MODEL_SECRET_LABEL}: "true"; it is not used',
        )
    return None
