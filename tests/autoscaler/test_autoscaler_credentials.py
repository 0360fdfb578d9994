"""Prometheus credentials: a Secret is only sent when it opted in, over https, to an allowed URL.

The built-in loop is driven one tick at a time against the emulated API server, with a
recording transport standing in for Prometheus, so what would have left the operator (and
with which Authorization header) is seen exactly. KEDA objects go through `reconcile()`.
"""

from __future__ import annotations

import logging
import pathlib

import httpx
import kopf
import kubernetes
import pytest

from inference_operator import credentials as cr
from inference_operator import settings
from inference_operator.analysis import AnalysisRefused, analysis_client, measure
from inference_operator.autoscaler.loop import SCALING_ACTIVE, Autoscaler
from inference_operator.builders import Owner
from inference_operator.k8s import KubeApi
from inference_operator.models import InferenceServiceSpec, SpecError, parse_spec
from inference_operator.prometheus.client import PrometheusClient
from inference_operator.prometheus.clients import PrometheusClients
from inference_operator.reasons import Reason
from inference_operator.reconcile import reconcile
from testsupport.cluster import Cluster, condition, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
NS, NAME = "ml", "mlp"
# Any URL: these cases are about the other rules (the allow-list has its own).
ANY = (settings.ANY_URL,)
HTTPS = "https://prometheus.monitoring:9090"


def api_of(cluster: Cluster) -> KubeApi:
    return KubeApi(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))


def add_secret(cluster: Cluster, name: str, value: bytes, labelled: bool) -> None:
    cluster.add_secret(NS, name, {"token": value}, labels={cr.SECRET_LABEL: "true"} if labelled else {})


def add_service(cluster: Cluster, url: str, mode: str = "builtin") -> dict:
    obj = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "replicas": 2,
            "model": {"uri": "pvc://models/mlp"},
            "autoscaling": {
                "mode": mode,
                "maxReplicas": 8,
                "target": 10,
                "metric": "queueDepth",
                "prometheusUrl": url,
                "prometheusAuth": {"bearerTokenSecret": {"name": "db-admin", "key": "token"}},
            },
        },
    }
    response = cluster.apply_cr(obj)
    assert response.status_code in (200, 201), response.text
    got = cluster.get_cr(NS, NAME)
    assert got is not None
    return got


