"""The model fetcher's command under the name the operator's init containers run:
`python -m model_server.storage URI DIR` is `python -m model_fetcher URI DIR`. This file imports
nothing, so the fetcher's SIGTERM handler is the first thing __main__.py does."""
