"""`python -m model_server serve|front|activator|quantize ...`."""

from __future__ import annotations

import sys

from bounded_http import signals

if sys.argv[1:2] in (["serve"], ["front"], ["activator"]):
    # Before the imports that take a while: as PID 1, a SIGTERM meanwhile would be lost.
    signals.remember_stop_signals()

import argparse  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from pydantic import ValidationError  # noqa: E402

from .settings import ENV_PREFIX, ServerSettings, add_arguments, flag_name  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m model_server", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="serve a model over HTTP",
        argument_default=argparse.SUPPRESS,  # unset flags fall through to MODEL_SERVER_* env
        allow_abbrev=False,  # `--max-batch` is no flag: a prefix must not pass for the full name
        description="Each flag can also be set through the env var shown in its help "
        "(MODEL_SERVER_...); a flag on the command line wins over the env var.",
    )
    add_arguments(serve)

    front = commands.add_parser(
        "front",
        help="a bounded reverse proxy in front of vLLM's loopback port",
        allow_abbrev=False,
        description="The port a vLLM pod's Service targets (see vllm_front/server.py).",
    )
    from vllm_front.server import add_arguments as add_front_arguments

    add_front_arguments(front)

    activator = commands.add_parser(
        "activator",
        help="hold the requests of services scaled to zero until a replica is ready",
        allow_abbrev=False,
        description="Where a service's requests go while it has no ready replica (see inference_activator/).",
    )
    from inference_activator.config import add_arguments as add_activator_arguments

    add_activator_arguments(activator)

    quant = commands.add_parser("quantize", help="INT8-quantize an ONNX model")
    quant.add_argument("--model", required=True, help="input .onnx")
    quant.add_argument("--out", required=True, help="output .onnx")
    quant.add_argument("--calibration", help=".npy (single input) or .npz (by input name)")
    quant.add_argument("--mode", choices=["dynamic", "static"], default="dynamic")
    quant.add_argument("--per-channel", dest="per_channel", action="store_true")
    quant.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="max relative L2 error of outputs vs. the original (exit 1 above it)",
    )
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """Flags given on the command line override env; the rest comes from env."""
    values = {k: v for k, v in vars(args).items() if k != "command"}
    return ServerSettings(**values)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "quantize":
        from .quantize import run_cli

        return run_cli(args)
    if args.command == "front":
        from vllm_front.server import config_from_args
        from vllm_front.server import serve as serve_front

        return serve_front(config_from_args(args))
    if args.command == "activator":
        from inference_activator.config import config_from_args as activator_config
        from inference_activator.server import serve as serve_activator

        return serve_activator(activator_config(args))
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            field = ".".join(str(p) for p in error["loc"])
            where = (
                f"--{flag_name(field)} or {ENV_PREFIX}{field.upper()}" if field in ServerSettings.model_fields else ""
            )
            print(f"error: {field} ({where}): {error['msg']}", file=sys.stderr)
        return 2
    from .runner import serve

    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
