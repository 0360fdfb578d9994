"""The node's images, kept between runs of the real-pods tier.

Importing a saved image into a fresh containerd writes it twice (content store, then unpacked
snapshots): the CPU vLLM image's 2.7 GB took 51-93 s on every run. Instead, one containerd root
per machine (`STORE`, beside the built images' other caches) holds every image the tier has
imported, unpacked, each recorded with the podman image ID it was imported from. A tier run
brings the store up to date (an image podman rebuilt or no longer has is dropped and the new one
imported, streamed from `podman save` without a tarball on disk) and then starts its own
containerd on a copy of the store whose blobs are hard links and whose unpacked layers are
symbolic links to the store's: nothing is written twice, the copy is made and removed in well
under a second, and the run's containerd, with its containers and metadata, is still its own.

The links are safe because neither is ever written in place: content blobs are immutable, and a
committed snapshot is only ever an overlay lower directory (a container's writes go to its own
upper directory; removing the snapshot removes the link). The two bolt databases are copied.

The store is changed only under a lock file, by a containerd without the CRI plugin whose sockets
and state are in the tier's work directory, so the tier's teardown stops it even if the run is
killed half-way; the mounts it makes while it unpacks a layer are under the store's
`root/tmpmounts`, and the tier's teardown unmounts whatever is mounted under the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import IO

from testsupport.waiting import eventually

CACHE = (
    pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "rocm-inference-operator" / "pods"
)
STORE = CACHE / "containerd"
NAMESPACE = "k8s.io"  # the namespace the kubelet's CRI reads images from
SNAPSHOTTER = "overlayfs"
# Written after an image is imported and before one is removed: an image it names is in the store.
INDEX = "images.json"
Ctr = Callable[..., "subprocess.CompletedProcess[bytes]"]
# A committed layer is only ever an overlay lower directory: linked, not copied.
SNAPSHOTS = f"io.containerd.snapshotter.v1.{SNAPSHOTTER}/snapshots"
# What the tier's containerd writes to: copied, never linked (the rest is blobs and layers).
DATABASES = ("io.containerd.metadata.v1.bolt/meta.db", f"io.containerd.snapshotter.v1.{SNAPSHOTTER}/metadata.db")


def podman_images() -> dict[str, str]:
    """Every tagged image podman has: name -> image ID."""
    listed = subprocess.run(
        ["podman", "images", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.Id}}"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    found = {}
    for line in listed.stdout.splitlines():
        name, _, image_id = line.partition(" ")
        if not name.endswith(":<none>"):
            found[name] = image_id.removeprefix("sha256:")
    return found


def read_index(store: pathlib.Path) -> dict[str, str]:
    """name -> the podman image ID the store's copy was imported from."""
    path = store / INDEX
    return dict(json.loads(path.read_text())) if path.is_file() and (store / "root").is_dir() else {}


def _write_index(store: pathlib.Path, index: dict[str, str]) -> None:
    tmp = store / f"{INDEX}.tmp"
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True))
    tmp.replace(store / INDEX)


def plan(index: dict[str, str], podman: dict[str, str], wanted: list[str]) -> tuple[list[str], list[str]]:
    """(to import, to remove): a wanted image the store lacks or holds at another ID is imported;
    one podman no longer has under that name at that ID is removed (it could never be used)."""
    missing = [name for name in wanted if name not in podman]
    assert not missing, f"images not built: {missing}"
    to_import = [name for name in wanted if index.get(name) != podman[name]]
    to_remove = [name for name, image_id in index.items() if podman.get(name) != image_id and name not in wanted]
    return to_import, to_remove


