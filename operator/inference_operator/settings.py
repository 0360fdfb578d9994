"""Operator-wide defaults for what a spec leaves unset, from the operator's environment (pure:
`config.load()` passes the environment in, once, at start).

A cluster has one GPU stack: either the device plugin (with one resource naming strategy) or
the DRA driver, and its hosts have one set of device-node groups. The chart states these once
(values `gpu.*`, passed as the variables below); an InferenceService that sets the field itself
wins.

    INFERENCE_OPERATOR_GPU_ALLOCATION           devicePlugin | dra            (default devicePlugin)
    INFERENCE_OPERATOR_GPU_RESOURCE_NAMING      single | mixed                (default single)
    INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS  comma-separated GIDs, or ""   (default 44,109)

How model-fetch init containers reach model sources (chart values `modelFetch.*`). These are the
platform's, never the InferenceService's: a proxy or a CA is what decides who sees a Hub token.

    INFERENCE_OPERATOR_FETCH_HTTPS_PROXY / _HTTP_PROXY / _NO_PROXY   proxy settings (default none)
    INFERENCE_OPERATOR_FETCH_CA_BUNDLE   PEM certificates trusted besides the public roots
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from .models import GpuAllocation, ResourceNaming

ALLOCATION_ENV = "INFERENCE_OPERATOR_GPU_ALLOCATION"
RESOURCE_NAMING_ENV = "INFERENCE_OPERATOR_GPU_RESOURCE_NAMING"
SUPPLEMENTAL_GROUPS_ENV = "INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS"
# video (44 on Debian and Ubuntu) and a common render GID. The render GID differs between hosts
# (109, 110 and 991 are all common): `stat -c %g /dev/kfd /dev/dri/renderD*` on a GPU node.
DEFAULT_SUPPLEMENTAL_GROUPS = (44, 109)
MAX_GID = 4294967295


E = TypeVar("E", GpuAllocation, ResourceNaming)


class SettingsError(ValueError):
    """An operator setting with a value the operator cannot use; the message names the variable."""


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
    if any(g < 0 or g > MAX_GID for g in groups):
        raise SettingsError(f"{name}={raw!r}: group IDs must be between 0 and {MAX_GID}")
    return groups


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
