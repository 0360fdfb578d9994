"""Replay a synthetic day of traffic through a queueing model and compare autoscaling policies.

    python bench/autoscaler_sim.py                 # 24 h, the default seed
    python bench/autoscaler_sim.py --hours 6 --seed 3 --bursts 4

Traffic: a diurnal curve (night trough, midday peak) with multiplicative noise and sudden
bursts (2-3.5x for a few minutes). Each replica serves `--capacity` req/s; a request's
latency is modelled as the backlog delay plus an M/M/1 sojourn per replica, so the p95 of one
second is `backlog / (N * mu) + ln(20) / (mu * (1 - rho))`. New replicas become ready after
`--startup` seconds (model loading on a GPU), removed ones disappear at once.

The autoscalers see what they would see in a cluster: a p95 computed the way Prometheus'
histogram_quantile() does from the model server's latency buckets, over a rate window that
ends at the last scrape. Every contender runs the same `decide()` with a different policy:

- built-in: the policy the operator derives from `spec.autoscaling` with only min/max/target
  set (fast path above 2x target, starting replicas not counted as capacity, damped
  scale-down on latency), at the default 15 s interval and at a 5 s interval;
- HPA defaults: what an autoscaling/v2 HPA does with an External metric and no `behavior`:
  15 s sync, 10 % tolerance, up max(4 pods, 100 %) per 15 s, down 100 % per 15 s after a
  300 s stabilization window, proportional both ways, no fast path, no notion of starting
  replicas.

Reported per policy: SLO-violation seconds (true p95 of the second above the SLO), replica-
hours (requested replicas integrated over time: what the GPUs cost), scale events (replica
count writes), flaps (a write reversing the direction of the previous one within
`FLAP_SECONDS`) and the peak count.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace

import numpy as np

from inference_operator.autoscaler.policy import History, Observation, Policy, decide
from inference_operator.models import AutoscalingSpec

# The model server's latency histogram buckets (seconds).
BUCKETS = np.array([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0])
LN20 = math.log(20.0)  # p95 of an exponential with rate 1
MAX_RHO = 0.98
FLAP_SECONDS = 600


@dataclass(frozen=True)
class Scenario:
    hours: float = 24.0
    seed: int = 1
    night_rps: float = 60.0
    peak_rps: float = 600.0
    noise: float = 0.08
    bursts: int = 6
    capacity: float = 50.0  # req/s one replica serves
    startup: int = 90  # seconds until a new replica is ready
    slo_ms: float = 200.0
    target_ms: float = 150.0
    min_replicas: int = 2
    max_replicas: int = 64
    scrape_seconds: int = 15
    window_seconds: int = 60


def traffic(s: Scenario) -> np.ndarray:
    """Requests per second for every second of the scenario."""
    rng = np.random.default_rng(s.seed)
    n = int(s.hours * 3600)
    t = np.arange(n)
    day = (1 - np.cos(2 * np.pi * ((t % 86400) - 4 * 3600) / 86400)) / 2  # trough at 04:00
    rate = s.night_rps + (s.peak_rps - s.night_rps) * day
    for _ in range(s.bursts):
        start = int(rng.uniform(0.05, 0.95) * n)
        length = int(rng.uniform(180, 600))
        factor = rng.uniform(2.0, 3.5)
        ramp = np.clip(np.minimum(t - start, start + length - t) / 20.0, 0, 1)  # 20 s edges
        rate = rate * (1 + (factor - 1) * ramp)
    return rate * rng.lognormal(0.0, s.noise, n)


@dataclass(frozen=True)
class Contender:
    name: str
    policy: Policy
    interval: int


def contenders(s: Scenario) -> list[Contender]:
    builtin = Policy.from_spec(
        AutoscalingSpec.model_validate(
            {
                "minReplicas": s.min_replicas,
                "maxReplicas": s.max_replicas,
                "target": s.target_ms,
                "metric": "latencyP95Ms",
                "windowSeconds": s.window_seconds,
            }
        )
    )
    hpa = replace(builtin, fast_factor=None, count_ready=False, scale_down_exponent=1.0)
    return [
        Contender("built-in, defaults (15 s)", builtin, 15),
        Contender("built-in, 5 s interval", builtin, 5),
        Contender("HPA defaults (15 s sync)", hpa, 15),
    ]


@dataclass
class Result:
    name: str
    slo_violation_seconds: int = 0
    replica_seconds: float = 0.0
    scale_events: int = 0
    flaps: int = 0
    peak_replicas: int = 0

    @property
    def replica_hours(self) -> float:
        return self.replica_seconds / 3600


def observed_p95_ms(lam: np.ndarray, delay: np.ndarray, theta: np.ndarray) -> float | None:
    """histogram_quantile(0.95, ...) over a window of seconds, from bucket counts.

    Each second's latencies are delay + Exp(theta); bucket `le` holds the fraction
    1 - exp(-theta * (le - delay)) of that second's requests.
    """
    total = lam.sum()
    if total <= 0:
        return 0.0
    excess = np.clip(BUCKETS[None, :] - delay[:, None], 0, None)
    cumulative = (lam[:, None] * (1 - np.exp(-theta[:, None] * excess))).sum(axis=0)
    rank = 0.95 * total
    index = int(np.searchsorted(cumulative, rank))
    if index >= len(BUCKETS):
        return BUCKETS[-1] * 1000  # like Prometheus: the highest finite bound
    lower = BUCKETS[index - 1] if index else 0.0
    below = cumulative[index - 1] if index else 0.0
    inside = cumulative[index] - below
    fraction = (rank - below) / inside if inside > 0 else 1.0
    return (lower + (BUCKETS[index] - lower) * fraction) * 1000


def simulate(s: Scenario, contender: Contender, rate: np.ndarray) -> Result:
    n = len(rate)
    mu = s.capacity
    delay = np.zeros(n)
    theta = np.zeros(n)
    result = Result(contender.name)
    policy = contender.policy
    history = History()
    replicas = s.min_replicas
    ready_at = [0] * replicas  # when each requested replica is (or was) ready
    backlog = 0.0
    last_write: tuple[int, int] | None = None  # (time, direction)
    for t in range(n):
        ready = sum(1 for r in ready_at if r <= t)
        served = ready * mu
        lam = rate[t]
        backlog = max(0.0, backlog + lam - served) if ready else backlog + lam
        rho = MAX_RHO if backlog > 0 or not served else min(lam / served, MAX_RHO)
        delay[t] = backlog / served if served else 60.0
        theta[t] = mu * (1 - rho)
        p95 = delay[t] + LN20 / theta[t]
        result.slo_violation_seconds += int(p95 * 1000 > s.slo_ms)
        result.replica_seconds += replicas

        if t % contender.interval or t < s.window_seconds:
            continue
        end = (t // s.scrape_seconds) * s.scrape_seconds  # what the last scrape could see
        lo = max(0, end - s.window_seconds)
        value = observed_p95_ms(rate[lo:end], delay[lo:end], theta[lo:end])
        decision = decide(Observation(float(t), value, ready_replicas=ready), replicas, policy, history)
        history = history.remember(float(t), decision.recommendation, policy.horizon_seconds)
        if decision.replicas != replicas:
            history = history.scaled(float(t), replicas, decision.replicas, policy.horizon_seconds)
            if decision.replicas > replicas:
                ready_at += [t + s.startup] * (decision.replicas - replicas)
            else:
                ready_at = sorted(ready_at)[: decision.replicas]  # starting pods go first
            direction = 1 if decision.replicas > replicas else -1
            if last_write and last_write[1] != direction and t - last_write[0] <= FLAP_SECONDS:
                result.flaps += 1
            last_write = (t, direction)
            replicas = decision.replicas
            result.scale_events += 1
        result.peak_replicas = max(result.peak_replicas, replicas)
    return result


def table(results: list[tuple[float, Result]]) -> str:
    header = (
        f"{'policy':<28} {'target ms':>9} {'SLO-violation s':>16} {'replica-hours':>14} "
        f"{'scale events':>13} {'flaps':>6} {'peak':>5}"
    )
    lines = [header, "-" * len(header)]
    for target, r in results:
        lines.append(
            f"{r.name:<28} {target:>9g} {r.slo_violation_seconds:>16d} {r.replica_hours:>14.1f} "
            f"{r.scale_events:>13d} {r.flaps:>6d} {r.peak_replicas:>5d}"
        )
    return "\n".join(lines)


def run(s: Scenario, targets: list[float] | None = None) -> list[tuple[float, Result]]:
    """Every contender at every target (default: the scenario's), on one shared trace."""
    rate = traffic(s)
    results = []
    for target in targets or [s.target_ms]:
        scenario = replace(s, target_ms=target)
        results += [(target, simulate(scenario, c, rate)) for c in contenders(scenario)]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=Scenario.hours)
    parser.add_argument("--seed", type=int, default=Scenario.seed)
    parser.add_argument("--bursts", type=int, default=Scenario.bursts)
    parser.add_argument("--capacity", type=float, default=Scenario.capacity, help="req/s per replica")
    parser.add_argument("--startup", type=int, default=Scenario.startup, help="seconds to ready")
    parser.add_argument("--slo-ms", type=float, default=Scenario.slo_ms)
    parser.add_argument(
        "--targets",
        default=str(Scenario.target_ms),
        help="comma-separated p95 targets in ms, e.g. 150,120,100 (a cost/SLO sweep)",
    )
    args = parser.parse_args(argv)
    targets = [float(t) for t in args.targets.split(",")]
    s = Scenario(
        hours=args.hours,
        seed=args.seed,
        bursts=args.bursts,
        capacity=args.capacity,
        startup=args.startup,
        slo_ms=args.slo_ms,
        target_ms=targets[0],
    )
    rate = traffic(s)
    print(
        f"trace: {s.hours:g} h, {rate.mean():.0f} req/s mean, {rate.max():.0f} peak, {s.bursts} bursts; "
        f"{s.capacity:g} req/s per replica, {s.startup} s to ready; p95 SLO {s.slo_ms:g} ms; "
        f"Prometheus scrape {s.scrape_seconds} s, window {s.window_seconds} s"
    )
    print(table(run(s, targets)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
