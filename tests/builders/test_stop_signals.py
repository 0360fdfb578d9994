"""A stop signal reaches every process the pods run however early it comes. Each was its
container's PID 1, and PID 1 drops a signal it has no handler for: a pod deleted as it starts ran
on to the SIGKILL at the end of its grace period. For the project's own programs, two guards: a
preStop sleep on every container that runs one of them (the kubelet's SIGTERM comes after it,
past the interpreter's start), and a handler from each program's first line (model_server's
`signals`, the operator's `entry`). vLLM, whose first handler comes after seconds of imports,
runs under an init of the operator's (INIT_SCRIPT), which is PID 1 in its stead."""

from __future__ import annotations

import ast
import contextlib
import pathlib
import shutil
import signal
import subprocess
import sys
from typing import Any

import pytest
import yaml

from inference_operator.builders import Owner, build_all
from inference_operator.engines.vllm import INIT_SCRIPT, under_init
from inference_operator.models import parse_spec
from tests.chart.conftest import helm as chart_helm  # noqa: F401  (the fixture: Helm, or a skip)
from tests.server.test_ms_pid1 import as_pid_1, catches, seconds_to_exit
from testsupport.cluster import Cluster
from testsupport.pod_invariants import pod_specs
from testsupport.waiting import eventually

ROOT = pathlib.Path(__file__).resolve().parents[2]


def runs_our_program(container: dict[str, Any]) -> bool:
    command = container.get("command") or []
    return command[:1] == ["inference-operator"] or command[:3] == ["python", "-m", "model_server"]


def pre_stop_sleep(container: dict[str, Any]) -> float:
    """Seconds the container's preStop sleeps (0 without one): what it asks the interpreter for,
    run here with the interpreter's sleep recorded."""
    hook = ((container.get("lifecycle") or {}).get("preStop") or {}).get("exec")
    if hook is None:
        return 0.0
    command = hook["command"]
    assert command[:2] == ["python", "-c"], command  # the image's own Python, nothing else needed
    ast.parse(command[2])
    recording = f"import time\nasked = []\ntime.sleep = asked.append\nexec({command[2]!r})\nprint(sum(asked))"
    run = subprocess.run([sys.executable, "-c", recording], check=True, timeout=60, capture_output=True, text=True)
    return float(run.stdout)


def our_containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for o in objects for _, pod in pod_specs(o) for c in pod["containers"] if runs_our_program(c)]


def example_objects() -> list[dict[str, Any]]:
    objects = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "InferenceService":
                objects += build_all(Owner(doc["metadata"]["name"], "ml", "u-1", parse_spec(doc["spec"])))
    return objects


def test_every_container_the_operator_runs_our_program_in_sleeps_before_its_sigterm() -> None:
    containers = our_containers(example_objects())
    assert len(containers) >= 5  # the model server of each example that has one
    assert all(pre_stop_sleep(c) >= 1 for c in containers), [c["name"] for c in containers]


@pytest.mark.slow
def test_every_container_the_chart_runs_our_program_in_sleeps_before_its_sigterm(
    chart_helm: Any,  # noqa: F811
) -> None:
    """The operator's pods and the activator's, as the chart renders them with every value file."""
    checked: set[str] = set()
    for values in sorted((ROOT / "charts" / "rocm-inference-operator" / "ci").glob("*-values.yaml")):
        objects = chart_helm.render(yaml.safe_load(values.read_text()) or {})
        for container in our_containers(objects):
            assert pre_stop_sleep(container) >= 1, (values.name, container["name"])
            checked.add(container["name"])
    assert checked == {"operator", "activator"}, checked


