"""The Prometheus client for a URL and its credentials, shared by the autoscaler and the
canary analysis so both hand a Secret out by the same rules.

The Secrets named by `prometheusAuth` are read from the InferenceService's namespace with
the operator's rights, so a Secret is used only once it has opted in (`check_secret`), and
the caller checks the URL first (`credentials.check_url`). The client is rebuilt when the
URL or the auth change, and every `SECRET_TTL_SECONDS` while it has any (Secrets rotate).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from ..credentials import check_secret
from ..k8s import KubeApi, Ref
from ..kinds import SECRET
from ..models import PrometheusAuth, SecretKeyRef
from .client import PrometheusClient, PrometheusError

SECRET_TTL_SECONDS = 300
# What getting a client or querying with it raises, besides CredentialsRefused (a rule's verdict,
# which each caller reports its own way).
CLIENT_ERRORS = (PrometheusError, ApiException, ValueError, ssl.SSLError)


def client_problem(exc: BaseException) -> str:
    """One of CLIENT_ERRORS as a status can say it: never what the URL answered (PrometheusError
    messages are bounded) nor the Secret's text."""
    if isinstance(exc, PrometheusError):
        return str(exc) or type(exc).__name__
    if isinstance(exc, ApiException):
        return f"API error {exc.status} reading a Prometheus credential Secret"
    return f"unusable Prometheus credential ({type(exc).__name__})"


class PrometheusClients:
    """One live client for one namespace's queries; close with `aclose()`."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        clock: Callable[[], float] = time.monotonic,
        factory: Callable[..., PrometheusClient] = PrometheusClient,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.clock = clock
        self.factory = factory
        self._client: PrometheusClient | None = None
        self._key: tuple[str, PrometheusAuth | None] | None = None
        self._born = 0.0

    async def get(self, url: str, auth: PrometheusAuth | None) -> PrometheusClient:
        """A client for `url` carrying `auth`'s Secrets (the caller has checked the URL may have
        them). Raises CredentialsRefused for a Secret that has not opted in, PrometheusError
        for a missing one, and ValueError or ssl.SSLError for one that is unusable."""
        key = (url, auth)
        now = self.clock()
        fresh = not auth or now - self._born < SECRET_TTL_SECONDS
        if self._client is not None and key == self._key and fresh:
            return self._client
        token = ca_pem = None
        if auth and auth.bearer_token_secret:
            token = (await asyncio.to_thread(self._secret_value, auth.bearer_token_secret)).strip()
        if auth and auth.ca_secret:
            ca_pem = await asyncio.to_thread(self._secret_value, auth.ca_secret)
        await self.aclose()
        self._client = self.factory(url, token=token, ca_pem=ca_pem)
        self._key, self._born = key, now
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _secret_value(self, ref: SecretKeyRef) -> str:
        secret = self.api.get(Ref.to(SECRET, self.namespace, ref.name))
        if secret is None:
            raise PrometheusError(f"secret {ref.name} not found")
        check_secret(secret, ref)
        data = (secret.get("data") or {}).get(ref.key)
        if data is None:
            raise PrometheusError(f"secret {ref.name} has no key {ref.key}")
        return base64.b64decode(data).decode()
