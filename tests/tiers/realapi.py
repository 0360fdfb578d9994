"""The real-apiserver tier's fixtures (a plugin, loaded by tests/conftest.py; tests/tiers/realapi.md):
a real kube-apiserver and etcd (envtest's layout), the shipped CRDs, the chart's RBAC for the
operator's user, and the real operator process.

Its tests are the modules `*_realapi.py` marked `realapi`, skipped with one line where the
binaries are not installed (testsupport/envtest.py says where they are looked for). A module
that wants the tier's operator process as `operator` says so with `operator_fixture()`.
"""

from __future__ import annotations

import contextlib
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from testsupport.envtest import OPERATOR_USER, SKIP_REASON, ApiServer, assets, install_crds, running_apiserver
from testsupport.processes import free_port, stop
from testsupport.waiting import eventually

#: The operator's start on a loaded machine: its imports, then kopf's startup activities.
STARTED_S = 120


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test marked `realapi` is skipped with one reason where the binaries are missing."""
    tier = [item for item in items if item.get_closest_marker("realapi")]
    if tier and assets() is None:
        skip = pytest.mark.skip(reason=SKIP_REASON)
        for item in tier:
            item.add_marker(skip)


@contextlib.contextmanager
def own_apiserver(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[ApiServer, pathlib.Path]]:
    """An API server with the shipped CRDs, and its work directory (`name`, made anew): the
    tier's, or a module's own where it adds what the others must not see (controllers,
    cluster-wide objects)."""
    directory = assets()
    assert directory is not None
    work = tmp_path_factory.mktemp(name)
    with running_apiserver(work, directory) as server:
        install_crds(server)
        yield server, work


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with own_apiserver(tmp_path_factory, "envtest") as (server, _):
        yield server


class Operator:
    """The operator as a process (`inference-operator run -A`), as the operator's user (or
    `user`), with `args` added to its command line and `env` to its environment."""

    def __init__(
        self,
        server: ApiServer,
        log: pathlib.Path,
        user: str = OPERATOR_USER,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        self.server, self.log, self.user, self.args, self.env = server, log, user, args, env or {}
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the process; return once kopf's liveness endpoint answers, which it does only
        after the operator's startup, its SIGTERM handler in place: a stop before that would kill
        it half-started, and a log line of an earlier start would pass for this one's."""
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        env = {"KUBECONFIG": str(self.server.kubeconfig(self.user)), "PATH": "/usr/bin:/bin"}
        env.update({k: v for k, v in __import__("os").environ.items() if k.startswith(("PYTHON", "HOME", "LANG"))})
        # The platform's registries: the examples' modelcar images come from ghcr.io/example/.
        env["INFERENCE_OPERATOR_POLICY_IMAGE_REGISTRIES"] = "ghcr.io/rocm-inference/,ghcr.io/example/"
        # NetworkPolicies on, as the chart installs it.
        env["INFERENCE_OPERATOR_NETWORK_POLICY"] = "true"
        env["INFERENCE_OPERATOR_NAMESPACE"] = "inference-system"
        env.update(self.env)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "inference_operator", "run", "-A", "--metrics-port", "0", "-v"),
                    *("--liveness", liveness, *self.args),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

        eventually(
            lambda: self._serving(liveness),
            timeout=STARTED_S,
            what="the operator's liveness endpoint",
            ignore=(httpx.TransportError,),
        )

    def _serving(self, liveness: str) -> bool:
        assert self.process is not None
        code = self.process.poll()
        assert code is None, f"the operator exited ({code}) before it served: {self.text()[-3000:]}"
        return httpx.get(liveness, timeout=5).status_code == 200

    def stop(self) -> int:
        assert self.process is not None
        code = stop(self.process, timeout=20)
        self.process = None
        return code

    @contextlib.contextmanager
    def stopped(self) -> Iterator[int]:
        """The operator stopped for the block (its exit code given), started again after it
        whatever the block does: the tests after this one share the process."""
        code = self.stop()
        try:
            yield code
        finally:
            self.start()

    def kill(self) -> None:
        """SIGKILL, as the OOM killer ends a process: no cleanup, no goodbye to its peers."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)
        self.process = None

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def running_operator(server: ApiServer, log: pathlib.Path, env: dict[str, str] | None = None) -> Iterator[Operator]:
    """The operator process on `server`, stopped after unless a test already stopped or killed it."""
    operator = Operator(server, log, env=env)
    operator.start()
    try:
        yield operator
    finally:
        if operator.process is not None:
            operator.stop()


@pytest.fixture(scope="session")
def realapi_operator(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """The tier's one operator process, shared by every module of the tier."""
    with running_operator(apiserver, tmp_path_factory.mktemp("operator") / "operator.log") as running:
        yield running


def operator_fixture() -> Any:
    """A module's `operator` fixture (`operator = realapi.operator_fixture()`): the tier's one
    process. tests/conftest.py's `operator`, kopf's runner on the emulator, is nearer every test
    than a plugin's fixture; and a session fixture imported into a module is a definition of that
    module's own, one process per module, all running at once and fighting over the same objects."""

    @pytest.fixture(name="operator")
    def tier_operator(realapi_operator: Operator) -> Operator:
        return realapi_operator

    return tier_operator
