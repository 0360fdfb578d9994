"""Fetch a model into a local directory: the job of the pod's `model-fetch` init container.

    python -m model_server.storage https://host/models/resnet/model.onnx /mnt/models
    python -m model_server.storage s3://bucket/models/resnet/ /mnt/models

An HTTP(S) URI names one model file, saved under its own name (the server treats a lone model
file as version 1). An S3 URI names a prefix whose objects are copied with their relative
paths, so a repository laid out as `<version>/model.onnx` arrives as such. Files are written
to a temporary name and renamed, so the server never sees half a model. S3 needs `boto3`
(installed in the server image); credentials and endpoint come from the usual AWS_* variables.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

log = logging.getLogger("model_server.storage")
CHUNK = 1 << 20


class FetchError(Exception):
    """The model could not be fetched; the message says what and from where."""


class S3Client(Protocol):
    def get_paginator(self, operation: str) -> Any: ...

    def download_file(self, bucket: str, key: str, filename: str) -> None: ...


def _atomic_target(dest: Path) -> tuple[int, str]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")


def fetch_http(uri: str, dest_dir: Path, client: httpx.Client | None = None) -> list[Path]:
    path = urlsplit(uri).path
    name = PurePosixPath(path).name
    if not name or path.endswith("/"):
        raise FetchError(f"{uri}: an http(s) model URI must name a file, e.g. .../model.onnx")
    target = dest_dir / name
    fd, part = _atomic_target(target)
    own_client = client is None
    client = client or httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30, read=300))
    try:
        with os.fdopen(fd, "wb") as out, client.stream("GET", uri) as response:
            if response.status_code != 200:
                raise FetchError(f"{uri}: HTTP {response.status_code}")
            for chunk in response.iter_bytes(CHUNK):
                out.write(chunk)
        os.replace(part, target)
    except httpx.HTTPError as exc:
        raise FetchError(f"{uri}: {exc}") from exc
    finally:
        if own_client:
            client.close()
        if os.path.exists(part):
            os.unlink(part)
    return [target]


def _s3_keys(client: S3Client, bucket: str, prefix: str) -> Iterator[str]:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if not item["Key"].endswith("/"):
                yield item["Key"]


def fetch_s3(uri: str, dest_dir: Path, client: S3Client | None = None) -> list[Path]:
    parts = urlsplit(uri)
    bucket, prefix = parts.netloc, parts.path.lstrip("/")
    if client is None:
        try:
            import boto3
        except ImportError as exc:
            raise FetchError("s3:// models need boto3 in the image (pip install boto3)") from exc
        client = boto3.client("s3")
    base = prefix if prefix.endswith("/") or not prefix else prefix.rsplit("/", 1)[0] + "/"
    fetched = []
    for key in _s3_keys(client, bucket, prefix):
        relative = PurePosixPath(key[len(base) :] if key.startswith(base) else PurePosixPath(key).name)
        if ".." in relative.parts:
            raise FetchError(f"{uri}: refusing key {key!r}, it leaves the model directory")
        target = dest_dir.joinpath(*relative.parts)
        fd, part = _atomic_target(target)
        os.close(fd)
        try:
            client.download_file(bucket, key, part)
            os.replace(part, target)
        finally:
            if os.path.exists(part):
                os.unlink(part)
        fetched.append(target)
    if not fetched:
        raise FetchError(f"{uri}: no objects under this prefix")
    return fetched


def fetch(uri: str, dest_dir: Path) -> list[Path]:
    scheme = urlsplit(uri).scheme
    if scheme in ("http", "https"):
        return fetch_http(uri, dest_dir)
    if scheme == "s3":
        return fetch_s3(uri, dest_dir)
    raise FetchError(f"{uri}: unsupported scheme {scheme!r} (http, https, s3)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_server.storage", description=__doc__.split("\n")[0])
    parser.add_argument("uri")
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        files = fetch(args.uri, args.dest)
    except FetchError as exc:
        log.error("fetch failed: %s", exc)
        return 1
    total = sum(f.stat().st_size for f in files)
    log.info("fetched %d file(s), %d bytes, from %s into %s", len(files), total, args.uri, args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
