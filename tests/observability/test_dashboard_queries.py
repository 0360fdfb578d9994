"""The dashboard's queries as the real-pods tier runs them (tests/observability/dashboard.py): every
panel is run by one of the tier's modules or listed with why it cannot be, and only GPU panels can
be listed; the variables are filled in as Grafana fills them."""

from __future__ import annotations

import re

from tests.observability import dashboard


def test_every_panel_is_run_on_the_tier_or_listed_with_why_not() -> None:
    board = dashboard.load()
    panels = {p["title"]: p for p in board["panels"] if p["type"] != "row"}
    assert set(dashboard.NO_SERIES_ON_THE_TIER) <= set(panels), "an exemption names no panel"
    for title, reason in dashboard.NO_SERIES_ON_THE_TIER.items():
        exprs = [t["expr"] for t in panels[title]["targets"]]
        # Only what no node of the tier exports: the GPU's own series.
        assert exprs and all("model_server_gpu_" in e for e in exprs), (title, exprs)
        assert reason
    by_panel = {q.panel: q.engines for q in dashboard.queries()}
    assert set(panels) <= set(by_panel)
    assert all(engines for engines in by_panel.values())
    # The LLM row, the adapters panel among it, is vLLM's; the variables list both kinds of model.
    assert by_panel["LoRA adapters in use"] == {"vllm"}
    assert by_panel["variable namespace"] == by_panel["variable model"] == {"vllm", "model-server"}


def test_queries_are_filled_in_as_grafana_sends_them() -> None:
    for query in dashboard.queries():
        expr = dashboard.filled(query.expr, "ml", "llama")
        assert "$" not in expr.replace('"$1"', ""), expr  # label_replace's own $1 stays
        assert not re.search(r"\[\s*\]", expr)
    filled = dashboard.filled('rate(x{namespace=~"$namespace", model=~"$model"}[$__rate_interval])', "ml", "m")
    assert filled == 'rate(x{namespace=~"ml", model=~"m"}[1m])'
