"""What every port of the server's programs shares: connection limits on uvicorn's protocol
(http_protocol.py), a bounded reverse proxy (proxy.py), stop signals caught from a process's
first line (signals.py) and the Prometheus port (metrics_port.py). It imports none of the
programs. This file imports nothing: a program's __main__.py installs its SIGTERM handler
through signals.py before the imports that take a while.
"""
