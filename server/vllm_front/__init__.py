"""The front of a vLLM pod (`python -m model_server front`, a native sidecar the operator adds
beside vLLM): a bounded reverse proxy on the port the pod's Service targets (server.py).
"""
