"""The chart as test data, and Helm itself where it can be had.

Helm is the Helm v4 engine (helm.sh/helm/v4) inside the `helm-sdkpy` wheel, a Go shared library
called through cffi (tests/chart/helm_cli.py): real `helm lint` and real `helm install`, here
into the emulated cluster of testsupport/cluster.py. That library has no `helm template`; an install
into the emulator renders the same manifests and also runs CRD installation and release handling.
Release records are kept in memory (HELM_DRIVER=memory): Helm writes its release Secret as
protobuf, which the emulator does not parse.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import kmock
import yaml

from testsupport.cluster import Cluster, running_cluster
from testsupport.emulator import declare

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rocm-inference-operator"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "rio"
RELEASE_NAMESPACE = "inference-system"
ALL_VERBS = ("list", "watch", "get", "create", "patch", "update", "delete")

# Everything the chart may create that the operator tests' emulator does not declare already.
CHART_RESOURCES = [
    ("v1/serviceaccounts", "ServiceAccount", True),
    ("v1/configmaps", "ConfigMap", True),
    ("v1/secrets", "Secret", True),
    ("rbac.authorization.k8s.io/v1/clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io/v1/clusterrolebindings", "ClusterRoleBinding", False),
    ("rbac.authorization.k8s.io/v1/roles", "Role", True),
    ("rbac.authorization.k8s.io/v1/rolebindings", "RoleBinding", True),
    ("kopf.dev/v1/clusterkopfpeerings", "ClusterKopfPeering", False),
    ("kopf.dev/v1/kopfpeerings", "KopfPeering", True),
    ("monitoring.coreos.com/v1/servicemonitors", "ServiceMonitor", True),
    ("monitoring.coreos.com/v1/podmonitors", "PodMonitor", True),
    ("monitoring.coreos.com/v1/prometheusrules", "PrometheusRule", True),
    ("admissionregistration.k8s.io/v1/validatingadmissionpolicies", "ValidatingAdmissionPolicy", False),
    ("admissionregistration.k8s.io/v1/validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", False),
]


class HelmError(Exception):
    """Helm refused: the message is Helm's."""


@functools.cache
def available() -> bool:
    """Whether helm-sdkpy is installed and its shared library loads."""
    probe = subprocess.run(
        [sys.executable, "-c", "from helm_sdkpy import _ffi; _ffi.get_library()"], capture_output=True, timeout=120
    )
    return probe.returncode == 0


def _helm(*args: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        return _helm_in(home, *args)


def _helm_in(home: str, *args: str) -> dict:
    env = {
        **os.environ,
        "HELM_DRIVER": "memory",
        "HELM_CACHE_HOME": f"{home}/cache",
        "HELM_CONFIG_HOME": f"{home}/config",
        "HELM_DATA_HOME": f"{home}/data",
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.chart.helm_cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if done.returncode != 0:
        raise HelmError(done.stderr.strip()[-4000:])
    return json.loads(done.stdout)


def values_of(path: pathlib.Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def prepare(cluster: Cluster) -> None:
    """Make the emulator able to take a `helm install` of the chart."""
    emulator = cluster.emulator
    declare(
        emulator,
        "apiextensions.k8s.io/v1/customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        verbs=ALL_VERBS,
    )
    for key, kind, namespaced in CHART_RESOURCES:
        declare(emulator, key, kind, namespaced=namespaced, verbs=ALL_VERBS)

    # kmock answers /api/v1 with groupVersion "/v1"; client-go (so Helm) then finds no core kinds.
    async def core_v1(request: kmock.Request) -> dict:
        payload = await emulator._serve_version(request)  # noqa: SLF001
        payload["groupVersion"] = "v1"
        return payload

    emulator["get /api/v1"] << core_v1


def lint(chart: pathlib.Path = CHART) -> dict:
    return _helm("lint", str(chart))


def install(
    cluster: Cluster,
    values: dict | None,
    namespace: str = RELEASE_NAMESPACE,
    release: str = RELEASE,
    chart: pathlib.Path = CHART,
) -> dict:
    """`helm install RELEASE CHART -n NAMESPACE -f values` against the emulated cluster."""
    args = ["install", release, str(chart), "--namespace", namespace, "--kubeconfig", str(cluster.kubeconfig)]
    if values:
        path = pathlib.Path(tempfile.mkdtemp(prefix="helm-values-")) / "values.json"
        path.write_text(json.dumps(values))
        args += ["-f", str(path)]
    return _helm(*args)


def render(values: dict | None, namespace: str = RELEASE_NAMESPACE, release: str = RELEASE) -> list[dict]:
    """The chart's objects for `values`, as `helm template` prints them (the engine has none: an
    install into a throwaway emulated cluster renders the same manifests)."""
    with tempfile.TemporaryDirectory(prefix="helm-render-") as work, running_cluster(pathlib.Path(work)) as cluster:
        prepare(cluster)
        manifest = install(cluster, values, namespace, release)["manifest"]
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def installed_objects(cluster: Cluster) -> list[dict]:
    """Every live object in the emulator, as the API would return it."""
    return [obj.raw for obj in cluster.emulator.objects.values() if not obj.deleted]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o.get("kind") == kind]


def is_activator(obj: dict) -> bool:
    return (obj.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/component") == "activator"


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    """The object of `kind` named `name`; unnamed, the operator's (the activator's are asked by name)."""
    found = [
        o
        for o in by_kind(objects, kind)
        if (o["metadata"]["name"] == name if name is not None else not is_activator(o))
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {json.dumps([o['metadata'] for o in found])}"
    return found[0]
