"""High availability: kopf peering settings from the environment.

Replicas started with `inference-operator run --peering NAME` exchange keep-alives through a
(Cluster)KopfPeering object; only the one with the highest priority handles events, the others
pause. Replicas of one Deployment share their command line, and kopf pauses *every* replica
when two share the highest priority, so each replica needs a priority of its own:

- `INFERENCE_OPERATOR_PEERING_PRIORITY`: an integer, or `random` for a random one in
  [1, 2**30) drawn at start (what the Helm chart sets). Overrides `--priority` when set.
- `INFERENCE_OPERATOR_PEERING_LIFETIME`: seconds a replica's keep-alive stays valid (kopf's
  default is 60). A replica that exits cleanly withdraws at once; one that is killed is
  replaced by a paused peer when this runs out, so it bounds the takeover time.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping

import kopf

PRIORITY_ENV = "INFERENCE_OPERATOR_PEERING_PRIORITY"
LIFETIME_ENV = "INFERENCE_OPERATOR_PEERING_LIFETIME"
MAX_PRIORITY = 2**30


def apply_peering_env(settings: kopf.OperatorSettings, environ: Mapping[str, str] = os.environ) -> None:
    """Set kopf's peering priority and lifetime from the environment, when given there."""
    priority = environ.get(PRIORITY_ENV, "").strip()
    if priority == "random":
        settings.peering.priority = random.SystemRandom().randrange(1, MAX_PRIORITY)
    elif priority:
        try:
            settings.peering.priority = int(priority)
        except ValueError:
            raise ValueError(f"{PRIORITY_ENV} must be an integer or 'random', got {priority!r}") from None
    lifetime = environ.get(LIFETIME_ENV, "").strip()
    if lifetime:
        try:
            seconds = int(lifetime)
        except ValueError:
            seconds = 0
        if seconds < 1:
            raise ValueError(f"{LIFETIME_ENV} must be a whole number of seconds >= 1, got {lifetime!r}")
        settings.peering.lifetime = seconds