class Recorder:
    """A Prometheus that answers 15 to every query and remembers each request's headers."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def factory(self, url: str, **kw) -> PrometheusClient:
        def answer(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            result = [{"metric": {}, "value": [1.0, "0.5" if "time() -" in request.url.params["query"] else "15"]}]
            return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

        return PrometheusClient(url, transport=httpx.MockTransport(answer), **kw)

    @property
    def tokens(self) -> set[str | None]:
        return {r.headers.get("Authorization") for r in self.requests}


async def one_tick(cluster: Cluster, body: dict, policy: settings.CredentialPolicy) -> Recorder:
    recorder = Recorder()
    loop = Autoscaler(
        api_of(cluster),
        NS,
        NAME,
        logging.getLogger("test"),
        post_event=lambda r, m: None,
        prometheus_factory=recorder.factory,
        policy=policy,
    )
    try:
        await loop.tick(body, parse_spec(body["spec"]))
    finally:
        await loop.aclose()
    return recorder


def scaling_active(cluster: Cluster) -> dict:
    status = (cluster.get_cr(NS, NAME) or {}).get("status") or {}
    return next(c for c in status.get("conditions") or [] if c["type"] == SCALING_ACTIVE)


@pytest.mark.parametrize(
    ("url", "labelled", "policy", "reason"),
    [
        # The attack: any Secret of the namespace, to a URL of the author's choosing, in clear.
        (
            "http://attacker.example:8080",
            False,
            settings.CredentialPolicy(allowed_urls=ANY),
            Reason.PROMETHEUS_CREDENTIALS_OVER_HTTP,
        ),
        (
            "http://attacker.example:8080",
            False,
            settings.CredentialPolicy(allowed_urls=ANY, allow_http=True),
            Reason.PROMETHEUS_SECRET_NOT_LABELLED,
        ),
        (HTTPS, False, settings.CredentialPolicy(allowed_urls=ANY), Reason.PROMETHEUS_SECRET_NOT_LABELLED),
        (
            "http://prometheus.monitoring:9090",
            True,
            settings.CredentialPolicy(allowed_urls=ANY),
            Reason.PROMETHEUS_CREDENTIALS_OVER_HTTP,
        ),
        (
            "https://attacker.example",
            True,
            settings.CredentialPolicy(allowed_urls=(HTTPS,)),
            Reason.PROMETHEUS_URL_NOT_ALLOWED,
        ),
        (
            HTTPS,
            True,
            settings.CredentialPolicy(allowed_urls=ANY, enabled=False),
            Reason.PROMETHEUS_CREDENTIALS_DISABLED,
        ),
    ],
)
async def test_a_refused_credential_is_never_sent_and_the_reason_is_in_status(
    cluster: Cluster, url: str, labelled: bool, policy: settings.CredentialPolicy, reason: str
) -> None:
    add_secret(cluster, "db-admin", b"hunter2", labelled)
    body = add_service(cluster, url)
    recorder = await one_tick(cluster, body, policy)
    assert not any("hunter2" in (t or "") for t in recorder.tokens)
    assert recorder.requests == []  # nothing asked at all: no data, the count holds
    obj = cluster.get_cr(NS, NAME)
    assert obj is not None and obj["spec"]["replicas"] == 2
    condition = scaling_active(cluster)
    assert (condition["status"], condition["reason"]) == ("False", reason)
    assert obj["status"]["autoscaler"]["reason"].startswith(f"no data ({reason}")


async def test_an_opted_in_secret_goes_to_an_allowed_https_url(cluster: Cluster) -> None:
    add_secret(cluster, "db-admin", b"s3cret\n", labelled=True)
    body = add_service(cluster, HTTPS + "/prom")
    recorder = await one_tick(cluster, body, settings.CredentialPolicy(allowed_urls=(HTTPS,)))
    assert recorder.requests and recorder.tokens == {"Bearer s3cret"}
    assert str(recorder.requests[0].url).startswith(HTTPS + "/prom/api/v1/query")
    condition = scaling_active(cluster)
    assert (condition["status"], condition["reason"]) == ("True", "MetricAvailable")
    obj = cluster.get_cr(NS, NAME)
    assert obj is not None and obj["spec"]["replicas"] == 3  # ceil(2 * 15 / 10)


async def test_plain_http_is_allowed_only_when_the_operator_says_so(cluster: Cluster) -> None:
    add_secret(cluster, "db-admin", b"s3cret", labelled=True)
    body = add_service(cluster, "http://prometheus.monitoring:9090")
    recorder = await one_tick(cluster, body, settings.CredentialPolicy(allowed_urls=ANY, allow_http=True))
    assert recorder.tokens == {"Bearer s3cret"}


def test_keda_objects_are_left_out_while_the_credential_is_refused(cluster: Cluster) -> None:
    body = add_service(cluster, "http://attacker.example:8080", mode="keda")
    spec = parse_spec(body["spec"])
    api = api_of(cluster)
    owner = Owner(name=NAME, namespace=NS, uid=body["metadata"]["uid"], spec=spec)

    missing = reconcile(api, owner, settings.CredentialPolicy(allowed_urls=ANY, allow_http=True))
    assert missing.problem is not None and missing.problem.reason == Reason.PROMETHEUS_SECRET_NOT_FOUND
    add_secret(cluster, "db-admin", b"hunter2", labelled=False)
    result = reconcile(api, owner, settings.CredentialPolicy(allowed_urls=ANY, allow_http=True))
    assert result.problem is not None and result.problem.reason == Reason.PROMETHEUS_SECRET_NOT_LABELLED
    assert {c.kind for c in result.changes} == {"Deployment", "Service"}  # the service itself runs on
    assert cluster.get("keda.sh/v1alpha1/triggerauthentications", NS, NAME) is None
    assert cluster.get("keda.sh/v1alpha1/scaledobjects", NS, NAME) is None

    cluster.patch("v1/secrets", NS, "db-admin", {"metadata": {"labels": {cr.SECRET_LABEL: "true"}}})
    still = reconcile(api, owner, settings.CredentialPolicy(allowed_urls=ANY))
    assert (
        still.problem is not None and still.problem.reason == Reason.PROMETHEUS_CREDENTIALS_OVER_HTTP
    )  # a token in clear
    allowed = reconcile(api, owner, settings.CredentialPolicy(allowed_urls=ANY, allow_http=True))
    assert allowed.problem is None
    auth = cluster.get("keda.sh/v1alpha1/triggerauthentications", NS, NAME)
    assert auth is not None and auth["spec"]["secretTargetRef"][0]["name"] == "db-admin"
    assert cluster.get("keda.sh/v1alpha1/scaledobjects", NS, NAME) is not None


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://prometheus.monitoring:9090", True),
        ("https://PROMETHEUS.monitoring:9090/", True),
        ("https://prometheus.monitoring:9090/api/prom", True),
        ("https://prometheus.monitoring", False),  # another port
        ("http://prometheus.monitoring:9090", False),  # another scheme
        ("https://prometheus.monitoring.attacker.example:9090", False),
        ("https://prometheus.monitoring:9090@attacker.example", False),
        ("https://thanos:443/tenant-a/x", True),
        ("https://thanos/tenant-ab", False),  # a prefix on a `/` boundary only
    ],
)
def test_allow_list_matches_origin_and_path_boundary(url: str, allowed: bool) -> None:
    entries = ("https://prometheus.monitoring:9090", "https://thanos/tenant-a")
    assert cr.url_allowed(url, entries) is allowed


def test_policy_from_the_operator_environment() -> None:
    assert settings.CredentialPolicy.from_env({}) == settings.CredentialPolicy(
        allowed_urls=settings.DEFAULT_ALLOWED_URLS
    )
    policy = settings.CredentialPolicy.from_env(
        {
            settings.PROMETHEUS_AUTH_ENV: "false",
            settings.PROMETHEUS_ALLOW_HTTP_ENV: "true",
            settings.PROMETHEUS_ALLOWED_URLS_ENV: "https://a:9090, https://b/x\nhttp://c",
        }
    )
    assert policy == settings.CredentialPolicy(False, True, ("https://a:9090", "https://b/x", "http://c"))
    with pytest.raises(ValueError, match="user info"):
        settings.CredentialPolicy.from_env({settings.PROMETHEUS_ALLOWED_URLS_ENV: "https://u:p@a"})


def test_operator_reports_a_refused_keda_credential_and_looks_again(
    cluster: Cluster, operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Deployment runs; the KEDA objects wait, Degraded says why, and labelling the Secret
    (no change to the InferenceService) is noticed at the next re-check."""
    monkeypatch.setattr(cr, "RECHECK_SECONDS", 1)
    add_secret(cluster, "db-admin", b"hunter2", labelled=False)
    add_service(cluster, "https://prometheus.monitoring:9090", mode="keda")
    degraded = wait_for(
        lambda: (c := condition(cluster.get_cr(NS, NAME), "Degraded")) and c["status"] == "True" and c,
        timeout=30,
        message="Degraded condition",
    )
    assert degraded["reason"] == Reason.PROMETHEUS_SECRET_NOT_LABELLED and "db-admin" in degraded["message"]
    assert cluster.get("apps/v1/deployments", NS, NAME) is not None
    assert cluster.get("keda.sh/v1alpha1/triggerauthentications", NS, NAME) is None
    assert cluster.get("keda.sh/v1alpha1/scaledobjects", NS, NAME) is None

    cluster.patch("v1/secrets", NS, "db-admin", {"metadata": {"labels": {cr.SECRET_LABEL: "true"}}})
    wait_for(
        lambda: cluster.get("keda.sh/v1alpha1/scaledobjects", NS, NAME), timeout=30, message="ScaledObject emitted"
    )
    assert cluster.get("keda.sh/v1alpha1/triggerauthentications", NS, NAME) is not None
    wait_for(
        lambda: (condition(cluster.get_cr(NS, NAME), "Degraded") or {}).get("status") == "False",
        timeout=30,
        message="Degraded cleared",
    )


