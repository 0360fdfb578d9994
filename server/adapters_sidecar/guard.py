"""An ASGI middleware for vLLM's server: adapter management only from inside the pod.

With runtime LoRA updating on (VLLM_ALLOW_RUNTIME_LORA_UPDATING), vLLM serves
/v1/load_lora_adapter, /v1/unload_lora_adapter and SageMaker's /adapters on the same port as
the OpenAI API, to anyone who reaches the Service: a client could unload every adapter, or load
any directory of the pod as one. This middleware (vLLM's `--middleware`) answers 403 to such a
request unless it comes over loopback, which only the pod's own containers (the adapters
sidecar) can use. The sidecar copies this file next to vLLM at start, so it must import nothing
beyond the standard library: it runs in vLLM's image, not in the model server's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
# Every route that manages adapters has one of these in its path, whatever vLLM names it next;
# refusing a little too much (a path that merely mentions them) costs nothing on an inference port.
MANAGEMENT_WORDS = ("adapter", "lora")
BODY = json.dumps({"error": "adapters are managed by the operator (spec.adapters), not over this port"}).encode()


def is_management(path: str) -> bool:
    return any(word in path.lower() for word in MANAGEMENT_WORDS)


class LocalAdminOnly:
    """Refuses adapter management from any client but loopback (403)."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and is_management(scope.get("path", "")):
            client = scope.get("client") or ("", 0)
            if client[0] not in LOOPBACK:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
                await send({"type": "http.response.start", "status": 403, "headers": headers})
                await send({"type": "http.response.body", "body": BODY})
                return
        await self.app(scope, receive, send)
