"""What an InferenceService may ask of its pods, as the platform team allows it (chart `policy.*`).

"May create InferenceServices" must not mean "may run pods as any ServiceAccount, at any
priority, from any image": the operator renders those pods with its own rights. So a spec that
names a ServiceAccount, a PriorityClass or an image outside the platform's lists, or asks for
the ServiceAccount token to be mounted when the platform does not allow it, is refused whole:
`Degraded=True`, reason `PolicyViolation`, naming the field and the value; nothing is rolled out
(a running Deployment keeps its previous spec) until the spec changes or the platform widens
the policy (an operator restart applies it to every InferenceService).

    INFERENCE_OPERATOR_POLICY_SERVICE_ACCOUNTS   comma-separated names         (default: default)
    INFERENCE_OPERATOR_POLICY_PRIORITY_CLASSES   comma-separated names         (default: none)
    INFERENCE_OPERATOR_POLICY_IMAGE_REGISTRIES   comma-separated prefixes, *   (default: those of
                                                 the operator's own images)
    INFERENCE_OPERATOR_POLICY_ALLOW_TOKEN        true | false                  (default: false)

Pure: no I/O; the environment is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .models import InferenceServiceSpec

SERVICE_ACCOUNTS_ENV = "INFERENCE_OPERATOR_POLICY_SERVICE_ACCOUNTS"
PRIORITY_CLASSES_ENV = "INFERENCE_OPERATOR_POLICY_PRIORITY_CLASSES"
IMAGE_REGISTRIES_ENV = "INFERENCE_OPERATOR_POLICY_IMAGE_REGISTRIES"
ALLOW_TOKEN_ENV = "INFERENCE_OPERATOR_POLICY_ALLOW_TOKEN"
ANY = "*"
REASON = "PolicyViolation"


class PolicyViolation(Exception):
    """A spec asks for what the platform does not allow; the message names field and value."""

    reason = REASON


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
    service_accounts: tuple[str, ...] = ("default",)
    priority_classes: tuple[str, ...] = ()
    image_registries: tuple[str, ...] = (ANY,)
    allow_token: bool = False

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
        )

    def image_allowed(self, image: str) -> bool:
        if ANY in self.image_registries:
            return True
        name = normalized_image(image)
        return any(name.startswith(normalized_prefix(prefix)) for prefix in self.image_registries)


def violations(spec: InferenceServiceSpec, policy: PodPolicy) -> list[str]:
    """Every field of `spec` the policy refuses, as `field value: why` (empty when allowed)."""
    found = []
    scheduling = spec.scheduling
    account = scheduling.service_account_name
    if account and account not in policy.service_accounts:
        allowed = _list(policy.service_accounts)
        found.append(f"scheduling.serviceAccountName {account!r} is not allowed (allowed: {allowed})")
    priority = scheduling.priority_class_name
    if priority and ANY not in policy.priority_classes and priority not in policy.priority_classes:
        allowed = _list(policy.priority_classes)
        found.append(f"scheduling.priorityClassName {priority!r} is not allowed (allowed: {allowed})")
    if scheduling.automount_service_account_token and not policy.allow_token:
        found.append("scheduling.automountServiceAccountToken true is not allowed on this cluster")
    images = [("runtime.image", spec.runtime.image)]
    if spec.model.uri.startswith("oci://"):
        images.append(("model.uri", spec.model.uri.removeprefix("oci://")))
    for field, image in images:
        if image and not policy.image_allowed(image):
            found.append(f"{field} {image!r} is not from an allowed registry ({_list(policy.image_registries)})")
    return found


def check(spec: InferenceServiceSpec, policy: PodPolicy) -> None:
    """Raise PolicyViolation naming every refused field."""
    if found := violations(spec, policy):
        raise PolicyViolation("; ".join(found))


def _list(values: tuple[str, ...]) -> str:
    return ", ".join(values) if values else "none"
