"""Fetch a model into a local directory: the job of the pod's `model-fetch` init container.

    python -m model_server.storage https://host/models/resnet/model.onnx /mnt/models
    python -m model_server.storage s3://bucket/models/resnet /mnt/models
    python -m model_server.storage hf://meta-llama/Llama-3.1-8B-Instruct@main /mnt/models

An HTTP(S) URI names one model file, saved under its own name (the server treats a lone model
file as version 1). An S3 URI names one object, or a "directory" (with or without the trailing
`/`; `models/resnet` never matches `models/resnet-private/`) whose objects are copied with their
relative paths, so a repository laid out as `<version>/model.onnx` arrives as such. An
`hf://ORG/NAME[@REVISION]` URI is a Hugging Face Hub model repository at a branch, tag or commit
(default `main`), copied whole with `huggingface_hub`. Files are written to a temporary name and
renamed, so the server never sees half a model.

Hostile or broken sources are refused, never followed:
- every written path stays inside the destination (no absolute, `.` or `..` parts);
- HTTP redirects only to https on the same host (or http to https); other hosts only when
  listed (`--allow-redirect-host`); never from https down to http;
- a size cap on the whole fetch and an overall deadline, however slowly the bytes trickle;
- `text/html` answers and files that start like an HTML page are not models;
- `--sha256` (one file) or `<file>.sha256` objects beside S3 files (hex digest, sha256sum
  format accepted) are checked before the rename.

Options (each also an environment variable, which the operator's init container can set):

    --sha256 HEX                  MODEL_FETCH_SHA256            expected digest of the one file
    --max-bytes N[Ki|Mi|Gi|Ti]    MODEL_FETCH_MAX_BYTES         default 200Gi
    --deadline SECONDS            MODEL_FETCH_DEADLINE_SECONDS  default 3600
    --allow-redirect-host HOST    MODEL_FETCH_REDIRECT_HOSTS    comma-separated
                                  MODEL_FETCH_ALLOW_HTTP_TOKEN  send HF_TOKEN to a plain-http HF_ENDPOINT
                                  MODEL_FETCH_CA_BUNDLE         PEM certificates trusted besides the
                                                                public roots (a platform's own CA)
                                  MODEL_FETCH_TERMINATION_LOG   a file for one line on why the fetch
                                                                failed (the pod's terminationMessagePath)

Credentials: S3 from the usual AWS_* variables (needs `boto3`, the `s3` extra); the Hub from
HF_TOKEN (a token for private or gated repositories) and HF_ENDPOINT (a mirror's URL, default
https://huggingface.co; the token goes only to an https endpoint).

A destination may be a cache claim's directory that outlives the pod (shared by replicas): a
fetch takes an flock on `.cache/model-fetch.lock` in it, removes every file the source does not
name, keeps a file already there only when it matches the digest the source publishes (the
Hub's sha256 of an LFS file or git blob id of a small one; S3's full-object ChecksumSHA256, an
MD5 ETag or a `.sha256` object), downloads the rest and refuses a download that does not match.

Exit codes: 0 fetched; 1 the source failed (HTTP error, unreachable, no such object or repo);
2 bad arguments or URI; 3 refused as unsafe (a path leaving the destination, a redirect not
allowed); 4 not a model (HTML); 5 over the size cap; 6 past the deadline; 7 checksum mismatch;
8 local I/O error (disk full, read-only destination).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import dataclasses
import enum
import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from types import FrameType
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

from . import signals

if __name__ == "__main__":  # the init container's process, before the imports that take a while
    # As PID 1 it would otherwise ignore SIGTERM and hold the pod for its whole grace period.
    signals.exit_on_stop_signal("fetch")

import httpx  # noqa: E402

log = logging.getLogger("model_server.storage")
CHUNK = 1 << 20
MAX_REDIRECTS = 5
DEFAULT_MAX_BYTES = 200 << 30
DEFAULT_DEADLINE_SECONDS = 3600.0
# Bytes of a file's start looked at for an HTML page saved under a model's name.
SNIFF_BYTES = 512
HTML_STARTS = (b"<!doctype html", b"<html", b"<head", b"<body", b"<?xml")
TEXT_NAMES = (".html", ".htm", ".xml")  # files that may be markup (never model weights)
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
HF_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


class ExitCode(enum.IntEnum):
    OK = 0
    SOURCE = 1
    USAGE = 2
    UNSAFE = 3
    NOT_A_MODEL = 4
    TOO_LARGE = 5
    DEADLINE = 6
    CHECKSUM = 7
    LOCAL_IO = 8


class FetchError(Exception):
    """The model could not be fetched: the message says what and from where, `code` the exit
    code the init container ends with, so a pod's status tells the kinds of failure apart."""

    def __init__(self, message: str, code: ExitCode = ExitCode.SOURCE) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class Limits:
    """What one fetch may cost, and what it must match; shared by every file it writes."""

    max_bytes: int = DEFAULT_MAX_BYTES
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS
    sha256: str | None = None
    redirect_hosts: frozenset[str] = frozenset()
    started: float = dataclasses.field(default_factory=time.monotonic)
    written: int = 0

    def remaining(self) -> float:
        left = self.deadline_seconds - (time.monotonic() - self.started)
        if left <= 0:
            raise FetchError(f"not done within the deadline of {self.deadline_seconds:g} s", ExitCode.DEADLINE)
        return left

    def count(self, size: int) -> None:
        self.written += size
        if self.written > self.max_bytes:
            raise FetchError(f"more than the size cap of {self.max_bytes} bytes", ExitCode.TOO_LARGE)

    def expect(self, total: int, what: str) -> None:
        if self.written + total > self.max_bytes:
            raise FetchError(
                f"{what} is {total} bytes, over the size cap of {self.max_bytes} bytes", ExitCode.TOO_LARGE
            )


