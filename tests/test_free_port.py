"""testsupport.processes.free_port: the ports the tests start their servers on."""

from __future__ import annotations

import socket

import pytest

from testsupport import processes


def test_ports_come_from_below_the_ranges_connections_and_node_ports_draw_from() -> None:
    first = min(processes._ephemeral_range()[0], 30_000)
    for port in {processes.free_port() for _ in range(50)}:
        assert 10_000 <= port < first
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # and free


def test_a_port_in_use_on_the_host_asked_for_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        draws = iter([busy, 12_345])
        monkeypatch.setattr(processes.random, "randrange", lambda low, high: next(draws))
        assert processes.free_port("127.0.0.1") == 12_345
