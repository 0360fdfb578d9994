"""The InferenceService's identity, and the names and patterns its fields take.

The API server's own rules for names, labels and quantities, written once: fields of every model
use these types and patterns, and the builders read the limits from here.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, Field, WithJsonSchema

GROUP = "inference.rocm.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "ris"
API_VERSION = f"{GROUP}/{VERSION}"

# A non-negative Kubernetes quantity: decimal or binary SI suffix, or an exponent.
QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
# A path segment that is not `.` or `..` (RE2, as the API server's patterns: no lookahead).
PATH_SEGMENT = r"([^/.\s][^/\s]*|\.[^/.\s][^/\s]*|\.\.[^/\s]+)"
# hf://ORG/NAME[@REVISION]: a Hugging Face Hub repository, at a branch, tag or commit.
HF_URI_PATTERN = r"hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(@[A-Za-z0-9][-A-Za-z0-9_./]*)?"
# pvc://CLAIM/PATH becomes a volume subPath, which the API server refuses with `..` in it.
MODEL_URI_PATTERN = (
    rf"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/{PATH_SEGMENT})*/?|(s3|https?|oci)://\S+|{HF_URI_PATTERN})$"
)
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
IMAGE_PATTERN = r"^\S+$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Label keys and values, as the API server checks them (pods would be refused otherwise).
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# Model names and versions reach the server's command line and URL paths: no leading '-' or '.',
# no '=', '/' or spaces, so a value can never be read as a flag or a path.
SAFE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"

# Names as the API server (or the model server) takes them; a field adds its description.
DnsLabel = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]
DnsSubdomain = Annotated[str, Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)]
SafeName = Annotated[str, Field(pattern=SAFE_NAME_PATTERN, max_length=63)]
# An InferenceService's name is its Service's, Deployment's and its label values: a DNS-1035 label.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX_LENGTH = 63
NAME_MESSAGE = (
    f"metadata.name must be a DNS-1035 label of at most {NAME_MAX_LENGTH} characters: lowercase letters, "
    "digits and '-', starting with a letter and ending with a letter or digit (it names the Service)"
)
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$"
)


def _quantity(value: object) -> object:
    """Accept YAML numbers for quantities (`cpu: 8`) and keep them as strings, as the API does."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return str(value)
    return value


# int-or-string on the wire (`cpu: 8` or `cpu: 500m`), a string in Python.
Quantity = Annotated[
    str,
    Field(pattern=QUANTITY_PATTERN),
    BeforeValidator(_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
        }
    ),
]


# A Gateway API hostname (a DNS name, or one wildcard label first), as HTTPRoute accepts it.
HOSTNAME_PATTERN = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class SpecError(ValueError):
    """A spec the operator cannot act on; `field` names where, `message` says why."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def check_name(name: str) -> None:
    """Raise SpecError unless `name` can name the Service and label the pods (as the CRD's rule)."""
    if len(name) > NAME_MAX_LENGTH or not re.match(NAME_PATTERN, name):
        raise SpecError("metadata.name", f"{name!r}: {NAME_MESSAGE.removeprefix('metadata.name ')}")
