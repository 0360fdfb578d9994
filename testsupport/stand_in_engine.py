"""A stand-in for vLLM's API server behind the vLLM front: /health, and a small completion for
any other request once its body has arrived. Run as its own process (`python -m
testsupport.stand_in_engine PORT`), so a test that attacks the front from its own process does
not slow the engine's answers with its own work."""

from __future__ import annotations

import sys
from typing import Any

import uvicorn

COMPLETION = b'{"choices":[{"text":"ok"}]}'


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = b"" if scope["path"] == "/health" else COMPLETION
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", lifespan="off")
