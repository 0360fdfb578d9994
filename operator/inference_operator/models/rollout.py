"""How a change of the pods reaches the replicas: rolling, or a canary judged from Prometheus."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field

from .autoscaling import DEFAULT_PROMETHEUS_URL
from .base import SpecModel, cel
from .engines import ENGINES, Metric, metrics_per_engine


class RolloutStrategy(StrEnum):
    ROLLING = "rolling"
    CANARY = "canary"


class CanaryAnalysis(SpecModel):
    """How a canary is judged, from Prometheus, on the canary's pods alone."""

    metric: Metric | None = Field(
        None,
        description="Latency judged (a quantile in milliseconds), one the engine exports: "
        + metrics_per_engine(lambda traits: traits.canary_metrics)
        + ". Unset: "
        + ", ".join(
            f"{serving.traits.canary_metrics[0].value} for {engine.value}" for engine, serving in ENGINES.items()
        )
        + ".",
    )
    max_latency_ms: float = Field(
        gt=0, le=3_600_000, description="Milliseconds: a check fails when the canary's metric is above this."
    )
    max_error_ratio: float = Field(
        0.05, ge=0, le=1, description="A check fails when more than this share of the canary's requests got a 5xx."
    )
    min_requests: int = Field(
        20, ge=1, le=1_000_000, description="Requests the canary must have served in the window for a verdict."
    )
    failure_limit: int = Field(2, ge=1, le=100, description="Failed checks in a row that roll the canary back.")
    interval_seconds: int = Field(15, ge=1, le=3600, description="Seconds between checks.")
    window_seconds: int = Field(
        60, ge=10, le=3600, description="Seconds of history each check covers (the PromQL rate() window)."
    )
    prometheus_url: str | None = Field(
        None,
        pattern=r"^https?://[^/?#@\s]+(/[^?#\s]*)?$",
        max_length=2048,
        description="Base URL of the Prometheus HTTP API; unset: autoscaling.prometheusUrl, else "
        f"{DEFAULT_PROMETHEUS_URL}. It must be on the operator's allowed list.",
    )


class CanarySpec(SpecModel):
    """The steps of a canary: traffic shares the candidate takes before it is promoted."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            "!has(self.steps) || (self.steps.isSorted()"
            " && self.steps.all(s, self.steps.indexOf(s) == self.steps.lastIndexOf(s)))",
            "rollout.canary.steps must be increasing traffic percentages",
            ".steps",
        )
    )

    steps: list[Annotated[int, Field(ge=1, le=99)]] = Field(
        default_factory=lambda: [10, 50],
        min_length=1,
        max_length=10,
        description="Percent of the traffic the candidate serves at each step; after the last, it is promoted.",
    )
    step_seconds: int = Field(
        60, ge=1, le=86400, description="At least this long per step, with a passing check at its end."
    )
    analysis: CanaryAnalysis = Field(
        description="How each step's check is judged: latency and error ratio of the canary's pods, from Prometheus."
    )


class RolloutSpec(SpecModel):
    """How a change of the pods (image, model, runtime, resources) reaches the replicas: the
    Deployment's rolling update, or a canary promoted step by step on its measured latency and
    errors."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            "!has(self.strategy) || self.strategy != 'canary' || has(self.canary)",
            "rollout.canary is required with strategy: canary",
            ".canary",
        )
    )

    strategy: RolloutStrategy = Field(
        RolloutStrategy.ROLLING,
        description="rolling: the Deployment's rolling update; canary: a candidate Deployment beside the stable "
        "one, promoted step by step while its latency and errors hold, rolled back when they do not.",
    )
    canary: CanarySpec | None = Field(
        None, description="The canary's steps and analysis; required with strategy canary."
    )
