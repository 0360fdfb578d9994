"""The adapters sidecar against a stand-in of vLLM's adapter endpoints, and vLLM's guard."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest

from adapters_sidecar import desired as desired_module
from adapters_sidecar import guard as vllm_guard
from adapters_sidecar import process as process_module
from adapters_sidecar import sidecar as sidecar_module
from adapters_sidecar.desired import Load, Unload, adapter_dir, plan, read_desired
from adapters_sidecar.sidecar import Engine, Sidecar
from model_fetcher.errors import FetchError
from model_fetcher.limits import Limits
from tests.http_stub import QuietHandler, serving
from testsupport.processes import free_port, running, stop, wait_http

BASE = "tiny"


class FakeVllm:
    """vLLM's /v1/models, /v1/load_lora_adapter and /v1/unload_lora_adapter, in memory."""

    def __init__(self) -> None:
        self.loaded: dict[str, str] = {}
        self.refuse: dict[str, str] = {}
        self.up = True

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("connection refused")
        if request.url.path == "/v1/models":
            cards = [{"id": BASE, "root": "/mnt/models", "parent": None}]
            cards += [{"id": name, "root": path, "parent": BASE} for name, path in self.loaded.items()]
            return httpx.Response(200, json={"object": "list", "data": cards})
        body = json.loads(request.content)
        name = body["lora_name"]
        if request.url.path == "/v1/load_lora_adapter":
            if name in self.refuse:
                return httpx.Response(400, json={"error": {"message": self.refuse[name], "code": 400}})
            if name in self.loaded and not body.get("load_inplace"):
                return httpx.Response(400, json={"error": {"message": f"'{name}' has already been loaded"}})
            self.loaded[name] = body["lora_path"]
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")
        if request.url.path == "/v1/unload_lora_adapter":
            if self.loaded.pop(name, None) is None:
                return httpx.Response(404, json={"error": {"message": f"'{name}' not found"}})
            return httpx.Response(200, text="removed")
        return httpx.Response(404)


class EndpointConnectionError(Exception):
    """What botocore raises, as far as the sidecar can see: exceptions of its own hierarchy."""


class ClientError(Exception):
    pass


class NoCredentialsError(Exception):
    pass


