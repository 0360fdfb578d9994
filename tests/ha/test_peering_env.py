"""Peering priority and lifetime from the environment (what the Helm chart sets)."""

from __future__ import annotations

import kopf
import pytest

from inference_operator.settings import MAX_PRIORITY, PEERING_LIFETIME_ENV, PEERING_PRIORITY_ENV, PeeringSettings


def apply_peering_env(settings: kopf.OperatorSettings, environ: dict[str, str]) -> None:
    PeeringSettings.from_env(environ).apply(settings)


def settings() -> kopf.OperatorSettings:
    s = kopf.OperatorSettings()
    s.peering.priority = 7
    return s


def test_nothing_set_keeps_kopfs_values() -> None:
    s = settings()
    apply_peering_env(s, {})
    assert (s.peering.priority, s.peering.lifetime) == (7, 60)


def test_random_priorities_differ_between_replicas() -> None:
    drawn = set()
    for _ in range(20):
        s = settings()
        apply_peering_env(s, {PEERING_PRIORITY_ENV: "random"})
        assert 1 <= s.peering.priority < MAX_PRIORITY
        drawn.add(s.peering.priority)
    assert len(drawn) == 20  # kopf pauses every replica when two share the top priority


def test_integer_priority_and_lifetime() -> None:
    s = settings()
    apply_peering_env(s, {PEERING_PRIORITY_ENV: " 100 ", PEERING_LIFETIME_ENV: "15"})
    assert (s.peering.priority, s.peering.lifetime) == (100, 15)


@pytest.mark.parametrize(
    "env", [{PEERING_PRIORITY_ENV: "high"}, {PEERING_LIFETIME_ENV: "0"}, {PEERING_LIFETIME_ENV: "1.5"}]
)
def test_invalid_values_are_refused(env: dict) -> None:
    with pytest.raises(ValueError, match="INFERENCE_OPERATOR_PEERING_"):
        apply_peering_env(settings(), env)
