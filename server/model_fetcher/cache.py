"""The destination as a cache. A destination on a cache claim outlives the pod and may hold what
an earlier fetch, or a fetch of another service, left there: nothing in it is served unless it
is a file the source names now, with the digest the source publishes for it. Replicas sharing
the claim take turns (an flock), so none removes or replaces what another is still writing."""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from .errors import ExitCode, FetchError
from .files import CHUNK, Digests, Expected, safe_relative
from .limits import Limits

log = logging.getLogger("model_server.storage")

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
    digests = Digests(expected)
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        while chunk := f.read(CHUNK):
            limits.remaining()
            digests.update(chunk)
    return digests.mismatch() is None
