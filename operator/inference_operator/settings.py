"""Operator-wide defaults for what a spec leaves unset, read once from the operator's environment.

A cluster has one GPU stack: either the device plugin (with one resource naming strategy) or
the DRA driver, and its hosts have one set of device-node groups. The chart states these once
(values `gpu.*`, passed as the variables below); an InferenceService that sets the field itself
wins.

    INFERENCE_OPERATOR_GPU_ALLOCATION           devicePlugin | dra            (default devicePlugin)
    INFERENCE_OPERATOR_GPU_RESOURCE_NAMING      single | mixed                (default single)
    INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS  comma-separated GIDs, or ""   (default 44,109)
"""

from __future__ import annotations

import functools
import os
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


@functools.cache
def operator_gpu_defaults() -> GpuDefaults:
    """The running operator's defaults: its environment, read once."""
    return GpuDefaults.from_env(os.environ)
