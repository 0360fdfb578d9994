"""The chart's Grafana dashboard as queries: each panel's PromQL and each variable's query, with the
dashboard's variables filled in as Grafana fills them for one namespace and one model, so a test
can run them against a real Prometheus and require data from every one."""

from __future__ import annotations

import json
import math
import os
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from testsupport.waiting import NeverHappened, eventually

DASHBOARD = (
    pathlib.Path(__file__).resolve().parents[2] / "charts/rocm-inference-operator/dashboards/rocm-inference.json"
)
# What Grafana makes of $__rate_interval with its default 15 s scrape interval for the data source:
# max($__interval + 15s, 4 * 15s) is 1m for any range up to a few hours.
RATE_INTERVAL = "1m"
# $__range: the dashboard's time range (its default: the last 3 hours).
RANGE = "3h"
# Panels whose series no real-pods cluster can produce, and why. Nothing else may be missing.
NO_SERIES_ON_THE_TIER = {
    "GPU utilisation": "exported only where amdsmi finds an AMD GPU; the tier's nodes have none",
    "GPU memory used": "exported only where amdsmi finds an AMD GPU; the tier's nodes have none",
}


@dataclass(frozen=True)
class Query:
    panel: str
    ref: str
    expr: str

    @property
    def engines(self) -> set[str]:
        """Whose series it reads: vLLM's (`vllm:*`), the model server's and the operator's, or
        either (the variables list both kinds of model); the scale-to-zero activator's
        (`activator_*`) are a kind of their own."""
        if "activator_" in self.expr:
            return {"activator"}
        vllm = "vllm:" in self.expr
        return (
            {"vllm", "model-server"} if vllm and "model_server_" in self.expr else {"vllm" if vllm else "model-server"}
        )


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dashboard: dict | None = None) -> list[Query]:
    """Every panel target and every query variable (the expression inside query_result(...))."""
    board = dashboard or load()
    found = [
        Query(p["title"], t["refId"], t["expr"]) for p in board["panels"] if p["type"] != "row" for t in p["targets"]
    ]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            expr = variable["query"]["query"].removeprefix("query_result(").removesuffix(")")
            found.append(Query(f"variable {variable['name']}", variable["name"], expr))
    return found


def filled(expr: str, namespace: str, model: str) -> str:
    """`expr` as Grafana sends it with one namespace and one model picked (a single value of a
    multi-value variable goes in as is; these names hold no regex characters)."""
    for variable, value in (
        ("$__rate_interval", RATE_INTERVAL),
        ("$__range", RANGE),
        ("$namespace", namespace),
        ("$model", model),
    ):
        expr = expr.replace(variable, value)
    return expr


def without_data(prometheus_url: str, engine: str, namespace: str, model: str) -> dict[str, str]:
    """The queries of `engine`'s panels (and the variables) that return no series with a number
    from this Prometheus, by panel and refId, with what they returned; the panels the tier cannot
    fill are skipped."""
    empty = {}
    for query in queries():
        if engine not in query.engines or query.panel in NO_SERIES_ON_THE_TIER:
            continue
        expr = filled(query.expr, namespace, model)
        answer = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": expr}, timeout=5).json()
        assert answer["status"] == "success", (query, answer)
        if not any(not math.isnan(float(series["value"][1])) for series in answer["data"]["result"]):
            empty[f"{query.panel} ({query.ref})"] = f"{expr} -> {answer['data']['result']}"
    return empty


def wait_for_data(
    prometheus_url: str,
    engine: str,
    namespace: str,
    model: str,
    timeout: float,
    interval: float = 1.0,
    before_each: Callable[[], object] = lambda: None,
) -> None:
    """Until every query of `engine`'s panels returns data (`before_each` sends traffic first, if
    it must); else fails with the queries still empty and what they returned."""
    empty: dict[str, str] = {}

    def every_query_has_data() -> bool:
        before_each()
        empty.clear()
        empty.update(without_data(prometheus_url, engine, namespace, model))
        return not empty

    try:
        eventually(every_query_has_data, timeout=timeout, interval=interval, what="every panel's data")
    except NeverHappened as exc:
        raise AssertionError(f"panels still without data after {timeout:g}s: {empty}") from exc


# Where the tier's modules leave their snapshots for testsupport/dashboard_picture.py, when set.
SNAPSHOTS_ENV = "RIO_DASHBOARD_SNAPSHOTS"


def snapshot(prometheus_url: str, engine: str, namespace: str, model: str, seconds: float = 900) -> dict:
    """What `engine`'s panels show from this Prometheus over the last `seconds`, as
    testsupport/dashboard_picture.py draws it: each target's series from `query_range` (one
    point every 5 s), or for an instant target, from `query` now."""
    board = load()
    end = time.time()
    panels: dict[str, list[dict]] = {}
    for panel in board["panels"]:
        if panel["type"] == "row" or not any(q.panel == panel["title"] and engine in q.engines for q in queries(board)):
            continue
        for target in panel["targets"]:
            expr = filled(target["expr"], namespace, model)
            if target.get("instant"):
                answer = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": expr, "time": end}, timeout=10)
                series = [{"labels": s["metric"], "values": [s["value"]]} for s in answer.json()["data"]["result"]]
            else:
                params = {"query": expr, "start": end - seconds, "end": end, "step": 5}
                answer = httpx.get(f"{prometheus_url}/api/v1/query_range", params=params, timeout=10)
                series = [{"labels": s["metric"], "values": s["values"]} for s in answer.json()["data"]["result"]]
            target_data = {"ref": target["refId"], "legend": target.get("legendFormat", ""), "series": series}
            panels.setdefault(panel["title"], []).append(target_data)
    return {"panels": panels, "no_data": NO_SERIES_ON_THE_TIER}


def save_snapshot(name: str, prometheus_url: str, engine: str, namespace: str, model: str) -> pathlib.Path | None:
    """`snapshot(...)` written to $RIO_DASHBOARD_SNAPSHOTS/NAME.json, where that is set (a run
    that makes the docs' picture, docs/dashboard.png); nothing otherwise."""
    directory = os.environ.get(SNAPSHOTS_ENV)
    if not directory:
        return None
    path = pathlib.Path(directory) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(snapshot(prometheus_url, engine, namespace, model)))
    return path
