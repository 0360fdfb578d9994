"""s3:// into a cache claim's directory: only what the listing names, each file checked.

S3 publishes an ETag per object (the MD5 of the bytes for a single-part upload without SSE-KMS
or SSE-C; a multipart upload's ends in -N and says nothing checkable about the content) and,
for an object stored with one, a ChecksumSHA256 (returned when asked with ChecksumMode). A file
already in the destination is kept when its size and a published digest match; every download
is checked against each digest S3 gives with it.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import pathlib
from collections.abc import Iterator

import pytest

from model_fetcher import cache
from model_fetcher.cache import exclusive
from model_fetcher.errors import ExitCode
from model_fetcher.limits import Limits
from model_fetcher.s3 import fetch_s3
from tests.storage.fetch_failures import fetch_fails
from tests.storage.test_model_fetch import StandInS3

WEIGHTS = bytes(range(256)) * 16
OBJECTS = {"m/1/model.onnx": WEIGHTS, "m/config.json": b'{"a": 1}'}


def served(dest: pathlib.Path) -> dict[str, bytes]:
    return {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}


def sha256_header(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def test_a_planted_file_of_the_same_size_is_replaced_and_extra_files_removed(tmp_path: pathlib.Path) -> None:
    """Another service's fetch of the same s3:// URI from its own endpoint left these here."""
    dest = tmp_path / "s3" / "bucket" / "m"
    (dest / "1").mkdir(parents=True)
    (dest / "1" / "model.onnx").write_bytes(WEIGHTS[::-1])
    (dest / "config.json").write_bytes(OBJECTS["m/config.json"])  # the right bytes: kept
    (dest / "2").mkdir()
    (dest / "2" / "model.onnx").write_bytes(b"a version the bucket does not have")
    (dest / "custom_op.py").write_bytes(b"import os")
    client = StandInS3(dict(OBJECTS))
    fetch_s3("s3://bucket/m", dest, client)
    assert served(dest) == {"1/model.onnx": WEIGHTS, "config.json": OBJECTS["m/config.json"]}
    assert client.fetched == ["m/1/model.onnx"]


def test_files_that_match_their_etag_are_not_downloaded_again(tmp_path: pathlib.Path) -> None:
    client = StandInS3(dict(OBJECTS))
    fetch_s3("s3://bucket/m", tmp_path, client)
    client.fetched.clear()
    fetch_s3("s3://bucket/m", tmp_path, client)
    assert client.fetched == []
    # The object changed in the bucket: the new one is downloaded.
    client.objects["m/1/model.onnx"] = WEIGHTS[::-1]
    fetch_s3("s3://bucket/m", tmp_path, client)
    assert client.fetched == ["m/1/model.onnx"]
    assert served(tmp_path)["1/model.onnx"] == WEIGHTS[::-1]


def test_a_multipart_object_is_downloaded_each_time_and_checked_by_its_sha256(tmp_path: pathlib.Path) -> None:
    """A multipart ETag is no MD5: without a ChecksumSHA256 or a .sha256 object nothing proves
    the cached copy is the object, so it is fetched again (as every S3 fetch was before)."""
    client = StandInS3({"m/model.onnx": WEIGHTS})
    client.etags["m/model.onnx"] = "0123456789abcdef0123456789abcdef-3"
    for _ in range(2):
        fetch_s3("s3://bucket/m/model.onnx", tmp_path, client)
    assert client.fetched == ["m/model.onnx"] * 2
    client.headers["m/model.onnx"] = {"ChecksumSHA256": sha256_header(WEIGHTS), "ChecksumType": "FULL_OBJECT"}
    client.served["m/model.onnx"] = WEIGHTS[::-1]
    with fetch_fails(ExitCode.CHECKSUM, match="sha256"):
        fetch_s3("s3://bucket/m/model.onnx", tmp_path / "again", client)
    assert served(tmp_path / "again") == {}


@pytest.fixture
def tampered() -> Iterator[StandInS3]:
    client = StandInS3(dict(OBJECTS))
    client.served["m/1/model.onnx"] = WEIGHTS[::-1]  # same size, other bytes
    yield client


def test_a_download_that_does_not_match_its_md5_etag_is_refused(tmp_path: pathlib.Path, tampered: StandInS3) -> None:
    with fetch_fails(ExitCode.CHECKSUM, match="md5"):
        fetch_s3("s3://bucket/m", tmp_path, tampered)
    assert "1/model.onnx" not in served(tmp_path)


