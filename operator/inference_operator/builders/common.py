"""What every owned object shares: identity of its owner, names, labels, ownerReferences."""

from __future__ import annotations

from dataclasses import dataclass

from ..models import API_VERSION, KIND, InferenceServiceSpec, check_name

MANAGER = "rocm-inference-operator"
COMPONENT = "predictor"
SPEC_HASH_ANNOTATION = "inference.rocm.dev/spec-hash"
OWNER_LABEL = "inference.rocm.dev/inference-service"


@dataclass(frozen=True)
class Owner:
    """The InferenceService an object belongs to: enough to name, label and own it."""

    name: str
    namespace: str
    uid: str
    spec: InferenceServiceSpec

    def __post_init__(self) -> None:
        check_name(self.name)  # every object is named after it: refuse a name a Service cannot take

    @property
    def model_name(self) -> str:
        return self.spec.model.name or self.name


def selector_labels(owner: Owner) -> dict[str, str]:
    """Labels that select this service's pods; immutable once a Deployment exists."""
    return {
        "app.kubernetes.io/name": "model-server",
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": COMPONENT,
    }


def standard_labels(owner: Owner) -> dict[str, str]:
    return {
        **selector_labels(owner),
        "app.kubernetes.io/managed-by": MANAGER,
        "app.kubernetes.io/part-of": "rocm-inference",
        OWNER_LABEL: owner.name,
    }


def selector_string(owner: Owner) -> str:
    """The pods' selector in label-selector syntax (status.selector, for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(owner).items()))


def owner_reference(owner: Owner) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(owner: Owner, name: str | None = None, annotations: dict | None = None) -> dict:
    meta = {
        "name": name or owner.name,
        "namespace": owner.namespace,
        "labels": standard_labels(owner),
        "ownerReferences": [owner_reference(owner)],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def service_url(owner: Owner) -> str:
    return f"http://{owner.name}.{owner.namespace}.svc.cluster.local"
