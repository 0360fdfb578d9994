"""A minimal `helm` command line over the Helm v4 engine of helm-sdkpy, run as a subprocess.

    python -m tests.chart.helm_cli lint CHART
    python -m tests.chart.helm_cli install RELEASE CHART --namespace NS --kubeconfig PATH [-f VALUES.json]
    python -m tests.chart.helm_cli uninstall RELEASE --namespace NS --kubeconfig PATH

It prints the result as JSON on stdout, or the error on stderr with exit status 1. A process of
its own because the Go runtime inside the library reads the environment (HELM_DRIVER and
Helm's home directories) only from the process' start-up environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="helm_cli")
    commands = parser.add_subparsers(dest="command", required=True)
    lint = commands.add_parser("lint")
    lint.add_argument("chart")
    install = commands.add_parser("install")
    install.add_argument("release")
    install.add_argument("chart")
    install.add_argument("--namespace", required=True)
    install.add_argument("--kubeconfig", required=True)
    install.add_argument("-f", "--values", help="a JSON file of values")
    uninstall = commands.add_parser("uninstall")
    uninstall.add_argument("release")
    uninstall.add_argument("--namespace", required=True)
    uninstall.add_argument("--kubeconfig", required=True)
    args = parser.parse_args(argv)

    import helm_sdkpy as helm

    try:
        if args.command == "lint":
            config = helm.Configuration(namespace="default")
            result = asyncio.run(helm.Lint(config).run(args.chart))
        elif args.command == "uninstall":
            config = helm.Configuration(namespace=args.namespace, kubeconfig=args.kubeconfig)
            result = asyncio.run(helm.Uninstall(config).run(args.release, wait=True, timeout=120))
        else:
            values = None
            if args.values:
                with open(args.values, encoding="utf-8") as stream:
                    values = json.load(stream) or None
            config = helm.Configuration(namespace=args.namespace, kubeconfig=args.kubeconfig)
            result = asyncio.run(
                helm.Install(config).run(args.release, args.chart, values=values, wait=False, timeout=60)
            )
    except helm.HelmError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