class S3Client(Protocol):
    def get_paginator(self, operation: str) -> Any: ...

    def get_object(self, Bucket: str, Key: str, ChecksumMode: str) -> dict[str, Any]: ...  # noqa: N803 (boto3's names)


def safe_relative(path: str, what: str) -> PurePosixPath:
    """A relative path with real names only: no absolute part, no `.`/`..`, no empty part."""
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
        raise FetchError(f"refusing {what} {path!r}: it would leave the model directory", ExitCode.UNSAFE)
    return PurePosixPath(*parts)


def contained(dest: Path, relative: PurePosixPath, what: str) -> Path:
    """dest/relative, refused unless it stays inside dest (symbolic links resolved)."""
    target = dest.joinpath(*relative.parts)
    root = dest.resolve()
    if not target.resolve().is_relative_to(root) or target.resolve() == root:
        raise FetchError(
            f"refusing {what} {relative.as_posix()!r}: it would leave the model directory", ExitCode.UNSAFE
        )
    return target


def looks_like_html(head: bytes) -> bool:
    return head.lstrip().lower().startswith(HTML_STARTS)


def _parse_digest(text: str, what: str) -> str:
    digest = text.strip().split()[0].lower() if text.strip() else ""
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise FetchError(f"{what}: {text.strip()[:80]!r} is not a sha256 hex digest", ExitCode.USAGE)
    return digest


@dataclasses.dataclass(frozen=True)
class Expected:
    """What one file must be, as its source publishes it: its size and the digests the source
    gives (the content's sha256; git's blob id, the sha1 of `blob SIZE\\0` and the content;
    an S3 ETag that is the content's MD5). A file with no digest to check is never reused."""

    size: int | None = None
    sha256: str | None = None
    git_blob: str | None = None
    md5: str | None = None

    @property
    def checkable(self) -> bool:
        return bool(self.sha256 or self.md5 or (self.git_blob and self.size is not None))


def _hex(value: object, length: int) -> str | None:
    """A published digest as lowercase hex, or None when it is not one of `length` digits."""
    text = str(value or "").strip().strip('"').lower()
    return text if re.fullmatch(f"[0-9a-f]{{{length}}}", text) else None


class _Digests:
    """The digests `expected` names (and one more sha256 to match), over bytes as they stream."""

    def __init__(self, expected: Expected, sha256: str | None = None) -> None:
        self.wanted = {
            "sha256": [d for d in (expected.sha256, sha256) if d],
            "md5": [expected.md5] if expected.md5 else [],
        }
        self.hashes: dict[str, Any] = {}
        if self.wanted["sha256"]:
            self.hashes["sha256"] = hashlib.sha256()
        if self.wanted["md5"]:
            self.hashes["md5"] = hashlib.md5(usedforsecurity=False)
        if expected.git_blob and expected.size is not None:
            blob = hashlib.sha1(usedforsecurity=False)  # git's object id, not a security choice of ours
            blob.update(b"blob %d\0" % expected.size)
            self.hashes["git blob id"] = blob
            self.wanted["git blob id"] = [expected.git_blob]

    def update(self, chunk: bytes) -> None:
        for h in self.hashes.values():
            h.update(chunk)

    def mismatch(self) -> str | None:
        """Which digest differs from what was published, in words; None when all match."""
        for name, h in self.hashes.items():
            for want in self.wanted[name]:
                if h.hexdigest() != want:
                    return f"{name} is {h.hexdigest()}, expected {want}"
        return None


NOTHING_PUBLISHED = Expected()


