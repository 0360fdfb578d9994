"""The fetcher trusts the platform's CA bundle (MODEL_FETCH_CA_BUNDLE, set by the operator from
chart value modelFetch.caBundle) besides the public roots, in every client it uses."""

from __future__ import annotations

import ssl
import subprocess

from model_fetcher import trust
from model_fetcher.errors import ExitCode
from tests.storage.fetch_failures import fetch_fails


def _ca(tmp_path) -> str:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=platform-ca",
         "-keyout", str(tmp_path / "ca.key"), "-out", str(tmp_path / "ca.crt")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return (tmp_path / "ca.crt").read_text()


def test_the_fetcher_trusts_the_bundle_besides_the_public_roots(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(trust.tempfile, "tempdir", str(tmp_path))
    pem = _ca(tmp_path)
    environ = {"MODEL_FETCH_CA_BUNDLE": pem}
    path = trust.trust_ca_bundle(environ)
    assert path is not None and path.parent == tmp_path
    assert {environ[v] for v in trust.CA_FILE_VARIABLES} == {str(path)}
    context = ssl.create_default_context(cafile=str(path))
    subjects = {dict(x[0] for x in cert["subject"]).get("commonName") for cert in context.get_ca_certs()}
    assert "platform-ca" in subjects and len(subjects) > 50  # the platform's CA and the public roots
    assert trust.trust_ca_bundle({}) is None


def test_the_fetcher_refuses_a_bundle_that_is_not_pem() -> None:
    with fetch_fails(ExitCode.USAGE, match="MODEL_FETCH_CA_BUNDLE"):
        trust.trust_ca_bundle({"MODEL_FETCH_CA_BUNDLE": "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----"})