@contextlib.contextmanager
def locked(store: pathlib.Path) -> Iterator[None]:
    """The store to oneself: one change or copy at a time on the machine."""
    store.parent.mkdir(parents=True, exist_ok=True)
    with (store.parent / f"{store.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _config(store: pathlib.Path, scratch: pathlib.Path) -> pathlib.Path:
    text = f"""version = 2
root = "{store / "root"}"
state = "{scratch / "state"}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{scratch / "containerd.sock"}"
[ttrpc]
  address = "{scratch / "containerd-ttrpc.sock"}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{scratch / "opt"}"
"""
    path = scratch / "containerd.toml"
    path.write_text(text)
    return path


@contextlib.contextmanager
def store_containerd(store: pathlib.Path, scratch: pathlib.Path, record: Callable[[int, str], None]) -> Iterator[Ctr]:
    """A containerd on the store's root (no CRI: the kubelet never sees it), and `ctr` against it."""
    scratch.mkdir(parents=True, exist_ok=True)
    socket = scratch / "containerd.sock"
    config = _config(store, scratch)
    with (scratch / "containerd.log").open("ab") as log:
        process = subprocess.Popen(
            ["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    record(process.pid, str(config))  # its command line names it: no other process matches

    def ctr(*args: str, stdin: IO[bytes] | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            ["ctr", "--address", str(socket), "-n", NAMESPACE, *args],
            stdin=stdin, capture_output=True, check=False, timeout=900,
        )  # fmt: skip
        if check and done.returncode:
            log = (scratch / "containerd.log").read_text(errors="replace")[-2000:]
            raise AssertionError(f"ctr {' '.join(args)}: exit {done.returncode}: {done.stderr.decode()}\n{log}")
        return done

    try:

        def answers() -> bool:
            assert process.poll() is None, (scratch / "containerd.log").read_text()[-3000:]
            version = ["ctr", "--address", str(socket), "version"]
            return subprocess.run(version, capture_output=True, check=False).returncode == 0

        eventually(answers, interval=0.1, what="the image store's containerd")
        yield ctr
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _import(ctr: Ctr, name: str) -> None:
    """`podman save` streamed into `ctr images import`, unpacked for the CRI's snapshotter."""
    save = subprocess.Popen(["podman", "save", "--format", "docker-archive", name], stdout=subprocess.PIPE)
    try:
        ctr("images", "import", "--snapshotter", SNAPSHOTTER, "-", stdin=save.stdout)
    finally:
        assert save.stdout is not None
        save.stdout.close()
        assert save.wait(600) == 0, f"podman save {name} failed"


def sync(
    store: pathlib.Path, wanted: list[str], scratch: pathlib.Path, record: Callable[[int, str], None]
) -> list[str]:
    """Bring the store up to date for `wanted` (names podman has); the names imported. Hold
    `locked(store)`. `record(pid, marker)` is told of the containerd started for the change (the
    marker is a word of its command line)."""
    index, podman = read_index(store), podman_images()
    to_import, to_remove = plan(index, podman, wanted)
    if not to_import and not to_remove:
        return []
    with store_containerd(store, scratch, record) as ctr:
        for name in to_remove:
            del index[name]
            _write_index(store, index)
            ctr("images", "rm", "--sync", name, check=False)  # gone already: as wanted
        for name in to_import:
            if index.pop(name, None) is not None:
                # A rebuilt image: its old version goes first, its garbage collected before the
                # import. Replaced by the import instead, the old version's snapshots would be
                # collected while the new one unpacks onto the layers they share ("parent
                # snapshot ... does not exist").
                _write_index(store, index)
                ctr("images", "rm", "--sync", name, check=False)
            _write_index(store, index)
            _import(ctr, name)
            index[name] = podman[name]
            _write_index(store, index)
    return to_import


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem (a tmpfs /tmp): a copy, as an import would have written
        shutil.copy2(source, target)


def seed(store: pathlib.Path, root: pathlib.Path) -> None:
    """A containerd root at `root` holding the store's images: each unpacked layer a symbolic
    link to the store's (a few dozen links, where its files are tens of thousands), each blob a
    hard link, the databases copied. Hold `locked(store)`."""
    source = store / "root"
    if not source.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        return
    assert not root.exists(), f"{root} exists: a containerd root is seeded once"
    layers = source / SNAPSHOTS
    shutil.copytree(
        source,
        root,
        symlinks=True,
        copy_function=_link_or_copy,
        ignore=lambda directory, names: names if pathlib.Path(directory) == layers else [],
    )
    for layer in layers.iterdir() if layers.is_dir() else ():
        (root / SNAPSHOTS / layer.name).symlink_to(layer)
    for name in DATABASES:
        path = root / name
        if path.exists():
            path.unlink()  # the link, not the store's database
            shutil.copy2(source / name, path)
