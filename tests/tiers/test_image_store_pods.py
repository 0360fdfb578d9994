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


def image_name(work: pathlib.Path) -> str:
    """A name of this test's own: podman's names are the machine's."""
    return f"localhost/rio-store-test:{work.name.lower()}"


def build(work: pathlib.Path, text: str) -> str:
    """An image whose /greeting is `text`: another text, another image ID."""
    context = work / "context"
    context.mkdir(exist_ok=True)
    shutil.copy(BUSYBOX, context / "busybox")
    (context / "greeting").write_text(text)
    (context / "Containerfile").write_text("FROM scratch\nCOPY busybox /bin/busybox\nCOPY greeting /greeting\n")
    build_image(context / "Containerfile", context, image_name(work))
    return imagestore.podman_images()[image_name(work)]


@pytest.fixture
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    # Short: containerd's socket paths must fit in a sockaddr_un.
    path = pathlib.Path(subprocess.check_output(["mktemp", "-d", "/tmp/rio-store-XXXXXX"], text=True).strip())
    yield path
    subprocess.run(["podman", "rmi", "-f", image_name(path)], capture_output=True, check=False, timeout=120)
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
    store, name = work / "store", image_name(work)
    first = build(work, "hello")
    pids, record = started()
    assert imagestore.sync(store, [name], work / "s1", record) == [name]
    assert len(pids) == 1  # the change was made by a containerd of its own, recorded for teardown
    assert imagestore.sync(store, [name], work / "s2", record) == []  # nothing started, nothing imported
    assert len(pids) == 1
    assert imagestore.read_index(store) == {name: first}
    second = build(work, "hello again")
    assert second != first
    assert imagestore.sync(store, [name], work / "s3", record) == [name]
    assert imagestore.read_index(store) == {name: second}
    subprocess.run(["podman", "rmi", name], capture_output=True, check=True, timeout=120)
    assert imagestore.sync(store, [], work / "s4", record) == []
    assert imagestore.read_index(store) == {}
    assert name not in stored(store, work / "s5")
    # Its layers went with it: only the (empty) databases and directories are left.
    assert not [p for p in (store / "root" / "io.containerd.content.v1.content").rglob("*") if p.is_file()]


def test_a_seeded_root_runs_the_image_and_leaves_the_store_as_it_was(work: pathlib.Path) -> None:
    store, copy, name = work / "store", work / "copy", image_name(work)
    build(work, "hello from the store")
    _, record = started()
    imagestore.sync(store, [name], work / "s1", record)
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
        ran = ctr("run", "--rm", "--snapshotter", imagestore.SNAPSHOTTER, name, "greet", "/bin/busybox", "cat",
                  "/greeting")  # fmt: skip
        assert ran.stdout.decode() == "hello from the store"
        # What a tier's containerd does with its copy: containers written to, images removed.
        ctr("run", "--rm", "--snapshotter", imagestore.SNAPSHOTTER, name, "write", "/bin/busybox", "sh", "-c",
            "echo changed > /greeting")  # fmt: skip
        ctr("images", "rm", "--sync", name)
    assert digests(store) == before
    assert name in stored(store, work / "s3")
    assert imagestore.sync(store, [name], work / "s4", record) == []