def test_a_malformed_allow_list_stops_the_operator_at_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    from inference_operator.handlers import startup

    monkeypatch.setenv(settings.PROMETHEUS_ALLOWED_URLS_ENV, "https://user:pass@prometheus:9090")
    with pytest.raises(ValueError, match="without user info"):
        startup.configure(settings=kopf.OperatorSettings(), memo=kopf.Memo())


# --- Hub tokens: model.huggingFace.tokenSecret reaches the init container as HF_TOKEN ----------


def hf_spec(endpoint: str | None = None, token_secret: str = "hf-token") -> dict:
    hub: dict = {"tokenSecret": token_secret}
    if endpoint:
        hub["endpoint"] = endpoint
    return {
        "model": {"uri": "hf://org/llm@main", "huggingFace": hub},
        "runtime": {"engine": "vllm"},
        "resources": {"gpu": {"count": 0}},
    }


def labelled(label: str | None) -> dict:
    return {"metadata": {"name": "hf-token", "labels": {label: "true"} if label else {}}}


@pytest.mark.parametrize(
    ("endpoint", "secret", "policy", "reason"),
    [
        (
            "https://attacker.example",
            labelled(cr.MODEL_SECRET_LABEL),
            settings.CredentialPolicy(),
            Reason.HUB_ENDPOINT_NOT_ALLOWED,
        ),
        (
            "http://huggingface.co",
            labelled(cr.MODEL_SECRET_LABEL),
            settings.CredentialPolicy(),
            Reason.HUB_ENDPOINT_NOT_ALLOWED,
        ),
        (None, labelled(None), settings.CredentialPolicy(), Reason.MODEL_SECRET_NOT_LABELLED),
        (
            None,
            labelled(cr.SECRET_LABEL),
            settings.CredentialPolicy(),
            Reason.MODEL_SECRET_NOT_LABELLED,
        ),  # Prometheus' label
        (None, None, settings.CredentialPolicy(), Reason.MODEL_SECRET_NOT_FOUND),
        (
            None,
            labelled(cr.MODEL_SECRET_LABEL),
            settings.CredentialPolicy(hub_tokens=False),
            Reason.HUB_TOKENS_DISABLED,
        ),
        (None, labelled(cr.MODEL_SECRET_LABEL), settings.CredentialPolicy(), None),
        (
            "https://hf-mirror.internal/hub",
            labelled(cr.MODEL_SECRET_LABEL),
            settings.CredentialPolicy(hub_endpoints=(settings.PUBLIC_HUB, "https://hf-mirror.internal")),
            None,
        ),
    ],
)
def test_hub_token_rules(
    endpoint: str | None, secret: dict | None, policy: settings.CredentialPolicy, reason: str
) -> None:
    refusal = cr.model_refusal(parse_spec(hf_spec(endpoint)), policy, lambda name: secret)
    assert (refusal.reason if refusal else None) == reason


