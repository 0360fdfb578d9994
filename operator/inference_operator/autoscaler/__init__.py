"""The latency-SLO autoscaler: its pure policy and one step's I/O (the loop).

`policy` is pure and importable without kopf (the simulation uses it); `loop` observes through
the `prometheus` package, decides and writes; the daemon that runs it is `handlers/autoscaler.py`.
"""
