"""The engines: one module per engine (model_server.py, vllm.py), each one object implementing
`base.ServingEngine` (traits, series, scaling names, image, and its part of the pod: serving
container, sidecars, probes, ports, grace period, multi-node arguments), and the registry below,
the one table that names them. Adding an engine is a module here, its member of `Engine` and its
entry in `ENGINES`; the spec's CEL rules, the PromQL layer, the settings and the builders read
it from here (tests/engines/test_engine_table.py holds every engine to that, and
tests/engines/test_engine_rule.py keeps the rest of the operator from naming one)."""

from __future__ import annotations

from .base import Engine, ServingEngine
from .model_server import MODEL_SERVER
from .vllm import VLLM

ENGINES: dict[Engine, ServingEngine] = {
    Engine.MODEL_SERVER: MODEL_SERVER,
    Engine.VLLM: VLLM,
}
DEFAULT_ENGINE = Engine.MODEL_SERVER