def test_hub_endpoints_from_the_environment() -> None:
    assert settings.CredentialPolicy.from_env({}).hub_endpoints == (settings.PUBLIC_HUB,)
    policy = settings.CredentialPolicy.from_env(
        {settings.HUB_ENDPOINTS_ENV: "https://huggingface.co,https://m.internal"}
    )
    assert policy.hub_endpoints == (settings.PUBLIC_HUB, "https://m.internal")
    with pytest.raises(ValueError, match="https URL"):
        settings.CredentialPolicy.from_env({settings.HUB_ENDPOINTS_ENV: "http://m.internal"})


def test_runtime_env_cannot_redirect_the_hub_token() -> None:
    spec = hf_spec()
    spec["runtime"]["env"] = [{"name": "HF_ENDPOINT", "value": "https://attacker.example"}]
    with pytest.raises(SpecError, match="runtime.env"):
        parse_spec(spec)


def add_hf_service(cluster: Cluster, endpoint: str | None = None) -> dict:
    obj = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": hf_spec(endpoint),
    }
    response = cluster.apply_cr(obj)
    assert response.status_code in (200, 201), response.text
    got = cluster.get_cr(NS, NAME)
    assert got is not None
    return got


def held_for_an_unlabelled_token(cluster: Cluster) -> None:
    """The service turns Degraded for the hub token's missing opt-in label, with no Deployment."""
    degraded = wait_for(
        lambda: (c := condition(cluster.get_cr(NS, NAME), "Degraded")) and c["status"] == "True" and c,
        timeout=30,
        message="Degraded condition",
    )
    assert degraded["reason"] == Reason.MODEL_SECRET_NOT_LABELLED
    assert cluster.get("apps/v1/deployments", NS, NAME) is None


