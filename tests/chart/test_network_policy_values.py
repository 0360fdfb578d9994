"""The chart's networkPolicy.* values reach the operator: on by default, with the release's
namespace as the operator's and the Prometheus namespace selector as given."""

from __future__ import annotations

from inference_operator.config import OperatorConfig
from inference_operator.settings import NetworkPolicySettings
from tests.chart import helm as h
from testsupport.cluster import Cluster


def operator_network(cluster: Cluster, values: dict | None) -> NetworkPolicySettings:
    h.install(cluster, values)
    (container,) = h.one(h.installed_objects(cluster), "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return OperatorConfig.from_environ(env).network


def test_network_policies_are_on_by_default(chart_cluster: Cluster) -> None:
    assert operator_network(chart_cluster, None) == NetworkPolicySettings(
        enabled=True,
        operator_namespace=h.RELEASE_NAMESPACE,
        prometheus_namespaces={"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    )


def test_network_policies_turned_off_and_another_prometheus(chart_cluster: Cluster) -> None:
    selector = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["observability"]}]}
    # Helm merges maps: the default matchLabels goes only when set to null.
    values = {"networkPolicy": {"enabled": False, "prometheusNamespaceSelector": {**selector, "matchLabels": None}}}
    network = operator_network(chart_cluster, values)
    assert not network.enabled and network.prometheus_namespaces == selector
