"""kopf handlers: the I/O edge between the API server and the pure parts of the operator.

One module per feature; importing this package registers every handler with kopf (`kopf run
-m inference_operator.handlers`, and `python -m inference_operator run`, import it):

    startup        kopf's settings, the memo's clients, login; what is released at exit
    service        reconcile on create, update and resume, with the status and events it says
    repair         owned objects' events: drift and deletions repaired, the rollout mirrored
    pods           a service's pods: what is wrong with them, in its status within seconds
    canary         a canary's analysis, a daemon per service with strategy canary
    adapters       status.adapters from the replicas' sidecars, a daemon per service with adapters
    autoscaler     the built-in autoscaler, a daemon per service in builtin mode
    scale_to_zero  the activator's addresses and the wake annotation
    shared         what they share: the status write, the events, the checked reconcile
    daemons        what every daemon does around its work: kopf's settings, the spec, its lifetime
"""

from __future__ import annotations

from .. import lifetimes
from . import adapters, autoscaler, canary, pods, repair, scale_to_zero, service, startup

FEATURES = (startup, service, repair, pods, canary, adapters, autoscaler, scale_to_zero)

# Every daemon is registered by now: none needs a finalizer.
lifetimes.release_finalizers()