def test_operator_rolls_out_no_pod_with_an_unlabelled_hub_token(
    cluster: Cluster, operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cr, "RECHECK_SECONDS", 1)
    cluster.add_secret(NS, "hf-token", {"token": b"hf_x"})
    add_hf_service(cluster)
    held_for_an_unlabelled_token(cluster)

    cluster.patch("v1/secrets", NS, "hf-token", {"metadata": {"labels": {cr.MODEL_SECRET_LABEL: "true"}}})
    deployment = wait_for(
        lambda: cluster.get("apps/v1/deployments", NS, NAME), timeout=30, message="Deployment rolled out"
    )
    init = deployment["spec"]["template"]["spec"]["initContainers"][0]
    token = next(e for e in init["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["name"] == "hf-token"


def test_a_ca_secret_must_opt_in_too() -> None:
    """The CA is not sent anywhere, but naming any Secret must not make the operator use it."""
    scaling = parse_spec(
        {
            "model": {"uri": "pvc://models/m"},
            "autoscaling": {
                "maxReplicas": 2,
                "target": 1,
                "prometheusUrl": HTTPS,
                "prometheusAuth": {"caSecret": {"name": "some-ca", "key": "ca.crt"}},
            },
        }
    ).autoscaling
    assert scaling is not None
    with pytest.raises(cr.CredentialsRefused) as refused:
        cr.check(scaling, settings.CredentialPolicy(allowed_urls=ANY), lambda name: {"metadata": {"name": name}})
    assert refused.value.reason == Reason.PROMETHEUS_SECRET_NOT_LABELLED
    ok = cr.check(
        scaling,
        settings.CredentialPolicy(allowed_urls=ANY),
        lambda name: {"metadata": {"labels": {cr.SECRET_LABEL: "true"}}},
    )
    assert set(ok) == {"some-ca"}


def test_a_deleted_deployment_is_not_restored_with_a_token_no_longer_allowed(
    cluster: Cluster, operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cr, "RECHECK_SECONDS", 1)
    cluster.add_secret(NS, "hf-token", {"token": b"hf_x"}, labels={cr.MODEL_SECRET_LABEL: "true"})
    add_hf_service(cluster)
    wait_for(lambda: cluster.get("apps/v1/deployments", NS, NAME), timeout=30, message="Deployment rolled out")
    # The label is withdrawn, then the Deployment deleted: it is not put back with the token.
    cluster.patch("v1/secrets", NS, "hf-token", {"metadata": {"labels": {cr.MODEL_SECRET_LABEL: None}}})
    assert cluster.request("DELETE", f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}").status_code == 200
    held_for_an_unlabelled_token(cluster)


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/node-role?x=",  # the query the attack used
        "http://prometheus:9090/#fragment",
        "http://user:pass@prometheus:9090",
        "http://prometheus:9090@169.254.169.254/",
        "http://prometheus:9090/api v1",
        "ftp://prometheus:9090",
        "http://" + "p" * 2100,
    ],
)
def test_prometheus_url_is_a_base_url_only(url: str) -> None:
    with pytest.raises(SpecError, match="prometheusUrl"):
        parse_spec(
            {"model": {"uri": "pvc://m/x"}, "autoscaling": {"maxReplicas": 2, "target": 50, "prometheusUrl": url}}
        )


def test_prometheus_url_may_carry_a_path_prefix() -> None:
    spec = parse_spec(
        {
            "model": {"uri": "pvc://m/x"},
            "autoscaling": {"maxReplicas": 2, "target": 50, "prometheusUrl": "https://thanos/tenant-a"},
        }
    )
    assert spec.autoscaling is not None and spec.autoscaling.prometheus_url == "https://thanos/tenant-a"


def test_an_empty_allow_list_allows_nothing_and_only_a_star_allows_anything() -> None:
    assert not cr.url_allowed("http://prometheus-operated.monitoring:9090", ())
    assert cr.url_allowed("http://10.0.0.1:1234/x", (settings.ANY_URL,))
    assert settings.CredentialPolicy.from_env({settings.PROMETHEUS_ALLOWED_URLS_ENV: ""}).allowed_urls == ()
    assert settings.CredentialPolicy.from_env({settings.PROMETHEUS_ALLOWED_URLS_ENV: "*"}).allowed_urls == (
        settings.ANY_URL,
    )
    default = settings.CredentialPolicy.from_env({})
    assert cr.url_allowed("http://prometheus-operated.monitoring.svc:9090", default.allowed_urls)
    assert not cr.url_allowed("http://169.254.169.254/latest/meta-data", default.allowed_urls)


