"""`python -m model_server serve|quantize ...`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

if TYPE_CHECKING:
    from .settings import ServerSettings


def _flag(parser: argparse.ArgumentParser, name: str, *, env: bool = False, **kwargs: Any) -> None:
    """Add `--name`; for `serve`, the help names the matching env var too."""
    if env:
        var = "MODEL_SERVER_" + kwargs.get("dest", name.replace("-", "_")).upper()
        kwargs["help"] = f"{kwargs.get('help', '')} [env {var}]".strip()
    parser.add_argument(f"--{name}", **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m model_server", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="serve a model over HTTP",
        argument_default=argparse.SUPPRESS,  # unset flags fall through to MODEL_SERVER_* env
        description="Each flag can also be set through the env var shown in its help "
        "(MODEL_SERVER_...); a flag on the command line wins over the env var.",
    )
    _flag(serve, env=True, name="model", help="model file or repository directory (DIR/<version>/model.onnx)")
    _flag(
        serve,
        env=True,
        name="model-name",
        dest="model_name",
        help="API name and metric label; also env MODEL_NAME",
    )
    _flag(serve, env=True, name="model-version", dest="model_version", help="serve only this version (pinned)")
    _flag(serve, env=True, name="format", choices=["auto", "onnx", "torchscript", "export"])
    _flag(serve, env=True, name="host")
    _flag(serve, env=True, name="port", type=int)
    _flag(serve, env=True, name="metrics-port", dest="metrics_port", type=int, help="extra port for /metrics")
    _flag(
        serve,
        env=True,
        name="providers",
        help="comma-separated ONNX Runtime execution providers, in preference order",
    )
    _flag(serve, env=True, name="intra-op-threads", dest="intra_op_threads", type=int)
    _flag(serve, env=True, name="inter-op-threads", dest="inter_op_threads", type=int)
    _flag(serve, env=True, name="io-binding", dest="io_binding", choices=["auto", "on", "off"])
    _flag(serve, env=True, name="profiling", action=argparse.BooleanOptionalAction)
    _flag(serve, env=True, name="profile-dir", dest="profile_dir")
    _flag(serve, env=True, name="device", choices=["auto", "cpu", "cuda"], help="torch device")
    _flag(serve, env=True, name="max-batch-size", dest="max_batch_size", type=int)
    _flag(serve, env=True, name="max-delay-ms", dest="max_delay_ms", type=float)
    _flag(serve, env=True, name="max-queue", dest="max_queue", type=int)
    _flag(serve, env=True, name="batch-workers", dest="batch_workers", type=int)
    _flag(serve, "instances", help="runtime sessions per version, one per device ('auto': one per visible GPU)")
    _flag(
        serve,
        env=True,
        name="batch-buckets",
        dest="batch_buckets",
        help="'auto', 'off' or sizes like 1,2,4,8,16",
    )
    _flag(serve, env=True, name="warmup", action=argparse.BooleanOptionalAction)
    _flag(serve, env=True, name="watch", action=argparse.BooleanOptionalAction, help="hot-reload new versions")
    _flag(serve, env=True, name="watch-polling", dest="watch_polling", action=argparse.BooleanOptionalAction)
    _flag(serve, env=True, name="watch-debounce-ms", dest="watch_debounce_ms", type=int)
    _flag(
        serve,
        env=True,
        name="max-versions",
        dest="max_versions",
        type=int,
        help="serve the N highest (0 = all)",
    )
    _flag(serve, env=True, name="drain-timeout", dest="drain_timeout_s", type=float)
    _flag(serve, env=True, name="shutdown-delay", dest="shutdown_delay_s", type=float)
    _flag(serve, env=True, name="max-body-bytes", dest="max_body_bytes", type=int)
    _flag(serve, env=True, name="log-level", dest="log_level")
    _flag(serve, env=True, name="access-log", dest="access_log", action=argparse.BooleanOptionalAction)

    quant = commands.add_parser("quantize", help="INT8-quantize an ONNX model")
    _flag(quant, "model", required=True, help="input .onnx")
    _flag(quant, "out", required=True, help="output .onnx")
    _flag(quant, "calibration", help=".npy (single input) or .npz (by input name)")
    _flag(quant, "mode", choices=["dynamic", "static"], default="dynamic")
    _flag(quant, "per-channel", dest="per_channel", action="store_true")
    _flag(
        quant,
        "tolerance",
        type=float,
        default=0.05,
        help="max relative L2 error of outputs vs. the original (exit 1 above it)",
    )
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """Flags given on the command line override env; the rest comes from env."""
    from .settings import ServerSettings

    values = {k: v for k, v in vars(args).items() if k != "command"}
    return ServerSettings(**values)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "quantize":
        from .quantize import run_cli

        return run_cli(args)
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            field = ".".join(str(p) for p in error["loc"])
            print(
                f"error: {field} (--{field.replace('_', '-')} or MODEL_SERVER_{field.upper()}): {error['msg']}",
                file=sys.stderr,
            )
        return 2
    from .runner import serve

    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
