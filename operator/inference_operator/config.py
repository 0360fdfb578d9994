"""The operator's configuration: its flags and environment, read and checked once, at start.

Every operator-wide setting (default images, GPU defaults, model-fetch proxies, the credential
and pod policies, HA peering, where the API server is) is a field of `OperatorConfig`. The
chart sets them as environment variables (settings.py documents each, section by section); `run` flags override
the images. `load()` is the only place in the operator that reads the process environment:
a bad value stops the operator at start with a message naming the variable, and everything
after start gets the config passed down (kopf's memo, then the `Owner` of each reconcile) and
never looks at the environment again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .builders.common import Owner
from .models import Engine, InferenceServiceSpec
from .settings import (
    ActivatorSettings,
    CredentialPolicy,
    FetchSettings,
    GpuDefaults,
    Images,
    NetworkPolicySettings,
    PeeringSettings,
    PodPolicy,
    TracingSettings,
)

KUBECONFIG_ENV = "KUBECONFIG"


def in_cluster_server(environ: Mapping[str, str]) -> str | None:
    """`https://host:port` from KUBERNETES_SERVICE_HOST/PORT (IPv6 in brackets), None without."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@dataclass(frozen=True)
class OperatorConfig:
    images: Images = field(default_factory=Images)
    gpu: GpuDefaults = field(default_factory=GpuDefaults)
    fetch: FetchSettings = field(default_factory=FetchSettings)
    network: NetworkPolicySettings = field(default_factory=NetworkPolicySettings)
    credentials: CredentialPolicy = field(default_factory=CredentialPolicy)
    # Without an environment, the policy of the default images (their registries only).
    pod_policy: PodPolicy = field(default_factory=lambda: PodPolicy.from_env({}, Images().all))
    peering: PeeringSettings = field(default_factory=PeeringSettings)
    # Traces of reconciles to the platform's collector (chart values tracing.*); off by default.
    tracing: TracingSettings = field(default_factory=TracingSettings)
    # The activator's Service (chart values activator.*): where services at zero send requests.
    activator: ActivatorSettings = field(default_factory=ActivatorSettings)
    # The API server as the kubelet announces it in a pod (client-go's choice too), else None.
    api_server: str | None = None
    # A kubeconfig path outside a pod (KUBECONFIG), read when the client is made.
    kubeconfig: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], images: Mapping[Engine, str | None] = {}) -> OperatorConfig:
        """Pure: the configuration `environ` and the flags describe (`images`: each engine's image
        flag, None where unset). A bad value raises `ValueError` (SettingsError is one) naming its
        variable."""
        return cls._from(environ, Images.from_environment(environ, images))

    @classmethod
    def _from(cls, environ: Mapping[str, str], images: Images) -> OperatorConfig:
        return cls(
            images=images,
            gpu=GpuDefaults.from_env(environ),
            fetch=FetchSettings.from_env(environ),
            network=NetworkPolicySettings.from_env(environ),
            credentials=CredentialPolicy.from_env(environ),
            pod_policy=PodPolicy.from_env(environ, images.all),
            peering=PeeringSettings.from_env(environ),
            tracing=TracingSettings.from_env(environ),
            activator=ActivatorSettings.from_env(environ),
            api_server=in_cluster_server(environ),
            kubeconfig=environ.get(KUBECONFIG_ENV) or None,
        )

    def owner(self, name: str, namespace: str, uid: str, spec: InferenceServiceSpec) -> Owner:
        """The `Owner` the builders get: the InferenceService with this operator's defaults."""
        return Owner(
            name,
            namespace,
            uid,
            spec,
            images=self.images,
            gpu_defaults=self.gpu,
            fetch=self.fetch,
            network=self.network,
        )


def load(images: Mapping[Engine, str | None] = {}) -> OperatorConfig:
    """The running operator's configuration: this process's environment and the flags (`images`:
    each engine's image flag)."""
    return OperatorConfig.from_environ(os.environ, images)