def test_the_charts_default_allow_list_is_the_operators() -> None:
    import yaml

    values = yaml.safe_load((ROOT / "charts" / "rocm-inference-operator" / "values.yaml").read_text())
    assert tuple(values["prometheus"]["allowedUrls"]) == settings.DEFAULT_ALLOWED_URLS


# --------------------------------------------------------------------------- canary analysis


def canary_analysis_spec(autoscaler_url: str, analysis_url: str | None = None) -> InferenceServiceSpec:
    analysis: dict = {"maxLatencyMs": 50}
    if analysis_url:
        analysis["prometheusUrl"] = analysis_url
    return parse_spec(
        {
            "model": {"uri": "pvc://models/mlp"},
            "autoscaling": {
                "maxReplicas": 4,
                "target": 10,
                "prometheusUrl": autoscaler_url,
                "prometheusAuth": {"bearerTokenSecret": {"name": "db-admin", "key": "token"}},
            },
            "rollout": {"strategy": "canary", "canary": {"analysis": analysis}},
        }
    )


async def analysed(cluster: Cluster, spec: InferenceServiceSpec, policy: settings.CredentialPolicy) -> Recorder:
    """One canary check as the analysis daemon makes it; what reached Prometheus."""
    recorder = Recorder()
    clients = PrometheusClients(api_of(cluster), NS, factory=recorder.factory)
    try:
        canary = spec.rollout.canary
        assert canary is not None
        client = await analysis_client(clients, spec, canary, policy)
        await measure(client, spec, canary, NS, NAME, "mlp")
    finally:
        await clients.aclose()
    return recorder


async def test_the_analysis_queries_the_autoscalers_prometheus_with_its_opted_in_credential(cluster: Cluster) -> None:
    add_secret(cluster, "db-admin", b"s3cret\n", labelled=True)
    recorder = await analysed(cluster, canary_analysis_spec(HTTPS), settings.CredentialPolicy(allowed_urls=(HTTPS,)))
    assert len(recorder.requests) == 3 and recorder.tokens == {"Bearer s3cret"}


async def test_the_analysis_never_takes_the_autoscalers_credential_to_a_url_of_its_own(cluster: Cluster) -> None:
    """The author names the analysis URL: the Secret meant for the autoscaler's Prometheus must
    not go there, even where the operator allows any URL."""
    add_secret(cluster, "db-admin", b"s3cret", labelled=True)
    spec = canary_analysis_spec(HTTPS, analysis_url="https://attacker.example")
    recorder = await analysed(cluster, spec, settings.CredentialPolicy(allowed_urls=ANY))
    assert recorder.requests and recorder.tokens == {None}


@pytest.mark.parametrize(
    ("url", "labelled", "policy", "reason"),
    [
        (HTTPS, False, settings.CredentialPolicy(allowed_urls=ANY), Reason.PROMETHEUS_SECRET_NOT_LABELLED),
        (
            "http://prometheus.monitoring:9090",
            True,
            settings.CredentialPolicy(allowed_urls=ANY),
            Reason.PROMETHEUS_CREDENTIALS_OVER_HTTP,
        ),
        (
            HTTPS,
            True,
            settings.CredentialPolicy(allowed_urls=ANY, enabled=False),
            Reason.PROMETHEUS_CREDENTIALS_DISABLED,
        ),
    ],
)
async def test_the_analysis_sends_nothing_when_the_credential_is_refused(
    cluster: Cluster, url: str, labelled: bool, policy: settings.CredentialPolicy, reason: str
) -> None:
    add_secret(cluster, "db-admin", b"hunter2", labelled)
    with pytest.raises(cr.CredentialsRefused) as refused:
        await analysed(cluster, canary_analysis_spec(url), policy)
    assert refused.value.reason == reason and "hunter2" not in str(refused.value)


async def test_the_analysis_refuses_a_url_off_the_allow_list(cluster: Cluster) -> None:
    spec = canary_analysis_spec(HTTPS, analysis_url="http://10.0.0.1:9090")
    with pytest.raises(AnalysisRefused):
        await analysed(cluster, spec, settings.CredentialPolicy(allowed_urls=(HTTPS,)))
