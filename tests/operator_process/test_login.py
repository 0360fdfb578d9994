"""In a pod the operator reaches the API server by the address in its environment, not by the
DNS name kopf would use, so it keeps working without cluster DNS (found on the real-pods tier,
which runs no DNS: kopf's https://kubernetes.default.svc never resolved)."""

from __future__ import annotations

import kopf
import pytest

from inference_operator import config
from inference_operator.handlers import startup


@pytest.mark.parametrize(
    ("environ", "server"),
    [
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, "https://10.96.0.1:443"),
        ({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}, "https://[fd00::1]:6443"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, None),
        ({}, None),
    ],
)
def test_in_cluster_server(environ: dict[str, str], server: str | None) -> None:
    assert config.in_cluster_server(environ) == server


def test_login_in_a_pod_uses_the_service_address_and_keeps_the_account(monkeypatch) -> None:
    account = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t0k", ca_path="/ca.crt")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    info = startup.login(memo=kopf.Memo(config=config.load()))
    assert info is not None
    assert (info.server, info.token, info.ca_path) == ("https://10.96.0.1:443", "t0k", "/ca.crt")


def test_login_outside_a_pod_falls_back_to_the_kubeconfig(monkeypatch) -> None:
    from_kubeconfig = kopf.ConnectionInfo(server="https://127.0.0.1:6443")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: None)
    monkeypatch.setattr(kopf, "login_with_kubeconfig", lambda **_: from_kubeconfig)
    assert startup.login(memo=kopf.Memo(config=config.load())) is from_kubeconfig
