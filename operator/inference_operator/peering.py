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

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `render` runs without kopf installed
    import kopf

PRIORITY_ENV = "INFERENCE_OPERATOR_PEERING_PRIORITY"
LIFETIME_ENV = "INFERENCE_OPERATOR_PEERING_LIFETIME"
MAX_PRIORITY = 2**30


@dataclass(frozen=True)
class PeeringSettings:
    """Peering as the environment asks for it; None leaves kopf's value (or `--priority`)."""

    priority: int | None = None
    random_priority: bool = False
    lifetime: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> PeeringSettings:
        """Pure: the settings in `environ`; a bad value raises ValueError naming its variable."""
        text = environ.get(PRIORITY_ENV, "").strip()
        priority = None
        if text and text != "random":
            try:
                priority = int(text)
            except ValueError:
                raise ValueError(f"{PRIORITY_ENV} must be an integer or 'random', got {text!r}") from None
        lifetime = environ.get(LIFETIME_ENV, "").strip()
        seconds = int(lifetime) if lifetime.isdigit() else 0
        if lifetime and seconds < 1:
            raise ValueError(f"{LIFETIME_ENV} must be a whole number of seconds >= 1, got {lifetime!r}")
        return cls(priority=priority, random_priority=text == "random", lifetime=seconds or None)

    def apply(self, settings: kopf.OperatorSettings) -> None:
        """Set kopf's peering priority and lifetime; a random priority is drawn now."""
        if self.random_priority:
            settings.peering.priority = random.SystemRandom().randrange(1, MAX_PRIORITY)
        elif self.priority is not None:
            settings.peering.priority = self.priority
        if self.lifetime is not None:
            settings.peering.lifetime = self.lifetime
