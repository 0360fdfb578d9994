"""The chart tests' Helm engine, for the chart values of tracing and logs."""

from __future__ import annotations

from tests.chart.conftest import helm  # noqa: F401  (a fixture)
