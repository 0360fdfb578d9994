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