def test_etags_that_are_no_md5_are_not_held_against_a_download(tmp_path: pathlib.Path, tampered: StandInS3) -> None:
    """SSE-KMS and SSE-C objects have ETags that are not the MD5 of their bytes; a composite
    checksum covers parts, not the object: refusing on them would refuse good models."""
    for headers in (
        {"ServerSideEncryption": "aws:kms"},
        {"SSECustomerAlgorithm": "AES256"},
        {
            "ServerSideEncryption": "aws:kms",
            "ChecksumSHA256": sha256_header(WEIGHTS) + "-3",
            "ChecksumType": "COMPOSITE",
        },
    ):
        tampered.headers["m/1/model.onnx"] = headers
        dest = tmp_path / str(len(list(tmp_path.iterdir())))
        fetch_s3("s3://bucket/m", dest, tampered)
        assert served(dest)["1/model.onnx"] == WEIGHTS[::-1]


def test_a_sha256_object_still_decides_and_an_expected_digest_reuses_the_file(tmp_path: pathlib.Path) -> None:
    digest = hashlib.sha256(WEIGHTS).hexdigest()
    client = StandInS3({"m/model.onnx": WEIGHTS, "m/model.onnx.sha256": f"{digest}  model.onnx\n".encode()})
    client.etags["m/model.onnx"] = "0123456789abcdef0123456789abcdef-2"
    fetch_s3("s3://bucket/m", tmp_path, client)
    fetch_s3("s3://bucket/m", tmp_path, client)
    assert client.fetched.count("m/model.onnx") == 1  # the second time the .sha256 object proved it
    assert served(tmp_path) == {"model.onnx": WEIGHTS}  # the .sha256 object is read, never served
    single = StandInS3({"m/model.onnx": WEIGHTS})
    single.etags["m/model.onnx"] = "0123456789abcdef0123456789abcdef-2"
    fetch_s3("s3://bucket/m/model.onnx", tmp_path / "one", single, Limits(sha256=digest))
    fetch_s3("s3://bucket/m/model.onnx", tmp_path / "one", single, Limits(sha256=digest))
    assert single.fetched == ["m/model.onnx"]


def test_a_checksum_error_while_reading_is_a_checksum_failure(tmp_path: pathlib.Path) -> None:
    """boto3 checks a full-object checksum it was sent as the body streams; its error is ours."""

    class FlexibleChecksumError(Exception):
        pass

    class Failing:
        def iter_chunks(self, size: int) -> Iterator[bytes]:
            yield b"\x08"
            raise FlexibleChecksumError("Expected checksum X did not match calculated checksum Y")

    class Dropping:
        def iter_chunks(self, size: int) -> Iterator[bytes]:
            raise ConnectionResetError("reset by peer")

    for body, code in ((Failing(), ExitCode.CHECKSUM), (Dropping(), ExitCode.SOURCE)):
        client = StandInS3({"m/model.onnx": WEIGHTS})
        client.get_object = lambda Bucket, Key, ChecksumMode="", body=body: {"Body": body}  # type: ignore[method-assign]  # noqa: N803
        with fetch_fails(code):
            fetch_s3("s3://bucket/m/model.onnx", tmp_path / code.name, client)
        assert served(tmp_path / code.name) == {}


def test_a_fetch_waits_for_the_one_under_way_within_its_deadline(tmp_path: pathlib.Path) -> None:
    client = StandInS3(dict(OBJECTS))
    with exclusive(tmp_path, Limits()), fetch_fails(ExitCode.DEADLINE):
        fetch_s3("s3://bucket/m", tmp_path, client, Limits(deadline_seconds=0.5))
    assert client.fetched == []
    fetch_s3("s3://bucket/m", tmp_path, client)  # the lock is gone with its holder
    assert served(tmp_path) == {"1/model.onnx": WEIGHTS, "config.json": OBJECTS["m/config.json"]}


def test_a_filesystem_without_locks_still_fetches(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failure = OSError(errno.ENOLCK, "No locks available")

    def flock(fd: int, operation: int) -> None:
        raise failure

    monkeypatch.setattr(cache.fcntl, "flock", flock)
    fetch_s3("s3://bucket/m", tmp_path, StandInS3(dict(OBJECTS)))
    assert served(tmp_path) == {"1/model.onnx": WEIGHTS, "config.json": OBJECTS["m/config.json"]}
    assert "no file locks here (ENOLCK)" in caplog.text
    failure = PermissionError(errno.EACCES, "Permission denied")
    with pytest.raises(PermissionError):  # any other failure is one (exit 8, local I/O)
        fetch_s3("s3://bucket/m", tmp_path / "other", StandInS3(dict(OBJECTS)))
