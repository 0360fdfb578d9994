"""A stand-in for vLLM's API server behind the vLLM front: /health, an answer 100 times its
request's body on `ANSWER_PATH` (what an answer-side attack asks for: embeddings of a long
input), and a small completion for any other request once its body has arrived. Run as its own process (`python -m
testsupport.stand_in_engine PORT`), so a test that attacks the front from its own process does
not slow the engine's answers with its own work."""

from __future__ import annotations

import sys
from typing import Any

import uvicorn

COMPLETION = b'{"choices":[{"text":"ok"}]}'
ANSWER_PATH = "/v1/embeddings"
#: How many times its request's body the answer on ANSWER_PATH is.
AMPLIFICATION = 100
_CHUNK = 64 * 1024


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    if scope["path"] == ANSWER_PATH:
        length = AMPLIFICATION * size
        await send({"type": "http.response.start", "status": 200, "headers": _headers(length)})
        chunk = b"0" * _CHUNK
        for start in range(0, length, _CHUNK):
            await send({"type": "http.response.body", "body": chunk[: length - start], "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b"" if scope["path"] == "/health" else COMPLETION
    await send({"type": "http.response.start", "status": 200, "headers": _headers(len(body))})
    await send({"type": "http.response.body", "body": body})


def _headers(length: int) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", b"%d" % length)]


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", lifespan="off")
