"""The machine's image store (testsupport.imagestore): each image is imported once, again only
when podman rebuilt it, dropped when podman no longer has it; a tier's containerd root seeded
from it runs the image, and what that containerd does to its copy leaves the store as it was.

On a store of its own in a temporary directory, with a small image built here from busybox."""

from __future__ import annotations

import hashlib
import pathlib
import shutil
import subprocess
from collections.abc import Callable, Iterator

import pytest

from testsupport import imagestore
from testsupport.nodecluster import BUSYBOX, build_image

pytestmark = [pytest.mark.pods, pytest.mark.slow]

NAME = "localhost/rio-store-test:1"


def build(context: pathlib.Path, text: str) -> str:
    """An image whose /greeting is `text`: another text, another image ID."""
    context.mkdir(exist_ok=True)
    shutil.copy(BUSYBOX, context / "busybox")
    (context / "greeting").write_text(text)
    (context / "Containerfile").write_text("FROM scratch\nCOPY busybox /bin/busybox\nCOPY greeting /greeting\n")
    build_image(context / "Containerfile", context, NAME)
    return imagestore.podman_images()[NAME]


@pytest.fixture
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    # Short: containerd's socket paths must fit in a sockaddr_un.
    path = pathlib.Path(subprocess.check_output(["mktemp", "-d", "/tmp/rio-store-XXXXXX"], text=True).strip())
    yield path
    subprocess.run(["podman", "rmi", "-f", NAME], capture_output=True, check=False, timeout=120)
    shutil.rmtree(path, ignore_errors=True)


def started() -> tuple[list[int], Callable[[int, str], None]]:
    pids: list[int] = []
    return pids, lambda pid, marker: pids.append(pid)


def digests(tree: pathlib.Path) -> dict[str, str]:
    return {
        str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(tree.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def stored(store: pathlib.Path, scratch: pathlib.Path) -> str:
    _, record = started()
    with imagestore.store_containerd(store, scratch, record) as ctr:
        return ctr("images", "ls", "-q").stdout.decode()


def test_an_image_is_imported_once_again_when_rebuilt_and_dropped_when_gone(work: pathlib.Path) -> None:
    store = work / "store"
    first = build(work / "context", "hello")
    pids, record = started()
    assert imagestore.sync(store, [NAME], work / "s1", record) == [NAME]
    assert len(pids) == 1  # the change was made by a containerd of its own, recorded for teardown
    assert imagestore.sync(store, [NAME], work / "s2", record) == []  # nothing started, nothing imported
    assert len(pids) == 1
    assert imagestore.read_index(store) == {NAME: first}
    second = build(work / "context", "hello again")
    assert second != first
    assert imagestore.sync(store, [NAME], work / "s3", record) == [NAME]
    assert imagestore.read_index(store) == {NAME: second}
    subprocess.run(["podman", "rmi", NAME], capture_output=True, check=True, timeout=120)
    assert imagestore.sync(store, [], work / "s4", record) == []
    assert imagestore.read_index(store) == {}
    assert NAME not in stored(store, work / "s5")
    # Its layers went with it: only the (empty) databases and directories are left.
    assert not [p for p in (store / "root" / "io.containerd.content.v1.content").rglob("*") if p.is_file()]


def test_a_seeded_root_runs_the_image_and_leaves_the_store_as_it_was(work: pathlib.Path) -> None:
    store, copy = work / "store", work / "copy"
    build(work / "context", "hello from the store")
    _, record = started()
    imagestore.sync(store, [NAME], work / "s1", record)
    before = digests(store)
    imagestore.seed(store, copy / "root")
    blobs = [p for p in (store / "root" / "io.containerd.content.v1.content").rglob("*") if p.is_file()]
    assert blobs
    for blob in blobs:  # the same files: the image is not written again
        assert (copy / blob.relative_to(store)).stat().st_ino == blob.stat().st_ino
    layers = list((store / "root" / imagestore.SNAPSHOTS).iterdir())
    assert layers
    for layer in layers:
        assert (copy / layer.relative_to(store)).resolve() == layer
    for database in imagestore.DATABASES:  # but the databases are the copy's own
        assert (copy / "root" / database).stat().st_ino != (store / "root" / database).stat().st_ino
    with imagestore.store_containerd(copy, work / "s2", record) as ctr:
        ran = ctr("run", "--rm", "--snapshotter", imagestore.SNAPSHOTTER, NAME, "greet", "/bin/busybox", "cat",
                  "/greeting")  # fmt: skip
        assert ran.stdout.decode() == "hello from the store"
        # What a tier's containerd does with its copy: containers written to, images removed.
        ctr("run", "--rm", "--snapshotter", imagestore.SNAPSHOTTER, NAME, "write", "/bin/busybox", "sh", "-c",
            "echo changed > /greeting")  # fmt: skip
        ctr("images", "rm", "--sync", NAME)
    assert digests(store) == before
    assert NAME in stored(store, work / "s3")
    assert imagestore.sync(store, [NAME], work / "s4", record) == []