BOTO_ERRORS: dict[str, Exception] = {
    "s3://corp-adapters/team-a/unreachable": EndpointConnectionError(
        'Could not connect to the endpoint URL: "http://10.20.30.40:9000/corp-adapters?list-type=2&prefix=team-a%2F"'
    ),
    "s3://corp-adapters/team-a/nobucket": ClientError(
        "An error occurred (NoSuchBucket) when calling the ListObjectsV2 operation: The specified bucket "
        "does not exist: corp-adapters/team-a/nobucket"
    ),
    "s3://corp-adapters/team-a/denied": ClientError(
        "An error occurred (AccessDenied) when calling the ListObjectsV2 operation: Access Denied " + "x" * 5000
    ),
    "s3://corp-adapters/team-a/nocreds": NoCredentialsError("Unable to locate credentials"),
}


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The fetcher's `fetch`, writing an adapter's files (or failing for hf://org/missing); the URIs asked."""
    asked: list[str] = []

    def fetch(uri: str, dest: pathlib.Path, limits: Limits | None = None) -> list[pathlib.Path]:
        asked.append(uri)
        if uri in BOTO_ERRORS:
            raise BOTO_ERRORS[uri]
        if uri.endswith("/missing"):
            raise FetchError(f"{uri}: RepositoryNotFoundError: 404")
        if uri.endswith("/html"):
            (dest / "index.html").write_text("<html>")
            return [dest / "index.html"]
        (dest / "adapter_config.json").write_text(json.dumps({"uri": uri}))
        return [dest / "adapter_config.json"]

    monkeypatch.setattr(sidecar_module, "fetch", fetch)
    return asked


class Pod:
    def __init__(self, root: pathlib.Path) -> None:
        self.vllm = FakeVllm()
        self.desired = root / "adapters.json"
        self.dir = root / "adapters"
        self.dir.mkdir()
        engine = Engine("http://vllm", transport=httpx.MockTransport(self.vllm))
        self.sidecar = Sidecar(self.desired, self.dir, engine, Limits())

    def want(self, **adapters: str) -> None:
        self.desired.write_text(json.dumps({"adapters": [{"name": n, "uri": u} for n, u in adapters.items()]}))

    def step(self) -> None:
        asyncio.run(self.sidecar.step())

    def states(self) -> dict[str, tuple[str, str]]:
        return {a["name"]: (a["state"], a.get("reason", "")) for a in self.sidecar.status()["adapters"]}


@pytest.fixture
def pod(tmp_path: pathlib.Path, fetched: list[str]) -> Pod:
    return Pod(tmp_path)


def test_the_list_is_fetched_and_loaded_and_reported(pod: Pod, fetched: list[str]) -> None:
    pod.want(sql="hf://org/sql", chat="s3://bucket/chat")
    assert not pod.sidecar.ready()
    pod.step()
    assert pod.vllm.loaded == {
        "sql": str(adapter_dir(pod.dir, "sql", "hf://org/sql")),
        "chat": str(adapter_dir(pod.dir, "chat", "s3://bucket/chat")),
    }
    assert pod.states() == {"sql": ("Ready", ""), "chat": ("Ready", "")}
    assert pod.sidecar.ready() and fetched == ["hf://org/sql", "s3://bucket/chat"]
    pod.step()  # nothing left to do: no second fetch or load
    assert fetched == ["hf://org/sql", "s3://bucket/chat"]


def test_a_removed_adapter_is_unloaded_and_its_files_removed(pod: Pod) -> None:
    pod.want(sql="hf://org/sql", chat="hf://org/chat")
    pod.step()
    pod.want(chat="hf://org/chat")
    pod.step()
    assert set(pod.vllm.loaded) == {"chat"} and set(pod.states()) == {"chat"}
    assert [p.name for p in pod.dir.iterdir()] == [adapter_dir(pod.dir, "chat", "hf://org/chat").name]


def test_a_changed_uri_is_loaded_in_place_and_the_old_files_go(pod: Pod) -> None:
    pod.want(sql="hf://org/sql@v1")
    pod.step()
    pod.want(sql="hf://org/sql@v2")
    pod.step()
    new = adapter_dir(pod.dir, "sql", "hf://org/sql@v2")
    assert pod.vllm.loaded == {"sql": str(new)} and pod.states() == {"sql": ("Ready", "")}
    assert [p.name for p in pod.dir.iterdir()] == [new.name]


def test_a_failed_fetch_is_reported_settles_readiness_and_is_retried_later(
    pod: Pod, fetched: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pod.want(sql="hf://org/sql", bad="hf://org/missing", page="hf://org/html")
    pod.step()
    states = pod.states()
    assert states["sql"] == ("Ready", "")
    assert states["bad"][0] == "Failed" and "RepositoryNotFoundError" in states["bad"][1]
    assert states["page"][0] == "Failed" and "no adapter_config.json" in states["page"][1]
    assert set(pod.vllm.loaded) == {"sql"}
    assert not any(p.name.endswith(".partial") for p in pod.dir.iterdir())  # nothing half-fetched is left
    assert pod.sidecar.ready()  # settled: a bad adapter must not keep the replica out of its Service
    pod.step()
    assert fetched.count("hf://org/missing") == 1  # not again before the retry delay
    monkeypatch.setattr(desired_module, "RETRY_SECONDS", 0.0)
    pod.step()
    assert fetched.count("hf://org/missing") == 2


def test_s3_errors_fail_their_adapter_only_with_a_bounded_reason_that_names_no_bucket_or_endpoint(
    pod: Pod,
) -> None:
    names = {uri.rsplit("/", 1)[1]: uri for uri in BOTO_ERRORS}
    pod.want(sql="hf://org/sql", **names)
    pod.step()  # raises nothing
    states = pod.states()
    assert states.pop("sql") == ("Ready", "") and set(pod.vllm.loaded) == {"sql"}
    expected = {
        "unreachable": "EndpointConnectionError",
        "nobucket": "NoSuchBucket",
        "denied": "AccessDenied",
        "nocreds": "NoCredentialsError: Unable to locate credentials",
    }
    for name, (state, reason) in states.items():
        assert state == "Failed" and expected[name] in reason, reason
        assert len(reason) <= sidecar_module.REASON_LENGTH
        assert not any(leak in reason for leak in ("corp-adapters", "team-a", "10.20.30.40", "://")), reason
    pod.want(sql="hf://org/sql", chat="hf://org/chat", **names)  # the sidecar goes on with the next list
    pod.step()
    assert set(pod.vllm.loaded) == {"sql", "chat"}


def test_vllms_refusal_is_the_reason(pod: Pod) -> None:
    pod.vllm.refuse["big"] = "LoRA rank 64 is greater than max_lora_rank 16."
    pod.want(big="hf://org/big")
    pod.step()
    state, reason = pod.states()["big"]
    assert state == "Failed" and reason == "vLLM answered 400: LoRA rank 64 is greater than max_lora_rank 16."


def test_a_restarted_vllm_gets_its_adapters_again_without_a_new_download(pod: Pod, fetched: list[str]) -> None:
    pod.want(sql="hf://org/sql")
    pod.step()
    pod.vllm.up = False
    pod.step()
    assert pod.sidecar.status()["engine"] == "starting"
    pod.vllm.up, pod.vllm.loaded = True, {}  # a new vLLM process: no adapters
    pod.step()
    assert set(pod.vllm.loaded) == {"sql"} and fetched == ["hf://org/sql"]


def test_readiness_waits_for_the_first_list_only(pod: Pod) -> None:
    pod.vllm.up = False
    pod.want(sql="hf://org/sql")
    pod.step()
    assert not pod.sidecar.ready()  # vLLM is not up: nothing is loaded yet
    pod.vllm.up = True
    pod.step()
    assert pod.sidecar.ready()
    pod.vllm.up = False
    pod.want(sql="hf://org/sql", chat="hf://org/chat")  # added later, not loaded yet
    pod.step()
    assert pod.states()["chat"][0] == "Pending" and pod.sidecar.ready()


def test_a_broken_list_file_keeps_the_list(pod: Pod) -> None:
    pod.want(sql="hf://org/sql")
    pod.step()
    for text in ("{", '{"adapters": {}}', '{"adapters": [{"name": "a"}]}', "[]"):
        pod.desired.write_text(text)
        pod.step()
        assert set(pod.vllm.loaded) == {"sql"} and set(pod.states()) == {"sql"}


@pytest.mark.parametrize(
    "text",
    [
        '{"adapters": [{"name": "a", "uri": "hf://o/a"}, {"name": "a", "uri": "hf://o/b"}]}',
        '{"adapters": [{"name": 1, "uri": "hf://o/a"}]}',
        json.dumps({"adapters": [{"name": f"a{i}", "uri": "hf://o/a"} for i in range(65)]}),  # the CRD's 64
    ],
)
def test_read_desired_refuses_what_the_operator_never_writes(text: str) -> None:
    with pytest.raises(ValueError):
        read_desired(text)


def test_the_sidecar_checks_the_list_with_the_crds_own_rules() -> None:
    """Names go into paths: the sidecar holds the ConfigMap to the CRD's rules, which are the
    operator's (models/model.py); the two programs share no code, so this keeps them equal."""
    from inference_operator.models import AdapterSpec, InferenceServiceSpec

    crd = AdapterSpec.model_json_schema()["properties"]
    assert desired_module.NAME_PATTERN.pattern == crd["name"]["pattern"]
    assert desired_module.NAME_MAX_LENGTH == crd["name"]["maxLength"]
    assert desired_module.URI_PATTERN.pattern == crd["uri"]["pattern"]
    assert desired_module.URI_MAX_LENGTH == crd["uri"]["maxLength"]
    assert desired_module.MAX_ADAPTERS == InferenceServiceSpec.model_json_schema()["properties"]["adapters"]["maxItems"]


HOSTILE_NAMES = ["..", "*", "s*", "../../etc", "a/b", "", ".hidden", "x" * 64, "sql?", "[a]"]


def test_names_the_crd_refuses_are_never_used_and_uris_it_refuses_never_fetched(pod: Pod, fetched: list[str]) -> None:
    (pod.dir / "keep-me").mkdir()  # not an adapter's: a glob or a path from a name could reach it
    pod.want(sql="hf://org/sql")
    pod.step()
    entries = [{"name": name, "uri": "hf://org/evil"} for name in HOSTILE_NAMES]
    entries += [
        {"name": "sql", "uri": "hf://org/sql"},
        {"name": "web", "uri": "https://attacker.example/adapter"},
        {"name": "local", "uri": "file:///var/run/secrets/token"},
        {"name": "shout", "uri": "s3://Bad_Bucket/x"},
    ]
    pod.desired.write_text(json.dumps({"adapters": entries}))
    pod.step()
    states = pod.states()
    assert not set(HOSTILE_NAMES) & set(states)
    assert states.pop("sql") == ("Ready", "")
    assert {name: state for name, (state, _) in states.items()} == {
        "web": "Failed",
        "local": "Failed",
        "shout": "Failed",
    }
    assert all("uri refused" in reason and "attacker" not in reason for _, reason in states.values())
    assert fetched == ["hf://org/sql"] and set(pod.vllm.loaded) == {"sql"}
    assert sorted(p.name for p in pod.dir.iterdir()) == sorted(
        ["keep-me", adapter_dir(pod.dir, "sql", "hf://org/sql").name]
    )
    assert pod.sidecar.ready()  # refused ones are settled


def test_removing_an_adapter_leaves_another_whose_name_it_prefixes(pod: Pod) -> None:
    """sql and sql-v2: sql's files are sql-<digest>/, sql-v2's sql-v2-<digest>/."""
    pod.want(**{"sql": "hf://org/sql@v1", "sql-v2": "hf://org/sql2", "sql.": "hf://org/sql3"})
    pod.step()
    pod.want(**{"sql": "hf://org/sql@v2", "sql-v2": "hf://org/sql2", "sql.": "hf://org/sql3"})  # sql reloaded
    pod.step()
    pod.want(**{"sql-v2": "hf://org/sql2", "sql.": "hf://org/sql3"})  # sql removed
    pod.step()
    v2 = adapter_dir(pod.dir, "sql-v2", "hf://org/sql2")
    dot = adapter_dir(pod.dir, "sql.", "hf://org/sql3")
    assert sorted(p.name for p in pod.dir.iterdir()) == sorted([v2.name, dot.name])
    assert (v2 / "adapter_config.json").exists() and pod.vllm.loaded == {"sql-v2": str(v2), "sql.": str(dot)}


def test_plan_unloads_before_it_loads(tmp_path: pathlib.Path) -> None:
    served = {"old": "/x/old-1", "keep": str(adapter_dir(tmp_path, "keep", "hf://o/keep"))}
    actions = plan({"keep": "hf://o/keep", "new": "hf://o/new"}, served, {}, tmp_path, 0.0)
    assert actions == [Unload("old"), Load("new", "hf://o/new")]


def test_the_sidecar_answers_the_probes_and_the_operator(pod: Pod) -> None:
    pod.want(sql="hf://org/sql")

    async def exchange() -> dict[str, tuple[int, object]]:
        transport = httpx.ASGITransport(app=process_module.status_app(pod.sidecar))
        answers = {}
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
            for label in ("before", "after"):
                if label == "after":
                    await pod.sidecar.step()
                for path in ("/ready", "/adapters"):
                    got = await client.get(path)
                    answers[f"{label} {path}"] = (got.status_code, got.json())
            for path in ("/nothing", "/health/live"):
                got = await client.get(path)
                answers[path] = (got.status_code, got.text)
            got = await client.post("/adapters", json={"adapters": []})
            answers["post"] = (got.status_code, got.text)
        return answers

    answers = asyncio.run(exchange())
    assert answers["before /ready"][0] == 503
    assert answers["after /ready"] == (200, {"ready": True})
    status = answers["after /adapters"][1]
    assert isinstance(status, dict) and status["adapters"] == [
        {"name": "sql", "digest": desired_module.digest("hf://org/sql"), "state": "Ready"}
    ]
    assert answers["/nothing"][0] == 404 and answers["/health/live"][0] == 200
    assert answers["post"][0] == 405  # read-only: the list comes from the ConfigMap alone


def test_a_reason_hides_the_uris_parts_as_words_only(pod: Pod) -> None:
    pod.vllm.refuse["short"] = "failed to load hf://ai/x from /var/lib/ai/x: ai rank too high, see ai%2Fx"
    pod.want(short="hf://ai/x")
    pod.step()
    reason = pod.states()["short"][1]
    assert reason == "vLLM answered 400: failed to load <uri> from /var/lib/<uri>: <uri> rank too high, see <uri>"


def test_the_status_names_no_uri_or_bucket_path(pod: Pod) -> None:
    """Any pod that reaches the port may read /adapters: names, states and reasons only."""
    pod.want(sql="hf://private-org/sql-lora", chat="s3://corp-adapters/team-a/nobucket")
    pod.step()
    text = json.dumps(pod.sidecar.status())
    assert "Failed" in text and "NoSuchBucket" in text
    for leak in ("private-org", "sql-lora", "corp-adapters", "team-a", "://", str(pod.dir)):
        assert leak not in text, (leak, text)


@pytest.fixture
def sidecar_process(tmp_path: pathlib.Path) -> Iterator[str]:
    desired = tmp_path / "adapters.json"
    desired.write_text('{"adapters": [{"name": "sql", "uri": "hf://org/sql"}]}')
    port = free_port()
    command = [sys.executable, "-m", "model_server.adapters", f"--desired={desired}", f"--dir={tmp_path / 'a'}"]
    command += ["--engine=http://127.0.0.1:9", "--host=127.0.0.1", f"--port={port}"]
    with running(command, ready_url=f"http://127.0.0.1:{port}/health/live", timeout=30):
        yield f"127.0.0.1:{port}"


def _exchange(address: str, data: bytes, timeout: float = 30) -> bytes:
    """What the server answers to `data` before it closes the connection."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_the_status_port_bounds_header_size_and_time_like_the_model_servers(sidecar_process: str) -> None:
    """uvicorn's defaults held a connection whose headers never end, and any header size."""
    huge = b"GET /adapters HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 60_000 + b"\r\n\r\n"
    assert _exchange(sidecar_process, huge).startswith(b"HTTP/1.1 431 ")
    many = b"GET /adapters HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(500)) + b"\r\n"
    assert _exchange(sidecar_process, many).startswith(b"HTTP/1.1 431 ")
    # Headers that never end: answered 408 and closed (STATUS_LIMITS' header time), not held.
    stalled = _exchange(sidecar_process, b"GET /adapters HTTP/1.1\r\nHost: x\r\n")
    assert stalled.startswith(b"HTTP/1.1 408 "), stalled[:100]
    assert httpx.get(f"http://{sidecar_process}/health/live").status_code == 200


def test_removing_a_large_adapter_leaves_the_probes_answered(pod: Pod, monkeypatch: pytest.MonkeyPatch) -> None:
    """rmtree of a large adapter ran on the event loop, and the readiness probe (2 s, one
    failure) went unanswered meanwhile."""
    pod.want(sql="hf://org/sql")
    pod.step()
    removing, release, finished = threading.Event(), threading.Event(), threading.Event()
    real_rmtree = shutil.rmtree

    def slow_rmtree(path: pathlib.Path, ignore_errors: bool = False) -> None:
        removing.set()
        release.wait(5)  # a large adapter's files; released by the probe's answer below
        real_rmtree(path, ignore_errors)
        finished.set()

    monkeypatch.setattr(sidecar_module.shutil, "rmtree", slow_rmtree)

    async def scenario() -> bool:
        pod.want()
        step = asyncio.create_task(pod.sidecar.step())
        while not removing.is_set() and not step.done():
            await asyncio.sleep(0.01)
        transport = httpx.ASGITransport(app=process_module.status_app(pod.sidecar))
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
            assert (await client.get("/health/live")).status_code == 200
        answered_while_removing = not finished.is_set()
        release.set()
        await step
        return answered_while_removing

    assert asyncio.run(scenario())
    assert list(pod.dir.iterdir()) == [] and pod.vllm.loaded == {}


class TricklingHub:
    """A Hub that answers every request with a body that never ends, a byte at a time: no read
    ever times out, and the fetch lasts as long as its deadline."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.closed = threading.Event()
        self.asked = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                self.asked.set()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n")
                while not self.closed.wait(0.5):
                    conn.sendall(b" ")
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="a PID namespace needs root")
def test_the_sidecar_as_pid_1_stops_on_sigterm_while_a_fetch_is_under_way(tmp_path: pathlib.Path) -> None:
    """A fetch held the loop until it ended (up to --deadline): as PID 1 the sidecar ignored
    SIGTERM meanwhile and the pod waited for the kubelet's SIGKILL."""
    from tests.server.test_ms_pid1 import as_pid_1, seconds_to_exit

    hub = TricklingHub()
    desired = tmp_path / "adapters.json"
    desired.write_text('{"adapters": [{"name": "sql", "uri": "hf://org/sql"}]}')
    engine = FakeVllm()
    port = free_port()
    command = [sys.executable, "-m", "model_server.adapters", f"--desired={desired}", f"--dir={tmp_path / 'a'}"]
    command += ["--host=127.0.0.1", f"--port={port}", "--interval=0.2"]
    # `env` execs the sidecar: it is still the namespace's PID 1.
    command = ["env", f"HF_ENDPOINT={hub.url}", f"HF_HOME={tmp_path / 'hf'}", "HF_HUB_DISABLE_TELEMETRY=1", *command]

    class Models(QuietHandler):
        def do_GET(self) -> None:
            self.reply(engine(httpx.Request("GET", "http://vllm/v1/models")).content)

    try:
        with serving(Models) as vllm:
            command.append(f"--engine=http://127.0.0.1:{vllm.server_address[1]}")
            outer, pid = as_pid_1(command, tmp_path / "sidecar.log")
            try:
                wait_http(f"http://127.0.0.1:{port}/health/live", timeout=30, log=tmp_path / "sidecar.log")
                assert hub.asked.wait(30), (tmp_path / "sidecar.log").read_text()[-2000:]
                state = httpx.get(f"http://127.0.0.1:{port}/adapters").json()["adapters"][0]["state"]
                assert state == "Loading"
                took = seconds_to_exit(outer, pid, timeout=20)
            finally:
                if outer.poll() is None:
                    outer.kill()
                    outer.wait()
    finally:
        hub.close()
    print(f"sidecar stopped {took:.2f} s after SIGTERM, mid-fetch")
    assert outer.returncode == 0, (tmp_path / "sidecar.log").read_text()[-2000:]


def test_the_sidecar_process_serves_until_sigterm(tmp_path: pathlib.Path) -> None:
    """Started as the pod starts it: the guard in place and /health/live up, then a clean stop."""
    desired = tmp_path / "adapters.json"
    desired.write_text('{"adapters": [{"name": "sql", "uri": "hf://org/sql"}]}')
    port = free_port()
    command = [sys.executable, "-m", "model_server.adapters", f"--desired={desired}", f"--dir={tmp_path / 'a'}"]
    command += [f"--plugins={tmp_path / 'p'}", "--engine=http://127.0.0.1:9", "--host=127.0.0.1", f"--port={port}"]
    with running(command, ready_url=f"http://127.0.0.1:{port}/health/live", timeout=30) as process:
        assert (tmp_path / "p" / "rocm_inference_guard.py").exists()
        assert httpx.get(f"http://127.0.0.1:{port}/ready").status_code == 503  # vLLM is not there to load it
        assert stop(process) in (0, -15)


# --- the guard vLLM loads with --middleware ----------------------------------------------------


async def _through_guard(path: str, client: str, kind: str = "http") -> tuple[int | None, bool]:
    """(the status the guard answered or None, whether vLLM's app was reached)."""
    reached = []

    async def app(scope, receive, send) -> None:
        reached.append(scope["path"])

    sent: list[dict] = []

    async def send(message) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    guard = vllm_guard.LocalAdminOnly(app)
    await guard({"type": kind, "path": path, "client": (client, 5000)}, receive, send)
    status = next((m["status"] for m in sent if m["type"] == "http.response.start"), None)
    return status, bool(reached)


@pytest.mark.parametrize(
    "path", ["/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/adapters", "/adapters/sql", "/v1/LOAD_LoRA_x"]
)
def test_the_guard_refuses_adapter_management_from_outside_the_pod(path: str) -> None:
    assert asyncio.run(_through_guard(path, "10.244.0.7")) == (403, False)
    assert asyncio.run(_through_guard(path, "127.0.0.1")) == (None, True)


def test_the_guard_lets_inference_through_from_anywhere() -> None:
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/metrics", "/health"):
        assert asyncio.run(_through_guard(path, "10.244.0.7")) == (None, True)


def test_the_guard_closes_a_websocket_to_a_management_path() -> None:
    sent: list[dict] = []

    async def run() -> None:
        async def app(scope, receive, send) -> None:
            raise AssertionError("reached vLLM")

        async def send(message) -> None:
            sent.append(message)

        guard = vllm_guard.LocalAdminOnly(app)
        await guard({"type": "websocket", "path": "/adapters", "client": ("10.0.0.1", 1)}, None, send)

    asyncio.run(run())
    assert sent == [{"type": "websocket.close", "code": 1008}]


def test_the_installed_guard_imports_with_the_standard_library_alone(tmp_path: pathlib.Path) -> None:
    """It runs in vLLM's image, which has no model_server package."""
    target = process_module.install_guard(tmp_path / "plugins")
    check = "import rocm_inference_guard as g; print(g.LocalAdminOnly.__name__)"
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target.parent)!r}); {check}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0 and result.stdout.strip() == "LocalAdminOnly", result.stderr
