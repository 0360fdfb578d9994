"""Hugging Face Hub sources: a repository at one commit, listed and checked first (paths, total
size), downloaded with `huggingface_hub` into a staging directory and moved into place file by
file, each only when the Hub's digest for it matches. huggingface_hub is imported only here,
and only for an hf:// model."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from .cache import STATE_DIR, exclusive, manifest_path, prune, verified_files
from .errors import ExitCode, FetchError
from .files import CHUNK, Digests, Expected, contained, hex_digest
from .limits import Limits
from .uris import parse_hf

log = logging.getLogger("model_server.storage")

ENV_ALLOW_HTTP_TOKEN = "MODEL_FETCH_ALLOW_HTTP_TOKEN"


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


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
        return Expected(size=f.size, sha256=hex_digest(getattr(lfs, "sha256", None), 64))
    if getattr(f, "xet_hash", None):  # stored in Xet with no LFS entry: the blob id is a pointer's
        return Expected(size=f.size)
    return Expected(size=f.size, git_blob=hex_digest(getattr(f, "blob_id", None), 40))


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
    digests = Digests(expected)
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
