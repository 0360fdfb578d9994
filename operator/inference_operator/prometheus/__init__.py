"""The operator's Prometheus layer, under every feature that reads metrics.

`promql` builds the queries (pure: the HPA and KEDA builders, the autoscaler and the canary
analysis all ask the same ones); `client` is the instant-query client; `clients` hands one out
per URL and credentials, by the Secret rules of `credentials`. Nothing here knows the features
above it (a contract in pyproject.toml holds that).
"""