@pytest.mark.skipif(shutil.which("unshare") is None, reason="a PID namespace needs unshare")
def test_the_operator_stops_on_a_sigterm_sent_while_it_imports(
    cluster: Cluster, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As PID 1, started by its console script against a cluster it would otherwise serve on:
    the SIGTERM that comes while it imports ends it at once."""
    program = pathlib.Path(sys.executable).with_name("inference-operator")
    outer, pid = as_pid_1([str(program), "run", "-A", "--metrics-port", "0"], tmp_path / "operator.log")
    # The moment its first handler is in place, before its imports: a loaded machine may take
    # longer than any fixed delay to get the interpreter that far (and PID 1 drops a signal it
    # has no handler for, which is the kernel's rule, not the operator's).
    eventually(lambda: catches(pid, signal.SIGTERM) or outer.poll() is not None, interval=0.002, what="a handler")
    took = seconds_to_exit(outer, pid, timeout=60)
    log = (tmp_path / "operator.log").read_text()
    print(f"operator stopped {took:.2f} s after SIGTERM: {log[-200:]}")
    assert outer.returncode in (0, 128 + 15), log[-2000:]


def test_every_vllm_container_runs_vllm_under_the_init_script() -> None:
    """vLLM's first handler comes only after its imports: PID 1 is INIT_SCRIPT, leaders and workers."""
    vllm = [c for o in example_objects() for _, pod in pod_specs(o) for c in pod["containers"] if c["name"] == "vllm"]
    assert len(vllm) >= 4  # the vLLM examples' leaders and the multi-node example's workers
    for container in vllm:
        assert container["command"][:3] == ["python3", "-c", INIT_SCRIPT], container["command"]
        assert container["command"][3:6] == ["python3", "-m", container["command"][5]]
        assert container["command"][5].startswith("vllm.entrypoints.")


@pytest.mark.skipif(shutil.which("unshare") is None, reason="a PID namespace needs unshare")
@pytest.mark.parametrize(
    ("engine", "status"),
    [
        # Still importing: no handler yet, so the signal ends it (it would have been dropped).
        ("import time; time.sleep(600)", 128 + 15),
        # Serving: its own handler stops it gracefully.
        ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(600)", 0),
        # Its status is passed on.
        ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(3)); time.sleep(600)", 3),
    ],
    ids=["no-handler", "graceful", "status"],
)
def test_the_init_script_passes_a_sigterm_on_to_the_engine_and_its_status_back(
    tmp_path: pathlib.Path, engine: str, status: int
) -> None:
    outer, pid = as_pid_1(under_init([sys.executable, "-c", engine]), tmp_path / "init.log")
    command = "\0".join([sys.executable, "-c", engine, ""]).encode()

    def engines() -> list[int]:
        """PID 1's children running the engine (not the helpers a `python3` found on PATH may
        start first: pyenv's shims fork before they exec)."""
        found = []
        for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(FileNotFoundError):
                if pathlib.Path(f"/proc/{child}/cmdline").read_bytes() == command:
                    found.append(int(child))
        return found

    # The init script in place (its handler, then the engine it starts), and the engine's own
    # handler where it has one: the signal comes after each, as in a pod that has started.
    eventually(lambda: catches(pid, signal.SIGTERM) and engines(), ignore=(FileNotFoundError,), what="the engine")
    if "signal.signal" in engine:
        eventually(
            lambda: any(catches(child, signal.SIGTERM) for child in engines()),
            interval=0.01,
            ignore=(FileNotFoundError,),
            what="the engine's handler",
        )
    # The engine sleeps ten minutes: an exit at all is the signal passed on, and its status says how.
    seconds_to_exit(outer, pid, timeout=120)
    assert outer.returncode == status, ((tmp_path / "init.log").read_text(), outer.returncode)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="a PID namespace needs unshare")
def test_the_init_script_reaps_the_orphans_it_inherits(tmp_path: pathlib.Path) -> None:
    """vLLM's worker processes that outlive their parent become PID 1's: reaped, not zombies."""
    go = tmp_path / "go"
    orphan = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    grandchild = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {orphan!r}])"
    # The engine's child starts a grandchild and exits at once: the grandchild is orphaned to
    # PID 1, and exits when the test says so.
    engine = f"import subprocess, sys, time; subprocess.run([sys.executable, '-c', {grandchild!r}]); time.sleep(600)"
    outer, pid = as_pid_1(under_init([sys.executable, "-c", engine]), tmp_path / "init.log")

    def children() -> list[tuple[str, str]]:
        """PID 1's children: (pid, state)."""
        found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        states = []
        for child in found:
            with contextlib.suppress(FileNotFoundError):  # reaped meanwhile
                states.append((child, pathlib.Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]))
        return states

    eventually(lambda: len(children()) == 2, what="the engine and the orphan, both PID 1's children")
    go.touch()
    # The orphan exits: reaped, PID 1 is left with the engine alone (a zombie would stay a child).
    eventually(lambda: len(children()) == 1, what="the orphan reaped")
    assert all(state != "Z" for _, state in children()), children()
    seconds_to_exit(outer, pid, timeout=60)
