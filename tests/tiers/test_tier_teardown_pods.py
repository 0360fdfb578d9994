"""The tier leaves nothing behind, even when the process that started it is killed half-way:
`teardown` (run by the next start, or by `python -m testsupport.nodecluster down DIR`) removes
processes, mounts, cgroups, network namespaces, the bridge and iptables chains, and restores the
sysctls the kubelet changed."""

from __future__ import annotations

import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from testsupport import nodecluster

pytestmark = [pytest.mark.pods, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]


def sysctls() -> dict[str, str]:
    return {k: (pathlib.Path("/proc/sys") / k).read_text().strip() for k in nodecluster.SYSCTLS}


def test_a_tier_killed_half_way_leaves_nothing_after_teardown() -> None:
    work = pathlib.Path(tempfile.mkdtemp(prefix="rio-kill-"))
    before = sysctls()
    holder = subprocess.Popen(
        [sys.executable, "-m", "testsupport.nodecluster", "up", str(work)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()  # printed once a pod runs
        assert line.startswith("KUBECONFIG="), line
        holder.send_signal(signal.SIGKILL)  # no cleanup of its own: the worst case
        holder.wait(10)
        time.sleep(1)
        left = nodecluster.leftovers(work)
        # The kill left a running cluster: processes, the pod's mounts and cgroups, the bridge.
        for kind in ("process", "mount", "cgroup", "bridge", "iptables", "netns"):
            assert any(item.startswith(kind) for item in left), (kind, left)
    finally:
        holder.kill()
        nodecluster.teardown(work)
    assert nodecluster.leftovers(work) == []
    assert sysctls() == before
    shutil.rmtree(work)  # no mount is left under it, so this removes it all


def test_a_mount_left_in_the_image_store_is_found_and_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The image store outlives the tier, its mounts do not: a containerd killed while it unpacked
    a layer into the store leaves one under `root/tmpmounts`."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="rio-kill-"))
    store = pathlib.Path(tempfile.mkdtemp(prefix="rio-store-"))
    monkeypatch.setattr(nodecluster.imagestore, "STORE", store)
    point = store / "root" / "tmpmounts" / "containerd-mount1"
    point.mkdir(parents=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(point)], check=True, timeout=30)
        assert nodecluster.leftovers(work) == [f"mount {point}"]
        nodecluster.teardown(work)
        assert nodecluster.leftovers(work) == []
        assert point.is_dir()  # the store itself stays
    finally:
        subprocess.run(["umount", str(point)], capture_output=True, check=False, timeout=30)
        shutil.rmtree(work)
        shutil.rmtree(store)
