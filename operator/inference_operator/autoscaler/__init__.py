"""The latency-SLO autoscaler: pure policy and PromQL, a Prometheus client, and a kopf daemon.

`policy` and `promql` are pure and importable without kopf (the builders and the simulation
use them); `loop` is one step's I/O; the daemon that runs it is `handlers/autoscaler.py`.
"""
