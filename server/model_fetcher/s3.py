"""S3 sources: one object, or every object under a prefix with its relative path. A file the
destination already holds is kept when a digest S3 publishes for it matches; every download is
checked against the digests S3 gives with it. boto3 (the `s3` extra) is imported only here, and
only for an s3:// model."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from .cache import exclusive, manifest_path, prune, verified_files
from .errors import ExitCode, FetchError
from .files import CHUNK, TEXT_NAMES, Expected, contained, hex_digest, parse_digest, write_file
from .limits import Limits
from .uris import s3_location


class S3Client(Protocol):
    def get_paginator(self, operation: str) -> Any: ...

    def get_object(self, Bucket: str, Key: str, ChecksumMode: str) -> dict[str, Any]: ...  # noqa: N803 (boto3's names)


@dataclass(frozen=True)
class S3Object:
    """One object as the listing names it: its key, size and ETag."""

    key: str
    size: int
    etag: str = ""


def _s3_objects(client: S3Client, bucket: str, prefix: str) -> Iterator[S3Object]:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if not item["Key"].endswith("/"):
                yield S3Object(item["Key"], int(item.get("Size", 0)), str(item.get("ETag") or ""))


def _s3_client() -> S3Client:
    try:
        import boto3
    except ImportError as exc:
        raise FetchError("s3:// models need boto3 in the image (pip install boto3)") from exc
    client: S3Client = boto3.client("s3")
    return client


def fetch_s3(uri: str, dest_dir: Path, client: S3Client | None = None, limits: Limits | None = None) -> list[Path]:
    """The object, or the objects under the prefix. A file the destination already holds is kept
    when it has the object's size and matches a digest published for it (a `.sha256` object,
    `--sha256`, or an ETag that is an MD5); everything else is downloaded and checked against
    every digest S3 gives with it (see `_s3_published`), and files the listing does not name are
    removed."""
    limits = limits or Limits()
    bucket, path = s3_location(uri)
    client = client or _s3_client()
    objects = _s3_objects_to_fetch(client, bucket, path)
    if not objects:
        raise FetchError(f"{uri}: no objects under this prefix")
    sidecars, files = _split_sidecars(objects)
    if limits.sha256 and len(files) != 1:
        raise FetchError(
            f"{uri}: --sha256 names one file, this prefix has {len(files)}; use <file>.sha256 objects", ExitCode.USAGE
        )
    limits.expect(sum(obj.size for obj, _ in files), uri)
    keep = [rel for _, rel in files]
    dest_dir.mkdir(parents=True, exist_ok=True)
    with exclusive(dest_dir, limits):
        prune(dest_dir, keep)
        targets = [(obj, rel, contained(dest_dir, rel, "S3 key")) for obj, rel in files]  # all, before any write
        expected = _s3_expected(client, bucket, targets, sidecars, limits)
        in_place = verified_files(expected, limits)
        for obj, rel, target in targets:
            if rel not in in_place:
                response = _s3_get(client, bucket, obj.key)
                body = _s3_body(response, bucket, obj.key)
                write_file(target, body, limits, expected[rel][1].sha256, _s3_published(response))
        fetched = [target for _, _, target in targets]
        prune(dest_dir, keep)
    return fetched


def _split_sidecars(
    objects: list[tuple[S3Object, PurePosixPath]],
) -> tuple[dict[str, str], list[tuple[S3Object, PurePosixPath]]]:
    """The `.sha256` objects (by relative path, to their key) apart from the files to fetch."""
    sidecars = {rel.as_posix(): obj.key for obj, rel in objects if rel.name.endswith(".sha256")}
    files = [(obj, rel) for obj, rel in objects if rel.as_posix() not in sidecars]
    return sidecars, files


def _s3_expected(
    client: S3Client,
    bucket: str,
    targets: list[tuple[S3Object, PurePosixPath, Path]],
    sidecars: dict[str, str],
    limits: Limits,
) -> dict[PurePosixPath, tuple[Path, Expected]]:
    """Each file's target and what it must be: the object's size and ETag MD5, and the SHA-256
    its `.sha256` object gives (else `--sha256`)."""
    expected: dict[PurePosixPath, tuple[Path, Expected]] = {}
    for obj, rel, target in targets:
        sha256 = limits.sha256
        if (sidecar := sidecars.get(rel.as_posix() + ".sha256")) is not None:
            sha256 = parse_digest(_s3_read(client, bucket, sidecar, limits), f"s3://{bucket}/{sidecar}")
        expected[rel] = (target, Expected(size=obj.size, sha256=sha256, md5=hex_digest(obj.etag, 32)))
    return expected


def _s3_objects_to_fetch(client: S3Client, bucket: str, path: str) -> list[tuple[S3Object, PurePosixPath]]:
    """Each object with its path relative to the destination: the one object `path` names
    exactly (unless it ends in `/`), else every object under the prefix."""
    directory = path.rstrip("/")
    listed = list(_s3_objects(client, bucket, directory))
    exact = [obj for obj in listed if obj.key == directory]
    if exact and not path.endswith("/"):
        return [(obj, manifest_path(PurePosixPath(obj.key).name, "S3 key")) for obj in exact]
    base = directory + "/" if directory else ""
    return [(obj, manifest_path(obj.key[len(base) :], "S3 key")) for obj in listed if obj.key.startswith(base)]


def _s3_read(client: S3Client, bucket: str, key: str, limits: Limits) -> str:
    data = b"".join(_s3_body(_s3_get(client, bucket, key), bucket, key))
    limits.count(len(data))
    return data[:4096].decode("utf-8", "replace")


# A ChecksumType: the checksum of the whole object, not of its parts (COMPOSITE, "...-N").
FULL_OBJECT = "FULL_OBJECT"
# Server-side encryption under which an object's ETag is not the MD5 of its content.
ETAG_NOT_MD5 = ("aws:kms", "aws:kms:dsse")


def _s3_published(response: dict[str, Any]) -> Expected:
    """The digests S3 gives with an object: its ChecksumSHA256 (base64) when it was stored with
    one and it covers the whole object, and its ETag when that is the content's MD5 (a single-part
    upload without SSE-KMS or SSE-C; a multipart ETag ends in -N). S3's default CRC checksums
    are not checked here."""
    sha256 = None
    checksum = str(response.get("ChecksumSHA256") or "")
    if checksum and "-" not in checksum and response.get("ChecksumType", FULL_OBJECT) == FULL_OBJECT:
        with contextlib.suppress(ValueError):
            sha256 = hex_digest(base64.b64decode(checksum, validate=True).hex(), 64)
    md5 = None
    encryption = str(response.get("ServerSideEncryption") or "")
    if encryption not in ETAG_NOT_MD5 and not response.get("SSECustomerAlgorithm"):
        md5 = hex_digest(response.get("ETag"), 32)
    return Expected(sha256=sha256, md5=md5)


def _s3_get(client: S3Client, bucket: str, key: str) -> dict[str, Any]:
    try:
        response = client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except Exception as exc:  # botocore's ClientError and friends, without importing botocore
        raise FetchError(f"s3://{bucket}/{key}: {type(exc).__name__}: {exc}") from exc
    content_type = str(response.get("ContentType") or "").split(";")[0].strip().lower()
    if content_type == "text/html" and not key.lower().endswith(TEXT_NAMES):
        raise FetchError(f"s3://{bucket}/{key}: stored as {content_type}, not a model", ExitCode.NOT_A_MODEL)
    return response


def _s3_body(response: dict[str, Any], bucket: str, key: str) -> Iterator[bytes]:
    try:
        yield from response["Body"].iter_chunks(CHUNK)
    except Exception as exc:  # botocore's own check of a checksum it was sent, a dropped connection
        code = ExitCode.CHECKSUM if "checksum" in type(exc).__name__.lower() else ExitCode.SOURCE
        raise FetchError(f"s3://{bucket}/{key}: {type(exc).__name__}: {exc}", code) from exc
