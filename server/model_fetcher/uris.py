"""The three URI forms a model may have, read before anything is asked of a source: an http(s)
URI names one file, an s3:// URI a bucket and a key or prefix, an hf:// URI a repository and a
revision. A malformed one is a usage error (exit 2), never a request."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from .errors import ExitCode, FetchError

HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
HF_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


def http_file_name(uri: str) -> str:
    """The name of the one file an http(s) URI names."""
    path = urlsplit(uri).path
    name = PurePosixPath(path).name
    if not name or path.endswith("/") or name in (".", "..") or ".." in path.split("/"):
        raise FetchError(f"{uri}: an http(s) model URI must name a file, e.g. .../model.onnx", ExitCode.USAGE)
    return name


def s3_location(uri: str) -> tuple[str, str]:
    """(bucket, key or prefix) of an s3:// URI; no `.` or `..` segments in the key."""
    parts = urlsplit(uri)
    bucket, path = parts.netloc, parts.path.lstrip("/")
    if not bucket:
        raise FetchError(f"{uri}: no bucket", ExitCode.USAGE)
    if path and (".." in path.split("/") or "." in path.split("/")):
        raise FetchError(f"{uri}: `.` and `..` are not allowed in an S3 key", ExitCode.USAGE)
    return bucket, path


def parse_hf(uri: str) -> tuple[str, str]:
    """(repo id, revision) of hf://ORG/NAME[@REVISION]."""
    rest = uri[len("hf://") :]
    repo, _, revision = rest.partition("@")
    repo = repo.rstrip("/")
    revision = revision or "main"
    if not HF_REPO.match(repo) or ".." in repo:
        raise FetchError(f"{uri}: expected hf://ORG/NAME[@REVISION]", ExitCode.USAGE)
    if not HF_REVISION.match(revision) or ".." in revision.split("/"):
        raise FetchError(f"{uri}: {revision!r} is not a branch, tag or commit", ExitCode.USAGE)
    return repo, revision
