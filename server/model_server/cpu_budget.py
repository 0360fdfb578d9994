"""How many CPUs the server may use: its cgroup's CPU limit (a pod's `resources.limits.cpu`) and
its affinity mask, not the host's cores.

ONNX Runtime and torch size their thread pools from the host's core count. On a 64-core node a
pod limited to 2 CPUs would run 64 compute threads, which the kernel's CFS quota then throttles in
turn: every batch waits for the slowest of them. The runtimes get this budget instead, unless
`--intra-op-threads` says otherwise.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def v2_limit(cpu_max: str) -> float | None:
    """CPUs allowed by a cgroup v2 `cpu.max` ("QUOTA PERIOD", or "max PERIOD": none)."""
    fields = cpu_max.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    quota, period = int(fields[0]), int(fields[1])
    return quota / period if quota > 0 and period > 0 else None


def v1_limit(quota_us: str, period_us: str) -> float | None:
    """CPUs allowed by cgroup v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: none)."""
    quota, period = int(quota_us), int(period_us)
    return quota / period if quota > 0 and period > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _own_v2_path(proc_self_cgroup: str) -> str:
    """This process's cgroup v2 path ("0::/kubepods/...", or "/" inside its own namespace)."""
    for line in proc_self_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return "/"


def cgroup_limit(root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> float | None:
    """The tightest CPU limit over this process's cgroup and its ancestors, v2 or v1; None if
    there is none (or no cgroup file system is mounted)."""
    limits: list[float] = []
    own = Path(_own_v2_path(_read(proc_self_cgroup) or ""))
    for directory in [own, *own.parents]:
        text = _read(root / directory.relative_to("/") / "cpu.max") if directory.is_absolute() else None
        limit = v2_limit(text) if text else None
        if limit is not None:
            limits.append(limit)
    quota, period = _read(root / "cpu" / "cpu.cfs_quota_us"), _read(root / "cpu" / "cpu.cfs_period_us")
    if quota and period:
        limit = v1_limit(quota, period)
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def budget(affinity: int, limit: float | None) -> int:
    """Whole CPUs to size a thread pool by: the affinity mask, capped by the limit rounded up
    (a 2.5-CPU limit still gives the runtime a third thread's worth of time), at least one."""
    return max(1, min(affinity, math.ceil(limit)) if limit is not None else affinity)


def available_cpus() -> int:
    """This process's CPU budget, read from the affinity mask and the cgroup file system."""
    return budget(len(os.sched_getaffinity(0)), cgroup_limit())


def threads_per_instance(requested: int, instances: str) -> int:
    """`--intra-op-threads` if set; else the CPU budget shared by the `--instances` a number names
    (`auto` runs one instance per GPU, or one on CPU: the whole budget each)."""
    if requested:
        return requested
    count = int(instances) if instances.strip().isdigit() and int(instances) > 0 else 1
    return max(1, available_cpus() // count)
