"""s3:// into a cache directory with the real boto3 (the image's `s3` extra), against an S3
stand-in on loopback that answers ListObjectsV2 and GetObject as S3 does: each object's ETag
(the MD5 of a single-part upload) and, when asked with `x-amz-checksum-mode: ENABLED`, the
full-object ChecksumSHA256 of an object stored with one.

The fetcher runs as the init container runs it: `python -m model_server.storage`.
"""

from __future__ import annotations

import base64
import hashlib
import html
import os
import pathlib
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from model_fetcher.errors import ExitCode
from tests.http_stub import QuietHandler, serving
from tests.server.test_adapters_pod import s3_libs  # noqa: F401  (a fixture: boto3 installed once)

WEIGHTS = bytes(range(256)) * 64
CONFIG = b'{"inputs": 1}'


@dataclass
class Bucket:
    url: str = ""
    objects: dict[str, bytes] = field(default_factory=lambda: {"m/model.onnx": WEIGHTS, "m/config.json": CONFIG})
    with_sha256: set[str] = field(default_factory=lambda: {"m/model.onnx"})  # stored with a ChecksumSHA256
    served: dict[str, bytes] = field(default_factory=dict)  # bytes sent instead of the object's own
    gets: list[tuple[str, str | None]] = field(default_factory=list)  # (key, x-amz-checksum-mode)


@pytest.fixture
def bucket() -> Iterator[Bucket]:
    state = Bucket()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            name, _, key = urllib.parse.unquote(url.path).lstrip("/").partition("/")
            query = urllib.parse.parse_qs(url.query)
            if name != "models":
                return self.reply(b"<Error><Code>NoSuchBucket</Code></Error>", "application/xml", 404)
            if not key:
                prefix = query.get("prefix", [""])[0]
                return self.reply(listing(state, prefix), "application/xml")
            if key not in state.objects:
                return self.reply(b"<Error><Code>NoSuchKey</Code></Error>", "application/xml", 404)
            state.gets.append((key, self.headers.get("x-amz-checksum-mode")))
            data = state.objects[key]
            body = state.served.get(key, data)
            self.send_response(200)
            self.send_header("Content-Type", "binary/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", f'"{hashlib.md5(data).hexdigest()}"')
            if key in state.with_sha256 and self.headers.get("x-amz-checksum-mode") == "ENABLED":
                self.send_header("x-amz-checksum-sha256", base64.b64encode(hashlib.sha256(data).digest()).decode())
                self.send_header("x-amz-checksum-type", "FULL_OBJECT")
            self.end_headers()
            self.wfile.write(body)

    with serving(Handler) as server:
        state.url = f"http://127.0.0.1:{server.server_address[1]}"
        yield state


def listing(state: Bucket, prefix: str) -> bytes:
    contents = "".join(
        f"<Contents><Key>{html.escape(key)}</Key><Size>{len(data)}</Size>"
        f"<ETag>&quot;{hashlib.md5(data).hexdigest()}&quot;</ETag><StorageClass>STANDARD</StorageClass></Contents>"
        for key, data in sorted(state.objects.items())
        if key.startswith(prefix)
    )
    count = sum(key.startswith(prefix) for key in state.objects)
    return (
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>models</Name><Prefix>{html.escape(prefix)}</Prefix><KeyCount>{count}</KeyCount>"
        f"<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>{contents}</ListBucketResult>"
    ).encode()


def run_fetch(bucket: Bucket, dest: pathlib.Path, libs: pathlib.Path) -> subprocess.CompletedProcess[str]:
    home = dest.parent / "home"
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join([*sys.path, str(libs)]),
        "HOME": str(home),
        "AWS_CONFIG_FILE": str(home / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
        "AWS_ENDPOINT_URL": bucket.url,
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    command = [sys.executable, "-m", "model_server.storage", "s3://models/m", str(dest)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


def files(dest: pathlib.Path) -> dict[str, bytes]:
    return {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}


def test_boto3_fetch_asks_for_checksums_keeps_what_matches_and_removes_the_rest(
    bucket: Bucket,
    tmp_path: pathlib.Path,
    s3_libs: pathlib.Path,  # noqa: F811
) -> None:
    dest = tmp_path / "cache" / "m"
    first = run_fetch(bucket, dest, s3_libs)
    assert first.returncode == 0, first.stderr[-2000:]
    assert files(dest) == {"model.onnx": WEIGHTS, "config.json": CONFIG}
    assert sorted(bucket.gets) == [("m/config.json", "ENABLED"), ("m/model.onnx", "ENABLED")]

    bucket.gets.clear()
    again = run_fetch(bucket, dest, s3_libs)
    assert again.returncode == 0, again.stderr[-2000:]
    assert bucket.gets == []  # both proved by their MD5 ETags

    (dest / "model.onnx").write_bytes(WEIGHTS[::-1])  # another source's copy, the same size
    (dest / "custom_op.py").write_bytes(b"import os")
    planted = run_fetch(bucket, dest, s3_libs)
    assert planted.returncode == 0, planted.stderr[-2000:]
    assert files(dest) == {"model.onnx": WEIGHTS, "config.json": CONFIG}
    assert [key for key, _ in bucket.gets] == ["m/model.onnx"]


@pytest.mark.parametrize("key", ["m/model.onnx", "m/config.json"])
def test_boto3_download_that_does_not_match_is_refused(
    bucket: Bucket,
    tmp_path: pathlib.Path,
    s3_libs: pathlib.Path,  # noqa: F811
    key: str,
) -> None:
    """model.onnx against its ChecksumSHA256 (botocore checks it too as the body streams),
    config.json against its MD5 ETag: same-size other bytes are not served."""
    bucket.served[key] = bucket.objects[key][::-1]
    dest = tmp_path / "m"
    result = run_fetch(bucket, dest, s3_libs)
    assert result.returncode == ExitCode.CHECKSUM, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert key.removeprefix("m/") not in files(dest)
