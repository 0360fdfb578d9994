"""Peers judged by when this replica saw their keep-alives (inference_operator/peering.py), not
by the timestamps their own clocks wrote."""

from __future__ import annotations

import datetime

import pytest

from inference_operator import peering


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def iso(offset_s: float) -> str:
    return (datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset_s)).isoformat()


def test_a_keep_alive_lives_its_lifetime_from_when_it_was_seen_whatever_its_timestamp() -> None:
    clock = Clock()
    sightings = peering.Sightings(clock)
    # Written by clocks 10 minutes behind and ahead: both fresh when first seen.
    for identity, stamp in (("behind", iso(-600)), ("ahead", iso(+600))):
        assert sightings.remaining(identity, stamp, 10) == 10
    clock.now += 9.5
    assert sightings.remaining("behind", iso(-600 - 30), 10) == 10  # renewed: a new value
    assert sightings.remaining("ahead", "unchanged", 10) == 10  # a value not seen before
    clock.now += 10
    assert sightings.remaining("ahead", "unchanged", 10) <= 0  # not renewed for a lifetime


def test_an_unrenewed_keep_alive_expires_and_a_goodbye_at_once() -> None:
    clock = Clock()
    sightings = peering.Sightings(clock)
    stamp = iso(0)
    assert sightings.remaining("a", stamp, 10) == 10
    clock.now += 4
    assert sightings.remaining("a", stamp, 10) == 6
    clock.now += 6
    assert sightings.remaining("a", stamp, 10) <= 0
    assert sightings.remaining("b", iso(0), 0) == 0


def test_kopf_peers_are_judged_by_sightings(monkeypatch: pytest.MonkeyPatch) -> None:
    from kopf._core.engines import peering as kopf_peering

    monkeypatch.setattr(kopf_peering, "Peer", kopf_peering.Peer)  # kopf's own again after the test
    peering.install()
    peering.install()  # idempotent
    skewed = kopf_peering.Peer(identity=kopf_peering.Identity("skewed"), lifetime=10, lastseen=iso(-600))
    assert not skewed.is_dead
    remaining = (skewed.deadline - datetime.datetime.now(datetime.UTC)).total_seconds()
    assert 0 < remaining <= 10
    gone = kopf_peering.Peer(identity=kopf_peering.Identity("gone"), lifetime=0, lastseen=iso(0))
    assert gone.is_dead
