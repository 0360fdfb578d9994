"""How scripts/test.sh splits the suite over two workers (tests/conftest.py), checked against the
installed pytest-xdist's own scheduler: the real-pods tier whole, first, on one worker; the
real-API-server tier whole on one worker; every other module whole. The tiers' modules sit in
feature folders beside ordinary ones, as the suite has them (tests/tiers)."""

from __future__ import annotations

import pathlib
import tomllib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from tests import conftest

# As pytest collects them: by folder, each tier's modules among the others.
COLLECTED = [
    "tests/canary/test_canary_reconcile.py::test_1",
    "tests/chart/test_helm.py::test_1",
    "tests/chart/test_real_pods.py::test_a",
    "tests/chart/test_real_pods.py::test_b",
    "tests/crd/test_explain_realapi.py::test_1",
    "tests/llm/test_multinode_realapi.py::test_1",
    "tests/llm/test_vllm_builders.py::test_1",
    "tests/llm/test_vllm_builders.py::test_2",
    "tests/llm/test_vllm_pods.py::test_c",
    "tests/server/test_y.py::test_1[a]",
    "tests/server/test_y.py::test_1[b]",
    "tests/server/test_z.py::test_1",
    "tests/status/test_status_on_pods.py::test_d",
]
PODS = [nodeid for nodeid in COLLECTED if "_pods.py::" in nodeid]
REALAPI = [nodeid for nodeid in COLLECTED if "_realapi.py::" in nodeid]


def ordered(nodeids: list[str]) -> list[str]:
    """The collection's order after tests/conftest.py's hook (the same on every worker)."""
    items = [SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: None) for nodeid in nodeids]
    conftest.pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    return [item.nodeid for item in items]


COLLECTION = ordered(COLLECTED)


@dataclass(eq=False)
class FakeWorker:
    """What xdist's scheduler calls on a worker."""

    name: str
    sent: list[int] = field(default_factory=list)
    shutting_down: bool = False

    @property
    def gateway(self) -> Any:
        return SimpleNamespace(id=self.name)

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


def run_to_the_end() -> list[list[str]]:
    """The scheduler of `-n 2 --dist loadscope`, fed the collection; each worker finishes what
    it was sent until nothing is left. The test ids each worker ran, in order."""
    config = SimpleNamespace(
        getoption=lambda name: {"dist": "loadscope"}[name],
        option=SimpleNamespace(loadscopereorder=True, maxschedchunk=None),
        getvalue=lambda name: {"tx": ["2*popen"]}.get(name),
    )
    log = SimpleNamespace(loadscopesched=lambda *args: None)
    scheduler = conftest.pytest_xdist_make_scheduler(config, log)  # type: ignore[arg-type]
    workers = [FakeWorker("gw0"), FakeWorker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, COLLECTION)
    scheduler.schedule()
    ran: list[list[str]] = [[], []]
    while not all(w.shutting_down and len(ran[i]) == len(w.sent) for i, w in enumerate(workers)):
        progressed = False
        for i, worker in enumerate(workers):
            if len(ran[i]) < len(worker.sent):
                index = worker.sent[len(ran[i])]
                ran[i].append(COLLECTION[index])
                scheduler.mark_test_complete(worker, index)
                progressed = True
        assert progressed, (ran, [w.sent for w in workers])
    return ran


def test_the_tiers_are_whole_and_the_pods_tier_goes_first_on_a_worker_of_its_own() -> None:
    first, second = run_to_the_end()
    assert sorted(first + second) == sorted(COLLECTION)  # each test once
    assert first[: len(PODS)] == PODS  # first, whole, in order, from three folders
    assert not set(PODS) & set(second)
    whole = [REALAPI, *(
        [nodeid for nodeid in COLLECTION if nodeid.startswith(module)]
        for module in ("tests/llm/test_vllm_builders.py", "tests/server/test_y.py", "tests/chart/test_helm.py")
    )]  # fmt: skip
    for scope in whole:
        on = {i for i, ran in enumerate((first, second)) for nodeid in ran if nodeid in scope}
        assert len(on) == 1, (scope, first, second)


def test_a_tier_is_one_scope_named_so_no_module_takes_it() -> None:
    assert {conftest.scope_of(nodeid) for nodeid in PODS} == {conftest.FIRST_SCOPE}
    assert {conftest.scope_of(nodeid) for nodeid in REALAPI} == {"tier realapi"}
    assert conftest.scope_of("tests/llm/test_vllm_builders.py::test_1") == "tests/llm/test_vllm_builders.py"
    assert not [nodeid for nodeid in COLLECTION if conftest.scope_of(nodeid).startswith("tests/") == (
        nodeid in PODS + REALAPI)]  # fmt: skip


def test_other_distribution_modes_keep_xdist_own_scheduler() -> None:
    config = SimpleNamespace(getoption=lambda name: {"dist": "load"}[name])
    assert conftest.pytest_xdist_make_scheduler(config, lambda *args: None) is None  # type: ignore[arg-type]


def test_collection_puts_the_pods_tier_first_keeping_every_other_order() -> None:
    backwards = ordered(list(reversed(COLLECTED)))
    assert backwards == [n for n in reversed(COLLECTED) if n in PODS] + [
        n for n in reversed(COLLECTED) if n not in PODS
    ]
    assert ordered(COLLECTED) == PODS + [nodeid for nodeid in COLLECTED if nodeid not in PODS]


def test_scripts_test_sh_runs_the_suite_with_these_scopes() -> None:
    """The command line that makes the hook apply is the one CI runs."""
    root = pathlib.Path(__file__).parents[1]
    assert "-m pytest -n 2 --dist loadscope" in (root / "scripts" / "test.sh").read_text()
    # xdist comes with the test extra, which scripts/setup.sh installs.
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert any(requirement.startswith("pytest-xdist") for requirement in extra), extra
