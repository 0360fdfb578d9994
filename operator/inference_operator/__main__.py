"""Command line: `render` manifests without a cluster, `run` the operator.

python -m inference_operator render -f examples/resnet-onnx-1gpu.yaml
python -m inference_operator run --all-namespaces --liveness http://0.0.0.0:8080/healthz
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TextIO

import yaml

from . import config
from .builders.gpu import gpu_view
from .jsontypes import JsonObject
from .kinds import INFERENCE_SERVICE
from .models import ENGINES, Engine, GpuAllocation, ResourceNaming, SpecError, parse_spec
from .settings import (
    SUPPLEMENTAL_GROUPS_ENV,
    GpuDefaults,
    SettingsError,
    parse_groups,
)
from .stages import rendered

if TYPE_CHECKING:
    import kopf
from .validation import validate_custom_resource

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


class RenderError(Exception):
    """A document that is not a renderable InferenceService; the message names where."""


def _inference_service(doc: object, where: str) -> JsonObject:
    """`doc` when it is a mapping of the InferenceService kind; otherwise RenderError."""
    if not isinstance(doc, dict):
        raise RenderError(f"{where}: expected a mapping, got {type(doc).__name__}")
    if (doc.get("apiVersion"), doc.get("kind")) != INFERENCE_SERVICE.key:
        expected = "/".join(INFERENCE_SERVICE.key)
        raise RenderError(f"{where}: apiVersion/kind must be {expected}, got {doc.get('apiVersion')}/{doc.get('kind')}")
    return doc


def render_documents(
    documents: Iterable[object], source: str = "<stdin>", operator: config.OperatorConfig | None = None
) -> list[JsonObject]:
    """Every object the operator configured as `operator` (built-in defaults when None) would
    create for the InferenceServices among `documents`.

    Each document first gets the API server's verdict (schema, defaults and CEL rules of the
    CRD): what `kubectl apply` would refuse, render refuses, naming the field.
    """
    operator = operator or config.OperatorConfig()
    objects: list[JsonObject] = []
    for index, doc in enumerate(documents, start=1):
        if doc is None:
            continue
        where = f"{source}: document {index}"
        doc = _inference_service(doc, where)
        meta = doc.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("name"), str) and meta["name"]:
            where = f"{source}: InferenceService {meta['name']}"
        if errors := validate_custom_resource(doc):
            raise RenderError("\n".join(f"{where}: {error}" for error in errors))
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(meta, dict) or not isinstance(name, str) or not name:
            raise RenderError(f"{where}: metadata.name is required (render does not generate names)")
        try:
            spec = parse_spec(doc.get("spec") or {})
            owner = operator.owner(name, meta.get("namespace", "default"), meta.get("uid", PLACEHOLDER_UID), spec)
        except SpecError as exc:
            raise RenderError(f"{where}: {exc}") from exc
        objects.extend(rendered(owner))
    return objects


def _render_config(args: argparse.Namespace) -> config.OperatorConfig:
    """The operator's settings as a cluster would have them: environment, then flags."""
    try:
        loaded = config.load(_images(args))
    except ValueError as exc:
        raise RenderError(str(exc)) from exc
    return dataclasses.replace(loaded, gpu=_gpu_defaults(args, loaded.gpu))


def _gpu_defaults(args: argparse.Namespace, defaults: GpuDefaults) -> GpuDefaults:
    """The GPU flags over the environment's settings."""
    groups = defaults.supplemental_groups
    if args.gpu_supplemental_groups is not None:
        try:
            groups = parse_groups(args.gpu_supplemental_groups, "--gpu-supplemental-groups")
        except SettingsError as exc:
            raise RenderError(str(exc)) from exc
    return GpuDefaults(
        allocation=GpuAllocation(args.gpu_allocation) if args.gpu_allocation else defaults.allocation,
        resource_naming=(
            ResourceNaming(args.gpu_resource_naming) if args.gpu_resource_naming else defaults.resource_naming
        ),
        supplemental_groups=groups,
    )


def _render(args: argparse.Namespace, out: TextIO) -> int:
    operator = _render_config(args)
    objects: list[JsonObject] = []
    for path in args.filename:
        try:
            stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
        except OSError as exc:
            raise RenderError(f"{path}: {exc.strerror}") from exc
        with stream:
            try:
                documents = list(yaml.safe_load_all(stream))
            except yaml.YAMLError as exc:
                raise RenderError(f"{path}: not valid YAML: {exc}") from exc
            except RecursionError as exc:
                raise RenderError(f"{path}: not valid YAML: nested too deeply") from exc
        objects.extend(render_documents(documents, source=path, operator=operator))
    if args.gpu_view:  # long CEL selectors stay on one line
        yaml.safe_dump_all(gpu_view(objects), out, sort_keys=False, width=1000)
        return 0
    yaml.safe_dump_all(objects, out, sort_keys=False)
    return 0


