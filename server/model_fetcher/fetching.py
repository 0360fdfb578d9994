"""`fetch`: a model URI into a directory, by its scheme. The one entry point of the fetcher as a
library (the command line and the adapters sidecar both call it)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from .errors import ExitCode, FetchError
from .hub import fetch_hf
from .limits import Limits
from .s3 import fetch_s3
from .web import fetch_http


def fetch(uri: str, dest_dir: Path, limits: Limits | None = None) -> list[Path]:
    limits = limits or Limits()
    scheme = urlsplit(uri).scheme
    if scheme in ("http", "https"):
        return fetch_http(uri, dest_dir, limits=limits)
    if scheme == "s3":
        return fetch_s3(uri, dest_dir, limits=limits)
    if scheme == "hf":
        return fetch_hf(uri, dest_dir, limits=limits)
    raise FetchError(f"{uri}: unsupported scheme {scheme!r} (http, https, s3, hf)", ExitCode.USAGE)
