"""The adapters sidecar's command under the name the operator's pods run:
`python -m model_server.adapters ...` is `python -m adapters_sidecar ...`. This file imports
nothing, so the sidecar's SIGTERM handler is the first thing __main__.py does."""