def write_file(
    target: Path,
    chunks: Iterable[bytes],
    limits: Limits,
    sha256: str | None = None,
    expected: Expected = NOTHING_PUBLISHED,
) -> Path:
    """Stream `chunks` to a temporary file beside `target`, check it (`sha256`, and the digests
    its source published), then rename it into place: a file that does not match is refused."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, part = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    digests = _Digests(expected, sha256)
    head = b""
    sniff = not target.name.lower().endswith(TEXT_NAMES)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                limits.remaining()
                limits.count(len(chunk))
                if sniff and len(head) < SNIFF_BYTES:
                    head += chunk[: SNIFF_BYTES - len(head)]
                    if looks_like_html(head):
                        raise FetchError(
                            f"{target.name}: the source sent an HTML page, not a model", ExitCode.NOT_A_MODEL
                        )
                digests.update(chunk)
                out.write(chunk)
        if (problem := digests.mismatch()) is not None:
            raise FetchError(f"{target.name}: {problem}", ExitCode.CHECKSUM)
        os.replace(part, target)
    finally:
        if os.path.exists(part):
            os.unlink(part)
    return target


# --- the destination as a cache ----------------------------------------------------------------
# A destination on a cache claim outlives the pod and may hold what an earlier fetch, or a fetch
# of another service, left there: nothing in it is served unless it is a file the source names
# now, with the digest the source publishes for it.

STATE_DIR = ".cache"  # the fetcher's own state in the destination (dot-names are never served)
LOCK_FILE = PurePosixPath(STATE_DIR, "model-fetch.lock")
LOCK_POLL_SECONDS = 0.2
REMOVED_NAMED = 5  # of the files removed, how many a log line names
NAME_CHARS = 200  # of each name (a name is whatever was written there)


def manifest_path(path: str, what: str) -> PurePosixPath:
    """A file the source names, as a path in the destination (see safe_relative); never inside
    the fetcher's own state directory."""
    relative = safe_relative(path, what)
    if relative.parts[0] == STATE_DIR:
        raise FetchError(f"refusing {what} {path!r}: {STATE_DIR}/ holds the fetcher's own state", ExitCode.UNSAFE)
    return relative


@contextlib.contextmanager
def exclusive(dest_dir: Path, limits: Limits) -> Iterator[None]:
    """One fetch at a time into a destination (an flock on a file in it): replicas sharing a
    cache claim take turns, so none removes or replaces what another is still writing. Waiting
    counts against the deadline. The lock file is removed by its holder, so a finished fetch
    leaves only the model; a waiter that got the lock of a removed file tries again."""
    state, lock = dest_dir / STATE_DIR, dest_dir.joinpath(*LOCK_FILE.parts)
    if state.is_symlink() or (state.exists() and not state.is_dir()):
        state.unlink()  # the fetcher's state directory is a real directory or nothing
    waited = False
    while True:
        state.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except FileNotFoundError:  # the holder removed the directory just now
            continue
        try:
            while not _locked(fd, dest_dir):
                if not waited:
                    log.info("waiting for another fetch into %s to end", dest_dir)
                    waited = True
                limits.remaining()
                time.sleep(LOCK_POLL_SECONDS)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    break  # the lock is ours and still the one in place
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        with contextlib.suppress(OSError):
            os.rmdir(state)  # when empty
        os.close(fd)  # releases the lock


def _locked(fd: int, dest_dir: Path) -> bool:
    """Whether the flock on `fd` is now ours; on a filesystem without locks, go on without one
    (only replicas of one service share a directory; they fetch the same files)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        log.warning("%s: no file locks here (%s); fetching without one", dest_dir, errno.errorcode.get(exc.errno or 0))
    return True


def prune(dest_dir: Path, keep: Iterable[PurePosixPath]) -> list[PurePosixPath]:
    """Remove from `dest_dir` every entry that is not a regular file of `keep`, a directory on
    the way to one, or the fetcher's lock; return what was removed. Nothing is followed: a
    symbolic link is removed wherever it is, so a kept path never leads elsewhere."""
    files = {*keep, LOCK_FILE}
    directories = {parent for path in files for parent in path.parents if parent.parts}
    removed: list[PurePosixPath] = []

    def walk(directory: Path, relative: PurePosixPath) -> None:
        with os.scandir(directory) as scan:
            entries = list(scan)
        for entry in entries:
            path = relative / entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if is_dir and path in directories:
                walk(Path(entry.path), path)
            elif not (entry.is_file(follow_symlinks=False) and path in files):
                removed.append(path)
                if is_dir:
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)

    if dest_dir.is_dir():
        walk(dest_dir, PurePosixPath())
    if removed:
        named = ", ".join(repr(p.as_posix()[:NAME_CHARS]) for p in removed[:REMOVED_NAMED])
        more = f" and {len(removed) - REMOVED_NAMED} more" if len(removed) > REMOVED_NAMED else ""
        log.warning("removed %d entr(ies) the source does not name from %s: %s%s", len(removed), dest_dir, named, more)
    return removed


VERIFY_WORKERS = 4  # files hashed at once (hashlib lets go of the GIL): a sharded model's shards


def verified_files(files: dict[PurePosixPath, tuple[Path, Expected]], limits: Limits) -> set[PurePosixPath]:
    """Those of `files` (path in the destination, what its source publishes) already in place:
    see `verified`; several files are hashed at once."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=VERIFY_WORKERS, thread_name_prefix="verify") as pool:
        checked = pool.map(lambda item: verified(item[0], item[1], limits), files.values())
        return {rel for rel, ok in zip(files, checked, strict=True) if ok}


