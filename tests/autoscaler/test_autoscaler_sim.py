"""The simulation benchmark: its latency model, and the comparison it exists to make."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import numpy as np
import pytest

SIM_PATH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "autoscaler_sim.py"


@pytest.fixture(scope="module")
def sim():
    spec = importlib.util.spec_from_file_location("autoscaler_sim", SIM_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_autoscaler_sim_observed_p95_follows_prometheus_interpolation(sim) -> None:
    # One second of traffic whose latencies are 40 ms + Exp(theta) with a true p95 of 90 ms.
    theta = math.log(20) / 0.05
    observed = sim.observed_p95_ms(np.array([100.0]), np.array([0.04]), np.array([theta]))
    # histogram_quantile interpolates linearly inside the (75, 100] ms bucket, so it reads a
    # little off the true value, as the real one would.
    assert 75 < observed < 100
    assert observed == pytest.approx(90, abs=6)
    # No requests: 0 (idle), like the operator's query.
    assert sim.observed_p95_ms(np.array([0.0]), np.array([0.0]), np.array([theta])) == 0.0
    # Beyond the last bucket: its bound, as Prometheus answers.
    assert sim.observed_p95_ms(np.array([10.0]), np.array([30.0]), np.array([theta])) == 10_000


def test_autoscaler_sim_traffic_is_diurnal_with_bursts(sim) -> None:
    s = sim.Scenario(hours=24, bursts=0, noise=0.0)
    rate = sim.traffic(s)
    assert rate[4 * 3600] == pytest.approx(s.night_rps)
    assert rate[16 * 3600] == pytest.approx(s.peak_rps)
    bursty = sim.traffic(sim.Scenario(hours=24, bursts=3, noise=0.0))
    assert (bursty / rate).max() >= 2.0


def test_autoscaler_sim_compares_builtin_with_hpa_defaults(sim) -> None:
    results = sim.run(sim.Scenario(hours=8, bursts=2, seed=5))
    by_name = {r.name: r for _, r in results}
    hpa = by_name["HPA defaults (15 s sync)"]
    builtin = by_name["built-in, defaults (15 s)"]
    assert set(by_name) == {"built-in, defaults (15 s)", "built-in, 5 s interval", "HPA defaults (15 s sync)"}
    # What the built-in policy is for: no oscillation, fewer replica-count writes. Cost and
    # SLO-violation seconds trade against each other with the trace and the target, so they
    # are reported, not asserted: the table exists to show that trade.
    assert builtin.flaps < hpa.flaps
    assert builtin.scale_events < hpa.scale_events
    for _, r in results:
        assert 0 <= r.slo_violation_seconds < 8 * 3600
        assert r.peak_replicas <= 64
    table = sim.table(results)
    assert "SLO-violation s" in table and "HPA defaults" in table
