"""The init container's model fetch: HTTP(S) for real on loopback, S3 through a stand-in client.

Hostile sources are part of the cases: paths that leave the destination, redirects to plain
http or to other hosts, HTML pages under a model's name, endless trickles, oversized answers
and wrong checksums. Each must end in its own exit code with nothing half-written.
"""

from __future__ import annotations

import hashlib
import io
import pathlib
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from model_fetcher import cli
from model_fetcher.errors import ExitCode, FetchError
from model_fetcher.limits import Limits, parse_size
from model_fetcher.s3 import fetch_s3
from model_fetcher.web import check_redirect, fetch_http
from tests.http_stub import QuietHandler, serving
from tests.storage.fetch_failures import fetch_fails

PAYLOAD = bytes(range(256)) * 8192  # 2 MiB: more than one chunk


class Site(QuietHandler):
    """Routes by path: files, redirects, an HTML page, a trickle, an answer without a length."""

    files: dict[str, bytes] = {}
    redirects: dict[str, str] = {}

    def do_GET(self) -> None:
        if self.path in self.redirects:
            self.send_response(302)
            self.send_header("Location", self.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/login/model.onnx":
            self.reply(b"<!DOCTYPE html><html><body>Sign in</body></html>", "text/html; charset=utf-8")
        elif self.path == "/disguised/model.onnx":
            self.reply(b"\n  <html><head><title>Not found</title></head></html>", "application/octet-stream")
        elif self.path == "/trickle/model.onnx":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            try:
                for _ in range(600):
                    self.wfile.write(b"\x08")
                    self.wfile.flush()
                    time.sleep(0.5)
            except OSError:
                pass
        elif self.path == "/unsized/model.onnx":  # no Content-Length: the cap must act mid-stream
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(PAYLOAD)
        elif self.path in self.files:
            self.reply(self.files[self.path], "application/octet-stream")
        else:
            self.reply(b"not found", "text/plain", status=404)


@pytest.fixture
def site() -> Iterator[str]:
    class Handler(Site):
        files = {"/model.onnx": PAYLOAD, "/m/v2/model.onnx": b"onnx-bytes"}
        redirects: dict[str, str] = {}

    with serving(Handler) as server:
        Handler.redirects = {
            "/moved/model.onnx": "/model.onnx",
            "/elsewhere/model.onnx": f"http://localhost:{server.server_address[1]}/model.onnx",
            "/loop/model.onnx": "/loop/model.onnx",
        }
        yield f"http://127.0.0.1:{server.server_address[1]}"


def run_fetch(uri: str, dest: pathlib.Path, *flags: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "model_server.storage", uri, str(dest), *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def leftovers(dest: pathlib.Path) -> list[str]:
    return sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) if dest.exists() else []


def test_http_model_lands_whole(site: str, tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "models"
    result = run_fetch(f"{site}/model.onnx", dest, "--sha256", hashlib.sha256(PAYLOAD).hexdigest())
    assert result.returncode == 0, result.stderr
    assert (dest / "model.onnx").read_bytes() == PAYLOAD
    assert leftovers(dest) == ["model.onnx"]  # no .part left behind


def test_same_host_redirect_is_followed(site: str, tmp_path: pathlib.Path) -> None:
    assert fetch_http(f"{site}/moved/model.onnx", tmp_path) == [tmp_path / "model.onnx"]
    assert (tmp_path / "model.onnx").read_bytes() == PAYLOAD


@pytest.mark.parametrize(
    ("path", "flags", "code", "message"),
    [
        ("/missing.onnx", (), ExitCode.SOURCE, "HTTP 404"),
        ("/models/", (), ExitCode.USAGE, "must name a file"),
        ("/models/..", (), ExitCode.USAGE, "must name a file"),
        ("/login/model.onnx", (), ExitCode.NOT_A_MODEL, "text/html"),
        ("/disguised/model.onnx", (), ExitCode.NOT_A_MODEL, "HTML page"),
        ("/elsewhere/model.onnx", (), ExitCode.UNSAFE, "another host 'localhost'"),
        ("/loop/model.onnx", (), ExitCode.SOURCE, "redirects"),
        ("/model.onnx", ("--max-bytes", "1Mi"), ExitCode.TOO_LARGE, "size cap"),
        ("/unsized/model.onnx", ("--max-bytes", "1Mi"), ExitCode.TOO_LARGE, "size cap"),
        ("/model.onnx", ("--sha256", "0" * 64), ExitCode.CHECKSUM, "expected 0000"),
        ("/model.onnx", ("--sha256", "nope"), ExitCode.USAGE, "not a sha256"),
    ],
)
def test_http_failures_have_their_exit_code_and_leave_nothing(
    site: str, tmp_path: pathlib.Path, path: str, flags: tuple[str, ...], code: ExitCode, message: str
) -> None:
    dest = tmp_path / "models"
    result = run_fetch(site + path, dest, *flags)
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert leftovers(dest) == []


def test_a_trickle_ends_at_the_deadline(site: str, tmp_path: pathlib.Path) -> None:
    """One byte every half second would take five minutes: the fetch's own deadline (2 s) ends
    it, with its exit code, long before the run's bound would."""
    result = run_fetch(f"{site}/trickle/model.onnx", tmp_path / "models", "--deadline", "2", timeout=120)
    assert result.returncode == ExitCode.DEADLINE, result.stderr
    assert "deadline" in result.stderr
    assert leftovers(tmp_path / "models") == []


def test_limits_come_from_the_environment_too(site: str, tmp_path: pathlib.Path) -> None:
    env = {"MODEL_FETCH_MAX_BYTES": "1000", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "model_server.storage", f"{site}/model.onnx", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PYTHONPATH": ":".join(sys.path)},
        check=False,
    )
    assert result.returncode == ExitCode.TOO_LARGE, result.stderr


def test_sizes_parse() -> None:
    assert parse_size("200Gi") == 200 << 30
    assert parse_size("5M") == 5_000_000
    assert parse_size("1234") == 1234


# --- https redirects: a real TLS server on loopback, trusted through the client ----------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.cafile = str(cert)  # type: ignore[attr-defined]  # carried to the client below
    return context


def test_https_redirects_to_http_or_another_host_are_refused(
    site: str, tls: ssl.SSLContext, tmp_path: pathlib.Path
) -> None:
    plain = site

    class Handler(Site):
        files = {"/model.onnx": PAYLOAD}
        redirects: dict[str, str] = {}

    with serving(Handler, tls=tls) as server:
        port = server.server_address[1]
        Handler.redirects = {
            "/down/model.onnx": f"{plain}/model.onnx",
            "/away/model.onnx": f"https://localhost:{port}/model.onnx",
            "/same/model.onnx": "/model.onnx",
        }
        base = f"https://127.0.0.1:{port}"
        with httpx.Client(verify=ssl.create_default_context(cafile=tls.cafile)) as client:  # type: ignore[attr-defined]
            with fetch_fails(ExitCode.UNSAFE, match="https to plain http"):
                fetch_http(f"{base}/down/model.onnx", tmp_path, client)
            with fetch_fails(ExitCode.UNSAFE, match="another host"):
                fetch_http(f"{base}/away/model.onnx", tmp_path, client)
            assert leftovers(tmp_path) == []
            fetch_http(f"{base}/same/model.onnx", tmp_path, client)
            allowed = Limits(redirect_hosts=frozenset({"localhost"}))
            fetch_http(f"{base}/away/model.onnx", tmp_path / "b", client, allowed)
    assert (tmp_path / "model.onnx").read_bytes() == PAYLOAD == (tmp_path / "b" / "model.onnx").read_bytes()


def test_redirect_rules() -> None:
    limits = Limits(redirect_hosts=frozenset({"cdn.example"}))
    assert check_redirect("http://h/m", "http://h/m", "https://h/n", limits) == "https://h/n"
    assert check_redirect("https://h/m", "https://h/m", "https://cdn.example/x", limits) == "https://cdn.example/x"
    with fetch_fails(ExitCode.UNSAFE):
        check_redirect("https://h/m", "https://h/m", "http://cdn.example/x", limits)
    with fetch_fails(ExitCode.UNSAFE):
        check_redirect("https://h/m", "https://h/m", "https://h:8443/m", Limits())  # another port
    with fetch_fails(ExitCode.UNSAFE):
        check_redirect("https://h/m", "https://h/m", "file:///etc/passwd", limits)


# --- s3 -------------------------------------------------------------------------------------


class Body:
    def __init__(self, data: bytes):
        self._data = io.BytesIO(data)

    def iter_chunks(self, size: int) -> Iterator[bytes]:
        while chunk := self._data.read(size):
            yield chunk


class StandInS3:
    """The two calls fetch_s3 makes, over a dict of key → bytes, paginated by two.

    As S3 answers: each object's ETag is the MD5 of its bytes (a single-part upload) unless
    `etags` names another (a multipart upload's ends in -N); `headers` adds to an object's
    GetObject answer (ChecksumSHA256, ServerSideEncryption); `served` are bytes sent in place of
    an object's own (tampered with on the way)."""

    def __init__(self, objects: dict[str, bytes], content_types: dict[str, str] | None = None):
        self.objects = objects
        self.content_types = content_types or {}
        self.etags: dict[str, str] = {}
        self.headers: dict[str, dict[str, str]] = {}
        self.served: dict[str, bytes] = {}
        self.fetched: list[str] = []

    def etag(self, key: str) -> str:
        return f'"{self.etags.get(key) or hashlib.md5(self.objects[key]).hexdigest()}"'

    def get_paginator(self, operation: str) -> Any:
        assert operation == "list_objects_v2"
        store = self

        class Paginator:
            def paginate(self, Bucket: str, Prefix: str) -> Iterator[dict]:  # noqa: N803 (boto3's names)
                keys = sorted(k for k in store.objects if k.startswith(Prefix))
                for i in range(0, len(keys), 2):
                    page = keys[i : i + 2]
                    yield {"Contents": [{"Key": k, "Size": len(store.objects[k]), "ETag": store.etag(k)} for k in page]}

        return Paginator()

    def get_object(self, Bucket: str, Key: str, ChecksumMode: str = "") -> dict:  # noqa: N803
        self.fetched.append(Key)
        checksums = self.headers.get(Key, {}) if ChecksumMode == "ENABLED" else {}
        headers = {k: v for k, v in self.headers.get(Key, {}).items() if not k.startswith("Checksum")}
        return {
            "Body": Body(self.served.get(Key, self.objects[Key])),
            "ContentType": self.content_types.get(Key, "binary/octet-stream"),
            "ETag": self.etag(Key),
            **headers,
            **checksums,
        }


def relative(files: list[pathlib.Path], root: pathlib.Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in files)


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
    assert relative(files, tmp_path) == ["1/model.onnx", "2/model.onnx"]
    assert (tmp_path / "2" / "model.onnx").read_bytes() == b"v2"


def test_s3_prefix_matches_on_a_slash_boundary(tmp_path: pathlib.Path) -> None:
    client = StandInS3({"models/resnet/1/model.onnx": b"v1", "models/resnet-private/1/model.onnx": b"secret"})
    files = fetch_s3("s3://bucket/models/resnet", tmp_path, client)
    assert relative(files, tmp_path) == ["1/model.onnx"]
    assert client.fetched == ["models/resnet/1/model.onnx"]


def test_s3_single_object_and_errors(tmp_path: pathlib.Path) -> None:
    client = StandInS3({"m/model.onnx": b"x", "evil/../../etc": b"x"})
    assert fetch_s3("s3://b/m/model.onnx", tmp_path, client) == [tmp_path / "model.onnx"]
    with pytest.raises(FetchError, match="no objects"):
        fetch_s3("s3://b/nothing/", tmp_path, client)
    with fetch_fails(ExitCode.UNSAFE, match="leave the model directory"):
        fetch_s3("s3://b/evil/", tmp_path, client)


@pytest.mark.parametrize("key", ["m//etc/cron.d/x", "m/a/../../x", "m/./x", "m/a\\..\\x"])
def test_s3_keys_leaving_the_destination_write_nothing(tmp_path: pathlib.Path, key: str) -> None:
    """One bad key refuses the whole fetch before any file is written, even the good ones."""
    dest = tmp_path / "models"
    client = StandInS3({"m/1/model.onnx": b"fine", key: b"owned"})
    with fetch_fails(ExitCode.UNSAFE):
        fetch_s3("s3://b/m/", dest, client)
    assert client.fetched == []
    assert leftovers(tmp_path) == []


def test_s3_sidecar_checksums_and_size_cap(tmp_path: pathlib.Path) -> None:
    digest = hashlib.sha256(b"v1").hexdigest()
    good = StandInS3({"m/1/model.onnx": b"v1", "m/1/model.onnx.sha256": f"{digest}  model.onnx\n".encode()})
    assert relative(fetch_s3("s3://b/m", tmp_path / "a", good), tmp_path / "a") == ["1/model.onnx"]
    bad = StandInS3({"m/1/model.onnx": b"v1-tampered", "m/1/model.onnx.sha256": digest.encode()})
    with fetch_fails(ExitCode.CHECKSUM):
        fetch_s3("s3://b/m", tmp_path / "b", bad)
    assert leftovers(tmp_path / "b") == ["1"]  # the directory, never the file
    with fetch_fails(ExitCode.TOO_LARGE):
        fetch_s3("s3://b/m", tmp_path / "c", StandInS3({"m/model.onnx": b"x" * 100}), Limits(max_bytes=99))


def test_s3_html_object_is_not_a_model(tmp_path: pathlib.Path) -> None:
    client = StandInS3({"m/model.onnx": b"<html>error</html>"})
    with fetch_fails(ExitCode.NOT_A_MODEL):
        fetch_s3("s3://b/m/model.onnx", tmp_path, client)
    typed = StandInS3({"m/model.onnx": b"\x08\x01"}, {"m/model.onnx": "text/html"})
    with fetch_fails(ExitCode.NOT_A_MODEL):
        fetch_s3("s3://b/m/model.onnx", tmp_path, typed)
    assert leftovers(tmp_path) == []


def test_s3_uri_with_dot_dot_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    result = run_fetch("s3://bucket/models/..", tmp_path)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "code",
    [c for c in ExitCode if c not in (ExitCode.OK, ExitCode.DEADLINE, ExitCode.LOCAL_IO)],  # DEADLINE: os._exit
)
def test_the_exit_code_is_the_one_the_error_carries(
    code: ExitCode, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One error type for every failure: its code is the process's exit status and its words
    the termination message, whatever the kind."""

    def failing(uri: str, dest: pathlib.Path, limits: Limits) -> list[pathlib.Path]:
        raise FetchError(f"{uri}: it went wrong", code)

    monkeypatch.setattr(cli, "fetch", failing)
    monkeypatch.setenv(cli.ENV_TERMINATION_LOG, str(tmp_path / "termination-log"))
    assert cli.main(["https://models.example/model.onnx", str(tmp_path / "dest")]) == code
    assert (tmp_path / "termination-log").read_text() == (
        f"fetch failed (exit {int(code)}, {code.name.lower()}): https://models.example/model.onnx: it went wrong\n"
    )