def verified(path: Path, expected: Expected, limits: Limits) -> bool:
    """Whether `path` already is the file its source publishes: a regular file of the declared
    size whose every published digest matches. A file with nothing to check it against is not."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or not expected.checkable:
        return False
    if expected.size is not None and st.st_size != expected.size:
        return False
    digests = _Digests(expected)
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        while chunk := f.read(CHUNK):
            limits.remaining()
            digests.update(chunk)
    return digests.mismatch() is None


# --- http(s) -----------------------------------------------------------------------------


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


def _file_name(uri: str) -> str:
    path = urlsplit(uri).path
    name = PurePosixPath(path).name
    if not name or path.endswith("/") or name in (".", "..") or ".." in path.split("/"):
        raise FetchError(f"{uri}: an http(s) model URI must name a file, e.g. .../model.onnx", ExitCode.USAGE)
    return name


def _timeout(limits: Limits) -> httpx.Timeout:
    left = limits.remaining()
    return httpx.Timeout(min(30.0, left), read=min(60.0, left))


def fetch_http(
    uri: str, dest_dir: Path, client: httpx.Client | None = None, limits: Limits | None = None
) -> list[Path]:
    limits = limits or Limits()
    target = contained(dest_dir, manifest_path(_file_name(uri), "file name"), "file name")
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


# --- s3 ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class S3Object:
    """One object as the listing names it: its key, size and ETag."""

    key: str
    size: int
    etag: str = ""


def _s3_objects(client: S3Client, bucket: str, prefix: str) -> Iterator[S3Object]:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if not item["Key"].endswith("/"):
                yield S3Object(item["Key"], int(item.get("Size", 0)), str(item.get("ETag") or ""))


def _s3_client() -> S3Client:
    try:
        import boto3
    except ImportError as exc:
        raise FetchError("s3:// models need boto3 in the image (pip install boto3)") from exc
    client: S3Client = boto3.client("s3")
    return client


def fetch_s3(uri: str, dest_dir: Path, client: S3Client | None = None, limits: Limits | None = None) -> list[Path]:
    """The object, or the objects under the prefix. A file the destination already holds is kept
    when it has the object's size and matches a digest published for it (a `.sha256` object,
    `--sha256`, or an ETag that is an MD5); everything else is downloaded and checked against
    every digest S3 gives with it (see `_s3_published`), and files the listing does not name are
    removed."""
    limits = limits or Limits()
    bucket, path = _s3_location(uri)
    client = client or _s3_client()
    objects = _s3_objects_to_fetch(client, bucket, path)
    if not objects:
        raise FetchError(f"{uri}: no objects under this prefix")
    sidecars = {rel.as_posix(): obj.key for obj, rel in objects if rel.name.endswith(".sha256")}
    files = [(obj, rel) for obj, rel in objects if rel.as_posix() not in sidecars]
    if limits.sha256 and len(files) != 1:
        raise FetchError(
            f"{uri}: --sha256 names one file, this prefix has {len(files)}; use <file>.sha256 objects", ExitCode.USAGE
        )
    limits.expect(sum(obj.size for obj, _ in files), uri)
    keep = [rel for _, rel in files]
    dest_dir.mkdir(parents=True, exist_ok=True)
    with exclusive(dest_dir, limits):
        prune(dest_dir, keep)
        targets = [(obj, rel, contained(dest_dir, rel, "S3 key")) for obj, rel in files]  # all, before any write
        expected: dict[PurePosixPath, tuple[Path, Expected]] = {}
        for obj, rel, target in targets:
            sha256 = limits.sha256
            if (sidecar := sidecars.get(rel.as_posix() + ".sha256")) is not None:
                sha256 = _parse_digest(_s3_read(client, bucket, sidecar, limits), f"s3://{bucket}/{sidecar}")
            expected[rel] = (target, Expected(size=obj.size, sha256=sha256, md5=_hex(obj.etag, 32)))
        in_place = verified_files(expected, limits)
        for obj, rel, target in targets:
            if rel not in in_place:
                response = _s3_get(client, bucket, obj.key)
                body = _s3_body(response, bucket, obj.key)
                write_file(target, body, limits, expected[rel][1].sha256, _s3_published(response))
        fetched = [target for _, _, target in targets]
        prune(dest_dir, keep)
    return fetched


def _s3_location(uri: str) -> tuple[str, str]:
    """(bucket, key or prefix) of an s3:// URI; no `.` or `..` segments in the key."""
    parts = urlsplit(uri)
    bucket, path = parts.netloc, parts.path.lstrip("/")
    if not bucket:
        raise FetchError(f"{uri}: no bucket", ExitCode.USAGE)
    if path and (".." in path.split("/") or "." in path.split("/")):
        raise FetchError(f"{uri}: `.` and `..` are not allowed in an S3 key", ExitCode.USAGE)
    return bucket, path


