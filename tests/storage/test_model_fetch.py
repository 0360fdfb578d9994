"""The init container's model fetch: HTTP(S) for real on loopback, S3 through a stand-in client."""

from __future__ import annotations

import functools
import http.server
import pathlib
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from model_server.storage import FetchError, fetch_s3


@pytest.fixture
def file_server(tmp_path: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()


def run_fetch(uri: str, dest: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "model_server.storage", uri, str(dest)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_http_model_lands_whole(file_server, tmp_path: pathlib.Path) -> None:
    url, root = file_server
    payload = bytes(range(256)) * 8192  # 2 MiB: more than one chunk
    (root / "model.onnx").write_bytes(payload)
    dest = tmp_path / "models"
    result = run_fetch(f"{url}/model.onnx", dest)
    assert result.returncode == 0, result.stderr
    assert (dest / "model.onnx").read_bytes() == payload
    assert [p.name for p in dest.iterdir()] == ["model.onnx"]  # no .part left behind


def test_http_error_fails_clearly_and_leaves_nothing(file_server, tmp_path: pathlib.Path) -> None:
    url, _ = file_server
    dest = tmp_path / "models"
    result = run_fetch(f"{url}/missing.onnx", dest)
    assert result.returncode == 1
    assert "HTTP 404" in result.stderr
    assert list(dest.iterdir()) == []


def test_uri_without_a_file_name_is_refused(tmp_path: pathlib.Path) -> None:
    result = run_fetch("http://127.0.0.1:9/models/", tmp_path)  # refused before any request
    assert result.returncode == 1
    assert "must name a file" in result.stderr


class StandInS3:
    """The two calls fetch_s3 makes, over a dict of key → bytes, paginated by two."""

    def __init__(self, objects: dict[str, bytes]):
        self.objects = objects

    def get_paginator(self, operation: str):
        assert operation == "list_objects_v2"
        objects = self.objects

        class Paginator:
            def paginate(self, Bucket: str, Prefix: str):  # noqa: N803 (boto3's names)
                keys = sorted(k for k in objects if k.startswith(Prefix))
                for i in range(0, len(keys), 2):
                    yield {"Contents": [{"Key": k} for k in keys[i : i + 2]]}

        return Paginator()

    def download_file(self, bucket: str, key: str, filename: str) -> None:
        pathlib.Path(filename).write_bytes(self.objects[key])


def test_s3_prefix_keeps_the_version_layout(tmp_path: pathlib.Path) -> None:
    client = StandInS3(
        {
            "models/resnet/1/model.onnx": b"v1",
            "models/resnet/2/model.onnx": b"v2",
            "models/resnet/2/": b"",  # a "directory" marker
            "models/other/1/model.onnx": b"no",
        }
    )
    files = fetch_s3("s3://bucket/models/resnet/", tmp_path, client)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in files) == ["1/model.onnx", "2/model.onnx"]
    assert (tmp_path / "2" / "model.onnx").read_bytes() == b"v2"


def test_s3_single_object_and_errors(tmp_path: pathlib.Path) -> None:
    client = StandInS3({"m/model.onnx": b"x", "evil/../../etc": b"x"})
    assert fetch_s3("s3://b/m/model.onnx", tmp_path, client) == [tmp_path / "model.onnx"]
    with pytest.raises(FetchError, match="no objects"):
        fetch_s3("s3://b/nothing/", tmp_path, client)
    with pytest.raises(FetchError, match="leaves the model directory"):
        fetch_s3("s3://b/evil/", tmp_path, client)
