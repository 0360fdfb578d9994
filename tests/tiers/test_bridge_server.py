"""The tier's https file server on the bridge: a client that connects and never says a word holds
neither the other clients nor the server's shutdown (it once kept a module's teardown waiting
past pytest's timeout)."""

from __future__ import annotations

import pathlib
import socket
import ssl
import subprocess
import threading
import types
import urllib.request

import pytest

from tests.tiers import pods


def ca(pki: pathlib.Path) -> None:
    pki.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=tier-ca", "-days", "1"]
        + ["-keyout", "ca.key", "-out", "ca.crt"],
        cwd=pki,
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_a_silent_client_holds_neither_other_clients_nor_the_shutdown(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pods, "NODE_IP", "127.0.0.1")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "model.txt").write_text("weights")
    ca(tmp_path / "pki")
    node = types.SimpleNamespace(work=tmp_path)
    serving = pods.file_server(tmp_path / "files", node)  # type: ignore[arg-type]
    server = serving.__enter__()
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)):  # connects, never handshakes
        context = ssl.create_default_context(cafile=str(server.ca))
        with urllib.request.urlopen(f"{server.url}/model.txt", context=context, timeout=10) as answer:
            assert answer.read() == b"weights"
        closing = threading.Thread(target=serving.__exit__, args=(None, None, None), daemon=True)
        closing.start()
        closing.join(30)  # the shutdown waits for one turn of the accept loop: well under a second
        assert not closing.is_alive(), "the server's shutdown waits for the silent client"
