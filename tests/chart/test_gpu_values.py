"""The chart's `gpu.*` values reach the operator as the defaults it builds pods with."""

from __future__ import annotations

import pytest

from inference_operator.models import GpuAllocation, ResourceNaming
from inference_operator.settings import GpuDefaults
from tests.chart import helm as h
from testsupport.cluster import Cluster


def operator_gpu_defaults(cluster: Cluster) -> GpuDefaults:
    """The defaults the installed operator container would read from its environment."""
    deployment = h.one(h.installed_objects(cluster), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return GpuDefaults.from_env(env)


def test_default_install_keeps_the_device_plugin_single_naming_and_video_render_groups(chart_cluster: Cluster) -> None:
    h.install(chart_cluster, None)
    assert operator_gpu_defaults(chart_cluster) == GpuDefaults(
        allocation=GpuAllocation.DEVICE_PLUGIN, resource_naming=ResourceNaming.SINGLE, supplemental_groups=(44, 109)
    )


def test_gpu_values_become_the_operator_defaults(chart_cluster: Cluster) -> None:
    values = {"gpu": {"allocation": "dra", "resourceNaming": "mixed", "supplementalGroups": [44, 992, 4294967295]}}
    h.install(chart_cluster, values)
    assert operator_gpu_defaults(chart_cluster) == GpuDefaults(
        allocation=GpuAllocation.DRA, resource_naming=ResourceNaming.MIXED, supplemental_groups=(44, 992, 4294967295)
    )


def test_no_device_groups_is_a_valid_setting(chart_cluster: Cluster) -> None:
    h.install(chart_cluster, {"gpu": {"supplementalGroups": []}})
    assert operator_gpu_defaults(chart_cluster).supplemental_groups == ()


@pytest.mark.parametrize(
    "bad",
    [
        {"gpu": {"allocation": "plugin"}},
        {"gpu": {"resourceNaming": "Mixed"}},
        {"gpu": {"supplementalGroups": ["render"]}},
        {"gpu": {"supplementalGroups": [44, 0]}},
        {"policy": {"supplementalGroups": [0]}},
        {"policy": {"supplementalGroups": ["0-999"]}},
    ],
)
def test_bad_gpu_values_are_refused_by_the_chart_schema(chart_cluster: Cluster, bad: dict) -> None:
    with pytest.raises(h.HelmError, match="values don't meet the specifications of the schema"):
        h.install(chart_cluster, bad)
