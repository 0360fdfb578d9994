"""What serves the model, as the spec sees it: the engines' traits (inference_operator.engines)
turned into the CRD's per-engine rules, and the flags and variables the operator sets on the
command line (which runtime.args and runtime.env may therefore not set).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from ..engines import DEFAULT_ENGINE as DEFAULT_ENGINE
from ..engines import ENGINES as ENGINES
from ..engines.base import Engine as Engine
from ..engines.base import Metric as Metric
from ..engines.base import ReservedArgs
from ..engines.base import Traits as Traits
from .base import flag_prefixes

# The default engine's image: the operator's own, which also carries the model fetcher.
DEFAULT_IMAGE = ENGINES[DEFAULT_ENGINE].image.default

# Flags of `model_server serve` the operator sets itself (engines/model_server.server_args) or that
# must keep their default for probes and the Service (--host): runtime.args may not set them,
# nor any prefix of them (argparse accepts an unambiguous prefix: `--po 1` is `--port 1`).
OPERATOR_FLAGS = (
    "--model",
    "--model-name",
    "--model-version",
    "--format",
    "--host",
    "--port",
    "--metrics-port",
    "--grpc-port",
    "--providers",
    "--max-batch-size",
    "--max-delay-ms",
    "--max-queue",
    "--shutdown-delay",
    "--drain-timeout",
    # runtime.tracing: traces leave only for the endpoint its author wrote there.
    "--otlp-traces-endpoint",
    "--trace-sample-ratio",
)
# Environment the operator sets, or that would override what it sets: GPU selection (HIP also
# honours CUDA_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL) and the server's env form of its flags.
OPERATOR_ENV = (
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "MODEL_NAME",
    "MODEL_SERVER_MODEL",
    "MODEL_SERVER_MODEL_NAME",
    "MODEL_SERVER_MODEL_VERSION",
    "MODEL_SERVER_FORMAT",
    "MODEL_SERVER_HOST",
    "MODEL_SERVER_PORT",
    "MODEL_SERVER_METRICS_PORT",
    "MODEL_SERVER_GRPC_PORT",
    "MODEL_SERVER_PROVIDERS",
    "MODEL_SERVER_MAX_BATCH_SIZE",
    "MODEL_SERVER_MAX_DELAY_MS",
    "MODEL_SERVER_MAX_QUEUE",
    "MODEL_SERVER_SHUTDOWN_DELAY_S",
    "MODEL_SERVER_DRAIN_TIMEOUT_S",
    "MODEL_SERVER_OTLP_TRACES_ENDPOINT",
    "MODEL_SERVER_TRACE_SAMPLE_RATIO",
    "OTEL_K8S_POD_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    # The model fetcher's Hub access: only from model.huggingFace, which the operator checks.
    "HF_TOKEN",
    "HF_ENDPOINT",
    "HF_HOME",
    "MODEL_FETCH_ALLOW_HTTP_TOKEN",
    # vLLM's adapter endpoints: opened by the operator only with the guard in front (spec.adapters).
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    # vLLM's trace export, from runtime.tracing.
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
)


ENGINES_TRAITS: dict[Engine, Traits] = {engine: serving.traits for engine, serving in ENGINES.items()}


def engines_where(trait: Callable[[Traits], bool]) -> tuple[Engine, ...]:
    return tuple(engine for engine, traits in ENGINES_TRAITS.items() if trait(traits))


def metrics_in_order(metrics: Collection[Metric]) -> list[Metric]:
    """`metrics` in the order Metric declares them (rules and messages read the same each time)."""
    return [metric for metric in Metric if metric in metrics]


def metrics_per_engine(allowed: Callable[[Traits], Collection[Metric]]) -> str:
    """`a, b or c for modelServer; d or e for vllm`: a rule's message, a field's description."""

    def listed(engine: Engine) -> str:
        names = [m.value for m in metrics_in_order(allowed(ENGINES_TRAITS[engine]))]
        return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]

    return "; ".join(f"{listed(engine)} for {engine.value}" for engine in ENGINES)


def engine_names(engines: tuple[Engine, ...]) -> str:
    """`vllm`, or `modelServer or vllm`: the engines in a rule's message."""
    return " or ".join(engines)


def cel_engine_in(engines: tuple[Engine, ...], runtime: str = "self") -> str:
    """CEL: the `engine` of the object at `runtime` (a RuntimeSpec, or a spec's `self.runtime`)
    is one of `engines`, an unset engine (or runtime) being the default one."""
    if DEFAULT_ENGINE in engines:
        others = tuple(engine for engine in ENGINES if engine not in engines)
        return f"!({cel_engine_in(others, runtime)})" if others else "true"
    if not engines:
        return "false"
    guards = ([f"has({runtime})"] if runtime != "self" else []) + [f"has({runtime}.engine)"]
    values = ", ".join(f"'{engine.value}'" for engine in engines)
    test = f"{runtime}.engine == {values}" if len(engines) == 1 else f"{runtime}.engine in [{values}]"
    return " && ".join([*guards, test])


def _args_pattern(flags: tuple[str, ...]) -> str:
    """One `--flag` or `--flag=value` naming (a prefix of) one of `flags`; `.key`/`+` are the JSON-
    argument syntax of vLLM-style parsers for the same flag. Shared with the CRD's CEL rule."""
    return "^--(" + "|".join(flag_prefixes(f) for f in flags) + ")([.+=][\\s\\S]*)?$"


# The engines whose runtime.args are checked by form, with the pattern of the flags they keep.
CHECKED_ARGS: dict[Engine, tuple[ReservedArgs, str]] = {
    engine: (serving.args, _args_pattern(serving.args.flags))
    for engine, serving in ENGINES.items()
    if serving.args is not None
}
# The engines that run on several nodes, with the pattern of the flags a group sets.
MULTI_NODE_ARGS: dict[Engine, tuple[tuple[str, ...], str]] = {
    engine: (serving.multi_node_flags, _args_pattern(serving.multi_node_flags))
    for engine, serving in ENGINES.items()
    if serving.multi_node_flags
}


def args_message(engine: Engine) -> str:
    return f"runtime.args for engine {engine.value}"