def _s3_objects_to_fetch(client: S3Client, bucket: str, path: str) -> list[tuple[S3Object, PurePosixPath]]:
    """Each object with its path relative to the destination: the one object `path` names
    exactly (unless it ends in `/`), else every object under the prefix."""
    directory = path.rstrip("/")
    listed = list(_s3_objects(client, bucket, directory))
    exact = [obj for obj in listed if obj.key == directory]
    if exact and not path.endswith("/"):
        return [(obj, manifest_path(PurePosixPath(obj.key).name, "S3 key")) for obj in exact]
    base = directory + "/" if directory else ""
    return [(obj, manifest_path(obj.key[len(base) :], "S3 key")) for obj in listed if obj.key.startswith(base)]


def _s3_read(client: S3Client, bucket: str, key: str, limits: Limits) -> str:
    data = b"".join(_s3_body(_s3_get(client, bucket, key), bucket, key))
    limits.count(len(data))
    return data[:4096].decode("utf-8", "replace")


# A ChecksumType: the checksum of the whole object, not of its parts (COMPOSITE, "...-N").
FULL_OBJECT = "FULL_OBJECT"
# Server-side encryption under which an object's ETag is not the MD5 of its content.
ETAG_NOT_MD5 = ("aws:kms", "aws:kms:dsse")


def _s3_published(response: dict[str, Any]) -> Expected:
    """The digests S3 gives with an object: its ChecksumSHA256 (base64) when it was stored with
    one and it covers the whole object, and its ETag when that is the content's MD5 (a single-part
    upload without SSE-KMS or SSE-C; a multipart ETag ends in -N). S3's default CRC checksums
    are not checked here."""
    sha256 = None
    checksum = str(response.get("ChecksumSHA256") or "")
    if checksum and "-" not in checksum and response.get("ChecksumType", FULL_OBJECT) == FULL_OBJECT:
        with contextlib.suppress(ValueError):
            sha256 = _hex(base64.b64decode(checksum, validate=True).hex(), 64)
    md5 = None
    encryption = str(response.get("ServerSideEncryption") or "")
    if encryption not in ETAG_NOT_MD5 and not response.get("SSECustomerAlgorithm"):
        md5 = _hex(response.get("ETag"), 32)
    return Expected(sha256=sha256, md5=md5)


def _s3_get(client: S3Client, bucket: str, key: str) -> dict[str, Any]:
    try:
        response = client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except Exception as exc:  # botocore's ClientError and friends, without importing botocore
        raise FetchError(f"s3://{bucket}/{key}: {type(exc).__name__}: {exc}") from exc
    content_type = str(response.get("ContentType") or "").split(";")[0].strip().lower()
    if content_type == "text/html" and not key.lower().endswith(TEXT_NAMES):
        raise FetchError(f"s3://{bucket}/{key}: stored as {content_type}, not a model", ExitCode.NOT_A_MODEL)
    return response


def _s3_body(response: dict[str, Any], bucket: str, key: str) -> Iterator[bytes]:
    try:
        yield from response["Body"].iter_chunks(CHUNK)
    except Exception as exc:  # botocore's own check of a checksum it was sent, a dropped connection
        code = ExitCode.CHECKSUM if "checksum" in type(exc).__name__.lower() else ExitCode.SOURCE
        raise FetchError(f"s3://{bucket}/{key}: {type(exc).__name__}: {exc}", code) from exc


# --- Hugging Face Hub -------------------------------------------------------------------------

