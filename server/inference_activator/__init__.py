"""Scale to zero's activator (`python -m model_server activator`, run by the chart): where a
service's requests are held while it has no ready replica, the service woken, and the requests
answered once a replica is Ready.

The modules: server.py (the ASGI app that holds and releases requests, and the process: its
flags, its drain on SIGTERM), routes.py (which hosts a slice routes, to where, under which
limits: no I/O), kube.py (the few Kubernetes API calls it makes, over httpx) and metrics.py
(its own registry and series).
"""
