"""The Prometheus client: answers, retries, auth and TLS, against fake and real HTTP servers."""

from __future__ import annotations

import json
import math
import shutil
import ssl
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from inference_operator.prometheus.client import (
    PrometheusClient,
    PrometheusError,
    Sample,
    parse_response,
)
from tests.http_stub import QuietHandler, serving


def vector(*values: str, ts: float = 1700000000.5) -> dict:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {}, "value": [ts, v]} for v in values]},
    }


def test_autoscaler_parse_vector_scalar_empty_and_special_values() -> None:
    assert parse_response(vector("41.5")) == Sample(41.5, 1700000000.5)
    assert parse_response(vector()) is None
    assert parse_response({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "7"]}}) == Sample(
        7.0, 1.0
    )
    assert math.isnan(parse_response(vector("NaN")).value)
    assert parse_response(vector("+Inf")).value == math.inf
    # Several series: the largest finite one (errs towards scaling up).
    assert parse_response(vector("3", "NaN", "9", "1")).value == 9.0


def test_autoscaler_parse_errors() -> None:
    with pytest.raises(PrometheusError, match="bad_data"):
        parse_response({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(PrometheusError, match="matrix"):
        parse_response({"status": "success", "data": {"resultType": "matrix", "result": []}})


@pytest.mark.parametrize(
    "data",
    [
        {"resultType": "scalar", "result": None},
        {"resultType": "scalar", "result": [1.0]},
        {"resultType": "scalar", "result": [1.0, "not a number"]},
        {"resultType": "vector", "result": [{"metric": {}}]},
        {"resultType": "vector", "result": [{"value": None}]},
        {"resultType": "vector", "result": 7},
    ],
)
def test_autoscaler_parse_malformed_answer_is_a_prometheus_error(data: dict) -> None:
    # The loop turns PrometheusError into an observation with an error; anything else would escape it.
    with pytest.raises(PrometheusError, match="malformed"):
        parse_response({"status": "success", "data": data})


class Script:
    """A fake Prometheus that answers from a list of (status, body) and records requests."""

    def __init__(self, *answers: tuple[int, dict | list | str] | Exception):
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        status, body = answer
        if isinstance(body, dict | list):
            return httpx.Response(status, json=body)
        return httpx.Response(status, text=body)


def client(script: Script, **kw) -> PrometheusClient:
    return PrometheusClient("http://prom:9090/", transport=httpx.MockTransport(script), backoff=0, **kw)


async def test_autoscaler_client_sends_query_and_token() -> None:
    script = Script((200, vector("12")))
    async with client(script, token="s3cret") as prom:
        assert (await prom.query('sum(up{job="x"})')).value == 12.0
    (request,) = script.requests
    assert request.url.path == "/api/v1/query"
    assert request.url.params["query"] == 'sum(up{job="x"})'
    assert request.headers["Authorization"] == "Bearer s3cret"


async def test_autoscaler_client_retries_what_retrying_can_fix() -> None:
    script = Script(httpx.ConnectError("refused"), (503, "busy"), (200, vector("5")))
    async with client(script, retries=2) as prom:
        assert (await prom.query("up")).value == 5.0
    assert len(script.requests) == 3


async def test_autoscaler_client_gives_up_after_retries() -> None:
    script = Script(httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), (502, "bad gateway"))
    async with client(script, retries=2) as prom:
        with pytest.raises(PrometheusError, match="502"):
            await prom.query("up")
    assert len(script.requests) == 3


async def test_autoscaler_client_does_not_retry_a_rejected_query() -> None:
    script = Script((400, {"status": "error", "errorType": "bad_data", "error": "parse error"}))
    async with client(script, retries=3) as prom:
        with pytest.raises(PrometheusError, match="bad_data") as refused:
            await prom.query("sum(")
    assert "parse error" not in str(refused.value)  # Prometheus' words are the server's, not ours
    assert len(script.requests) == 1


SECRET = "AKIA-node-role-SECRET"


@pytest.mark.parametrize(
    "answer",
    [
        (200, {"Code": "Success", "AccessKeyId": SECRET}),  # an instance metadata service
        (200, {"status": "error", "errorType": SECRET, "error": SECRET}),
        (200, {"status": "success", "data": {"resultType": SECRET, "result": SECRET}}),
        (200, {"status": "success", "data": {"resultType": "vector", "result": [{"value": [SECRET, SECRET]}]}}),
        (200, [SECRET]),
        (400, {"status": "error", "errorType": "bad_data", "error": SECRET}),
        (200, SECRET),
        (404, SECRET),
        (500, SECRET),
    ],
)
async def test_what_the_url_answers_never_appears_in_an_error(answer) -> None:
    """SSRF: prometheusUrl is the InferenceService author's. Whatever answers there, the error
    (which goes to status, events and logs) names what failed and never quotes the answer."""
    async with client(Script(answer), retries=0) as prom:
        with pytest.raises(PrometheusError) as failed:
            await prom.query("up")
    assert SECRET not in str(failed.value)
    assert len(str(failed.value)) < 200


async def test_autoscaler_client_reports_auth_failure_without_retrying() -> None:
    script = Script((401, "unauthorized"))
    async with client(script, retries=3) as prom:
        with pytest.raises(PrometheusError, match="401"):
            await prom.query("up")
    assert len(script.requests) == 1


async def test_autoscaler_client_times_out_against_a_silent_server() -> None:
    import socket

    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        async with PrometheusClient(f"http://127.0.0.1:{port}", timeout=0.2, retries=1, backoff=0) as prom:
            with pytest.raises(PrometheusError, match="unreachable"):
                await prom.query("up")


@pytest.fixture(scope="module")
def tls_prometheus(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """A fake Prometheus on https://127.0.0.1 with a self-signed certificate: (url, ca_pem)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            self.reply(json.dumps(vector("3")).encode())

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with serving(Handler, tls=context) as server:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert.read_text()


async def test_autoscaler_client_trusts_the_given_ca(tls_prometheus) -> None:
    url, ca_pem = tls_prometheus
    async with PrometheusClient(url, ca_pem=ca_pem, retries=0) as prom:
        assert (await prom.query("up")).value == 3.0
    async with PrometheusClient(url, retries=0) as prom:
        with pytest.raises(PrometheusError, match="unreachable"):
            await prom.query("up")
