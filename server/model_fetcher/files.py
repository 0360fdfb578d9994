"""One file written as every source writes it: its path kept inside the destination, streamed
to a temporary name, refused when it is an HTML page or does not match a digest its source
published, and only then renamed into place, so the server never sees half a model."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import ExitCode, FetchError
from .limits import Limits

CHUNK = 1 << 20
# Bytes of a file's start looked at for an HTML page saved under a model's name.
SNIFF_BYTES = 512
HTML_STARTS = (b"<!doctype html", b"<html", b"<head", b"<body", b"<?xml")
TEXT_NAMES = (".html", ".htm", ".xml")  # files that may be markup (never model weights)


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


def parse_digest(text: str, what: str) -> str:
    digest = text.strip().split()[0].lower() if text.strip() else ""
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise FetchError(f"{what}: {text.strip()[:80]!r} is not a sha256 hex digest", ExitCode.USAGE)
    return digest


@dataclass(frozen=True)
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


def hex_digest(value: object, length: int) -> str | None:
    """A published digest as lowercase hex, or None when it is not one of `length` digits."""
    text = str(value or "").strip().strip('"').lower()
    return text if re.fullmatch(f"[0-9a-f]{{{length}}}", text) else None


class Digests:
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
    digests = Digests(expected, sha256)
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
