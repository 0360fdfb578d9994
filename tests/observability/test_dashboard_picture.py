"""The dashboard drawn from snapshots of Prometheus answers (testsupport/dashboard_picture.py), as
the docs' picture (docs/dashboard.png) is made from the real-pods tier's: every panel in its
place, each series with its Grafana legend, a panel without data says so and why."""

from __future__ import annotations

import pathlib

import pytest

from tests.observability import dashboard
from testsupport import dashboard_picture as pic

T0 = 1_780_000_000.0


def series(labels: dict[str, str], values: list[float]) -> dict:
    return {"labels": labels, "values": [[T0 + 5 * i, str(v)] for i, v in enumerate(values)]}


def target(ref: str, legend: str, *found: dict) -> dict:
    return {"ref": ref, "legend": legend, "series": list(found)}


@pytest.fixture
def snapshots() -> list[dict]:
    latency = [
        target("A", "p50 {{namespace}}/{{model}}", series({"namespace": "ml", "model": "mlp"}, [0.01, 0.02, 0.015])),
        target("B", "p95 {{namespace}}/{{model}}", series({"namespace": "ml", "model": "mlp"}, [0.03, 0.05, 0.04])),
    ]
    cold = [target("A", "p95 {{namespace}}/{{service}}", series({"namespace": "ml", "service": "idle"}, [12.5]))]
    empty_held = [
        target("A", "{{namespace}}/{{service}}", series({"namespace": "ml", "service": "idle"}, [float("nan")]))
    ]
    return [
        # The model server's module: no activator series there (NaN only).
        {"panels": {"Request latency p50 / p95 / p99": latency, "Requests held at zero": empty_held},
         "no_data": dashboard.NO_SERIES_ON_THE_TIER},
        # The scale-to-zero module's.
        {"panels": {"Cold-start wait p50 / p95 (time range)": cold,
                    "Requests held at zero": [target("A", "{{service}}", series({"service": "idle"}, [0, 3, 0]))]},
         "no_data": {}},
    ]  # fmt: skip


def test_each_panel_is_drawn_in_its_place_from_the_snapshot_that_has_its_data(
    snapshots: list[dict], tmp_path: pathlib.Path
) -> None:
    out = tmp_path / "dashboard.png"
    figure = pic.picture(snapshots, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    board = dashboard.load()
    drawn = {axes.get_title(loc="left"): axes for axes in figure.axes}
    assert list(drawn) == [p["title"] for p in board["panels"] if p["type"] != "row"]
    rows = {text.get_text() for text in figure.texts}
    assert {p["title"] for p in board["panels"] if p["type"] == "row"} <= rows
    # Grafana's layout: a half-width panel on the right is drawn in the figure's right half.
    right = next(p for p in board["panels"] if p["gridPos"]["x"] == 12 and p["type"] != "row")
    assert 0.5 < drawn[right["title"]].get_position().x0 < drawn[right["title"]].get_position().x1 < 1
    left = next(p for p in board["panels"] if p["gridPos"]["x"] == 0 and p["gridPos"]["w"] == 12)
    assert 0 < drawn[left["title"]].get_position().x1 < 0.5

    latency = drawn["Request latency p50 / p95 / p99"]
    assert [line.get_label() for line in latency.get_lines()] == ["p50 ml/mlp", "p95 ml/mlp"]
    assert list(latency.get_lines()[1].get_ydata()) == [0.03, 0.05, 0.04]
    # Held requests: the second snapshot's, since the first has only NaN for it.
    assert [list(line.get_ydata()) for line in drawn["Requests held at zero"].get_lines()] == [[0, 3, 0]]
    cold = [text.get_text() for text in drawn["Cold-start wait p50 / p95 (time range)"].texts]
    assert cold == ["p95 ml/idle", "12.5 s"]
    gpu = " ".join(text.get_text() for text in drawn["GPU utilisation"].texts)
    assert gpu.startswith("No data") and dashboard.NO_SERIES_ON_THE_TIER["GPU utilisation"] in gpu
    assert [t.get_text() for t in drawn["KV cache usage"].texts] == ["No data"]


def test_a_legend_is_filled_in_as_grafana_fills_it() -> None:
    labels = {"namespace": "ml", "service": "idle", "outcome": "served"}
    assert pic.legend("{{outcome}} {{ namespace }}/{{service}}", labels) == "served ml/idle"
    assert pic.legend("{{missing}}x", labels) == "x"
    assert pic.legend("", {"__name__": "up", "job": "a"}) == "job=a"
