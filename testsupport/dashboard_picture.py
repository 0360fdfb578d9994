"""The chart's Grafana dashboard drawn as a picture from the series a real Prometheus returned for
its panels, laid out as Grafana lays it out (`gridPos` on its 24-column grid), so the docs can show
the dashboard populated from the real-pods tier where no Grafana runs.

The series come as snapshots, one per Prometheus (each tier module runs its own): for each panel
title, its targets with the series `query_range` (or, for instant targets, `query`) returned. A
panel is drawn from the first snapshot that has data for it.

    python -m testsupport.dashboard_picture SNAPSHOT_DIR OUT.png
"""

from __future__ import annotations

import datetime
import json
import math
import pathlib
import re
import sys
from collections.abc import Iterable
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: a file
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

DASHBOARD = (
    pathlib.Path(__file__).resolve().parents[1] / "charts/rocm-inference-operator/dashboards/rocm-inference.json"
)
# Grafana's dark theme.
BACKGROUND, PANEL, TEXT, MUTED = "#111217", "#181b1f", "#ccccdc", "#8e8e9c"
COLOURS = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0", "#37872d"]
# One grid unit: Grafana's rows are 30 px high, its columns a 24th of the width.
WIDTH_PX, ROW_PX, DPI = 1600, 30, 80
MAX_LEGEND = 6

#: {panel title: [{"ref", "legend", "instant", "series": [{"labels": {...}, "values": [[t, "v"], ...]}]}]}
Panels = dict[str, list[dict[str, Any]]]


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: `{{label}}` replaced by the series' value of it."""
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
    return text or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")


def has_data(targets: Iterable[dict[str, Any]]) -> bool:
    return any(
        not math.isnan(float(value))
        for target in targets
        for series in target["series"]
        for _, value in series["values"]
    )


def merge(snapshots: Iterable[Panels]) -> Panels:
    """Each panel from the first snapshot that has data for it."""
    merged: Panels = {}
    for snapshot in snapshots:
        for title, targets in snapshot.items():
            if title not in merged or (not has_data(merged[title]) and has_data(targets)):
                merged[title] = targets
    return merged


def draw(dashboard: dict[str, Any], panels: Panels, no_data: dict[str, str] | None = None) -> Figure:
    """The dashboard as a figure; a panel without data says so (with `no_data`'s reason for it)."""
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    figure = plt.figure(figsize=(WIDTH_PX / DPI, bottom * ROW_PX / DPI), dpi=DPI, facecolor=BACKGROUND)

    height_px = bottom * ROW_PX

    def box(
        grid: dict[str, int], left: float = 4, right: float = 4, top: float = 4, low: float = 4
    ) -> tuple[float, float, float, float]:
        """The grid cell in figure fractions, inset by these pixels."""
        x, y, w, h = grid["x"] / 24, grid["y"] / bottom, grid["w"] / 24, grid["h"] / bottom
        return (
            x + left / WIDTH_PX,
            1 - y - h + low / height_px,
            w - (left + right) / WIDTH_PX,
            h - (top + low) / height_px,
        )

    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            figure.text(
                box(panel["gridPos"])[0], 1 - (panel["gridPos"]["y"] + 0.6) / bottom, panel["title"],
                color=TEXT, fontsize=13, fontweight="bold",
            )  # fmt: skip
            continue
        x, y, w, h = box(panel["gridPos"])
        figure.add_artist(
            Rectangle((x, y), w, h, transform=figure.transFigure, facecolor=PANEL, edgecolor="#2c3235", zorder=-1)
        )
        axes = figure.add_axes(box(panel["gridPos"], left=56, right=16, top=30, low=26), facecolor=PANEL)
        axes.set_title(panel["title"], color=TEXT, fontsize=10, loc="left", pad=8)
        for spine in axes.spines.values():
            spine.set_visible(False)
        axes.tick_params(colors=MUTED, labelsize=8)
        targets = panels.get(panel["title"], [])
        if not has_data(targets):
            reason = (no_data or {}).get(panel["title"], "")
            axes.set_xticks([])
            axes.set_yticks([])
            axes.text(0.5, 0.5, "No data" + (f"\n{reason}" if reason else ""), color=MUTED, ha="center",
                      va="center", fontsize=9, wrap=True, transform=axes.transAxes)  # fmt: skip
        elif panel["type"] == "timeseries":
            _timeseries(axes, targets, panel["fieldConfig"]["defaults"].get("unit", ""))
        else:  # stat, table: the last value of each series
            _values(axes, targets, panel["fieldConfig"]["defaults"].get("unit", ""))
    return figure


def _timeseries(axes: Axes, targets: list[dict[str, Any]], unit: str) -> None:
    lines, seen = 0, []
    for target in targets:
        for series in target["series"]:
            points = [(t, float(v)) for t, v in series["values"] if not math.isnan(float(v))]
            if not points:
                continue
            times = [t for t, _ in points]
            seen += times
            label = legend(target["legend"], series["labels"]) if lines < MAX_LEGEND else None
            colour, marker = COLOURS[lines % len(COLOURS)], "o" if len(points) == 1 else None
            axes.plot(times, [v for _, v in points], color=colour, linewidth=1.2, marker=marker, label=label)
            lines += 1
    axes.grid(color="#2c3235", linewidth=0.5)
    if seen and max(seen) - min(seen) < 1:  # one instant: a minute either side, as Grafana would show it
        axes.set_xlim(min(seen) - 60, max(seen) + 60)
    shown = axes.get_xlim()
    ticks = [t for t in axes.get_xticks() if shown[0] <= t <= shown[1]]
    axes.set_xticks(ticks, [datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%H:%M:%S") for t in ticks])
    axes.set_xlim(shown)
    if unit:
        axes.set_ylabel(unit, color=MUTED, fontsize=7)
    axes.legend(loc="upper left", fontsize=6, facecolor=PANEL, edgecolor=PANEL, labelcolor=TEXT)


def _values(axes: Axes, targets: list[dict[str, Any]], unit: str) -> None:
    rows = [
        (legend(target["legend"], series["labels"]), float(series["values"][-1][1]))
        for target in targets
        for series in target["series"]
        if series["values"] and not math.isnan(float(series["values"][-1][1]))
    ][:MAX_LEGEND]
    axes.set_xticks([])
    axes.set_yticks([])
    for i, (name, value) in enumerate(rows):
        y = 1 - (i + 1) / (len(rows) + 1)
        axes.text(0.04, y, name, color=MUTED, fontsize=8, va="center", transform=axes.transAxes)
        shown = f"{value:.3g} {unit}".strip() if unit not in ("short", "") else f"{value:.3g}"
        axes.text(0.96, y, shown, color=COLOURS[0], fontsize=13, ha="right", va="center", transform=axes.transAxes)


def picture(snapshots: list[dict[str, Any]], out: pathlib.Path, dashboard: dict[str, Any] | None = None) -> Figure:
    """Snapshots ({"panels": Panels, "no_data": {title: why}}) drawn into `out` (a PNG)."""
    no_data = {title: why for snapshot in snapshots for title, why in snapshot.get("no_data", {}).items()}
    figure = draw(dashboard or json.loads(DASHBOARD.read_text()), merge(s["panels"] for s in snapshots), no_data)
    figure.savefig(out, facecolor=BACKGROUND)
    return figure


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    directory, out = pathlib.Path(argv[0]), pathlib.Path(argv[1])
    snapshots = [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]
    picture(snapshots, out)
    print(f"{out}: {len(snapshots)} snapshots")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