def scale_settings(concurrency: int) -> kopf.OperatorSettings:
    """kopf settings for many InferenceServices (bench/operator_scale.py measures them; the
    figures behind each choice: docs/measurements.md#the-figures-behind-the-codes-limits).

    kopf runs one worker per object and our handlers are synchronous: each worker hands its
    handler to the thread pool, and kopf waits for a handler's thread even when cancelled (it
    shields it). Unbounded, 1,000 objects queue 1,000 handlers in front of the pool, and SIGTERM
    waited for all of them. `queueing.worker_limit` bounds the objects in
    work per watched kind, and the pool has a thread for each of them (InferenceServices and
    Deployments), so nothing waits in the pool: a backlog waits in kopf's queues, which SIGTERM
    cancels after `queueing.exit_timeout`. The limit trades convergence for exit time: a small
    one converges slowly, a large one exits slowly on SIGTERM (every handler in flight finishes
    first); the default sits where both were short.
    """
    import kopf

    settings = kopf.OperatorSettings()
    settings.queueing.worker_limit = concurrency
    # A worker keeps its slot while idle, waiting for more events of its object (5 s by default):
    # with a limit, that capped the rate at `concurrency` objects per 5 s. Our own patches'
    # events arrive within milliseconds; later ones start a new worker.
    settings.queueing.idle_timeout = 0.1
    settings.execution.max_workers = 2 * concurrency
    # After SIGTERM, queued work goes on this long, then is cancelled (the next start resumes
    # it): SIGTERM-to-exit is about this plus the handlers in flight.
    settings.queueing.exit_timeout = 1.0
    return settings


def _run(args: argparse.Namespace) -> int:
    import kopf

    try:
        # A bad chart value stops the operator here, named, not per reconcile.
        operator = config.load(_images(args))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from . import handlers  # noqa: F401  (registers the handlers)

    if args.log_format == "json":
        kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON)
        from .tracing import TraceIds

        for handler in logging.getLogger().handlers:  # kopf's: a reconcile's lines carry its trace id
            handler.addFilter(TraceIds())
    else:
        kopf.configure(verbose=args.verbose)
    if args.metrics_port:
        from . import metrics

        metrics.serve(args.metrics_port, args.metrics_address)
    kopf.run(
        settings=scale_settings(args.concurrency),
        clusterwide=args.all_namespaces,
        namespaces=args.namespace or (),
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(config=operator),
    )
    return 0


def _image_flags(command: argparse.ArgumentParser) -> None:
    """The operator's default images (chart values images.*) for services that name none: a flag
    per engine, as the engine names it."""
    for serving in ENGINES.values():
        image = serving.image
        command.add_argument(f"--{image.flag}", metavar="IMAGE", help=f"{image.help} (default ${image.env})")


def _images(args: argparse.Namespace) -> dict[Engine, str | None]:
    """Each engine's image flag, None where unset."""
    return {engine: getattr(args, serving.image.flag.replace("-", "_")) for engine, serving in ENGINES.items()}


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="inference-operator", description=__doc__.split("\n")[0])
    commands = root.add_subparsers(dest="command", required=True)

    render = commands.add_parser("render", help="print the objects an InferenceService becomes")
    render.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        help="InferenceService YAML file ('-' for stdin); repeatable",
    )
    render.add_argument(
        "--gpu-view",
        action="store_true",
        help="print only what each pod gets for its GPUs (resources or claims, env, placement, groups, devices)",
    )
    # The operator's GPU settings (chart values gpu.*) for fields a spec leaves unset.
    render.add_argument(
        "--gpu-allocation", choices=[a.value for a in GpuAllocation], help="operator default of gpu.allocation"
    )
    render.add_argument(
        "--gpu-resource-naming",
        choices=[n.value for n in ResourceNaming],
        help="the device plugin's resource naming strategy on the cluster (operator default)",
    )
    render.add_argument(
        "--gpu-supplemental-groups",
        metavar="GIDS",
        help=f"the hosts' video/render GIDs, e.g. 44,992 (operator default; {SUPPLEMENTAL_GROUPS_ENV})",
    )

    _image_flags(render)

    run = commands.add_parser("run", help="run the operator")
    _image_flags(run)
    scope = run.add_mutually_exclusive_group(required=True)
    scope.add_argument("-A", "--all-namespaces", action="store_true")
    scope.add_argument("-n", "--namespace", action="append", help="watch this namespace; repeatable")
    run.add_argument(
        "--peering", default=None, help="kopf peering name for HA (one active replica); standalone when unset"
    )
    run.add_argument("--priority", type=int, default=0, help="peering priority of this replica")
    run.add_argument("--liveness", default=None, help="e.g. http://0.0.0.0:8080/healthz")
    run.add_argument(
        "--metrics-port", type=int, default=8000, help="serve Prometheus metrics on this port at /metrics (0 = off)"
    )
    run.add_argument("--metrics-address", default="0.0.0.0", help="address the metrics server binds")
    run.add_argument(
        "--concurrency",
        type=int,
        default=32,
        help="objects reconciled at once per watched kind (and 2x handler threads)",
    )
    run.add_argument("-v", "--verbose", action="store_true")
    run.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="json: one JSON object per line, with trace_id/span_id inside a traced reconcile (chart value logFormat)",
    )
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "render":
        try:
            return _render(args, sys.stdout)
        except RenderError as exc:
            for line in str(exc).splitlines():
                print(f"error: {line}", file=sys.stderr)
            return 2
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
