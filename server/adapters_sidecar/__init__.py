"""LoRA adapters of a vLLM pod, loaded and unloaded while it serves: the pod's `adapters` sidecar.

    python -m model_server.adapters --desired /etc/adapters/adapters.json --dir /var/lib/adapters \
        --engine http://127.0.0.1:8080 --port 8081 --plugins /var/run/vllm-plugins

The operator writes the adapters a service wants (`spec.adapters`: name and uri) into the
ConfigMap NAME-adapters, which the pod mounts; the kubelet updates the file in place, with no
restart. Every `--interval` seconds this sidecar compares that list with what vLLM serves
(`GET /v1/models`) and closes the gap: a new adapter is fetched into `--dir` with the model
fetcher's rules and limits (hf://, s3://) and loaded (`POST /v1/load_lora_adapter`); one that
left the list is unloaded and its files removed; one whose uri changed is fetched and loaded
in place. Comparing with vLLM's own list each time also reloads everything after vLLM restarts.

On `--port` (bounded like the model server's ports: header time and size, connections) it
answers `GET /adapters` (each adapter's name, its uri's digest and its state: Pending, Loading,
Ready or Failed with a reason the operator copies into status; never a uri, which other pods
could read there) and `GET /ready`: 200 once every
adapter of the list it first read has settled (Ready or Failed), so a new replica takes no
request before its adapters are loaded, while adapters added later never take a serving
replica out of its Service.

It holds the Hub token and S3 keys, and its HOME, /tmp and tools' configuration paths are in
a volume of its own (the pod's builder sees to it): nothing the vLLM container (the author's
code) can write steers its HTTP or S3 clients. The list it reads is held to the CRD's rules
again, since names become directories.

At start it copies guard.py (as `rocm_inference_guard.py`) into `--plugins`, vLLM's `--middleware`, which refuses
adapter management to any client but this sidecar; vLLM starts after it (a native sidecar's
startup probe on /health/live).

The modules: desired.py (the list the operator wrote, and what brings vLLM to it, without I/O),
sidecar.py (the loop's work: vLLM's adapter endpoints, fetching, each adapter's state),
process.py (the status port, the loop until SIGTERM, the command line), guard.py (vLLM's
middleware, shipped as one file) and __main__.py. This file imports nothing: `python -m
model_server.adapters` runs it before __main__.py's SIGTERM handler is in place.
"""
