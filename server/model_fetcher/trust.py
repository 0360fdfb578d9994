"""A platform's own CA (MODEL_FETCH_CA_BUNDLE), trusted besides the public roots by every client
the fetcher uses; the adapters sidecar trusts it the same way."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import ExitCode, FetchError

ENV_CA_BUNDLE = "MODEL_FETCH_CA_BUNDLE"
# Where each client library of the fetcher looks for its trusted certificates.
CA_FILE_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "AWS_CA_BUNDLE")


def trust_ca_bundle(environ: dict[str, str] | os._Environ[str]) -> Path | None:
    """Trust the certificates in MODEL_FETCH_CA_BUNDLE besides the public roots, in every client
    the fetcher uses (httpx, boto3, huggingface_hub), through the variables each reads. The
    bundle is written to a temporary file; None when there is no bundle."""
    pem = environ.get(ENV_CA_BUNDLE, "").strip()
    if not pem:
        return None
    import ssl

    import certifi

    try:
        ssl.create_default_context(cadata=pem)
    except (ssl.SSLError, ValueError) as exc:
        raise FetchError(f"{ENV_CA_BUNDLE}: not PEM certificates ({exc})", ExitCode.USAGE) from None
    fd, name = tempfile.mkstemp(prefix="model-fetch-ca-", suffix=".pem")
    with os.fdopen(fd, "w") as bundle:
        bundle.write(Path(certifi.where()).read_text() + "\n" + pem + "\n")
    for variable in CA_FILE_VARIABLES:
        environ[variable] = name
    return Path(name)
