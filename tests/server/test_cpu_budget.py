"""The runtimes' thread pools are sized by the CPUs the pod may use (its cgroup's limit and the
affinity mask), not by the host's cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from model_server import cpu_budget
from model_server.backends import create_backend
from tests.server.helpers import make_settings
from testsupport.onnx_models import mlp_model


def cgroup_tree(tmp_path: Path, own: str, limits: dict[str, str], v1: tuple[str, str] | None = None) -> Path:
    """A cgroup file system: `cpu.max` per directory, /proc/self/cgroup naming `own`."""
    root = tmp_path / "cgroup"
    for directory, cpu_max in limits.items():
        (root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / directory.lstrip("/") / "cpu.max").write_text(cpu_max + "\n")
    if v1 is not None:
        (root / "cpu").mkdir(parents=True, exist_ok=True)
        (root / "cpu" / "cpu.cfs_quota_us").write_text(v1[0] + "\n")
        (root / "cpu" / "cpu.cfs_period_us").write_text(v1[1] + "\n")
    (tmp_path / "proc-self-cgroup").write_text(f"0::{own}\n")
    return root


def limit(tmp_path: Path, own: str, limits: dict[str, str], v1: tuple[str, str] | None = None) -> float | None:
    root = cgroup_tree(tmp_path, own, limits, v1)
    return cpu_budget.cgroup_limit(root, tmp_path / "proc-self-cgroup")


def test_cpu_max_is_read_as_a_number_of_cpus() -> None:
    assert cpu_budget.v2_limit("200000 100000\n") == 2.0
    assert cpu_budget.v2_limit("50000 100000") == 0.5
    assert cpu_budget.v2_limit("max 100000") is None
    assert cpu_budget.v2_limit("") is None
    assert cpu_budget.v1_limit("-1", "100000") is None
    assert cpu_budget.v1_limit("150000", "100000") == 1.5


def test_the_tightest_limit_over_the_process_cgroup_and_its_ancestors_counts(tmp_path: Path) -> None:
    pod = "/kubepods/burstable/pod1/ctr"
    limits = {"/": "max 100000", "/kubepods/burstable/pod1": "400000 100000", pod: "250000 100000"}
    assert limit(tmp_path / "a", pod, limits) == 2.5
    # A pod-level limit tighter than the container's own.
    assert limit(tmp_path / "b", pod, {**limits, "/kubepods/burstable/pod1": "100000 100000"}) == 1.0
    # Inside its own cgroup namespace the container's cgroup is the root.
    assert limit(tmp_path / "c", "/", {"/": "300000 100000"}) == 3.0
    # cgroup v1's quota.
    assert limit(tmp_path / "d", "/", {}, v1=("200000", "100000")) == 2.0
    # No limit anywhere, or no cgroup file system at all.
    assert limit(tmp_path / "e", pod, {"/": "max 100000", pod: "max 100000"}) is None
    assert cpu_budget.cgroup_limit(tmp_path / "absent", tmp_path / "absent-proc") is None


@pytest.mark.parametrize(
    ("affinity", "cgroup", "expected"),
    [(64, 2.0, 2), (64, 2.5, 3), (64, 0.2, 1), (2, 8.0, 2), (16, None, 16), (1, None, 1)],
)
def test_the_budget_is_the_affinity_capped_by_the_limit_rounded_up(
    affinity: int, cgroup: float | None, expected: int
) -> None:
    assert cpu_budget.budget(affinity, cgroup) == expected


def test_the_budget_is_shared_by_the_instances_unless_threads_are_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_budget, "available_cpus", lambda: 8)
    assert cpu_budget.threads_per_instance(0, "auto") == 8
    assert cpu_budget.threads_per_instance(0, "2") == 4
    assert cpu_budget.threads_per_instance(0, "16") == 1
    assert cpu_budget.threads_per_instance(3, "2") == 3


def test_this_process_budget_is_within_its_affinity() -> None:
    assert 1 <= cpu_budget.available_cpus() <= len(os.sched_getaffinity(0))


def session_threads(model: Path, intra_op_threads: int) -> int:
    """The intra-op threads of the ONNX session the server would load `model` into."""
    backend = create_backend(model, make_settings(model, intra_op_threads=intra_op_threads))
    backend.load()
    try:
        return int(backend._session.get_session_options().intra_op_num_threads)  # type: ignore[attr-defined]
    finally:
        backend.close()


def test_an_onnx_session_gets_the_budget_as_its_intra_op_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = mlp_model(tmp_path / "model.onnx", [4, 8, 2])
    monkeypatch.setattr(cpu_budget, "available_cpus", lambda: 3)
    assert session_threads(model, 0) == 3
    assert session_threads(model, 2) == 2  # --intra-op-threads wins
