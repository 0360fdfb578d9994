"""The type of the JSON objects the operator reads and writes: Kubernetes objects, their
parts (metadata, status, conditions) and API answers, all as the API server sends them."""

from __future__ import annotations

from typing import Any

JsonObject = dict[str, Any]
