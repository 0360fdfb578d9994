"""Fixtures shared by every test directory: an emulated cluster and the real operator on it."""

from __future__ import annotations

import json
import logging
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from inference_operator.settings import ANY_URL, IMAGE_REGISTRIES_ENV, PROMETHEUS_ALLOWED_URLS_ENV
from tests import tiers
from testsupport import nodecluster
from testsupport.cluster import Cluster, running_cluster

# The tests' Prometheus servers listen on loopback ports, which the operator's default allow-list
# (in-cluster Services) refuses; tests of the list itself set it or pass a policy explicitly.
os.environ.setdefault(PROMETHEUS_ALLOWED_URLS_ENV, ANY_URL)
# The platform's registries as the examples need them (their modelcars come from ghcr.io/example/);
# tests of the policy set their own.
os.environ.setdefault(IMAGE_REGISTRIES_ENV, "ghcr.io/rocm-inference/,ghcr.io/example/,docker.io/vllm/")


# The real tiers' fixtures, each skipping its marked tests with one line where it cannot run.
pytest_plugins = ["tests.tiers.pods", "tests.tiers.realapi"]

# Measured figures of the real-pods tier (`pytest -m pods`), printed at the end of the run.
FIGURES: dict[str, float] = {}
# Tiers whose tests share one session-wide thing that must not run twice at once: the real-pods
# tier (one node cluster on a fixed bridge address) and the real-API-server tier. Each is one
# scope, named so that no module's path can take it.
SHARED_SCOPES = tuple(f"tier {tier}" for tier in tiers.SUFFIXES)
# The longest scope, which runs first on a worker of its own while the others share the rest.
FIRST_SCOPE = f"tier {tiers.FIRST}"


def scope_of(nodeid: str) -> str:
    """A test's xdist scope: its tier's (one for the whole tier), else its module's."""
    tier = tiers.tier_of(nodeid)
    return f"tier {tier}" if tier else nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`pytest -n 2 --dist loadscope` (scripts/test.sh): one scope per module, except each tier
    of SHARED_SCOPES, which is one scope wherever its modules live (the scheduler sees node ids
    only, so the tier is read from the module's name: tests/tiers). The tiers' waits (pods
    starting, alerts firing, engines loading under a pod's CPU limit) leave a core idle that the
    other worker fills with the rest of the suite."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TierScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    config.option.loadscopereorder = False  # the collection's order: FIRST_SCOPE goes first
    return TierScopes(config, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On an xdist worker: its real-pods figures go back to the controller, which prints them."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["figures"] = json.dumps(FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    FIGURES.update(json.loads(getattr(node, "workeroutput", {}).get("figures", "{}")))


# Seconds spent in tests (setup, call and teardown) by worker, by tier marker and by directory:
# which worker the suite's wall-clock time waits for, and where its time goes.
BUSY: dict[str, float] = {}
KINDS = ("worker", "tier", "tests/")


def busy_keys(report: pytest.TestReport) -> tuple[str, str, str]:
    """Where a report's seconds count: its worker, its tier (by marker), its feature folder."""
    gateway = getattr(getattr(report, "node", None), "gateway", None)
    worker = f"worker {gateway.id}" if gateway is not None else "worker main"
    tier = next((f"tier {tier}" for tier in tiers.SUFFIXES if tier in report.keywords), "tier none (the fast rest)")
    directory = "/".join(report.nodeid.split("::", 1)[0].split("/")[:2])
    return worker, tier, directory


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key in busy_keys(report):
        BUSY[key] = BUSY.get(key, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("real-pods tier figures")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value:.1f}")
    if BUSY:
        terminalreporter.section("seconds in tests, by worker, by tier and by directory")
        kind = {name: next((i for i, k in enumerate(KINDS) if name.startswith(k)), len(KINDS)) for name in BUSY}
        for name, seconds in sorted(BUSY.items(), key=lambda item: (kind[item[0]], -item[1])):
            terminalreporter.write_line(f"{name}: {seconds:.0f}")


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what will not run
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-pods tier first (a stable sort: the order within it and elsewhere is kept, and
    is the same on every xdist worker, as xdist requires).

    A test marked `proven_on_pods(module)` skips when that real-pods module runs in the same
    session: the same behaviour proven on real pods, without a second minute-long engine start
    on a 2-core machine. Wherever the tier cannot run, or is left out, the twin runs."""
    items.sort(key=lambda item: scope_of(item.nodeid) != FIRST_SCOPE)
    twins = [item for item in items if item.get_closest_marker("proven_on_pods")]
    if not twins or nodecluster.missing() is not None:
        return
    running = {str(item.path.relative_to(item.config.rootpath)) for item in items}
    for item in twins:
        (module,) = item.get_closest_marker("proven_on_pods").args  # type: ignore[union-attr]
        if module in running:
            item.add_marker(pytest.mark.skip(reason=f"proven on real pods in this run: {module}"))


@pytest.fixture
def cluster(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as cluster:
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield cluster


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[KopfRunner]:
    """The real operator (kopf run) against the emulated cluster."""
    args = ["run", "--all-namespaces", "--standalone", "--verbose", "-m", "inference_operator.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        yield runner
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None, runner.exception


@pytest.fixture(autouse=True)
def root_logger_as_it_was() -> Iterator[None]:
    """Each test leaves the root logger as it found it. A KopfRunner (kopf's `configure`) sets it
    to DEBUG or INFO with a stderr handler of its own, for the rest of the process: every later
    test then formatted every library's debug lines (300 gRPC heads took 177 s in hpack's)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = [h for h in root.handlers if h in handlers or type(h).__module__.startswith("_pytest")]
