"""A pod's containers say why they failed where the kubelet reads it (terminationMessagePath),
so the pod's status, and the operator's InferenceService status, can name the cause: the model
fetch's one line, and the model server's load failure, after which it exits rather than sit
unready until its startup probe gives up."""

from __future__ import annotations

import http.server
import os
import pathlib
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from model_fetcher.cli import ENV_TERMINATION_LOG, TERMINATION_MESSAGE_BYTES, say_why


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def missing_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/models/model.onnx"
    finally:
        server.shutdown()
        server.server_close()


def test_a_failed_fetch_writes_one_line_on_why(missing_url: str, tmp_path: pathlib.Path) -> None:
    log = tmp_path / "termination-log"
    done = subprocess.run(
        [sys.executable, "-m", "model_server.storage", missing_url, str(tmp_path / "models")],
        env={**os.environ, ENV_TERMINATION_LOG: str(log)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert log.read_text() == f"fetch failed (exit 1, source): {missing_url}: HTTP 404\n"


def test_without_the_variable_nothing_is_written(tmp_path: pathlib.Path) -> None:
    say_why("fetch failed", environ={})
    assert list(tmp_path.iterdir()) == []


def test_the_line_is_bounded_and_single(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "termination-log"
    say_why("a\nb " + "x" * 5000, environ={ENV_TERMINATION_LOG: str(log)})
    text = log.read_text()
    assert text.startswith("a b xxx") and text.count("\n") == 1 and len(text) == TERMINATION_MESSAGE_BYTES + 1


def serve(model_dir: pathlib.Path, termination_log: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODEL_SERVER_")}
    env["MODEL_SERVER_TERMINATION_LOG"] = str(termination_log)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "model_server",
            "serve",
            "--model",
            str(model_dir),
            "--port",
            "0",
            "--host",
            "127.0.0.1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_model_that_does_not_load_ends_the_server_with_the_reason(tmp_path: pathlib.Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "model.onnx").write_bytes(b"this is not an onnx model")
    log = tmp_path / "termination-log"
    log.touch()  # the kubelet makes the file in every container
    done = serve(models, log)
    assert done.returncode == 3, done.stderr[-2000:]
    said = log.read_text()
    assert said.startswith("version 1 failed to load: ") and "INVALID_PROTOBUF" in said, said
    assert said.count("\n") == 1


def test_outside_a_pod_the_server_waits_for_the_files_to_change(tmp_path: pathlib.Path) -> None:
    """No termination-log file (not a container): the old behaviour, unready and still running."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "model.onnx").write_bytes(b"this is not an onnx model")
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "model_server",
                "serve",
                "--model",
                str(models),
                "--port",
                "0",
                "--host",
                "127.0.0.1",
            ],
            env={**os.environ, "MODEL_SERVER_TERMINATION_LOG": str(tmp_path / "absent")},
            capture_output=True,
            timeout=8,
            check=False,
        )
    assert not (tmp_path / "absent").exists()