ENV_ALLOW_HTTP_TOKEN = "MODEL_FETCH_ALLOW_HTTP_TOKEN"


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def parse_hf(uri: str) -> tuple[str, str]:
    """(repo id, revision) of hf://ORG/NAME[@REVISION]."""
    rest = uri[len("hf://") :]
    repo, _, revision = rest.partition("@")
    repo = repo.rstrip("/")
    revision = revision or "main"
    if not HF_REPO.match(repo) or ".." in repo:
        raise FetchError(f"{uri}: expected hf://ORG/NAME[@REVISION]", ExitCode.USAGE)
    if not HF_REVISION.match(revision) or ".." in revision.split("/"):
        raise FetchError(f"{uri}: {revision!r} is not a branch, tag or commit", ExitCode.USAGE)
    return repo, revision


def fetch_hf(uri: str, dest_dir: Path, limits: Limits | None = None) -> list[Path]:
    """The repository's files at one commit, listed and checked first (paths, total size).

    What the destination already holds is kept only when the Hub's digest for it matches (an
    LFS file's sha256, a small file's git blob id); everything else the commit does not name
    is removed, and a download whose bytes differ from the Hub's digest is refused."""
    limits = limits or Limits()
    repo, revision = parse_hf(uri)
    if limits.sha256:
        raise FetchError(f"{uri}: --sha256 names one file; the Hub checks its own files", ExitCode.USAGE)
    hub = _Hub.connect()
    try:
        commit = hub.commit(uri, repo, revision)
        manifest = {manifest_path(f.path, "repository file"): hub_expectation(f) for f in hub.files(repo, commit)}
        limits.expect(sum(e.size or 0 for e in manifest.values()), uri)
        limits.remaining()
        dest_dir.mkdir(parents=True, exist_ok=True)
        with exclusive(dest_dir, limits):
            prune(dest_dir, manifest)
            targets = {rel: contained(dest_dir, rel, "repository file") for rel in manifest}
            in_place = verified_files({rel: (targets[rel], e) for rel, e in manifest.items()}, limits)
            missing = [(rel, e) for rel, e in manifest.items() if rel not in in_place]
            log.info("%s: %d of %d file(s) to download at %s", uri, len(missing), len(manifest), commit)
            hub.download(uri, repo, commit, dest_dir, limits, missing)
            prune(dest_dir, manifest)
    except hub.not_found as exc:
        raise FetchError(f"{uri}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    return list(targets.values())


def hub_expectation(f: Any) -> Expected:
    """What the Hub publishes about one file of its tree: an LFS file's sha256, or a file kept
    in git itself, its blob id (the LFS pointer's id says nothing of the content)."""
    lfs = getattr(f, "lfs", None)
    if lfs is not None:
        return Expected(size=f.size, sha256=_hex(getattr(lfs, "sha256", None), 64))
    if getattr(f, "xet_hash", None):  # stored in Xet with no LFS entry: the blob id is a pointer's
        return Expected(size=f.size)
    return Expected(size=f.size, git_blob=_hex(getattr(f, "blob_id", None), 40))


class _Hub:
    """huggingface_hub, imported only for hf:// models, with the token and endpoint to use."""

    def __init__(self, module: Any, errors: Any, token: str | None, endpoint: str | None) -> None:
        self.module = module
        self.api = module.HfApi(endpoint=endpoint, token=token)
        self.token = token
        self.endpoint = endpoint
        self.not_found: tuple[type[Exception], ...] = (
            errors.RepositoryNotFoundError,
            errors.RevisionNotFoundError,
            errors.GatedRepoError,
            errors.HfHubHTTPError,
            errors.LocalEntryNotFoundError,
        )

    @classmethod
    def connect(cls) -> _Hub:
        # huggingface_hub reads these when imported. Its own state goes to a fresh temporary
        # directory unless HF_HOME names one (the init container's root filesystem is read-only;
        # the destination holds only the model); no telemetry, no progress bars.
        if not os.environ.get("HF_HOME"):
            os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="model-fetch-hf-home-")
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        try:
            import huggingface_hub
            from huggingface_hub import errors as hf_errors
        except ImportError as exc:
            raise FetchError("hf:// models need huggingface_hub in the image (pip install huggingface_hub)") from exc
        token = os.environ.get("HF_TOKEN") or None
        endpoint = os.environ.get("HF_ENDPOINT") or None
        if token and endpoint and urlsplit(endpoint).scheme != "https" and not _truthy(ENV_ALLOW_HTTP_TOKEN):
            raise FetchError(
                f"refusing to send HF_TOKEN to {endpoint}: not https (set {ENV_ALLOW_HTTP_TOKEN}=true)", ExitCode.UNSAFE
            )
        return cls(huggingface_hub, hf_errors, token, endpoint)

    def commit(self, uri: str, repo: str, revision: str) -> str:
        """The 40-digit sha `revision` names now: the download is pinned to it."""
        commit = self.api.repo_info(repo, revision=revision).sha
        if not commit:
            raise FetchError(f"{uri}: the Hub named no commit for {revision!r}")
        if not COMMIT_SHA.fullmatch(commit):  # it becomes a path under HF_HOME and dest_dir
            raise FetchError(f"{uri}: the Hub named a commit that is no 40-digit hex sha", ExitCode.UNSAFE)
        return str(commit)

    def files(self, repo: str, commit: str) -> list[Any]:
        """The repository's files (not folders) at `commit`, with their declared sizes and digests."""
        tree = self.api.list_repo_tree(repo, revision=commit, recursive=True)
        return [f for f in tree if isinstance(f, self.module.hf_api.RepoFile)]

    def download(
        self,
        uri: str,
        repo: str,
        commit: str,
        dest_dir: Path,
        limits: Limits,
        files: list[tuple[PurePosixPath, Expected]],
    ) -> None:
        """Download `files` of `commit` into a staging directory inside `dest_dir`, then move
        each into place only if it is the size the Hub declared and has the digest it published."""
        if not files:
            return
        staging = Path(tempfile.mkdtemp(dir=dest_dir / STATE_DIR, prefix="hf-"))
        try:
            # The tree's sizes are the Hub's word: the bytes actually written are watched too.
            with _size_watch(dest_dir, limits.max_bytes - limits.written):
                self._get(repo, commit, staging, [rel.as_posix() for rel, _ in files])
            refused: FetchError | None = None
            for rel, expected in files:
                problem = _staged_problem(uri, rel, staging.joinpath(*rel.parts), expected, limits)
                if problem is None:
                    target = contained(dest_dir, rel, "repository file")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staging.joinpath(*rel.parts), target)
                refused = refused or problem
            if refused is not None:
                raise refused
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _get(self, repo: str, commit: str, staging: Path, names: list[str]) -> None:
        def one(name: str) -> None:
            self.module.hf_hub_download(
                repo, name, revision=commit, local_dir=staging, endpoint=self.endpoint, token=self.token
            )

        with concurrent.futures.ThreadPoolExecutor(max_workers=HUB_WORKERS, thread_name_prefix="hf-get") as pool:
            for _ in pool.map(one, names):
                pass


