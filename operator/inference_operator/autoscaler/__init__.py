"""The latency-SLO autoscaler: pure policy and PromQL, a Prometheus client, and a kopf daemon.

`policy` and `promql` are pure and importable without kopf (the builders and the simulation
use them); `handlers` is the I/O edge and is imported only by the operator's handler module.
"""
