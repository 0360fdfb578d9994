"""HTTP(S) sources: one model file, fetched without following a redirect the fetcher has not
checked (no downgrade to http, no other host unless allowed) and refused when the server
answers with an HTML page."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from urllib.parse import urljoin, urlsplit

import httpx

from .cache import exclusive, manifest_path, prune
from .errors import ExitCode, FetchError
from .files import contained, write_file
from .limits import Limits
from .uris import http_file_name

MAX_REDIRECTS = 5


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(parts.scheme)


def check_redirect(first: str, current: str, location: str, limits: Limits) -> str:
    """The next URL of a redirect, or FetchError (UNSAFE): no downgrade to http, no other host unless allowed."""
    target = urljoin(current, location)
    scheme, host, port = _origin(target)
    first_scheme, first_host, first_port = _origin(first)
    if scheme not in ("http", "https"):
        raise FetchError(f"refusing a redirect to {scheme}:// ({target})", ExitCode.UNSAFE)
    if scheme == "http" and (first_scheme == "https" or _origin(current)[0] == "https"):
        raise FetchError(f"refusing a redirect from https to plain http ({target})", ExitCode.UNSAFE)
    same_host = host == first_host and (port == first_port or (first_scheme, scheme) == ("http", "https"))
    if not same_host:
        if host not in limits.redirect_hosts:
            raise FetchError(
                f"refusing a redirect to another host {host!r} (allow it with --allow-redirect-host)", ExitCode.UNSAFE
            )
        if scheme != "https":
            raise FetchError(f"refusing a plain http redirect to another host ({target})", ExitCode.UNSAFE)
    return target


def _timeout(limits: Limits) -> httpx.Timeout:
    left = limits.remaining()
    return httpx.Timeout(min(30.0, left), read=min(60.0, left))


def fetch_http(
    uri: str, dest_dir: Path, client: httpx.Client | None = None, limits: Limits | None = None
) -> list[Path]:
    limits = limits or Limits()
    target = contained(dest_dir, manifest_path(http_file_name(uri), "file name"), "file name")
    own_client = client is None
    client = client or httpx.Client(follow_redirects=False)
    dest_dir.mkdir(parents=True, exist_ok=True)
    try:
        with exclusive(dest_dir, limits):
            prune(dest_dir, [PurePosixPath(target.name)])
            return _get_http(uri, target, client, limits)
    finally:
        if own_client:
            client.close()


def _get_http(uri: str, target: Path, client: httpx.Client, limits: Limits) -> list[Path]:
    url = uri
    try:
        for _ in range(MAX_REDIRECTS + 1):
            with client.stream("GET", url, timeout=_timeout(limits)) as response:
                if response.is_redirect:
                    url = check_redirect(uri, url, response.headers.get("location", ""), limits)
                    continue
                if response.status_code != 200:
                    raise FetchError(f"{url}: HTTP {response.status_code}")
                content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if content_type in ("text/html", "application/xhtml+xml"):
                    raise FetchError(f"{url}: the server sent {content_type}, not a model", ExitCode.NOT_A_MODEL)
                length = response.headers.get("content-length", "")
                if length.isdigit():
                    limits.expect(int(length), url)
                # iter_bytes() without a size hands over whatever arrived, so the deadline is
                # checked even when the bytes trickle in one at a time.
                return [write_file(target, response.iter_bytes(), limits, limits.sha256)]
        raise FetchError(f"{uri}: more than {MAX_REDIRECTS} redirects")
    except httpx.TimeoutException as exc:
        limits.remaining()  # past the deadline: say so rather than "timed out"
        raise FetchError(f"{url}: timed out ({type(exc).__name__})") from exc
    except httpx.HTTPError as exc:
        raise FetchError(f"{url}: {type(exc).__name__}: {exc}") from exc