HUB_WORKERS = 4


def _staged_problem(
    uri: str, rel: PurePosixPath, staged: Path, expected: Expected, limits: Limits
) -> FetchError | None:
    """Why a downloaded file may not be served (None: it may): not the declared size (the cap
    held only what was declared) or not the digest the Hub published."""
    name = repr(rel.as_posix())
    if not staged.is_file() or staged.is_symlink():
        return FetchError(f"{uri}: {name} was not downloaded")
    actual = staged.stat().st_size
    if expected.size is not None and actual != expected.size:
        return FetchError(f"{uri}: {name} is {actual} bytes, the Hub declared {expected.size}", ExitCode.TOO_LARGE)
    digests = _Digests(expected)
    with staged.open("rb") as f:
        while chunk := f.read(CHUNK):
            limits.remaining()
            digests.update(chunk)
    if (problem := digests.mismatch()) is not None:
        return FetchError(f"{uri}: {name}: {problem} (the Hub's digest)", ExitCode.CHECKSUM)
    return None


COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
SIZE_WATCH_INTERVAL_S = 0.2


def _tree_bytes(root: Path) -> int:
    total = 0
    for directory, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


@contextlib.contextmanager
def _size_watch(root: Path, cap: int) -> Iterator[None]:
    """Stop the process (exit TOO_LARGE) once what a library writes under `root` passes `cap`:
    a source that sends more than it declared cannot fill the volume."""
    before = _tree_bytes(root)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(SIZE_WATCH_INTERVAL_S):
            written = _tree_bytes(root) - before
            if written > cap:
                log.error(
                    "fetch failed (exit %d, too_large): %d bytes written, over the cap", ExitCode.TOO_LARGE, written
                )
                logging.shutdown()
                os._exit(ExitCode.TOO_LARGE)  # the library's download threads cannot be stopped otherwise

    watcher = threading.Thread(target=watch, name="size-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
    if _tree_bytes(root) - before > cap:
        raise FetchError(f"more than the size cap of {cap} bytes written", ExitCode.TOO_LARGE)


# --- command line ----------------------------------------------------------------------------


def fetch(uri: str, dest_dir: Path, limits: Limits | None = None) -> list[Path]:
    limits = limits or Limits()
    scheme = urlsplit(uri).scheme
    if scheme in ("http", "https"):
        return fetch_http(uri, dest_dir, limits=limits)
    if scheme == "s3":
        return fetch_s3(uri, dest_dir, limits=limits)
    if scheme == "hf":
        return fetch_hf(uri, dest_dir, limits=limits)
    raise FetchError(f"{uri}: unsupported scheme {scheme!r} (http, https, s3, hf)", ExitCode.USAGE)


SIZE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30}
SIZE_UNITS["ti"] = 1 << 40


