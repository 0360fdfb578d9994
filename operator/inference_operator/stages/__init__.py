"""The stages of a reconcile, in order: each a transform of the desired set (see base.py).

    desired_objects (what the spec asks) -> scale to zero -> canary -> apply -> prune

Scale to zero comes first, so the canary's arms are judged against the whole set the spec
asks for, its private Service included (the set's order, and so the apply order within a kind,
is then the builders' with each stage's objects beside the one they derive from). A new stage is
a module here with a `stage` function, entered in `PIPELINE`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..builders import build_all
from ..builders.common import Owner
from ..jsontypes import JsonObject
from . import canary, scale_to_zero
from .base import Cluster, Context, NothingLive, Stage, Staged, unmarked

PIPELINE: tuple[Stage, ...] = (scale_to_zero.stage, canary.stage)


def run(
    cluster: Cluster,
    owner: Owner,
    objects: list[JsonObject],
    context: Context,
    pipeline: Sequence[Stage] = PIPELINE,
) -> Staged:
    """`objects` through each stage in turn; a stage's report stands unless a later one makes its own."""
    staged = Staged(objects)
    for step in pipeline:
        out = step(cluster, owner, staged.objects, context)
        staged = Staged(out.objects, out.rollout if out.rollout is not None else staged.rollout)
    return staged


def rendered(owner: Owner) -> list[JsonObject]:
    """What the spec alone renders (`render`): the builders' set through every stage, with
    nothing live and no marks."""
    return run(NothingLive(), owner, build_all(owner), Context(mark=unmarked)).objects


__all__ = ["PIPELINE", "Cluster", "Context", "NothingLive", "Stage", "Staged", "rendered", "run"]
