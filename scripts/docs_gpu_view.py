"""Fill the GPU allocation page's snippets (docs/gpu-allocation.md) from real `render --gpu-view` output.

    python scripts/docs_gpu_view.py            # rewrite the snippets in docs/gpu-allocation.md
    python scripts/docs_gpu_view.py --check    # exit 1 naming each stale snippet (a test runs this)

Each snippet is a fenced yaml block right after a marker line naming the command line:

    <!-- render: --gpu-view -f examples/resnet-dra.yaml -->
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "gpu-allocation.md"
SNIPPET = re.compile(r"(<!-- render: (?P<args>[^>]*?) -->\n```yaml\n)(?P<body>.*?)(```)", re.S)
# Snippets show what the chart's defaults give; the operator's environment must not leak in.
CLEAN_ENV_PREFIX = "INFERENCE_OPERATOR_GPU_"


def render(args: str) -> str:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_ENV_PREFIX)}
    result = subprocess.run(
        [sys.executable, "-m", "inference_operator", "render", *shlex.split(args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"render {args}: {result.stderr.strip()}")
    return result.stdout


def refreshed(text: str) -> tuple[str, list[str]]:
    """The page with every snippet re-rendered, and the command lines whose snippet changed."""
    stale: list[str] = []

    def fill(match: re.Match[str]) -> str:
        body = render(match["args"])
        if body != match["body"]:
            stale.append(match["args"])
        return match.group(1) + body + match.group(4)

    return SNIPPET.sub(fill, text), stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="report stale snippets instead of rewriting them")
    args = parser.parse_args()
    text = PAGE.read_text()
    new, stale = refreshed(text)
    if not SNIPPET.search(text):
        print(f"{PAGE} has no render snippets", file=sys.stderr)
        return 1
    if args.check:
        for command in stale:
            print(f"{PAGE}: stale snippet for `render {command}` (run python scripts/docs_gpu_view.py)")
        return 1 if stale else 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