def parse_size(text: str) -> int:
    """A byte count: 5000000, 500Mi, 200Gi, 1T."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]i?)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 500Mi or 200Gi")
    return int(match[1]) * SIZE_UNITS[(match[2] or "").lower()]


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _sha256(text: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a sha256 hex digest")
    return text.strip().lower()


def parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="python -m model_server.storage",
        description=(__doc__ or "").split("\n")[0],
        epilog="exit codes: 0 ok, 1 source failed, 2 usage, 3 unsafe, 4 not a model, 5 too large, "
        "6 deadline, 7 checksum, 8 local I/O",
    )
    p.add_argument("uri")
    p.add_argument("dest", type=Path)
    p.add_argument("--sha256", type=_sha256, default=env.get("MODEL_FETCH_SHA256") or None)
    p.add_argument("--max-bytes", type=parse_size, default=env.get("MODEL_FETCH_MAX_BYTES") or DEFAULT_MAX_BYTES)
    p.add_argument(
        "--deadline",
        type=_positive_seconds,
        default=env.get("MODEL_FETCH_DEADLINE_SECONDS") or DEFAULT_DEADLINE_SECONDS,
        help="seconds for the whole fetch",
    )
    hosts = [h.strip().lower() for h in env.get("MODEL_FETCH_REDIRECT_HOSTS", "").split(",") if h.strip()]
    p.add_argument("--allow-redirect-host", action="append", default=hosts, metavar="HOST")
    return p


# After the deadline's exception, how long unwinding may take before the process just exits
# (a library's download threads can keep its thread pool from shutting down).
GRACE_SECONDS = 2.0


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGALRM, _exit_now)
    signal.setitimer(signal.ITIMER_REAL, GRACE_SECONDS)
    raise FetchError("not done within the deadline", ExitCode.DEADLINE)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    log.error("fetch failed (exit %d, deadline): not done within the deadline", ExitCode.DEADLINE)
    logging.shutdown()
    os._exit(ExitCode.DEADLINE)


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


# Where the kubelet reads a container's last words (its terminationMessagePath), for the pod's
# status and so the InferenceService's; the operator sets it and redacts what it reads again.
ENV_TERMINATION_LOG = "MODEL_FETCH_TERMINATION_LOG"
TERMINATION_MESSAGE_BYTES = 1024


def say_why(message: str, environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Write why the fetch failed, one line of bounded length, where the kubelet reads it."""
    path = environ.get(ENV_TERMINATION_LOG)
    if not path:
        return
    line = " ".join(message.split()).encode()[:TERMINATION_MESSAGE_BYTES].decode(errors="ignore")
    with contextlib.suppress(OSError):
        Path(path).write_text(line + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)  # exits 2 on bad arguments, like ExitCode.USAGE
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("httpx", "httpx2", "huggingface_hub"):  # one line per request otherwise
        logging.getLogger(chatty).setLevel(logging.WARNING)
    limits = Limits(
        max_bytes=args.max_bytes,
        deadline_seconds=args.deadline,
        sha256=args.sha256,
        redirect_hosts=frozenset(h.lower() for h in args.allow_redirect_host),
    )
    # A backstop for reads that block inside a library: the alarm interrupts them.
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, args.deadline + 1)
    try:
        trust_ca_bundle(os.environ)
        files = fetch(args.uri, args.dest, limits)
    except FetchError as exc:
        log.error("fetch failed (exit %d, %s): %s", exc.code, exc.code.name.lower(), exc)
        say_why(f"fetch failed (exit {int(exc.code)}, {exc.code.name.lower()}): {exc}")
        if exc.code == ExitCode.DEADLINE:
            logging.shutdown()
            os._exit(exc.code)  # download threads of a library may still be blocked: do not wait
        return exc.code
    except OSError as exc:
        log.error("fetch failed (exit %d, local_io): %s: %s", ExitCode.LOCAL_IO, type(exc).__name__, exc)
        say_why(f"fetch failed (exit {int(ExitCode.LOCAL_IO)}, local_io): {type(exc).__name__}: {exc}")
        return ExitCode.LOCAL_IO
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    total = sum(f.stat().st_size for f in files)
    log.info("fetched %d file(s), %d bytes, from %s into %s", len(files), total, args.uri, args.dest)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
